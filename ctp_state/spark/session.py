"""The driver side of the Spark reconciler: a session, and the ``map_files`` that
:func:`ctp_state.reconcile.run_reconcile` hands the planned L1 files to.

The build is a DataFrame job (``spark.range`` or rows of pickled files,
``mapInArrow``, ``collect``), with no RDD and no SparkContext, so the same code runs on
``local[*]``, on a standalone or YARN cluster through spark-submit, and as a Spark
Connect client. Through Connect the Python workers are the server's: start the server
with ``ctp_state`` importable and with the store's environment, and set
``spark.default.parallelism`` on it when it fronts a cluster (see
:func:`default_parallelism`). The task side is :mod:`ctp_state.spark.tasks`.
"""

from __future__ import annotations

import functools
import os
import pickle
import re
import sys
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any, TypeVar

import msgspec

from ctp_state.l1 import L1Build
from ctp_state.spark.tasks import RESULT_SCHEMA, _builder, _warm

#: Dealt plans up to this size (pickled) ride inside the ``mapInArrow`` function, over a
#: ``spark.range`` of slot numbers; bigger ones go in as rows and are repartitioned
#: (see :func:`spark_map_files`). ``CTP_SPARK_INLINE_PLAN_MB`` overrides it.
INLINE_PLAN_MB = 4.0
#: malloc settings for the Python workers (see :func:`spark_session`): buffers up to 32
#: MiB come from the heap, and up to 512 MiB freed stays with the process.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(512 << 20)}


def inline_plan_mb(env: Mapping[str, str]) -> float:
    """The entry points' ``$CTP_SPARK_INLINE_PLAN_MB`` (a number of MiB >= 0), else
    :data:`INLINE_PLAN_MB`."""
    import math

    from ctp_state.errors import ConfigError

    raw = env.get("CTP_SPARK_INLINE_PLAN_MB")
    if not raw:
        return INLINE_PLAN_MB
    try:
        mb = float(raw)
    except ValueError:
        mb = math.nan
    if not 0 <= mb < math.inf:
        raise ConfigError(f"CTP_SPARK_INLINE_PLAN_MB must be a number of MiB >= 0, got {raw!r}")
    return mb


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
        return max(1, int(spark.sparkContext.defaultParallelism))
    master = spark.conf.get("spark.master", None) or ""
    m = re.fullmatch(r"local(?:\[(\d+)(?:,\s*\d+)?\])?", master)
    if m:
        return int(m.group(1) or 1)
    return os.cpu_count() or 2


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


def spark_map_files(
    spark: Any, store_url: str, compression: str, tasks_per_core: int = 1, inline_plan_mb: float | None = None
) -> Callable[[list[Any]], list[L1Build]]:
    """``map_files`` for the library: the files spread over about ``tasks_per_core`` x
    the default parallelism Spark tasks, balanced by size.

    A DataFrame job, no RDD and no SparkContext, so it runs through Spark Connect too.
    The files are dealt largest-first round-robin into slots, one slot per task, and
    pickled per slot; ``mapInArrow`` builds each slot's files in its task; the result
    come back to the driver as JSON strings of :class:`~ctp_state.l1.L1Build`. How the slots reach the tasks:

    * a plan of up to ``inline_plan_mb`` MiB pickled (default :data:`INLINE_PLAN_MB`;
      the entry points take ``$CTP_SPARK_INLINE_PLAN_MB``) travels inside the
      ``mapInArrow`` function, and the job runs over ``spark.range(slots)`` with one
      partition per slot: no shuffle;
    * a bigger plan goes in as a DataFrame, one row per slot, and ``repartition`` on a
      key per slot (see :func:`slot_keys`) puts each slot in a partition of its own. That
      costs a shuffle, noise for a run that big but not for a small one; and it keeps
      the function, which every task receives whole, small.

    Not one task per file: each Python task has a fixed cost in Spark on top of its work,
    which would dominate small files (figures in docs/benchmarks.md).
    """

    def run(files: list[Any]) -> list[L1Build]:
        jobs = list(enumerate(files))
        # Deal the files largest-first round-robin so every slot gets a similar share.
        order = sorted(jobs, key=lambda job: -job[1].l0_bytes)
        rows = _spark_map(spark, store_url, compression, order, tasks_per_core, inline_plan_mb)
        return [msgspec.json.decode(r, type=L1Build) for r in rows]

    return run


