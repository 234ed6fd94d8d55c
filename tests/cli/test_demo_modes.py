"""The README's demo modes, one after another in one checkout (round-four review,
defect 5). Before the fix, ``scripts/demo.sh`` then ``scripts/demo.sh --s3`` failed:
the S3 run's GC DAG found the report directory of the file store ("report directory
.ctp-demo/report belongs to store file://..., not s3://ctp/demo/"). Each store now keeps
its own report directory, Airflow home and catalog under ``.ctp-demo/``.

The checkout is a copy of this one's files in a temporary directory (``.ctp-demo/`` is
the checkout's), run with this checkout's virtualenv (``CTP_VENV``), as a user runs it
but for the install step (the suite's own run of it installed that virtualenv).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from tests.support import REPO

SMALL = ("--rounds", "1", "--records", "600", "--partitions", "2", "--json")


@pytest.fixture
def checkout(tmp_path) -> str:
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    root = tmp_path / "ctp"
    for f in filter(None, (x.decode() for x in files)):
        src = os.path.join(REPO, f)
        if os.path.isfile(src):
            os.makedirs(os.path.dirname(root / f), exist_ok=True)
            shutil.copy2(src, root / f)
    # The copy runs on this checkout's virtualenv (CTP_VENV), which is installed from
    # this checkout: its own install step must not re-point the virtualenv at the copy.
    (root / "scripts" / "bootstrap.sh").write_text("#!/usr/bin/env bash\nexit 0\n")
    return str(root)


def demo(checkout: str, *args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CTP_", "AIRFLOW", "AWS_"))}
    env["CTP_VENV"] = os.path.join(REPO, ".venv")
    env["HOME"] = os.path.join(checkout, "home")
    r = subprocess.run(
        [os.path.join(checkout, "scripts", "demo.sh"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, (args, r.stderr[-3000:])
    try:
        return json.loads(r.stdout)  # ctp demo --json: one document
    except json.JSONDecodeError:
        return json.loads(r.stdout.strip().splitlines()[-1])  # run_dags.py --json: its last line


@pytest.mark.slow
def test_every_demo_mode_runs_after_every_other_in_one_checkout(checkout):
    """The CLI demo on the file store, the Airflow demo on S3 after it, and the file
    store's again: each mode after the other store's. (The Airflow demo on the file
    store is ``tests/dags/test_dags_e2e.py``; both modes of one store share everything
    they keep, so one Airflow run and the CLI around it show the order.)"""
    if not os.path.exists(os.path.join(REPO, ".venv", "bin", "python")):
        pytest.fail("the suite runs from scripts/test.sh, which installs .venv in the checkout")
    cli = demo(checkout, "--cli", "--rounds", "2", "--records", "300", "--partitions", "2", "--json")
    on_s3 = demo(checkout, "--s3", *SMALL)  # Airflow, SeaweedFS (and its REST catalog)
    again = demo(checkout, "--cli", "--rounds", "1", "--records", "400", "--partitions", "2", "--json")
    assert on_s3["gc_status"] == "ok" and on_s3["records_read_back"] == on_s3["records_produced"], on_s3
    assert on_s3["records_in_table"] == on_s3["records_produced"]  # published to the REST catalog
    for out in (cli, again):
        assert out["gc"]["status"] == "ok" and out["lag_records"] == 0, out
        assert out["reconcile"]["ok"], out
    assert cli["records_produced"] == cli["reconcile"]["records"] == 600 and cli["stale_write_rejected"]
    assert again["reconcile"]["records"] == 400  # run again, it adds data and reconciles it all
    assert cli["gc"]["m"] >= 1 and cli["gc"]["deleted"] >= 1  # the round's L0 at or below M
    reports = {cli["gc"]["report"], on_s3["report"], again["gc"]["report"]}
    assert len(reports) == 2, reports  # one per store, whichever mode wrote it
    assert all(r.startswith(os.path.join(checkout, ".ctp-demo")) and os.path.exists(r) for r in reports), reports
