"""I5: kill -9 the reconciler (the whole spark-submit application) at injected points,
rerun, and check that every accepted record is in L1 exactly once (I2)."""

from __future__ import annotations

import json
import os
import signal

import pytest

from ctp_state.read import committed_l1_keys
from tests.support import assert_exactly_once, plog, produce_rounds
from tests.support.spark import spark_submit

POINTS = [
    "after_claim",  # claims taken, nothing written
    "after_l1_write:1",  # in a Spark task, right after the second L1 file was written
    "before_commit",  # every L1 file written, nothing committed
    "after_commit:0",  # the first partition committed, the others maybe not
]


def killed(r) -> bool:
    return r.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL)


@pytest.mark.parametrize("point", POINTS)
def test_kill_9_then_rerun_converges(point, tmp_path):
    from ctp_state.storage import open_store

    url = f"file://{tmp_path}/store"
    store = open_store(url, os.environ)
    sent = produce_rounds(store, partitions=3, rounds=3, per=30)
    env = {**os.environ, "CTP_STORE": url}
    small = ["--target-file-mb", "0.003"]  # several files per partition

    crashed = spark_submit({**env, "CTP_FAULT": point}, "--lease-seconds", "2", *small)
    assert killed(crashed), (crashed.returncode, crashed.stderr[-2000:])

    rerun = spark_submit(env, "--claim-wait-seconds", "60", *small)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    summary = json.loads(rerun.stdout)
    assert summary["ok"] and summary["lag_entries_left"] == 0
    assert_exactly_once(store, "t", sent)
    # Every committed key exists; files of the crashed run are either the same keys
    # rewritten or orphans no commit names (the GC's to collect).
    for p in range(3):
        keys, _ = committed_l1_keys(plog(store, "t", p))
        assert keys and all(store.head(k) is not None for k in keys)


def test_kill_9_mid_write_on_s3_then_rerun_converges(s3_server):
    from ctp_state.storage import open_store

    url, s3env = s3_server.url("crash"), s3_server.env
    store = open_store(url, s3env)
    sent = produce_rounds(store, partitions=2, rounds=2, per=20)
    env = {**os.environ, **s3env, "CTP_STORE": url}
    crashed = spark_submit(
        {**env, "CTP_FAULT": "after_l1_write:1"}, "--lease-seconds", "2", "--target-file-mb", "0.002"
    )
    assert killed(crashed), crashed.stderr[-2000:]
    rerun = spark_submit(env, "--claim-wait-seconds", "60", "--target-file-mb", "0.002")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert_exactly_once(store, "t", sent)
