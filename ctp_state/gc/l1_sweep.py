"""New L1 files checked before their L0 sources go, and L1 orphans collected.

A reconciler writes L1 files before its commit (deterministic keys
``l1/<t>/<p>/<first>-<last>.parquet``), so a crash leaves files no ``reconcile`` entry
names. Every such file starts at a commit boundary (the last reconciled offset when its
writer claimed, plus one).

Per partition the GC keeps a watermark W (in the GC history's partition view): every
L1 file whose first offset is <= W was checked (committed) or deleted (orphan). A
sweep looks only past W, so its cost follows new files, not the table, and it skips a
partition entirely while W is its last reconciled offset (LR): every file a listing
past W could find then lies past LR, which a sweep leaves alone (below), whatever the
log gained since -- ticks, placeholders not reconciled yet, a claim given up. A commit
moves LR past W, and the next sweep lists.

**Checking (every partition, every run).** The partition's state names its committed
files and the CRC32C of each; every one past W is read whole — its CRC32C, every
Parquet page checksum, its schema, its offsets — before the GC may delete the L0
objects it came from. A committed file that is missing or fails a check fails the gate.

**Collecting orphans** (partitions without a live claim, in the topics asked for). Only
a listed file that ends at or below the last reconciled offset (LR) and that no commit
names is deleted: commits only move forward from LR + 1, so no writer can ever commit
it. A file beyond LR is left alone, since a live writer may still commit it; if it is
never committed, a later commit moves LR past it and the next sweep collects it. Files
younger than the grace age, and orphans of partitions not collected this run, are left
(and W stays before them).

**Files a compaction or trim took out of the committed set** (R11). L1 is the only
copy of the data, so such a file -- a *retired* file: listed, uncommitted, at or below
LR, and inside a compaction's file or wholly before the committed files -- is deleted
only when (a) the entry that retired it is committed (the state names the
replacement), (b) no retained snapshot of the topic's table names it (checked after
the run fences publishes through the catalog: :meth:`TableHook.fenced_refs`), (c) the
partition's newest compact or trim entry is older than the reader grace by the store's
clock (a ``ctp read`` or a Spark job holding the old file list finishes first), and (d)
the compaction's file that holds its records is read whole by this run and passes the
gate's L1 checks. A partition whose files changed since its last sweep is listed from
its start, and again every run while it keeps a retired file.

A compaction writes at or below LR, where nothing else commits: its file (keyed by its
writer epoch) is never collected while a claim of that writer epoch is in the
partition's state, lapsed or not -- the fold accepts the writer's commit until another
claim fences it, whatever the clocks say -- nor while its writer epoch is newer than
the state's: that claim was taken after the GC's read, and may commit after its listing.

**Full sweeps.** A reconciler whose lease ran out can still write a file after a sweep
moved W past the file's offsets; an incremental sweep never lists behind W, so such a
file would stay forever. Once a period (``GcSettings.l1_full_sweep_s``, a day by default)
a run lists every partition's L1 files from the start and collects those orphans too.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

import pyarrow as pa
import pyarrow.compute as pc

from ctp_state import layout
from ctp_state.errors import CorruptData, ObjectNotFound
from ctp_state.l1 import file_weight, newest_record_ms_read, parse_l1
from ctp_state.parallel import pmap, read_threads
from ctp_state.partition_state import L1Ref
from ctp_state.storage import ObjectInfo, ObjectStore

L1_CHECK_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("key", pa.string()),
        ("first_offset", pa.int64()),
        ("last_offset", pa.int64()),
        ("expected_first_offset", pa.int64()),  # previous file's last offset + 1
        ("span", pa.int64()),  # last - first + 1
        ("rows", pa.int64()),
        ("distinct_offsets", pa.int64()),
        ("min_offset", pa.int64()),
        ("max_offset", pa.int64()),
        ("checksums_ok", pa.bool_()),  # the file is there and passed its CRC32C, page checksums and schema
    ]
)


@dataclass(frozen=True)
class SweepInput:
    topic: str
    partition: int
    last_reconciled_offset: int
    log_end_offset: int
    swept_through: int = -1  # W from the previous sweep
    swept_log_end: int = -1
    committed: tuple[L1Ref, ...] = ()  # the committed files past W, from the partition's state
    collect: bool = True  # delete orphans (False: check only; a reconciler may be writing)
    full: bool = False  # list from the start, not from W (see "Full sweeps")
    all_committed: frozenset[str] = frozenset()  # with ``full``: every committed file's key
    topic_id: str | None = None  # the id in the partition's keys (None: the name only)
    # R11, for a partition a compaction or trim changed (changed_log_offset >= 0):
    all_refs: tuple[L1Ref, ...] = ()  # every committed file
    l1_first: int = 0  # the first committed file's first offset
    changed_log_offset: int = -1  # the newest compact or trim entry's log offset
    changed_entry_key: str | None = None  # its key (its store time starts the reader grace)
    #: Writer epochs of the partition's claim holders, lapsed leases included: a
    #: compactor whose lease lapsed can still commit its file until someone else claims
    #: (the fold judges the claim, not the clock), so its file is never collected.
    holders: frozenset[int] = frozenset()
    #: The newest writer epoch of the state this input was read from (None: not known).
    #: A claim taken after that read has a newer one, and may commit a file at or below
    #: LR after this sweep listed it: a compaction's file of a newer writer epoch is never
    #: collected (None: no compaction's file is).
    writer_epoch: int | None = None


def unseen_writer(inp: SweepInput, compacted_by: int) -> bool:
    """A compaction's file of a claim the sweep's state does not know (taken after the
    read): only a later claim fences it, so it may be committed yet. Pure."""
    return compacted_by > 0 and (inp.writer_epoch is None or compacted_by > inp.writer_epoch)


@dataclass
class SweepResult:
    topic: str
    partition: int
    swept_through: int
    swept_log_end: int
    listed: int = 0
    skipped: bool = False  # not listed: W at LR, nothing a listing could find to act on
    young: int = 0  # uncommitted files left for a later run (too young, or a claim is live)
    beyond_lr: int = 0
    orphans: list[ObjectInfo] = field(default_factory=list)
    new_files: list[L1Check] = field(default_factory=list)
    #: Retired files past the reader grace, their replacement checked: deleted after the
    #: gate unless the topic's table still names them (see prepare).
    retired: list[ObjectInfo] = field(default_factory=list)
    retired_kept: int = 0  # retired files left for a later run (grace, claim, or a table names them)
    #: Of ``retired``, those a trim dropped, for the gate's retention check.
    dropped: list[Dropped] = field(default_factory=list)
    dropped_held: int = 0  # dropped files kept: nothing allows their trim now


@dataclass(frozen=True)
class Dropped:
    """An L1 file a trim dropped, with what R11's check of it needs."""

    key: str
    last: int  # its last offset
    newest_ms: int | None  # its newest record's time (None: unknown)
    #: Bytes of the partition's L1 files newer than it that the listing saw (committed,
    #: or dropped too): what retention.bytes kept when it let this file go.
    newer_bytes: int


