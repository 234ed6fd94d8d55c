"""L1 lifecycle: what compaction buys a table that aged in small files, what it costs
against the reconciler on the same bytes, a GC that deletes many replaced files, and the
table's publish of a compaction. JSON, side by side in one run.

    python benchmarks/bench_compaction.py [--partitions 16] [--rounds 48] [--per 20]
        [--throughput-mib 64] [--gc-files 10000] [--repeat 15] [--only lifecycle,throughput,gc]

- lifecycle (the scenario of issue 39): ``--partitions`` partitions, ``--rounds`` rounds
  of ``--per`` records per partition, each round produce -> epoch advance -> reconcile
  -> ``ctp table publish`` (a SQLite catalog). Then ``ctp compact`` (defaults), a
  publish, and GC runs with no reader grace that keep one table snapshot. Reports the
  data files per partition in the table head before and after, a DuckDB
  ``iceberg_scan`` of the table before, after and after snapshot expiry, each against the
  same records in one file per partition read with ``read_parquet`` (best of
  ``--repeat``, the two queries taken in turn; ``ratio_scan_after_expiry_to_one_file``,
  goal <= 2), the bytes under ``l1/`` after the GC
  against the compacted files' (``ratio_l1_bytes_to_compacted``, goal <= 1.2), the
  compaction's publish against an append publish, and whether every record reads once
  through ``ctp read``, pyiceberg, DuckDB and polars, after snapshot expiry too.
- throughput: about ``--throughput-mib`` MiB of records in 8 partitions, reconciled in 8
  rounds (8 files a partition), against compacting exactly those files (both in this
  process, local threads): MB/s of record bytes each, ``ratio_compact_to_reconcile``
  (goal >= 0.8).
- gc: ``--gc-files`` small files in 100 partitions, compacted, then one GC that deletes
  every replaced file: its seconds and files per second.
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

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import pyarrow as pa
import pyarrow.parquet as pq

from ctp_state import layout
from ctp_state.compact import run_compaction
from ctp_state.epoch import ClusterEpoch
from ctp_state.gc import run_gc
from ctp_state.l0 import Record
from ctp_state.partition_log import PartitionLog
from ctp_state.producer import Producer
from ctp_state.read import read_partition
from ctp_state.reconcile import run_reconcile
from ctp_state.settings import CompactSettings, GcSettings, ReconcileSettings
from ctp_state.storage import open_store
from ctp_state.table.catalog import CatalogConfig, open_catalog
from ctp_state.table.jobs import publish_topics
from ctp_state.table.maintenance import CatalogTables
from ctp_state.topics import create_topic, get_topic

NO_GRACE = GcSettings(l1_grace_s=0, l1_reader_grace_s=0)


class NoGate:
    """The GC's checks in plain Python only (the benchmark times deletes, not GX)."""

    def __call__(self, frames):
        from ctp_state.gc.prepare import GateResult

        return GateResult(True, [])


def round_of(store, topic: str, partitions: int, per: int, r: int, value: bytes = b"") -> None:
    ClusterEpoch(store).advance()
    with Producer(store, epoch_ttl_s=0) as prod:
        chunks = [
            (
                (topic, p),
                [Record(value or f"{r}-{p}-{i}".encode(), b"k%d" % i, 1_700_000_000_000 + r) for i in range(per)],
            )
            for p in range(partitions)
        ]
        for v in prod.write(chunks):
            assert v.accepted, v.error
    run_reconcile(store, topics=[topic], config=ReconcileSettings())


def l1_bytes(store) -> int:
    return sum(o.size for o in store.list(layout.L1_ROOT))


def committed_bytes(store, t) -> int:
    sizes = {o.key: o.size for o in store.list(layout.L1_ROOT)}
    return sum(
        sizes[f.key] for p in range(t.partitions) for f in PartitionLog(store, t, p).read_state().committed_l1_files()
    )


def duckdb_scans(sqls: list[str], repeat: int) -> list[tuple[float, tuple]]:
    """Best of ``repeat`` for each query, the queries taken in turn (a noisy machine slows
    them alike instead of whichever ran during the noise)."""
    import duckdb
    from duckdb_extensions import import_extension

    con = duckdb.connect()
    for ext in ("avro", "iceberg"):
        import_extension(ext, con=con)
        con.execute(f"LOAD {ext}")
    best, out = [float("inf")] * len(sqls), [()] * len(sqls)
    for _ in range(repeat):
        for i, sql in enumerate(sqls):
            t0 = time.perf_counter()
            out[i] = con.execute(sql).fetchone()
            best[i] = min(best[i], time.perf_counter() - t0)
    return list(zip(best, out))


