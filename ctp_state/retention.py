"""Retention and DeleteRecords (R11): a partition's start offset moved forward through its
state log, with Kafka's meaning.

- ``retention_ms``: the oldest committed L1 files go, whole, while the newest record in
  each is older than ``retention_ms`` by the store's clock (the records' own
  timestamps, as Kafka's time retention reads its segments' largest timestamps);
- ``retention_bytes``: the oldest files go while what stays is still at least
  ``retention_bytes`` (so a partition keeps within its bound plus one file);
- DeleteRecords (``ctp delete-records TOPIC PARTITION OFFSET``): an operator moves the
  start offset to an offset of their choosing, within a file or at its end.

Each is one ``trim`` entry under an exclusive claim (the fold refuses a start offset
that does not grow or that passes what is in L1: retention never drops data not yet in
L1). Readers stop at the start offset at once; the files wholly before it leave the
committed set, the next ``ctp table publish`` drops them from the table in one
snapshot, and the GC deletes them behind its gate once the change is older than its
reader grace and no retained table snapshot names them.

A partition of a topic without retention costs nothing here; one with retention costs
a listing of its L1 files (their sizes) and, for time retention, a footer read of each
file it considers, oldest first, stopping at the first that stays.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from ctp_state import crashpoints, state as sm
from ctp_state.entries import AccessMode, Trim, TrimReason
from ctp_state.errors import ClaimHeld, ConfigError, CtpError
from ctp_state.incarnations import read_name
from ctp_state.l1 import l1_sizes, newest_record_ms
from ctp_state.parallel import pmap
from ctp_state.partition_log import PartitionLog
from ctp_state.partition_state import L1Ref
from ctp_state.storage import ObjectStore
from ctp_state.topics import get_topic, list_topics

log = logging.getLogger(__name__)


def plan_trim(
    files: Sequence[L1Ref],
    sizes: dict[str, int],
    newest_ms: Callable[[L1Ref], int | None],
    *,
    now_ms: int,
    retention_ms: int | None,
    retention_bytes: int | None,
) -> tuple[int, TrimReason] | None:
    """The start offset retention moves a partition to, and why; None: nothing to drop.
    Pure but for ``newest_ms`` (a file's newest record time, None if unknown: the file
    stays), called for the oldest files only, in order, until one stays."""
    drop_ms = 0
    if retention_ms is not None:
        for f in files:
            newest = newest_ms(f)
            if newest is None or now_ms - newest <= retention_ms:
                break
            drop_ms += 1
    drop_bytes = 0
    if retention_bytes is not None:
        total = sum(sizes.get(f.key, 0) for f in files)
        for f in files:
            size = sizes.get(f.key)
            if size is None or total - size < retention_bytes:
                break
            total -= size
            drop_bytes += 1
    n = max(drop_ms, drop_bytes)
    if n == 0:
        return None
    return files[n - 1].last + 1, (TrimReason.RETENTION_MS if drop_ms >= drop_bytes else TrimReason.RETENTION_BYTES)


@dataclass
class PartitionTrim:
    topic: str
    partition: int
    status: str = "kept"  # kept | trimmed | claim_held | fenced | error | planned
    reason: str | None = None
    start_before: int = 0
    start_after: int = 0
    files_dropped: int = 0


@dataclass
class TrimSummary:
    run_id: str
    seconds: float
    partitions: list[PartitionTrim] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(1 for p in self.partitions if p.status == status)

    @property
    def failed(self) -> list[PartitionTrim]:
        return [p for p in self.partitions if p.status in ("error", "fenced")]

    def as_dict(self) -> dict[str, object]:
        return {
            "run_id": self.run_id,
            "seconds": round(self.seconds, 3),
            "partitions_trimmed": self.count("trimmed"),
            "files_dropped": sum(p.files_dropped for p in self.partitions),
            "partitions": [p.__dict__ for p in self.partitions if p.status != "kept"],
        }


def trim_partition(
    store: ObjectStore,
    s: sm.PartitionState,
    decide: Callable[[sm.PartitionState], tuple[int, TrimReason] | None],
    *,
    owner: str,
    lease_ms: int,
    dry_run: bool = False,
) -> PartitionTrim:
    """Decide on ``s``, claim, decide again on the claimed state, append the trim (which
    releases the claim)."""
    r = PartitionTrim(s.topic, s.partition, start_before=s.start_offset, start_after=s.start_offset)
    want = decide(s)
    if want is None:
        return r
    if dry_run:
        r.status, r.start_after, r.reason = "planned", want[0], want[1].value
        r.files_dropped = sum(1 for f in s.committed_l1_files() if f.last < want[0])
        return r
    plog = PartitionLog(store, s.topic, s.partition, topic_id=s.topic_id)
    try:
        got = plog.claim(s, owner, AccessMode.EXCLUSIVE, lease_ms=lease_ms, wait_timeout_s=0).outcome
    except ClaimHeld as e:
        r.status, r.reason = "claim_held", str(e)
        return r
    if got.rejected is not None:
        r.status, r.reason = "claim_held", str(got.rejected)
        return r
    st, we, released = got.state, got.state.writer_epoch, False
    try:
        want = decide(st)
        if want is None:
            return r
        crashpoints.reached("trim_before_commit")
        out = plog.append(st, lambda _s: Trim(want[0], want[1], we, owner)).outcome
        if out.rejected is not None:
            r.status, r.reason = "fenced", str(out.rejected)
            return r
        released = True
        r.status, r.reason, r.start_after = "trimmed", want[1].value, out.state.start_offset
        r.files_dropped = len(st.l1_ends) - len(out.state.l1_ends)
        return r
    except CtpError as e:
        r.status, r.reason = "error", str(e)
        return r
    finally:
        if not released:
            try:
                plog.release(st, owner, we)
            except CtpError:
                pass  # the lease runs out by itself


def run_retention(
    store: ObjectStore,
    *,
    topics: Sequence[str] | None = None,
    lease_ms: int = 60_000,
    dry_run: bool = False,
    now_ms: int | None = None,
    threads: int = 8,
) -> TrimSummary:
    """Apply each topic's retention (``ctp topic alter``) to its partitions."""
    from ctp_state.deletion import store_now
    from ctp_state.status import read_states

    t0 = time.perf_counter()
    run_id = f"{int(time.time() * 1000)}-{uuid.uuid4().hex[:8]}"
    owner = f"retention:{run_id}"
    summary = TrimSummary(run_id, 0.0)
    chosen = [get_topic(store, n) for n in topics] if topics else list_topics(store)
    configured = []
    for t in chosen:
        ns = read_name(store, t.name)
        if ns.current is not None and (ns.retention_ms is not None or ns.retention_bytes is not None):
            configured.append((t, ns.retention_ms, ns.retention_bytes))
    if not configured:
        return summary
    now = now_ms if now_ms is not None else int(store_now(store) * 1000)  # the store's clock (R9)
    jobs = []
    for t, rms, rbytes in configured:
        for s in read_states(store, [t]):
            if s.initialized and not s.sealed and s.l1_ends:
                jobs.append((s, rms, rbytes))

    def one(job: tuple[sm.PartitionState, int | None, int | None]) -> PartitionTrim:
        s, rms, rbytes = job
        sizes = l1_sizes(store, s.topic, s.partition, s.topic_id) if rbytes is not None else {}
        footers: dict[str, int | None] = {}

        def newest(f: L1Ref) -> int | None:
            if f.key not in footers:
                footers[f.key] = newest_record_ms(store, f.key)
            return footers[f.key]

        def decide(st: sm.PartitionState) -> tuple[int, TrimReason] | None:
            return plan_trim(
                st.committed_l1_files(), sizes, newest, now_ms=now, retention_ms=rms, retention_bytes=rbytes
            )

        try:
            return trim_partition(store, s, decide, owner=owner, lease_ms=lease_ms, dry_run=dry_run)
        except CtpError as e:
            return PartitionTrim(s.topic, s.partition, status="error", reason=str(e))

    summary.partitions = pmap(one, jobs, threads)
    summary.seconds = time.perf_counter() - t0
    return summary


