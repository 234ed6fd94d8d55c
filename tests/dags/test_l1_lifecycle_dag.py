"""The L1 lifecycle DAG (``airflow dags test``, a real metadata DB, spark-submit through
``spark_default``): retention moves the start offsets, the Spark compactor merges the
small files, publish makes the table follow; every retained record reads once through
``ctp read`` and the table."""

from __future__ import annotations

import json
import os

import pytest

from ctp_state.incarnations import set_retention
from ctp_state.table.catalog import CatalogConfig
from ctp_state.table.jobs import describe
from tests.compact.test_compaction import files_of, many_small_files
from tests.support import plog
from tests.support.airflow import airflow


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["file"], indirect=True)  # (the DAGs on S3: test_dags_e2e.py)
def test_the_lifecycle_dag_trims_compacts_and_publishes(airflow_env, store):
    r = airflow(airflow_env, "db", "migrate")
    assert r.returncode == 0, r.stderr[-2000:]
    many_small_files(store, rounds=5, partitions=2)
    set_retention(store, "t", None, 1)  # retention.bytes 1: every file but the newest goes...
    r = airflow(
        airflow_env, "dags", "test", "ctp_l1_lifecycle", "--conf", json.dumps({"max_small_files": 2}), timeout=900
    )
    out = r.stdout + r.stderr
    assert "state=success" in out, out[-4000:]
    for p in range(2):
        st = plog(store, "t", p).read_state()
        assert st.start_offset == 20 and len(files_of(store, "t", p)) == 1  # ...so nothing is left to compact
    # a second topic without retention: compacted, not trimmed
    many_small_files(store, rounds=4, partitions=2, topic="u")
    r = airflow(
        airflow_env, "dags", "test", "ctp_l1_lifecycle", "--conf", json.dumps({"max_small_files": 2}), timeout=900
    )
    assert "state=success" in r.stdout + r.stderr, (r.stdout + r.stderr)[-4000:]
    for p in range(2):
        st = plog(store, "u", p).read_state()
        assert st.start_offset == 0 and len(files_of(store, "u", p)) == 1 and st.l1_tags[0] > 0
    home = airflow_env.get("HOME", os.path.expanduser("~"))
    table = describe(store, CatalogConfig.from_env(airflow_env), "u", home=home)
    assert sum(f.records for f in table.files) == committed_records(store, "u") == 40


def committed_records(store, topic: str) -> int:
    return sum(plog(store, topic, p).read_state().last_reconciled_offset + 1 for p in range(2))
