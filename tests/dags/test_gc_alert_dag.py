"""The GC DAG's ``check_m`` task: a quarantined chunk fails it (no retry) with the
partition named and calls the alert hook; a healthy run passes it; every run's Asset
event carries M, C and the delete counts (``airflow dags test``, a real metadata DB)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ctp_state.epoch import ClusterEpoch
from ctp_state.gc.history import GcHistory
from ctp_state.reconcile import run_reconcile
from tests.support import REPO, corrupt_chunk
from tests.support.airflow import airflow
from tests.support.gc import produce, reconciled

EVENTS = """
import json
from airflow.models.asset import AssetEvent, AssetModel
from airflow.utils.session import create_session
with create_session() as s:
    rows = s.query(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id).filter(
        AssetModel.uri == "ctp://gc/history").order_by(AssetEvent.id).all()
    print(json.dumps([e.extra for e in rows]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["file"], indirect=True)
def test_check_m_fails_on_a_quarantine_and_calls_the_alert_hook(airflow_env, store, tmp_path):
    hook_file = tmp_path / "alerts.txt"
    env = {
        **airflow_env,
        "PYTHONPATH": REPO,
        "CTP_ALERT_CALLBACK": "tests.dags.alert_hook:record",
        "CTP_TEST_ALERT_FILE": str(hook_file),
    }
    r = airflow(env, "db", "migrate")
    assert r.returncode == 0, r.stderr[-2000:]
    reconciled(store)

    r = airflow(env, "dags", "test", "ctp_gc", timeout=600)
    out = r.stdout + r.stderr
    assert "no alert: M = " in out, out[-3000:]
    assert not hook_file.exists()

    produce(store, partitions=(2,))
    bad = corrupt_chunk(store, "t", 2)
    ClusterEpoch(store).advance()
    assert run_reconcile(store).partitions_quarantined == 1
    r = airflow(env, "dags", "test", "ctp_gc", timeout=600)
    out = r.stdout + r.stderr
    assert "ctp alert (quarantine): 1 partition(s) quarantined" in out, out[-3000:]
    assert GcHistory(store).tail(1)[0].alert.where == ("t/2",)  # the GC itself ran and recorded it
    hooked = hook_file.read_text()
    assert hooked.startswith("check_m: ctp alert (quarantine)") and "t/2" in hooked and bad in hooked

    ev = subprocess.run([sys.executable, "-c", EVENTS], env=env, capture_output=True, text=True, timeout=120)
    assert ev.returncode == 0, ev.stderr[-2000:]
    extras = json.loads(ev.stdout.strip().splitlines()[-1])
    assert len(extras) == 2
    last = GcHistory(store).tail(1)[0]
    assert extras[-1] == {
        "seq": last.seq,
        "status": "ok",
        "m": last.m,
        "cluster_epoch": last.cluster_epoch,
        "deleted": last.deleted,
        "deleted_bytes": last.deleted_bytes,
        "would_delete": last.would_delete,
        "partitions": 3,
        "alert": "quarantine",
    }
    assert extras[0]["alert"] is None and extras[0]["deleted"] > 0
