"""Quiet partitions are not read (docs/design.md section 14, "quiet partitions"): the
reconciler reads a partition only if its GC pack state has work, an L0 object of an
epoch at or above its lower bound names it, or its advance is due (then a GET of the
pack state's last entry, and the tick's create is the probe). The L0 listing only finds
work sooner: a partition it misses -- its L0 object gone, or a footer forged to name
another -- keeps the pack's state (M stays below its placeholder) and is read at its
tick. A listing or footer that does not read makes the run read every partition. On
both stores."""

from __future__ import annotations

from ctp_state import layout
from ctp_state.epoch import ClusterEpoch
from ctp_state.gc import run_gc
from ctp_state.gc.history import newest_pack
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.settings import ReconcileSettings
from ctp_state.topics import create_topic
from tests.support import LAG2, CountingStore, assert_exactly_once, l0_keys, plog, reconcile, rewrite_footer

P = 10  # at least ReconcileSettings.quiet_min: the quiet path is the default one here


def epoch(store, gate, config=LAG2):
    ClusterEpoch(store).advance()
    s = reconcile(store, config=config)
    assert s.ok, [p for p in s.partitions if p.failed]
    rec = run_gc(store, gate=gate)
    assert rec.status == "ok", rec.gate.failures if rec.gate else rec.error
    return s, rec


def warm(store, gate, topic="t", n=P):
    create_topic(store, topic, n)
    for _ in range(4):
        epoch(store, gate)
    assert newest_pack(store) is not None


def produce(store, partition: int, value: bytes, topic="t") -> str:
    before = l0_keys(store)
    with Producer(store, epoch_ttl_s=0) as prod:
        got = prod.write([((topic, partition), [Record(value)])])[0]
    assert got.accepted, got.error
    (key,) = l0_keys(store) - before
    return key


def test_a_quiet_partition_costs_nothing_between_its_ticks(store, gate):
    """Per partition (a topic of 14 against one of 10 in the same epoch: the run's fixed
    requests, the L0 listing among them, drop out): nothing at all in an epoch without a
    tick; in one with, the GET of the pack state's last entry, the tick's PUT and the
    page of listing after it -- no 404 after the state (the create is the probe)."""
    warm(store, gate, "a", 10)
    create_topic(store, "b", 14)
    for _ in range(4):
        epoch(store, gate)
    seen = set()
    for _ in range(2):
        ClusterEpoch(store).advance()
        counts = []
        for topic in ("a", "b"):
            counting = CountingStore(store)
            s = reconcile(counting, topics=[topic])
            assert s.ok and {p.status for p in s.partitions} <= {"idle", "advanced"}, s
            counts.append((dict(counting.counts), s.partitions_advanced))
        (few, ta), (many, tb) = counts
        assert (ta, tb) in ((0, 0), (10, 14)), counts
        ticked = tb > 0
        seen.add(ticked)
        per = {verb: (many.get(verb, 0) - few.get(verb, 0)) / 4 for verb in set(few) | set(many)}
        want = {
            "head": 0.0,
            "get": 1.0 if ticked else 0.0,
            "put": 1.0 if ticked else 0.0,
            "list": 1.0 if ticked else 0.0,
        }
        assert {k: per.get(k, 0.0) for k in want} == want, (per, few, many)
        assert run_gc(store, gate=gate).status == "ok"
    assert seen == {True, False}


def test_a_placeholder_in_a_quiet_partition_is_found_by_its_l0_object(store, gate):
    """One partition of ten is written to: the next run reconciles it (its L0 object
    names it); after a GC, a run in the same epoch reads that one partition's log (its
    L0 object is still there) and none of the other nine."""
    warm(store, gate)
    produce(store, 3, b"x")
    ClusterEpoch(store).advance()
    s = reconcile(store)
    assert s.ok and s.partitions_reconciled == 1, s
    assert next(p for p in s.partitions if p.partition == 3).status == "reconciled"
    assert run_gc(store, gate=gate).status == "ok"
    logs = CountingLogs(store)
    s = reconcile(logs)
    assert s.ok and s.partitions_advanced == 0, s
    assert logs.partitions_read == {("t", 3)}, logs.partitions_read
    assert_exactly_once(store, "t", {p: [Record(b"x")] if p == 3 else [] for p in range(P)}, all_in_l1=True)


class CountingLogs(CountingStore):
    """Which partitions' log keys a run GETs."""

    def __init__(self, inner):
        super().__init__(inner)
        self.partitions_read: set[tuple[str, int]] = set()

    def get(self, key):
        if key.startswith(layout.LOGS_ROOT) and "/snapshot" not in key:
            parts = key[len(layout.LOGS_ROOT) :].split("/")
            self.partitions_read.add((parts[0], int(parts[-2])))
        return super().get(key)


def test_a_placeholder_whose_l0_footer_names_another_partition_waits_for_its_tick(store, gate):
    """A forged footer (valid CRC32C) names partition 4 where the chunk is partition
    3's: the run reads 4 and skips 3. Until 3's tick, M stays below the placeholder's
    epoch (its L0 object is never deleted); at the tick, the create collides with the
    placeholder, the partition is read and reconciled, exactly once."""
    warm(store, gate)
    key = produce(store, 3, b"forged-away")
    _, placeholder_epoch = layout.parse_l0_key(key)
    rewrite_footer(store, key, lambda p: 4 if p == 3 else p)
    reconciled = False
    for _ in range(ReconcileSettings(idle_lag=2).idle_lag + 1):
        s, rec = epoch(store, gate)
        r3 = next(p for p in s.partitions if p.partition == 3)
        reconciled = reconciled or r3.status == "reconciled"
        if not reconciled:
            assert rec.m < placeholder_epoch, (rec.m, placeholder_epoch)
            assert store.head(key) is not None
    assert reconciled
    assert_exactly_once(store, "t", {p: [Record(b"forged-away")] if p == 3 else [] for p in range(P)}, all_in_l1=True)


