"""Airflow as real processes (api-server, scheduler, dag-processor): trigger the GC DAG
through the REST API v2 with ``dry_run`` set, and wait for it to succeed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
import requests

from ctp_state import layout
from ctp_state.epoch import ClusterEpoch
from ctp_state.gc.history import GcHistory
from ctp_state.reconcile import run_reconcile
from tests.support import produce_rounds
from tests.support.airflow import BIN, airflow, free_port

PASSWORD = "ctp-test-password"


class AirflowProcesses:
    def __init__(self, env: dict[str, str], port: int):
        self.env, self.port, self.procs = env, port, []
        self.logs = os.path.join(env["AIRFLOW_HOME"], "process-logs")
        os.makedirs(self.logs, exist_ok=True)

    def start(self, *args: str) -> None:
        out = open(os.path.join(self.logs, f"{args[0]}.log"), "wb")
        # Own session per process, so stopping it stops its children (task runners) too.
        self.procs.append(
            subprocess.Popen(
                [os.path.join(BIN, "airflow"), *args],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    def tail(self) -> str:
        out = []
        for name in sorted(os.listdir(self.logs)):
            with open(os.path.join(self.logs, name), errors="replace") as f:
                out.append(f"--- {name}\n" + "".join(f.readlines()[-30:]))
        return "\n".join(out)

    def stop(self) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 20
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)


@pytest.mark.parametrize("store_url", ["file"], indirect=True)
def test_trigger_the_gc_dag_with_dry_run_through_the_rest_api(airflow_env, store):
    produce_rounds(store, partitions=2, rounds=3, per=10)
    run_reconcile(store)
    ClusterEpoch(store).advance()
    l0_before = {o.key for o in store.list(layout.L0_ROOT)}

    port = free_port()
    env = {
        **airflow_env,
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__API_AUTH__JWT_SECRET": "ctp-test-jwt-secret-with-enough-length",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
    }
    with open(os.path.join(env["AIRFLOW_HOME"], "simple_auth_manager_passwords.json.generated"), "w") as f:
        json.dump({"admin": PASSWORD}, f)
    r = airflow(env, "db", "migrate")
    assert r.returncode == 0, r.stderr[-2000:]

    procs = AirflowProcesses(env, port)
    base = f"http://127.0.0.1:{port}"
    try:
        procs.start("api-server", "--port", str(port))
        procs.start("scheduler")
        procs.start("dag-processor")

        def wait_for(what, check, timeout=180.0, every=1.0):
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    got = check()
                except requests.RequestException:
                    got = None
                if got:
                    return got
                time.sleep(every)
            raise AssertionError(f"timed out waiting for {what}\n{procs.tail()}")

        wait_for("the API server", lambda: requests.get(f"{base}/api/v2/monitor/health", timeout=5).ok)
        token = requests.post(
            f"{base}/auth/token", json={"username": "admin", "password": PASSWORD}, timeout=10
        ).json()["access_token"]
        h = {"Authorization": f"Bearer {token}"}
        assert requests.get(f"{base}/api/v2/dags", timeout=10).status_code == 401  # no token, no access
        wait_for("the GC DAG to be parsed", lambda: requests.get(f"{base}/api/v2/dags/ctp_gc", headers=h, timeout=5).ok)
        r = requests.patch(f"{base}/api/v2/dags/ctp_gc", headers=h, json={"is_paused": False}, timeout=10)
        assert r.ok, r.text
        r = requests.post(
            f"{base}/api/v2/dags/ctp_gc/dagRuns",
            headers=h,
            json={"logical_date": None, "conf": {"dry_run": True, "verify": True}},
            timeout=10,
        )
        assert r.ok, r.text
        run_id = r.json()["dag_run_id"]

        def finished():
            state = requests.get(f"{base}/api/v2/dags/ctp_gc/dagRuns/{run_id}", headers=h, timeout=5).json()["state"]
            return state if state in ("success", "failed") else None

        assert wait_for("the GC DAG run", finished, timeout=300, every=2) == "success", procs.tail()
        tis = requests.get(f"{base}/api/v2/dags/ctp_gc/dagRuns/{run_id}/taskInstances", headers=h, timeout=10).json()
        assert {t["task_id"]: t["state"] for t in tis["task_instances"]} == {
            "gate": "success",
            "verify": "success",
            "collect": "success",
            "check_m": "success",
            "report": "success",
        }
    finally:
        procs.stop()
    rec = GcHistory(store).tail(1)[0]
    assert rec.status == "dry_run" and rec.would_delete > 0 and rec.deleted == 0
    assert {o.key for o in store.list(layout.L0_ROOT)} == l0_before  # a dry run deletes nothing
    assert all(p.poll() is not None for p in procs.procs)