@dataclass(frozen=True)
class L1Check:
    """One newly committed L1 file as the gate checks it (a row of ``L1_CHECK_SCHEMA``):
    where its offsets should start, and what reading it whole found (``None``, and
    ``checksums_ok`` False, when it did not read)."""

    topic: str
    partition: int
    key: str
    first_offset: int
    last_offset: int
    expected_first_offset: int
    span: int
    rows: int | None = None
    distinct_offsets: int | None = None
    min_offset: int | None = None
    max_offset: int | None = None
    checksums_ok: bool = False


def _range(key: str) -> tuple[int, int]:
    """A listed L1 key's offsets (:func:`layout.parse_l1_key`, the one L1 key parser)."""
    name = layout.parse_l1_key(key)
    return name.first, name.last


def _retiring(inp: SweepInput, first: int, last: int) -> L1Ref | bool | None:
    """For an uncommitted file of offsets ``first``-``last`` at or below LR of a changed
    partition: the compaction's file that holds its records (it was replaced), True if
    it lies wholly before the committed files (a trim dropped it), None otherwise."""
    if inp.changed_log_offset < 0:
        return None
    if last < inp.l1_first:
        return True
    ends = [r.last for r in inp.all_refs]
    i = bisect.bisect_left(ends, first)
    if i == len(inp.all_refs):
        return None
    c = inp.all_refs[i]
    if c.first <= first and last <= c.last and layout.parse_l1_key(c.key).compacted_by > 0:
        return c
    return None


