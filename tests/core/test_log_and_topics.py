"""The state log, topics and epoch reads against real stores: costs, claims, resumes."""

from __future__ import annotations

import threading
import time

import pytest

from ctp_state import layout
from ctp_state.entries import AccessMode, Init, Placeholder, encode
from ctp_state.epoch import ClusterEpoch, EpochCache
from ctp_state.errors import ClaimHeld, TopicExists
from ctp_state.log import PartitionLog
from ctp_state.storage import ObjectStore
from ctp_state.topics import create_topic, get_topic, list_topics
from tests.support import key_id, plog


class CountingStore(ObjectStore):
    """Wraps a store and counts requests by verb."""

    def __init__(self, inner: ObjectStore):
        self.inner, self.url, self.counts = inner, inner.url, {}

    def _n(self, verb: str) -> None:
        self.counts[verb] = self.counts.get(verb, 0) + 1

    def get(self, key):
        self._n("get")
        return self.inner.get(key)

    def get_range(self, key, start, length):
        self._n("get")
        return self.inner.get_range(key, start, length)

    def put(self, key, data):
        self._n("put")
        return self.inner.put(key, data)

    def put_if_absent(self, key, data):
        self._n("put")
        return self.inner.put_if_absent(key, data)

    def head(self, key):
        self._n("head")
        return self.inner.head(key)

    def list(self, prefix="", start_after=None, end_before=None):
        self._n("list")
        return self.inner.list(prefix, start_after, end_before)

    def list_level(self, prefix):
        self._n("list")
        return self.inner.list_level(prefix)

    def _delete_batch(self, keys):
        self._n("delete")
        return self.inner._delete_batch(keys)


def ph(epoch: int, i: int) -> Placeholder:
    return Placeholder(epoch, f"l0/000/{epoch:018d}/{i}.l0", 8, 10, 1, 0)


def test_reading_state_costs_a_snapshot_get_one_list_and_the_tail(store):
    create_topic(store, "t", 1)
    log = plog(store, "t", 0, snapshot_every=16)
    s = log.read_state()
    for i in range(200):
        s = log.append(s, lambda _s, i=i: ph(1, i)).outcome.state
    # Appenders never snapshot (their states hold entries they never read back): the
    # first reader folds all 201 entries from the store and leaves a snapshot.
    assert plog(store, "t", 0).read_snapshot().applied_offset == -1
    first = CountingStore(store)
    assert PartitionLog(first, get_topic(store, "t"), 0, snapshot_every=16).read_state() == s
    assert first.counts == {"get": 1 + 201, "list": 1, "put": 1}
    for i in range(10):  # a tail shorter than snapshot_every
        s = log.append(s, lambda _s, i=i: ph(1, 200 + i)).outcome.state
    counting = CountingStore(store)
    fresh = PartitionLog(counting, get_topic(store, "t"), 0, snapshot_every=16).read_state()
    assert fresh == s and fresh.applied_offset == 210
    tail = 210 - plog(store, "t", 0).read_snapshot().applied_offset
    assert tail == 10
    assert counting.counts == {"get": 1 + tail, "list": 1}  # snapshot + tail entries


def test_epoch_read_is_constant_cost_however_many_advances(store):
    ce = ClusterEpoch(store)
    for _ in range(30):
        ce.advance()
    counting = CountingStore(store)
    assert ClusterEpoch(counting).current() == 31
    # The hint, then one LIST that both vouches for it (its marker comes first) and
    # finds any newer markers.
    assert counting.counts == {"get": 1, "list": 1}


def test_epoch_cache_rereads_only_after_its_ttl(store):
    now = [0.0]
    cache = EpochCache(ClusterEpoch(store), ttl_s=5, clock=lambda: now[0])
    assert cache.get() == 1
    ClusterEpoch(store).advance()
    now[0] = 4.9
    assert cache.get() == 1  # stale, and that is safe
    now[0] = 5.0
    assert cache.get() == 2
    ClusterEpoch(store).advance()
    cache.invalidate()
    assert cache.get() == 3


