"""Committed L1 files as Iceberg data files, without rewriting them.

pyiceberg's ``add_files`` reads each file's footer and, per file, checks the file's
schema against the table's and plans which columns get statistics: pure-Python work
that costs several milliseconds a file and is the same for every file of one schema. A
publish reads each footer once here (it needs it anyway, for the file's L1 format
version), checks each distinct file schema once, and builds the data files with
pyiceberg's own statistics functions; it appends them with a plain fast append.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ctp_state.errors import CorruptData
from ctp_state.storage import ObjectStore

#: Table properties: column statistics in the manifests for the columns readers prune
#: by (the offset, the time; the partition's are needed for its value), counts only for
#: the rest (key and value bounds cost time on every publish and help no query).
METRICS = {
    "write.metadata.metrics.default": "counts",
    "write.metadata.metrics.column.offset": "full",
    "write.metadata.metrics.column.partition": "full",
    "write.metadata.metrics.column.timestamp": "full",
}


@dataclass(frozen=True)
class Footer:
    """One Parquet file's footer, read once."""

    key: str
    size: int
    metadata: Any  # pyarrow.parquet.FileMetaData

    @property
    def format_version(self) -> str:
        """The L1 format version the file names (format 1 files name none)."""
        meta = self.metadata.metadata or {}
        return (meta.get(b"ctp.format_version") or b"1").decode()


#: How much of a file's end one read takes: an L1 footer is a few KiB, so one read holds
#: it (a larger one takes a second read, of exactly its length).
FOOTER_READ = 64 * 1024


def read_footer(store: ObjectStore, key: str) -> Footer:
    """The footer of the Parquet file ``key``: one read of the file's end (a suffix-ranged
    GET on S3), a second only for a footer longer than :data:`FOOTER_READ`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tail, size = store.get_tail(key, FOOTER_READ)
    # A Parquet file ends with its footer's length (4 bytes, little-endian) and "PAR1".
    need = int.from_bytes(tail[-8:-4], "little") + 8 if len(tail) >= 8 else 0
    if len(tail) < need <= size:
        tail = store.get_range(key, size - need, need)
    try:
        meta = pq.read_metadata(pa.BufferReader(tail))
    except (OSError, pa.ArrowException) as e:
        raise CorruptData(key, f"L1 file's footer does not read: {e}") from None
    return Footer(key, size, meta)


def data_files(table_metadata: Any, footers: list[tuple[str, Footer]]) -> list[Any]:
    """pyiceberg ``DataFile``s for ``(uri, footer)`` pairs, as ``add_files`` would build
    them; raises ``ValueError`` for a file whose schema the table cannot read."""
    from pyiceberg.io.pyarrow import _check_pyarrow_schema_compatible, compute_statistics_plan
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

    schema, spec = table_metadata.schema(), table_metadata.spec()
    plan = compute_statistics_plan(schema, table_metadata.properties)
    columns: list[tuple[Any, list[_Column]]] = []  # per distinct Parquet schema (one, as a rule)
    out = []
    for uri, footer in footers:
        parquet_schema = footer.metadata.schema
        cols = next((c for seen, c in columns if parquet_schema.equals(seen)), None)
        if cols is None:
            arrow = parquet_schema.to_arrow_schema()
            _check_pyarrow_schema_compatible(schema, arrow, format_version=table_metadata.format_version)
            cols = _columns(parquet_schema, schema, plan)
            columns.append((parquet_schema, cols))
        stats = _statistics(footer.metadata, cols)
        out.append(
            DataFile.from_args(
                content=DataFileContent.DATA,
                file_path=uri,
                file_format=FileFormat.PARQUET,
                partition=stats.partition(spec, schema),
                file_size_in_bytes=footer.size,
                sort_order_id=None,
                spec_id=table_metadata.default_spec_id,
                equality_ids=None,
                key_metadata=None,
                **stats.to_serialized_dict(),
            )
        )
    return out


@dataclass(frozen=True)
class _Column:
    """How one Parquet column's statistics are gathered: its field id, its metrics mode
    (``none``, ``counts``, or bounds), and for bounds what aggregates them."""

    field_id: int
    counts: bool  # value and null counts
    bounds: Callable[[str], Any] | None  # physical type -> a new aggregator
    raw: bool  # the aggregator takes the statistics' raw (physical) values


def _columns(parquet_schema: Any, schema: Any, plan: dict[int, Any]) -> list[_Column]:
    """The plan for each column of one Parquet schema. A bounded column of an integer or
    microsecond-timestamp type that the file stores as such is aggregated from its raw
    values (what pyiceberg's aggregator ends up with, after converting each one to a
    Python ``datetime`` and back); any other from pyiceberg's own aggregator."""
    from pyiceberg.io.pyarrow import MetricModeTypes, parquet_path_to_id_mapping
    from pyiceberg.types import DecimalType

    mapping = parquet_path_to_id_mapping(schema)
    out = []
    for pos in range(len(parquet_schema)):
        column = parquet_schema.column(pos)
        field_id = mapping[column.path]
        collector = plan[field_id]
        mode = collector.mode.type
        if mode in (MetricModeTypes.NONE, MetricModeTypes.COUNTS):
            out.append(_Column(field_id, mode is MetricModeTypes.COUNTS, None, False))
            continue
        if isinstance(collector.iceberg_type, DecimalType):  # (L1 has none; pyiceberg's path for them)
            raise ValueError(f"no statistics for decimal column {collector.column_name!r}")
        pack = _raw_packer(collector.iceberg_type, column)
        if pack is not None:
            out.append(_Column(field_id, True, functools.partial(_RawBounds, pack), True))
        else:
            out.append(_Column(field_id, True, functools.partial(_aggregator, collector), False))
    return out