def lists_whole(inp: SweepInput) -> bool:
    """The partition is listed from its start: a full sweep, or files a compaction or
    trim changed since the last sweep looked (or retired files it kept). Pure."""
    return inp.full or (inp.changed_log_offset >= 0 and inp.changed_log_offset >= inp.swept_log_end)


def nothing_to_list(inp: SweepInput) -> bool:
    """Not listed from its start, and W is LR: a listing past W could find only files
    past LR, which a sweep leaves alone (a writer may commit them), whatever the log
    gained since the last sweep. The sweep's result is a listing's, less the listing. Pure."""
    return not lists_whole(inp) and inp.swept_through == inp.last_reconciled_offset


def sweep_partition(
    store: ObjectStore,
    inp: SweepInput,
    *,
    now_s: float,
    grace_s: float,
    reader_grace_s: float = 3600.0,
    store_now_s: float | None = None,
) -> SweepResult:
    w, lr = inp.swept_through, inp.last_reconciled_offset
    res = SweepResult(inp.topic, inp.partition, w, inp.swept_log_end)
    if nothing_to_list(inp):
        res.skipped = True
        res.swept_log_end = inp.log_end_offset  # as a listing would have it
        return res
    whole = lists_whole(inp)
    prefix = layout.l1_partition_prefix(inp.topic, inp.partition, inp.topic_id)
    start = layout.l1_after(inp.topic, inp.partition, w, inp.topic_id) if w >= 0 and not whole else None
    listed: dict[str, ObjectInfo] = {}
    for info in store.list(prefix, start_after=start):
        if not info.key.endswith(".parquet"):
            raise CorruptData(info.key, "unexpected key under the L1 root")
        listed[info.key] = info
    res.listed = len(listed)

    prev_last = max(w, inp.l1_first - 1)  # (a trimmed partition's files start at its first committed offset)
    committed = set()
    boundaries = [w]  # commit boundaries (a committed file's last offset): where W may stand
    for ref in inp.committed:  # checked whether or not the listing saw them
        if ref.last <= w or ref.last > lr:
            continue
        if ref.first <= w and prev_last == max(w, inp.l1_first - 1):
            # W inside this file: an older ctp could leave W off a commit boundary (see
            # below). The file starts where the previous committed one ended, so check
            # it from there; contiguity between committed files is still checked.
            prev_last = ref.first - 1
        committed.add(ref.key)
        res.new_files.append(_check_row(store, inp, ref, prev_last))
        prev_last = ref.last
        boundaries.append(ref.last)

    new_w = lr
    every = {r.key for r in inp.all_refs}
    checked = set(committed)
    changed_at: list[float | None] = []  # the change entry's store time, read once when needed
    for key, info in sorted(listed.items(), key=lambda kv: _range(kv[0])):
        first, last = _range(key)
        if key in committed or key in inp.all_committed or key in every:
            continue
        retiring = _retiring(inp, first, last) if last <= lr else None
        if last > lr:
            res.beyond_lr += 1
        elif (tag := layout.parse_l1_key(key).compacted_by) in inp.holders or unseen_writer(inp, tag):
            # A compaction's file whose writer still holds its claim (even past its
            # lease), or claimed after the state was read: it may be committed yet. Not
            # an orphan, nor a retired file, until the state shows that claim gone.
            res.young += 1
        elif retiring is not None:
            if not changed_at:
                head = store.head(inp.changed_entry_key) if inp.changed_entry_key else None
                changed_at.append(head.mtime if head is not None else None)
            since = changed_at[0]
            now = store_now_s if store_now_s is not None else now_s
            if not inp.collect or now_s - info.mtime < grace_s or since is None or now - since < reader_grace_s:
                res.retired_kept += 1
                continue
            if isinstance(retiring, L1Ref) and retiring.key not in checked:
                # (d): the file that holds its records now is read whole and checked first
                res.new_files.append(_check_row(store, inp, retiring, retiring.first - 1))
                checked.add(retiring.key)
            if retiring is True:  # dropped: the gate checks what allowed it
                try:  # its records' own times: the footer's statistics are not checked (R11)
                    newest = newest_record_ms_read(store, key)
                except (CorruptData, ObjectNotFound):
                    newest = None
                res.dropped.append(Dropped(key, last, newest, 0))
            res.retired.append(info)
        elif not inp.collect or now_s - info.mtime < grace_s:
            res.young += 1
            if first > w:  # one behind W waits for the next full sweep; W does not move back
                # W stops at the last commit boundary before it. Not at first - 1: a
                # crashed run may have split the offsets differently from the run that
                # committed them, so an orphan can start inside a committed file.
                new_w = min(new_w, max(b for b in boundaries if b < first))
        else:
            res.orphans.append(info)
    if res.dropped:
        # what retention.bytes weighs: the files it keeps (committed) or also let go. A
        # compaction after the trim merges the files after it into fewer bytes (one
        # footer instead of many), which would hold the trim's files until the
        # partition grows: a committed file counts as much as the files it replaced
        # (the bytes the trim weighed), never both: those still in the store, or the
        # bytes its footer names (l1.weight_of; for a compaction's file, one ranged GET).
        dropped_keys = {d.key for d in res.dropped}
        kept_keys = {k for k in listed if k in every or k in inp.all_committed or k in dropped_keys}
        replaced: dict[str, int] = {}
        for k, i in listed.items():
            first, last = _range(k)
            if k not in kept_keys and last <= lr:
                holder = _retiring(inp, first, last)
                if isinstance(holder, L1Ref):
                    replaced[holder.key] = replaced.get(holder.key, 0) + i.size
        kept = [
            (_range(k)[0], max(listed[k].size, replaced.get(k, 0), _weight(store, k, listed[k].size)))
            for k in kept_keys
        ]
        res.dropped = [replace(d, newer_bytes=sum(n for f, n in kept if f > d.last)) for d in res.dropped]
    res.swept_through = new_w
    res.swept_log_end = inp.log_end_offset if new_w == lr else inp.swept_log_end
    if res.retired_kept or res.retired:
        # Retired files remain (kept, or deleted only if this run's deletes all land):
        # the next run lists the partition whole again.
        res.swept_log_end = min(res.swept_log_end, inp.changed_log_offset)
    return res


