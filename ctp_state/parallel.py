"""Per-partition work on threads: a map, and how many requests to keep in flight."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

from ctp_state.settings import ReconcileSettings
from ctp_state.storage import ObjectStore

T = TypeVar("T")
U = TypeVar("U")


def write_threads(store: ObjectStore, config: ReconcileSettings) -> int:
    """Claims and commits in flight: the setting, capped by what the store gains from
    (:attr:`ObjectStore.write_concurrency`)."""
    return max(1, min(config.threads, getattr(store, "write_concurrency", config.threads)))


def read_threads(store: ObjectStore, threads: int) -> int:
    """Reads in flight: ``threads``, capped by what the store gains from
    (:attr:`ObjectStore.read_concurrency`: 1 for a file store, where threads only
    contend for the GIL -- the GC from its pack at 100k partitions: 23 s on one
    thread, 37 s on 32)."""
    return max(1, min(threads, getattr(store, "read_concurrency", threads)))


def pmap(fn: Callable[[T], U], items: Sequence[T], threads: int) -> list[U]:
    """``[fn(x) for x in items]`` on up to ``threads`` threads, in order, several items
    a task (:func:`chunked_map`); on one thread, in this one (a pool's per-task cost is
    a third of a state read on a file store). The first error in order is raised; as
    with ``pool.map``, items not started by then do not run (no caller counts on them: a
    run that raises is a run that stopped, as if killed)."""
    if not items:
        return []
    if threads <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(items)))) as pool:
        return list(chunked_map(pool, fn, items, threads))


def chunked_map(pool: Executor, fn: Callable[[T], U], items: Sequence[T], threads: int) -> Iterator[U]:
    """``pool.map(fn, items)``, in order, with several items a task: a thread pool
    ignores ``map``'s ``chunksize``, and a future per item costs more than a local
    read (20k futures: about a second). Chunks of up to 64 items, at least four per
    thread so the threads stay busy."""
    size = max(1, min(64, len(items) // (4 * max(1, threads))))
    chunks = [items[i : i + size] for i in range(0, len(items), size)]
    for out in pool.map(lambda chunk: [fn(x) for x in chunk], chunks):
        yield from out


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for a run (as a decorator:
    ``@collector_paused()``). A run builds a few objects per partition, nearly none in a
    cycle (reference counting frees them), and the collector walked all of them again
    and again as they grew: at 100k partitions, 2.2-2.6 s of the GC's 10-12 s read
    before M, collecting 70 objects. Re-enabled on the way out by whoever found it on
    (runs on several threads of one process end with it on)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
