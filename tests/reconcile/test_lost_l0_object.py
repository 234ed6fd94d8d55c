"""A lost L0 object quarantines its partition without making every later reconcile
re-read the partition's whole backlog (issue: topic identity, scenario 8).

Before: every run re-read every pending chunk, wrote every L1 file it could build, and
committed none of them (the partition was all or nothing), so the same backlog was read
and written again on every run, and files piled up that no run could commit. Now a run
commits the files before the bad chunk, and later runs, seeing the object still missing
(one HEAD), do not claim or read the partition at all until it is restored.
"""

from __future__ import annotations

import threading

from ctp_state import layout
from ctp_state.epoch import ClusterEpoch
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.reconcile import run_reconcile
from ctp_state.settings import ReconcileSettings
from ctp_state.topics import create_topic
from tests.support import Wrapped, plog, values


class Counting(Wrapped):
    """Counts ranged reads of L0 objects and L1 writes."""

    def __init__(self, inner):
        super().__init__(inner)
        self.l0_reads = self.l1_writes = 0
        self._lock = threading.Lock()

    def get_range(self, k, s, n):
        with self._lock:
            self.l0_reads += 1
        return self.inner.get_range(k, s, n)

    def put_if_absent(self, k, d):
        if k.startswith(layout.L1_ROOT):
            with self._lock:
                self.l1_writes += 1
        return self.inner.put_if_absent(k, d)


def test_a_lost_l0_object_holds_its_partition_from_its_chunk_on_and_is_not_read_again(store):
    create_topic(store, "t", 1)
    ClusterEpoch(store).advance()
    batches = [[Record(f"b{b}-{i}".encode(), None, 1000 + i) for i in range(5)] for b in range(6)]
    with Producer(store, epoch_ttl_s=0) as prod:
        for recs in batches:  # one L0 object per batch
            assert prod.write([(("t", 0), recs)])[0].accepted
    pending = plog(store, "t", 0).read_state().pending
    lost = pending[3].l0_key
    backup = store.get(lost)
    store.delete_many([lost])  # an operator's mistake, a lifecycle rule, a bad restore

    one_per_chunk = ReconcileSettings(target_file_bytes=1)
    first = Counting(store)
    s1 = run_reconcile(first, config=one_per_chunk)
    (p1,) = s1.partitions
    assert p1.status == "quarantined" and p1.key == lost and "not found" in (p1.reason or ""), p1
    st = plog(store, "t", 0).read_state()
    assert st.last_reconciled_offset == 14  # the three chunks before the lost one are committed
    assert st.pending[0].l0_key == lost and len(st.l1_ends) == 3

    later = Counting(store)
    for _ in range(3):
        (p,) = run_reconcile(later, config=one_per_chunk).partitions
        assert p.status == "quarantined" and p.key == lost and "still missing" in (p.reason or ""), p
        assert "restore it" in (p.reason or "") and "15 records" in (p.reason or "")
    assert later.l0_reads == 0 and later.l1_writes == 0  # nothing re-read, nothing rewritten
    log_end = plog(store, "t", 0).read_state().applied_offset
    run_reconcile(store, config=one_per_chunk)
    assert plog(store, "t", 0).read_state().applied_offset == log_end  # not even claimed

    store.put(lost, backup)  # the operator restores it from a backup: the next run goes on
    (p,) = run_reconcile(store, config=one_per_chunk).partitions
    assert p.status == "reconciled", p
    assert values(store) == [r.value for b in batches for r in b]
