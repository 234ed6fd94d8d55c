"""The Spark reconciler: lift L0 chunks into per-partition L1 Parquet files.

    spark-submit --master 'local[*]' spark_apps/reconcile.py --store URL [--topic T ...]
    spark-submit --master spark://HOST:7077 spark_apps/reconcile.py --store URL     # standalone cluster
    python spark_apps/reconcile.py --remote sc://HOST:15002 --store URL             # Spark Connect

The main is thin: it parses arguments, starts a SparkSession and hands
``ctp_state.reconcile.run_reconcile`` a ``map_files`` that builds the planned L1 files
in Spark tasks (:mod:`ctp_state.spark`). Each task opens the store itself from the URL
and its environment and builds its share of the files; planning, claims and commits stay
on the driver, in the library. The same code runs on ``local[*]``, on a standalone or
YARN cluster through spark-submit, and as a Spark Connect client (``--remote``, or
``$SPARK_REMOTE``; started with plain ``python``, no JVM on the client). Through Connect
the Python workers are the server's: start the server with ``ctp_state`` importable
(installed, or on its ``PYTHONPATH``) and with the store's environment
(``CTP_S3_ENDPOINT_URL``, AWS credentials or an instance role), and set
``spark.default.parallelism`` on it when it fronts a cluster.

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

from ctp_state.spark.session import inline_plan_mb, run_app, spark_map_files


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
    ap.add_argument(
        "--remote",
        default=os.environ.get("SPARK_REMOTE"),
        help="Spark Connect server, sc://host:port (default $SPARK_REMOTE); run with plain python",
    )
    args = ap.parse_args(argv)
    if not args.store:
        ap.error("no store: pass --store or set CTP_STORE")
    return args


def config_from_args(args: argparse.Namespace) -> Any:
    """The run's settings; a value out of range raises ConfigError naming the option."""
    from ctp_state.settings import ReconcileSettings, from_options

    return from_options(ReconcileSettings, vars(args))


def check(args: argparse.Namespace) -> None:
    """What the run needs, checked before Spark starts: its settings, the store (it
    must exist), ``$CTP_SPARK_INLINE_PLAN_MB``."""
    from ctp_state.storage import open_store

    config_from_args(args)
    open_store(args.store, os.environ, create=False)
    inline_plan_mb(os.environ)


def run(spark: Any, args: argparse.Namespace, on_progress: Callable[[str, int, int], None] | None = None) -> Any:
    from ctp_state.reconcile import run_reconcile
    from ctp_state.storage import open_store

    config = config_from_args(args)
    store = open_store(args.store, os.environ, create=False)  # a mistyped path is an error, not an empty store
    return run_reconcile(
        store,
        topics=args.topics,
        config=config,
        map_files=spark_map_files(spark, args.store, config.compression, inline_plan_mb=inline_plan_mb(os.environ)),
        on_progress=on_progress or (lambda stage, done, total: None),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    summary = run_app(args, run, app_name="ctp-reconcile", env=os.environ, check=check)
    if summary is None:
        return 1
    from ctp_state.records import encode

    print(json.dumps(encode(summary), indent=1))
    if not summary.ok:
        bad = summary.failed
        first = bad[0]
        print(
            f"error: {len(bad)} partition(s) not reconciled; first: {first.topic}/{first.partition} "
            f"{first.status}: {first.reason}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    from ctp_state.process_exit import run as run_and_leave

    run_and_leave(main)  # the driver's status reaches spark-submit, whatever pyarrow does at teardown
