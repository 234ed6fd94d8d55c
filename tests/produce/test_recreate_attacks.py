"""A ``ctp produce FILE`` run that meets a topic delete and re-create (round-four review,
defect 1).

Before the fix the producer forgot a topic's handles when a write was refused as
deleted, and its next write looked the name up again: a later batch for another
partition landed in the *new* incarnation, with producer sequences starting at 0, while
the run's report and progress record named the old one. The re-run the docs prescribe
then counted records the new topic lacked as already written and wrote others twice.

Wanted (and checked here, on the local store and SeaweedFS): a run is bound to the
incarnations it looked up once; a write refused as deleted ends the run's part for that
incarnation, every one of its remaining records rejected as ``topic_deleted``; nothing of
the run lands in the new incarnation; a re-run writes every record the new incarnation
lacks exactly once.
"""

from __future__ import annotations

from ctp_state import crashpoints, layout
from ctp_state.deletion import delete_topic
from ctp_state.ingest import produce_input
from ctp_state.l0 import Record
from ctp_state.topics import create_topic, get_topic
from tests.support import Wrapped, values

#: flush 0: t/0 a0, t/1 b0 -- flush 1: t/0 a1 a2 -- flush 2: t/1 b1 b2 (batches of 2)
INPUT = [("t", 0, "a0"), ("t", 1, "b0"), ("t", 0, "a1"), ("t", 0, "a2"), ("t", 1, "b1"), ("t", 1, "b2")]
RECORDS = [(t, p, Record(v.encode())) for t, p, v in INPUT]


def run(store, **kw):
    return produce_input(store, RECORDS, producer_id="file-recreate", digest="d" * 64, batch_records=2, **kw)


def recreate(store) -> None:
    delete_topic(store, "t")
    create_topic(store, "t", 2)


def test_a_run_paused_after_a_flush_across_a_recreate_writes_nothing_into_the_new_incarnation(store):
    old = create_topic(store, "t", 2)

    def at(point: str, index: int) -> None:
        if point == "produce_after_flush" and index == 0:
            recreate(store)

    crashpoints.install(at)
    try:
        report = run(store)
    finally:
        crashpoints.install(None)
    new = get_topic(store, "t")
    assert new.id != old.id
    # The run names, and wrote only to, the incarnation it started with.
    assert report.topics == {"t": old.id}
    assert values(store, "t", 0) == [] and values(store, "t", 1) == [], "the run wrote into the new incarnation"
    assert (report.accepted, report.rejected, report.not_sent, report.unknown) == (2, 4, 0, 0), report.as_dict()
    assert dict(report.rejected_by_reason) == {"topic_deleted": 4}
    assert "deleted" in (report.first_error or "") and not report.complete

    again = run(store)
    assert again.topics == {"t": new.id}
    assert (again.accepted, again.duplicates, again.rejected) == (6, 0, 0), again.as_dict()
    assert values(store, "t", 0) == [b"a0", b"a1", b"a2"]
    assert values(store, "t", 1) == [b"b0", b"b1", b"b2"]
    third = run(store)  # complete now: nothing twice
    assert third.completed_before is not None
    assert values(store, "t", 1) == [b"b0", b"b1", b"b2"]


class RecreateOnFirstProgressRead(Wrapped):
    """Deletes and re-creates ``t`` the first time the run reads its progress record:
    after the run looked the topic up, before it opens a partition."""

    def __init__(self, inner):
        super().__init__(inner)
        self.done = False

    def get(self, k):
        if not self.done and k == layout.produce_progress("file-recreate"):
            self.done = True
            recreate(self.inner)
        return self.inner.get(k)


def test_a_recreate_between_the_lookup_and_the_first_partition_handle(store):
    old = create_topic(store, "t", 2)
    racing = RecreateOnFirstProgressRead(store)
    report = run(racing)
    assert racing.done
    new = get_topic(store, "t")
    assert report.topics == {"t": old.id}
    assert values(store, "t", 0) == [] and values(store, "t", 1) == [], "the run wrote into the new incarnation"
    assert (report.accepted, report.rejected) == (0, 6), report.as_dict()
    again = run(store)
    assert again.topics == {"t": new.id} and again.accepted == 6, again.as_dict()
    assert values(store, "t", 0) == [b"a0", b"a1", b"a2"]
    assert values(store, "t", 1) == [b"b0", b"b1", b"b2"]
