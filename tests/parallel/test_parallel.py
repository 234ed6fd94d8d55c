"""Per-partition work on threads (``ctp_state/parallel.py``): in order, several items a
task, the first error in order raised; reads on a file store on one thread."""

from __future__ import annotations

import threading

import pytest

from ctp_state.parallel import pmap, read_threads
from ctp_state.storage import LocalStore


@pytest.mark.parametrize("threads", [1, 4, 32])
def test_results_in_order_and_the_first_error_in_order_is_raised(threads):
    done, lock = set(), threading.Lock()

    def fn(x: int) -> int:
        with lock:
            done.add(x)
        if x in (3, 150, 151):
            raise ValueError(f"item {x}")
        return x * x

    with pytest.raises(ValueError, match="item 3$"):
        pmap(fn, list(range(400)), threads)
    assert set(range(4)) <= done  # (what runs after it may not: as with pool.map)
    assert pmap(lambda x: x * x, list(range(400)), threads) == [x * x for x in range(400)]
    assert pmap(fn, [], threads) == []


def test_reads_on_a_file_store_run_on_one_thread(tmp_path):
    # threads there only contend for the GIL (the GC from its pack at 100k partitions:
    # 23 s on one thread, 37 s on 32)
    assert read_threads(LocalStore(str(tmp_path)), 32) == 1
    assert read_threads(object(), 32) == 32  # (a store that says nothing: the setting)


@pytest.mark.parametrize("enabled", [True, False])
def test_a_gc_run_and_a_reconcile_run_pause_the_cyclic_collector_and_leave_it_as_they_found_it(store, gate, enabled):
    """Seen from inside each run (its progress callback, on its own thread): off; after
    it, as before. A run that raises leaves it as it found it too."""
    import gc

    from ctp_state.epoch import ClusterEpoch
    from ctp_state.gc import run_gc
    from ctp_state.reconcile import run_reconcile
    from tests.support.gc import produce, reconciled

    reconciled(store)
    produce(store)
    ClusterEpoch(store).advance()
    seen: list[bool] = []
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        run_reconcile(store, on_progress=lambda *a: seen.append(gc.isenabled()))
        assert gc.isenabled() is enabled
        run_gc(store, gate=gate, on_progress=lambda *a: seen.append(gc.isenabled()))
        assert gc.isenabled() is enabled

        def boom(*a):
            raise RuntimeError("stop")

        with pytest.raises(RuntimeError):
            run_gc(store, gate=gate, on_progress=boom)
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
    assert seen and not any(seen)