def test_partition_inits_carry_the_epoch_current_at_creation(store):
    ce = ClusterEpoch(store)
    for _ in range(3):
        ce.advance()
    create_topic(store, "t", 3)
    for p in range(3):
        s = plog(store, "t", p).read_state()
        assert (s.max_applied_epoch, s.previous_applied_epoch, s.min_epoch_lower_bound, s.m) == (4, 4, 4, 3)
        assert s.window == (4, 4)


def test_a_crashed_topic_creation_is_finished_by_running_it_again(store):
    # The crash left the metadata and the init of partition 0 only.
    store.put_if_absent(layout.topic_meta("t"), b'{"v":1,"name":"t","partitions":3,"created_ms":1}')
    store.put_if_absent(layout.log_entry("t", 0, 0), encode(Init(1)))
    ClusterEpoch(store).advance()
    assert not plog(store, "t", 2).read_state().initialized
    create_topic(store, "t", 3)  # resumes
    assert plog(store, "t", 0).read_state().max_applied_epoch == 1
    assert plog(store, "t", 2).read_state().max_applied_epoch == 2
    with pytest.raises(TopicExists):
        create_topic(store, "t", 3)  # complete now: a plain re-create is an error
    with pytest.raises(TopicExists):
        create_topic(store, "t", 5)
    assert [t.name for t in list_topics(store)] == ["t"]


def test_exclusive_claim_fails_at_once_and_wait_for_exclusive_waits_for_release(store):
    create_topic(store, "t", 1)
    a = plog(store, "t", 0)
    held = a.claim(a.read_state(), "reconciler-a", AccessMode.EXCLUSIVE, lease_ms=60_000)
    assert held.outcome.accepted and held.outcome.state.writer_epoch == 1
    b = plog(store, "t", 0)
    t0 = time.monotonic()
    with pytest.raises(ClaimHeld) as e:
        b.claim(b.read_state(), "reconciler-b", AccessMode.EXCLUSIVE)
    assert time.monotonic() - t0 < 5 and e.value.owner == "reconciler-a"

    def release_soon() -> None:
        time.sleep(0.5)
        a.release(a.read_state(), "reconciler-a", 1)

    threading.Thread(target=release_soon).start()
    got = b.claim(b.read_state(), "reconciler-b", AccessMode.WAIT_FOR_EXCLUSIVE, wait_timeout_s=20)
    assert got.outcome.accepted and got.outcome.state.writer_epoch == 2
    assert [h.owner for h in got.outcome.state.holders] == ["reconciler-b"]


def test_wait_for_exclusive_gives_up_after_its_timeout(store):
    create_topic(store, "t", 1)
    a = plog(store, "t", 0)
    a.claim(a.read_state(), "a", AccessMode.EXCLUSIVE, lease_ms=600_000)
    with pytest.raises(ClaimHeld):
        a.claim(a.read_state(), "b", AccessMode.WAIT_FOR_EXCLUSIVE, wait_timeout_s=0.3)


def test_lost_response_retry_does_not_duplicate_the_entry(store):
    create_topic(store, "t", 1)
    log = plog(store, "t", 0)
    s = log.read_state()
    entry = ph(1, 0)
    store.put_if_absent(log.key(1), encode(entry))  # our PUT landed, its response was lost
    appended = log.append(s, lambda _s: entry)  # the retry finds its own bytes there
    assert appended.offset == 1 and appended.outcome.accepted
    assert [o for o, _ in log.entries()] == [0, 1]


