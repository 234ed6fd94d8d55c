"""Found by adversarial review, now guarded: one damaged GC-history object bricks the GC for good.

``prepare`` reads the newest ``history_tail`` records and the newest passing run's
partition view (ctp_state/gc/prepare.py ``prepare``: ``history.tail``, ``read_partitions``)
and lets CorruptData / ObjectNotFound escape before anything is appended. So the
damaged record stays the newest one, every later run fails the same way, and no
command repairs it (``ctp verify`` reports it; nothing fixes it). Failing one run is
the right call; failing every run forever is a bricked GC: L0 garbage grows without
bound while producers keep writing.
"""

from __future__ import annotations

import pytest

from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import CtpError
from ctp_state.gc import run_gc
from ctp_state.gc.history import GcHistory, record_key
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.topics import create_topic
from tests.support import l0_keys, reconcile


def _garbage_round(store, ce, i):
    ce.advance()
    with Producer(store, epoch_ttl_s=0) as prod:
        assert prod.write([(("t", 0), [Record(f"r{i}".encode())])])[0].accepted
    ce.advance()
    ce.advance()
    reconcile(store)


def _damage_newest_record(store):
    key = record_key(GcHistory(store).last_seq())
    data = bytearray(store.get(key))
    data[len(data) // 2] ^= 0x01
    store.put(key, bytes(data))


def _drop_newest_view(store):
    h = GcHistory(store)
    store.delete_many([h.get(h.last_seq()).partitions_key])


@pytest.mark.parametrize("damage", [_damage_newest_record, _drop_newest_view], ids=["flipped-bit", "view-lost"])
def test_one_damaged_history_object_does_not_stop_later_gc_runs(store, gate, damage):
    create_topic(store, "t", 1)
    ce = ClusterEpoch(store)
    _garbage_round(store, ce, 0)
    assert run_gc(store, gate=gate).status == "ok"
    damage(store)

    failures = []
    for i in range(1, 4):  # three more rounds of production, reconcile and GC
        _garbage_round(store, ce, i)
        try:
            run_gc(store, gate=gate)
        except CtpError as e:
            failures.append(type(e).__name__)
    left = len(l0_keys(store))
    assert len(failures) < 3, f"every GC run failed ({failures}); {left} L0 objects pile up, nothing recovers"
    newest = GcHistory(store).tail(1)[0]
    assert newest.status == "ok" and left == 0 and not failures  # every later run collected
    # the run that first skipped the damaged object says so on its record
    first_after = GcHistory(store).get(1)
    assert first_after.history_skipped and first_after.history_skipped[0].seq == 0