def table_files_per_partition(table) -> int:
    from ctp_state.table.files import data_files

    counts: dict[int, int] = {}
    for f in data_files(table):
        counts[f.partition] = counts.get(f.partition, 0) + 1
    return max(counts.values(), default=0)


def read_everything(store, t, table) -> dict[str, bool]:
    """Whether ctp read, pyiceberg, DuckDB and polars each return every record once."""
    import polars as pl

    want = pa.concat_tables([read_partition(store, t.name, p) for p in range(t.partitions)])
    key = sorted(zip(want.column("partition").to_pylist(), want.column("offset").to_pylist()))
    ok = {"ctp_read": len(set(key)) == len(key) == want.num_rows}

    def same(tab) -> bool:
        got = sorted(zip(tab.column("partition").to_pylist(), tab.column("offset").to_pylist()))
        return got == key

    ok["pyiceberg"] = same(table.scan().to_arrow())
    ok["polars"] = same(pl.scan_iceberg(table).collect().to_arrow())
    import duckdb
    from duckdb_extensions import import_extension

    con = duckdb.connect()
    for ext in ("avro", "iceberg"):
        import_extension(ext, con=con)
        con.execute(f"LOAD {ext}")
    ok["duckdb"] = same(
        con.execute(f"select partition, \"offset\" from iceberg_scan('{table.metadata_location}')").to_arrow_table()
    )
    return ok


def lifecycle(args, root: str) -> dict:
    store = open_store(f"file://{root}/store", {})
    home = os.path.join(root, "home")
    os.makedirs(home)
    config = CatalogConfig.from_env({})
    t = create_topic(store, "t", args.partitions)
    publish_times = []
    for r in range(args.rounds):
        round_of(store, "t", args.partitions, args.per, r)
        t0 = time.perf_counter()
        publish_topics(store, config, home=home, topics=["t"])
        publish_times.append(time.perf_counter() - t0)
    publish_append_s = statistics.median(publish_times[-5:])
    catalog = open_catalog(store, config, home=home)
    table = catalog.load_table((config.namespace, "t"))
    records = args.partitions * args.rounds * args.per
    # the same records, one file per partition: the reference a compacted table should approach
    ref = os.path.join(root, "one-file")
    os.makedirs(ref)
    for p in range(args.partitions):
        pq.write_table(read_partition(store, "t", p), os.path.join(ref, f"{p}.parquet"))
    one_sql = f"select count(*), sum(octet_length(value)) from read_parquet('{ref}/*.parquet')"
    sql = "select count(*), sum(octet_length(value)) from iceberg_scan('{}')"
    (one_s, one), (before_s, before) = duckdb_scans([one_sql, sql.format(table.metadata_location)], args.repeat)
    files_before = table_files_per_partition(table)
    l1_files_before = sum(1 for _ in store.list(layout.L1_ROOT))
    metadata_files = sum(len(fs) for _, _, fs in os.walk(os.path.join(root, "store", "tables")))

    t0 = time.perf_counter()
    summary = run_compaction(store, config=CompactSettings())
    compact_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    pub = publish_topics(store, config, home=home, topics=["t"])[0]
    publish_compaction_s = time.perf_counter() - t0
    table = table.refresh()
    (one_after_s, _), (after_s, after) = duckdb_scans([one_sql, sql.format(table.metadata_location)], args.repeat)
    files_after = table_files_per_partition(table)
    tables = CatalogTables(store, config, home=home, keep=1, max_age_s=0)
    gcs = [run_gc(store, gate=NoGate(), config=NO_GRACE, tables=tables) for _ in range(2)]
    table = table.refresh()
    (one_expired_s, _), (expired_s, expired) = duckdb_scans([one_sql, sql.format(table.metadata_location)], args.repeat)
    head_manifests = len(table.current_snapshot().manifests(table.io))
    t = get_topic(store, "t")
    reads = read_everything(store, t, table)
    return {
        "partitions": args.partitions,
        "rounds": args.rounds,
        "records": records,
        "l1_files_before": l1_files_before,
        "table_metadata_files_before": metadata_files,
        "table_files_per_partition_before": files_before,
        "table_files_per_partition_after": files_after,
        "duckdb_scan_s_one_file_per_partition": round(one_s, 4),
        "duckdb_scan_s_before": round(before_s, 4),
        "duckdb_scan_s_after": round(after_s, 4),
        "ratio_scan_before_to_one_file": round(before_s / one_s, 2),
        "ratio_scan_after_to_one_file": round(after_s / one_after_s, 2),
        "duckdb_scan_s_after_expiry": round(expired_s, 4),
        "ratio_scan_after_expiry_to_one_file": round(expired_s / one_expired_s, 2),
        "table_snapshots_after_expiry": len(table.metadata.snapshots),
        "table_head_manifests_after_expiry": head_manifests,
        "scan_results_agree": before == one == after == expired and before[0] == records,
        "compaction_s": round(compact_s, 3),
        "files_replaced": summary.files_replaced,
        "files_written": summary.files_written,
        "publish_compaction_s": round(publish_compaction_s, 3),
        "publish_compaction_files_removed": pub.files_removed,
        "publish_append_s_median_last5": round(publish_append_s, 3),
        "gc_retired_deleted": sum(g.l1_retired_deleted for g in gcs),
        "l1_bytes_after_gc": l1_bytes(store),
        "committed_l1_bytes": committed_bytes(store, t),
        "ratio_l1_bytes_to_compacted": round(l1_bytes(store) / committed_bytes(store, t), 3),
        "read_exactly_once_after_expiry": reads,
    }


