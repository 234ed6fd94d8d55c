"""GC benchmarks, printed as JSON with side-by-side ratios.

    python benchmarks/bench_gc.py [--live 1000,10000,100000] [--garbage 1000]
                                  [--partitions 1000,10000] [--delete-objects 5000] [--s3]
                                  [--only growth|delete|m|throttle] [--throttle-objects 5000]

- growth: GC wall time with a fixed amount of L0 garbage while the live L0 objects (above
  M) grow, with what the listing read (directories and entries on the file store; LIST
  requests on S3 with ``--s3``), next to a delta-rs vacuum in full mode (``full=True``: it lists the whole
  table, as any GC that also collects orphans must) over a Delta table holding the same
  numbers of live and removed files of the same size, on the same filesystem. ctp's GC
  is timed twice: the L0 list+delete alone, and the whole ``run_gc`` with the Great
  Expectations gate (a constant ~1 s).
- delete: ctp's deleter (batches of 1000, 4 in flight, retries) against the store's raw
  batched delete (1000-key requests one after another) on the same objects; local
  filesystem, and with ``--s3`` a real S3 server (a local SeaweedFS), where the raw
  side is boto3's own DeleteObjects calls.
- throttle (with ``--s3``): L0 list+delete through a proxy in front of the S3 server,
  clean and with 30% of requests answered 503 SlowDown: objects/s side by side; the
  deleter and lister back off per spread prefix (AIMD) and finish.
- m: computing M (C, every partition's state, R4/R7) at 1k and 10k partitions, from the
  state logs and from a reconcile summary.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from ctp_state import layout
from ctp_state.epoch import ClusterEpoch
from ctp_state.gc import compute_m, delete_objects, gather, plan_l0_deletes, run_gc
from ctp_state.settings import GcSettings
from ctp_state.storage import LocalStore, ObjectStore, open_store
from ctp_state.topics import create_topic

SPREAD = 100
SIZE = 256  # bytes per object/file: the cost under test is listing and deleting, not bytes


def _fill(store: ObjectStore, keys: list[str], threads: int = 16) -> None:
    blob = b"x" * SIZE
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda k: store.put(k, blob), keys, chunksize=256))


def _l0_keys(n: int, epoch_of, tag: str) -> list[str]:
    return [layout.l0_key(i % SPREAD, epoch_of(i), f"{tag}{i}") for i in range(n)]


class _CountingScandir:
    """Counts the directories a file store opens and the entries it reads from them."""

    def __init__(self) -> None:
        self.dirs = self.entries = 0
        self._real = os.scandir

    def __call__(self, path="."):
        self.dirs += 1
        it = self._real(path)
        counter = self

        class Counted:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                it.close()

            def __iter__(self):
                for e in it:
                    counter.entries += 1
                    yield e

        return Counted()


def _list_requests(store: ObjectStore) -> tuple[list[int], object]:
    """A counter of the S3 LIST requests ``store``'s client sends (boto3's event hooks),
    and the hook (to unregister)."""
    n = [0]

    def count(**_kw):
        n[0] += 1

    store._s3.meta.events.register("before-call.s3.ListObjectsV2", count)  # type: ignore[attr-defined]
    return n, count


def ctp_growth(root: str, live: int, garbage: int, store: ObjectStore | None = None, repeat: int = 3) -> dict:
    """L0 list + delete of ``garbage`` objects (epochs 1-10, M = 10) beside ``live``
    objects at epoch 11, and what it read: directories and entries on a file store,
    LIST requests on S3."""
    store = store or LocalStore(root, fsync=False)
    ce = ClusterEpoch(store)
    for _ in range(10):
        ce.advance()  # C = 11, no partitions: M = 10
    _fill(store, _l0_keys(live, lambda i: 11, "l"))
    times = []
    for rep in range(repeat):  # the same garbage again each time; the median is reported
        _fill(store, _l0_keys(garbage, lambda i: 1 + i % 10, f"g{rep}x"))
        os.sync()  # the fill's writeback must not land inside the timed run
        if isinstance(store, LocalStore):
            counting = _CountingScandir()
            os.scandir = counting  # type: ignore[assignment]
        else:
            lists = _list_requests(store)
        try:
            t0 = time.perf_counter()
            todo, c = plan_l0_deletes(store, 10, now_s=time.time())
            delete_objects(store, todo, counters=c)
            times.append(time.perf_counter() - t0)
        finally:
            if isinstance(store, LocalStore):
                os.scandir = counting._real
                reads = {"dirs_read": counting.dirs, "dir_entries_read": counting.entries}
            else:
                store._s3.meta.events.unregister("before-call.s3.ListObjectsV2", lists[1])  # type: ignore[attr-defined]
                reads = {"list_requests": lists[0][0]}
        assert c.deleted == garbage, c
    core = statistics.median(times)
    if not isinstance(store, LocalStore):
        return {"l0_gc_s": round(core, 4), "l0_gc_runs_s": [round(t, 4) for t in times], "listed": c.listed, **reads}
    # the whole run with the gate, on a second batch of the same garbage
    _fill(store, _l0_keys(garbage, lambda i: 1 + i % 10, "h"))
    from expectations.gate import GxGate

    os.sync()
    t0 = time.perf_counter()
    rec = run_gc(store, gate=GxGate(os.path.join(root, "..", "report")), config=GcSettings())
    full = time.perf_counter() - t0
    assert rec.deleted == garbage, rec
    return {
        "l0_gc_s": round(core, 4),
        "l0_gc_runs_s": [round(t, 4) for t in times],
        "run_gc_with_gate_s": round(full, 3),
        "listed": c.listed,
        **reads,
    }


def delta_growth(root: str, live: int, garbage: int) -> dict:
    from deltalake import DeltaTable

    os.makedirs(os.path.join(root, "_delta_log"))
    now_ms = int(time.time() * 1000)
    old_ms = now_ms - 30 * 24 * 3600 * 1000
    names = [f"part-{i:07d}-{uuid.uuid4().hex[:8]}.parquet" for i in range(live + garbage)]
    blob = b"x" * SIZE

    def write(name: str) -> None:
        with open(os.path.join(root, name), "wb") as f:
            f.write(blob)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(write, names, chunksize=256))
    schema = json.dumps({"type": "struct", "fields": [{"name": "x", "type": "long", "nullable": True, "metadata": {}}]})
    v0 = [
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {
            "metaData": {
                "id": str(uuid.uuid4()),
                "format": {"provider": "parquet", "options": {}},
                "schemaString": schema,
                "partitionColumns": [],
                "configuration": {},
                "createdTime": old_ms,
            }
        },
    ]
    v0 += [
        {"add": {"path": n, "partitionValues": {}, "size": SIZE, "modificationTime": old_ms, "dataChange": True}}
        for n in names
    ]
    v1 = [{"remove": {"path": n, "deletionTimestamp": old_ms, "dataChange": True, "size": SIZE}} for n in names[live:]]
    for version, actions in ((0, v0), (1, v1)):
        with open(os.path.join(root, "_delta_log", f"{version:020d}.json"), "w") as f:
            f.write("\n".join(json.dumps(a) for a in actions) + "\n")
    os.utime(root, None)
    os.sync()
    t0 = time.perf_counter()
    dt = DeltaTable(root)
    removed = dt.vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False, full=True)
    took = time.perf_counter() - t0
    assert len(removed) == garbage, len(removed)
    return {"vacuum_full_s": round(took, 4)}


def bench_growth(lives: list[int], garbage: int) -> list[dict]:
    out = []
    for live in lives:
        base = tempfile.mkdtemp(prefix="ctp-bench-gc-")
        try:
            ours = ctp_growth(os.path.join(base, "store"), live, garbage)
            delta = delta_growth(os.path.join(base, "delta"), live, garbage)
        finally:
            shutil.rmtree(base, ignore_errors=True)
        row = {
            "live": live,
            "garbage": garbage,
            **ours,
            **delta,
            "ratio_vacuum_over_ctp_l0": round(delta["vacuum_full_s"] / ours["l0_gc_s"], 2),
        }
        print(json.dumps({"growth": row}), file=sys.stderr)
        out.append(row)
    first = out[0]
    for row in out:
        row["ctp_l0_vs_smallest"] = round(row["l0_gc_s"] / first["l0_gc_s"], 2)
        row["vacuum_vs_smallest"] = round(row["vacuum_full_s"] / first["vacuum_full_s"], 2)
    return out


def bench_growth_s3(server, lives: list[int], garbage: int) -> list[dict]:
    """The growth run on S3 (SeaweedFS over HTTP): time, keys listed, LIST requests."""
    out = []
    for live in lives:
        store = open_store(server.url("bench"), server.env)
        row = {"live": live, "garbage": garbage, **ctp_growth("", live, garbage, store=store)}
        print(json.dumps({"growth_s3": row}), file=sys.stderr)
        out.append(row)
    for row in out:
        row["ctp_l0_vs_smallest"] = round(row["l0_gc_s"] / out[0]["l0_gc_s"], 2)
    return out


def bench_delete(store_of, n: int, label: str, repeat: int = 3) -> dict:
    """ctp's deleter against the store's raw batched delete, each on a freshly filled
    store (synced first: unlinking files still in the page cache is another, cheaper
    operation), in alternating order, ``repeat`` times; medians and the median of the
    paired ratios."""
    runs: dict[str, list[float]] = {"raw": [], "ctp": []}
    for rep in range(repeat):
        for mode in ("raw", "ctp") if rep % 2 == 0 else ("ctp", "raw"):
            store = store_of()
            keys = [layout.l0_key(i % SPREAD, 1, f"d{i}") for i in range(n)]
            _fill(store, keys)
            os.sync()
            if mode == "raw" and hasattr(store, "_s3"):  # S3: boto3's DeleteObjects, nothing of ctp's
                client, prefix = store._s3, store.prefix
                t0 = time.perf_counter()
                deleted = 0
                for i in range(0, n, 1000):
                    resp = client.delete_objects(
                        Bucket=store.bucket,
                        Delete={"Objects": [{"Key": prefix + k} for k in keys[i : i + 1000]], "Quiet": True},
                    )
                    assert not resp.get("Errors"), resp["Errors"][:3]
                    deleted += len(keys[i : i + 1000])
            elif mode == "raw":
                t0 = time.perf_counter()
                deleted = 0
                for i in range(0, n, 1000):
                    deleted += len(store._delete_batch(keys[i : i + 1000]).deleted)
            else:
                bulk = store.bulk()  # as the GC deletes: its own pacing, no retries underneath
                todo, c = plan_l0_deletes(store, 1, now_s=time.time(), bulk=bulk)
                t0 = time.perf_counter()  # the deleter alone, as the raw loop is
                deleted = delete_objects(bulk, todo, counters=c).deleted
                if bulk is not store:
                    bulk.close()
            took = time.perf_counter() - t0
            assert deleted == n, (mode, deleted)
            runs[mode].append(n / took)
    res = {f"{m}_objects_per_s": round(statistics.median(v)) for m, v in runs.items()}
    res["runs_objects_per_s"] = {m: [round(x) for x in v] for m, v in runs.items()}
    res["ratio_ctp_over_raw"] = round(res["ctp_objects_per_s"] / res["raw_objects_per_s"], 2)
    res["ratio_paired_median"] = round(statistics.median(c / r for c, r in zip(runs["ctp"], runs["raw"])), 2)
    return {"store": label, "objects": n, **res}


def bench_throttle(server, n: int, probability: float = 0.3) -> dict:
    """L0 list+delete on S3 (SeaweedFS behind the fault proxy), clean and with
    ``probability`` of every request answered 503 SlowDown, same objects, same run."""
    from tests.support.s3_fault_proxy import S3FaultProxy

    res: dict = {"objects": n, "throttle_probability": probability}
    for mode in ("clean", "throttled"):
        url = server.url("bench")
        direct = open_store(url, server.env)
        _fill(direct, [layout.l0_key(i % SPREAD, 1 + i % 3, f"t{i}") for i in range(n)])
        with S3FaultProxy.for_server(server, seed=7) as proxy:
            if mode == "throttled":
                proxy.add_rule("slowdown_503", probability=probability)
            store = open_store(url, {**server.env, "CTP_S3_ENDPOINT_URL": proxy.endpoint})
            bulk = store.bulk()
            try:
                t0 = time.perf_counter()
                todo, c = plan_l0_deletes(store, 3, now_s=time.time(), bulk=bulk)
                delete_objects(bulk, todo, counters=c)
                took = time.perf_counter() - t0
            finally:
                bulk.close()
            assert (c.deleted, c.delete_errors) == (n, 0), (mode, c.deleted, c.delete_errors)
            assert not list(direct.list(layout.L0_ROOT))
            res[mode] = {
                "objects_per_s": round(n / took),
                "seconds": round(took, 2),
                "requests_served": proxy.requests,
                "throttled_responses": proxy.injected["slowdown_503"],
                "list_retries": c.list_retries,
                "delete_retries": c.delete_retries,
                "lowest_delete_limit": round(c.lowest_limit, 2),
            }
    res["ratio_throttled_over_clean"] = round(res["throttled"]["objects_per_s"] / res["clean"]["objects_per_s"], 2)
    print(json.dumps({"throttle": res}), file=sys.stderr)
    return res


def bench_m(counts: list[int]) -> list[dict]:
    """M as the GC computes it: C, then every partition's state from its log (the
    newest snapshot plus the entries after it), read 32 at a time."""
    out = []
    for n in counts:
        base = tempfile.mkdtemp(prefix="ctp-bench-m-")
        try:
            store = LocalStore(os.path.join(base, "store"), fsync=False)
            per_topic = 1000
            for t in range(n // per_topic):
                create_topic(store, f"t{t}", per_topic)
            t0 = time.perf_counter()
            c, views = gather(store)
            d = compute_m(c, views, now_ms=int(time.time() * 1000))  # type: ignore[arg-type]
            from_logs = time.perf_counter() - t0
            assert d.m == c - 1 and len(views) == n
        finally:
            shutil.rmtree(base, ignore_errors=True)
        row = {"partitions": n, "m_from_logs_s": round(from_logs, 3), "partitions_per_s": round(n / from_logs)}
        print(json.dumps({"m": row}), file=sys.stderr)
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--live", default="1000,10000,100000")
    ap.add_argument("--garbage", type=int, default=1000)
    ap.add_argument("--partitions", default="1000,10000")
    ap.add_argument("--delete-objects", type=int, default=5000)
    ap.add_argument("--s3", action="store_true", help="also measure on S3: a local SeaweedFS server")
    ap.add_argument("--throttle-objects", type=int, default=5000, help="objects for the S3 throttling run")
    ap.add_argument("--s3-live", default="1000,10000,100000", help="live objects for the S3 growth run (with --s3)")
    ap.add_argument(
        "--only",
        choices=["growth", "delete", "m", "throttle"],
        default=None,
        help="run one section (throttle implies --s3)",
    )
    args = ap.parse_args()
    os.environ.setdefault("CTP_FSYNC", "0")
    want = {args.only} if args.only else {"growth", "delete", "m"} | ({"throttle"} if args.s3 else set())
    result: dict = {"machine": {"cpus": os.cpu_count()}}
    if "growth" in want:
        result["growth"] = bench_growth([int(x) for x in args.live.split(",")], args.garbage)
    if "delete" in want:
        base = tempfile.mkdtemp(prefix="ctp-bench-del-")
        try:
            result["delete"] = [
                bench_delete(
                    lambda: LocalStore(os.path.join(base, uuid.uuid4().hex), fsync=False), args.delete_objects, "file"
                )
            ]
        finally:
            shutil.rmtree(base, ignore_errors=True)
    if args.s3 or "throttle" in want:
        from ctp_state.local_s3 import LocalS3

        server = LocalS3(tempfile.mkdtemp(prefix="ctp-bench-seaweedfs-")).start()
        try:
            if "delete" in want and args.s3:
                result["delete"].append(
                    bench_delete(
                        lambda: open_store(server.url("bench"), server.env),
                        args.delete_objects,
                        "s3 (SeaweedFS)",
                    )
                )
            if "throttle" in want:
                result["throttle"] = bench_throttle(server, args.throttle_objects)
            if "growth" in want and args.s3:
                result["growth_s3"] = bench_growth_s3(server, [int(x) for x in args.s3_live.split(",")], args.garbage)
        finally:
            server.stop()
            shutil.rmtree(server.data_dir, ignore_errors=True)
    if "m" in want:
        result["m"] = bench_m([int(x) for x in args.partitions.split(",")])
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
