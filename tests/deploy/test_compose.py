"""docker-compose.yml and the Dockerfile, checked without a Docker engine: the services
of the multi-machine shape, one image built for all of them, ports, environment, every
connection and Variable the DAGs resolve, and the file's safety by default (no default
secret, loopback ports, pinned images, healthchecks), validated against the Compose
Specification's JSON schema (tests/deploy/compose_spec/, Apache-2.0, see its README)."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess

import jsonschema
import pytest
import yaml

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SPEC = os.path.join(os.path.dirname(__file__), "compose_spec", "compose-spec.json")
AIRFLOW = ["airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"]
SPARK = ["spark-master", "spark-worker"]
SECRETS = [
    "MINIO_ROOT_PASSWORD",
    "POSTGRES_PASSWORD",
    "AIRFLOW_ADMIN_PASSWORD",
    "AIRFLOW_JWT_SECRET",
    "AIRFLOW_SECRET_KEY",
]
# The values the file used to fall back to: none may come back as a default.
KNOWN_DEFAULTS = ["admin", "airflow", "ctp-minio-secret", "change-me-jwt-secret", "change-me-secret-key"]


class MissingVariable(Exception):
    pass


def interpolate(value, env: dict[str, str]):
    """Compose's interpolation of ``value`` (recursively), as ``docker compose`` does it:
    ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?error}``, ``$$``."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, arg = m.group(1), m.group(2) or "", m.group(3) or ""
        have = env.get(name)
        if op in (":-", "-"):
            return have if have or (op == "-" and have is not None) else arg
        if op in (":?", "?"):
            if not have:
                raise MissingVariable(f"{name}: {arg}")
            return have
        return have or ""

    return re.sub(r"\$\$|\$\{(\w+)(?:(:?[-?])([^}]*))?\}", one, value)


def generated_env(tmp_path) -> dict[str, str]:
    """The .env scripts/compose-env.sh writes, parsed."""
    path = tmp_path / "compose.env"
    subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "compose-env.sh"), str(path)], check=True, capture_output=True
    )
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#"))


@pytest.fixture(scope="module")
def raw() -> dict:
    with open(os.path.join(ROOT, "docker-compose.yml")) as f:
        return yaml.safe_load(f)


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    return generated_env(tmp_path_factory.mktemp("compose"))


@pytest.fixture(scope="module")
def compose(raw, env) -> dict:
    """The file as ``docker compose`` sees it with the generated .env."""
    return interpolate(raw, env)


def env_of(service: dict) -> dict[str, str]:
    e = service.get("environment") or {}
    if isinstance(e, list):
        e = dict(item.split("=", 1) for item in e)
    return {k: str(v) for k, v in e.items()}


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
    assert "127.0.0.1:8080:8080" in ports["airflow-apiserver"]
    assert "127.0.0.1:9000:9000" in ports["minio"] and "127.0.0.1:8081:8081" in ports["spark-master"]


def test_airflow_services_share_the_database_and_the_execution_api(compose):
    for name in ["airflow-init", *AIRFLOW]:
        env = env_of(compose["services"][name])
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg://airflow:")
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].endswith("@postgres:5432/airflow")
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
    # unset: the alert is logged and fails check_m, nobody is paged; the catalog comes
    # from $CTP_CATALOG_URI (compose sets it, below); a REST catalog's warehouse and
    # credentials (Variable ctp_catalog_warehouse, connection ctp_catalog) only with one
    optional = {"ctp_alert_callback", "ctp_catalog_uri", "ctp_catalog_warehouse"}
    optional_conns = {"ctp_catalog"}
    assert conn_ids == {"spark_default", "ctp_s3"} | optional_conns
    assert variables == {"ctp_store", "ctp_report_dir"} | optional
    variables -= optional
    conn_ids -= optional_conns
    for name in AIRFLOW:
        env = env_of(compose["services"][name])
        for cid in conn_ids:
            conn = json.loads(env[f"AIRFLOW_CONN_{cid.upper()}"])
            assert conn["conn_type"] in ("spark", "aws"), cid
        for var in variables:
            assert env[f"AIRFLOW_VAR_{var.upper()}"], var
        catalog = env["CTP_CATALOG_URI"]  # the compose PostgreSQL, a database of its own
        password = env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].split(":")[2].split("@")[0]
        assert catalog == f"postgresql+psycopg://airflow:{password}@postgres:5432/ctp_catalog"
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


# -- safe by default ----------------------------------------------------------------


def references(raw) -> list[tuple[str, str, str]]:
    """Every ``${NAME<op><arg>}`` in the file, as (name, op, arg)."""
    text = open(os.path.join(ROOT, "docker-compose.yml")).read()
    return re.findall(r"\$\{(\w+)(:?[-?]|)([^}]*)\}", text)


