"""The README's first command runs `ctp demo`: it must work end to end."""

from __future__ import annotations

import json
import os

from tests.core.test_cli import ok


def test_demo_runs_end_to_end(tmp_path):
    env = {**os.environ, "CTP_STORE": f"file://{tmp_path}/store"}
    summary = json.loads(ok(env, "demo", "--rounds", "2", "--records", "3000", "--partitions", "4", "--json"))
    assert summary["records_produced"] == 6000 and summary["stale_write_rejected"]
    assert summary["reconcile"]["ok"] and summary["reconcile"]["records"] == 6000
    assert summary["lag_records"] == 0
    assert summary["m_if_gc_ran_now"] >= 1  # the reconcile moved M off its initial 0
    # running it again adds data and still reconciles everything
    again = json.loads(ok(env, "demo", "--rounds", "1", "--records", "1000", "--partitions", "4", "--json"))
    assert again["reconcile"]["records"] == 1000 and again["lag_records"] == 0
