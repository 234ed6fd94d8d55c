"""L1 files: per-partition, offset-ordered Parquet readable by any engine.

Each row is one record: ``offset`` (int64), ``timestamp`` (timestamp[us, UTC]),
``key`` (binary, nullable), ``value`` (binary), ``headers`` (list of key/value
structs), ``partition`` (int32, the same in every row: what an Iceberg table's
``identity(partition)`` spec reads from the file's statistics). The file's key-value
metadata names the topic, partition and offset range. Format 1 files (written before
format 2: milliseconds, no ``partition`` column) are read as format 2 (:func:`parse_l1`).
Keys are deterministic from (topic, partition, first offset, last offset), and a file
is written only if its key is absent: a file at a key is never replaced. A rerun of a
crashed reconcile, or a reconciler whose lease lapsed, that meets a file already there
takes it over when it holds exactly the records it built (its bytes and CRC32C then go
into the commit); a file holding anything else is refused, never overwritten. So a
late write can never change a committed file's bytes (the CRC32C its commit recorded).
"""

from __future__ import annotations

import io
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ctp_state import l0, layout
from ctp_state.errors import CorruptData, KeyExists, ObjectNotFound
from ctp_state.state import Pending
from ctp_state.storage import ObjectStore

L1_FORMAT_VERSION = "2"
#: Format 2 (Iceberg holds no millisecond timestamps, and partitions a table by a column).
SCHEMA = pa.schema(
    [
        ("offset", pa.int64(), False),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", pa.list_(l0.HEADER_TYPE)),
        ("partition", pa.int32(), False),
    ]
)
#: Format 1, still read.
SCHEMA_V1 = pa.schema(
    [
        ("offset", pa.int64(), False),
        ("timestamp", pa.timestamp("ms", tz="UTC")),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", pa.list_(l0.HEADER_TYPE)),
    ]
)


@dataclass(frozen=True, slots=True)
class L1File:
    """One L1 file to build: consecutive pending chunks of one partition."""

    topic: str
    partition: int
    chunks: tuple[Pending, ...]
    #: The id in the topic's keys (None: keys carry only the topic's name).
    topic_id: str | None = None

    @property
    def first_offset(self) -> int:
        return self.chunks[0].base_offset

    @property
    def last_offset(self) -> int:
        return self.chunks[-1].last_offset

    @property
    def key(self) -> str:
        return layout.l1_key(self.topic, self.partition, self.first_offset, self.last_offset, self.topic_id)

    @property
    def l0_bytes(self) -> int:
        return sum(c.byte_length for c in self.chunks)

    @property
    def records(self) -> int:
        return sum(c.record_count for c in self.chunks)


def read_chunk(store: ObjectStore, chunk: Pending) -> pa.RecordBatch:
    """Fetch one placeholder's chunk with a ranged GET and verify it (CRC32C, count)."""
    return decode_checked(chunk, store.get_range(chunk.l0_key, chunk.byte_offset, chunk.byte_length))


def decode_checked(chunk: Pending, data: bytes) -> pa.RecordBatch:
    if len(data) != chunk.byte_length:
        raise CorruptData(
            chunk.l0_key, f"chunk at byte {chunk.byte_offset} is truncated: {len(data)} of {chunk.byte_length} bytes"
        )
    batch = l0.decode_chunk(data, chunk.l0_key, expected_crc=chunk.crc32c, expected_records=chunk.record_count)
    ts = batch.column("timestamp")
    if len(ts) - ts.null_count:
        values = np.frombuffer(ts.buffers()[1], dtype=np.int64, count=ts.offset + len(ts))[ts.offset :]
        if values.min() < -_MAX_MS or values.max() > _MAX_MS:  # (nulls read as whatever is there: stricter)
            raise CorruptData(chunk.l0_key, "a record's timestamp is beyond what L1 holds in microseconds")
    return batch


#: Milliseconds whose microseconds still fit an int64 (records are bounded far below at
#: produce; chunks written before that bound could hold more).
_MAX_MS = (2**63 - 1) // 1000


def to_l1_table(batches: Sequence[tuple[int, pa.RecordBatch]], partition: int = 0) -> pa.Table:
    """Turn decoded chunks of ``partition``, each with its base offset, into L1 rows. Pure."""
    tables = []
    for base, batch in batches:
        n = batch.num_rows
        tables.append(
            pa.Table.from_arrays(
                [
                    # from_buffers, not pa.array(ndarray): the latter makes pyarrow import
                    # pandas (about a second in every fresh Spark worker)
                    pa.Array.from_buffers(
                        pa.int64(), n, [None, pa.py_buffer(np.arange(base, base + n, dtype=np.int64))]
                    ),
                    _micros(batch.column("timestamp")),
                    batch.column("key"),
                    batch.column("value"),
                    batch.column("headers"),
                    pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(np.full(n, partition, dtype=np.int32))]),
                ],
                schema=SCHEMA,
            )
        )
    return pa.concat_tables(tables) if tables else SCHEMA.empty_table()


