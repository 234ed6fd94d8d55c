"""Reconcile throughput against this machine's raw read + Parquet-write limit, and the
reconciler's DataFrame (``mapInArrow``) build job against the RDD job it replaced.

    python benchmarks/bench_reconcile.py [--gib 1.0] [--partitions 64] [--master 'local[2]'] [--repeat 3]
    python benchmarks/bench_reconcile.py --s3 [--gib 0.25] [--repeat 3]      (on a local SeaweedFS)

1. Produces about ``--gib`` GiB of L0 (random, incompressible values) across
   ``--partitions`` partitions on a local-filesystem store.
2. raw: the same L0 bytes read with the same ranged reads, CRC-checked, decoded and
   written as the same Parquet rows with pyarrow, no Spark, no state log — on 1 and on
   2 threads; the faster is the machine's raw limit.
3. spark: the reconciler itself (``spark_apps.reconcile`` with a local SparkSession),
   claims, commits and all, on a fresh copy of the produced store each run (hard
   links: L0 objects are immutable and the file store replaces, never rewrites). Three
   build jobs in the same session, in turn, ``--repeat`` runs each:

   * ``spark_rdd``: the old job, kept here only as the baseline: the files dealt into
     an RDD with ``sparkContext.parallelize`` and built in ``flatMap``;
   * ``spark``: the app's job (what also runs through Spark Connect): the same slots
     over ``spark.range``, the dealt plan inside the ``mapInArrow`` function;
   * ``spark_rows``: the app's job on its path for plans too big to inline: one row per
     slot, ``repartition``, ``mapInArrow`` (forced here with ``inline_plan_mb=0``).

   Session start-up and each job's one-off worker warm-up are reported apart and not
   counted.

Prints JSON: MB/s and records/s for each (a path's best run; every run's MB/s under
``runs_mb_per_s``), the ratio spark/raw, ``ratio_new_to_old`` (mapInArrow MB/s over
RDD MB/s, best runs; ``ratio_new_to_old_median`` over the medians and
``ratio_new_to_old_paired_median`` over each repeat's pair, steadier on a busy machine;
``ratio_new_to_old_cpu_median`` the same for MB per CPU second of the driver, the JVM
and the Python workers, which other load barely moves; ``ratio_rows_to_old`` for the
rows path), and where the time went
(per-phase seconds summed over the Spark tasks, and the driver's phases).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from ctp_state.epoch import ClusterEpoch
from ctp_state.l0 import Record
from ctp_state.l1 import L1Build, L1File, build_file
from ctp_state.producer import Producer
from ctp_state.reconcile import plan_files, run_reconcile
from ctp_state.settings import ReconcileSettings
from ctp_state.status import read_states, select_topics
from ctp_state.storage import open_store
from ctp_state.topics import create_topic


def produce(store, gib: float, partitions: int, value_size: int, flush_records: int) -> dict:
    create_topic(store, "bench", partitions, exist_ok=True)
    ClusterEpoch(store).advance()
    pool = os.urandom(value_size * 4096 + value_size)
    total = int(gib * 1024**3 / value_size)
    t0 = time.perf_counter()
    with Producer(store, epoch_ttl_s=60) as prod:
        i = 0
        while i < total:
            n = min(flush_records, total - i)
            chunks: dict[tuple[str, int], list[Record]] = {}
            for j in range(i, i + n):
                off = (j * 7919 % 4096) * value_size
                chunks.setdefault(("bench", j % partitions), []).append(
                    Record(pool[off : off + value_size], b"k%d" % j, 1_700_000_000_000 + j)
                )
            for v in prod.write(sorted(chunks.items())):
                assert v.accepted, v.error
            i += n
    return {"records": total, "seconds": round(time.perf_counter() - t0, 2)}


def median_of(runs: list[dict]) -> float:
    return statistics.median(r["mb_per_s"] for r in runs)


def raw(store, files: list[L1File], threads: int, out_dir: str, durable: bool = False, sink=None) -> dict:
    """Read + decode + Parquet-write the same files with pyarrow only. ``durable``: and
    wait until the files are on disk (``os.sync()``, timed), as any writer must before
    it records that the files exist. ``sink``: write there instead of ``out_dir``."""
    if sink is None:
        os.makedirs(out_dir, exist_ok=True)
        sink = open_store(f"file://{out_dir}", {"CTP_FSYNC": "0"})

    def one(f: L1File) -> L1Build:
        return build_file(_RawStore(store, sink), f)

    os.sync()  # not timed: the writeback of what came before is not this run's cost
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(one, files))
    sync_s = 0.0
    if durable:
        t1 = time.perf_counter()
        os.sync()
        sync_s = time.perf_counter() - t1
    secs = time.perf_counter() - t0
    return _rates(results, secs) | {"threads": threads} | ({"sync_seconds": round(sync_s, 3)} if durable else {})


class _RawStore:
    """Reads from the L0 store, writes L1 files elsewhere (so raw never touches the log)."""

    def __init__(self, src, dst):
        self.src, self.dst = src, dst

    def get_range(self, key, start, length):
        return self.src.get_range(key, start, length)

    def put(self, key, data):
        self.dst.put(key, data)

    # The raw limit writes plainly (a rerun overwrites its files); ctp creates each L1
    # file only if absent, which costs the same one request.
    put_if_absent = put


def _warm_rdd(_: object) -> int:
    import ctp_state.l1
    import ctp_state.reconcile  # noqa: F401

    return os.getpid()


def rdd_warm_workers(spark) -> int:
    """The old warm-up (an RDD job): starts the Python workers the RDD job uses."""
    n = spark.sparkContext.defaultParallelism
    return len(set(spark.sparkContext.parallelize(range(n), n).map(_warm_rdd).collect()))


def rdd_map_files(spark, store_url: str, compression: str, tasks_per_core: int = 2):
    """The reconciler's build job before Spark Connect (an RDD ``flatMap``), verbatim
    but for the import: the baseline the DataFrame job must not be slower than."""
    from ctp_state.spark.tasks import _build

    def run(files: list) -> list[L1Build]:
        jobs = list(enumerate(files))
        slices = max(1, min(len(jobs), spark.sparkContext.defaultParallelism * tasks_per_core))
        # Deal the files largest-first round-robin so every slice gets a similar share.
        order = sorted(jobs, key=lambda job: -job[1].l0_bytes)
        dealt = [order[i::slices] for i in range(slices)]
        rdd = spark.sparkContext.parallelize(dealt, numSlices=slices)
        return rdd.flatMap(lambda group: [_build(store_url, compression, job) for job in group]).collect()

    return run


def link_copy(src: str, dst: str) -> None:
    """A copy of the store made of hard links (instant; the file store never rewrites
    an object in place, it writes a new file and renames or links it)."""
    shutil.copytree(src, dst, copy_function=os.link)


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds (user + system) used so far by ``root`` and its descendants (the
    Spark JVM and its Python workers), from /proc: a cost that, unlike wall time, other
    load on the machine barely moves."""
    stats: dict[int, tuple[int, float]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += stats.get(pid, (0, 0.0))[1]
        todo.extend(child for child, (ppid, _) in stats.items() if ppid == pid)
    return total


def _rates(results: list[L1Build], secs: float) -> dict:
    l0 = sum(r.l0_bytes for r in results)
    recs = sum(r.records for r in results)
    return {
        "seconds": round(secs, 2),
        "l0_mb": round(l0 / 1e6, 1),
        "mb_per_s": round(l0 / 1e6 / secs, 1),
        "records_per_s": round(recs / secs),
        "phase_seconds": {
            k: round(sum(getattr(r, k) for r in results), 2)
            for k in ("read_s", "decode_s", "encode_s", "write_s", "wall_s", "cpu_s")
        },
    }


def s3_runs(args, work: str) -> dict:
    """The reconciler on a real S3 server (a local SeaweedFS on loopback): L0 read with
    ranged GETs, L1 written with PUTs, the state log through conditional PUTs, against
    the raw limit of the same bytes on the same server (the same ranged GETs, decode,
    Parquet encode and PUT, boto3 and pyarrow only, on 2 and 4 threads: the faster).
    Each repeat produces a fresh store (production is not timed)."""
    from ctp_state.local_s3 import LocalS3
    from ctp_state.spark.session import spark_map_files, spark_session, warm_workers

    out: dict = {"benchmark": "reconcile_s3", "cpus": os.cpu_count(), "server": "SeaweedFS (weed mini, loopback)"}
    with LocalS3(os.path.join(work, "seaweedfs")) as server:
        os.environ.update(server.env)  # the Spark workers reach the store with these
        t0 = time.perf_counter()
        spark = spark_session(os.environ, args.master, app_name="ctp-bench-s3")
        out["session_startup_seconds"] = round(time.perf_counter() - t0, 2)
        warm_workers(spark)
        cfg = ReconcileSettings()
        runs = []
        for i in range(args.repeat):
            url = server.url(f"run{i}")
            store = open_store(url, server.env)
            produced = produce(store, args.gib, args.partitions, args.value_size, args.flush_records)
            states = read_states(store, select_topics(store))
            files = [f for s in states for f in plan_files(s, cfg.target_file_bytes)]
            raws = {t: raw(store, files, t, "", sink=open_store(server.url("raw"), server.env)) for t in (2, 4)}
            t0 = time.perf_counter()
            summary = run_reconcile(store, config=cfg, map_files=spark_map_files(spark, url, cfg.compression))
            secs = time.perf_counter() - t0
            assert summary.ok and summary.records == produced["records"], summary.records
            l0_mb = raws[2]["l0_mb"]
            best_raw = max(raws[2]["mb_per_s"], raws[4]["mb_per_s"])
            runs.append(
                {
                    "l0_mb": l0_mb,
                    "l1_files": len(files),
                    "raw_2_threads_mb_per_s": raws[2]["mb_per_s"],
                    "raw_4_threads_mb_per_s": raws[4]["mb_per_s"],
                    "reconcile_seconds": round(secs, 2),
                    "reconcile_mb_per_s": round(l0_mb / secs, 1),
                    "ratio_reconcile_to_raw": round(l0_mb / secs / best_raw, 3),
                }
            )
            print(json.dumps({"s3_run": runs[-1]}), file=sys.stderr)
        spark.stop()
    out["gib"] = args.gib
    out["partitions"] = args.partitions
    out["runs"] = runs
    out["ratio_reconcile_to_raw_median"] = round(statistics.median(r["ratio_reconcile_to_raw"] for r in runs), 3)
    out["ratio_reconcile_to_raw_best"] = max(r["ratio_reconcile_to_raw"] for r in runs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument("--value-size", type=int, default=1000)
    ap.add_argument("--flush-records", type=int, default=65536)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--dir", default=None, help="work directory (default: a temp dir, removed after)")
    ap.add_argument("--profile", action="store_true", help="cProfile the Spark tasks; print the top functions")
    ap.add_argument(
        "--also-tasks-per-core",
        type=int,
        default=None,
        help="also run the app's job with this many tasks per core (path spark_tpcN), to compare",
    )
    ap.add_argument(
        "--repeat", type=int, default=3, help="reconcile runs per build job, in turn (8 or more on a busy machine)"
    )
    ap.add_argument(
        "--s3",
        action="store_true",
        help="measure on a real S3 server instead (a local SeaweedFS): reconcile vs the raw limit of the same bytes",
    )
    args = ap.parse_args()
    work = args.dir or tempfile.mkdtemp(prefix="ctp-bench-")
    if args.s3:
        try:
            print(json.dumps(s3_runs(args, work), indent=2))
        finally:
            if not args.dir:
                shutil.rmtree(work, ignore_errors=True)
        return
    try:
        url = f"file://{work}/store"
        store = open_store(url, {"CTP_FSYNC": "0"})
        out: dict = {
            "benchmark": "reconcile",
            "cpus": os.cpu_count(),
            "master": args.master,
            "partitions": args.partitions,
            "value_size": args.value_size,
        }
        out["produce"] = produce(store, args.gib, args.partitions, args.value_size, args.flush_records)
        states = read_states(store, select_topics(store))
        cfg = ReconcileSettings()
        files = [f for s in states for f in plan_files(s, cfg.target_file_bytes)]
        out["l1_files"] = len(files)
        out["raw_1_thread"] = raw(store, files, 1, f"{work}/raw1")
        out["raw_2_threads"] = raw(store, files, 2, f"{work}/raw2")
        out["raw_2_threads_durable"] = raw(store, files, 2, f"{work}/raw2d", durable=True)
        for d in ("raw1", "raw2", "raw2d"):
            shutil.rmtree(f"{work}/{d}", ignore_errors=True)

        os.environ["CTP_FSYNC"] = "0"
        if args.profile:
            os.makedirs(f"{work}/prof", exist_ok=True)
            os.environ["CTP_PROFILE_DIR"] = f"{work}/prof"
        from ctp_state.spark.session import spark_map_files, spark_session, warm_workers

        t0 = time.perf_counter()
        spark = spark_session(os.environ, args.master, app_name="ctp-bench")
        startup = time.perf_counter() - t0
        jvm = spark.sparkContext._gateway.proc.pid  # local mode: the executors' JVM too
        paths = {  # name: (warm-up, map_files factory); the app does its warm-up once, before its first job
            "spark_rdd": (rdd_warm_workers, rdd_map_files),
            "spark": (warm_workers, spark_map_files),
            # the app's job forced onto its path for big plans (rows + repartition)
            "spark_rows": (warm_workers, functools.partial(spark_map_files, inline_plan_mb=0)),
        }
        if args.also_tasks_per_core:
            tpc = args.also_tasks_per_core
            paths[f"spark_tpc{tpc}"] = (warm_workers, functools.partial(spark_map_files, tasks_per_core=tpc))
            paths[f"spark_rdd_tpc{tpc}"] = (rdd_warm_workers, functools.partial(rdd_map_files, tasks_per_core=tpc))
        warm: dict[str, tuple[int, float]] = {}
        for name, (warm_up, _) in paths.items():
            t0 = time.perf_counter()
            workers = warm_up(spark)
            warm[name] = (workers, time.perf_counter() - t0)
        runs: dict[str, list[dict]] = {name: [] for name in paths}
        for i in range(args.repeat):
            # ABBA: neither job always runs first (the first runs of a session are slower)
            for name in list(paths) if i % 2 == 0 else list(paths)[::-1]:
                factory = paths[name][1]
                run_url = f"file://{work}/run-{i}-{name}"
                link_copy(f"{work}/store", f"{work}/run-{i}-{name}")
                os.sync()  # not timed, as for raw
                run_store = open_store(run_url, {"CTP_FSYNC": "0"})
                build_results: list[L1Build] = []
                inner = factory(spark, run_url, cfg.compression)
                phases: dict[str, float] = {}

                def timed_map(fs, inner=inner, phases=phases, build_results=build_results):
                    t = phases["build_start"] = time.perf_counter()
                    res = inner(fs)
                    phases["spark_build_s"] = time.perf_counter() - t
                    build_results.extend(res)
                    return res

                t0, cpu0 = time.perf_counter(), tree_cpu_seconds(jvm) + time.process_time()
                summary = run_reconcile(run_store, config=cfg, map_files=timed_map)
                secs = time.perf_counter() - t0
                cpu = tree_cpu_seconds(jvm) + time.process_time() - cpu0
                assert summary.ok and summary.records == out["produce"]["records"], summary.records
                runs[name].append(
                    _rates(build_results, secs)
                    | {
                        "driver_seconds_outside_spark_tasks": round(secs - phases["spark_build_s"], 2),
                        # reading states and claiming | committing, releasing, snapshotting, the summary
                        "driver_seconds_before_build": round(phases["build_start"] - t0, 2),
                        "driver_seconds_after_build": round(
                            secs - phases["spark_build_s"] - (phases["build_start"] - t0), 2
                        ),
                        "spark_job_seconds": round(phases["spark_build_s"], 2),
                        "cpu_seconds": round(cpu, 2),  # driver + JVM + Python workers
                        "mb_per_cpu_s": round(sum(r.l0_bytes for r in build_results) / 1e6 / cpu, 1),
                    }
                )
                shutil.rmtree(f"{work}/run-{i}-{name}", ignore_errors=True)
        spark.stop()
        best = max(out["raw_1_thread"]["mb_per_s"], out["raw_2_threads"]["mb_per_s"])
        for name in paths:
            top = max(runs[name], key=lambda r: r["mb_per_s"])
            workers, warmup = warm[name]
            job = {
                "spark_rdd": "rdd flatMap (old)",
                "spark": "mapInArrow (new)",
                "spark_rows": "mapInArrow, plan as rows + repartition (new, for big plans)",
            }.get(
                name,
                f"{'rdd flatMap' if 'rdd' in name else 'mapInArrow'}, {args.also_tasks_per_core} task(s) per core",
            )
            out[name] = (
                {"build_job": job}
                | top
                | {
                    "runs_mb_per_s": [r["mb_per_s"] for r in runs[name]],
                    "median_mb_per_s": round(statistics.median(r["mb_per_s"] for r in runs[name]), 1),
                    "runs_mb_per_cpu_s": [r["mb_per_cpu_s"] for r in runs[name]],
                    "median_mb_per_cpu_s": round(statistics.median(r["mb_per_cpu_s"] for r in runs[name]), 1),
                    "session_startup_seconds": round(startup, 2),
                    "worker_warmup_seconds": round(warmup, 2),
                    "python_workers": workers,
                    "mb_per_s_including_startup_and_warmup": round(
                        top["l0_mb"] / (top["seconds"] + startup + warmup), 1
                    ),
                }
            )
        out["ratio_spark_to_raw"] = round(out["spark"]["mb_per_s"] / best, 3)
        # the same against a raw writer that also waits for its files to reach the disk
        out["ratio_spark_to_raw_durable"] = round(
            out["spark"]["mb_per_s"] / out["raw_2_threads_durable"]["mb_per_s"], 3
        )
        out["ratio_spark_median_to_raw"] = round(median_of(runs["spark"]) / best, 3)
        out["ratio_rdd_to_raw"] = round(out["spark_rdd"]["mb_per_s"] / best, 3)
        out["ratio_new_to_old"] = round(out["spark"]["mb_per_s"] / out["spark_rdd"]["mb_per_s"], 3)
        median = {name: statistics.median(r["mb_per_s"] for r in runs[name]) for name in paths}
        out["ratio_new_to_old_median"] = round(median["spark"] / median["spark_rdd"], 3)
        # each repeat ran both jobs back to back: the median of those pairs' ratios
        out["ratio_new_to_old_paired_median"] = round(
            statistics.median(new["mb_per_s"] / old["mb_per_s"] for new, old in zip(runs["spark"], runs["spark_rdd"])),
            3,
        )
        out["ratio_new_to_old_cpu_median"] = round(
            statistics.median(r["mb_per_cpu_s"] for r in runs["spark"])
            / statistics.median(r["mb_per_cpu_s"] for r in runs["spark_rdd"]),
            3,
        )
        out["ratio_rows_to_old"] = round(out["spark_rows"]["mb_per_s"] / out["spark_rdd"]["mb_per_s"], 3)
        for name in paths:
            if name.startswith(("spark_tpc", "spark_rdd_tpc")):
                out[f"ratio_{name}_to_old_median"] = round(median[name] / median["spark_rdd"], 3)
                out[f"ratio_{name}_to_old_paired_median"] = round(
                    statistics.median(a["mb_per_s"] / b["mb_per_s"] for a, b in zip(runs[name], runs["spark_rdd"])), 3
                )
        if args.profile:
            import glob
            import io
            import pstats

            buf = io.StringIO()
            stats = pstats.Stats(*glob.glob(f"{work}/prof/*.prof"), stream=buf)
            stats.sort_stats("tottime").print_stats(12)
            out["profile_top_tottime"] = [line for line in buf.getvalue().splitlines() if line.strip()][-14:]
        print(json.dumps(out, indent=2))
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
