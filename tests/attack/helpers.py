from __future__ import annotations

from ctp_state import layout
from ctp_state.epoch import ClusterEpoch
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.read import committed_l1_keys, read_partition
from ctp_state.reconcile import run_reconcile
from ctp_state.topics import create_topic
from tests.support import plog


def l0_keys(store) -> set[str]:
    return {o.key for o in store.list(layout.L0_ROOT)}


def values(store, topic="t", partition=0) -> list[bytes]:
    return [r["value"] for r in read_partition(store, topic, partition).to_pylist()]


def one_reconciled_record(store, value: bytes):
    """t/0 holds one record with ``value``, reconciled into one L1 file at epoch 2.
    Returns (cluster epoch, the record's verdict, the L1 key)."""
    create_topic(store, "t", 1)
    ce = ClusterEpoch(store)
    ce.advance()
    with Producer(store, epoch_ttl_s=0) as prod:
        v = prod.write([(("t", 0), [Record(value, b"k", 1234)])])[0]
    assert v.accepted
    run_reconcile(store)
    (l1,), _ = committed_l1_keys(plog(store, "t", 0))
    return ce, v, l1