def _raw_packer(iceberg_type: Any, column: Any) -> Callable[[int], bytes] | None:
    """How to write a raw statistic of ``column`` as an Iceberg bound of ``iceberg_type``,
    when the two agree on the value (None: they may not; pyiceberg's aggregator decides)."""
    import json
    import struct

    from pyiceberg.types import IntegerType, LongType, TimestampType, TimestamptzType

    logical = json.loads(column.logical_type.to_json())
    kind = logical.get("Type")
    if isinstance(iceberg_type, IntegerType) and column.physical_type == "INT32":
        ok = kind == "None" or (kind == "Int" and logical.get("bitWidth") == 32 and logical.get("isSigned") is True)
        return struct.Struct("<i").pack if ok else None
    if isinstance(iceberg_type, LongType) and column.physical_type == "INT64":
        ok = kind == "None" or (kind == "Int" and logical.get("bitWidth") == 64 and logical.get("isSigned") is True)
        return struct.Struct("<q").pack if ok else None
    if isinstance(iceberg_type, (TimestamptzType, TimestampType)) and column.physical_type == "INT64":
        utc = isinstance(iceberg_type, TimestamptzType)
        ok = kind == "Timestamp" and logical.get("timeUnit") == "microseconds" and logical.get("isAdjustedToUTC") is utc
        return struct.Struct("<q").pack if ok else None
    return None


def _aggregator(collector: Any, physical_type: str) -> Any:
    from pyiceberg.io.pyarrow import StatsAggregator

    return StatsAggregator(collector.iceberg_type, physical_type, collector.mode.length)


class _RawBounds:
    """Lower and upper bounds of raw integer statistics, in the interface of pyiceberg's
    ``StatsAggregator`` that its ``DataFileStatistics`` reads."""

    __slots__ = ("_pack", "current_max", "current_min")

    def __init__(self, pack: Callable[[int], bytes], physical_type: str):
        self._pack = pack
        self.current_min: int | None = None
        self.current_max: int | None = None

    def update_min(self, value: int) -> None:
        if self.current_min is None or value < self.current_min:
            self.current_min = value

    def update_max(self, value: int) -> None:
        if self.current_max is None or value > self.current_max:
            self.current_max = value

    def min_as_bytes(self) -> bytes | None:
        return None if self.current_min is None else self._pack(self.current_min)

    def max_as_bytes(self) -> bytes | None:
        return None if self.current_max is None else self._pack(self.current_max)


