"""What a reconcile run writes to the logs it claims, against real stores: an idle
partition's advance in one entry, each claim released in the partition's last entry, a
snapshot at the log end of each partition it claimed, and each entry decoded once."""

from __future__ import annotations

import threading

from ctp_state import layout
from ctp_state.epoch import ClusterEpoch
from ctp_state.topics import create_topic
from tests.support import CountingStore, plog, reconcile


def idle_reconcile_counts(store, topic: str, partitions: int) -> dict[str, int]:
    """The requests of one reconcile run over ``partitions`` idle partitions due an
    advance (C moved by the idle lag since their init)."""
    from ctp_state.settings import ReconcileSettings

    create_topic(store, topic, partitions)
    for _ in range(ReconcileSettings(idle_lag=2).idle_lag):
        ClusterEpoch(store).advance()
    counting = CountingStore(store)
    s = reconcile(counting, topics=[topic])
    assert s.partitions_advanced == partitions, s
    return dict(counting.counts)


def test_an_idle_partitions_advance_is_one_object_write_and_no_snapshot(store):
    """The request budget of an idle partition (R6 in one ``tick`` entry): per
    partition, one read of its state by GETs and one write, the tick, with the listing
    that guards it; no claim, no release, no read-back, no snapshot. Counted as the
    difference between 4 and 12 partitions, so a run's own fixed requests drop out: a
    change that adds a request per idle partition fails here."""
    idle_reconcile_counts(store, "warm", 1)  # the run summaries' sequence has begun
    few, many = idle_reconcile_counts(store, "a", 4), idle_reconcile_counts(store, "b", 12)
    per = {verb: n for verb in set(few) | set(many) if (n := (many.get(verb, 0) - few.get(verb, 0)) / 8)}
    # GETs of the snapshot (none yet), the init entry and the next key (none: no LIST
    # to read); the tick, after one page of a listing (never written into a hole)
    assert per == {"get": 3, "list": 1, "put": 1}, (few, many)
    for p in range(12):
        assert _kinds(store, "b", p) == [("init", False), ("tick", False)]
        st = plog(store, "b", p).read_state()
        assert st.holders == () and st.min_epoch_lower_bound == ClusterEpoch(store).current()


def _kinds(store, topic: str, p: int) -> list[tuple[str, bool]]:
    """Each entry of a log: its kind, and whether it releases a claim."""
    from ctp_state import entries as en

    log = plog(store, topic, p, write_snapshots=False)
    return [
        (e.kind, isinstance(e, en.Release) or getattr(e, "release_owner", None) is not None) for _, e in log.entries()
    ]


def test_a_reconcile_run_releases_each_claim_in_the_partitions_last_entry(store):
    """A run writes per partition its claim and one more entry, which also releases the
    claim: the reconcile, or the advance (idle, or caught up and behind C after the
    reconcile). A separate release only where neither landed (a quarantined partition).
    Every claim is released; later runs claim again at once."""
    from tests.support import corrupt_chunk, produce_rounds

    claim, release = ("claim", False), ("release", True)
    produce_rounds(store, "busy", partitions=1, rounds=1, per=5)  # C moves by 1: no advance after
    reconcile(store, topics=["busy"])
    assert _kinds(store, "busy", 0)[2:] == [claim, ("reconcile", True)]
    create_topic(store, "idle", 1)
    produce_rounds(store, "behind", partitions=1, rounds=1, per=5)
    produce_rounds(store, "bad", partitions=1, rounds=1, per=5)
    corrupt_chunk(store, "bad", 0)  # its chunk fails its CRC32C: quarantined
    for _ in range(3):
        ClusterEpoch(store).advance()
    s = reconcile(store, topics=["idle", "behind", "bad"])
    assert (s.partitions_advanced, s.partitions_reconciled, s.partitions_quarantined) == (1, 1, 1), s
    assert _kinds(store, "idle", 0)[1:] == [("tick", False)]  # idle and free: one entry
    assert _kinds(store, "behind", 0)[2:] == [claim, ("reconcile", False), ("advance", True)]
    assert _kinds(store, "bad", 0)[2:] == [claim, release]
    for t in ("busy", "idle", "behind", "bad"):
        assert plog(store, t, 0).read_state().holders == (), t
    again = reconcile(store, topics=["busy"])  # claimable at once, and now behind C
    assert again.partitions_claim_held == 0 and again.partitions_advanced == 1, again


def test_a_reconcile_run_decodes_each_log_entry_once_when_the_tail_is_long(store):
    """A partition with a long tail (no snapshot, 12 placeholders): the run-start read
    snapshots it, so the read-back before the run's own snapshot decodes only the
    entries the run wrote. Every entry is fetched once in the run but the one that
    snapshot ends at (the read-back checks its bytes are still there); with a short tail
    (below ``START_SNAPSHOT_TAIL``) the start read writes nothing and the read-back
    reads the tail again."""
    from ctp_state.reconcile import START_SNAPSHOT_TAIL
    from ctp_state.settings import ReconcileSettings
    from tests.support import Wrapped, produce_rounds

    class PerKey(Wrapped):
        def __init__(self, inner):
            super().__init__(inner)
            self.gets: dict[str, int] = {}
            self.lock = threading.Lock()

        def get(self, k):
            data = self.inner.get(k)  # (a probe of the key after a log's end is no read of an entry)
            with self.lock:
                self.gets[k] = self.gets.get(k, 0) + 1
            return data

    produce_rounds(store, "long", partitions=1, rounds=START_SNAPSHOT_TAIL + 4, per=2)
    produce_rounds(store, "short", partitions=1, rounds=2, per=2)
    counting = PerKey(store)
    s = reconcile(counting, config=ReconcileSettings(idle_lag=2, threads=2))
    assert s.partitions_reconciled == 2, s
    for topic, tail, twice in (("long", START_SNAPSHOT_TAIL + 5, 1), ("short", 3, 3)):
        log = plog(store, topic, 0, write_snapshots=False)
        end = max(layout.log_offset_of(o.key, log.prefix) for o in store.list(log.prefix))
        assert end >= tail + 1  # init + placeholders, then the claim and the run's commit
        reads = {k: n for k, n in counting.gets.items() if k.startswith(log.prefix)}
        assert len(reads) == end + 1, (topic, end, reads)
        assert sum(1 for n in reads.values() if n > 1) == twice, (topic, reads)
        assert log.read_snapshot(strict=True).applied_offset == end  # the run's own, at the log end


def test_an_idle_partitions_tail_of_ticks_stays_short(store):
    """A tick leaves no snapshot; the next run's start read leaves one once an idle
    partition's tail reaches ``IDLE_SNAPSHOT_TAIL`` (a tail every later read would GET
    entry by entry), while a busy partition's waits for ``START_SNAPSHOT_TAIL``."""
    from ctp_state.reconcile import IDLE_SNAPSHOT_TAIL
    from ctp_state.settings import ReconcileSettings
    from tests.support.snapshot import log_end, snap_offset

    create_topic(store, "t", 2)
    tails, ticks = [], 0
    for _ in range(6):
        for _ in range(ReconcileSettings(idle_lag=2).idle_lag):
            ClusterEpoch(store).advance()
        ticks += reconcile(store).partitions_advanced
        tails += [log_end(store, "t", p) - snap_offset(store, "t", p) for p in range(2)]
    assert ticks == 12 and max(tails) == IDLE_SNAPSHOT_TAIL and min(tails) < IDLE_SNAPSHOT_TAIL, tails
    assert [kind for kind, _ in _kinds(store, "t", 0)] == ["init"] + ["tick"] * 6
