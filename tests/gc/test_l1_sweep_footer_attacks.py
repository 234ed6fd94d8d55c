"""L1 page checksums cover page *data* only: a flipped bit in the Parquet footer (the
schema, the column-chunk metadata) is not checked by anything.

The footer names the columns and the fields of the ``headers`` struct. One bit flipped
in the field name ``value`` of that struct (``v`` -> ``r``: 0x76 ^ 0x04) leaves a file
that every page checksum still passes. The GC's whole-file read
(ctp_state/gc/l1_sweep.py ``_check_row``: ``parse_l1`` + the offset column) passes, the gate
passes, the GC deletes the L0 object -- the only copy that could be checked against the
producer's CRC32C -- and ``read_partition`` (``.select(SCHEMA.names).cast(SCHEMA)``)
casts the struct by field name: every header's value is served as ``None``, with no
error. ``ctp verify --deep`` (offsets only) reports a clean store. I2: an accepted
record is not served byte-identical, and nothing can bring it back.

The same bit flipped in a top-level column name (``value`` -> ``ralue``) makes every
read of the partition fail after the L0 source is gone (I2: accepted records
unreadable), and in ``offset`` it makes the GC itself die with a KeyError on every run.
"""

from __future__ import annotations

import struct

from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import CtpError, GateFailed
from ctp_state.gc import run_gc
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.read import committed_l1_keys, read_partition
from ctp_state.reconcile import run_reconcile
from ctp_state.topics import create_topic
from ctp_state.verify import verify
from tests.support import l0_keys, plog

RECORDS = [
    Record(f"value-{i}".encode(), f"k{i}".encode(), 1_700_000_000_000 + i, (("trace", f"id-{i}".encode()),))
    for i in range(5)
]


def _footer_span(data: bytes) -> tuple[int, int]:
    (n,) = struct.unpack("<I", data[-8:-4])
    assert data[-4:] == b"PAR1"
    return len(data) - 8 - n, len(data) - 8


def _flip_schema_name(data: bytes, after: bytes, name: bytes) -> bytes:
    """Flip bit 2 of the first byte of the schema element ``name`` that follows the
    schema element ``after`` in the footer (thrift: field 4, binary, length, bytes)."""
    lo, hi = _footer_span(data)
    start = data.index(bytes([0x18, len(after)]) + after, lo, hi) if after else lo
    at = data.index(bytes([0x18, len(name)]) + name, start, hi) + 2
    out = bytearray(data)
    out[at] ^= 0x04
    return bytes(out)


def _committed_and_collected(store, gate, damage):
    create_topic(store, "t", 1)
    ce = ClusterEpoch(store)
    ce.advance()
    with Producer(store, epoch_ttl_s=0) as prod:
        v = prod.write([(("t", 0), RECORDS)])[0]
    assert v.accepted
    run_reconcile(store)
    (l1,), _ = committed_l1_keys(plog(store, "t", 0))
    store.put(l1, damage(store.get(l1)))  # one bit, in the footer
    ce.advance()
    ce.advance()
    run_reconcile(store)  # R6: the idle partition's lower bound moves past the L0 epoch
    try:
        run_gc(store, gate=gate)
    except (GateFailed, CtpError):
        pass  # refused: what the invariant asks for
    return v, l1


def _as_produced(table) -> list[tuple]:
    return [(r["key"], r["value"], [(h["key"], h["value"]) for h in r["headers"]]) for r in table.to_pylist()]


EXPECTED = [(r.key, r.value, [(k, v) for k, v in r.headers]) for r in RECORDS]


def test_a_flipped_bit_in_a_header_field_name_is_never_served_once_l0_is_gone(store, gate):
    v, _l1 = _committed_and_collected(
        store, gate, lambda d: _flip_schema_name(d, b"element", b"value")
    )  # headers.element.value
    l0_gone = v.l0_key not in l0_keys(store)
    try:
        served = _as_produced(read_partition(store, "t", 0))
    except CtpError:
        served = None  # refused: fine, as long as the L0 source was kept
    # I2: either the damage is refused (and the L0 copy kept) or what is served is exact.
    assert served == EXPECTED or (served is None and not l0_gone), (l0_gone, served[:1] if served else served)
    # and a deep verify must not call such a store clean
    assert not verify(store, deep=True).ok or served == EXPECTED


def test_a_flipped_bit_in_a_column_name_never_leaves_records_unreadable(store, gate):
    v, _l1 = _committed_and_collected(
        store, gate, lambda d: _flip_schema_name(d, b"key", b"value")
    )  # the top-level value column
    l0_gone = v.l0_key not in l0_keys(store)
    try:
        served = _as_produced(read_partition(store, "t", 0))
    except Exception as e:
        served = f"{type(e).__name__}: {e}"
    # I2: accepted records stay readable: the GC must not delete the L0 copy of a file
    # that does not read back as the L1 schema.
    assert served == EXPECTED or not l0_gone, (l0_gone, served)