def test_no_secret_has_a_default_and_the_stack_refuses_to_start_without_each(raw, env):
    refs = references(raw)
    used = {name for name, _, _ in refs}
    assert set(SECRETS) <= used
    for name, op, arg in refs:
        if name in SECRETS:
            assert op == ":?" and "scripts/compose-env.sh" in arg, (name, op, arg)
    text = open(os.path.join(ROOT, "docker-compose.yml")).read()
    for value in KNOWN_DEFAULTS:  # no literal secret left anywhere either
        assert not re.search(rf"(PASSWORD|SECRET|password)[^\n]*[:=]\s*['\"]?{re.escape(value)}\b", text), value
    for name in SECRETS:
        without = {k: v for k, v in env.items() if k != name}
        with pytest.raises(MissingVariable, match=name):
            interpolate(raw, without)


def test_published_ports_listen_on_loopback_unless_asked_and_postgres_is_not_published(raw, env):
    for bind, expect in ((None, "127.0.0.1"), ("0.0.0.0", "0.0.0.0")):
        e = dict(env) if bind is None else {**env, "CTP_BIND_ADDRESS": bind}
        services = interpolate(raw, e)["services"]
        published = [(n, p) for n, s in services.items() for p in s.get("ports", [])]
        assert len(published) == 4, published  # Airflow, the S3 API and console, Spark's UI
        for name, port in published:
            assert isinstance(port, str) and port.split(":")[0] == expect and port.count(":") == 2, (name, port)
    assert "ports" not in raw["services"]["postgres"] and "expose" not in raw["services"]["postgres"]
    assert not any("7077" in p.split(":")[1] for p in interpolate(raw, env)["services"]["spark-master"]["ports"])


def test_every_image_is_pinned_to_an_exact_tag(compose):
    for name, s in compose["services"].items():
        image = s["image"]
        if s.get("build"):
            assert image == "ctp:latest", name  # built from this checkout, never pulled
            continue
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest", (name, image)
        if repo in ("minio/minio", "minio/mc"):
            assert re.fullmatch(r"RELEASE\.\d{4}-\d\d-\d\dT\d\d-\d\d-\d\dZ", tag), image
        elif repo == "postgres":
            assert re.fullmatch(r"16\.\d+", tag), image
        else:
            pytest.fail(f"unexpected image {image} in service {name}")


def test_every_long_running_service_has_a_healthcheck_and_waits_for_what_it_needs(compose):
    services = compose["services"]
    long_running = [n for n, s in services.items() if s.get("restart") != "no" and not s.get("profiles")]
    assert set(long_running) == {"minio", "postgres", *AIRFLOW, *SPARK}
    for name in long_running:
        check = services[name].get("healthcheck")
        assert check and check["test"][0] in ("CMD", "CMD-SHELL") and not check.get("disable"), name
    for name, s in services.items():
        deps = s.get("depends_on", {})
        assert isinstance(deps, dict), f"{name}: depends_on must name a condition"
        for dep, how in deps.items():
            want = "service_healthy" if dep in long_running else "service_completed_successfully"
            assert how["condition"] == want, (name, dep, how)
    assert "spark-master" in services["spark-worker"]["depends_on"]
    assert "airflow-apiserver" in services["airflow-scheduler"]["depends_on"]
    for job, name in (
        ("SchedulerJob", "airflow-scheduler"),
        ("DagProcessorJob", "airflow-dag-processor"),
        ("TriggererJob", "airflow-triggerer"),
    ):
        assert services[name]["healthcheck"]["test"][1:] == ["airflow", "jobs", "check", "--job-type", job, "--local"]


def test_the_file_is_valid_against_the_compose_specification_schema(raw, compose):
    with open(SPEC) as f:
        schema = json.load(f)
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.Draft7Validator(schema).validate(compose)
    with pytest.raises(jsonschema.ValidationError):  # the schema does reject a broken file
        jsonschema.Draft7Validator(schema).validate({**compose, "services": {"x": {"ports": {"bad": 1}}}})


def test_compose_env_writes_private_random_secrets_once_and_prints_none(tmp_path):
    path = tmp_path / ".env"
    script = os.path.join(ROOT, "scripts", "compose-env.sh")
    r = subprocess.run(["bash", script, str(path)], capture_output=True, text=True, check=True)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    values = dict(line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#"))
    assert sorted(values) == sorted(SECRETS)
    assert all(re.fullmatch(r"[0-9a-f]{32}", v) for v in values.values()) and len(set(values.values())) == 5
    assert not any(v in r.stdout + r.stderr for v in values.values())
    assert "admin" in r.stderr and "127.0.0.1:8080" in r.stderr
    before = path.read_text()
    r = subprocess.run(["bash", script, str(path)], capture_output=True, text=True, check=True)
    assert path.read_text() == before and "nothing changed" in r.stderr  # idempotent
    path.write_text(before.replace(f"POSTGRES_PASSWORD={values['POSTGRES_PASSWORD']}\n", "POSTGRES_PASSWORD=\n"))
    subprocess.run(["bash", script, str(path)], capture_output=True, text=True, check=True)
    again = dict(line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#"))
    assert again.keys() == values.keys() and again["POSTGRES_PASSWORD"] != values["POSTGRES_PASSWORD"]
    assert {k: v for k, v in again.items() if k != "POSTGRES_PASSWORD"} == {
        k: v for k, v in values.items() if k != "POSTGRES_PASSWORD"
    }
    assert ".env" in open(os.path.join(ROOT, ".gitignore")).read().split()
