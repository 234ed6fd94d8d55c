"""Compaction (R11): a partition's adjacent small L1 files merged into files of about the
target size, exactly once against its state log.

A run:

1. reads every selected partition's state; a partition is a candidate once it commits
   more than ``max_small_files`` files smaller than the target (no request is spent on
   the others: the count is in the state);
2. lists each candidate's L1 files for their sizes and plans runs of adjacent small
   files to merge (pure: :func:`plan_runs`);
3. claims the partition (R5, exclusive: a reconciler, a trim and another compactor wait
   or skip), and plans again on the state the claim returned;
4. builds each run's file (:func:`build_run`): every replaced file read whole and
   checked (its committed CRC32C, page checksums, schema), their rows concatenated, the
   offsets checked to be exactly the run's, written once at the key the writer epoch
   gives it (``<first>-<last>.w<writer epoch>.parquet``), then read back and compared
   row for row with what the replaced files hold (offset, timestamp, key, value,
   headers);
5. commits one ``compact`` entry per run, naming the replaced files (keys and CRC32C)
   and the new one (key, offsets, record count, CRC32C); the last releases the claim.

Crash safety: nothing is committed before its file is written and checked; a crash
before the commit leaves a file no entry names (an orphan the GC collects), and a rerun
claims again, under a new writer epoch, so it writes a new key and never meets the
old one. A compactor whose lease ran out is fenced by the next claim (R5): its commit
is rejected. Readers follow the committed files, so they see the replaced files or the
new one, never both and never neither. The replaced files stay in the store until the
GC deletes them, behind the gate (see :mod:`ctp_state.gc.l1_sweep`).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import msgspec
import numpy as np
import pyarrow as pa

from ctp_state import crashpoints, l0, layout, state as sm
from ctp_state.entries import AccessMode, Compact
from ctp_state.errors import ClaimHeld, CorruptData, CtpError, OutcomeUnknown, Rejected
from ctp_state.l1 import encode_parquet, l1_sizes, parse_l1, read_l1, weight_of, write_once
from ctp_state.parallel import pmap
from ctp_state.partition_log import PartitionLog
from ctp_state.partition_state import L1Ref
from ctp_state.settings import CompactSettings
from ctp_state.status import select_topics, try_read_partition_states
from ctp_state.storage import ObjectStore
from ctp_state.topics import Topic

log = logging.getLogger(__name__)


def small_files(s: sm.PartitionState, target_bytes: int, sizes: dict[str, int] | None = None) -> int:
    """How many committed files of ``s`` are smaller than the target (without
    ``sizes``, every committed file counts: the upper bound the state alone gives)."""
    files = s.committed_l1_files()
    if sizes is None:
        return len(files)
    return sum(1 for f in files if sizes.get(f.key, 0) < target_bytes)


def plan_runs(files: Sequence[L1Ref], sizes: dict[str, int], target_bytes: int) -> list[list[L1Ref]]:
    """Runs of two or more adjacent files, each file smaller than the target and each
    run's bytes at most the target, greedily from the oldest. Pure.

    A file at or over the target, or one whose size is unknown (not listed), ends a
    run and starts none."""
    runs: list[list[L1Ref]] = []
    current: list[L1Ref] = []
    total = 0
    for f in files:
        size = sizes.get(f.key)
        if size is None or size >= target_bytes:
            if len(current) >= 2:
                runs.append(current)
            current, total = [], 0
            continue
        if current and total + size > target_bytes:
            if len(current) >= 2:
                runs.append(current)
            current, total = [], 0
        current.append(f)
        total += size
    if len(current) >= 2:
        runs.append(current)
    return runs


class RunBuild(msgspec.Struct, frozen=True, kw_only=True):
    """What building one compacted file did (from a Spark task to the driver, as JSON)."""

    key: str
    records: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    l1_crc32c: int = 0
    seconds: float = 0.0
    error: str | None = None


@dataclass(frozen=True)
class CompactJob:
    """One run to merge: the replaced files (key, offsets, committed CRC32C) and where the
    new file goes."""

    topic: str
    partition: int
    topic_id: str | None
    writer_epoch: int
    replaced: tuple[L1Ref, ...]

    @property
    def first(self) -> int:
        return self.replaced[0].first

    @property
    def last(self) -> int:
        return self.replaced[-1].last

    @property
    def key(self) -> str:
        return layout.l1_key(self.topic, self.partition, self.first, self.last, self.topic_id, self.writer_epoch)


def merged_rows(store: ObjectStore, job: CompactJob) -> tuple[pa.Table, int, int]:
    """The replaced files' rows, concatenated and checked to hold exactly offsets
    ``first``..``last`` once each, in order; the bytes read; and what the replaced
    files weigh for retention.bytes (:func:`~ctp_state.l1.weight_of`: the new file's)."""
    tables, read, weight = [], 0, 0
    for ref in job.replaced:
        data = store.get(ref.key)
        read += len(data)
        t = parse_l1(data, ref.key, ref.crc32c)
        weight += weight_of(len(data), t.schema.metadata)
        offs = t.column("offset").to_numpy()
        if len(offs) != ref.last - ref.first + 1 or (len(offs) and (offs[0] != ref.first or offs[-1] != ref.last)):
            raise CorruptData(ref.key, f"committed L1 file does not hold exactly offsets {ref.first}-{ref.last}")
        tables.append(t.replace_schema_metadata(None))
    merged = pa.concat_tables(tables).combine_chunks()
    offs = merged.column("offset").to_numpy()
    if len(offs) != job.last - job.first + 1 or not np.array_equal(offs, np.arange(job.first, job.last + 1)):
        raise CorruptData(job.key, f"the replaced files do not hold offsets {job.first}-{job.last} exactly once")
    return merged, read, weight


def build_run(store: ObjectStore, job: CompactJob, *, compression: str = "zstd") -> RunBuild:
    """Merge ``job``'s files into its new file, written once and checked row for row
    against what the replaced files hold (never raises: an error is in the result)."""
    t0 = time.perf_counter()
    try:
        merged, read, weight = merged_rows(store, job)
        data = encode_parquet(
            merged, job.topic, job.partition, compression=compression, topic_id=job.topic_id, weight_bytes=weight
        )
        data = write_once(store, job.key, data, merged)
        crashpoints.reached("compact_after_write")
        back = read_l1(store, job.key, l0.crc32c(data)).replace_schema_metadata(None)
        if not back.equals(merged):
            raise CorruptData(job.key, "the compacted file does not read back as the replaced files' records")
        return RunBuild(
            key=job.key,
            records=merged.num_rows,
            bytes_in=read,
            bytes_out=len(data),
            l1_crc32c=l0.crc32c(data),
            seconds=time.perf_counter() - t0,
        )
    except (CtpError, OSError) as e:
        return RunBuild(key=job.key, error=str(e), seconds=time.perf_counter() - t0)


def build_locally(store: ObjectStore, jobs: list[CompactJob], *, compression: str, threads: int = 4) -> list[RunBuild]:
    if not jobs:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(jobs)))) as pool:
        return list(pool.map(lambda j: build_run(store, j, compression=compression), jobs))


