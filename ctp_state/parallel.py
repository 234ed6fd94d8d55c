"""Per-partition work on threads: a map, and how many requests to keep in flight."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from ctp_state.settings import ReconcileSettings
from ctp_state.storage import ObjectStore

T = TypeVar("T")
U = TypeVar("U")


def write_threads(store: ObjectStore, config: ReconcileSettings) -> int:
    """Claims and commits in flight: the setting, capped by what the store gains from
    (:attr:`ObjectStore.write_concurrency`)."""
    return max(1, min(config.threads, getattr(store, "write_concurrency", config.threads)))


def pmap(fn: Callable[[T], U], items: Sequence[T], threads: int) -> list[U]:
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(items)))) as pool:
        return list(pool.map(fn, items))
