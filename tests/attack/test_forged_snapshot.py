"""Attack: a snapshot that is sealed and self-consistent but does not match its log.

The GC "reads every partition from its state log" (ctp_state/gc_run.py ``gather``), but
that read is ``PartitionLog.read_state``: the snapshot, trusted as is, plus the entries
after it. The snapshot is checked for its CRC32C (which anyone can recompute) and for
self-consistency (ctp_state/state.py ``inconsistencies``) -- never against a single
log entry. A snapshot that says "everything was reconciled into an L1 file, lower
bound 5" passes both, and the I1 backstop then has no pending placeholder to check:
the GC deletes the L0 object of an acknowledged, never-reconciled record.

(The existing test forges only the lower bound and is caught because a pending
placeholder stays below it; drop the pending list too and nothing is caught.)
A writer with a bug, an old binary, or a tool that "compacts" snapshots is enough.
"""

from __future__ import annotations

from ctp_state import codec, layout
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import CtpError
from ctp_state.gc_run import run_gc
from ctp_state.l0 import Record
from ctp_state.log import PartitionLog
from ctp_state.producer import Producer
from ctp_state.topics import create_topic
from ctp_state.verify import verify


def test_a_consistent_sealed_snapshot_that_disagrees_with_the_log_makes_the_gc_delete_pending_data(store, gate):
    create_topic(store, "t", 1)
    ce = ClusterEpoch(store)
    ce.advance()  # C = 2
    with Producer(store, epoch_ttl_s=0) as prod:
        v = prod.write([(("t", 0), [Record(b"acked")])])[0]
    assert v.accepted
    for _ in range(4):
        ce.advance()  # C = 6
    log = PartitionLog(store, "t", 0)
    st = log.read_state()
    assert [p.epoch for p in st.pending] == [2]

    key = layout.snapshot("t", 0)
    body = codec.unseal(store.get(key), key) if store.head(key) else None
    if body is None:
        log.write_snapshot(st)
        body = codec.unseal(store.get(key), key)
    body.pop("crc", None)
    body.update(max_applied_epoch=5, previous_applied_epoch=5, min_epoch_lower_bound=5,
                last_reconciled_log_offset=st.applied_offset, last_reconciled_offset=0, next_offset=1,
                l1_ends=[0], pending=[])
    store.put(key, codec.seal(body))  # sealed, and self-consistent

    try:
        rec = run_gc(store, gate=gate)
    except CtpError as e:
        rec = {"m": None, "error": str(e)}
    report = verify(store)
    # I1: the L0 object of an accepted, unreconciled placeholder is never deleted.
    assert store.head(v.l0_key) is not None, f"GC deleted the only copy of an acked record with M={rec['m']}"
    assert not report.ok  # (verify does notice the disagreement -- after the fact)
