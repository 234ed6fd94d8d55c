"""Spark fixtures: one local SparkSession for the session, and a spark-submit runner."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.conftest import with_this_checkout

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
APP = os.path.join(REPO, "spark_apps", "reconcile.py")


@pytest.fixture(scope="session")
def spark(s3_server) -> Iterator[object]:
    """Started after the S3 server so its workers inherit the S3 settings."""
    from ctp_state.spark.session import spark_session

    s = spark_session(os.environ, "local[2]", app_name="ctp-tests")
    yield s
    s.stop()


def spark_submit(
    env: dict[str, str], *args: str, timeout: float = 300, master: str = "local[2]"
) -> subprocess.CompletedProcess:
    """Run the reconciler with spark-submit in its own session (so a crash injected with
    CTP_FAULT kills the whole application, JVM and Python workers alike)."""
    exe = shutil.which("spark-submit") or os.path.join(os.path.dirname(sys.executable), "spark-submit")
    proc = subprocess.Popen(
        [exe, "--master", master, "--conf", "spark.ui.enabled=false", APP, *args],
        env=with_this_checkout(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
