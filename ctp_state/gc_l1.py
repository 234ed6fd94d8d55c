"""L1 orphan collection: files a crashed or fenced reconciler wrote but never committed.

A reconciler writes L1 files before its commit (deterministic keys
``l1/<t>/<p>/<first>-<last>.parquet``), so a crash leaves files no ``reconcile`` entry
names. Every such file starts at a commit boundary (the last reconciled offset when its
writer claimed, plus one).

Per partition the GC keeps a watermark W (in the GC history's partition view): every
L1 key whose first offset is <= W is resolved (committed, or deleted). A sweep lists
only keys after W, so its cost follows new files, not the table, and it skips a
partition entirely while its log end offset has not moved since the last sweep (a
reconciler must append a claim before it writes a file).

Only a file that ends at or below the last reconciled offset (LR) and is not committed
is deleted: commits only move forward from LR + 1, so no writer can ever commit it. A
file beyond LR is left alone, since a live writer may still commit it; if it is never
committed, a later commit moves LR past it and the next sweep collects it. Files
younger than the grace age are left for the next run.

Telling committed from orphan: if the listed files up to LR tile ``[W + 1, LR]``
exactly, they are all committed (the committed files tile that range and are among
them). Otherwise (a crash left overlapping files) the partition's log is replayed to
get the committed keys: the slow path, taken only after crashes.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from ctp_state import layout
from ctp_state.errors import CorruptData
from ctp_state.l1 import parse_l1
from ctp_state.log import PartitionLog
from ctp_state.read import committed_l1_keys
from ctp_state.store import ObjectInfo, ObjectStore

L1_CHECK_SCHEMA = pa.schema([
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
    ("checksums_ok", pa.bool_()),  # every page of the file passed its checksum (None: not read)
])


@dataclass(frozen=True)
class SweepInput:
    topic: str
    partition: int
    last_reconciled_offset: int
    log_end_offset: int
    swept_through: int = -1  # W from the previous sweep
    swept_log_end: int = -1


@dataclass
class SweepResult:
    topic: str
    partition: int
    swept_through: int
    swept_log_end: int
    listed: int = 0
    skipped: bool = False  # nothing moved since the last sweep
    slow_path: bool = False
    young: int = 0
    beyond_lr: int = 0
    orphans: list[ObjectInfo] = field(default_factory=list)
    new_files: list[dict] = field(default_factory=list)


def _range(key: str) -> tuple[int, int]:
    name = key.rsplit("/", 1)[1]
    try:
        first, last = name.removesuffix(".parquet").split("-")
        return int(first), int(last)
    except ValueError:
        raise CorruptData(key, "L1 key does not parse as <first>-<last>.parquet") from None


def sweep_partition(store: ObjectStore, inp: SweepInput, *, now_s: float, grace_s: float,
                    verify_rows: bool = True) -> SweepResult:
    w, lr = inp.swept_through, inp.last_reconciled_offset
    res = SweepResult(inp.topic, inp.partition, w, inp.swept_log_end)
    if inp.log_end_offset == inp.swept_log_end and w == lr:
        res.skipped = True
        return res
    prefix = f"{layout.L1_ROOT}{inp.topic}/{inp.partition:06d}/"
    start = f"{prefix}{w:020d}-99999999999999999999" if w >= 0 else None
    files = []
    for info in store.list(prefix, start_after=start):
        if not info.key.endswith(".parquet"):
            raise CorruptData(info.key, "unexpected key under the L1 root")
        files.append((*_range(info.key), info))
    res.listed = len(files)
    files.sort(key=lambda f: (f[0], f[1]))
    settled = [f for f in files if f[1] <= lr]
    res.beyond_lr = len(files) - len(settled)

    expected, chain = w + 1, True
    for first, last, _ in settled:
        if first != expected:
            chain = False
            break
        expected = last + 1
    if chain and (expected == lr + 1):
        committed = {f[2].key for f in settled}
    else:
        res.slow_path = True
        keys, _ = committed_l1_keys(PartitionLog(store, inp.topic, inp.partition))
        committed = set(keys)

    new_w = lr
    prev_last = w
    for first, last, info in settled:
        if info.key in committed:
            res.new_files.append(_check_row(store, inp, info, first, last, prev_last, verify_rows))
            prev_last = last
        elif now_s - info.mtime < grace_s:
            res.young += 1
            new_w = min(new_w, first - 1)  # orphans start at a commit boundary
        else:
            res.orphans.append(info)
    res.swept_through = new_w
    res.swept_log_end = inp.log_end_offset if new_w == lr else inp.swept_log_end
    return res


def _check_row(store: ObjectStore, inp: SweepInput, info: ObjectInfo, first: int, last: int,
               prev_last: int, verify_rows: bool) -> dict:
    """One newly committed L1 file, as the gate sees it. With ``verify_rows`` the whole
    file is read once with every page checked (its L0 sources are about to be deleted:
    the L1 copy must read first), and its offsets are counted."""
    row = {"topic": inp.topic, "partition": inp.partition, "key": info.key, "first_offset": first,
           "last_offset": last, "expected_first_offset": prev_last + 1, "span": last - first + 1,
           "rows": None, "distinct_offsets": None, "min_offset": None, "max_offset": None, "checksums_ok": None}
    if verify_rows:
        try:
            offs = parse_l1(store.get(info.key), info.key).column("offset").combine_chunks()
        except CorruptData:
            row["checksums_ok"] = False
            return row
        mm = pc.min_max(offs)
        row.update(rows=len(offs), distinct_offsets=pc.count_distinct(offs).as_py(),
                   min_offset=mm["min"].as_py(), max_offset=mm["max"].as_py(), checksums_ok=True)
    return row


def sweep(store: ObjectStore, inputs: Sequence[SweepInput], *, now_s: float, grace_s: float,
          verify_rows: bool = True, threads: int = 16) -> list[SweepResult]:
    if not inputs:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(inputs)))) as pool:
        return list(pool.map(
            lambda i: sweep_partition(store, i, now_s=now_s, grace_s=grace_s, verify_rows=verify_rows), inputs))


def check_table(results: Sequence[SweepResult]) -> pa.Table:
    rows = [r for res in results for r in res.new_files]
    return pa.Table.from_pylist(rows, schema=L1_CHECK_SCHEMA)
