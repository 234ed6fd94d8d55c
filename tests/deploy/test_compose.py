"""docker-compose.yml and the Dockerfile, checked without a Docker engine: the services
of the multi-machine shape, one image built for all of them, ports, environment, and
every connection and Variable the DAGs resolve."""

from __future__ import annotations

import json
import os
import re

import pytest
import yaml

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
AIRFLOW = ["airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"]
SPARK = ["spark-master", "spark-worker"]


@pytest.fixture(scope="module")
def compose() -> dict:
    with open(os.path.join(ROOT, "docker-compose.yml")) as f:
        return yaml.safe_load(f)


def defaults(value: str) -> str:
    """Compose's ${VAR:-default} interpolation, with every variable unset."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: m.group(2), value)


def env_of(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: defaults(str(v)) for k, v in env.items()}


def test_the_services_of_the_multi_machine_shape(compose):
    services = compose["services"]
    for name in ["minio", "create-bucket", "postgres", "airflow-init", *AIRFLOW, *SPARK]:
        assert name in services, name
    for name in ["airflow-init", *AIRFLOW, *SPARK]:
        assert services[name]["build"] == "." and services[name]["image"] == "ctp:latest", name
    assert services["airflow-apiserver"]["command"].split()[:2] == ["airflow", "api-server"]
    assert "scheduler" in services["airflow-scheduler"]["command"]
    assert "dag-processor" in services["airflow-dag-processor"]["command"]
    assert "triggerer" in services["airflow-triggerer"]["command"]
    assert "deploy.master.Master" in services["spark-master"]["command"]
    assert "spark://spark-master:7077" in services["spark-worker"]["command"]


def test_ports(compose):
    ports = {name: s.get("ports", []) for name, s in compose["services"].items()}
    assert "8080:8080" in ports["airflow-apiserver"]
    assert "9000:9000" in ports["minio"] and "5432:5432" in ports["postgres"]
    assert "7077:7077" in ports["spark-master"]


def test_airflow_services_share_the_database_and_the_execution_api(compose):
    for name in ["airflow-init", *AIRFLOW]:
        env = env_of(compose["services"][name])
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith(
            "postgresql+psycopg://airflow:airflow@postgres:5432/"
        )
        assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://airflow-apiserver:8080/execution/"
        assert env["AIRFLOW__CORE__DAGS_FOLDER"] == "/opt/ctp/dags"
        deps = compose["services"][name]["depends_on"]
        assert deps["postgres"]["condition"] == "service_healthy"


def test_every_connection_and_variable_the_dags_use_is_defined(compose):
    src = "".join(
        open(os.path.join(ROOT, "dags", f)).read() for f in os.listdir(os.path.join(ROOT, "dags")) if f.endswith(".py")
    )
    conn_ids = set(re.findall(r'CONN_ID = "(\w+)"', src))
    variables = set(re.findall(r'_variable\("(\w+)"\)', src))
    optional = {"ctp_alert_callback"}  # unset: the alert is logged and fails check_m, nobody is paged
    assert conn_ids == {"spark_default", "ctp_s3"} and variables == {"ctp_store", "ctp_report_dir"} | optional
    variables -= optional
    for name in AIRFLOW:
        env = env_of(compose["services"][name])
        for cid in conn_ids:
            conn = json.loads(env[f"AIRFLOW_CONN_{cid.upper()}"])
            assert conn["conn_type"] in ("spark", "aws"), cid
        for var in variables:
            assert env[f"AIRFLOW_VAR_{var.upper()}"], var
        spark = json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"])
        assert (spark["host"], spark["port"]) == ("spark://spark-master", 7077)
        s3 = json.loads(env["AIRFLOW_CONN_CTP_S3"])
        assert s3["extra"]["endpoint_url"] == "http://minio:9000" and s3["login"] == "ctp"
    worker = env_of(compose["services"]["spark-worker"])  # executors open the store themselves
    assert worker["CTP_S3_ENDPOINT_URL"] == "http://minio:9000" and worker["AWS_SECRET_ACCESS_KEY"]


def test_the_dockerfile_carries_java_the_project_and_a_checked_pyspark():
    text = open(os.path.join(ROOT, "Dockerfile")).read()
    assert re.search(r"^FROM python:3\.11", text, re.M)
    assert "openjdk-17-jre-headless" in text
    for folder in ("ctp_state", "spark_apps", "expectations", "dags"):
        assert re.search(rf"^COPY {folder} ", text, re.M), folder
    assert "--force-reinstall pyspark==4.3.0" in text and "pyspark.__version__ == '4.3.0'" in text
    pinned = re.search(r'"pyspark==([\d.]+)"', open(os.path.join(ROOT, "pyproject.toml")).read()).group(1)
    assert f"pyspark=={pinned}" in text
