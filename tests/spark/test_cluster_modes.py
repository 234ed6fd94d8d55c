"""The reconciler beyond ``local[*]``, unchanged: on a standalone cluster (a master and
a worker, the shape docker-compose.yml runs) and through a Spark Connect server, both
on loopback. Each run must put every acknowledged record in L1 exactly once.

The services start once per module (a few seconds each) in sessions of their own and
are stopped, whole sessions, in teardown. Their environment is the one the compose
file gives the workers: this checkout importable and the S3 settings, so both
store backends run through both modes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from ctp_state.local_s3 import free_ports
from ctp_state.reconcile import run_reconcile
from ctp_state.spark import session as spark_driver
from tests.support import assert_exactly_once, produce_rounds, with_this_checkout
from tests.support.spark import APP, spark_submit

pytestmark = pytest.mark.slow

#: A JAVA_HOME with no java: a Connect client must not need a JVM (pyspark would fail
#: to start one if the app fell back to a classic session).
NO_JVM = {"JAVA_HOME": "/nonexistent/no-jvm-on-a-connect-client"}


def _bin(name: str) -> str:
    return shutil.which(name) or os.path.join(os.path.dirname(sys.executable), name)


def _session_pids(sid: int) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[3]) == sid:
                        pids.append(int(name))
            except (OSError, IndexError, ValueError):
                pass
    return pids


class Service:
    """A Spark JVM started in a session of its own (so its children, executors and
    Python workers, which sit in process groups of their own, are found again by
    session id), ready once ``port`` accepts connections."""

    def __init__(
        self, name: str, cmd: list[str], env: dict[str, str], port: int, work: Path, timeout: float = 120
    ) -> None:
        self.name, self.log_path = name, work / f"{name}.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                cmd, env=env, cwd=work, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"{name} did not start:\n{self.log_tail()}") from None
                time.sleep(0.2)

    def log_tail(self, n: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-n:]

    def stop(self) -> None:
        sid = self.proc.pid
        try:
            os.killpg(sid, signal.SIGTERM)  # the JVM's shutdown hooks stop its executors
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            pass
        for pid in _session_pids(sid):  # whatever is left of this service, and only that
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.wait(10)


def service_env(s3_server) -> dict[str, str]:
    """What the compose file gives Spark workers: the store's settings (here the suite's S3 server's),
    and ctp importable (here: this checkout)."""
    return with_this_checkout(
        {
            **os.environ,
            **s3_server.env,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_NO_DAEMONIZE": "true",
            "PYSPARK_PYTHON": sys.executable,
        }
    )


class Standalone:
    def __init__(self, url: str, work_dir: Path) -> None:
        self.url, self.work_dir = url, work_dir

    def apps(self) -> set[str]:
        """The applications the worker ran executors for."""
        return {p.name for p in self.work_dir.glob("app-*")}


@pytest.fixture(scope="module")
def standalone(s3_server, tmp_path_factory) -> Iterator[Standalone]:
    """A standalone master and one worker (2 cores, 2 GiB) on free loopback ports."""
    work = tmp_path_factory.mktemp("standalone")
    env = service_env(s3_server)
    port, ui = free_ports(2)
    master = Service(
        "master",
        [
            _bin("spark-class"),
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(ui),
        ],
        env,
        port,
        work,
    )
    try:
        wport = free_ports(1)[0]
        worker = Service(
            "worker",
            [
                _bin("spark-class"),
                "org.apache.spark.deploy.worker.Worker",
                f"spark://127.0.0.1:{port}",
                "--host",
                "127.0.0.1",
                "--port",
                str(wport),
                "--cores",
                "2",
                "--memory",
                "2g",
                "--webui-port",
                str(free_ports(1)[0]),
                "--work-dir",
                str(work / "work"),
            ],
            env,
            wport,
            work,
        )
        try:
            deadline = time.monotonic() + 60
            while True:  # the worker is listening; wait until the master counts it
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as r:
                    if json.load(r).get("aliveworkers", 0) >= 1:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the worker did not register:\n{worker.log_tail()}")
                time.sleep(0.3)
            yield Standalone(f"spark://127.0.0.1:{port}", work / "work")
        finally:
            worker.stop()
    finally:
        master.stop()


@pytest.fixture(scope="module")
def connect_server(s3_server, tmp_path_factory) -> Iterator[str]:
    """A Spark Connect server (``local[2]``) on a free loopback port; its Python workers
    import this checkout and see the S3 server."""
    work = tmp_path_factory.mktemp("connect")
    port = free_ports(1)[0]
    server = Service(
        "connect",
        [
            _bin("spark-submit"),
            "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--master",
            "local[2]",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf",
            f"spark.connect.grpc.binding.port={port}",
            "spark-internal",
        ],
        service_env(s3_server),
        port,
        work,
    )
    try:
        yield f"sc://127.0.0.1:{port}"
    finally:
        server.stop()


def check_summary(stdout: str, sent: dict) -> dict:
    summary = json.loads(stdout)
    assert summary["ok"] and summary["partitions_reconciled"] == len(sent)
    assert summary["records"] == sum(len(r) for r in sent.values()) and summary["lag_entries_left"] == 0
    assert summary["l1_files"] > len(sent)  # several files per partition: several tasks' worth
    return summary


# --- the build job's pieces, on the session's local Spark ----------------------------------------


def test_slot_keys_put_each_slot_in_a_partition_of_its_own(spark):
    from pyspark.sql import functions as F

    ids = spark.range(0, 64).select(F.hash(F.col("id").cast("int")).alias("h"), "id").collect()
    assert [r.h for r in ids] == [spark_driver._murmur3_int(r.id) for r in ids]  # Spark's hash(), reimplemented
    for n in (1, 3, 4, 16, 64):
        keys = spark_driver.slot_keys(n)
        df = spark.createDataFrame([(k,) for k in keys], "slot int").repartition(n, "slot")
        got = sorted((r.p, r.slot) for r in df.select(F.spark_partition_id().alias("p"), "slot").collect())
        assert got == list(enumerate(keys))


def test_default_parallelism_on_a_classic_session(spark):
    assert not spark_driver.is_connect(spark)
    assert spark_driver.default_parallelism(spark) == spark.sparkContext.defaultParallelism == 2
    assert spark_driver.warm_workers(spark) >= 1


def test_the_python_workers_keep_freed_memory(spark):
    """The reconciler's Python workers run with malloc keeping freed buffers (fresh
    workers otherwise page-fault every L0 chunk they read: 3x the raw read time), in
    local mode through the inherited environment and on a cluster through executorEnv."""

    def env(batches):
        import os

        import pyarrow as pa

        for _ in batches:
            pass
        names = sorted(spark_driver.MALLOC_ENV)
        yield pa.RecordBatch.from_pydict({"name": names, "value": [os.environ.get(n) for n in names]})

    got = {
        r.name: r.value
        for r in spark.range(0, 2, 1, numPartitions=2).mapInArrow(env, "name string, value string").collect()
    }
    assert got == {n: os.environ[n] for n in spark_driver.MALLOC_ENV} and all(got.values())
    assert {n: spark.conf.get(f"spark.executorEnv.{n}") for n in spark_driver.MALLOC_ENV} == got


def test_the_rows_path_for_big_plans_lifts_everything_exactly_once(spark, store):
    sent = produce_rounds(store, partitions=3, rounds=2, per=30)
    from ctp_state.settings import ReconcileSettings

    summary = run_reconcile(
        store,
        config=ReconcileSettings(target_file_bytes=1500),
        map_files=spark_driver.spark_map_files(spark, store.url, "zstd", inline_plan_mb=0),
    )
    assert summary.ok and summary.records == 180 and summary.l1_files > 3
    assert_exactly_once(store, "t", sent)


# --- a standalone cluster: spark-submit --master spark://... --------------------------------------


def test_standalone_cluster_reconciles_exactly_once(standalone, store, subprocess_env):
    sent = produce_rounds(store, partitions=3, rounds=2, per=40)
    before = standalone.apps()
    r = spark_submit(
        {**subprocess_env, "SPARK_LOCAL_IP": "127.0.0.1"}, "--target-file-mb", "0.002", master=standalone.url
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    check_summary(r.stdout, sent)
    assert_exactly_once(store, "t", sent)
    assert len(standalone.apps() - before) == 1  # the files were built in the worker's executor


# --- a Spark Connect server: python reconcile.py --remote sc://... --------------------------------


def connect_client(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``python spark_apps/reconcile.py ...`` as a Connect client (no JVM)."""
    return subprocess.run(
        [sys.executable, APP, *args],
        env=with_this_checkout({**env, **NO_JVM}),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize("plan", ["inline", "rows"])
def test_connect_server_reconciles_exactly_once(connect_server, store, subprocess_env, plan):
    sent = produce_rounds(store, partitions=3, rounds=2, per=40)
    env = {**subprocess_env, "CTP_SPARK_INLINE_PLAN_MB": "4" if plan == "inline" else "0"}
    r = connect_client(env, "--remote", connect_server, "--target-file-mb", "0.002")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    check_summary(r.stdout, sent)
    assert_exactly_once(store, "t", sent)
    if plan == "inline":  # a rerun through Connect finds nothing left to do
        again = connect_client(env, "--remote", connect_server)
        assert again.returncode == 0 and json.loads(again.stdout)["records"] == 0, again.stderr[-3000:]


def test_connect_session_sizes_and_warms_without_a_spark_context(connect_server):
    code = (
        "import json, os, sys; from ctp_state.spark.session import *; "
        f"s = spark_session(os.environ, remote={connect_server!r}); "
        "print(json.dumps([is_connect(s), default_parallelism(s), warm_workers(s)])); s.stop()"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        env=with_this_checkout({**os.environ, **NO_JVM}),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    connected, parallelism, workers = json.loads(r.stdout.strip().splitlines()[-1])
    assert connected and parallelism == 2 and workers >= 1  # local[2] on the server


def test_remote_and_master_together_are_refused():
    with pytest.raises(ValueError, match="not both"):
        spark_driver.spark_session(os.environ, "local[2]", remote="sc://127.0.0.1:1")


def test_ctp_reconcile_runs_through_a_connect_server(connect_server, store, subprocess_env):
    """The CLI's --remote: the same build job, no local JVM."""
    from tests.support import ctp

    sent = produce_rounds(store, partitions=2, rounds=2, per=30)
    env = {**subprocess_env, **NO_JVM, "CTP_STORE": store.url}
    r = ctp(env, "reconcile", "--remote", connect_server, "--target-file-mb", "0.002", "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    summary = json.loads(r.stdout)
    assert summary["ok"] and summary["records"] == 120 and summary["partitions_reconciled"] == 2
    assert_exactly_once(store, "t", sent)