def test_a_reconcile_leaves_a_snapshot_at_the_log_end_of_every_partition_it_claimed(store):
    """Readers (the GC's M over every partition) replay no tail after a reconcile run:
    it snapshots the state it holds after its release. Without that, each idle advance
    (claim, then an advance that releases) grows every partition's tail by two entries
    up to ``snapshot_every`` and M at 100k partitions replays millions of entries."""
    from ctp_state.reconcile import run_reconcile
    from ctp_state.settings import ReconcileSettings

    create_topic(store, "t", 4)
    for _ in range(ReconcileSettings().idle_lag):
        ClusterEpoch(store).advance()
    s = run_reconcile(store)
    assert s.partitions_advanced == 4
    for p in range(4):
        log = plog(store, "t", p, write_snapshots=False)
        end = max(layout.log_offset_of(o.key, log.prefix) for o in store.list(log.prefix))
        assert end == 2  # init, claim, advance (releasing the claim)
        counting = CountingStore(store)
        PartitionLog(counting, get_topic(store, "t"), p, write_snapshots=False).read_state()
        assert log.read_snapshot().applied_offset == end
        assert counting.counts == {"get": 1, "list": 1}  # the snapshot, and a listing with no tail


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
    from ctp_state.reconcile import run_reconcile
    from tests.support import corrupt_chunk, produce_rounds

    claim, release = ("claim", False), ("release", True)
    produce_rounds(store, "busy", partitions=1, rounds=1, per=5)  # C moves by 1: no advance after
    run_reconcile(store, topics=["busy"])
    assert _kinds(store, "busy", 0)[2:] == [claim, ("reconcile", True)]
    create_topic(store, "idle", 1)
    produce_rounds(store, "behind", partitions=1, rounds=1, per=5)
    produce_rounds(store, "bad", partitions=1, rounds=1, per=5)
    corrupt_chunk(store, "bad", 0)  # its chunk fails its CRC32C: quarantined
    for _ in range(3):
        ClusterEpoch(store).advance()
    s = run_reconcile(store, topics=["idle", "behind", "bad"])
    assert (s.partitions_advanced, s.partitions_reconciled, s.partitions_quarantined) == (1, 1, 1), s
    assert _kinds(store, "idle", 0)[1:] == [claim, ("advance", True)]
    assert _kinds(store, "behind", 0)[2:] == [claim, ("reconcile", False), ("advance", True)]
    assert _kinds(store, "bad", 0)[2:] == [claim, release]
    for t in ("busy", "idle", "behind", "bad"):
        assert plog(store, t, 0).read_state().holders == (), t
    again = run_reconcile(store, topics=["busy"])  # claimable at once, and now behind C
    assert again.partitions_claim_held == 0 and again.partitions_advanced == 1, again


def test_a_reconcile_run_decodes_each_log_entry_once_when_the_tail_is_long(store):
    """A partition with a long tail (no snapshot, 12 placeholders): the run-start read
    snapshots it, so the read-back before the run's own snapshot decodes only the
    entries the run wrote. Every entry is fetched once in the run; with a short tail
    (below ``START_SNAPSHOT_TAIL``) the start read writes nothing and the read-back
    reads the tail again."""
    from ctp_state.reconcile import START_SNAPSHOT_TAIL, run_reconcile
    from ctp_state.settings import ReconcileSettings
    from tests.support import Wrapped, produce_rounds

    class PerKey(Wrapped):
        def __init__(self, inner):
            super().__init__(inner)
            self.gets: dict[str, int] = {}
            self.lock = threading.Lock()

        def get(self, k):
            with self.lock:
                self.gets[k] = self.gets.get(k, 0) + 1
            return self.inner.get(k)

    produce_rounds(store, "long", partitions=1, rounds=START_SNAPSHOT_TAIL + 4, per=2)
    produce_rounds(store, "short", partitions=1, rounds=2, per=2)
    counting = PerKey(store)
    s = run_reconcile(counting, config=ReconcileSettings(threads=2))
    assert s.partitions_reconciled == 2, s
    for topic, tail, twice in (("long", START_SNAPSHOT_TAIL + 5, 0), ("short", 3, 3)):
        log = plog(store, topic, 0, write_snapshots=False)
        end = max(layout.log_offset_of(o.key, log.prefix) for o in store.list(log.prefix))
        assert end >= tail + 1  # init + placeholders, then the claim and the run's commit
        reads = {k: n for k, n in counting.gets.items() if k.startswith(log.prefix)}
        assert len(reads) == end + 1, (topic, end, reads)
        assert sum(1 for n in reads.values() if n > 1) == twice, (topic, reads)
        assert log.read_snapshot(strict=True).applied_offset == end  # the run's own, at the log end


def test_topic_create_reports_progress_as_the_inits_land(store):
    seen: list[tuple[int, int]] = []
    create_topic(store, "big", 1001, on_progress=lambda d, t: seen.append((d, t)))
    assert seen == [(0, 1001), (1000, 1001), (1001, 1001)]
    assert len(list(store.list(layout.log_prefix("big", 1000, key_id(store, "big"))))) == 1  # the last init is there
