"""The M-stall alert through real GC runs (the real gate) on both backends: a stuck
claim and a quarantined chunk each raise it, a healthy store never does, and the CLI
shows it."""

from __future__ import annotations

import json

import pytest

from ctp_state.entries import AccessMode
from ctp_state.epoch import ClusterEpoch
from ctp_state.gc import run_gc
from ctp_state.gc.history import GcHistory
from tests.support import corrupt_chunk, ok, plog, reconcile
from tests.support.gc import produce, reconciled


def cycle(store, gate):
    """What the three DAGs do in one round: traffic, advance, reconcile, GC."""
    produce(store)
    ClusterEpoch(store).advance()
    reconcile(store)
    return run_gc(store, gate=gate)


def test_a_healthy_store_never_alerts(store, gate):
    reconciled(store)
    recs = [cycle(store, gate) for _ in range(8)]
    assert [r.alert for r in recs] == [None] * 8
    ms = [r.m for r in recs]
    # With traffic at every epoch M moves every other run (R3: a bound passes an epoch
    # once the window has moved past it): flat for two runs is healthy, which is why the
    # default rule wants four.
    assert ms == sorted(ms) and ms[-1] - ms[0] >= 6, ms
    assert all(len(set(ms[i : i + 3])) > 1 for i in range(len(ms) - 2)), ms


def test_a_stuck_claim_raises_the_stall_alert_naming_the_partition(store, gate, subprocess_env, tmp_path):
    reconciled(store)
    log = plog(store, "t", 1)
    log.claim(log.read_state(), "reconciler:dead", AccessMode.EXCLUSIVE, lease_ms=3_600_000)
    recs = [cycle(store, gate) for _ in range(5)]
    assert len({r.m for r in recs}) == 1, [r.m for r in recs]  # t/1 holds M
    assert [r.alert is not None for r in recs] == [False, False, False, True, True]
    alert = recs[3].alert
    assert alert.kind == "stall" and alert.where == ("t/1",)
    assert "claim held by reconciler:dead" in alert.message
    assert f"M stalled at {recs[3].m} for 4 GC runs" in alert.message
    assert GcHistory(store).tail(1)[0].alert == recs[4].alert  # on the record, as stored

    env = {**subprocess_env, "CTP_REPORT_DIR": str(tmp_path / "report2")}
    status = json.loads(ok(env, "status", "--json"))
    assert status["gc"]["alert"]["kind"] == "stall" and status["gc"]["seq"] == recs[4].seq
    assert "ALERT (stall): M stalled" in ok(env, "status")
    out = ok(env, "gc", "--dry-run")
    assert "ALERT (stall): M stalled" in out and "held by t/1: " in out and "claim held by reconciler:dead" in out
    rec = json.loads(ok(env, "gc", "--dry-run", "--json"))
    assert rec["alert"]["where"] == ["t/1"]
    page = open(rec["report"]).read()  # the report shows it above everything else
    assert "ALERT (stall)" in page and "claim held by reconciler:dead" in page
    # The rule is configurable: off, or a longer window, and it says nothing.
    assert json.loads(ok(env, "gc", "--dry-run", "--json", "--alert-stall-runs", "0"))["alert"] is None
    assert json.loads(ok(env, "gc", "--dry-run", "--json", "--alert-stall-runs", "30"))["alert"] is None


def test_a_quarantined_chunk_alerts_at_once(store, gate):
    reconciled(store)
    assert cycle(store, gate).alert is None
    produce(store, partitions=(2,))
    bad = corrupt_chunk(store, "t", 2)
    ClusterEpoch(store).advance()
    summary = reconcile(store)
    assert summary.partitions_quarantined == 1
    rec = run_gc(store, gate=gate)
    assert rec.alert is not None and rec.alert.kind == "quarantine" and rec.alert.where == ("t/2",)
    assert bad in rec.alert.message and "CRC32C" in rec.alert.message


@pytest.mark.parametrize("idle_lag,together", [(4, True), (6, True), (6, False)])
def test_an_idle_cluster_at_a_longer_idle_lag_never_alerts_and_a_stuck_claim_still_does(
    store, gate, idle_lag, together
):
    # idle_lag 4, ticking together: each idle partition is ticked every fourth epoch, and
    # M stays put in between -- four flat runs while C moves three, which the default
    # rule (4 runs, 3 epochs) took for a stall on every cycle. 6: the default lag (six
    # flat runs); and the default schedule, each partition at its phase (M moves when the
    # partition holding it ticks, within the same six epochs).
    from ctp_state.settings import ReconcileSettings

    lag = ReconcileSettings(idle_lag=idle_lag, tick_together=together)
    assert idle_lag != 6 or together or lag == ReconcileSettings()
    reconciled(store)

    def idle_cycle():
        ClusterEpoch(store).advance()
        reconcile(store, config=lag)
        return run_gc(store, gate=gate)

    n = 2 * idle_lag + 2
    recs = [idle_cycle() for _ in range(n)]
    ms = [r.m for r in recs]
    assert [r.alert for r in recs] == [None] * n, [(r.m, r.cluster_epoch, r.alert) for r in recs]
    flat = idle_lag - 1
    assert ms == sorted(ms), ms
    assert not together or any(ms[i] == ms[i + flat] for i in range(n - flat)), ms  # idle_lag flat runs seen
    assert all(r.cluster_epoch - r.m <= idle_lag + 1 for r in recs), [(r.m, r.cluster_epoch) for r in recs]

    log = plog(store, "t", 1)
    log.claim(log.read_state(), "reconciler:dead", AccessMode.EXCLUSIVE, lease_ms=3_600_000)
    stuck = [idle_cycle() for _ in range(idle_lag + 2)]
    kinds = [r.alert.kind if r.alert else None for r in stuck]
    assert "stall" in kinds and stuck[-1].alert.where == ("t/1",), kinds
