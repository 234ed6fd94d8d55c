"""The tables the gate checks (Arrow, built from the run's inputs) and the partition
view the history keeps."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from ctp_state import layout
from ctp_state.gc.history import DELETES_SCHEMA, PARTITION_SCHEMA
from ctp_state.gc.safe_epoch import PartitionStatus
from ctp_state.records import GcRecord

if TYPE_CHECKING:
    from ctp_state.gc.inputs import PartitionView
    from ctp_state.gc.table_hook import TableFile, TableHead
    from ctp_state.storage import ObjectInfo


HISTORY_SCHEMA = pa.schema(
    [
        ("seq", pa.int64()),
        ("candidate", pa.bool_()),
        ("status", pa.string()),
        ("m", pa.int64()),
        ("cluster_epoch", pa.int64()),
        ("m_high_water_before", pa.int64()),
        ("started_ms", pa.int64()),
        ("run_id", pa.string()),
    ]
)
STATE_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("source", pa.string()),
        ("min_epoch_lower_bound", pa.int64()),
        ("previous_min_epoch_lower_bound", pa.int64()),
        ("previous_applied_epoch", pa.int64()),
        ("max_applied_epoch", pa.int64()),
        ("min_pending_epoch", pa.int64()),
        ("candidate_m", pa.int64()),
    ]
)


@dataclass(frozen=True)
class HistoryCandidate:
    """This run, as the gate's history check sees it beside the runs before it."""

    seq: int
    m: int | None
    cluster_epoch: int
    m_high_water_before: int | None
    started_ms: int
    run_id: str


def history_table(tail: list[GcRecord], candidate: HistoryCandidate) -> pa.Table:
    """The passing runs of ``tail`` and this run's ``candidate`` row (seq, m, cluster
    epoch, high water before, started, run id)."""
    rows = [
        {
            "seq": r.seq,
            "candidate": False,
            "status": r.status,
            "m": r.m,
            "cluster_epoch": r.cluster_epoch,
            "m_high_water_before": r.m_high_water_before,
            "started_ms": r.started_ms,
            "run_id": r.run_id,
        }
        for r in tail
        if r.passed
    ]
    rows.append({**asdict(candidate), "candidate": True, "status": "candidate"})
    return pa.Table.from_pylist(rows, schema=HISTORY_SCHEMA)


def state_table(views: list[PartitionView], previous: dict[tuple[str, int], int], m: int | None = None) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {
                "topic": v.topic,
                "partition": v.partition,
                "source": v.source,
                "min_epoch_lower_bound": v.min_epoch_lower_bound,
                "previous_min_epoch_lower_bound": previous.get((v.topic, v.partition)),
                "previous_applied_epoch": v.previous_applied_epoch,
                "max_applied_epoch": v.max_applied_epoch,
                "min_pending_epoch": v.min_pending_epoch,
                "candidate_m": m,
            }
            for v in views
        ],
        schema=STATE_SCHEMA,
    )


def partition_view_table(
    views: list[PartitionView],
    sweeps: dict[tuple[str, int], tuple[int, int]],
    statuses: dict[tuple[str, int], PartitionStatus] | None = None,
) -> pa.Table:
    statuses = statuses or {}
    none = PartitionStatus("caught up", None)
    return pa.Table.from_pylist(
        [
            {
                "topic": v.topic,
                "partition": v.partition,
                "source": v.source,
                "m": v.m,
                "min_epoch_lower_bound": v.min_epoch_lower_bound,
                "previous_applied_epoch": v.previous_applied_epoch,
                "max_applied_epoch": v.max_applied_epoch,
                "last_reconciled_offset": v.last_reconciled_offset,
                "log_end_offset": v.log_end_offset,
                "lag_entries": v.lag_entries,
                "lag_bytes": v.lag_bytes,
                "l1_swept_through": sweeps.get((v.topic, v.partition), (-1, -1))[0],
                "l1_swept_log_end": sweeps.get((v.topic, v.partition), (-1, -1))[1],
                "lag_records": v.lag_records,
                "status": statuses.get((v.topic, v.partition), none).status if statuses else None,
                "status_detail": statuses.get((v.topic, v.partition), none).detail if statuses else None,
                "topic_id": v.topic_id,
            }
            for v in views
        ],
        schema=PARTITION_SCHEMA,
    )


