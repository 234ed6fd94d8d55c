"""The reconciler starts from the GC's state pack (docs/design.md, section 14): a
partition's state there, checked against its log (the entry it ends at still there, with
the bytes the pack folded), instead of its snapshot. The pack is a
cache: one that is damaged, of another incarnation, older than the log or ahead of a log
that lost its tail costs reads and never hides a placeholder from the reconciler. On
both stores. (tests/gc/test_pack_identity_attacks.py: an entry that took a lost one's
place with an older mtime.)"""

from __future__ import annotations

import pytest

from ctp_state import layout
from ctp_state.deletion import delete_topic
from ctp_state.entries import Tick
from ctp_state.epoch import ClusterEpoch
from ctp_state.gc import run_gc
from ctp_state.gc.history import GcHistory, newest_pack
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.reconcile import run_reconcile
from ctp_state.settings import ReconcileSettings
from ctp_state.topics import create_topic
from tests.support import CountingStore, assert_exactly_once, plog

P = 4


#: Every partition of a topic ticks in the same run: the counts below compare two topics
#: epoch by epoch (the default spreads the ticks: tests/reconcile/test_tick_spread.py).
TOGETHER = ReconcileSettings(tick_together=True)


def epoch(store, gate, config=ReconcileSettings()):
    ClusterEpoch(store).advance()
    assert run_reconcile(store, config=config).ok
    rec = run_gc(store, gate=gate)
    assert rec.status == "ok", rec.gate.failures if rec.gate else rec.error
    return rec


def counted(store, topic: str) -> tuple[dict[str, int], object]:
    counting = CountingStore(store)
    s = run_reconcile(counting, topics=[topic], config=TOGETHER)
    assert s.ok, s
    return dict(counting.counts), s


def test_an_idle_partition_is_read_from_the_pack_with_two_gets(store, gate):
    """After a GC, the reconciler's read of an idle partition is a GET of the pack's
    last entry (its CRC32C: the bytes the pack folded) and the GET (a 404) of the key
    after it: no snapshot read, none written.
    Per partition: the difference between a topic of 2 and one of 6 in the same epoch,
    so a run's fixed requests (C, the topics, the GC history and its pack, the summary)
    drop out."""
    create_topic(store, "a", 2)
    create_topic(store, "b", 6)
    for _ in range(4):
        epoch(store, gate, TOGETHER)
    assert newest_pack(store) is not None
    snapshots = [layout.snapshot(t, p, plog(store, t, p).topic_id) for t, n in (("a", 2), ("b", 6)) for p in range(n)]
    store.delete_many(snapshots)  # not needed: the pack stands in for them
    for _ in range(2):  # an epoch with ticks and one without
        ClusterEpoch(store).advance()
        (few, a), (many, b) = counted(store, "a"), counted(store, "b")
        assert (a.partitions_advanced, b.partitions_advanced) in ((0, 0), (2, 6))
        per = {verb: (many.get(verb, 0) - few.get(verb, 0)) / 4 for verb in set(few) | set(many)}
        ticked = b.partitions_advanced > 0
        # a tick: one PUT, after one page of a listing (never written into a hole)
        want = {"head": 0.0, "get": 2.0, "put": 1.0 if ticked else 0.0, "list": 1.0 if ticked else 0.0}
        assert {k: per.get(k, 0.0) for k in want} == want, (per, few, many)
        assert run_gc(store, gate=gate).status == "ok"
    assert all(store.head(k) is None for k in snapshots)  # none written: a tail after the pack is short


def test_a_placeholder_after_the_pack_is_reconciled(store, gate):
    create_topic(store, "t", P)
    for _ in range(3):
        epoch(store, gate)
    with Producer(store, epoch_ttl_s=0) as prod:
        assert all(r.accepted for r in prod.write([(("t", p), [Record(b"late-%d" % p)]) for p in range(P)]))
    ClusterEpoch(store).advance()
    s = run_reconcile(store)
    assert s.ok and s.partitions_reconciled == P, s
    assert_exactly_once(store, "t", {p: [Record(b"late-%d" % p)] for p in range(P)}, all_in_l1=True)


