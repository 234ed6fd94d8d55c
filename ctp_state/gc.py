"""Garbage collection of L0 objects: the safe epoch M (R4, R7) and the deleter.

M = min(C - 1, min over partitions of M(p)), with C read before any partition. A
partition created after C was read starts at an epoch >= C, so it cannot hold data
this M deletes; stale inputs only make M smaller. A partition whose ``init`` entry is
missing (a topic creation still running, or crashed) blocks collection entirely:
its first epoch is not known yet.

Deletion lists each spread prefix of the L0 root (in parallel), in key order, which is
epoch order, and stops at the first key above M: the cost follows the garbage, not the
live data; one level listing per prefix (an entry per epoch) then looks for keys that
do not parse behind that point. A key that does not parse is never deleted and stops
the run before any delete. Deletes go out in batches of at most 1000 keys, a few in flight; keys that fail
are retried with exponential backoff and counted, never ignored.

This module does not decide *whether* to delete: the GC task runs the Great
Expectations checkpoint first (monotonic M and the other invariants) and only then
calls :func:`delete_l0`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ctp_state import faults, layout
from ctp_state import state as sm
from ctp_state.errors import CorruptData
from ctp_state.store import MAX_DELETE_BATCH, ObjectInfo, ObjectStore

# --- M (R4) and who holds it back (R7) ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class Holdback:
    """One reason M is not higher: a partition (or the cluster epoch) at M."""

    topic: str | None  # None: the cluster epoch itself (M = C - 1)
    partition: int | None
    m: int | None
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class MDecision:
    cluster_epoch: int
    m: int | None  # None: nothing may be collected this run
    held_by: tuple[Holdback, ...]
    partitions: int


def compute_m(
    cluster_epoch: int,
    states: Sequence[sm.PartitionState],
    *,
    now_ms: int,
    quarantined: Mapping[tuple[str, int], tuple[str | None, str]] | None = None,
) -> MDecision:
    """R4 over states read *after* ``cluster_epoch``; R7 reasons for the partitions at M.

    ``quarantined`` maps (topic, partition) to (L0 key, reason) from the newest
    reconcile summary. Pure.
    """
    quarantined = quarantined or {}
    missing = [s for s in states if not s.initialized]
    if missing:
        held = tuple(
            Holdback(s.topic, s.partition, None, ("partition has no init entry: topic creation is unfinished "
                                                  "(run `ctp topic create` again); collection waits",))
            for s in missing
        )
        return MDecision(cluster_epoch, None, held, len(states))
    m = min([cluster_epoch - 1] + [s.m for s in states])  # type: ignore[type-var]
    held: list[Holdback] = []
    if cluster_epoch - 1 == m:
        held.append(Holdback(None, None, m, (f"cluster epoch C={cluster_epoch}: M < C always",)))
    for s in states:
        # At M = C - 1 the cluster epoch is what holds M; a partition there is not behind.
        if s.m != m or m == cluster_epoch - 1:
            continue
        reasons: list[str] = []
        if (s.topic, s.partition) in quarantined:
            key, why = quarantined[(s.topic, s.partition)]
            reasons.append(f"quarantined: {why}" + (f" (L0 key {key})" if key else ""))
        if s.lag_entries:
            reasons.append(f"reconciler lag: {s.lag_entries} placeholders, {s.lag_records} records, "
                           f"{s.lag_bytes} bytes")
        for h in s.holders:
            if h.lease_until_ms <= now_ms:
                reasons.append(f"stuck claim: {h.owner} ({h.mode.value}) lease ran out at {h.lease_until_ms} ms")
            else:
                reasons.append(f"claim held by {h.owner} ({h.mode.value}) until {h.lease_until_ms} ms")
        if not reasons:
            reasons.append("idle: lower bound not advanced yet (the next reconcile advances it, R6)")
        held.append(Holdback(s.topic, s.partition, m, tuple(reasons)))
    return MDecision(cluster_epoch, m, tuple(held), len(states))


# --- deleting L0 objects at or below M -------------------------------------------------------


@dataclass
class GcCounters:
    """Per-run counters, as the reference system keeps them."""

    listed: int = 0
    deleted: int = 0
    deleted_bytes: int = 0
    skipped_above_m: int = 0  # first key above M seen in a prefix (listing stops there)
    skipped_too_young: int = 0
    list_errors: int = 0
    delete_errors: int = 0  # keys still failing after every retry
    delete_retries: int = 0
    min_epoch_seen: int | None = None
    max_epoch_seen: int | None = None
    failed_keys: dict[str, str] = field(default_factory=dict)

    def see(self, epoch: int) -> None:
        self.min_epoch_seen = epoch if self.min_epoch_seen is None else min(self.min_epoch_seen, epoch)
        self.max_epoch_seen = epoch if self.max_epoch_seen is None else max(self.max_epoch_seen, epoch)


def scan_prefix(store: ObjectStore, prefix: str, m: int) -> tuple[list[tuple[ObjectInfo, int]], int, int, int]:
    """List one spread prefix in epoch order up to M.

    Returns ((object, epoch) candidates, listed, first epoch above M or -1, min epoch
    seen or -1). Raises :class:`CorruptData` naming the first key that does not parse.
    """
    out: list[tuple[ObjectInfo, int]] = []
    listed = 0
    above = lowest = -1
    for info in store.list(prefix):
        listed += 1
        _, epoch = layout.parse_l0_key(info.key)
        lowest = epoch if lowest < 0 else lowest
        if epoch > m:
            above = epoch
            break
        out.append((info, epoch))
    if above >= 0:
        check_epoch_dirs(store, prefix)
    return out, listed, above, lowest


def check_epoch_dirs(store: ObjectStore, prefix: str) -> None:
    """The listing stopped at the first live key: a key that does not parse and sorts
    after it would never be seen. One level listing of the prefix (one entry per epoch)
    finds any such directory or stray object; a bad name inside a live epoch's
    directory is found by the listing once that epoch is at or below M."""
    dirs, stray = store.list_level(prefix)
    if stray:
        raise CorruptData(stray[0].key, "key under the L0 root does not parse as l0/<spread>/<epoch>/<id>.l0")
    for d in dirs:
        name = d[len(prefix):].rstrip("/")
        if len(name) != 18 or not name.isdigit() or not name.isascii():
            first = next(iter(store.list(d)), None)
            raise CorruptData(first.key if first else d,
                              "key under the L0 root does not parse as l0/<spread>/<epoch>/<id>.l0")


def plan_l0_deletes(store: ObjectStore, m: int, *, now_s: float, grace_s: float = 0.0,
                    threads: int = 8, counters: GcCounters | None = None) -> tuple[list[ObjectInfo], GcCounters]:
    """Everything under the L0 root with epoch <= ``m`` and older than ``grace_s``.

    Listing happens before any delete, so an unparseable key stops the run with nothing
    deleted.
    """
    c = counters or GcCounters()
    prefixes, stray = store.list_level(layout.L0_ROOT)
    if stray:
        raise CorruptData(stray[0].key, "key under the L0 root does not parse as l0/<spread>/<epoch>/<id>.l0")
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(prefixes) or 1))) as pool:
        scans = list(pool.map(lambda p: scan_prefix(store, p, m), prefixes))
    todo: list[ObjectInfo] = []
    for candidates, listed, above, lowest in scans:
        c.listed += listed
        if lowest >= 0:
            c.see(lowest)
        if above >= 0:
            c.skipped_above_m += 1
            c.see(above)
        for info, epoch in candidates:
            c.see(epoch)
            if grace_s and now_s - info.mtime < grace_s:
                c.skipped_too_young += 1
            else:
                todo.append(info)
    return todo, c


def delete_objects(
    store: ObjectStore,
    objects: Sequence[ObjectInfo],
    *,
    counters: GcCounters | None = None,
    in_flight: int = 4,
    max_attempts: int = 5,
    backoff_s: float = 0.2,
    sleep: Callable[[float], None] = time.sleep,
    on_progress: Callable[[int, int], None] = lambda done, total: None,
) -> GcCounters:
    """Delete ``objects`` in batches of at most 1000, ``in_flight`` batches at a time;
    retry failing keys with exponential backoff; count what still fails."""
    c = counters or GcCounters()
    sizes = {o.key: o.size for o in objects}
    batches = [list(sizes)[i:i + MAX_DELETE_BATCH] for i in range(0, len(sizes), MAX_DELETE_BATCH)]
    lock = threading.Lock()
    done = [0]

    def run(job: tuple[int, list[str]]) -> None:
        index, batch = job
        pending = batch
        for attempt in range(max_attempts):
            res = store.delete_many(pending)
            with lock:
                for key in res.deleted:
                    c.deleted += 1
                    c.deleted_bytes += sizes[key]
            if not res.errors:
                break
            pending = list(res.errors)
            if attempt + 1 == max_attempts:
                with lock:
                    c.delete_errors += len(res.errors)
                    c.failed_keys.update(res.errors)
                break
            with lock:
                c.delete_retries += len(pending)
            sleep(backoff_s * (2 ** attempt))
        with lock:
            done[0] += len(batch)
            on_progress(done[0], len(sizes))
        faults.hit("gc_after_delete_batch", index)

    with ThreadPoolExecutor(max_workers=max(1, in_flight)) as pool:
        list(pool.map(run, enumerate(batches)))
    return c
