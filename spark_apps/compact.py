"""The Spark compactor: merge each partition's small L1 files, through its state log.

    spark-submit --master 'local[*]' spark_apps/compact.py --store URL [--topic T ...]
    spark-submit --master spark://HOST:7077 spark_apps/compact.py --store URL     # standalone cluster
    python spark_apps/compact.py --remote sc://HOST:15002 --store URL             # Spark Connect

As thin as the reconciler's main: it parses arguments, starts a SparkSession and hands
``ctp_state.compact.run_compaction`` a ``map_runs`` that builds the compacted files in
Spark tasks (``mapInArrow``, the reconciler's slots: :mod:`ctp_state.spark`). Planning,
claims, the row-for-row check's commit and releases stay on the driver, in the library.

Prints the run summary as JSON on stdout; exits 1 if any partition failed or was fenced,
2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ctp_state.spark.session import inline_plan_mb, run_app, spark_map_runs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options of :class:`ctp_state.settings.CompactSettings`, plus where to run."""
    from ctp_state.settings import CompactSettings, options

    ap = argparse.ArgumentParser(prog="compact", description="ctp Spark compactor")
    ap.add_argument("--store", default=os.environ.get("CTP_STORE"), help="store URL (default $CTP_STORE)")
    ap.add_argument("--topic", action="append", dest="topics", help="only this topic (repeatable)")
    for o in options(CompactSettings):
        ap.add_argument(o.flag, type=o.knob.kind, default=o.default, choices=o.knob.choices, help=o.knob.help)
    ap.add_argument("--master", default=None, help="Spark master when not set by spark-submit")
    ap.add_argument("--remote", default=os.environ.get("SPARK_REMOTE"), help="Spark Connect server, sc://host:port")
    args = ap.parse_args(argv)
    if not args.store:
        ap.error("no store: pass --store or set CTP_STORE")
    return args


def check(args: argparse.Namespace) -> None:
    """What the run needs, checked before Spark starts: its settings, the store (it
    must exist), ``$CTP_SPARK_INLINE_PLAN_MB``."""
    from ctp_state.settings import CompactSettings, from_options
    from ctp_state.storage import open_store

    from_options(CompactSettings, vars(args))
    open_store(args.store, os.environ, create=False)
    inline_plan_mb(os.environ)


def run(spark: Any, args: argparse.Namespace) -> Any:
    from ctp_state.compact import run_compaction
    from ctp_state.settings import CompactSettings, from_options
    from ctp_state.storage import open_store

    config = from_options(CompactSettings, vars(args))
    store = open_store(args.store, os.environ, create=False)  # a mistyped path is an error, not an empty store
    return run_compaction(
        store,
        topics=args.topics,
        config=config,
        map_runs=spark_map_runs(spark, args.store, config.compression, inline_plan_mb=inline_plan_mb(os.environ)),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    summary = run_app(args, run, app_name="ctp-compact", env=os.environ, check=check)
    if summary is None:
        return 1
    print(json.dumps(summary.as_dict(), indent=1))
    if summary.failed:
        first = summary.failed[0]
        print(
            f"error: {len(summary.failed)} partition(s) not compacted; first: {first.topic}/{first.partition} "
            f"{first.status}: {first.reason}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    from ctp_state.process_exit import run as run_and_leave

    run_and_leave(main)
