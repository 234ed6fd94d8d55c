"""The cluster epoch read against real stores: its cost, and the cache producers read it through."""

from __future__ import annotations

from ctp_state.epoch import ClusterEpoch, EpochCache
from tests.support import CountingStore


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
