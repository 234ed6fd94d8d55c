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
from dataclasses import dataclass
from typing import Any

from ctp_state.errors import CorruptData, ObjectNotFound
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


def read_footer(store: ObjectStore, key: str) -> Footer:
    """The footer of the Parquet file ``key`` (two ranged GETs)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = _RangeFile(store, key)
    try:
        meta = pq.read_metadata(pa.PythonFile(f, mode="r"))
    except (OSError, pa.ArrowException) as e:
        raise CorruptData(key, f"L1 file's footer does not read: {e}") from None
    return Footer(key, f.size, meta)


def data_files(table_metadata: Any, footers: list[tuple[str, Footer]]) -> list[Any]:
    """pyiceberg ``DataFile``s for ``(uri, footer)`` pairs, as ``add_files`` would build
    them; raises ``ValueError`` for a file whose schema the table cannot read."""
    from pyiceberg.io.pyarrow import (
        _check_pyarrow_schema_compatible,
        compute_statistics_plan,
        parquet_path_to_id_mapping,
    )
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

    schema, spec = table_metadata.schema(), table_metadata.spec()
    plan = compute_statistics_plan(schema, table_metadata.properties)
    mapping = parquet_path_to_id_mapping(schema)
    modes = {field_id: collector.mode.type for field_id, collector in plan.items()}
    checked: list[Any] = []  # the distinct Parquet schemas seen (one, as a rule)
    out = []
    for uri, footer in footers:
        parquet_schema = footer.metadata.schema
        if not any(parquet_schema.equals(seen) for seen in checked):
            arrow = parquet_schema.to_arrow_schema()
            _check_pyarrow_schema_compatible(schema, arrow, format_version=table_metadata.format_version)
            checked.append(parquet_schema)
        stats = _statistics(footer.metadata, plan, modes, mapping)
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


def _statistics(metadata: Any, plan: dict[int, Any], modes: dict[int, Any], mapping: dict[str, int]) -> Any:
    """pyiceberg's ``data_file_statistics_from_parquet_metadata``, step for step, with
    each column's metrics mode looked up rather than compared as a new ``MetricsMode``
    per column and row group (pyiceberg's singletons hash their arguments on every
    construction: most of that function's time). ``tests/table/test_register.py`` holds
    the two to the same result."""
    import pyarrow as pa
    from pyiceberg.io.pyarrow import DataFileStatistics, MetricModeTypes, StatsAggregator
    from pyiceberg.types import DecimalType

    column_sizes: dict[int, int] = {}
    value_counts: dict[int, int] = {}
    null_value_counts: dict[int, int] = {}
    aggregates: dict[int, Any] = {}
    invalid: set[int] = set()
    split_offsets = []
    columns = range(metadata.num_columns)
    for r in range(metadata.num_row_groups):
        row_group = metadata.row_group(r)
        first = row_group.column(0)
        data_offset, dictionary_offset = first.data_page_offset, first.dictionary_page_offset
        split_offsets.append(
            dictionary_offset if first.has_dictionary_page and dictionary_offset < data_offset else data_offset
        )
        for pos in columns:
            column = row_group.column(pos)
            field_id = mapping[column.path_in_schema]
            column_sizes[field_id] = column_sizes.get(field_id, 0) + column.total_compressed_size
            mode = modes[field_id]
            if mode is MetricModeTypes.NONE:
                continue
            value_counts[field_id] = value_counts.get(field_id, 0) + column.num_values
            if not column.is_stats_set:
                invalid.add(field_id)
                continue
            statistics = column.statistics
            if statistics.has_null_count:
                null_value_counts[field_id] = null_value_counts.get(field_id, 0) + statistics.null_count
            if mode is MetricModeTypes.COUNTS:
                continue
            collector = plan[field_id]
            if isinstance(collector.iceberg_type, DecimalType):  # (L1 has none; pyiceberg's path for them)
                raise ValueError(f"no statistics for decimal column {collector.column_name!r}")
            try:
                if field_id not in aggregates:
                    aggregates[field_id] = StatsAggregator(
                        collector.iceberg_type, statistics.physical_type, collector.mode.length
                    )
                aggregates[field_id].update_min(statistics.min)
                aggregates[field_id].update_max(statistics.max)
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


class _RangeFile:
    """A read-only file over one store object, fetched by ranges (for Parquet footers)."""

    def __init__(self, store: ObjectStore, key: str):
        info = store.head(key)
        if info is None:
            raise ObjectNotFound(key)
        self.store, self.key, self.size, self.pos = store, key, info.size, 0
        self.closed = False

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else self.pos + offset if whence == 1 else self.size + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        n = self.size - self.pos if n is None or n < 0 else min(n, self.size - self.pos)
        if n <= 0:
            return b""
        data = self.store.get_range(self.key, self.pos, n)
        self.pos += len(data)
        return data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True
