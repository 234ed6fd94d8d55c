"""DAG integrity, as Airflow's own example-DAG tests check it: the files import, each
DAG is documented, tagged, retried deliberately, and nothing reads a connection or a
Variable while the files are parsed."""

from __future__ import annotations

import os
from unittest import mock

import pytest

DAGS = os.path.join(os.path.dirname(__file__), "..", "..", "dags")

# Airflow's deprecations are errors here: an import or API that Airflow 3 moved fails
# the DAG tests instead of warning in every task log.
DEPRECATIONS = (
    "airflow.utils.deprecation_tools.DeprecatedImportWarning",
    "airflow.exceptions.RemovedInAirflow4Warning",
    "airflow.exceptions.AirflowProviderDeprecationWarning",
)
pytestmark = [pytest.mark.filterwarnings(f"error::{w}") for w in DEPRECATIONS]
EXPECTED = {"ctp_epoch_advance", "ctp_reconcile", "ctp_gc", "ctp_topic_delete", "ctp_l1_lifecycle"}


@pytest.fixture(scope="module")
def dagbag(tmp_path_factory):
    home = tmp_path_factory.mktemp("airflow-home")
    env = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "True",
        "AIRFLOW__CORE__DAGS_FOLDER": os.path.abspath(DAGS),
    }
    # Airflow puts the DAGs folder on sys.path, so DAG files share ctp_common.py.
    with mock.patch.dict(os.environ, env), mock.patch("sys.path", [os.path.abspath(DAGS), *__import__("sys").path]):
        from airflow.dag_processing.dagbag import DagBag
        from airflow.sdk import BaseHook, Variable

        def forbidden(*a, **k):
            raise AssertionError(f"read at parse time: {a}")

        with (
            mock.patch.object(BaseHook, "get_connection", side_effect=forbidden),
            mock.patch.object(Variable, "get", side_effect=forbidden),
        ):
            bag = DagBag(dag_folder=os.path.abspath(DAGS))
    return bag


def test_the_dag_files_import_without_errors_or_parse_time_lookups(dagbag):
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) == EXPECTED


@pytest.mark.parametrize("dag_id", sorted(EXPECTED))
def test_each_dag_is_documented_tagged_and_does_not_overlap(dagbag, dag_id):
    dag = dagbag.dags[dag_id]
    assert dag.doc_md and len(dag.doc_md) > 300 and "###" in dag.doc_md
    assert "ctp" in dag.tags
    assert dag.max_active_runs == 1
    assert dag.catchup is False
    for t in dag.tasks:
        assert t.retries is not None and t.execution_timeout is not None, t.task_id
        assert t.owner == "ctp"


def test_the_gc_gate_does_not_retry_and_the_report_always_runs(dagbag):
    dag = dagbag.dags["ctp_gc"]
    gate, verify, collect, report = (dag.get_task(t) for t in ("gate", "verify", "collect", "report"))
    assert gate.retries == 0 and verify.retries == 0  # a failed invariant needs a person, not a retry
    assert verify.upstream_task_ids == {"gate"} and collect.upstream_task_ids == {"verify"}
    assert report.upstream_task_ids == {"collect"}
    assert dag.params["verify"] is False  # off by default: it reads every entry of every log
    assert report.trigger_rule == "all_done"
    check = dag.get_task("check_m")
    assert check.upstream_task_ids == {"collect"} and check.retries == 0
    assert check.on_failure_callback  # the alert hook (ctp_common.on_ctp_alert)
    assert set(dag.params.keys()) == {
        "alert_stall_runs",
        "alert_stall_epochs",
        "dry_run",
        "topics",
        "max_deletes",
        "grace_seconds",
        "l1_grace_seconds",
        "l1_reader_grace_seconds",
        "topic_removal_grace_seconds",
        "table_keep_snapshots",
        "table_snapshot_max_age_hours",
        "full_read_every",
        "publish_report",
        "verify",
    }
    assert dag.params["dry_run"] is False


def test_reconcile_submits_the_spark_app_through_spark_default(dagbag):
    dag = dagbag.dags["ctp_reconcile"]
    op, publish = dag.get_task("spark_reconcile"), dag.get_task("publish")
    assert {t.task_id for t in dag.tasks} == {"spark_reconcile", "publish"}
    assert op.conn_id == "spark_default" if hasattr(op, "conn_id") else op._conn_id == "spark_default"
    assert op.application.endswith("spark_apps/reconcile.py") and os.path.exists(op.application)
    assert [a.uri for a in op.outlets] == ["ctp://reconcile/summary"]
    # the table follows the commits: published after the Spark app, as its own retried task
    assert publish.upstream_task_ids == {"spark_reconcile"} and [a.uri for a in publish.outlets] == ["ctp://tables/"]


def test_the_l1_lifecycle_trims_then_compacts_in_spark_then_publishes(dagbag):
    dag = dagbag.dags["ctp_l1_lifecycle"]
    retention, spark, publish = (dag.get_task(t) for t in ("retention", "spark_compact", "publish"))
    assert retention.upstream_task_ids == set() and retention.retries == 2
    assert spark.upstream_task_ids == {"retention"} and publish.upstream_task_ids == {"spark_compact"}
    assert spark.application.endswith("spark_apps/compact.py") and os.path.exists(spark.application)
    assert [a.uri for a in publish.outlets] == ["ctp://tables/"]
    assert set(dag.params.keys()) == {"topics", "max_small_files", "target_file_mb"}