def test_a_pack_older_than_the_log_is_caught_up(store, gate):
    """No GC for a while: the pack's states are older; the reconciler reads the tail after
    them and every record is reconciled once."""
    create_topic(store, "t", P)
    for _ in range(3):
        epoch(store, gate)
    want: dict[int, list[Record]] = {p: [] for p in range(P)}
    with Producer(store, epoch_ttl_s=0) as prod:
        for i in range(3):
            batch = [(("t", p), [Record(b"r%d-%d" % (i, p))]) for p in range(P)]
            assert all(r.accepted for r in prod.write(batch))
            for p in range(P):
                want[p].append(Record(b"r%d-%d" % (i, p)))
            ClusterEpoch(store).advance()
            assert run_reconcile(store).ok
    assert_exactly_once(store, "t", want, all_in_l1=True)
    assert epoch(store, gate).m >= 0


@pytest.mark.parametrize("how", ["damaged", "missing"])
def test_a_pack_that_does_not_read_costs_reads_only(store, gate, how):
    create_topic(store, "t", P)
    for _ in range(3):
        epoch(store, gate)
    rec = GcHistory(store).get(GcHistory(store).last_seq())
    if how == "damaged":
        data = store.get(rec.pack_key)
        store.delete_many([rec.pack_key])
        store.put(rec.pack_key, data[:-5])
    else:
        store.delete_many([rec.pack_key])
    assert newest_pack(store) is None
    with Producer(store, epoch_ttl_s=0) as prod:
        assert prod.write([(("t", 1), [Record(b"x")])])[0].accepted
    ClusterEpoch(store).advance()
    s = run_reconcile(store)
    assert s.ok and s.partitions_reconciled == 1, s
    assert_exactly_once(store, "t", {0: [], 1: [Record(b"x")], 2: [], 3: []}, all_in_l1=True)


def test_a_pack_of_a_deleted_incarnation_is_not_used(store, gate):
    """The topic is deleted and created again under the same name: the pack's states are
    of the old incarnation (another key id) and the new partitions read from their logs."""
    create_topic(store, "t", P)
    for _ in range(3):
        epoch(store, gate)
    pack = newest_pack(store)
    assert pack is not None and len(pack.states) == P
    delete_topic(store, "t")
    create_topic(store, "t", P)
    with Producer(store, epoch_ttl_s=0) as prod:
        assert prod.write([(("t", 2), [Record(b"new")])])[0].accepted
    ClusterEpoch(store).advance()
    s = run_reconcile(store)
    assert s.ok and s.partitions_reconciled == 1, s
    assert_exactly_once(store, "t", {0: [], 1: [], 2: [Record(b"new")], 3: []}, all_in_l1=True)


def test_a_pack_ahead_of_a_log_that_lost_its_tail_does_not_hide_a_placeholder(store, gate):
    """The store loses a partition's newest entry (a tick the pack folded) and its
    snapshot, and a producer appends a placeholder where the tick was. From the pack's
    state the reconciler would find the key after it empty and call the partition idle:
    the placeholder would never be reconciled. The pack's last entry is younger than the
    pack's read, so the reconciler reads the log, and reconciles it."""
    create_topic(store, "t", 1)
    log = plog(store, "t", 0, write_snapshots=False)
    for _ in range(4):
        epoch(store, gate)
    while not isinstance(list(log.entries())[-1][1], Tick):
        epoch(store, gate)
    last_off, _ = list(log.entries())[-1]
    pack = newest_pack(store)
    assert pack is not None and pack.states[("t", 0)][0].applied_offset == last_off
    store.delete_many([log.key(last_off), layout.snapshot("t", 0, log.topic_id)])
    short = plog(store, "t", 0, write_snapshots=False).read_state()
    with Producer(store, epoch_ttl_s=0) as prod:
        got = prod.write([(("t", 0), [Record(b"victim")])], epoch=short.max_applied_epoch)[0]
    assert got.accepted, got.error
    assert plog(store, "t", 0, write_snapshots=False).read_state().applied_offset == last_off  # where the tick was
    ClusterEpoch(store).advance()
    s = run_reconcile(store)
    assert s.ok and s.partitions_reconciled == 1, s
    assert_exactly_once(store, "t", {0: [Record(b"victim")]}, all_in_l1=True)