def _statistics(metadata: Any, columns: list[_Column]) -> Any:
    """pyiceberg's ``data_file_statistics_from_parquet_metadata``, step for step, from a
    plan made once per Parquet schema (:func:`_columns`): pyiceberg builds a
    ``MetricsMode`` singleton per column and row group, hashing its arguments each
    time, and turns every timestamp bound into a ``datetime`` and back.
    ``tests/table/test_register.py`` holds the two to the same result for every file
    pyiceberg can describe; a timestamp past Python's datetimes (year 10000, which L1
    admits) stops pyiceberg with an ``OverflowError``, where ctp writes the bound Iceberg
    defines, the microsecond count."""
    import pyarrow as pa
    from pyiceberg.io.pyarrow import DataFileStatistics

    column_sizes: dict[int, int] = {}
    value_counts: dict[int, int] = {}
    null_value_counts: dict[int, int] = {}
    aggregates: dict[int, Any] = {}
    invalid: set[int] = set()
    split_offsets = []
    for r in range(metadata.num_row_groups):
        row_group = metadata.row_group(r)
        first = row_group.column(0)
        data_offset, dictionary_offset = first.data_page_offset, first.dictionary_page_offset
        split_offsets.append(
            dictionary_offset if first.has_dictionary_page and dictionary_offset < data_offset else data_offset
        )
        for pos, col in enumerate(columns):
            column = row_group.column(pos)
            field_id = col.field_id
            column_sizes[field_id] = column_sizes.get(field_id, 0) + column.total_compressed_size
            if not col.counts:
                continue
            value_counts[field_id] = value_counts.get(field_id, 0) + column.num_values
            if not column.is_stats_set:
                invalid.add(field_id)
                continue
            statistics = column.statistics
            if statistics.has_null_count:
                null_value_counts[field_id] = null_value_counts.get(field_id, 0) + statistics.null_count
            if col.bounds is None:
                continue
            try:
                agg = aggregates.get(field_id)
                if agg is None:
                    agg = aggregates[field_id] = col.bounds(statistics.physical_type)
                if col.raw:
                    if statistics.has_min_max:
                        agg.update_min(statistics.min_raw)
                        agg.update_max(statistics.max_raw)
                else:
                    agg.update_min(statistics.min)
                    agg.update_max(statistics.max)
            except pa.ArrowNotImplementedError:
                invalid.add(field_id)
    for field_id in invalid:
        aggregates.pop(field_id, None)
        null_value_counts.pop(field_id, None)
    return DataFileStatistics(
        record_count=metadata.num_rows,
        column_sizes=column_sizes,
        value_counts=value_counts,
        null_value_counts=null_value_counts,
        nan_value_counts={},
        column_aggregates=aggregates,
        split_offsets=sorted(split_offsets),
    )


def transaction(table: Any) -> Any:
    """A pyiceberg transaction on ``table`` that computes its view of the metadata once
    per staged update. pyiceberg's recomputes it, deep-copying the whole metadata, on
    every read of ``table_metadata`` -- over a dozen times in one append -- and that
    cost grows with the table's history. The metadata is a frozen model, so the one
    copy can be shared by the readers of one transaction."""
    return _cached_transaction_class()(table)


@functools.cache
def _cached_transaction_class() -> type:
    from pyiceberg.table import Transaction

    class CachedTransaction(Transaction):
        _view: tuple[tuple[Any, Any], Any] | None = None  # ((base metadata, staged updates), what they give)

        @property
        def table_metadata(self) -> Any:
            key = (self._table.metadata, self._updates)
            view = self._view
            if view is None or view[0][0] is not key[0] or view[0][1] is not key[1]:
                view = (key, super().table_metadata)
                self._view = view
            return view[1]

    return CachedTransaction


def append(tx: Any, files: list[Any], snapshot_properties: dict[str, str]) -> None:
    """Append ``files`` to the transaction's table in one fast append (what ``add_files``
    does after building them; the table's name mapping, which lets readers map the
    files' columns by name, is set first if the table has none)."""
    from pyiceberg.table import TableProperties

    if tx.table_metadata.name_mapping() is None:
        tx.set_properties(
            **{TableProperties.DEFAULT_NAME_MAPPING: tx.table_metadata.schema().name_mapping.model_dump_json()}
        )
    with tx.update_snapshot(snapshot_properties=snapshot_properties).fast_append() as fast:
        for f in files:
            fast.append_data_file(f)


def replace(tx: Any, removed: list[Any], files: list[Any], snapshot_properties: dict[str, str]) -> None:
    """Remove ``removed`` (data files of the head) and add ``files`` in one snapshot: a
    compaction's or a trim's publish. A reader loading any snapshot sees the old files
    or the new ones, never both, never neither."""
    from pyiceberg.table import TableProperties

    if tx.table_metadata.name_mapping() is None:
        tx.set_properties(
            **{TableProperties.DEFAULT_NAME_MAPPING: tx.table_metadata.schema().name_mapping.model_dump_json()}
        )
    with tx.update_snapshot(snapshot_properties=snapshot_properties).overwrite() as ow:
        for f in removed:
            ow.delete_data_file(f)
        for f in files:
            ow.append_data_file(f)