@pytest.mark.parametrize(
    ("dag_id", "cls_name"),
    [("ctp_gc", "GcSettings"), ("ctp_reconcile", "ReconcileSettings"), ("ctp_l1_lifecycle", "CompactSettings")],
)
def test_the_trigger_forms_defaults_are_the_settings_defaults(dagbag, dag_id, cls_name):
    """A Param generated from a settings class keeps its default, limits and help."""
    import ctp_state.settings as s

    known = {o.name: o for o in s.options(getattr(s, cls_name))}
    params = dagbag.dags[dag_id].params
    offered = [n for n in params if n in known]
    assert offered
    for name in offered:
        assert params[name] == known[name].default, name
        assert params.get_param(name).description == known[name].knob.help
    # what the form sends back is what the job runs with
    assert s.from_options(getattr(s, cls_name), {n: params[n] for n in offered}) == getattr(s, cls_name)()


@pytest.mark.parametrize(
    "name",
    ["ctp_common.py", "ctp_epoch.py", "ctp_reconcile.py", "ctp_gc.py", "ctp_topic_delete.py", "ctp_l1_lifecycle.py"],
)
def test_every_import_in_the_dag_files_is_current(name):
    """Task bodies import lazily, so parsing the DAGs does not run their imports: run
    every import statement of the file, at any depth, with deprecations as errors."""
    import ast
    import importlib
    import sys
    import warnings

    tree = ast.parse(open(os.path.join(DAGS, name), encoding="utf-8").read())
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert imports
    categories = [getattr(importlib.import_module(w.rsplit(".", 1)[0]), w.rsplit(".", 1)[1]) for w in DEPRECATIONS]
    with mock.patch("sys.path", [os.path.abspath(DAGS), *sys.path]), warnings.catch_warnings():
        for c in categories:
            warnings.simplefilter("error", c)
        for node in imports:
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                continue
            for alias in node.names:  # a module imported once warns once: import each afresh
                module = node.module if isinstance(node, ast.ImportFrom) else alias.name
                for cached in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
                    if cached.startswith("airflow.exceptions"):
                        sys.modules.pop(cached)
            exec(compile(ast.Module([node], []), name, "exec"), {})


def test_the_deprecation_check_can_fail():
    """The old home of AirflowFailException still warns; the check above would catch it."""
    import importlib
    import sys
    import warnings

    from airflow.utils.deprecation_tools import DeprecatedImportWarning

    sys.modules.pop("airflow.exceptions", None)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecatedImportWarning)
        with pytest.raises(DeprecatedImportWarning, match="airflow.sdk.exceptions.AirflowFailException"):
            exec("from airflow.exceptions import AirflowFailException", {})
    importlib.import_module("airflow.exceptions")


def test_the_alert_hook_never_raises_even_when_its_variable_cannot_be_read(monkeypatch, caplog):
    """check_m has failed already: a secrets backend that is down, or a hook that is
    missing, is logged, not raised over the alert."""
    monkeypatch.syspath_prepend(os.path.abspath(DAGS))
    import ctp_common

    def down(name):
        raise RuntimeError("secrets backend unreachable")

    monkeypatch.setattr(ctp_common, "_variable", down)
    ctp_common.on_ctp_alert({"exception": "ctp alert (stall): M stalled"})
    assert "secrets backend unreachable" in caplog.text and "M stalled" in caplog.text
    monkeypatch.setattr(ctp_common, "_variable", lambda name: "no.such.module:page")
    ctp_common.on_ctp_alert({"exception": "x"})
    assert "no.such.module:page" in caplog.text


@pytest.mark.parametrize(
    ("conn", "auth", "field"),
    [
        ({"conn_type": "generic", "password": "a-bearer-token-1234"}, "token", "token"),
        (
            {"conn_type": "generic", "login": "client", "password": "a-client-secret-1234", "extra": {"scope": "s"}},
            "oauth2",
            "credential",
        ),
    ],
)
def test_a_rest_catalog_is_configured_from_variables_and_the_ctp_catalog_connection(monkeypatch, conn, auth, field):
    """The tasks' catalog: Variables ctp_catalog_uri and ctp_catalog_warehouse, the
    connection ctp_catalog's password (a token) or login and password (OAuth2 client
    credentials); the secret reaches the settings and never their repr."""
    import json

    monkeypatch.syspath_prepend(os.path.abspath(DAGS))
    import ctp_common

    monkeypatch.setenv("AIRFLOW_VAR_CTP_CATALOG_URI", "https://catalog.example/api/catalog")
    monkeypatch.setenv("AIRFLOW_VAR_CTP_CATALOG_WAREHOUSE", "lake")
    monkeypatch.setenv("AIRFLOW_CONN_CTP_CATALOG", json.dumps(conn))
    config = ctp_common.CtpConfig("file:///tmp/ctp", "/tmp/report", {}, ctp_common._catalog_env()).catalog()
    assert (config.uri, config.warehouse, config.auth) == ("https://catalog.example/api/catalog", "lake", auth)
    assert conn["password"] in (getattr(config, field) or "")
    assert conn["password"] not in repr(config) and conn["password"] not in repr(ctp_common.resolve())