def test_a_placeholder_whose_l0_object_is_gone_is_quarantined_at_its_tick(store, gate):
    """The L0 object is lost after its placeholder landed: nothing names the partition,
    so it is not read until its tick, and then quarantined over the missing object;
    its lower bound never passes the placeholder's epoch meanwhile."""
    warm(store, gate)
    key = produce(store, 6, b"lost")
    _, placeholder_epoch = layout.parse_l0_key(key)
    store.delete_many([key])
    statuses = []
    for _ in range(ReconcileSettings(idle_lag=2).idle_lag + 1):
        ClusterEpoch(store).advance()
        s = reconcile(store)
        statuses.append(next(p.status for p in s.partitions if p.partition == 6))
        rec = run_gc(store, gate=gate)
        assert rec.status == "ok"
        assert rec.m < placeholder_epoch, (rec.m, placeholder_epoch, statuses)
    assert statuses[-1] == "quarantined" and set(statuses) <= {"idle", "quarantined"}, statuses


def test_a_footer_that_does_not_read_makes_the_run_read_every_partition(store, gate):
    warm(store, gate)
    key = produce(store, 2, b"y")
    data = store.get(key)
    store.delete_many([key])
    store.put(key, data[:-20] + bytes([data[-20] ^ 0xFF]) + data[-19:])  # the footer's last byte
    ClusterEpoch(store).advance()
    logs = CountingLogs(store)
    s = reconcile(logs)
    assert s.ok and s.partitions_reconciled == 1, s  # (the chunk itself is intact)
    assert logs.partitions_read == {("t", p) for p in range(P)}, logs.partitions_read
    assert_exactly_once(store, "t", {p: [Record(b"y")] if p == 2 else [] for p in range(P)}, all_in_l1=True)


def test_a_stray_key_under_the_l0_root_makes_the_run_read_every_partition(store, gate):
    warm(store, gate)
    store.put(layout.L0_ROOT + "000/stray.txt", b"not an L0 object")
    produce(store, 5, b"z")
    ClusterEpoch(store).advance()
    logs = CountingLogs(store)
    s = reconcile(logs)
    assert s.ok and s.partitions_reconciled == 1, s
    assert logs.partitions_read == {("t", p) for p in range(P)}, logs.partitions_read


def _replace_the_pack_states_last_entry(store, gate, *, due_next: bool) -> str:
    """Partition 0 quiet in the pack, its tick due in the next epoch or not: the store loses the
    entry its pack state ends at (a tick) and its snapshot, and a producer appends from
    the shorter state, into that slot: a placeholder of an epoch *below* the pack state's
    lower bound. Returns its L0 key."""
    create_topic(store, "t", P)
    log = plog(store, "t", 0, write_snapshots=False)
    for _ in range(4):
        epoch(store, gate)
    while True:  # the pack's state of partition 0 ends at its newest entry
        st = newest_pack(store).states[("t", 0)][0]
        if (
            ClusterEpoch(store).current() + 1 - st.min_epoch_lower_bound >= ReconcileSettings(idle_lag=2).idle_lag
        ) == due_next:
            break
        epoch(store, gate)
    last_off = st.applied_offset
    store.delete_many([log.key(last_off), layout.snapshot("t", 0, log.topic_id)])
    short = plog(store, "t", 0, write_snapshots=False).read_state()
    before = l0_keys(store)
    with Producer(store, epoch_ttl_s=0) as prod:
        got = prod.write([(("t", 0), [Record(b"victim")])], epoch=short.max_applied_epoch)[0]
    assert got.accepted, got.error
    (key,) = l0_keys(store) - before
    assert layout.parse_l0_key(key)[1] < st.min_epoch_lower_bound
    assert plog(store, "t", 0, write_snapshots=False).read_state().applied_offset == last_off
    return key


def test_a_placeholder_in_the_slot_of_a_pack_states_lost_entry_is_read_at_once(store, gate):
    """Its L0 object names the partition, whatever its epoch: the next run reads the
    partition, the log does not vouch for the pack's state, and the placeholder is
    reconciled, in an epoch where its tick is not due. (Named only by objects of an
    epoch at or above the pack state's bound, it was not: that rule holds for a log, not
    for a store that lost the entry the bound came from.)"""
    _replace_the_pack_states_last_entry(store, gate, due_next=False)
    ClusterEpoch(store).advance()
    s = reconcile(store)
    r0 = next(p for p in s.partitions if p.partition == 0)
    assert r0.status == "reconciled", r0
    assert_exactly_once(store, "t", {p: [Record(b"victim")] if p == 0 else [] for p in range(P)}, all_in_l1=True)


def test_a_pack_state_whose_entry_was_replaced_is_read_not_ticked(store, gate):
    """The store loses a quiet partition's newest entry and a producer's placeholder
    lands in its slot, its L0 object's footer forged to name another partition: nothing
    names it, so the pack's state would be ticked -- but the tick first GETs the entry
    that state ends at, finds other bytes, and the partition is read from its log: the
    placeholder is reconciled, exactly once."""
    key = _replace_the_pack_states_last_entry(store, gate, due_next=True)
    rewrite_footer(store, key, lambda p: 1)
    ClusterEpoch(store).advance()
    s = reconcile(store)
    r0 = next(p for p in s.partitions if p.partition == 0)
    assert r0.status == "reconciled", r0
    assert_exactly_once(store, "t", {p: [Record(b"victim")] if p == 0 else [] for p in range(P)}, all_in_l1=True)
