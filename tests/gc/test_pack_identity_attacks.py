"""Found by review: a state pack's state must match the log by the *bytes* of the entry it
ends at, not by that entry's age. A producer's create-if-absent of offset B writes its
temporary file, then stalls before link(2); meanwhile the reconciler ticks at B, the GC
packs the state at B, and the store loses entry B. The producer's link lands at B: its
placeholder carries the temporary file's mtime, from *before* the pack was read, so an
mtime rule took the pack's state (the lost tick folded in) for the log's, and the
placeholder was never reconciled while M passed its epoch and its L0 object was deleted.
(An S3 PUT's Last-Modified is its start, so the same holds there.) Both readers of the
pack -- the reconciler and the GC -- are attacked, each going first after the loss.

And a pack is no base for a reconciler once the GC has stopped: the reconcile's reads
stay bounded."""

from __future__ import annotations

import os
import threading
import time

import pytest

from ctp_state.entries import Placeholder, Tick
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import GateFailed
from ctp_state.gc import run_gc
from ctp_state.gc.history import newest_pack
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.reconcile_tick import tick_due
from ctp_state.settings import ReconcileSettings
from ctp_state.topics import create_topic
from tests.support import CountingStore, assert_exactly_once, plog, reconcile

# each scenario on both of the reconciler's read paths (docs/design.md 14: quiet partitions)
pytestmark = pytest.mark.usefixtures("both_read_paths")


def gc(store, gate):
    rec = run_gc(store, gate=gate)
    assert rec.status == "ok", rec.gate.failures if rec.gate else rec.error
    return rec


def epoch(store, gate):
    ClusterEpoch(store).advance()
    assert reconcile(store).ok
    time.sleep(0.01)
    gc(store, gate)
    time.sleep(0.01)


def lose_the_tick_under_a_stalled_create(store, gate, monkeypatch):
    """The scenario up to the producer's accepted placeholder at B, where the pack's
    state ends at the lost tick; returns (B, the producer's verdict)."""
    create_topic(store, "t", 1)
    log = plog(store, "t", 0, write_snapshots=False)
    for _ in range(3):
        epoch(store, gate)
    cfg = ReconcileSettings(idle_lag=2)
    for _ in range(4):  # C moves until the partition is due a tick (no reconcile yet)
        c = ClusterEpoch(store).advance()
        st = log.read_state()
        if tick_due(st, c, cfg):
            break
    else:
        raise AssertionError("the partition never came due a tick")
    b = st.applied_offset + 1
    target = os.path.join(store.root, *log.key(b).split("/"))
    real_link, stalled, release, first = os.link, threading.Event(), threading.Event(), [True]

    def slow_link(src, dst, *a, **kw):
        if dst == target and first[0]:
            first[0] = False
            stalled.set()
            assert release.wait(30)
        return real_link(src, dst, *a, **kw)

    monkeypatch.setattr(os, "link", slow_link)
    verdict = {}

    def produce():
        with Producer(store, epoch_ttl_s=0) as prod:
            verdict["v"] = prod.write([(("t", 0), [Record(b"victim")])])[0]

    th = threading.Thread(target=produce)
    th.start()
    assert stalled.wait(30)  # its temporary file is written; its link waits
    time.sleep(0.05)
    s = reconcile(store)
    assert s.ok and s.partitions_advanced == 1, s
    assert isinstance(list(log.entries())[-1][1], Tick)
    time.sleep(0.05)
    gc(store, gate)
    pack = newest_pack(store)
    assert pack is not None and pack.states[("t", 0)][0].applied_offset == b
    store.delete_many([log.key(b)])  # the store loses its newest entry (the tick)
    release.set()
    th.join(30)
    v = verdict["v"]
    assert v.accepted, v.error
    assert isinstance(dict(log.entries())[b], Placeholder)
    return b, v


def test_a_placeholder_linked_into_a_lost_ticks_place_is_reconciled(fstore, gate, monkeypatch):
    """The reconciler runs first after the loss."""
    lose_the_tick_under_a_stalled_create(fstore, gate, monkeypatch)
    for _ in range(6):
        epoch(fstore, gate)
    assert_exactly_once(fstore, "t", {0: [Record(b"victim")]}, all_in_l1=True)


def test_a_placeholder_linked_into_a_lost_ticks_place_is_never_passed_by_m(fstore, gate, monkeypatch):
    """The GC runs first after the loss, before any reconcile: M from the pack's state
    would pass the placeholder's epoch and delete its L0 object. The state's last entry
    does not match, so the GC reads the log, sees M would go back, and stops (as it
    does for a log that lost its tail); the reconciler then lifts the record."""
    _, v = lose_the_tick_under_a_stalled_create(fstore, gate, monkeypatch)
    ClusterEpoch(fstore).advance()
    with pytest.raises(GateFailed, match="I3"):
        run_gc(fstore, gate=gate)
    assert fstore.head(v.l0_key) is not None
    assert reconcile(fstore).ok
    assert_exactly_once(fstore, "t", {0: [Record(b"victim")]}, all_in_l1=True)


def test_with_the_gc_stopped_a_reconciles_reads_stay_bounded(store, gate):
    """The GC stops (its DAG paused): the newest pack falls behind the reconciles, and
    the reconciler goes back to its snapshots instead of reading an ever longer tail
    after the pack."""
    create_topic(store, "t", 2)
    for _ in range(3):
        epoch(store, gate)
    gets = []
    with Producer(store, epoch_ttl_s=0) as prod:
        for i in range(12):
            ClusterEpoch(store).advance()
            assert all(v.accepted for v in prod.write([(("t", p), [Record(b"r%d" % i)]) for p in range(2)]))
            counting = CountingStore(store)
            assert reconcile(counting).ok
            gets.append(counting.counts.get("get", 0))
    assert max(gets[4:]) <= max(gets[:4]), gets
    assert_exactly_once(store, "t", {p: [Record(b"r%d" % i) for i in range(12)] for p in range(2)}, all_in_l1=True)
