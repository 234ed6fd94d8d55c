"""The Spark reconciler: lift L0 chunks into per-partition L1 Parquet files.

    spark-submit --master 'local[*]' spark_apps/reconcile.py --store URL [--topic T ...]

The main is thin: it parses arguments, starts a SparkSession and hands
``ctp_state.reconcile.run_reconcile`` a ``map_files`` that runs one Spark task per L1
file. Each task opens the store itself (from the URL and its environment: there is no
s3a here, so object storage is read and written by Python code in the tasks with
ranged GETs and plain PUTs) and builds one file. Planning, claims and commits stay on
the driver, in the library.

Prints the run summary as JSON on stdout; exits 1 if any partition was quarantined,
fenced or failed (so Airflow shows the failure), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

_STORES: dict[str, Any] = {}


def _store(url: str) -> Any:
    """One store client per worker process (boto3 clients are expensive to build)."""
    from ctp_state.storage import open_store

    if url not in _STORES:
        _STORES[url] = open_store(url, os.environ)
    return _STORES[url]


def _build(url: str, compression: str, job: tuple[int, Any]) -> dict:
    from ctp_state.reconcile import build_one

    index, f = job
    return build_one(_store(url), index, f, compression, os.environ.get("CTP_PROFILE_DIR"))


def _warm(_: object) -> int:
    import ctp_state.l1
    import ctp_state.reconcile  # noqa: F401

    return os.getpid()


def warm_workers(spark: Any) -> int:
    """Start the Python workers and import the reconciler in each, once per application
    (~0.3 s a worker), so the first L1 files do not pay for it. Returns the number of
    distinct worker processes seen."""
    n = spark.sparkContext.defaultParallelism
    return len(set(spark.sparkContext.parallelize(range(n), n).map(_warm).collect()))


def spark_map_files(spark: Any, store_url: str, compression: str,
                    tasks_per_core: int = 2) -> Callable[[list], list[dict]]:
    """``map_files`` for the library: the files spread over about ``tasks_per_core`` x
    the default parallelism Spark tasks, balanced by size.

    Not one task per file: a Python task costs Spark ~40 ms on top of its work (measured
    with empty tasks, see the README's benchmark notes), which would dominate small files.
    """

    def run(files: list) -> list[dict]:
        jobs = list(enumerate(files))
        slices = max(1, min(len(jobs), spark.sparkContext.defaultParallelism * tasks_per_core))
        # Deal the files largest-first round-robin so every slice gets a similar share.
        order = sorted(jobs, key=lambda job: -job[1].l0_bytes)
        dealt = [order[i::slices] for i in range(slices)]
        rdd = spark.sparkContext.parallelize(dealt, numSlices=slices)
        return rdd.flatMap(lambda group: [_build(store_url, compression, job) for job in group]).collect()

    return run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options of :class:`ctp_state.settings.ReconcileSettings`, plus where to run."""
    from ctp_state.settings import ReconcileSettings, options

    ap = argparse.ArgumentParser(prog="reconcile", description="ctp Spark reconciler")
    ap.add_argument("--store", default=os.environ.get("CTP_STORE"), help="store URL (default $CTP_STORE)")
    ap.add_argument("--topic", action="append", dest="topics", help="only this topic (repeatable)")
    for o in options(ReconcileSettings):
        if o.knob.kind is bool:
            ap.add_argument(o.flag, action="store_true", help=o.knob.help)
        else:
            ap.add_argument(o.flag, type=o.knob.kind, default=o.default, choices=o.knob.choices, help=o.knob.help)
    ap.add_argument("--master", default=None, help="Spark master when not set by spark-submit")
    args = ap.parse_args(argv)
    if not args.store:
        ap.error("no store: pass --store or set CTP_STORE")
    return args


def config_from_args(args: argparse.Namespace) -> Any:
    """The run's settings; a value out of range raises ConfigError naming the option."""
    from ctp_state.settings import ReconcileSettings, from_options

    return from_options(ReconcileSettings, vars(args))


def spark_session(master: str | None = None, app_name: str = "ctp-reconcile") -> Any:
    from pyspark.sql import SparkSession

    # Workers must run the interpreter that has ctp installed, not whatever `python3`
    # is first on PATH (spark.pyspark.python / PYSPARK_PYTHON still win when set).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    elif not os.environ.get("SPARK_ENV_LOADED") and "spark.master" not in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
        builder = builder.master(os.environ.get("CTP_SPARK_MASTER", "local[*]"))
    return (builder.config("spark.ui.showConsoleProgress", "false")
            .config("spark.log.level", os.environ.get("CTP_SPARK_LOG_LEVEL", "WARN"))
            .config("spark.python.worker.reuse", "true")
            .getOrCreate())


def run(spark: Any, args: argparse.Namespace, on_progress: Callable[[str, int, int], None] | None = None) -> Any:
    from ctp_state.reconcile import run_reconcile
    from ctp_state.storage import open_store

    config = config_from_args(args)
    store = open_store(args.store, os.environ)
    kwargs: dict[str, Any] = {"on_progress": on_progress} if on_progress else {}
    return run_reconcile(store, topics=args.topics, config=config,
                         map_files=spark_map_files(spark, args.store, config.compression), **kwargs)


def main(argv: list[str] | None = None) -> int:
    from ctp_state.errors import CtpError

    args = parse_args(argv)
    try:
        spark = spark_session(args.master)
        spark.sparkContext.setLogLevel("WARN")
        try:
            warm_workers(spark)
            summary = run(spark, args)
        finally:
            spark.stop()
    except (CtpError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    from ctp_state.records import encode

    print(json.dumps(encode(summary), indent=1))
    if not summary.ok:
        bad = summary.failed
        first = bad[0]
        print(f"error: {len(bad)} partition(s) not reconciled; first: {first.topic}/{first.partition} "
              f"{first.status}: {first.reason}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
