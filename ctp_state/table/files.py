"""Reading a topic's table back: the files its head lists, and what it holds per
partition. Spark has no Iceberg jars here: a Spark job reads the table through the
file list (:func:`spark_read`)."""

from __future__ import annotations

import re
from typing import Any

from ctp_state.errors import CorruptData
from ctp_state.gc.table_hook import TableFile, TableHead
from ctp_state.storage import ObjectStore
from ctp_state.table.vector import read_vector, vector_key
from ctp_state.topic_meta import Topic

#: Every file ctp registers is named ``<first>-<last>[.w<writer epoch>].parquet`` by the
#: record offsets it holds: an L1 key (a compaction's names its writer epoch), or the
#: format 2 copy of a format 1 file.
_RANGE_RE = re.compile(r"/(\d{20})-(\d{20})(?:\.w\d{20})?\.parquet$")
_OFFSET_FIELD = 1  # the field id of ``offset`` (ctp_state.table.schema)


def data_files(table: Any) -> list[TableFile]:
    """The data files of the table's head, ordered by partition then offset."""
    if table.current_snapshot() is None:
        return []
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import LongType

    def bound(b: dict[int, bytes] | None) -> int | None:
        raw = (b or {}).get(_OFFSET_FIELD)
        return None if raw is None else int(from_bytes(LongType(), raw))

    out = []
    for task in table.scan().plan_files():
        f = task.file
        m = _RANGE_RE.search(f.file_path)
        if m is None:
            raise CorruptData(f.file_path, f"table {table.name()} lists a data file ctp did not name")
        out.append(
            TableFile(
                partition=int(f.partition[0]),
                first_offset=int(m.group(1)),
                last_offset=int(m.group(2)),
                records=f.record_count,
                min_offset=bound(f.lower_bounds),
                max_offset=bound(f.upper_bounds),
                path=f.file_path,
                bytes=f.file_size_in_bytes,
            )
        )
    return sorted(out, key=lambda f: (f.partition, f.first_offset, f.path))


def published_vector(store: ObjectStore, table: Any) -> dict[int, int]:
    """Per partition, the last record offset the table's head accounts for."""
    return read_vector(store, vector_key(table.current_snapshot()))


def table_head(store: ObjectStore, table: Any, t: Topic) -> TableHead:
    """What ``t``'s table holds at its head: its data files and its published vector."""
    head = table.current_snapshot()
    return TableHead(
        topic=t.name,
        topic_id=t.id,
        table=".".join(table.name()),
        snapshot_id=head.snapshot_id if head else None,
        published=published_vector(store, table),
        files=tuple(data_files(table)),
    )


def spark_read(spark: Any, table: Any) -> Any:
    """A Spark DataFrame of the table's head, read through its file list."""
    paths = [f.path for f in data_files(table)]
    if not paths:
        from ctp_state.table.schema import iceberg_schema

        return spark.createDataFrame([], schema=iceberg_schema().as_arrow())
    return spark.read.parquet(*paths)
