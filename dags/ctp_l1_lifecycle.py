"""
### ctp: the L1 lifecycle — retention, compaction, the table (Spark)

Keeps each topic's L1 output fast to read and bounded as it ages. Runs on its own
schedule (hourly by default; a cron string in `$CTP_L1_LIFECYCLE_SCHEDULE` replaces it),
not after every reconcile: a partition needs a compaction only once small files have
piled up (more than `max_small_files`), and checking that costs a state read of every
partition; once an hour keeps tables within a few files a partition at the default
5-minute epoch, at a twelfth of the reads.

1. **`retention`** applies each topic's retention (`ctp topic create --retention-*`,
   `ctp topic alter`): the oldest L1 files whose newest record is older than
   retention.ms, or that keep a partition over retention.bytes, leave the committed set
   (whole files, Kafka's meaning; never data not yet in L1). Topics without retention
   cost nothing.
2. **`spark_compact`** submits `spark_apps/compact.py` through the connection
   **`spark_default`** (as the reconcile DAG): each partition with more than
   `max_small_files` files under the target size has adjacent runs merged into files of
   up to `target_file_mb`; each merged file is checked row for row against the files it
   replaces and committed through the partition's state log under an exclusive claim.
3. **`publish`** makes each topic's Iceberg table follow (one snapshot per topic: the
   replaced and dropped files out, the compacted files in).

Nothing is deleted here: the GC DAG deletes the files that left the committed set, behind
its gate, once the change is older than its `l1_reader_grace_seconds` and no retained
table snapshot names them.

- **Params**: `topics` (empty = all), `max_small_files`, `target_file_mb`.
- **Updates** `ctp://tables` (publish).
- **Overlap**: `max_active_runs=1`; a reconcile, another compactor or a CLI run is safe
  beside it: each takes an exclusive claim per partition, and a fenced writer never
  commits.
- **If it fails**: the Spark task's log ends with the run summary (per partition:
  compacted, claim_held, fenced, error and why). A killed run is safe to rerun: its
  claims lapse after the lease (15 min), and a file it wrote but never committed is an
  orphan the GC collects.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pendulum
from airflow.sdk import Param, dag, task
from ctp_common import (
    SPARK_CONN_ID,
    TABLE_ASSET,
    CtpSparkSubmitOperator,
    default_args,
    open_store,
    repo_path,
    resolve,
    settings_params,
)

from ctp_state.settings import CompactSettings

#: The knobs the trigger form offers (the Spark app takes them all).
FORM = ["max_small_files", "target_file_bytes"]

SCHEDULE = os.environ.get("CTP_L1_LIFECYCLE_SCHEDULE") or "@hourly"


@dag(
    dag_id="ctp_l1_lifecycle",
    schedule=SCHEDULE,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["ctp", "l1", "spark"],
    doc_md=__doc__,
    params={
        "topics": Param([], type="array", items={"type": "string"}, description="Only these topics; empty for all."),
        **settings_params(CompactSettings, FORM),
    },
    default_args=default_args(retries=2, retry_delay=timedelta(minutes=1), execution_timeout=timedelta(hours=2)),
)
def ctp_l1_lifecycle():
    @task
    def retention(**context) -> dict:
        """Apply each topic's retention: start offsets move through the logs."""
        from ctp_state.retention import run_retention

        topics = context["params"].get("topics") or None
        summary = run_retention(open_store(resolve()), topics=topics)
        if summary.failed:
            first = summary.failed[0]
            raise RuntimeError(
                f"{len(summary.failed)} partition(s) not trimmed; first {first.topic}/{first.partition}: "
                f"{first.status}: {first.reason}"
            )
        return summary.as_dict()

    spark = CtpSparkSubmitOperator(
        settings=CompactSettings,
        form=FORM,
        task_id="spark_compact",
        application=repo_path("spark_apps", "compact.py"),
        conn_id=SPARK_CONN_ID,
        name="ctp-compact",
    )

    @task(outlets=[TABLE_ASSET])
    def publish(**context) -> list[dict]:
        """Each topic's Iceberg table follows: replaced and dropped files out, compacted in."""
        from ctp_state.table.jobs import publish_topics

        cfg = resolve()
        topics = context["params"].get("topics") or None
        done = publish_topics(open_store(cfg), cfg.catalog(), home=os.path.expanduser("~"), topics=topics)
        return [p.as_dict() for p in done]

    retention() >> spark >> publish()


ctp_l1_lifecycle()
