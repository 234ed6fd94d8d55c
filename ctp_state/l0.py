"""The L0 object format (documented in docs/l0-format.md).

One L0 object holds chunks for many partitions, written by one producer flush::

    header   8 bytes   b"CTPL0" + format version (u8) + 2 reserved zero bytes
    chunk*             one per (topic, partition): an Arrow IPC stream of one record
                       batch (timestamp int64 ms, key binary?, value binary,
                       headers list<struct<key string, value binary>>)
    footer             JSON index: format version, epoch, and per chunk topic,
                       partition, byte offset, byte length, record count, CRC32C
    trailer  16 bytes  footer length (u32 LE), footer CRC32C (u32 LE),
                       format version (u16 LE), b"CTPL0F"

A placeholder carries its chunk's byte range and CRC32C, so a reader fetches exactly
one chunk with a ranged GET and verifies it without touching the rest of the object.
Arrow IPC lets readers decode a chunk without a per-record loop in Python.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import google_crc32c
import pyarrow as pa
import pyarrow.compute as pc

from ctp_state import validate
from ctp_state.errors import CorruptData, InvalidRecord, UnsupportedVersion

FORMAT_VERSION = 1
SUPPORTED_VERSIONS = (1,)
MAGIC = b"CTPL0"
HEADER = MAGIC + bytes([FORMAT_VERSION]) + b"\x00\x00"
TRAILER = struct.Struct("<IIH6s")
TRAILER_MAGIC = b"CTPL0F"

HEADER_TYPE = pa.struct([("key", pa.string()), ("value", pa.binary())])
CHUNK_SCHEMA = pa.schema(
    [
        ("timestamp", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", pa.list_(HEADER_TYPE)),
    ]
)


def crc32c(data: bytes | memoryview) -> int:
    return int(google_crc32c.value(bytes(data) if isinstance(data, memoryview) else data))


@dataclass(frozen=True, slots=True)
class Record:
    value: bytes
    key: bytes | None = None
    timestamp_ms: int = 0
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class ChunkRef:
    topic: str
    partition: int
    byte_offset: int
    byte_length: int
    record_count: int
    crc32c: int
    # R8: CRC32C of the chunk's keys, values and headers (not its timestamps, which a
    # re-send may default differently): what a re-sent batch must match. Not stored.
    fingerprint: int = field(default=0, compare=False)


def _ipc(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    out: bytes = sink.getvalue().to_pybytes()
    return out


def encode_chunk(records: Sequence[Record]) -> bytes:
    return encode_chunk_and_fingerprint(records)[0]


def encode_chunk_and_fingerprint(records: Sequence[Record]) -> tuple[bytes, int]:
    """The chunk's bytes, and the CRC32C of its records without their timestamps.
    Raises :class:`InvalidRecord` for a record no reader could read back (a timestamp
    outside years 1970-9999, a header name that is not valid Unicode)."""
    try:
        table = _chunk_batch(records)
    except (pa.ArrowException, UnicodeEncodeError, OverflowError, TypeError) as e:
        raise InvalidRecord("record", f"cannot be encoded: {e}") from None
    ts = pc.min_max(table.column(0))
    if len(records) and (ts["min"].as_py() < 0 or ts["max"].as_py() > validate.MAX_TIMESTAMP_MS):
        raise InvalidRecord("record", f"timestamp outside [0, {validate.MAX_TIMESTAMP_MS}] ms (1970 to year 9999)")
    return _ipc(table), crc32c(_ipc(table.drop_columns(["timestamp"])))


def _chunk_batch(records: Sequence[Record]) -> pa.RecordBatch:
    return pa.record_batch(
        [
            pa.array([r.timestamp_ms for r in records], pa.int64()),
            pa.array([r.key for r in records], pa.binary()),
            pa.array([r.value for r in records], pa.binary()),
            pa.array([[{"key": k, "value": v} for k, v in r.headers] for r in records], pa.list_(HEADER_TYPE)),
        ],
        schema=CHUNK_SCHEMA,
    )


def build_object(epoch: int, chunks: Iterable[tuple[str, int, Sequence[Record]]]) -> tuple[bytes, list[ChunkRef]]:
    """Encode an L0 object from ``(topic, partition, records)`` chunks."""
    parts = [HEADER]
    pos = len(HEADER)
    refs: list[ChunkRef] = []
    for topic, partition, records in chunks:
        if not records:
            continue
        data, fingerprint = encode_chunk_and_fingerprint(records)
        refs.append(ChunkRef(topic, partition, pos, len(data), len(records), crc32c(data), fingerprint))
        parts.append(data)
        pos += len(data)
    footer = json.dumps(
        {
            "v": FORMAT_VERSION,
            "epoch": epoch,
            "chunks": [[c.topic, c.partition, c.byte_offset, c.byte_length, c.record_count, c.crc32c] for c in refs],
        },
        separators=(",", ":"),
    ).encode()
    parts.append(footer)
    parts.append(TRAILER.pack(len(footer), crc32c(footer), FORMAT_VERSION, TRAILER_MAGIC))
    return b"".join(parts), refs


def decode_chunk(data: bytes, key: str, *, expected_crc: int, expected_records: int) -> pa.RecordBatch:
    """Verify one chunk's CRC32C and record count and decode it; :class:`CorruptData`
    naming the key if anything is off."""
    actual = crc32c(data)
    if actual != expected_crc:
        raise CorruptData(key, f"chunk CRC32C mismatch: expected {expected_crc:#010x}, computed {actual:#010x}")
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(data))
        batches = list(reader)
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as e:
        raise CorruptData(key, f"chunk does not decode: {e}") from None
    if reader.schema != CHUNK_SCHEMA:
        raise CorruptData(key, "chunk schema is not the L0 chunk schema")
    batch = pa.concat_batches(batches) if len(batches) != 1 else batches[0]
    if batch.num_rows != expected_records:
        raise CorruptData(key, f"chunk holds {batch.num_rows} records, its placeholder says {expected_records}")
    return batch


def records_of(batch: pa.RecordBatch) -> list[Record]:
    cols = batch.to_pydict()
    return [
        Record(v, k, ts, tuple((h["key"], h["value"]) for h in hs))
        for ts, k, v, hs in zip(cols["timestamp"], cols["key"], cols["value"], cols["headers"])
    ]


def read_index(data: bytes, key: str) -> tuple[int, list[ChunkRef]]:
    """Parse a whole L0 object's trailer and footer; return ``(epoch, chunks)``."""
    if len(data) < len(HEADER) + TRAILER.size:
        raise CorruptData(key, f"L0 object is truncated ({len(data)} bytes)")
    if data[:5] != MAGIC:
        raise CorruptData(key, "not an L0 object (bad header magic)")
    if data[5] not in SUPPORTED_VERSIONS:
        raise UnsupportedVersion(key, "L0 format", data[5], SUPPORTED_VERSIONS)
    footer_len, footer_crc = _trailer(data[-TRAILER.size :], key)
    end = len(data) - TRAILER.size
    if footer_len > end - len(HEADER):
        raise CorruptData(key, f"L0 footer length {footer_len} exceeds the object")
    return _footer(data[end - footer_len : end], footer_crc, end - footer_len, key)


