"""Issue 9.6: a reconcile summary written by a reconciler whose clock runs a day fast
must not wedge the GC. Which summary is newest is decided by the store (a dense,
create-if-absent sequence), never by a writer's clock, and M is computed from the
partitions' own state logs, so a summary can at most annotate a run (R7), never hold M
back or make it look as if it decreased."""

from __future__ import annotations

import time

from ctp_state.epoch import ClusterEpoch
from ctp_state.gc import run_gc
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.reconcile import run_reconcile
from ctp_state.settings import GcSettings
from ctp_state.topics import create_topic

DAY_S = 86_400


def produce(store, round_: int) -> None:
    with Producer(store, epoch_ttl_s=0) as prod:
        for v in prod.write([(("t", p), [Record(f"{round_}-{p}".encode())]) for p in range(2)]):
            assert v.accepted, v.error


def test_a_summary_from_a_fast_clock_does_not_wedge_the_gc(store, gate, monkeypatch):
    create_topic(store, "t", 2)
    ce = ClusterEpoch(store)
    ce.advance()
    produce(store, 0)
    ce.advance()
    ce.advance()
    real_time = time.time
    import ctp_state.reconcile as reconcile_mod

    with monkeypatch.context() as m:  # this reconciler's clock is a day fast
        m.setattr(reconcile_mod.time, "time", lambda: real_time() + DAY_S)
        run_reconcile(store)
    ce.advance()
    ce.advance()
    logs = run_gc(store, gate=gate, config=GcSettings(dry_run=True))
    # Later, correct-clock reconciles move every partition's lower bound up.
    produce(store, 1)
    ce.advance()
    ce.advance()
    run_reconcile(store)
    ce.advance()
    ce.advance()
    run_reconcile(store)

    rec = run_gc(store, gate=gate, config=GcSettings(dry_run=True))  # the default run
    assert rec.status == "dry_run"
    assert rec.m > logs.m
    rec2 = run_gc(store, gate=gate)
    assert rec2.status == "ok" and rec2.m == rec.m