def delete_records(
    store: ObjectStore, topic: str, partition: int, offset: int, *, lease_ms: int = 60_000
) -> PartitionTrim:
    """Kafka's DeleteRecords: move ``topic``/``partition``'s start offset to ``offset``
    (records before it are gone for readers; the files wholly before it go to the GC).
    An offset at or below the start offset changes nothing; one past what is in L1 is
    refused (reconcile first)."""
    t = get_topic(store, topic)
    t.check_partition(partition)
    s = PartitionLog(store, t, partition).read_state()
    if offset > s.last_reconciled_offset + 1:
        raise ConfigError(
            f"{topic}/{partition}: offset {offset} is past what is in L1 (reconciled through "
            f"{s.last_reconciled_offset}; the next offset is {s.next_offset}): reconcile first"
        )

    def decide(st: sm.PartitionState) -> tuple[int, TrimReason] | None:
        if offset <= st.start_offset:
            return None
        return offset, TrimReason.DELETE_RECORDS

    r = trim_partition(store, s, decide, owner=f"delete-records:{uuid.uuid4().hex[:8]}", lease_ms=lease_ms)
    if r.status in ("error", "fenced", "claim_held"):
        raise CtpError(f"{topic}/{partition}: start offset not moved ({r.status}: {r.reason})")
    return r


T = TypeVar("T")
U = TypeVar("U")
