"""Airflow for the DAG tests (tests/dags): where its commands are, the metadata database
to use, running ``airflow`` with a test's environment, and a free loopback port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

BIN = os.path.dirname(sys.executable)
PG = "postgresql+psycopg://postgres@127.0.0.1:5432/"


def use_postgres() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true") or os.environ.get("CTP_TEST_POSTGRES") == "1"


def airflow(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [os.path.join(BIN, "airflow"), *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
