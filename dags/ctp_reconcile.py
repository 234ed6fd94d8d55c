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
task log. With the GC's state pack, a partition nobody wrote to is not read at all
between its advances: the L0 objects' footers say which partitions have work (the log
line `reading N partitions; ... not read`; docs/design.md section 14).

Then **`publish`** appends every newly committed L1 file to its topic's Apache Iceberg
table (`<namespace>.<topic>`, exactly once: safe to retry, and beside another
publisher), so the records reconciled are queryable by Spark, DuckDB, polars or
pyiceberg. Catalog: Variable `ctp_catalog_uri` or `$CTP_CATALOG_URI` (a SQLAlchemy URL,
e.g. the compose PostgreSQL, or a REST catalog's `http(s)://` URI with its warehouse in
Variable `ctp_catalog_warehouse` and a token or OAuth2 client in the connection
`ctp_catalog`; SigV4 with the `ctp_s3` credentials by default); default a SQLite file
inside a `file://` store. Namespace: `$CTP_TABLE_NAMESPACE` (default `ctp`). The task's
return value lists, per table, the files and records added.

- **Params**: `topics` (empty = all), `target_file_mb`, `idle_lag` (default 6: an idle
  partition is advanced once every 6 epochs, so M trails C by up to 6 epochs where
  nobody writes; 2 keeps M closer at about 2.4x the requests, docs/design.md 14),
  `tick_together` (off: each idle partition is advanced at an epoch of its own, so a
  run advances about a sixth of them; on: all in one run every 6 epochs).
- **Updates** `ctp://reconcile/summary` (Spark), which schedules the GC DAG, and
  `ctp://tables` (publish).
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
from airflow.sdk import Param, dag, task
from ctp_common import (
    EPOCH_ASSET,
    RECONCILE_ASSET,
    SPARK_CONN_ID,
    TABLE_ASSET,
    CtpSparkSubmitOperator,
    default_args,
    open_store,
    repo_path,
    resolve,
    settings_params,
)

from ctp_state.settings import ReconcileSettings

#: The knobs the trigger form offers (the Spark app takes them all).
FORM = ["target_file_bytes", "max_bytes_per_partition", "idle_lag", "tick_together", "claim_wait_s"]

# A cron string in $CTP_RECONCILE_SCHEDULE replaces the Asset schedule.
SCHEDULE = os.environ.get("CTP_RECONCILE_SCHEDULE") or [EPOCH_ASSET]


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
    default_args=default_args(retries=2, retry_delay=timedelta(minutes=1), execution_timeout=timedelta(hours=2)),
)
def ctp_reconcile():
    spark = CtpSparkSubmitOperator(
        settings=ReconcileSettings,
        form=FORM,
        task_id="spark_reconcile",
        application=repo_path("spark_apps", "reconcile.py"),
        conn_id=SPARK_CONN_ID,
        name="ctp-reconcile",
        outlets=[RECONCILE_ASSET],
    )

    @task(outlets=[TABLE_ASSET])
    def publish(**context) -> list[dict]:
        """Append the newly committed L1 files to each topic's Iceberg table."""
        from ctp_state.table.jobs import publish_topics

        cfg = resolve()
        config = cfg.catalog()
        topics = context["params"].get("topics") or None
        done = publish_topics(open_store(cfg), config, home=os.path.expanduser("~"), topics=topics)
        return [p.as_dict() for p in done]

    spark >> publish()


ctp_reconcile()
