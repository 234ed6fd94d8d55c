"""The GC DAG's ``verify`` param: ``ctp verify`` runs before anything is deleted, and an
error stops the DAG there (``airflow dags test``, a real metadata DB)."""

from __future__ import annotations

import json

import pytest

from ctp_state import layout
from ctp_state.gc.history import GcHistory
from tests.support import key_id, plog
from tests.support.airflow import airflow
from tests.support.gc import l0_epochs, reconciled


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["file"], indirect=True)
def test_verify_stops_the_gc_dag_before_any_delete(airflow_env, store):
    reconciled(store)
    r = airflow(airflow_env, "db", "migrate")
    assert r.returncode == 0, r.stderr[-2000:]
    # An old entry goes bad under a snapshot: every reader (and so the gate) still reads
    # the state from the snapshot, but the log could no longer rebuild it. Only a full
    # verify reads every entry.
    log = plog(store, "t", 1)
    log.write_snapshot(log.read_state())
    lost = layout.log_entry("t", 1, 1, key_id(store, "t"))
    store.put(lost, store.get(lost)[:-9] + b"garbage}")
    before = l0_epochs(store)

    r = airflow(airflow_env, "dags", "test", "ctp_gc", "-c", json.dumps({"verify": True}), timeout=600)
    out = r.stdout + r.stderr
    assert "entry does not decode" in out and lost in out
    assert l0_epochs(store) == before  # nothing deleted
    assert GcHistory(store).last_seq() == -1  # collect never ran

    r = airflow(airflow_env, "dags", "test", "ctp_gc", "-c", json.dumps({"verify": False}), timeout=600)
    assert "verify: skipped" in r.stdout + r.stderr
    assert GcHistory(store).tail(1)[0].status == "ok"
    assert set(l0_epochs(store)) < set(before)  # without verify, the GC runs (its state reads) and deletes
