"""A local SparkSession for ``ctp reconcile`` and ``ctp demo``: the same build job the
Spark app Airflow submits runs (``spark_apps/reconcile.py``), started in this process."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from ctp_state.reconcile import run_reconcile
from ctp_state.settings import ReconcileSettings
from ctp_state.storage import ObjectStore


def reconcile_with_spark(
    store: ObjectStore,
    settings: ReconcileSettings,
    *,
    master: str | None,
    remote: str | None = None,
    topics: Sequence[str] | None = None,
    app_name: str = "ctp-reconcile",
    on_progress: Callable[[str, int, int], None] | None = None,
) -> Any:
    """One reconcile run with its L1 files built by Spark on ``master`` (or through the
    Spark Connect server ``remote``, sc://host:port); returns the summary."""
    from ctp_state.spark.session import inline_plan_mb, spark_map_files, spark_session

    spark = spark_session(os.environ, None if remote else master, app_name=app_name, remote=remote)
    try:
        # store.url reopens the same store in the Spark workers
        return run_reconcile(
            store,
            topics=topics,
            config=settings,
            map_files=spark_map_files(
                spark, store.url, settings.compression, inline_plan_mb=inline_plan_mb(os.environ)
            ),
            on_progress=on_progress or _quiet,
        )
    finally:
        spark.stop()


def _quiet(stage: str, done: int, total: int) -> None:
    """No progress to show."""
