"""The producer and per-partition writers against real stores (file and S3)."""

from __future__ import annotations

import threading

import pytest

from ctp_state import layout
from ctp_state.entries import Placeholder
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import PartitionNotFound, StaleClusterEpoch, TopicNotFound
from ctp_state.l0 import Record, decode_chunk, records_of
from ctp_state.producer import PartitionWriter, Producer
from ctp_state.topics import create_topic
from tests.support import plog


def recs(n: int, tag: str = "v") -> list[Record]:
    return [Record(f"{tag}-{i}".encode(), f"k{i}".encode(), 1000 + i, (("h", b"x"),)) for i in range(n)]


@pytest.fixture
def topic_at(store):
    """Create topic 't' (2 partitions) with its inits at cluster epoch N."""

    def make(n: int) -> None:
        ce = ClusterEpoch(store)
        while ce.current() < n:
            ce.advance()
        create_topic(store, "t", 2)

    return make


def test_flush_writes_one_l0_object_and_one_placeholder_per_partition(store, topic_at):
    topic_at(3)
    with Producer(store) as p:
        p.send("t", 0, Record(b"a"))
        p.send("t", 1, Record(b"b"))
        p.send("t", 0, Record(b"c"))
        verdicts = p.flush()
    assert [(v.partition, v.records, v.base_offset) for v in verdicts] == [(0, 2, 0), (1, 1, 0)]
    assert len({v.l0_key for v in verdicts}) == 1
    spread, epoch = layout.parse_l0_key(verdicts[0].l0_key)
    assert epoch == 3 and 0 <= spread < 16
    # The placeholder points at a chunk that decodes back to the records, byte-identical.
    st = plog(store, "t", 0).read_state()
    (pend,) = st.pending
    data = store.get_range(pend.l0_key, pend.byte_offset, pend.byte_length)
    batch = decode_chunk(data, pend.l0_key, expected_crc=pend.crc32c, expected_records=pend.record_count)
    assert [r.value for r in records_of(batch)] == [b"a", b"c"]


def test_two_producers_older_epoch_fences_slowly_still_succeeds(store, topic_at):
    n = 4
    topic_at(n)
    # Two producers in one process share the partition's writer (and so its fence).
    with Producer(store) as prod:
        writer = prod.writer("t", 0)
        a_uploaded = threading.Event()
        b_done = threading.Event()
        results = {}

        def producer_a() -> None:
            a_uploaded.set()
            b_done.wait(5)  # A fences only after B, with the newer epoch, went first
            results["a"] = prod.write([(("t", 0), recs(2, "a"))], epoch=n)[0]

        def producer_b() -> None:
            a_uploaded.wait(5)
            results["b"] = prod.write([(("t", 0), recs(3, "b"))], epoch=n + 1)[0]
            b_done.set()

        ts = [threading.Thread(target=f) for f in (producer_a, producer_b)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
    assert results["b"].accepted and results["a"].accepted, (results["a"].error, results["b"].error)
    assert results["b"].base_offset == 0 and results["a"].base_offset == 3
    assert writer.state.window == (n, n + 1)


def test_two_processes_older_epoch_after_newer_is_accepted_by_the_log(store, topic_at):
    n = 4
    topic_at(n)
    with Producer(store) as a, Producer(store) as b:
        a.writer("t", 0).state  # A loaded the state (window [N]) before B wrote
        vb = b.write([(("t", 0), recs(1))], epoch=n + 1)[0]
        va = a.write([(("t", 0), recs(1))], epoch=n)[0]
    assert vb.accepted and va.accepted and va.base_offset == 1


def test_rapid_transitions_accept_the_last_two_epochs_only(store, topic_at):
    n = 2
    topic_at(n)
    with Producer(store) as p:
        for e in (n + 1, n + 2, n + 3):
            assert p.write([(("t", 0), recs(1))], epoch=e)[0].accepted
        late = {e: p.write([(("t", 0), recs(1))], epoch=e)[0] for e in (n + 3, n + 2, n + 1, n)}
    assert late[n + 3].accepted and late[n + 2].accepted
    for e in (n + 1, n):
        v = late[e]
        assert not v.accepted and isinstance(v.error, StaleClusterEpoch)
        assert v.error.window == (n + 2, n + 3)
    assert plog(store, "t", 0).read_state().next_offset == 5


def test_failover_writer_with_stale_window_is_rejected_by_the_log(store, topic_at):
    n = 5
    topic_at(n)
    stale = PartitionWriter(plog(store, "t", 0))
    assert stale.state.window == (n, n)  # loaded before the other writer moved on
    fresh = PartitionWriter(plog(store, "t", 0))
    for e in (n + 1, n + 2):
        assert fresh.append_placeholder(Placeholder(e, layout.l0_key(0, e, "y"), 8, 1, 1, 0))[1].accepted
    # The stale writer's own window still admits N, but the state rebuilt from the log
    # (previous_applied = N+1) rejects it, deterministically.
    _, outcome = stale.append_placeholder(Placeholder(n, layout.l0_key(0, n, "z"), 8, 1, 1, 0))
    assert isinstance(outcome.rejected, StaleClusterEpoch)
    assert outcome.rejected.window == (n + 1, n + 2)
    assert stale.state.window == (n + 1, n + 2)  # and it learned the new window


def test_every_chunk_gets_a_verdict_and_rejections_are_reported(store, topic_at):
    topic_at(3)
    with Producer(store) as p:
        p.write([(("t", 0), recs(1)), (("t", 1), recs(1))], epoch=5)  # p0, p1 now at [3, 5]
        p.write([(("t", 0), recs(1))], epoch=6)  # p0 now at [5, 6]
        verdicts = p.write([(("t", 0), recs(2)), (("t", 1), recs(3))], epoch=4)
    assert [(v.partition, v.accepted, v.records) for v in verdicts] == [(0, False, 2), (1, True, 3)]
    assert verdicts[0].reason == "stale_epoch"


def test_unknown_topic_or_partition_writes_nothing(store, topic_at):
    topic_at(1)
    with Producer(store) as p:
        with pytest.raises(TopicNotFound):
            p.send("nope", 0, Record(b"x"))
        with pytest.raises(PartitionNotFound):
            p.write([(("t", 7), recs(1))])
    assert list(store.list(layout.L0_ROOT)) == []


@pytest.mark.parametrize(
    "bad", [Record(b"v", None, 253_402_300_800_000), Record(b"v", None, -1), Record(b"v", None, 0, (("\ud800", b"x"),))]
)
def test_a_record_no_reader_could_read_back_is_refused_before_anything_is_written(store, topic_at, bad):
    from ctp_state.errors import InvalidRecord

    topic_at(1)
    with Producer(store) as p, pytest.raises(InvalidRecord):
        p.write([(("t", 0), [Record(b"fine"), bad])])
    assert not list(store.list(layout.L0_ROOT)) and plog(store, "t", 0).read_state().next_offset == 0