def spark_map_runs(
    spark: Any, store_url: str, compression: str, tasks_per_core: int = 1, inline_plan_mb: float | None = None
) -> Callable[[list[Any]], list[Any]]:
    """``map_runs`` for :func:`ctp_state.compact.run_compaction`: each compacted file built
    in a Spark task as :func:`spark_map_files` builds a reconcile's (the same slots,
    ``mapInArrow``, Connect or classic), largest runs first."""
    from ctp_state.compact import RunBuild

    def run(jobs: list[Any]) -> list[RunBuild]:
        order = sorted(jobs, key=lambda j: -(j.last - j.first))
        rows = _spark_map(spark, store_url, compression, order, tasks_per_core, inline_plan_mb)
        return [msgspec.json.decode(r, type=RunBuild) for r in rows]

    return run


def _spark_map(
    spark: Any, store_url: str, compression: str, order: list[Any], tasks_per_core: int, inline_plan_mb: float | None
) -> list[str]:
    """Build every job of ``order`` in Spark tasks; their results as JSON strings."""
    if inline_plan_mb is None:
        inline_plan_mb = INLINE_PLAN_MB
    slices = max(1, min(len(order), default_parallelism(spark) * tasks_per_core))
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
    return [r.result for r in df.mapInArrow(build, RESULT_SCHEMA).collect()]


def spark_session(
    env: MutableMapping[str, str],
    master: str | None = None,
    app_name: str = "ctp-reconcile",
    remote: str | None = None,
) -> Any:
    """A classic session (``master``, or the one spark-submit set), or a Spark Connect
    session when ``remote`` (``sc://host:port``) is given. Through Connect, the Python
    workers are the server's: they must import ``ctp_state`` and see the store's
    environment (S3 endpoint, credentials) themselves.

    ``env`` is the driver process's environment (``os.environ`` at the entry point): it
    is read (``CTP_SPARK_MASTER``, ``CTP_SPARK_LOG_LEVEL``) and given the worker
    settings local-mode workers inherit (``PYSPARK_PYTHON``, :data:`MALLOC_ENV`)."""
    from pyspark.sql import SparkSession

    if remote:
        if master:
            raise ValueError("pass either a Spark master or a Spark Connect remote, not both")
        return SparkSession.builder.remote(remote).appName(app_name).getOrCreate()

    # Workers must run the interpreter that has ctp installed, not whatever `python3`
    # is first on PATH (spark.pyspark.python / PYSPARK_PYTHON still win when set).
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    # glibc's malloc hands freed chunk buffers back to the kernel, so a fresh Python
    # worker page-faults (and zeroes) every MiB it reads: L0 reads inside the tasks took
    # 3x the raw reads. Keeping freed memory (env read by the workers' malloc; local
    # mode's workers inherit this process's environment, executors get executorEnv).
    for name, value in MALLOC_ENV.items():
        env.setdefault(name, value)

    builder = SparkSession.builder.appName(app_name)
    for name in MALLOC_ENV:
        builder = builder.config(f"spark.executorEnv.{name}", env[name])
    if master:
        builder = builder.master(master)
    elif not env.get("SPARK_ENV_LOADED") and "spark.master" not in env.get("PYSPARK_SUBMIT_ARGS", ""):
        builder = builder.master(env.get("CTP_SPARK_MASTER", "local[*]"))
    return (
        builder.config("spark.ui.showConsoleProgress", "false")
        .config("spark.log.level", env.get("CTP_SPARK_LOG_LEVEL", "WARN"))
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )


_R = TypeVar("_R")


def run_app(
    args: Any,
    run: Callable[[Any, Any], _R],
    *,
    app_name: str,
    env: MutableMapping[str, str],
    check: Callable[[Any], object] = lambda args: None,
) -> _R | None:
    """An entry point's body: ``check(args)`` (settings, the store: before a session
    starts, so bad input costs no Spark start), then ``run(spark, args)`` in a session
    started from ``args`` (``master``, ``remote``) and the entry point's ``env``
    (:func:`spark_session`), its workers warmed, the session stopped however it ends.
    A :class:`ctp_state.errors.CtpError` or ``ValueError`` is printed as one line on
    stderr and gives None (the caller exits 1)."""
    from ctp_state.errors import CtpError

    try:
        check(args)
        spark = spark_session(env, args.master, app_name=app_name, remote=args.remote)
        if not is_connect(spark):  # through Connect, the server's log settings apply
            spark.sparkContext.setLogLevel("WARN")
        try:
            warm_workers(spark)
            return run(spark, args)
        finally:
            spark.stop()
    except (CtpError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return None
