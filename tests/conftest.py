"""The suite's fixtures, for every folder: a real S3 server (SeaweedFS) over HTTP, moto's
emulator for the store contract, stores on both backends (local filesystem and S3), the
S3 fault proxy, the GC's real gate, one SparkSession, and the Iceberg catalogs. (The
Airflow fixtures only tests/dags uses are in tests/dags/conftest.py; helpers are in
:mod:`tests.support`.)"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from ctp_state.local_s3 import LocalS3, free_ports
from ctp_state.storage import ObjectStore, S3Settings, open_store
from ctp_state.table.catalog import CatalogConfig
from tests.support import proxy_env, with_this_checkout
from tests.support.s3_fault_proxy import S3FaultProxy

# py4j logs "Closing down clientserver connection" from __del__ at interpreter exit, after
# pytest closed the streams a test's logging setup (Airflow's) pointed handlers at.
logging.getLogger("py4j").setLevel(logging.WARNING)

# Every JVM the suite starts (the session's SparkSession, each spark-submit a test or a DAG
# runs, a standalone master and worker) lives for seconds on a few thousand rows: the JIT's
# second tier compiles code that never runs long enough to pay for it. C1 only and the
# serial collector: a small local Spark job's CPU 35 s -> 19 s, two Spark test files on 3
# workers 209 -> 130 CPU seconds (docs/testing.md). Spark is as real as before; an
# operator's own setting wins.
JVM_TEST_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
for _var in ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS"):
    os.environ.setdefault(_var, JVM_TEST_OPTS)

settings.register_profile("ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


class MotoServer:
    """moto's S3 server (``moto_server``) as a separate process on 127.0.0.1, reached over
    HTTP: the emulator, kept beside the real server for the store contract (so a
    difference between S3 implementations is a failing test) and for what only an
    emulator gives. Its conditional writes are not atomic under its threaded server:
    nothing races on it."""

    def __init__(self) -> None:
        self.port = free_ports(1)[0]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError("moto_server exited at start") from None
                time.sleep(0.1)
        raise RuntimeError("moto_server did not start within 30 s")

    @property
    def env(self) -> dict[str, str]:
        return {
            "CTP_S3_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing-key-id",
            "AWS_SECRET_ACCESS_KEY": "testing-secret-do-not-log",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def url(self, name: str = "ctp") -> str:
        bucket = "ctp-" + uuid.uuid4().hex[:20]
        S3Settings.from_env(self.env).client().create_bucket(Bucket=bucket)
        return f"s3://{bucket}/{name}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@contextlib.contextmanager
def exported(env: dict[str, str]) -> Iterator[None]:
    """``env`` in this process's environment while the block runs, as it would be on a
    worker (Spark workers and child processes inherit it)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalS3]:
    """The suite's S3 server: SeaweedFS (a real S3 implementation, atomic conditional
    writes, SigV4 enforced) on loopback with generated credentials, one per test
    process, with its Iceberg REST catalog (table bucket ``warehouse``); its S3 settings
    exported to this process's environment."""
    with LocalS3(tmp_path_factory.mktemp("seaweedfs"), catalog=True) as server, exported(server.env):
        yield server


@pytest.fixture(scope="session")
def moto() -> Iterator[MotoServer]:
    """moto's S3 server: only for the store contract and what only an emulator gives."""
    server = MotoServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["every", "quiet"])
def both_read_paths(request, monkeypatch) -> str:
    """Run the module's scenarios on both of the reconciler's read paths: every
    partition read (a topic smaller than ``quiet_min``, as these tests' are), and the
    quiet path (``quiet_min`` 1: a partition nothing names is not read, or ticked from
    the GC's pack; docs/design.md 14). Applies to ``tests.support.reconcile`` without a
    ``config`` (the scenarios' settings, ``LAG2``)."""
    if request.param == "quiet":
        import dataclasses

        from tests import support

        monkeypatch.setitem(support.SCENARIO, "config", dataclasses.replace(support.LAG2, quiet_min=1))
    return str(request.param)


