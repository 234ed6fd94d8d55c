"""Attack: one missing L0 object (an accidental delete, a bad lifecycle rule, a restore
that missed a prefix) wedges the GC for the whole cluster, for good.

The reconciler quarantines the partition (ctp_state/reconcile.py ``commit``: any bad
file -> nothing committed) and every later run does the same, since the lost chunk is
always the first pending one. Its lower bound never moves, so M = min over all
partitions stays below the lost epoch forever: no topic's garbage is collected again.
Records acknowledged *after* the loss, whose L0 objects are intact, are never lifted
into L1 either, and a read of the partition from offset 0 fails on the lost chunk.

There is no way out short of hand-editing the log: no command writes off a chunk
that is known lost (with an audit record) so the partition can move on.
"""

from __future__ import annotations

from ctp_state.epoch import ClusterEpoch
from ctp_state.gc_run import run_gc
from ctp_state.l0 import Record
from ctp_state.log import PartitionLog
from ctp_state.producer import Producer
from ctp_state.reconcile import run_reconcile
from ctp_state.topics import create_topic
from tests.attack.helpers import l0_keys


def test_one_lost_l0_object_pins_m_for_every_topic_forever(store, gate):
    create_topic(store, "t", 1)
    create_topic(store, "u", 1)
    ce = ClusterEpoch(store)
    ce.advance()
    with Producer(store, epoch_ttl_s=0) as prod:
        lost = prod.write([(("t", 0), [Record(b"lost")])])[0]
    store.delete_many([lost.l0_key])  # the one object that goes missing

    before = l0_keys(store)
    with Producer(store, epoch_ttl_s=0) as prod:
        for r in range(4):  # life goes on: both topics keep producing
            ce.advance()
            for topic in ("t", "u"):  # separate L0 objects: u's become pure garbage
                assert prod.write([((topic, 0), [Record(f"{topic}{r}".encode())])])[0].accepted
            ce.advance()
            run_reconcile(store)
    u_keys = {k for k in l0_keys(store) - before if store.get(k).find(b'"u"') > 0}
    assert len(u_keys) == 4
    rec = run_gc(store, gate=gate)
    u_state = PartitionLog(store, "u", 0).read_state()
    t_state = PartitionLog(store, "t", 0).read_state()
    print("M", rec["m"], "C", rec["cluster_epoch"], "u lower bound", u_state.min_epoch_lower_bound,
          "t pending", len(t_state.pending), "L0 objects left", len(l0_keys(store)))
    # u is healthy and fully reconciled: its garbage must become collectable; and t's
    # records acknowledged after the loss (intact) must reach L1.
    u_garbage = [k for k in l0_keys(store) if k in u_keys]
    assert not u_garbage, f"M pinned at {rec['m']} by t/0's lost chunk: u's {len(u_garbage)} L0 objects never go"
    assert t_state.last_reconciled_offset >= 1, "records after the lost chunk are never reconciled"
