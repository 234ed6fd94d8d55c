"""The README's first command runs `ctp demo`: it must work end to end."""

from __future__ import annotations

import json
import os

from tests.support import ok


def test_demo_runs_end_to_end(tmp_path):
    env = {**os.environ, "CTP_STORE": f"file://{tmp_path}/store", "CTP_REPORT_DIR": str(tmp_path / "report")}
    summary = json.loads(ok(env, "demo", "--rounds", "2", "--records", "3000", "--partitions", "4", "--json"))
    assert summary["records_produced"] == 6000 and summary["stale_write_rejected"]
    assert summary["reconcile"]["ok"] and summary["reconcile"]["records"] == 6000
    assert summary["lag_records"] == 0
    assert summary["m_if_gc_ran_now"] >= 1  # the reconcile moved M off its initial 0
    gc = summary["gc"]
    assert gc["status"] == "ok" and gc["m"] >= 1 and gc["deleted"] >= 1  # the rounds' L0 at or below M
    assert os.path.exists(gc["report"]) and gc["report"].startswith(str(tmp_path))
    # running it again adds data and still reconciles everything
    again = json.loads(ok(env, "demo", "--rounds", "1", "--records", "1000", "--partitions", "4", "--json"))
    assert again["reconcile"]["records"] == 1000 and again["lag_records"] == 0
