"""A committed L1 file becomes the same Iceberg data file through ctp's registration
as through pyiceberg's own ``add_files`` path: the statistics ctp computes itself
(for speed) are pyiceberg's, field for field, whatever the metrics settings, row
groups or nulls."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO, parquet_file_to_data_file
from pyiceberg.table.metadata import new_table_metadata
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER

from ctp_state import l1
from ctp_state.errors import CorruptData
from ctp_state.storage import open_store
from ctp_state.table import register
from ctp_state.table.schema import iceberg_schema, partition_spec

FIELDS = ("record_count", "column_sizes", "value_counts", "null_value_counts", "nan_value_counts")
BOUNDS = (
    "lower_bounds",
    "upper_bounds",
    "split_offsets",
    "partition",
    "file_size_in_bytes",
    "file_path",
    "file_format",
)


def l1_rows(n: int, partition: int) -> pa.Table:
    headers = l1.SCHEMA.field("headers").type
    return pa.table(
        {
            "offset": pa.array(range(100, 100 + n), pa.int64()),
            "timestamp": pa.array(
                [None if i % 7 == 3 else 1_700_000_000_000_000 + i for i in range(n)], pa.timestamp("us", tz="UTC")
            ),
            "key": pa.array([None if i % 3 == 0 else b"key-%06d-with-a-long-tail" % i for i in range(n)], pa.binary()),
            "value": pa.array([b"v" * (i % 50) for i in range(n)], pa.binary()),
            "headers": pa.array([[{"key": "h", "value": b"x"}] if i % 2 else [] for i in range(n)], headers),
            "partition": pa.array([partition] * n, pa.int32()),
        },
        schema=l1.SCHEMA,
    )


WRITERS = {
    "l1": lambda rows, path: path.write_bytes(l1.encode_parquet(rows, "t", 7)),
    "row-groups": lambda rows, path: pq.write_table(rows, path, row_group_size=37, compression="zstd"),
    # bounds pyiceberg's own aggregator computes (ctp reads raw microseconds only)
    "millisecond-timestamps": lambda rows, path: pq.write_table(
        rows, path, coerce_timestamps="ms", allow_truncated_timestamps=True
    ),
}


@pytest.mark.parametrize(
    "properties",
    [register.METRICS, {}, {"write.metadata.metrics.default": "none"}, {"write.metadata.metrics.default": "full"}],
    ids=["ctp", "pyiceberg-default", "none", "full"],
)
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_ctps_data_file_is_the_one_add_files_would_build(tmp_path, properties, writer):
    rows = l1_rows(500, 7)
    path = tmp_path / "f.parquet"
    WRITERS[writer](rows, path)
    assert writer != "row-groups" or pq.read_metadata(path).num_row_groups > 1
    metadata = new_table_metadata(
        iceberg_schema(), partition_spec(), UNSORTED_SORT_ORDER, f"file://{tmp_path}/table", properties
    )
    store = open_store(f"file://{tmp_path}", {})
    uri = f"file://{path}"

    (ours,) = register.data_files(metadata, [(uri, register.read_footer(store, "f.parquet"))])
    theirs = parquet_file_to_data_file(PyArrowFileIO(), metadata, uri)

    for name in FIELDS + BOUNDS:
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours == theirs
    assert ours.lower_bounds.get(1) is not None or properties.get("write.metadata.metrics.default") == "none"


def test_a_footer_longer_than_one_read_is_read_whole_and_a_cut_file_is_refused(tmp_path):
    store = open_store(f"file://{tmp_path}", {})
    path = tmp_path / "f.parquet"
    pq.write_table(l1_rows(3000, 2), path, row_group_size=10)  # 300 row groups: a long footer
    whole = pq.read_metadata(path)
    assert whole.serialized_size > register.FOOTER_READ

    footer = register.read_footer(store, "f.parquet")
    assert footer.metadata.equals(whole) and footer.size == path.stat().st_size

    store.put("cut.parquet", path.read_bytes()[:-100])
    with pytest.raises(CorruptData, match="'cut.parquet': L1 file's footer does not read"):
        register.read_footer(store, "cut.parquet")


@pytest.mark.parametrize(
    "micros", [253_402_300_800_000_000, -62_135_596_800_000_001], ids=["year-10000", "before-year-1"]
)
def test_a_timestamp_past_pythons_datetimes_gets_its_raw_bound_where_pyiceberg_stops(tmp_path, micros):
    """L1 admits any millisecond whose microseconds fit an int64; pyiceberg turns each
    bound into a Python datetime and fails past year 9999 (a publish that could never
    finish). Iceberg's bound is the microsecond count itself, which ctp writes."""
    import struct

    rows = l1_rows(2, 7).set_column(
        1, "timestamp", pa.array([micros, 1_700_000_000_000_000], pa.timestamp("us", tz="UTC"))
    )
    (tmp_path / "f.parquet").write_bytes(l1.encode_parquet(rows, "t", 7))
    metadata = new_table_metadata(
        iceberg_schema(), partition_spec(), UNSORTED_SORT_ORDER, f"file://{tmp_path}/table", register.METRICS
    )
    store = open_store(f"file://{tmp_path}", {})
    uri = f"file://{tmp_path}/f.parquet"
    with pytest.raises(OverflowError):
        parquet_file_to_data_file(PyArrowFileIO(), metadata, uri)

    (ours,) = register.data_files(metadata, [(uri, register.read_footer(store, "f.parquet"))])
    low, high = sorted([micros, 1_700_000_000_000_000])
    assert (ours.lower_bounds[2], ours.upper_bounds[2]) == (struct.pack("<q", low), struct.pack("<q", high))
