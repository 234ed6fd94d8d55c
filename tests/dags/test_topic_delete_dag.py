"""The topic-delete DAG (``airflow dags test`` with a form, a real metadata DB): a
confirm that does not repeat the name deletes nothing; a run deletes the live
incarnation; a second run pinned to the same id succeeds without touching the
incarnation created since."""

from __future__ import annotations

import json

import pytest

from ctp_state.incarnations import read_name
from ctp_state.topics import create_topic, get_topic
from tests.support.airflow import airflow


def dags_test(env, conf: dict) -> str:
    r = airflow(env, "dags", "test", "ctp_topic_delete", "--conf", json.dumps(conf), timeout=600)
    return r.stdout + r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["file"], indirect=True)  # (the DAGs on S3: test_dags_e2e.py)
def test_the_delete_dag_checks_the_form_pins_the_incarnation_and_is_safe_to_run_again(airflow_env, store):
    r = airflow(airflow_env, "db", "migrate")
    assert r.returncode == 0, r.stderr[-2000:]
    old = create_topic(store, "t", 2)

    out = dags_test(airflow_env, {"topic": "t", "confirm": "tt"})
    assert "confirm must repeat the topic name" in out and "state=failed" in out, out[-3000:]
    assert get_topic(store, "t") == old  # nothing deleted

    out = dags_test(airflow_env, {"topic": "t", "confirm": "t"})
    assert f"deleted topic t (incarnation {old.id}, 2 partitions)" in out and "state=success" in out, out[-3000:]
    assert [t.id for t, _ in read_name(store, "t").deleting] == [old.id]

    new = create_topic(store, "t", 2)  # re-created at once
    out = dags_test(airflow_env, {"topic": "t", "confirm": "t", "id": old.id})  # a rerun pinned to the old id
    assert f"deleted topic t (incarnation {old.id}" in out and "failed" not in out.lower().split("dagrun")[-1], out[
        -3000:
    ]
    assert get_topic(store, "t") == new  # the new incarnation is untouched
