"""``scripts/demo.sh --ui`` (scripts/ui.sh) as a user meets it after the first command:
the ctp DAGs were registered paused, yet after ``--ui`` all three are unpaused and the
epoch DAG really runs on its schedule; every listener is on 127.0.0.1; the admin
password is random, printed once and kept (mode 600) under the demo directory."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import stat
import subprocess
import time

import pytest
import requests

from ctp_state.epoch import ClusterEpoch
from tests.support import REPO
from tests.support.airflow import BIN, airflow, free_port

DAGS = ("ctp_epoch_advance", "ctp_reconcile", "ctp_gc")


def listening_sockets(root: int) -> list[str]:
    """``address:port`` of every TCP listener owned by ``root`` or its descendants."""
    parents: dict[int, int] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                parents[int(pid)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo.extend(child for child, parent in parents.items() if parent == pid and child not in tree)
    inodes: set[str] = set()
    for pid in tree:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                    addr, port = cols[1].split(":")
                    out.append(f"{_ip(addr)}:{int(port, 16)}")
    return out


def _ip(hex_addr: str) -> str:
    """An address as /proc/net/tcp{,6} writes it: 32-bit words in host (little-endian) order."""
    raw = b"".join(bytes.fromhex(hex_addr[i : i + 8])[::-1] for i in range(0, len(hex_addr), 8))
    ip = ipaddress.ip_address(raw)
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped or ip)


def _loopback(listener: str) -> bool:
    return ipaddress.ip_address(listener.rsplit(":", 1)[0]).is_loopback


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["file"], indirect=True)
def test_ui_mode_unpauses_the_dags_binds_loopback_and_runs_the_epoch_on_schedule(airflow_env, store, tmp_path):
    demo = tmp_path / "demo"
    port = free_port()
    env = {
        **airflow_env,
        "PATH": BIN + os.pathsep + airflow_env["PATH"],
        "CTP_UI_PORT": str(port),
        "CTP_DEMO_DIR": str(demo),
        "CTP_EPOCH_INTERVAL_MINUTES": "1",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
    }
    env.pop("CTP_UI_PASSWORD", None)
    # What the first command leaves behind: the ctp DAGs registered, and paused.
    assert airflow(env, "db", "migrate").returncode == 0
    r = airflow(env, "dags", "reserialize")
    assert r.returncode == 0, r.stderr[-2000:]
    listed = json.loads(airflow(env, "dags", "list", "-o", "json").stdout.strip().splitlines()[-1])
    assert {d["dag_id"]: d["is_paused"] for d in listed if d["dag_id"] in DAGS} == dict.fromkeys(DAGS, "True")

    c0 = ClusterEpoch(store).current()
    out_path = tmp_path / "ui.out"
    ui = subprocess.Popen(
        ["bash", os.path.join(REPO, "scripts", "ui.sh")],
        env=env,
        stdout=open(out_path, "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"

    def wait_for(what, check, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                got = check()
            except (requests.RequestException, OSError, ValueError):
                got = None
            if got:
                return got
            assert ui.poll() is None, f"ui.sh exited: {out_path.read_text()[-3000:]}"
            time.sleep(2)
        log = (tmp_path / "airflow" / "ui.log").read_text(errors="replace")[-4000:]
        raise AssertionError(f"timed out waiting for {what}\n{out_path.read_text()[-2000:]}\n{log}")

    try:
        wait_for("ui.sh to be ready", lambda: "Press Ctrl-C" in out_path.read_text(), 300)
        printed = out_path.read_text()
        pw_file = demo / "ui-password"
        password = pw_file.read_text().strip()
        assert len(password) >= 24 and password != "ctp-admin"
        assert stat.S_IMODE(pw_file.stat().st_mode) == 0o600
        assert printed.count(password) == 1 and "generated now" in printed  # shown once, on first start

        token = requests.post(
            f"{base}/auth/token", json={"username": "admin", "password": password}, timeout=10
        ).json()["access_token"]
        h = {"Authorization": f"Bearer {token}"}
        for dag in DAGS:
            assert requests.get(f"{base}/api/v2/dags/{dag}", headers=h, timeout=10).json()["is_paused"] is False

        seen: set[str] = set()

        def epoch_ran() -> bool:
            seen.update(listening_sockets(ui.pid))
            got = requests.get(
                f"{base}/api/v2/dags/ctp_epoch_advance/dagRuns", headers=h, params={"run_type": "scheduled"}, timeout=10
            ).json()["dag_runs"]
            return any(r["state"] == "success" for r in got)

        def reconcile_finished() -> list[str]:
            seen.update(listening_sockets(ui.pid))  # sampled all along: Spark's ports come and go
            got = requests.get(f"{base}/api/v2/dags/ctp_reconcile/dagRuns", headers=h, timeout=10).json()["dag_runs"]
            return [r["state"] for r in got if r["state"] in ("success", "failed")]

        wait_for("a scheduled epoch run", epoch_ran, 240)
        assert ClusterEpoch(store).current() > c0
        # The epoch Asset starts the reconcile: spark-submit, whose driver, block manager
        # and Spark UI listen while it runs.
        assert "success" in wait_for("the reconcile the epoch started", reconcile_finished, 300)
        assert f"127.0.0.1:{port}" in seen, seen
        assert len(seen) > 1, f"no Spark listener was ever seen: {seen}"
        assert all(_loopback(a) for a in seen), seen
    finally:
        os.killpg(ui.pid, signal.SIGTERM)
        try:
            ui.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(ui.pid, signal.SIGKILL)
            ui.wait(10)