def deletes_table(
    l0: list[ObjectInfo],
    l0_failed: set[str],
    l1: list[ObjectInfo],
    l1_failed: set[str],
    *,
    dry_run: bool,
    interrupted: bool = False,
    gc_files: Sequence[ObjectInfo] = (),
    gc_failed: frozenset[str] = frozenset(),
    topic_files: Sequence[ObjectInfo] = (),
    topic_failed: frozenset[str] = frozenset(),
    table_files: Sequence[ObjectInfo] = (),
    table_failed: frozenset[str] = frozenset(),
) -> pa.Table:
    """Every key a run deleted (a dry run: would delete), the ones that still failed
    after every retry marked ``failed``. A run ``interrupted`` part way (it failed) marks
    every other planned key ``unknown``: deleted, in flight or never sent."""
    done = "unknown" if interrupted else "deleted"

    def outcome(key: str, failed: set[str]) -> str:
        return "would_delete" if dry_run else ("failed" if key in failed else done)

    return pa.Table.from_pydict(
        {
            "key": [o.key for o in l0]
            + [o.key for o in l1]
            + [o.key for o in gc_files]
            + [o.key for o in topic_files]
            + [o.key for o in table_files],
            "kind": ["l0"] * len(l0)
            + ["l1_orphan"] * len(l1)
            + ["gc_orphan"] * len(gc_files)
            + ["deleted_topic"] * len(topic_files)
            + ["table_metadata"] * len(table_files),
            "epoch": [layout.parse_l0_key(o.key)[1] for o in l0]
            + [None] * (len(l1) + len(gc_files) + len(topic_files) + len(table_files)),
            "size": [o.size for o in l0]
            + [o.size for o in l1]
            + [o.size for o in gc_files]
            + [o.size for o in topic_files]
            + [o.size for o in table_files],
            "outcome": [outcome(o.key, l0_failed) for o in l0]
            + [outcome(o.key, l1_failed) for o in l1]
            + [outcome(o.key, set(gc_failed)) for o in gc_files]
            + [outcome(o.key, set(topic_failed)) for o in topic_files]
            + [outcome(o.key, set(table_failed)) for o in table_files],
        },
        schema=DELETES_SCHEMA,
    )


TABLE_FILES_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("table", pa.string()),
        ("partition", pa.int32()),
        ("first_offset", pa.int64()),
        ("last_offset", pa.int64()),
        ("expected_first_offset", pa.int64()),
        ("records", pa.int64()),
        ("span", pa.int64()),
        ("min_offset", pa.int64()),
        ("max_offset", pa.int64()),
        ("path", pa.string()),
        # the file is the live incarnation's committed L1 file of its range (or that
        # file's format 2 copy); null when the table's incarnation has no state beside it
        # (deleted or re-created after the table was read)
        ("committed", pa.bool_()),
    ]
)
TABLE_PARTITIONS_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("table", pa.string()),
        ("partition", pa.int32()),
        ("published_through", pa.int64()),
        ("files_through", pa.int64()),
        ("reconciled_through", pa.int64()),
    ]
)


def table_files_table(
    heads: Sequence[TableHead],
    views: Sequence[PartitionView] = (),
    key_of: Callable[[str], str | None] = lambda path: None,
) -> pa.Table:
    """One row per data file of each table's head, in partition and offset order, with
    the offset the file must start at for the partition's files to tile it from 0 (I2 in
    the table: no gap, no overlap), and whether it is the live incarnation's committed
    L1 file of its range (``views``: the partitions' states, read after the tables;
    ``key_of``: the store key a file's path names, None outside the store --
    :meth:`ObjectStore.key_of`). A file's name says its range; only its path says whose
    it is."""
    by_partition = {(v.topic, v.topic_id, v.partition): v for v in views}
    live = {(v.topic, v.topic_id) for v in views}
    rows = []
    for h in heads:
        expected: dict[int, int] = {}
        for f in sorted(h.files, key=lambda f: (f.partition, f.first_offset, f.last_offset)):
            rows.append(
                {
                    "topic": h.topic,
                    "table": h.table,
                    "partition": f.partition,
                    "first_offset": f.first_offset,
                    "last_offset": f.last_offset,
                    "expected_first_offset": expected.get(f.partition, 0),
                    "records": f.records,
                    "span": f.last_offset - f.first_offset + 1,
                    "min_offset": f.min_offset,
                    "max_offset": f.max_offset,
                    "path": f.path,
                    "committed": _committed(by_partition.get((h.topic, h.topic_id, f.partition)), f, key_of)
                    if (h.topic, h.topic_id) in live
                    else None,
                }
            )
            expected[f.partition] = f.last_offset + 1
    return pa.Table.from_pylist(rows, schema=TABLE_FILES_SCHEMA)


def _committed(v: PartitionView | None, f: TableFile, key_of: Callable[[str], str | None]) -> bool:
    """Whether ``f`` is partition ``v``'s committed L1 file of its range, or its copy."""
    if v is None:
        return False  # a partition the live incarnation does not have
    i = bisect.bisect_left(v.l1_ends, f.last_offset)
    if i == len(v.l1_ends) or v.l1_ends[i] != f.last_offset or (v.l1_ends[i - 1] + 1 if i else 0) != f.first_offset:
        return False
    args = (v.topic, v.partition, f.first_offset, f.last_offset, v.key_id)
    return key_of(f.path) in (layout.l1_key(*args), layout.l1_copy_key(*args))


def table_partitions_table(heads: Sequence[TableHead], views: Sequence[PartitionView]) -> pa.Table:
    """Per partition of each table: the offset its published vector names, the last
    offset its files hold, and the last offset the partition's state log has reconciled
    (read after the table; None for a partition of another incarnation or none read)."""
    reconciled = {(v.topic, v.topic_id, v.partition): v.last_reconciled_offset for v in views}
    rows = []
    for h in heads:
        files: dict[int, int] = {}
        for f in h.files:
            files[f.partition] = max(files.get(f.partition, -1), f.last_offset)
        for p in sorted(set(h.published) | set(files)):
            rows.append(
                {
                    "topic": h.topic,
                    "table": h.table,
                    "partition": p,
                    "published_through": h.published.get(p, -1),
                    "files_through": files.get(p, -1),
                    "reconciled_through": reconciled.get((h.topic, h.topic_id, p)),
                }
            )
    return pa.Table.from_pylist(rows, schema=TABLE_PARTITIONS_SCHEMA)
