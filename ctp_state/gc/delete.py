"""Deleting L0 objects at or below M.

Deletion lists each spread prefix of the L0 root (in parallel), in key order, which is
epoch order, and stops at the first key above M: the cost follows the garbage, not the
live data; one level listing per prefix (an entry per epoch) then looks for keys that
do not parse behind that point. A key that does not parse is never deleted and stops
the run before any delete. Deletes go out in batches of at most 1000 keys, a few in
flight; a store that throttles gets fewer requests per spread prefix (AIMD,
:mod:`ctp_state.throttle`), not just the same requests again; keys that fail are
retried with exponential backoff and counted, never ignored.

This module does not decide *whether* to delete: the GC run (:mod:`ctp_state.gc.run`)
passes the Great Expectations gate first (monotonic M and the other invariants) and
only then calls :func:`delete_objects`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ctp_state import crashpoints, layout
from ctp_state.errors import CorruptData, ObjectNotFound, StoreError
from ctp_state.storage import MAX_DELETE_BATCH, DeleteResult, ObjectInfo, ObjectStore
from ctp_state.throttle import Aimd, Ticket, is_throttle
from ctp_state.validate import MAX_EPOCH


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
    list_retries: int = 0
    throttled: int = 0  # throttled responses (503 SlowDown and the like) to listing and deletes
    lowest_limit: float = 0.0  # the lowest per-prefix delete concurrency AIMD went down to (0: no deletes)
    min_epoch_seen: int | None = None
    max_epoch_seen: int | None = None
    failed_keys: dict[str, str] = field(default_factory=dict)

    def see(self, epoch: int) -> None:
        self.min_epoch_seen = epoch if self.min_epoch_seen is None else min(self.min_epoch_seen, epoch)
        self.max_epoch_seen = epoch if self.max_epoch_seen is None else max(self.max_epoch_seen, epoch)


@dataclass
class Scan:
    """What listing one spread prefix found."""

    candidates: list[tuple[ObjectInfo, int]] = field(default_factory=list)  # (object, epoch) at or below M
    listed: int = 0
    above: int = -1  # first epoch above M, -1 if none
    lowest: int = -1  # lowest epoch seen, -1 if none
    retries: int = 0  # listings resumed after a throttle or a transient error
    throttled: int = 0


def backoff_delay(attempt: int, base_s: float, cap_s: float) -> float:
    """Exponential backoff: ``base_s * 2**attempt``, at most ``cap_s``."""
    return float(min(cap_s, base_s * (2**attempt)))


def scan_prefix(
    store: ObjectStore,
    prefix: str,
    m: int,
    *,
    lister: ObjectStore | None = None,
    limiter: Aimd | None = None,
    max_attempts: int = 10,
    throttle_attempts: int = 60,
    backoff_s: float = 0.1,
    max_backoff_s: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Scan:
    """List one spread prefix in epoch order up to M.

    The listing is bounded at the first key of epoch M + 1 (``end_before``), so no store
    reads past the garbage: a file store never opens a live epoch's directory, S3 stops
    within the page that reaches it. One level listing of the prefix (an entry per
    epoch, :func:`check_epoch_dirs`) then finds the first live epoch and any name
    that does not parse behind the bound.

    A listing that fails part way (a throttle, a reset connection) resumes after the
    last key it returned; a throttle paces this prefix through ``limiter`` (listing a
    prefix is sequential, page after page, so slowing down means waiting longer between
    requests), other errors back off exponentially. Raises :class:`CorruptData` naming
    the first key that does not parse, :class:`StoreError` once retries are spent.
    ``lister`` (default ``store``) is the view the listing goes through
    (:meth:`ObjectStore.bulk`).
    """
    limiter = limiter or Aimd(1)
    lister = lister or store
    scan = Scan()
    last: str | None = None
    # Keys of epoch M + 1 and above sort at or after this (none when M is the last epoch)
    bound = layout.l0_epoch_prefix(prefix, m + 1) if m < MAX_EPOCH else None
    errors = throttles = 0  # failures since the listing last made progress
    failed_at: str | None = None
    while True:
        ticket = limiter.acquire(prefix)
        try:
            for info in lister.list(prefix, start_after=last, end_before=bound):
                scan.listed += 1
                last = info.key
                _, epoch = layout.parse_l0_key(info.key)
                scan.lowest = epoch if scan.lowest < 0 else scan.lowest
                if epoch > m:  # a store must not list past the bound; if one does, stop there
                    scan.above = epoch
                    break
                scan.candidates.append((info, epoch))
        except StoreError as e:
            if isinstance(e, ObjectNotFound):
                limiter.release(ticket)
                raise
            if last != failed_at:  # this attempt listed something: a fresh budget
                errors = throttles = 0
            failed_at = last
            scan.retries += 1
            if is_throttle(e.code):
                limiter.throttled(ticket)
                scan.throttled += 1
                throttles += 1
                if throttles >= throttle_attempts:
                    raise
            else:
                limiter.release(ticket)
                errors += 1
                if errors >= max_attempts:
                    raise
                sleep(backoff_delay(errors - 1, backoff_s, max_backoff_s))
            continue
        except BaseException:
            limiter.release(ticket)
            raise
        limiter.success(ticket)
        break
    epochs = check_epoch_dirs(store, prefix)
    live = [e for e in epochs if e > m]
    if live and scan.above < 0:
        scan.above = live[0]
    if epochs and scan.lowest < 0:
        scan.lowest = epochs[0]
    return scan


def check_epoch_dirs(store: ObjectStore, prefix: str) -> list[int]:
    """The epochs of a spread prefix, in order, from one level listing (an entry per
    epoch). The bounded listing never sees a key that sorts after its bound: this finds
    any directory or stray object there that does not parse, and raises
    :class:`CorruptData` naming it; a bad name inside a live epoch's directory is found
    by the listing once that epoch is at or below M."""
    dirs, stray = store.list_level(prefix)
    if stray:
        raise CorruptData(stray[0].key, "key under the L0 root does not parse as l0/<spread>/<epoch>/<id>.l0")
    epochs = []
    for d in dirs:
        name = d[len(prefix) :].rstrip("/")
        if len(name) != 18 or not name.isdigit() or not name.isascii():
            first = next(iter(store.list(d)), None)
            if first is None:
                continue  # an emptied directory some servers (SeaweedFS) keep listing: no key, nothing wrong
            raise CorruptData(first.key, "key under the L0 root does not parse as l0/<spread>/<epoch>/<id>.l0")
        epochs.append(int(name))
    return epochs


def plan_l0_deletes(
    store: ObjectStore,
    m: int,
    *,
    now_s: float,
    grace_s: float = 0.0,
    threads: int = 8,
    counters: GcCounters | None = None,
    bulk: ObjectStore | None = None,
) -> tuple[list[ObjectInfo], GcCounters]:
    """Everything under the L0 root with epoch <= ``m`` and older than ``grace_s``.

    Listing happens before any delete, so an unparseable key stops the run with nothing
    deleted. ``bulk`` (default ``store``) is the view the per-prefix listings go
    through (:meth:`ObjectStore.bulk`).
    """
    c = counters or GcCounters()
    prefixes, stray = store.list_level(layout.L0_ROOT)
    if stray:
        raise CorruptData(stray[0].key, "key under the L0 root does not parse as l0/<spread>/<epoch>/<id>.l0")
    # The bounded listings below never read a live epoch: a spread directory whose name
    # does not parse must be caught here, whatever epochs it holds.
    for p in prefixes:
        if not layout.is_spread_prefix(p):
            first = next(iter(store.list(p)), None)
            if first is None:
                continue  # an emptied directory (see ObjectStore.list_level)
            raise CorruptData(first.key, "key under the L0 root does not parse as l0/<spread>/<epoch>/<id>.l0")
    limiter = Aimd(1)
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(prefixes) or 1))) as pool:
        scans = list(pool.map(lambda p: scan_prefix(store, p, m, lister=bulk, limiter=limiter), prefixes))
    todo: list[ObjectInfo] = []
    for scan in scans:
        c.listed += scan.listed
        c.list_retries += scan.retries
        c.throttled += scan.throttled
        if scan.lowest >= 0:
            c.see(scan.lowest)
        if scan.above >= 0:
            c.skipped_above_m += 1
            c.see(scan.above)
        for info, epoch in scan.candidates:
            c.see(epoch)
            if grace_s and now_s - info.mtime < grace_s:
                c.skipped_too_young += 1
            else:
                todo.append(info)
    return todo, c


def spread_of(key: str) -> str:
    """The prefix a store throttles ``key`` under: its spread prefix for an L0 key
    (``l0/<spread>/``), else its parent directory."""
    if key.startswith(layout.L0_ROOT):
        cut = key.find("/", len(layout.L0_ROOT))
        if cut > 0:
            return key[: cut + 1]
    return key.rsplit("/", 1)[0] + "/" if "/" in key else ""


@dataclass
class _Job:
    keys: list[str]
    index: int  # the batch it started as
    errors: int = 0  # failed attempts that were not throttles
    throttles: int = 0
    not_before: float = 0.0
    prefixes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.prefixes = sorted({spread_of(k) for k in self.keys})


def delete_objects(
    store: ObjectStore,
    objects: Sequence[ObjectInfo],
    *,
    counters: GcCounters | None = None,
    in_flight: int = 4,
    max_attempts: int = 10,
    throttle_attempts: int = 60,
    backoff_s: float = 0.1,
    max_backoff_s: float = 2.0,
    limiter: Aimd | None = None,
    clock: Callable[[], float] = time.monotonic,
    on_progress: Callable[[int, int], None] = lambda done, total: None,
) -> GcCounters:
    """Delete ``objects`` in batches of at most 1000 keys, up to ``in_flight`` batches at
    a time, with adaptive concurrency per spread prefix.

    Keys are batched in spread-prefix order, so a batch touches few prefixes. A batch
    goes out only when each of its prefixes has room under ``limiter`` (AIMD: a throttle
    halves the prefix's limit, successes grow it back by one per round trip). Throttled
    keys go back in the queue (up to ``throttle_attempts`` times); keys failing
    otherwise are retried with exponential backoff up to ``max_attempts`` attempts; what
    still fails is counted in ``delete_errors`` and ``failed_keys``, never ignored.
    A store that gains nothing from parallel batches (a file store,
    :attr:`ObjectStore.delete_concurrency`) gets fewer in flight.
    """
    c = counters or GcCounters()
    in_flight = max(1, min(in_flight, getattr(store, "delete_concurrency", in_flight)))
    sizes = {o.key: o.size for o in objects}
    ordered = sorted(sizes, key=spread_of)  # stable: keeps listing order inside a prefix
    queue: deque[_Job] = deque(
        _Job(ordered[i : i + MAX_DELETE_BATCH], n) for n, i in enumerate(range(0, len(ordered), MAX_DELETE_BATCH))
    )
    limiter = limiter or Aimd(max(1, in_flight))
    cond = threading.Condition()
    active = [0]
    done = [0]

    def take() -> tuple[_Job, list[Ticket]] | None:
        """The first queued job that may go now (caller holds ``cond``); waits if none."""
        while True:
            if not queue and not active[0]:
                return None
            now = clock()
            for i, job in enumerate(queue):
                if job.not_before > now:
                    continue
                tickets = limiter.try_acquire_all(job.prefixes)
                if tickets is not None:
                    del queue[i]
                    active[0] += 1
                    return job, tickets
            cond.wait(0.02)  # a finishing job notifies; pacing and backoff end by the clock

    def again(keys: dict[str, str], spent: bool, retry: _Job) -> int:
        """Queue ``retry`` for failed ``keys``, or count them as failed once attempts are
        ``spent``; return how many keys are finished (caller holds ``cond``)."""
        if spent:
            c.delete_errors += len(keys)
            c.failed_keys.update(keys)
            return len(keys)
        c.delete_retries += len(keys)
        queue.append(retry)
        return 0

    def settle(job: _Job, tickets: list[Ticket], raw: DeleteResult) -> None:
        asked = set(job.keys)  # the plan bounds what is deleted, not the store's answer
        errors = {k: code for k, code in raw.errors.items() if k in asked}
        deleted = {k for k in raw.deleted if k in asked and k not in errors}
        errors.update(dict.fromkeys(asked - deleted - errors.keys(), "missing from the delete response"))
        res = DeleteResult(tuple(k for k in job.keys if k in deleted), errors)
        throttled = {k: code for k, code in res.errors.items() if is_throttle(code)}
        failed = {k: code for k, code in res.errors.items() if k not in throttled}
        hot = {spread_of(k) for k in throttled}
        while tickets:  # popped first: a ticket is given back once, even if this raises
            t = tickets.pop()
            if t.key in hot:
                limiter.throttled(t)
            elif res.deleted:
                limiter.success(t)
            else:
                limiter.release(t)
        now = clock()
        with cond:
            for key in res.deleted:
                c.deleted += 1
                c.deleted_bytes += sizes[key]
            finished = len(res.deleted)
            if throttled:
                c.throttled += 1
                finished += again(
                    throttled,
                    job.throttles + 1 >= throttle_attempts,
                    _Job(list(throttled), job.index, job.errors, job.throttles + 1, now),
                )
            if failed:
                finished += again(
                    failed,
                    job.errors + 1 >= max_attempts,
                    _Job(
                        list(failed),
                        job.index,
                        job.errors + 1,
                        job.throttles,
                        now + backoff_delay(job.errors, backoff_s, max_backoff_s),
                    ),
                )
            done[0] += finished
            if finished:
                on_progress(done[0], len(sizes))

    def worker() -> None:
        while True:
            with cond:
                picked = take()
            if picked is None:
                return
            job, tickets = picked
            try:
                res = store.delete_many(job.keys)  # at most 1000 keys: one request
                settle(job, tickets, res)
            except BaseException:
                with cond:
                    queue.clear()  # the run fails: the other workers stop too
                raise
            finally:
                for t in tickets:  # those settle() did not give back
                    limiter.release(t)
                with cond:
                    active[0] -= 1
                    cond.notify_all()
            if not (job.errors or job.throttles):
                crashpoints.reached("gc_after_delete_batch", job.index)

    with ThreadPoolExecutor(max_workers=max(1, in_flight)) as pool:
        for f in [pool.submit(worker) for _ in range(max(1, in_flight))]:
            f.result()
    if sizes:
        c.lowest_limit = min(c.lowest_limit, limiter.lowest) if c.lowest_limit else limiter.lowest
    return c
