"""L1 format 2: timestamps in microseconds and a ``partition`` column (what an Iceberg
table needs), with format 1 files -- written by ctp before format 2 -- read as format 2
everywhere (``ctp read``, the GC's L1 checks, ``verify --deep``, a reconciler taking over
a file in its way). ``tests/data/l1-format1-t-2-40-42.parquet`` holds bytes written by
the format 1 encoder: records 40-42 of t/2."""

from __future__ import annotations

import io
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ctp_state import l0, l1, layout
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import CorruptData
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.read import read_partition
from ctp_state.reconcile import run_reconcile
from ctp_state.state import Pending
from ctp_state.topics import create_topic
from ctp_state.verify import verify_partition
from tests.support import format1_encoder, plog

FORMAT1 = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "l1-format1-t-2-40-42.parquet")


def chunk_of(records: list[Record], partition: int = 0) -> pa.RecordBatch:
    data, (ref,) = l0.build_object(1, [("t", partition, records)])
    return l0.decode_chunk(
        data[ref.byte_offset : ref.byte_offset + ref.byte_length],
        "k",
        expected_crc=ref.crc32c,
        expected_records=len(records),
    )


def test_format2_rows_carry_microseconds_and_their_partition():
    table = l1.to_l1_table([(10, chunk_of([Record(b"a", None, 1_700_000_000_123), Record(b"b", b"k", 5)]))], 7)
    assert table.schema == l1.SCHEMA
    assert table.column("partition").to_pylist() == [7, 7]
    assert table.column("timestamp").cast(pa.int64()).to_pylist() == [1_700_000_000_123_000, 5_000]
    data = l1.encode_parquet(table, "t", 7)
    assert pq.read_metadata(io.BytesIO(data)).metadata[b"ctp.format_version"] == b"2"
    assert l1.parse_l1(data, "k").equals(table.replace_schema_metadata(l1.parse_l1(data, "k").schema.metadata))


def test_a_format1_file_reads_as_format2():
    data = open(FORMAT1, "rb").read()
    raw = pq.read_table(io.BytesIO(data))
    assert raw.schema.remove_metadata().equals(l1.SCHEMA_V1)  # the fixture is what format 1 wrote
    table = l1.parse_l1(data, "l1/t/000002/00000000000000000040-00000000000000000042.parquet", l0.crc32c(data))
    assert table.schema.remove_metadata().equals(l1.SCHEMA)
    assert table.column("offset").to_pylist() == [40, 41, 42]
    assert table.column("partition").to_pylist() == [2, 2, 2]
    us = table.column("timestamp").cast(pa.int64()).to_pylist()
    assert us == [ms * 1000 for ms in raw.column("timestamp").cast(pa.int64()).to_pylist()]
    assert table.column("value").to_pylist() == raw.column("value").to_pylist()


def test_a_chunk_with_a_timestamp_beyond_microseconds_is_refused_naming_its_key():
    big = (2**63 - 1) // 1000 + 1
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([big], pa.int64()),
            pa.array([None], pa.binary()),
            pa.array([b"v"]),
            pa.array([[]], pa.list_(l0.HEADER_TYPE)),
        ],
        schema=l0.CHUNK_SCHEMA,
    )
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, l0.CHUNK_SCHEMA) as w:
        w.write_batch(batch)
    data = sink.getvalue()
    chunk = Pending(0, 1, "l0/000/000000000000000001/x.l0", 0, len(data), 1, l0.crc32c(data), 0)
    with pytest.raises(CorruptData, match=r"l0/000/000000000000000001/x.l0.*microseconds"):
        l1.decode_checked(chunk, data)


def test_a_partition_of_both_formats_reads_verifies_and_reconciles_as_one(store, monkeypatch):
    create_topic(store, "t", 1)
    ce = ClusterEpoch(store)
    ce.advance()
    with Producer(store, epoch_ttl_s=0) as prod:
        assert prod.write([(("t", 0), [Record(f"old-{i}".encode(), None, 1000 + i) for i in range(3)])])[0].accepted
    with monkeypatch.context() as m:  # a reconcile by a ctp of format 1
        m.setattr(l1, "encode_parquet", format1_encoder(l1.encode_parquet))
        run_reconcile(store)
    (old_key,) = plog(store, "t", 0).read_state().committed_l1_keys()
    assert pq.read_metadata(io.BytesIO(store.get(old_key))).metadata[b"ctp.format_version"] == b"1"
    ce.advance()
    with Producer(store, epoch_ttl_s=0) as prod:
        assert prod.write([(("t", 0), [Record(f"new-{i}".encode(), None, 2000 + i) for i in range(2)])])[0].accepted
    before = read_partition(store, "t", 0)  # one format 1 file + pending L0
    run_reconcile(store)
    after = read_partition(store, "t", 0)  # one file of each format
    assert before.schema == after.schema == l1.SCHEMA
    assert after.equals(before)
    assert after.column("value").to_pylist() == [b"old-0", b"old-1", b"old-2", b"new-0", b"new-1"]
    assert after.column("timestamp").cast(pa.int64()).to_pylist() == [
        1_000_000,
        1_001_000,
        1_002_000,
        2_000_000,
        2_001_000,
    ]
    assert after.column("partition").to_pylist() == [0] * 5
    check = verify_partition(store, "t", 0, deep=True)
    assert check.ok and check.l1_checked == 2, check.findings


def test_a_reconciler_takes_over_a_format1_file_of_the_same_records(store):
    """A format 2 reconciler meeting, at its key, a format 1 file holding the records it
    built takes it over (the file is never replaced), as with a file of its own format."""
    key = layout.l1_key("t", 2, 40, 42)
    old = open(FORMAT1, "rb").read()
    store.put_if_absent(key, old)
    table = l1.parse_l1(old, key).replace_schema_metadata(None)
    mine = l1.encode_parquet(table, "t", 2)
    assert mine != old
    assert l1.write_once(store, key, mine, table) == old and store.get(key) == old
