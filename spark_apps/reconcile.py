"""The Spark reconciler: lift L0 chunks into per-partition L1 Parquet files.

    spark-submit --master 'local[*]' spark_apps/reconcile.py --store URL [--topic T ...]
    spark-submit --master spark://HOST:7077 spark_apps/reconcile.py --store URL     # standalone cluster
    python spark_apps/reconcile.py --remote sc://HOST:15002 --store URL             # Spark Connect

The main is thin: it parses arguments, starts a SparkSession and hands
``ctp_state.reconcile.run_reconcile`` a ``map_files`` that builds the planned L1 files
in Spark tasks. Each task opens the store itself (from the URL and its environment:
there is no s3a here, so object storage is read and written by Python code in the tasks
with ranged GETs and plain PUTs) and builds its share of the files. Planning, claims and
commits stay on the driver, in the library.

The build is a DataFrame job (rows of pickled files, ``repartition``, ``mapInArrow``,
``collect``), with no RDD and no SparkContext, so the same code runs on ``local[*]``, on
a standalone or YARN cluster through spark-submit, and as a Spark Connect client
(``--remote``, or ``$SPARK_REMOTE``; started with plain ``python``, no JVM on the
client). Through Connect the Python workers are the server's: start the server with
``ctp_state`` importable (installed, or on its ``PYTHONPATH``) and with the store's
environment (``CTP_S3_ENDPOINT_URL``, AWS credentials or an instance role), and set
``spark.default.parallelism`` on it when it fronts a cluster (a Connect client cannot
ask a SparkContext how many cores there are; see :func:`default_parallelism`).

Prints the run summary as JSON on stdout; exits 1 if any partition was quarantined,
fenced or failed (so Airflow shows the failure), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pickle
import re
import struct
import sys
from collections.abc import Callable, Iterator
from typing import Any

_STORES: dict[str, Any] = {}

#: The build job's output: one JSON result dict per L1 file.
RESULT_SCHEMA = "result string"
#: Dealt plans up to this size (pickled) ride inside the ``mapInArrow`` function, over a
#: ``spark.range`` of slot numbers; bigger ones go in as rows and are repartitioned
#: (see :func:`spark_map_files`). ``CTP_SPARK_INLINE_PLAN_MB`` overrides it.
INLINE_PLAN_MB = 4.0
#: malloc settings for the Python workers (see :func:`spark_session`): buffers up to 32
#: MiB come from the heap, and up to 512 MiB freed stays with the process.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(512 << 20)}


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


def is_connect(spark: Any) -> bool:
    """True for a Spark Connect session (no SparkContext, no RDDs)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def default_parallelism(spark: Any) -> int:
    """How many tasks the cluster runs at once, to size the build job.

    ``spark.default.parallelism`` when it is set; else, on a classic session, the
    SparkContext's default parallelism (the cores of ``local[N]`` or of the registered
    executors). A Connect client has no SparkContext to ask: it reads the server's
    ``spark.master`` and takes N from ``local[N]``, and otherwise falls back to this
    machine's CPU count. So behind a Connect server on a cluster, set
    ``spark.default.parallelism`` on the server to the cluster's cores.
    """
    conf = spark.conf.get("spark.default.parallelism", None)
    if conf:
        return max(1, int(conf))
    if not is_connect(spark):
        return max(1, spark.sparkContext.defaultParallelism)
    master = spark.conf.get("spark.master", None) or ""
    m = re.fullmatch(r"local(?:\[(\d+)(?:,\s*\d+)?\])?", master)
    if m:
        return int(m.group(1) or 1)
    return os.cpu_count() or 2


def _arrow_column(name: str, values: list[str] | list[int]) -> Any:
    """A one-column RecordBatch of strings or int64s built from buffers: ``pa.array`` on
    Python objects imports pandas (~0.3-1 s in every fresh Python worker)."""
    import pyarrow as pa

    n = len(values)
    if values and isinstance(values[0], int):
        arr = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(struct.pack(f"<{n}q", *values))])
    else:
        data = [v.encode() for v in values]  # type: ignore[union-attr]
        offsets = [0]
        for d in data:
            offsets.append(offsets[-1] + len(d))
        arr = pa.Array.from_buffers(
            pa.string(), n, [None, pa.py_buffer(struct.pack(f"<{n + 1}i", *offsets)), pa.py_buffer(b"".join(data))]
        )
    return pa.RecordBatch.from_arrays([arr], names=[name])


