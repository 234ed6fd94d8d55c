"""Airflow for the tests: a fresh metadata DB per test — PostgreSQL at 127.0.0.1:5432
in CI (``CI=true``, or ``CTP_TEST_POSTGRES=1``), SQLite elsewhere — and the environment
a real deployment would give the DAGs."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator

import pytest

from tests.support import REPO
from tests.support.airflow import BIN, PG, use_postgres


@pytest.fixture
def airflow_db(tmp_path) -> Iterator[str]:
    """SQLAlchemy URL of an empty metadata DB, migrated by the test's own Airflow."""
    if not use_postgres():
        yield f"sqlite:///{tmp_path}/airflow.db"
        return
    import psycopg

    name = f"ctp_af_{uuid.uuid4().hex[:12]}"
    with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=postgres", autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG + name
    finally:
        with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=postgres", autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def airflow_env(tmp_path, airflow_db, store_url) -> dict[str, str]:
    """Environment for Airflow processes over the test's store. On S3 the store and its
    credentials reach the DAGs only through the Variable ``ctp_store`` and the
    connection ``ctp_s3``, as in a deployment; nothing S3 is in the plain environment."""
    url, s3 = store_url
    drop = {
        "CTP_STORE",
        "CTP_S3_ENDPOINT_URL",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_DEFAULT_REGION",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "AWS_SESSION_TOKEN",
        "CTP_FAULT",
    }
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("AIRFLOW")}
    env.update(
        {
            "PATH": BIN + os.pathsep + env.get("PATH", ""),
            "AIRFLOW_HOME": str(tmp_path / "airflow"),
            "AIRFLOW__CORE__DAGS_FOLDER": os.path.join(REPO, "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": airflow_db,
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
            "CTP_REPORT_DIR": str(tmp_path / "report"),
        }
    )
    if s3:
        env["AIRFLOW_VAR_CTP_STORE"] = url
        env["AIRFLOW_CONN_CTP_S3"] = json.dumps(
            {
                "conn_type": "aws",
                "login": s3["AWS_ACCESS_KEY_ID"],
                "password": s3["AWS_SECRET_ACCESS_KEY"],
                "extra": {"endpoint_url": s3["CTP_S3_ENDPOINT_URL"], "region_name": s3["AWS_DEFAULT_REGION"]},
            }
        )
    else:
        env["CTP_STORE"] = url
    os.makedirs(env["AIRFLOW_HOME"], exist_ok=True)
    return env
