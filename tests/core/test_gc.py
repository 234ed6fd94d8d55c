"""GC groundwork: M (R4) with who holds it back (R7), and the L0 deleter."""

from __future__ import annotations

import os
import threading

import pytest

from ctp_state import layout
from ctp_state import state as sm
from ctp_state.entries import AccessMode, Claim, Init, Placeholder
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import CorruptData
from ctp_state.gc import backoff_delay, compute_m, delete_objects, plan_l0_deletes
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.status import read_states, select_topics
from ctp_state.storage import DeleteResult, ObjectStore
from ctp_state.topics import create_topic
from tests.support import Wrapped


def st(topic: str, p: int, *entries) -> sm.PartitionState:
    return sm.replay(sm.PartitionState(topic, p), 0, list(entries))


def test_m_with_no_partitions_is_c_minus_1():
    d = compute_m(7, [], now_ms=0)
    assert d.m == 6 and d.held_by[0].topic is None and "C=7" in d.held_by[0].reasons[0]


def test_m_is_the_minimum_and_says_why():
    busy = st("t", 0, Init(3), Placeholder(3, layout.l0_key(0, 3, "k"), 8, 100, 5, 0))  # M(p) = 2, lag 1
    stuck = st("t", 1, Init(3), Claim(1, "rec-x", AccessMode.EXCLUSIVE, 50, 0))  # lease over at 50
    fresh = st("t", 2, Init(9))
    q = st("t", 3, Init(3))
    d = compute_m(10, [busy, stuck, fresh, q], now_ms=100, quarantined={("t", 3): ("l0/001/x.l0", "CRC32C mismatch")})
    assert d.m == 2
    why = {(h.topic, h.partition): " | ".join(h.reasons) for h in d.held_by}
    assert set(why) == {("t", 0), ("t", 1), ("t", 3)}
    assert "reconciler lag: 1 placeholders, 5 records, 100 bytes" in why[("t", 0)]
    assert "stuck claim: rec-x" in why[("t", 1)]
    assert "quarantined: CRC32C mismatch (L0 key l0/001/x.l0)" in why[("t", 3)]


def test_an_uninitialized_partition_blocks_collection():
    d = compute_m(10, [st("t", 0, Init(3)), sm.PartitionState("t", 1)], now_ms=0)
    assert d.m is None and d.held_by[0].partition == 1 and "no init entry" in d.held_by[0].reasons[0]


def test_a_partition_created_while_a_gc_runs_keeps_its_data(store):
    create_topic(store, "old", 1)
    ce = ClusterEpoch(store)
    for _ in range(3):
        ce.advance()
    c = ce.current()  # the GC reads C first ...
    states = read_states(store, select_topics(store))
    create_topic(store, "new", 1)  # ... a topic appears while it runs ...
    with Producer(store, epoch_ttl_s=0) as prod:
        v = prod.write([(("new", 0), [Record(b"keep me")])])[0]
    assert v.accepted
    d = compute_m(c, states, now_ms=0)  # ... and M comes from what it read
    todo, _ = plan_l0_deletes(store, d.m, now_s=0)
    assert v.l0_key not in {o.key for o in todo}


def put_l0(store: ObjectStore, epochs: list[int], spread: int = 0) -> list[str]:
    keys = [layout.l0_key(spread, e, f"id{e}x{i}") for i, e in enumerate(epochs)]
    for k in keys:
        store.put(k, b"x" * 10)
    return keys


def test_plan_stops_at_the_first_key_above_m_in_each_prefix(store):
    low = put_l0(store, [1, 2, 3], spread=0) + put_l0(store, [2], spread=7)
    put_l0(store, [4, 5, 6, 7, 8], spread=0)
    todo, c = plan_l0_deletes(store, 3, now_s=0)
    assert sorted(o.key for o in todo) == sorted(low)
    assert c.listed == 4  # the garbage alone: the first live epoch comes from the epoch directories
    assert c.skipped_above_m == 1 and (c.min_epoch_seen, c.max_epoch_seen) == (1, 4)


class ScandirCount:
    """Counts the directory entries a file store reads."""

    def __init__(self, monkeypatch):
        self.dirs: list[str] = []
        real = os.scandir

        def counting(path="."):
            self.dirs.append(str(path))
            return real(path)

        monkeypatch.setattr(os, "scandir", counting)


def test_the_gc_listing_never_opens_a_live_epochs_directory(tmp_path, monkeypatch):
    """Issue: the listing per spread prefix read the whole first live epoch directory
    (every live object in it) to find the one key above M. Bounded at epoch M + 1, a
    file store opens the prefix and the garbage epochs' directories only."""
    from ctp_state.storage import LocalStore

    store = LocalStore(str(tmp_path / "s"), fsync=False)
    low = put_l0(store, [1, 2], spread=5)
    live = [layout.l0_key(5, 9, f"live{i}") for i in range(300)]
    for k in live:
        store.put(k, b"x")
    seen = ScandirCount(monkeypatch)
    todo, c = plan_l0_deletes(store, 3, now_s=0)
    assert sorted(o.key for o in todo) == sorted(low) and c.listed == 2
    assert c.skipped_above_m == 1 and c.max_epoch_seen == 9
    live_dir = os.path.join(store.root, "l0", "005", f"{9:018d}")
    assert not any(os.path.normpath(d) == live_dir for d in seen.dirs), seen.dirs


