"""Found by adversarial review, now guarded: L1 files carry no checksum of the records (ctp_state/l1.py ``encode_parquet``
writes no page checksums and stores no chunk CRC; ``read_l1`` checks nothing), so the
end-to-end CRC32C a placeholder carries for its L0 chunk stops at the reconciler.

A flipped byte in a committed L1 file's value column decodes fine (zstd leaves
incompressible data as raw blocks): the GC's L1 check reads only the offset column and
passes, the GC then deletes the L0 object (the only copy that could be checked), and
every reader gets a record that is not byte-identical to what was acknowledged (I2),
while ``ctp verify`` reports a clean store.
"""

from __future__ import annotations

import random

import pytest

from ctp_state.errors import CtpError, GateFailed
from ctp_state.gc import run_gc
from ctp_state.read import read_partition
from ctp_state.reconcile import run_reconcile
from ctp_state.verify import verify
from tests.support import l0_keys, one_reconciled_record


def test_a_flipped_byte_in_an_l1_file_is_refused_and_its_l0_source_kept(store, gate):
    value = random.Random(7).randbytes(4096)  # incompressible, like most payloads
    ce, v, l1 = one_reconciled_record(store, value)

    data = bytearray(store.get(l1))
    at = bytes(data).find(value[1000:1100])
    assert at > 0
    data[at + 7] ^= 0x04  # bit rot / a bad disk / a buggy copy tool
    store.put(l1, bytes(data))

    ce.advance()
    ce.advance()
    run_reconcile(store)  # R6: the idle partition's lower bound moves
    with pytest.raises(GateFailed, match="checksums_ok"):
        run_gc(store, gate=gate)  # the new L1 file is read whole before its L0 source goes
    assert v.l0_key in l0_keys(store)  # the checked copy stays
    with pytest.raises(CtpError, match="CRC32C check|CRC checksum verification failed"):
        read_partition(store, "t", 0)  # refused, never served different bytes
    assert verify(store).ok  # the references are all there...
    deep = verify(store, deep=True)  # ...but a deep verify reads the pages
    assert not deep.ok and deep.errors[0].key == l1 and "does not read" in deep.errors[0].what