@dataclass
class PartitionCompaction:
    """What a run did to one partition."""

    topic: str
    partition: int
    status: str = "skipped"  # skipped | compacted | claim_held | fenced | error | planned
    reason: str | None = None
    runs: int = 0
    files_replaced: int = 0
    files_written: int = 0
    records: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    replaced: list[str] = field(default_factory=list)
    written: list[str] = field(default_factory=list)


@dataclass
class CompactionSummary:
    run_id: str
    seconds: float
    partitions: list[PartitionCompaction]

    def count(self, status: str) -> int:
        return sum(1 for p in self.partitions if p.status == status)

    @property
    def files_replaced(self) -> int:
        return sum(p.files_replaced for p in self.partitions)

    @property
    def files_written(self) -> int:
        return sum(p.files_written for p in self.partitions)

    @property
    def records(self) -> int:
        return sum(p.records for p in self.partitions)

    @property
    def bytes_in(self) -> int:
        return sum(p.bytes_in for p in self.partitions)

    @property
    def bytes_out(self) -> int:
        return sum(p.bytes_out for p in self.partitions)

    @property
    def failed(self) -> list[PartitionCompaction]:
        return [p for p in self.partitions if p.status in ("error", "fenced")]

    def as_dict(self) -> dict[str, object]:
        return {
            "run_id": self.run_id,
            "seconds": round(self.seconds, 3),
            "partitions_compacted": self.count("compacted"),
            "partitions_planned": self.count("planned"),
            "files_replaced": self.files_replaced,
            "files_written": self.files_written,
            "records": self.records,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "partitions": [p.__dict__ for p in self.partitions if p.status != "skipped"],
        }