@pytest.fixture(params=["file", "s3"])
def store_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[tuple[str, dict[str, str]]]:
    """``(url, env)`` for a fresh, empty store on each backend."""
    if request.param == "file":
        yield f"file://{tmp_path}/store", {}
    else:
        server: LocalS3 = request.getfixturevalue("s3_server")
        yield server.url("ctp-test"), server.env


@pytest.fixture
def store(store_url) -> ObjectStore:
    url, env = store_url
    return open_store(url, env)


@pytest.fixture
def fstore(tmp_path) -> ObjectStore:
    """A file store only: for scenarios with hundreds of appends."""
    return open_store(f"file://{tmp_path}/store", {})


@pytest.fixture
def subprocess_env(store_url) -> dict[str, str]:
    """Environment for child processes that open the same store."""
    url, env = store_url
    return with_this_checkout({**os.environ, **env, "CTP_STORE": url})


@pytest.fixture
def fault_proxy(s3_server: LocalS3) -> Iterator[S3FaultProxy]:
    """A fault-injecting proxy in front of the session's S3 server, fresh per test
    (no rules, zeroed counters)."""
    with S3FaultProxy.for_server(s3_server) as proxy:
        yield proxy


@pytest.fixture
def fault_env(s3_server: LocalS3, fault_proxy: S3FaultProxy) -> dict[str, str]:
    """``s3_server.env`` with ``CTP_S3_ENDPOINT_URL`` pointing at ``fault_proxy``."""
    return proxy_env(s3_server, fault_proxy)


# --- the GC's gate -------------------------------------------------------------------------


@pytest.fixture
def gate(tmp_path):
    """The real Great Expectations gate, its project and Data Docs in the test's own
    report directory."""
    from expectations.gate import GxGate

    return GxGate(str(tmp_path / "report"))


# --- Spark ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def spark(s3_server) -> Iterator[object]:
    """One local SparkSession for the session. Started after the S3 server so its
    workers inherit the S3 settings."""
    from ctp_state.spark.session import spark_session

    s = spark_session(os.environ, "local[2]", app_name="ctp-tests")
    yield s
    s.stop()


# --- Iceberg catalogs (tests/table, tests/gate) ---


@pytest.fixture
def config(tmp_path) -> CatalogConfig:
    return CatalogConfig(uri=f"sqlite:///{tmp_path}/catalog.db", namespace="ctp")


@pytest.fixture(params=["sqlite", "postgresql", "rest"])
def catalogs(request, tmp_path) -> Iterator[CatalogConfig]:
    """Every kind of catalog: a SQLite file, a database of its own on the machine's
    PostgreSQL (127.0.0.1:5432, as in CI), and SeaweedFS's Iceberg REST catalog (a
    namespace of its own; SigV4 with the S3 server's credentials)."""
    if request.param == "rest":
        server: LocalS3 = request.getfixturevalue("s3_server")
        yield rest_catalog(server)
        return
    yield from sql_catalog(request.param, tmp_path)


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_catalogs(request, tmp_path) -> Iterator[CatalogConfig]:
    """Both SQL catalogs (for what is about ctp's own SQL catalog class)."""
    yield from sql_catalog(request.param, tmp_path)


def rest_catalog(server: LocalS3) -> CatalogConfig:
    """The REST catalog of ``server``, under a namespace no other test uses."""
    env = {**server.env, **server.catalog_env, "CTP_TABLE_NAMESPACE": f"t{uuid.uuid4().hex[:12]}"}
    return CatalogConfig.from_env(env)


def sql_catalog(kind: str, tmp_path) -> Iterator[CatalogConfig]:
    if kind == "sqlite":
        yield CatalogConfig(uri=f"sqlite:///{tmp_path}/catalog.db", namespace="ctp")
        return
    import psycopg

    name = f"ctp_cat_{uuid.uuid4().hex[:12]}"
    admin = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    try:
        yield CatalogConfig(uri=f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}", namespace="ctp")
    finally:
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
