"""The three DAGs end to end with ``dag.test()`` over really produced data, on both
store backends: the README's main command (``scripts/run_dags.py``), as a new user
runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support import REPO
from tests.support.airflow import use_postgres


def test_the_three_dags_run_end_to_end(airflow_env, store, tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "scripts", "run_dags.py"),
            "--rounds",
            "3",
            "--records",
            "3000",
            "--partitions",
            "4",
            "--json",
        ],
        env=airflow_env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    log = os.path.join(airflow_env["AIRFLOW_HOME"], "dag-runs.log")
    assert r.returncode == 0, r.stderr[-3000:] + (open(log).read()[-5000:] if os.path.exists(log) else "")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["metadata_db"] == ("postgresql+psycopg" if use_postgres() else "sqlite")
    assert [d["dag_id"] for d in out["dag_runs"]] == ["ctp_epoch_advance"] * 3 + ["ctp_reconcile", "ctp_gc", "ctp_gc"]
    assert all(d["state"] == "success" for d in out["dag_runs"])
    assert out["epoch_after"] == out["epoch_before"] + 3
    assert out["records_produced"] == out["records_reconciled"] == out["records_read_back"] == 9000
    assert out["records_in_table"] == 9000  # the publish task after Spark
    # One L0 object per round, at epochs 1, 2 and 3; reconciled at C = 4: each partition's
    # window spans epochs 2 and 3 after its last write, so M >= 1 (its idle advance, R6, is
    # due only `idle_lag` epochs on: 6 by default) and the GC deleted exactly the rounds'
    # objects at or below M, after a dry run that said so.
    assert 1 <= out["m"] < out["epoch_after"]
    assert out["would_delete_dry_run"] == out["l0_objects_deleted"] == min(out["m"], 3)
    assert out["gc_status"] == "ok"
    assert os.path.exists(out["report"]) and out["report"].startswith(str(tmp_path))
    task_logs = open(log).read()
    # Everything the run left behind: what it printed, the task logs (spark-submit's
    # command line and conf included), every XCom, the report and its Data Docs.
    import sqlalchemy

    engine = sqlalchemy.create_engine(airflow_env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    with engine.connect() as db:
        xcoms = [str(v) for (v,) in db.execute(sqlalchemy.text("SELECT value FROM xcom"))]
    engine.dispose()
    assert xcoms  # the DAGs hand results through XCom: there is something to look at
    report_dir = os.path.dirname(out["report"])
    report = "".join(open(os.path.join(d, f), errors="replace").read() for d, _, fs in os.walk(report_dir) for f in fs)
    for secret in [v for k, v in os.environ.items() if k == "AWS_SECRET_ACCESS_KEY"] or ["testing-secret-do-not-log"]:
        for where, text in (("output", r.stdout + r.stderr), ("task logs", task_logs), ("report", report)):
            assert secret not in text, where  # the S3 secret never shows
        assert not any(secret in x for x in xcoms), "xcom"
    assert "spark-submit" in task_logs  # the reconcile DAG really went through spark-submit
