"""Shared fixtures: a real moto S3 server over HTTP, and stores on both backends."""

from __future__ import annotations

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

from ctp_state.storage import ObjectStore, S3Settings, open_store
from tests.s3_fault_proxy import S3FaultProxy

# py4j logs "Closing down clientserver connection" from __del__ at interpreter exit, after
# pytest closed the streams a test's logging setup (Airflow's) pointed handlers at.
logging.getLogger("py4j").setLevel(logging.WARNING)

settings.register_profile("ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer:
    """moto's S3 server (with atomic conditional writes, see tests/s3_server.py) as a
    separate process on 127.0.0.1, reached over HTTP."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        # moto's app behind a lock for writes: conditional PUTs are atomic, as on S3.
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.s3_server", "-H", "127.0.0.1", "-p", str(self.port)],
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
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

    def new_bucket(self) -> str:
        name = "ctp-" + uuid.uuid4().hex[:20]
        S3Settings.from_env(self.env).client().create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="session")
def moto() -> Iterator[MotoServer]:
    """The S3 server, its endpoint and credentials exported to this process's
    environment, as they would be on a worker (Spark workers inherit them)."""
    server = MotoServer()
    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    yield server
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    server.stop()


@pytest.fixture(params=["file", "s3"])
def store_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[tuple[str, dict[str, str]]]:
    """``(url, env)`` for a fresh, empty store on each backend."""
    if request.param == "file":
        yield f"file://{tmp_path}/store", {}
    else:
        moto: MotoServer = request.getfixturevalue("moto")
        yield f"s3://{moto.new_bucket()}/ctp-test", moto.env


@pytest.fixture
def store(store_url) -> ObjectStore:
    url, env = store_url
    return open_store(url, env)


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOOKS = os.path.join(REPO, "tests", "hooks")


def with_this_checkout(env: dict[str, str]) -> dict[str, str]:
    """``env`` with this checkout first on ``PYTHONPATH``: child processes (the ``ctp``
    script, helper scripts) import the code under test even when the venv's editable
    install points at another checkout (the editable finder only answers what
    ``sys.path`` does not). ``tests/hooks`` comes next: its ``sitecustomize`` installs
    the crash points ``CTP_FAULT`` arms (:mod:`ctp_state.crashpoints`)."""
    path = [REPO, HOOKS] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in (REPO, HOOKS)]
    return {**env, "PYTHONPATH": os.pathsep.join(path)}


@pytest.fixture
def subprocess_env(store_url) -> dict[str, str]:
    """Environment for child processes that open the same store."""
    url, env = store_url
    return with_this_checkout({**os.environ, **env, "CTP_STORE": url})


@pytest.fixture
def fault_proxy(moto: MotoServer) -> Iterator[S3FaultProxy]:
    """A fault-injecting proxy in front of the session's moto server, fresh per test
    (no rules, zeroed counters)."""
    with S3FaultProxy(moto.endpoint) as proxy:
        yield proxy


@pytest.fixture
def fault_env(moto: MotoServer, fault_proxy: S3FaultProxy) -> dict[str, str]:
    """``moto.env`` with ``CTP_S3_ENDPOINT_URL`` pointing at ``fault_proxy``."""
    return proxy_env(moto, fault_proxy)


def proxy_env(moto: MotoServer, proxy: S3FaultProxy, **extra: str) -> dict[str, str]:
    """A copy of ``moto.env`` that reaches S3 through ``proxy``, plus ``extra``."""
    return {**moto.env, "CTP_S3_ENDPOINT_URL": proxy.endpoint, **extra}
