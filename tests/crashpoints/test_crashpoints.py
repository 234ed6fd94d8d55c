"""Crash points: marked by the product, armed only by the test hooks."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support import REPO, with_this_checkout

PROBE = "from ctp_state import crashpoints; crashpoints.reached('after_claim', 1); print('alive')"


def _run(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60, start_new_session=True
    )


def test_ctp_fault_does_nothing_in_the_product_alone():
    env = {**os.environ, "PYTHONPATH": REPO, "CTP_FAULT": "after_claim:1"}
    p = _run(env)
    assert p.returncode == 0 and p.stdout.strip() == "alive", p.stderr


def test_the_test_hooks_kill_the_session_at_the_armed_point_and_index():
    env = with_this_checkout({**os.environ, "CTP_FAULT": "after_claim:1"})
    assert _run(env).returncode == -9
    other = with_this_checkout({**os.environ, "CTP_FAULT": "after_claim:0,before_commit:1"})
    assert _run(other).stdout.strip() == "alive"