def _micros(ms: pa.Array) -> pa.Array:
    """int64 milliseconds as timestamp[us]: numpy on the buffers, since a pyarrow cast
    would load compute kernels (~0.5 s in every fresh Spark worker). Nulls stay null;
    the chunk decoder has bounded the values (:func:`decode_checked`)."""
    if len(ms) == 0:
        return pa.array([], pa.timestamp("us", tz="UTC"))
    validity, data = ms.buffers()
    values = np.frombuffer(data, dtype=np.int64, count=ms.offset + len(ms)) * 1000
    return pa.Array.from_buffers(
        pa.timestamp("us", tz="UTC"), len(ms), [validity, pa.py_buffer(values)], ms.null_count, ms.offset
    )


#: A compacted file's footer key: the bytes of the files it replaced (each weighed the
#: same way), what retention.bytes weighed before the compaction merged them into fewer.
WEIGHT_KEY = b"ctp.weight_bytes"


def encode_parquet(
    table: pa.Table,
    topic: str,
    partition: int,
    *,
    compression: str = "zstd",
    topic_id: str | None = None,
    weight_bytes: int | None = None,
) -> bytes:
    first, last = table.column("offset")[0].as_py(), table.column("offset")[-1].as_py()
    meta = {
        b"ctp.format_version": L1_FORMAT_VERSION.encode(),
        b"ctp.topic": topic.encode(),
        b"ctp.partition": str(partition).encode(),
        b"ctp.first_offset": str(first).encode(),
        b"ctp.last_offset": str(last).encode(),
    }
    if topic_id is not None:
        meta[b"ctp.topic_id"] = topic_id.encode()
    if weight_bytes is not None:
        meta[WEIGHT_KEY] = str(weight_bytes).encode()
    table = table.replace_schema_metadata(meta)
    buf = io.BytesIO()
    # Page checksums (CRC32) carry the end-to-end check past the L0 chunk's CRC32C: a
    # flipped byte in an L1 file is refused on read, never served.
    pq.write_table(table, buf, compression=compression, write_page_checksum=True)
    return buf.getvalue()


class L1Build(msgspec.Struct, frozen=True, kw_only=True):
    """What building one L1 file did (from a Spark task to the driver, as JSON): the
    file's size and CRC32C, which its commit records, and where the time went; or, with
    ``error``, why it could not be built (``l0_key``: the L0 object at fault, if one is)."""

    key: str
    records: int = 0
    l0_bytes: int = 0
    l1_bytes: int = 0
    l1_crc32c: int = 0
    read_s: float = 0.0
    decode_s: float = 0.0
    encode_s: float = 0.0
    write_s: float = 0.0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    error: str | None = None
    l0_key: str | None = None


def build_file(store: ObjectStore, f: L1File, *, compression: str = "zstd") -> L1Build:
    """Read ``f``'s chunks, write its Parquet file, return what was done and where the
    time went (seconds reading, decoding, encoding, writing).

    Raises :class:`CorruptData`/``ObjectNotFound`` naming the L0 key on bad data.
    """
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    raw = [(c, store.get_range(c.l0_key, c.byte_offset, c.byte_length)) for c in f.chunks]
    t1 = time.perf_counter()
    batches = [(c.base_offset, decode_checked(c, data)) for c, data in raw]
    table = to_l1_table(batches, f.partition)
    t2 = time.perf_counter()
    data = encode_parquet(table, f.topic, f.partition, compression=compression, topic_id=f.topic_id)
    t3 = time.perf_counter()
    data = write_once(store, f.key, data, table)
    t4 = time.perf_counter()
    return L1Build(
        key=f.key,
        records=table.num_rows,
        l0_bytes=f.l0_bytes,
        l1_bytes=len(data),
        l1_crc32c=l0.crc32c(data),
        read_s=t1 - t0,
        decode_s=t2 - t1,
        encode_s=t3 - t2,
        write_s=t4 - t3,
        wall_s=t4 - t0,
        cpu_s=time.process_time() - cpu0,
    )


#: What to do about a file in the way, said with every refusal of one.
BLOCKED_HINT = (
    "left as it is, since it could be committed; if no commit names it (ctp verify --deep --topic T "
    "lists every committed file), delete it and reconcile again"
)


