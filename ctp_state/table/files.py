"""Reading a topic's table back: the files its head lists, and what it holds per
partition. Spark has no Iceberg jars here: a Spark job reads the table through the
file list (:func:`spark_read`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ctp_state.storage import ObjectStore
from ctp_state.table.publish import PUBLISHED, read_vector


@dataclass(frozen=True)
class DataFile:
    path: str
    partition: int
    records: int
    bytes: int


def data_files(table: Any) -> list[DataFile]:
    """The data files of the table's head, ordered by partition then path (L1 keys sort
    by offset)."""
    if table.current_snapshot() is None:
        return []
    out = [
        DataFile(t.file.file_path, int(t.file.partition[0]), t.file.record_count, t.file.file_size_in_bytes)
        for t in table.scan().plan_files()
    ]
    return sorted(out, key=lambda f: (f.partition, f.path))


def published_vector(store: ObjectStore, table: Any) -> dict[int, int]:
    """Per partition, the last record offset the table's head accounts for."""
    head = table.current_snapshot()
    return read_vector(store, head.summary.additional_properties.get(PUBLISHED) if head else None)


def spark_read(spark: Any, table: Any) -> Any:
    """A Spark DataFrame of the table's head, read through its file list."""
    paths = [f.path for f in data_files(table)]
    if not paths:
        from ctp_state.table.schema import iceberg_schema

        return spark.createDataFrame([], schema=iceberg_schema().as_arrow())
    return spark.read.parquet(*paths)