def test_unparseable_keys_stop_the_run_before_any_delete(store):
    put_l0(store, [1, 2])
    store.put("l0/000/not-an-epoch/x.l0", b"")
    with pytest.raises(CorruptData, match="l0/000/not-an-epoch/x.l0"):
        plan_l0_deletes(store, 5, now_s=0)
    store.delete_many(["l0/000/not-an-epoch/x.l0"])
    store.put("l0/README", b"")
    with pytest.raises(CorruptData, match="l0/README"):
        plan_l0_deletes(store, 5, now_s=0)


def test_an_unparseable_key_behind_the_first_live_key_is_still_reported(store):
    # 'z' sorts after every digit: the listing stops at the first live key (epoch 9 > M)
    # and would never reach it. One level listing per prefix sees every epoch directory.
    put_l0(store, [1, 9], spread=3)
    for bad in ("l0/003/zzz/x.l0", "l0/003/999999999999999999x/y.l0", "l0/003/stray-file"):
        store.put(bad, b"")
        with pytest.raises(CorruptData) as e:
            plan_l0_deletes(store, 5, now_s=0)
        assert bad in str(e.value)
        store.delete_many([bad])
    todo, c = plan_l0_deletes(store, 5, now_s=0)
    assert len(todo) == 1 and c.skipped_above_m == 1


def test_young_objects_are_skipped_within_the_grace(store):
    put_l0(store, [1, 2])
    todo, c = plan_l0_deletes(store, 5, now_s=10**10, grace_s=60)
    assert len(todo) == 2 and c.skipped_too_young == 0
    todo, c = plan_l0_deletes(store, 5, now_s=0, grace_s=60)  # "now" before they were written
    assert todo == [] and c.skipped_too_young == 2


def test_deletes_over_1000_in_batches(store):
    from concurrent.futures import ThreadPoolExecutor

    keys = [layout.l0_key(i % 3, 1 + i % 5, f"k{i}") for i in range(1234)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: store.put(k, b"abc"), keys))
    todo, c = plan_l0_deletes(store, 10, now_s=0)
    assert len(todo) == 1234
    delete_objects(store, todo, counters=c)
    assert (c.deleted, c.deleted_bytes, c.delete_errors) == (1234, 3 * 1234, 0)
    assert list(store.list(layout.L0_ROOT)) == []


class FlakyStore(Wrapped):
    """Fault injection: the first ``throttle`` delete requests are refused with SlowDown
    for every key; keys in ``broken`` always fail."""

    def __init__(self, inner: ObjectStore, throttle: int = 0, broken: frozenset[str] = frozenset()):
        super().__init__(inner)
        self.throttle, self.broken, self.requests = throttle, broken, 0
        self._lock = threading.Lock()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _delete_batch(self, keys):
        with self._lock:
            self.requests += 1
            throttled = self.requests <= self.throttle
        if throttled:
            return DeleteResult((), dict.fromkeys(keys, "SlowDown"))
        ok = [k for k in keys if k not in self.broken]
        res = self.inner._delete_batch(ok) if ok else DeleteResult()
        return DeleteResult(res.deleted, {**res.errors, **{k: "AccessDenied" for k in keys if k in self.broken}})


def test_throttling_is_retried_with_backoff_and_failures_are_counted(store):
    keys = put_l0(store, list(range(1, 31)))
    flaky = FlakyStore(store, throttle=2, broken=frozenset(keys[:2]))
    todo, c = plan_l0_deletes(flaky, 100, now_s=0)
    delete_objects(flaky, todo, counters=c, max_attempts=3, backoff_s=0.01)
    assert c.deleted == 28 and c.delete_errors == 2
    assert set(c.failed_keys) == set(keys[:2]) and set(c.failed_keys.values()) == {"AccessDenied"}
    assert c.throttled == 2  # two throttled requests, each answered by backing off
    assert c.delete_retries == 30 + 30 + 2 * 2  # two throttled rounds of every key, two retries of the broken ones
    assert {o.key for o in store.list(layout.L0_ROOT)} == set(keys[:2])  # nothing else survived


def test_backoff_doubles_up_to_its_cap():
    assert [backoff_delay(a, 0.2, 1.0) for a in range(5)] == [0.2, 0.4, 0.8, 1.0, 1.0]


def test_partitions_at_c_minus_1_are_not_reported_as_holding_m_back():
    d = compute_m(5, [st("t", 0, Init(5)), st("t", 1, Init(5))], now_ms=0)
    assert d.m == 4 and [h.topic for h in d.held_by] == [None]
