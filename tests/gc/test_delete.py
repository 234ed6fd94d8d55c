"""The L0 deleter (ctp_state/gc/delete.py): listing each spread prefix up to M and no
further, keys that do not parse, the grace for young objects, batches, and throttled or
failing deletes. (M itself: test_m.py.)"""

from __future__ import annotations

import os

import pytest

from ctp_state import layout
from ctp_state.errors import CorruptData
from ctp_state.gc import backoff_delay, delete_objects, plan_l0_deletes
from ctp_state.storage import ObjectStore
from tests.support.gc import FlakyStore


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