def _weight(store: ObjectStore, key: str, size: int) -> int:
    """What a kept file weighs for retention.bytes: a compaction's file by its footer
    (:func:`~ctp_state.l1.file_weight`), a reconcile's by its size (one that does not
    read weighs its size: a weight only ever lets a dropped file go sooner)."""
    if not layout.parse_l1_key(key).compacted_by:
        return size
    try:
        return file_weight(store, key, size)
    except (CorruptData, ObjectNotFound, OSError):
        return size


def _check_row(store: ObjectStore, inp: SweepInput, ref: L1Ref, prev_last: int) -> L1Check:
    """One newly committed L1 file, as the gate sees it: read whole and checked (its L0
    sources are about to be deleted: the L1 copy must read first), offsets counted."""
    named = L1Check(
        topic=inp.topic,
        partition=inp.partition,
        key=ref.key,
        first_offset=ref.first,
        last_offset=ref.last,
        expected_first_offset=prev_last + 1,
        span=ref.last - ref.first + 1,
    )
    try:
        offs = parse_l1(store.get(ref.key), ref.key, ref.crc32c).column("offset").combine_chunks()
    except (CorruptData, ObjectNotFound):  # damaged, or gone: the gate fails on checksums_ok
        return named
    mm = pc.min_max(offs)
    return replace(
        named,
        rows=len(offs),
        distinct_offsets=pc.count_distinct(offs).as_py(),
        min_offset=mm["min"].as_py(),
        max_offset=mm["max"].as_py(),
        checksums_ok=True,
    )


def sweep(
    store: ObjectStore,
    inputs: Sequence[SweepInput],
    *,
    now_s: float,
    grace_s: float,
    threads: int = 16,
    reader_grace_s: float = 3600.0,
    store_now_s: float | None = None,
) -> list[SweepResult]:
    if not inputs:
        return []

    def one(i: SweepInput) -> SweepResult:
        return sweep_partition(
            store, i, now_s=now_s, grace_s=grace_s, reader_grace_s=reader_grace_s, store_now_s=store_now_s
        )

    return pmap(one, inputs, read_threads(store, threads))


def check_table(results: Sequence[SweepResult]) -> pa.Table:
    rows = [asdict(r) for res in results for r in res.new_files]
    return pa.Table.from_pylist(rows, schema=L1_CHECK_SCHEMA)