def _warm(batches: Iterator[Any]) -> Iterator[Any]:
    import ctp_state.l1
    import ctp_state.reconcile  # noqa: F401

    for _ in batches:
        pass
    yield _arrow_column("pid", [os.getpid()])


def warm_workers(spark: Any) -> int:
    """Start the Python workers and import the reconciler in each, once per application
    (~0.3 s a worker), so the first L1 files do not pay for it: a tiny ``mapInArrow``
    job, one task per core, in the same kind of job as the build (so on a classic
    session and through Spark Connect alike). Returns the number of distinct worker
    processes seen."""
    n = default_parallelism(spark)
    rows = spark.range(0, n, 1, numPartitions=n).mapInArrow(_warm, "pid long").collect()
    return len({r.pid for r in rows})


def _murmur3_int(value: int, seed: int = 42) -> int:
    """Spark's ``hash()`` of an int (Murmur3_x86_32.hashInt, seed 42), as a signed int."""

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF

    k = (value & 0xFFFFFFFF) * 0xCC9E2D51 & 0xFFFFFFFF
    k = rotl(k, 15) * 0x1B873593 & 0xFFFFFFFF
    h = rotl(seed ^ k, 13)
    h = (h * 5 + 0xE6546B64) & 0xFFFFFFFF
    h ^= 4
    h ^= h >> 16
    h = h * 0x85EBCA6B & 0xFFFFFFFF
    h ^= h >> 13
    h = h * 0xC2B2AE35 & 0xFFFFFFFF
    h ^= h >> 16
    return h - (1 << 32) if h >= 1 << 31 else h


@functools.lru_cache(maxsize=64)
def slot_keys(slices: int) -> tuple[int, ...]:
    """``keys[i]`` is an int that ``repartition(slices, col)`` sends to partition i.

    Spark's hash partitioning puts a row in ``pmod(hash(col), n)``; slot numbers 0..n-1
    as keys would collide (two slots in one task, an idle core). Only the balance
    depends on this, never the result: were Spark to hash differently, some tasks would
    just get two slots.
    """
    keys: list[int | None] = [None] * slices
    missing, k = slices, 0
    while missing:
        p = _murmur3_int(k) % slices
        if keys[p] is None:
            keys[p], missing = k, missing - 1
        k += 1
    return tuple(keys)  # type: ignore[arg-type]