def run_compaction(
    store: ObjectStore,
    *,
    topics: Sequence[str] | None = None,
    config: CompactSettings = CompactSettings(),
    dry_run: bool = False,
    map_runs: Callable[[list[CompactJob]], list[RunBuild]] | None = None,
    on_progress: Callable[[str, int, int], None] = lambda stage, done, total: None,
) -> CompactionSummary:
    """Compact the partitions of ``topics`` (all when None) that commit more than
    ``config.max_small_files`` files smaller than the target."""
    t0 = time.perf_counter()
    run_id = f"{int(time.time() * 1000)}-{uuid.uuid4().hex[:8]}"
    owner = f"compactor:{run_id}"
    build = map_runs or (lambda jobs: build_locally(store, jobs, compression=config.compression))
    wanted: list[tuple[Topic | str, int]] = [(t, p) for t in select_topics(store, topics) for p in range(t.partitions)]
    got, unreadable = try_read_partition_states(store, wanted, threads=config.threads)
    results: dict[tuple[str, int], PartitionCompaction] = {}
    for name, p, why in unreadable:
        results[(name, p)] = PartitionCompaction(name, p, status="error", reason=f"state cannot be read: {why}")
    states = [s for s in got if s is not None and s.initialized and not s.sealed]
    for s in states:
        results[(s.topic, s.partition)] = PartitionCompaction(s.topic, s.partition)
    # 1-2. candidates: more small files than allowed (the state's count first, free)
    candidates = [s for s in states if small_files(s, config.target_file_bytes) > config.max_small_files]
    on_progress("plan", 0, len(candidates))

    def plan(s: sm.PartitionState) -> tuple[sm.PartitionState, dict[str, int]] | None:
        sizes = l1_sizes(store, s.topic, s.partition, s.topic_id)
        if small_files(s, config.target_file_bytes, sizes) <= config.max_small_files:
            return None
        if not plan_runs(s.committed_l1_files(), sizes, config.target_file_bytes):
            return None
        return s, sizes

    planned = [x for x in pmap(plan, candidates, config.threads) if x is not None]
    on_progress("plan", len(candidates), len(candidates))
    if dry_run:
        for s, sizes in planned:
            r = results[(s.topic, s.partition)]
            runs = plan_runs(s.committed_l1_files(), sizes, config.target_file_bytes)
            r.status, r.runs = "planned", len(runs)
            r.files_replaced = sum(len(run) for run in runs)
            r.bytes_in = sum(sizes[f.key] for run in runs for f in run)
            r.replaced = [f.key for run in runs for f in run]
        return CompactionSummary(run_id, time.perf_counter() - t0, list(results.values()))

    # 3. claims
    Claimed = tuple[PartitionLog, sm.PartitionState, dict[str, int]]

    def claim(job: tuple[sm.PartitionState, dict[str, int]]) -> Claimed | None:
        s, sizes = job
        plog = PartitionLog(store, s.topic, s.partition, topic_id=s.topic_id)
        r = results[(s.topic, s.partition)]
        try:
            got = plog.claim(s, owner, AccessMode.EXCLUSIVE, lease_ms=config.lease_ms, wait_timeout_s=0)
        except ClaimHeld as e:
            r.status, r.reason = "claim_held", str(e)
            return None
        except CtpError as e:
            r.status, r.reason = "error", f"claim failed: {e}"
            if isinstance(e, OutcomeUnknown):
                plog.release_held(owner)
            return None
        if got.outcome.rejected is not None:
            r.status, r.reason = "claim_held", str(got.outcome.rejected)
            return None
        return plog, got.outcome.state, sizes

    claimed = [x for x in pmap(claim, planned, config.threads) if x is not None]
    crashpoints.reached("compact_after_claim")
    try:
        jobs: dict[tuple[str, int], list[CompactJob]] = {}
        for _plog, st, sizes in claimed:  # planned again on the state the claim returned
            runs = plan_runs(st.committed_l1_files(), sizes, config.target_file_bytes)
            jobs[(st.topic, st.partition)] = [
                CompactJob(st.topic, st.partition, st.topic_id, st.writer_epoch, tuple(run)) for run in runs
            ]
        flat = [j for js in jobs.values() for j in js]
        on_progress("build", 0, len(flat))
        builds = {b.key: b for b in build(flat)} if flat else {}
        on_progress("build", len(flat), len(flat))
        crashpoints.reached("compact_before_commit")
        done = [0]
        lock = threading.Lock()

        def commit(item: Claimed) -> None:
            plog, st, _ = item
            r = results[(st.topic, st.partition)]
            we = st.writer_epoch
            mine = jobs[(st.topic, st.partition)]
            released = False
            lease_until = max((h.lease_until_ms for h in st.holders if h.owner == owner), default=0)
            try:
                for i, job in enumerate(mine):
                    b = builds[job.key]
                    if b.error is not None:
                        r.status, r.reason = "error", b.error
                        break
                    if _now_ms() >= lease_until:
                        # (not what keeps the GC off its file -- the claim in the log does
                        # that -- but a writer past its lease does not commit)
                        r.status, r.reason = "error", "the claim's lease ran out before the commit (--lease-seconds)"
                        break
                    last = i == len(mine) - 1
                    entry = Compact(
                        job.first,
                        job.last,
                        tuple(f.key for f in job.replaced),
                        tuple(f.crc32c for f in job.replaced),
                        job.key,
                        b.l1_crc32c,
                        job.last - job.first + 1,
                        we,
                        owner if last else None,
                    )
                    out = plog.append(st, _constant(entry)).outcome
                    if out.rejected is not None:
                        r.status, r.reason = "fenced", str(out.rejected)
                        break
                    st = out.state
                    released = last
                    crashpoints.reached("compact_after_commit", i)
                    r.status = "compacted"
                    r.runs += 1
                    r.files_replaced += len(job.replaced)
                    r.files_written += 1
                    r.records += b.records
                    r.bytes_in += b.bytes_in
                    r.bytes_out += b.bytes_out
                    r.replaced += [f.key for f in job.replaced]
                    r.written.append(job.key)
            except (Rejected, CtpError) as e:
                r.status, r.reason = "error", str(e)
            finally:
                if not released:
                    try:
                        plog.release(st, owner, we)
                    except CtpError:
                        pass  # the lease runs out by itself
                with lock:
                    done[0] += 1
                    on_progress("commit", done[0], len(claimed))

        pmap(commit, claimed, config.threads)
    except BaseException:
        for plog, _st, _ in claimed:
            plog.release_held(owner)
        raise
    return CompactionSummary(run_id, time.perf_counter() - t0, list(results.values()))


def _now_ms() -> int:
    """This machine's clock, for the compactor's own lease check."""
    return int(time.time() * 1000)


def _constant(entry: Compact) -> Callable[[sm.PartitionState], Compact]:
    """The entry to append whatever the log's state (the claim keeps the files still)."""
    return lambda _fresh: entry


T = TypeVar("T")
U = TypeVar("U")