def write_once(store: ObjectStore, key: str, data: bytes, table: pa.Table, *, attempts: int = 3) -> bytes:
    """Create the L1 file ``key`` with ``data`` (the encoding of ``table``), or take over
    the one already there if it holds the same rows; return the bytes now at ``key``.
    Raise :class:`CorruptData` naming the key when the file there does not read or holds
    other rows: it is never replaced (it may be committed: a reconciler cannot tell a
    file a live writer committed from one a crash left without trusting a read of the
    log that may be stale by the time it writes)."""
    for _ in range(attempts):
        try:
            store.put_if_absent(key, data)
            return data
        except KeyExists:
            pass
        try:
            there = store.get(key)
        except ObjectNotFound:
            continue  # gone since (collected as an orphan, or a create that never landed): again
        try:
            same = parse_l1(there, key).replace_schema_metadata(None).equals(table.replace_schema_metadata(None))
        except CorruptData as e:
            raise CorruptData(key, f"an L1 file in the way does not read ({e.reason}); {BLOCKED_HINT}") from None
        if not same:
            raise CorruptData(key, f"an L1 file in the way holds other records; {BLOCKED_HINT}")
        return there
    raise CorruptData(key, f"an L1 file kept appearing and vanishing at this key ({attempts} attempts)")


def read_l1(store: ObjectStore, key: str, crc32c: int | None = None) -> pa.Table:
    """A committed L1 file, checked: the CRC32C of its bytes as committed (when known),
    every page against its checksum, its schema; :class:`CorruptData` naming the key."""
    return parse_l1(store.get(key), key, crc32c)


def parse_l1(data: bytes, key: str, crc32c: int | None = None) -> pa.Table:
    if crc32c is not None and l0.crc32c(data) != crc32c:
        raise CorruptData(key, "L1 file fails its CRC32C check: its bytes are not the ones committed")
    try:
        table = pq.read_table(io.BytesIO(data), page_checksum_verification=True)
    except (OSError, pa.ArrowException) as e:
        raise CorruptData(key, f"L1 file does not read: {e}") from None
    schema = table.schema.remove_metadata()
    if schema.equals(SCHEMA_V1):
        return _upcast_v1(table, key)
    if not schema.equals(SCHEMA):
        raise CorruptData(key, f"L1 file's schema is not the L1 schema: {schema}")
    return table


def _upcast_v1(table: pa.Table, key: str) -> pa.Table:
    """A format 1 file's rows as format 2: microseconds, and its partition as a column."""
    meta = table.schema.metadata or {}
    try:
        partition = int(meta[b"ctp.partition"])
    except (KeyError, ValueError):
        partition = layout.parse_l1_key(key).partition
    return pa.Table.from_arrays(
        [
            table.column("offset"),
            table.column("timestamp").cast(pa.timestamp("us", tz="UTC")),
            table.column("key"),
            table.column("value"),
            table.column("headers"),
            pa.array([partition] * table.num_rows, pa.int32()),
        ],
        schema=SCHEMA.with_metadata(table.schema.metadata),
    )


def newest_record_ms(store: ObjectStore, key: str) -> int | None:
    """The newest record's timestamp in L1 file ``key``, from its footer's statistics (one
    ranged read); None if the footer holds none."""
    from ctp_state.table.register import read_footer

    meta = read_footer(store, key).metadata
    col = meta.schema.names.index("timestamp") if "timestamp" in meta.schema.names else None
    if col is None:
        raise CorruptData(key, "L1 file has no timestamp column")
    best: int | None = None
    for i in range(meta.num_row_groups):
        stats = meta.row_group(i).column(col).statistics
        if stats is None or not stats.has_min_max:
            return None
        v = stats.max
        ms = int(v.timestamp() * 1000) if hasattr(v, "timestamp") else int(v) // 1000
        best = ms if best is None else max(best, ms)
    return best


def newest_record_ms_read(store: ObjectStore, key: str) -> int | None:
    """The newest record's timestamp in L1 file ``key``, from its records: the file read
    whole, its page checksums and schema verified (:func:`parse_l1`); None if it holds
    none. What lets a file go for its age: a footer's statistics are not checked
    against anything, and a damaged one could make young records look old."""
    import pyarrow.compute as pc

    table = parse_l1(store.get(key), key)
    if table.num_rows == 0:
        return None
    newest = pc.max(table.column("timestamp").cast(pa.int64())).as_py()  # microseconds
    return None if newest is None else int(newest) // 1000


def weight_of(size: int, metadata: Mapping[bytes, bytes] | None) -> int:
    """What an L1 file of ``size`` bytes weighs for retention.bytes: its size, or the
    bytes of the files it replaced when its footer (``metadata``) names more (a
    compaction merges files into fewer bytes; a trim weighed the files before it). A
    weight that does not parse is no weight: the size."""
    raw = (metadata or {}).get(WEIGHT_KEY)
    try:
        named = int(raw) if raw is not None else 0
    except ValueError:
        named = 0
    return max(size, named)


def file_weight(store: ObjectStore, key: str, size: int) -> int:
    """:func:`weight_of` the L1 file ``key`` (its footer: one ranged read)."""
    from ctp_state.table.register import read_footer

    return weight_of(size, read_footer(store, key).metadata.metadata)


def l1_sizes(store: ObjectStore, topic: str, partition: int, topic_id: str | None) -> dict[str, int]:
    """The sizes of a partition's L1 files (committed or not), by one listing of its prefix."""
    return {o.key: o.size for o in store.list(layout.l1_partition_prefix(topic, partition, topic_id))}