#: The last bytes of an L0 object a footer reader asks for first: the footer of an
#: object of a few hundred chunks, in one request.
FOOTER_READ = 64 * 1024
#: The longest footer :func:`footer_tail_length` accepts: a chunk's entry is under 100
#: bytes, so 64 MiB is more than 600,000 chunks. A footer length past it (a damaged or
#: forged trailer, up to 4 GiB) is refused before anything is read into memory.
MAX_FOOTER_BYTES = 64 * 1024 * 1024


def footer_tail_length(tail: bytes, size: int, key: str) -> int:
    """How many of the last bytes of the L0 object at ``key`` (``size`` bytes long) hold
    its footer and trailer, from ``tail``, at least its last ``TRAILER.size`` bytes.
    Raises :class:`CorruptData` naming the key."""
    if size < len(HEADER) + TRAILER.size or len(tail) < TRAILER.size:
        raise CorruptData(key, f"L0 object is truncated ({size} bytes)")
    footer_len, _crc = _trailer(tail[-TRAILER.size :], key)
    if footer_len > size - TRAILER.size - len(HEADER):
        raise CorruptData(key, f"L0 footer length {footer_len} exceeds the object")
    if footer_len > MAX_FOOTER_BYTES:
        raise CorruptData(key, f"L0 footer length {footer_len} exceeds {MAX_FOOTER_BYTES} bytes")
    return footer_len + TRAILER.size


def parse_footer_tail(tail: bytes, size: int, key: str) -> tuple[int, list[ChunkRef]]:
    """``(epoch, chunks)`` of the L0 object at ``key`` (``size`` bytes long) from its
    last bytes alone (at least :func:`footer_tail_length` of them): what a reader that
    needs only the object's index reads, with one ranged GET of the object's end."""
    need = footer_tail_length(tail, size, key)
    if len(tail) < need:
        raise CorruptData(key, f"L0 footer needs the last {need} bytes, got {len(tail)}")
    footer_len, footer_crc = _trailer(tail[-TRAILER.size :], key)
    end = len(tail) - TRAILER.size
    return _footer(tail[end - footer_len : end], footer_crc, size - TRAILER.size - footer_len, key)


def _trailer(trailer: bytes, key: str) -> tuple[int, int]:
    """The footer's length and CRC32C from an L0 object's last ``TRAILER.size`` bytes."""
    footer_len, footer_crc, version, magic = TRAILER.unpack(trailer)
    if magic != TRAILER_MAGIC:
        raise CorruptData(key, "L0 object is truncated or damaged (bad trailer magic)")
    if version not in SUPPORTED_VERSIONS:
        raise UnsupportedVersion(key, "L0 format", version, SUPPORTED_VERSIONS)
    return footer_len, footer_crc


def _footer(footer: bytes, footer_crc: int, chunks_end: int, key: str) -> tuple[int, list[ChunkRef]]:
    """The epoch and chunks a footer (checked against its CRC32C) names; every chunk
    must lie between the header and ``chunks_end`` (where the footer starts)."""
    if crc32c(footer) != footer_crc:
        raise CorruptData(key, "L0 footer CRC32C mismatch")
    try:
        b = json.loads(footer)
        refs = [ChunkRef(str(t), int(p), int(o), int(n), int(r), int(c)) for t, p, o, n, r, c in b["chunks"]]
        epoch = int(b["epoch"])
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptData(key, f"L0 footer is malformed: {e}") from None
    for ref in refs:
        if ref.byte_offset < len(HEADER) or ref.byte_offset + ref.byte_length > chunks_end:
            raise CorruptData(key, f"chunk for {ref.topic}/{ref.partition} lies outside the object")
    return epoch, refs
