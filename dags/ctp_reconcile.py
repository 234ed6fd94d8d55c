"""
### ctp: reconcile L0 into L1 (Spark)

Submits `spark_apps/reconcile.py` with `spark-submit` through the Airflow connection
**`spark_default`** (`local[*]` by default; point its host at `spark://master:7077`
or `yarn` for a cluster). Runs whenever the epoch DAG advances the cluster epoch
(the `ctp://cluster/epoch` Asset), or from the trigger form.

What a run does: claims (exclusively) every partition with unreconciled placeholders,
lifts their L0 chunks into per-partition L1 Parquet files, commits the new
`min_epoch_lower_bound` to each partition's state log, advances idle partitions (R6),
and writes a run summary to `runs/reconcile/` in the store. The summary JSON is in the
task log.

- **Params**: `topics` (empty = all), `target_file_mb`, `idle_lag`.
- **Updates** `ctp://reconcile/summary`, which schedules the GC DAG.
- **Overlap**: `max_active_runs=1`; a second reconciler (another deployment, a CLI run)
  is still safe: claims fence it.
- **If it fails**: the log ends with the run summary and a one-line cause. A
  *quarantined* partition names the corrupt L0 key; the others were committed, and
  the GC's report shows the quarantine holding M back. A killed run is safe to rerun:
  its claims expire after the lease (15 min) and its uncommitted files are orphans the
  GC collects.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Param, dag
from ctp_common import EPOCH_ASSET, OWNER, RECONCILE_ASSET, SPARK_CONN_ID, repo_path, resolve, settings_params

from ctp_state.settings import ReconcileSettings, from_options, to_args

#: The knobs the trigger form offers (the Spark app takes them all).
FORM = ["target_file_bytes", "max_bytes_per_partition", "idle_lag", "claim_wait_s"]

# A cron string in $CTP_RECONCILE_SCHEDULE replaces the Asset schedule.
SCHEDULE = os.environ.get("CTP_RECONCILE_SCHEDULE") or [EPOCH_ASSET]


class CtpSparkSubmitOperator(SparkSubmitOperator):
    """spark-submit with the store and its S3 settings resolved when the task runs
    (never at parse time), passed as arguments and environment, not through XCom."""

    def execute(self, context):
        cfg = resolve()
        p = context["params"]
        args = ["--store", cfg.store, *to_args(from_options(ReconcileSettings, p), FORM)]
        for t in p.get("topics") or []:
            args += ["--topic", t]
        self.application_args = args
        self.env_vars = {**(self.env_vars or {}), **cfg.env}
        return super().execute(context)


@dag(
    dag_id="ctp_reconcile",
    schedule=SCHEDULE,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["ctp", "reconcile", "spark"],
    doc_md=__doc__,
    params={
        "topics": Param([], type="array", items={"type": "string"}, description="Only these topics; empty for all."),
        **settings_params(ReconcileSettings, FORM),
    },
    default_args={
        "owner": OWNER,
        "retries": 2,
        "retry_delay": timedelta(minutes=1),
        "execution_timeout": timedelta(hours=2),
    },
)
def ctp_reconcile():
    CtpSparkSubmitOperator(
        task_id="spark_reconcile",
        application=repo_path("spark_apps", "reconcile.py"),
        conn_id=SPARK_CONN_ID,
        name="ctp-reconcile",
        outlets=[RECONCILE_ASSET],
    )


ctp_reconcile()
