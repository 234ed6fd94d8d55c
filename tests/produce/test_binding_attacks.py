"""Attacks (round-four review of the fixes; each HELD) on the binding of a ``ctp produce FILE`` run to the incarnations it
looked up (ctp_state/ingest.py, ctp_state/producer.py)."""

from __future__ import annotations

from ctp_state import crashpoints
from ctp_state.deletion import delete_topic
from ctp_state.epoch import ClusterEpoch
from ctp_state.ingest import produce_input
from ctp_state.l0 import Record
from ctp_state.topics import create_topic, get_topic
from tests.support import values

#: t (2 partitions) and u (1 partition) interleaved; batches of 3 put t and u chunks into one L0 object
INPUT = [
    ("t", 0, "a0"), ("u", 0, "u0"), ("t", 1, "b0"),
    ("t", 0, "a1"), ("u", 0, "u1"), ("t", 1, "b1"),
    ("u", 0, "u2"), ("t", 0, "a2"), ("t", 1, "b2"),
    ("t", 1, "b3"), ("u", 0, "u3"), ("t", 0, "a3"),
]  # fmt: skip
RECORDS = [(t, p, Record(v.encode())) for t, p, v in INPUT]


def run(store):
    return produce_input(store, RECORDS, producer_id="file-bind", digest="e" * 64, batch_records=3)


def expect(topic, partition):
    return [v.encode() for t, p, v in INPUT if (t, p) == (topic, partition)]


def test_a_two_topic_run_across_a_recreate_of_one_topic_then_reruns(store):
    """ATTACK: one input for topics t and u, every flush's L0 object holding chunks of
    both. After flush 1 (its second), t is deleted and created again -- with *one more*
    partition, and after an epoch advance. The run must keep writing u, write nothing
    into the new t, reject the rest of t as topic_deleted; a rerun must write every t
    record into the new incarnation once and no u record twice; a third run must be
    'completed before'. HELD."""
    old = create_topic(store, "t", 2)
    create_topic(store, "u", 1)

    def at(point: str, index: int) -> None:
        if point == "produce_after_flush" and index == 1:
            delete_topic(store, "t")
            ClusterEpoch(store).advance()
            create_topic(store, "t", 3)

    crashpoints.install(at)
    try:
        first = run(store)
    finally:
        crashpoints.install(None)
    new = get_topic(store, "t")
    assert new.id != old.id and first.topics["t"] == old.id
    assert values(store, "t", 0) == [] and values(store, "t", 1) == [] and values(store, "t", 2) == []
    assert values(store, "u", 0) == expect("u", 0), "u lost records"
    assert first.accepted == 4 + 4 and first.rejected == 4, first.as_dict()  # t: 4 in the old one, 4 refused
    assert dict(first.rejected_by_reason) == {"topic_deleted": 4}

    second = run(store)
    assert second.topics["t"] == new.id
    assert (second.accepted, second.duplicates, second.rejected, second.unknown, second.not_sent) == (
        8,
        4,
        0,
        0,
        0,
    ), second.as_dict()
    for p in (0, 1):
        assert values(store, "t", p) == expect("t", p)
    assert values(store, "u", 0) == expect("u", 0)
    third = run(store)
    assert third.completed_before is not None and third.accepted == 0
    for p in (0, 1):
        assert values(store, "t", p) == expect("t", p)
    assert values(store, "u", 0) == expect("u", 0)


def test_a_delete_without_recreate_mid_run_then_rerun_writes_nothing(store):
    """ATTACK: t deleted (not re-created) mid-run: the run rejects the rest of t; a
    rerun must refuse (the topic does not exist), not write u twice or crash without a
    status. HELD: the rerun raises a CtpError and u is intact."""
    from ctp_state.errors import CtpError

    create_topic(store, "t", 2)
    create_topic(store, "u", 1)

    def at(point: str, index: int) -> None:
        if point == "produce_after_flush" and index == 0:
            delete_topic(store, "t")

    crashpoints.install(at)
    try:
        first = run(store)
    finally:
        crashpoints.install(None)
    assert values(store, "u", 0) == expect("u", 0)
    assert first.rejected and not first.complete
    try:
        run(store)
        raised = False
    except CtpError:
        raised = True
    assert raised
    assert values(store, "u", 0) == expect("u", 0)
