"""The tables the gate checks (Arrow, built from the run's inputs) and the partition
view the history keeps."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from ctp_state import layout
from ctp_state.errors import CorruptData
from ctp_state.gc.history import DELETES_SCHEMA, PARTITION_SCHEMA
from ctp_state.gc.safe_epoch import PartitionStatus
from ctp_state.records import GcRecord

if TYPE_CHECKING:
    from ctp_state.gc.inputs import PartitionView
    from ctp_state.gc.l1_sweep import Dropped
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
        ("start_offset", pa.int64()),  # R11: start offsets only grow
        ("previous_start_offset", pa.int64()),
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


def state_table(
    views: list[PartitionView],
    previous: dict[tuple[str, int], int],
    m: int | None = None,
    previous_start: dict[tuple[str, int], int] | None = None,
) -> pa.Table:
    previous_start = previous_start or {}
    return pa.Table.from_pylist(
        [
            {
                "start_offset": v.start_offset,
                "previous_start_offset": previous_start.get((v.topic, v.partition)),
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
                "start_offset": v.start_offset,
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
    retired_files: Sequence[ObjectInfo] = (),
    retired_failed: frozenset[str] = frozenset(),
) -> pa.Table:
    """Every key a run deleted (a dry run: would delete), the ones that still failed
    after every retry marked ``failed``. A run ``interrupted`` part way (it failed) marks
    every other planned key ``unknown``: deleted, in flight or never sent."""
    done = "unknown" if interrupted else "deleted"

    def outcome(key: str, failed: set[str]) -> str:
        return "would_delete" if dry_run else ("failed" if key in failed else done)

    groups: list[tuple[str, Sequence[ObjectInfo], set[str]]] = [
        ("l0", l0, l0_failed),
        ("l1_orphan", l1, l1_failed),
        ("l1_retired", retired_files, set(retired_failed)),
        ("gc_orphan", gc_files, set(gc_failed)),
        ("deleted_topic", topic_files, set(topic_failed)),
        ("table_metadata", table_files, set(table_failed)),
    ]
    return pa.Table.from_pydict(
        {
            "key": [o.key for _, objs, _ in groups for o in objs],
            "kind": [kind for kind, objs, _ in groups for _o in objs],
            "epoch": [
                layout.parse_l0_key(o.key)[1] if kind == "l0" else None for kind, objs, _ in groups for o in objs
            ],
            "size": [o.size for _, objs, _ in groups for o in objs],
            "outcome": [outcome(o.key, failed) for _, objs, failed in groups for o in objs],
        },
        schema=DELETES_SCHEMA,
    )


L1_DROPPED_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("key", pa.string()),
        ("last_offset", pa.int64()),
        ("newest_ms", pa.int64()),  # the newest record's timestamp (null: unknown)
        ("newer_bytes", pa.int64()),  # bytes of the partition's L1 files after it
        ("authorized", pa.bool_()),
        ("deleting", pa.bool_()),  # this run deletes it (only if authorized)
        ("why", pa.string()),
    ]
)


def authorize_drop(
    v: PartitionView, d: Dropped, retention: tuple[int | None, int | None], now_ms: int
) -> tuple[bool, str]:
    """R11: what allows an L1 file a trim dropped to go, judged now: an operator's
    DeleteRecords past it, the topic's retention.bytes kept at least its bound in the
    files after it, or its newest record older than the topic's retention.ms (by the
    store's clock). A file nothing allows now is kept, not lost: its records are already
    behind the start offset, and a later run lets it go once the partition has grown or
    the file has aged past a loosened retention."""
    rms, rbytes = retention
    if d.last < v.deleted_to:
        return True, f"delete-records to {v.deleted_to}"
    if rbytes is not None and d.newer_bytes >= rbytes:
        return True, f"{d.newer_bytes} bytes after it >= retention.bytes {rbytes}"
    if rms is not None and d.newest_ms is not None and now_ms - d.newest_ms > rms:
        return True, f"newest record {now_ms - d.newest_ms} ms old > retention.ms {rms}"
    age = "?" if d.newest_ms is None else now_ms - d.newest_ms
    return False, (
        f"newest record {age} ms old, retention.ms {rms if rms is not None else 'none'}; "
        f"{d.newer_bytes} bytes after it, retention.bytes {rbytes if rbytes is not None else 'none'}; "
        f"delete-records to {v.deleted_to}"
    )


def dropped_table(rows: Sequence[tuple[PartitionView, Dropped, bool, str, bool]]) -> pa.Table:
    """R11: every L1 file a trim dropped that this run looked at: (view, file,
    authorized, why, deleting)."""
    return pa.Table.from_pylist(
        [
            {
                "topic": v.topic,
                "partition": v.partition,
                "key": d.key,
                "last_offset": d.last,
                "newest_ms": d.newest_ms,
                "newer_bytes": d.newer_bytes,
                "authorized": ok,
                "deleting": deleting,
                "why": why,
            }
            for v, d, ok, why, deleting in rows
        ],
        schema=L1_DROPPED_SCHEMA,
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
            v = by_partition.get((h.topic, h.topic_id, f.partition))
            if f.partition not in expected and v is not None and v.l1_changed_log_offset >= 0:
                # A trimmed partition's table starts where its files did when it was last
                # published: at most at the first committed file (no retained record missing).
                expected[f.partition] = min(f.first_offset, v.l1_first)
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
    """Whether ``f`` is partition ``v``'s committed L1 file of its range, or its copy --
    or one that a compaction or trim took out of the committed set since the table was
    last published (the table follows the log, later: it still holds those records once,
    in the files they were in)."""
    if v is None:
        return False  # a partition the live incarnation does not have
    args = (v.topic, v.partition, f.first_offset, f.last_offset, v.key_id)
    key = key_of(f.path)
    refs = v.l1_after(f.last_offset - 1)
    if (
        refs
        and (refs[0].first, refs[0].last) == (f.first_offset, f.last_offset)
        and key in (refs[0].key, layout.l1_copy_key(*args))
    ):
        return True
    return key is not None and _superseded(v, f, key)


def _superseded(v: PartitionView, f: TableFile, key: str) -> bool:
    """Whether ``key`` is one of ``v``'s L1 files (or a copy) that a committed compaction
    replaced (its range inside a compaction's file) or a trim dropped (wholly before the
    committed files)."""
    args = (v.topic, v.partition, f.first_offset, f.last_offset, v.key_id)
    if key != layout.l1_copy_key(*args):
        try:
            name = layout.parse_l1_key(key)
        except CorruptData:
            return False
        if (name.topic, name.topic_id, name.partition, name.first, name.last) != (
            v.topic,
            v.key_id,
            v.partition,
            f.first_offset,
            f.last_offset,
        ):
            return False
    if v.l1_changed_log_offset < 0:
        return False  # never compacted or trimmed: nothing left the committed set
    if f.last_offset < v.l1_first:
        return True
    refs = v.l1_after(f.first_offset - 1)
    if not refs:
        return False
    c = refs[0]
    return layout.parse_l1_key(c.key).compacted_by > 0 and c.first <= f.first_offset and f.last_offset <= c.last


def table_partitions_table(heads: Sequence[TableHead], views: Sequence[PartitionView]) -> pa.Table:
    """Per partition of each table: the offset its published vector names, the last
    offset its files hold, and the last offset the partition's state log has reconciled
    (read after the table; None for a partition of another incarnation or none read)."""
    reconciled = {(v.topic, v.topic_id, v.partition): v.last_reconciled_offset for v in views}
    # A partition whose retention dropped every published file holds none in the table:
    # its files then reach just before its start offset (R11), not -1.
    start = {(v.topic, v.topic_id, v.partition): v.start_offset for v in views}
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
                    "files_through": files.get(p, start.get((h.topic, h.topic_id, p), 0) - 1),
                    "reconciled_through": reconciled.get((h.topic, h.topic_id, p)),
                }
            )
    return pa.Table.from_pylist(rows, schema=TABLE_PARTITIONS_SCHEMA)
