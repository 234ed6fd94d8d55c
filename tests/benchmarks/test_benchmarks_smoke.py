"""The scale benchmarks, run small: they still work, print the JSON the README's tables
come from, and what they count (not what they time) holds — the GC reads the same
directories whatever the live data, every phase of the scale run completes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bench(*args: str, timeout: int = 300) -> dict:
    done = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env={**os.environ, "CTP_FSYNC": "0"},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.slow
def test_gc_growth_reads_the_same_directories_whatever_the_live_objects():
    out = _bench("benchmarks/bench_gc.py", "--only", "growth", "--live", "200,2000", "--garbage", "30")
    small, large = out["growth"]
    assert (small["live"], large["live"]) == (200, 2000)  # both on every one of the 100 spread prefixes
    assert small["listed"] == large["listed"] == 30  # the garbage alone is listed
    assert (small["dirs_read"], small["dir_entries_read"]) == (large["dirs_read"], large["dir_entries_read"])
    assert large["vacuum_full_s"] > 0 and large["ratio_vacuum_over_ctp_l0"] > 0


@pytest.mark.slow
def test_the_scale_run_completes_every_phase():
    out = _bench("benchmarks/bench_scale.py", "--partitions", "30,60", "--topic-size", "25")
    small, large = out["scale"]
    assert small["m"]["partitions_read"] == 30
    assert large["m"]["partitions_read"] == 60 and large["reconcile"]["advanced"] == 60
    assert large["gc"]["status"] == "ok" and large["gc"]["m"] == large["gc"]["cluster_epoch"] - 1
    assert large["m_after"]["m"] == large["gc"]["m"] and large["m_after"]["partitions_read"] == 60
    # the steady state: the reconcile and the GC from the pack, no log read by the GC
    assert large["reconcile_pack"]["advanced"] == 60 and large["reconcile_pack"]["ok"]
    assert large["gc_pack"]["status"] == "ok" and large["gc_pack"]["partitions_read"] == 0
    assert large["gc_pack"]["m"] == large["gc_pack"]["cluster_epoch"] - 1 > large["gc"]["m"]
    for p in ("gc", "gc_pack"):  # M's inputs, read within the run's time
        assert 0 < large[p]["m_inputs_seconds"] < large[p]["seconds"], large[p]
    # between ticks: every partition quiet in the GC's pack and none due, so none read
    assert large["reconcile_quiet"]["advanced"] == 0 and large["reconcile_quiet"]["ok"]
    # spread: the next run ticks the partitions at their phase, some and not all (60
    # partitions over 6 phases: 1 to 20 of them, by crc32 of their names)
    assert 0 < large["reconcile_spread"]["advanced"] < 30 and large["reconcile_spread"]["ok"]
    phases = {"create", "m", "reconcile", "m_after", "gc", "reconcile_pack", "gc_pack", "reconcile_quiet"}
    phases.add("reconcile_spread")
    assert all(large[p]["peak_rss_mib"] > 0 for p in phases)
    assert set(out["per_partition_growth"]["30->60"]) == phases


@pytest.mark.slow
def test_the_reconcile_benchmark_reconciles_every_record_and_reports_its_ratios():
    """Spark in local mode, tiny: every path reconciles all the produced records (the
    benchmark asserts it per run), and the ratios the README quotes are there."""
    out = _bench("benchmarks/bench_reconcile.py", "--gib", "0.004", "--partitions", "4", "--repeat", "1", timeout=600)
    assert out["l1_files"] >= 4 and out["produce"]["records"] > 0
    for path in ("spark", "spark_rdd", "spark_rows"):
        run = out[path]
        assert run["records_per_s"] > 0 and len(run["runs_mb_per_s"]) == 1
        assert run["driver_seconds_before_build"] >= 0 and run["driver_seconds_after_build"] >= 0
    assert out["raw_2_threads_durable"]["sync_seconds"] >= 0
    for ratio in ("ratio_spark_to_raw", "ratio_spark_to_raw_durable", "ratio_spark_median_to_raw"):
        assert out[ratio] > 0, ratio


@pytest.mark.slow
def test_the_table_benchmark_publishes_every_record_and_every_reader_agrees():
    """Tiny: the reconcile+publish path publishes every reconciled record (asserted per
    run), the four readers of the scan part return the same count and bytes (asserted
    inside), and each publish of the partitions part adds one file per touched partition."""
    out = _bench(
        "benchmarks/bench_table.py",
        "--gib",
        "0.004",
        "--partitions-1gib",
        "4",
        "--partitions",
        "40",
        "--repeat",
        "1",
        timeout=600,
    )
    rec = out["reconcile"]
    assert rec["reconcile_publish"]["runs"][0]["files_published"] >= 4
    assert rec["ratio_publish_overhead"] > -1
    scan = out["scan"]
    assert scan["records"] == rec["produce"]["records"] and scan["files"] >= 4
    assert scan["ratio_duckdb_table_to_files"] > 0 and scan["ratio_polars_table_to_files"] > 0
    (wide,) = out["partitions"]
    assert [wide[r]["files_added"] for r in ("first", "second", "one_percent")] == [40, 40, 1]
    assert wide["one_percent"]["table_metadata_bytes"] > wide["first"]["table_metadata_bytes"] > 0


@pytest.mark.slow
def test_the_compaction_benchmark_leaves_one_file_per_partition_and_every_reader_agrees():
    """Tiny: what it counts holds -- every small file replaced, the table's head down to
    one file a partition, the store down to the committed files after the GC, every
    reader returning every record once after expiry."""
    out = _bench(
        "benchmarks/bench_compaction.py",
        *("--partitions", "3", "--rounds", "10", "--per", "4", "--throughput-mib", "2", "--gc-files", "300"),
        *("--repeat", "1"),
        timeout=600,
    )
    life = out["lifecycle"]
    assert life["table_files_per_partition_before"] == 10 and life["table_files_per_partition_after"] == 1
    assert life["files_replaced"] == 30 == life["publish_compaction_files_removed"] == life["gc_retired_deleted"]
    assert life["scan_results_agree"] and life["ratio_l1_bytes_to_compacted"] == 1.0
    assert all(life["read_exactly_once_after_expiry"].values()), life
    assert out["throughput"]["files_replaced"] == 64 and out["throughput"]["ratio_compact_to_reconcile"] > 0
    assert out["gc"]["retired_deleted"] == out["gc"]["files_replaced"] == 300


@pytest.mark.slow
def test_the_request_benchmark_separates_what_a_partition_costs_from_what_a_run_costs():
    partitions, rounds = 6, 2
    out = _bench(
        "benchmarks/bench_requests.py",
        *("--partitions", str(partitions), "--warmup", "2", "--rounds", str(rounds), "--scenario", "idle"),
        *("--idle-lag", "2", "--marginal"),  # one advance of every partition in the two rounds
    )
    idle = out["idle"]
    m = idle["marginal"]
    assert m["outcome_twice"]["partitions_advanced"] == 2 * idle["outcome"]["partitions_advanced"] > 0
    # the identity it rests on: the counts at N are N partitions' worth plus the runs' own
    for op, n in idle["maintenance_calls"].items():
        per, fixed = m["per_partition_epoch"].get(op, 0.0), m["fixed_per_epoch"].get(op, 0.0)
        assert abs(per * partitions * rounds + fixed * rounds - n) < 0.01 * max(n, 1), op
    # the runs' fixed requests are what the figures spread over 6 partitions carried
    assert 0 < m["put_class"] < idle["put_class"] and 0 < m["get_class"] < idle["get_class"]
    assert m["fixed_per_epoch_classes"]["put_class"] > 0 and m["fixed_per_epoch_classes"]["get_class"] > 0
    at_100k, spread = out["cost_100k_idle_per_day_marginal"], out["cost_100k_idle_per_day"]
    assert 0 < at_100k["usd"] < spread["usd"]