def _builder(url: str, compression: str, plan: list[bytes] | None) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function. Each input row is a slot: its number (``id``, an
    index into ``plan``) or, with no ``plan``, its pickled files (``jobs``). For each
    ``(index, L1File)`` of the slot it builds the file (the task opens the store itself
    from ``url`` and its environment); it yields the slot's result dicts as JSON."""

    def build(batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            if plan is not None:
                slots = [plan[slot] for slot in batch.column("id").to_pylist()]
            else:
                slots = batch.column("jobs").to_pylist()
            for blob in slots:
                # one batch per slot, not per file: each Arrow batch costs the JVM too
                yield _arrow_column("result", [json.dumps(_build(url, compression, job)) for job in pickle.loads(blob)])

    return build


def spark_map_files(
    spark: Any, store_url: str, compression: str, tasks_per_core: int = 1, inline_plan_mb: float | None = None
) -> Callable[[list], list[dict]]:
    """``map_files`` for the library: the files spread over about ``tasks_per_core`` x
    the default parallelism Spark tasks, balanced by size.

    A DataFrame job, no RDD and no SparkContext, so it runs through Spark Connect too.
    The files are dealt largest-first round-robin into slots, one slot per task, and
    pickled per slot; ``mapInArrow`` builds each slot's files in its task; the result
    dicts come back to the driver as JSON strings. How the slots reach the tasks:

    * a plan of up to ``inline_plan_mb`` MiB pickled (default :data:`INLINE_PLAN_MB`, or
      ``$CTP_SPARK_INLINE_PLAN_MB``) travels inside the ``mapInArrow`` function, and the
      job runs over ``spark.range(slots)`` with one partition per slot: no shuffle;
    * a bigger plan goes in as a DataFrame, one row per slot, and ``repartition`` on a
      key per slot (see :func:`slot_keys`) puts each slot in a partition of its own. That
      costs a shuffle (~0.1-0.2 s on ``local[2]``, measured with
      ``benchmarks/bench_reconcile.py``), noise for a run that big, but not for a small
      one; and it keeps the function, which every task receives whole, small.

    Not one task per file: a Python task costs Spark ~40 ms on top of its work (measured
    with empty tasks, see the README's benchmark notes), which would dominate small files.
    """
    if inline_plan_mb is None:
        inline_plan_mb = float(os.environ.get("CTP_SPARK_INLINE_PLAN_MB", INLINE_PLAN_MB))

    def run(files: list) -> list[dict]:
        jobs = list(enumerate(files))
        slices = max(1, min(len(jobs), default_parallelism(spark) * tasks_per_core))
        # Deal the files largest-first round-robin so every slot gets a similar share.
        order = sorted(jobs, key=lambda job: -job[1].l0_bytes)
        plan = [pickle.dumps(order[i::slices], protocol=pickle.HIGHEST_PROTOCOL) for i in range(slices)]
        if sum(map(len, plan)) <= inline_plan_mb * 1024 * 1024:
            # spark.range splits evenly: partition i holds the one row i.
            df = spark.range(0, slices, 1, numPartitions=slices)
            build = _builder(store_url, compression, plan)
        else:
            keys = slot_keys(slices)
            df = spark.createDataFrame(
                [(keys[i], blob) for i, blob in enumerate(plan)], "slot int, jobs binary"
            ).repartition(slices, "slot")
            build = _builder(store_url, compression, None)
        return [json.loads(r.result) for r in df.mapInArrow(build, RESULT_SCHEMA).collect()]

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


def spark_session(master: str | None = None, app_name: str = "ctp-reconcile", remote: str | None = None) -> Any:
    """A classic session (``master``, or the one spark-submit set), or a Spark Connect
    session when ``remote`` (``sc://host:port``) is given. Through Connect, the Python
    workers are the server's: they must import ``ctp_state`` and see the store's
    environment (S3 endpoint, credentials) themselves."""
    from pyspark.sql import SparkSession

    if remote:
        if master:
            raise ValueError("pass either a Spark master or a Spark Connect remote, not both")
        return SparkSession.builder.remote(remote).appName(app_name).getOrCreate()

    # Workers must run the interpreter that has ctp installed, not whatever `python3`
    # is first on PATH (spark.pyspark.python / PYSPARK_PYTHON still win when set).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # glibc's malloc hands freed chunk buffers back to the kernel, so a fresh Python
    # worker page-faults (and zeroes) every MiB it reads: L0 reads inside the tasks took
    # 3x the raw reads. Keeping freed memory (env read by the workers' malloc; local
    # mode's workers inherit this process's environment, executors get executorEnv).
    for name, value in MALLOC_ENV.items():
        os.environ.setdefault(name, value)

    builder = SparkSession.builder.appName(app_name)
    for name in MALLOC_ENV:
        builder = builder.config(f"spark.executorEnv.{name}", os.environ[name])
    if master:
        builder = builder.master(master)
    elif not os.environ.get("SPARK_ENV_LOADED") and "spark.master" not in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
        builder = builder.master(os.environ.get("CTP_SPARK_MASTER", "local[*]"))
    return (
        builder.config("spark.ui.showConsoleProgress", "false")
        .config("spark.log.level", os.environ.get("CTP_SPARK_LOG_LEVEL", "WARN"))
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )


def run(spark: Any, args: argparse.Namespace, on_progress: Callable[[str, int, int], None] | None = None) -> Any:
    from ctp_state.reconcile import run_reconcile
    from ctp_state.storage import open_store

    config = config_from_args(args)
    store = open_store(args.store, os.environ)
    kwargs: dict[str, Any] = {"on_progress": on_progress} if on_progress else {}
    return run_reconcile(
        store,
        topics=args.topics,
        config=config,
        map_files=spark_map_files(spark, args.store, config.compression),
        **kwargs,
    )


def main(argv: list[str] | None = None) -> int:
    from ctp_state.errors import CtpError

    args = parse_args(argv)
    try:
        spark = spark_session(args.master, remote=args.remote)
        if not is_connect(spark):  # through Connect, the server's log settings apply
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
        print(
            f"error: {len(bad)} partition(s) not reconciled; first: {first.topic}/{first.partition} "
            f"{first.status}: {first.reason}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
