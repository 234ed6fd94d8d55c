"""A store that lost log entries in the middle (an operator's delete, a damaged bucket,
a partial restore): holes no create-if-absent append makes. The reconciler reads by
probing (GETs of the next key, no LIST) and so cannot see a hole when it reads; it
must never write into one, and the GC, which deletes by what the states commit, must
refuse the store rather than act on a state read short of a lost entry. Both scenarios
came from a review of the probing reads, where they lost data; kept as tests."""

from __future__ import annotations

import pytest

from ctp_state.compact import run_compaction
from ctp_state.entries import Placeholder
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import StateUnreadable
from ctp_state.gc import run_gc
from ctp_state.read import read_partition
from ctp_state.reconcile import run_reconcile
from ctp_state.settings import CompactSettings, GcSettings
from tests.support import plog, produce_rounds


def test_two_lost_entries_no_tick_lands_in_the_hole_and_the_gc_keeps_the_pending_l0_object(store, gate):
    """Placeholders at 4, 5, 6; the store loses 4 and 5. The reconciler's probing read
    stops at 4 and finds the partition idle and due: its listing before the write finds
    6 past the hole and it writes nothing. The GC's listing read names the gap and the
    run stops: the L0 object the pending placeholder at 6 needs stays."""
    produce_rounds(store, "t", partitions=1, rounds=1, per=2)  # init, placeholder 1
    assert run_reconcile(store).partitions_reconciled == 1  # claim 2, reconcile 3
    produce_rounds(store, "t", partitions=1, rounds=3, per=2, advance=False)  # placeholders 4, 5, 6
    log = plog(store, "t", 0, write_snapshots=False)
    (last, victim), *_ = list(log.entries(5))
    assert isinstance(victim, Placeholder) and last == 6
    for _ in range(4):
        ClusterEpoch(store).advance()
    store.delete_many([log.key(4), log.key(5)])
    keys = sorted(o.key for o in store.list(log.prefix))
    s = run_reconcile(store)
    assert s.partitions_advanced == 0 and s.partitions_failed == 1 and "not dense" in s.partitions[0].reason, s
    assert sorted(o.key for o in store.list(log.prefix)) == keys  # nothing written into the hole
    with pytest.raises(StateUnreadable):
        run_gc(store, gate=gate, config=GcSettings())
    assert store.head(victim.l0_key) is not None


def test_a_lost_compactor_claim_never_lets_the_gc_take_the_compacted_file_for_an_orphan(store, gate):
    """The store loses the compactor's claim (the entry before its compact). A state
    read short of it would not commit the compacted file, which a full sweep would then
    delete as an orphan, and once the entry came back from a backup the log would commit
    a file that is gone. The GC reads by listing: it names the gap and deletes nothing."""
    small = CompactSettings(max_small_files=1, target_file_bytes=1 << 20)
    sent = []
    for _ in range(3):
        sent += produce_rounds(store, "t", partitions=1, rounds=1, per=2)[0]
        assert run_reconcile(store).partitions_reconciled == 1
    run_compaction(store, config=small)
    log = plog(store, "t", 0, write_snapshots=False)
    kinds = [(o, e.kind) for o, e in log.entries()]
    assert [k for _, k in kinds[-2:]] == ["claim", "compact"], kinds
    (compacted,) = [f.key for f in log.read_state().committed_l1_files()]
    h = kinds[-2][0]
    saved = store.get(log.key(h))
    store.delete_many([log.key(h)])
    with pytest.raises(StateUnreadable):
        run_gc(store, gate=gate, config=GcSettings(l1_grace_s=0, l1_reader_grace_s=0, l1_full_sweep_s=0))
    store.put(log.key(h), saved)  # restored
    assert store.head(compacted) is not None
    assert [r["value"] for r in read_partition(store, "t", 0).to_pylist()] == [x.value for x in sent]
