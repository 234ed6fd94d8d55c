"""Running the Spark reconciler as Airflow does: ``spark-submit`` of
``spark_apps/reconcile.py`` in a session of its own (tests/spark, tests/cli)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

from tests.support import REPO, with_this_checkout

APP = os.path.join(REPO, "spark_apps", "reconcile.py")
COMPACT_APP = os.path.join(REPO, "spark_apps", "compact.py")


def spark_submit(
    env: dict[str, str], *args: str, timeout: float = 300, master: str = "local[2]", app: str = APP
) -> subprocess.CompletedProcess:
    """Run the reconciler (or ``app``) with spark-submit in its own session (so a crash
    injected with CTP_FAULT kills the whole application, JVM and Python workers alike)."""
    exe = shutil.which("spark-submit") or os.path.join(os.path.dirname(sys.executable), "spark-submit")
    proc = subprocess.Popen(
        [exe, "--master", master, "--conf", "spark.ui.enabled=false", app, *args],
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
