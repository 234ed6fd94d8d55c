"""The Spark compactor (``spark_apps/compact.py``) under spark-submit, as the L1
lifecycle DAG runs it: the compacted files are built in Spark tasks (``mapInArrow``)
and committed by the driver; killed at its commit point, a rerun converges. On the file
store (a Spark task's S3 side is the reconciler's, tested in tests/spark)."""

from __future__ import annotations

import json
import os

import pytest

from ctp_state.entries import Release
from tests.compact.test_compaction import files_of, many_small_files
from tests.support import assert_exactly_once, plog, with_this_checkout
from tests.support.spark import COMPACT_APP, spark_submit

pytestmark = pytest.mark.slow


def env_of(store) -> dict[str, str]:
    return with_this_checkout({**os.environ, "CTP_STORE": store.url})


def test_a_spark_compactor_killed_before_its_commit_changes_nothing_and_a_rerun_compacts_every_partition(fstore):
    store, subprocess_env = fstore, env_of(fstore)
    sent = many_small_files(store, rounds=3, partitions=2)
    r = spark_submit(
        {**subprocess_env, "CTP_FAULT": "compact_before_commit"}, "--max-small-files", "2", app=COMPACT_APP
    )
    assert r.returncode == -9, (r.returncode, r.stderr[-2000:])
    assert all(len(files_of(store, "t", p)) == 3 for p in sent)
    assert_exactly_once(store, "t", sent)
    for p in sent:  # (its claims: the lease, 15 minutes, stood in for by a release)
        log = plog(store, "t", p)
        st = log.read_state()
        for h in st.holders:
            st = log.append(st, lambda s, h=h: Release(h.owner, h.writer_epoch)).outcome.state
    r = spark_submit(subprocess_env, "--max-small-files", "2", app=COMPACT_APP)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)  # the files were built in Spark tasks, committed by the driver
    assert out["partitions_compacted"] == 2 and out["files_replaced"] == 6, out
    assert all(len(files_of(store, "t", p)) == 1 for p in sent)
    assert_exactly_once(store, "t", sent)