def throughput(args, root: str) -> dict:
    value = os.urandom(1000)
    partitions, rounds = 8, 8
    per = max(1, int(args.throughput_mib * 1024 * 1024 / 1000 / partitions / rounds))
    store = open_store(f"file://{root}/tp", {})
    create_topic(store, "t", partitions)
    reconcile_s = 0.0
    for _ in range(rounds):
        ClusterEpoch(store).advance()
        with Producer(store, epoch_ttl_s=0) as prod:
            for v in prod.write(
                [(("t", p), [Record(value, b"k", 1_700_000_000_000) for _ in range(per)]) for p in range(partitions)]
            ):
                assert v.accepted
        t0 = time.perf_counter()
        run_reconcile(store, topics=["t"])
        reconcile_s += time.perf_counter() - t0
    t0 = time.perf_counter()
    s = run_compaction(store, config=CompactSettings(max_small_files=2))
    compact_s = time.perf_counter() - t0
    mb = partitions * rounds * per * 1000 / 1e6
    return {
        "record_mb": round(mb, 1),
        "files_replaced": s.files_replaced,
        "reconcile_s": round(reconcile_s, 3),
        "compact_s": round(compact_s, 3),
        "reconcile_mb_per_s": round(mb / reconcile_s, 1),
        "compact_mb_per_s": round(mb / compact_s, 1),
        "ratio_compact_to_reconcile": round(reconcile_s / compact_s, 2),
    }


def gc_many(args, root: str) -> dict:
    partitions = 100
    rounds = max(3, args.gc_files // partitions)  # (a partition compacts once it has more than 2)
    store = open_store(f"file://{root}/gc", {})
    create_topic(store, "t", partitions)
    for r in range(rounds):
        round_of(store, "t", partitions, 1, r)
    s = run_compaction(store, config=CompactSettings(max_small_files=2))
    t0 = time.perf_counter()
    rec = run_gc(store, gate=NoGate(), config=NO_GRACE)
    gc_s = time.perf_counter() - t0
    return {
        "files_replaced": s.files_replaced,
        "gc_s": round(gc_s, 2),
        "retired_deleted": rec.l1_retired_deleted,
        "deleted_per_s": round(rec.l1_retired_deleted / gc_s, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=48)
    ap.add_argument("--per", type=int, default=20)
    ap.add_argument("--throughput-mib", type=float, default=64)
    ap.add_argument("--gc-files", type=int, default=10000)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--only", default="lifecycle,throughput,gc")
    args = ap.parse_args()
    only = set(args.only.split(","))
    root = tempfile.mkdtemp(prefix="bench-compaction-")
    out: dict = {}
    try:
        if "lifecycle" in only:
            out["lifecycle"] = lifecycle(args, root)
        if "throughput" in only:
            out["throughput"] = throughput(args, root)
        if "gc" in only:
            out["gc"] = gc_many(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
