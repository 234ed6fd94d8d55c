"""A local SparkSession for ``ctp reconcile`` and ``ctp demo``: the same Spark app
Airflow submits (``spark_apps/reconcile.py``), started in this process."""

from __future__ import annotations

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
    from spark_apps import reconcile as app

    spark = app.spark_session(None if remote else master, app_name=app_name, remote=remote)
    try:
        kw: dict[str, Any] = {"on_progress": on_progress} if on_progress else {}
        # store.url reopens the same store in the Spark workers
        return run_reconcile(
            store,
            topics=topics,
            config=settings,
            map_files=app.spark_map_files(spark, store.url, settings.compression),
            **kw,
        )
    finally:
        spark.stop()
