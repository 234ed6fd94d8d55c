"""The GC reads each newly committed L1 file whole "before the L0 objects it came from
may go" (docs/failure-model.md) -- except for a partition that holds a live claim when
the GC runs: ``prepare`` (ctp_state/gc/prepare.py, the ``inputs`` of the L1 sweep) leaves
such a partition out of the sweep, so its new L1 files are not read this run, while M,
computed from every partition's lower bound, still covers the L0 objects they came
from, and those are deleted.

A reconciler holding a claim is the normal state of a busy partition (a run claims
every partition with pending data, and holds it for its whole Spark job). Here the
committed L1 file has a flipped byte in a page (the case
tests/gc/test_l1_sweep_checksum_attacks.py covers when no claim is held): the gate never
sees it, its L0 source is deleted, and the acknowledged record can no longer be read
(I2).
"""

from __future__ import annotations

import random

from ctp_state.entries import AccessMode
from ctp_state.errors import CtpError
from ctp_state.gc import run_gc
from ctp_state.read import read_partition
from ctp_state.reconcile import run_reconcile
from tests.support import l0_keys, one_reconciled_record, plog


def test_a_claimed_partitions_unchecked_l1_file_never_lets_its_l0_source_go(store, gate):
    value = random.Random(7).randbytes(4096)  # incompressible, like most payloads
    ce, v, l1 = one_reconciled_record(store, value)
    data = bytearray(store.get(l1))
    data[bytes(data).find(value[1000:1100]) + 7] ^= 0x04  # bit rot in a data page
    store.put(l1, bytes(data))
    ce.advance()
    ce.advance()
    run_reconcile(store)  # R6: the lower bound passes the L0 object's epoch

    # The next reconcile run has claimed the partition (its Spark job is running).
    log = plog(store, "t", 0)
    log.claim(log.read_state(), "reconciler:next-run", AccessMode.EXCLUSIVE, lease_ms=15 * 60 * 1000)
    try:
        run_gc(store, gate=gate)
    except CtpError:
        pass  # refused: what I2 asks for
    try:
        read_partition(store, "t", 0)
        readable = True
    except CtpError:
        readable = False
    # I2: the only checkable copy stays until the L1 copy has been read whole.
    assert v.l0_key in l0_keys(store) or readable, "L0 source deleted, L1 copy unreadable"
