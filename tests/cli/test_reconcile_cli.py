"""What a new user does: produce, reconcile, read; and what Airflow sees on bad data."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from ctp_state.epoch import ClusterEpoch
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.topics import create_topic
from tests.support import corrupt_chunk, ctp, ok
from tests.support.spark import spark_submit


def test_produce_reconcile_read(subprocess_env, store, tmp_path):
    env = subprocess_env
    ok(env, "topic", "create", "orders", "-p", "4")
    ok(env, "epoch", "advance")
    ok(env, "produce", "--generate", "--topic", "orders", "--records", "4000", "--value-size", "50", "--seed", "1")
    summary = json.loads(ok(env, "reconcile", "--master", "local[2]", "--json", "--target-file-mb", "0.05"))
    assert summary["ok"] and summary["records"] == 4000 and summary["partitions_reconciled"] == 4
    lines = ok(env, "read", "orders", "2", "--from", "990", "--limit", "20").splitlines()
    rows = [json.loads(x) for x in lines]
    assert [r["offset"] for r in rows] == list(range(990, 1000))  # partition 2 holds 1000 records
    assert all(r["key"].startswith("key-") for r in rows)
    status = json.loads(ok(env, "status", "--json"))["partitions"]
    assert all(p["lag_records"] == 0 and p["last_reconciled_offset"] == 999 for p in status)
    # any Parquet reader can read the L1 files
    key = summary["partitions"][0]["l1_files"][0]
    local = tmp_path / "f.parquet"
    local.write_bytes(store.get(key))
    assert pq.read_table(local).column("offset")[0].as_py() == 0


def test_read_sees_unreconciled_records_too(subprocess_env):
    env = subprocess_env
    ok(env, "topic", "create", "t", "-p", "1")
    ok(env, "produce", "-", input='{"topic":"t","partition":0,"value":"a"}\n{"topic":"t","partition":0,"value":"b"}\n')
    assert [json.loads(x)["value"] for x in ok(env, "read", "t", "0").splitlines()] == ["a", "b"]
    r = ctp(env, "read", "t", "3")
    assert r.returncode == 1 and "partition 3 of topic 't' does not exist" in r.stderr


def test_quarantine_makes_spark_submit_exit_non_zero(subprocess_env, store):
    create_topic(store, "t", 2)
    ClusterEpoch(store).advance()
    with Producer(store) as prod:
        for p in range(2):
            assert prod.write([(("t", p), [Record(b"x"), Record(b"y")])])[0].accepted
    bad = corrupt_chunk(store, "t", 1)
    r = spark_submit(subprocess_env)
    assert r.returncode == 1, (r.returncode, r.stdout[-3000:], r.stderr[-3000:])
    # spark-submit merges the Python driver's stderr into stdout: summary, then the error.
    body, _, last = r.stdout.strip().rpartition("\n")
    summary = json.loads(body)
    assert summary["partitions_quarantined"] == 1 and summary["partitions_reconciled"] == 1
    assert last.startswith("error: 1 partition(s) not reconciled; first: t/1 quarantined") and bad in last
