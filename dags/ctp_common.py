"""Shared wiring for the ctp DAGs: the Assets, and configuration resolved at run time.

Nothing here reads a connection or a Variable when a DAG file is parsed: the DAG
processor parses files every few seconds, and a parse-time lookup would hit the
metadata DB (or a secrets backend) each time. ``resolve()`` is called inside tasks.

Configuration, first match wins:

- store URL: Variable ``ctp_store``, else ``$CTP_STORE``, else a local store under
  ``$AIRFLOW_HOME/ctp/store``;
- S3 endpoint and credentials: connection ``ctp_s3`` (type aws: login = access key,
  password = secret key, extra ``{"endpoint_url": ..., "region_name": ...}``), else the
  environment (``CTP_S3_ENDPOINT_URL``, ``AWS_*``), else boto3's own sources;
- report directory: Variable ``ctp_report_dir``, else ``$CTP_REPORT_DIR``, else the
  store's own ``$AIRFLOW_HOME/ctp/reports/<store name>-<hash>/``;
- alert hook: Variable ``ctp_alert_callback``, else ``$CTP_ALERT_CALLBACK``, a
  ``module:function`` called with the task context when the GC DAG's ``check_m`` task
  fails (see :func:`on_ctp_alert`).
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Asset, Param

from ctp_state.codec import JsonObject
from ctp_state.settings import from_options, options, to_args

#: Updated by the epoch DAG after every advance; the reconcile DAG runs on it.
EPOCH_ASSET = Asset("ctp://cluster/epoch", group="ctp")
#: Updated by the reconcile DAG after every successful run; the GC DAG runs on it.
RECONCILE_ASSET = Asset("ctp://reconcile/summary", group="ctp")
#: Updated when the topics' Iceberg tables were published (after each reconcile).
TABLE_ASSET = Asset("ctp://tables", group="ctp")
#: Updated by the GC DAG after every run that passed the gate.
GC_ASSET = Asset("ctp://gc/history", group="ctp")

S3_CONN_ID = "ctp_s3"
SPARK_CONN_ID = "spark_default"
OWNER = "ctp"


@dataclass(frozen=True)
class CtpConfig:
    store: str
    report_dir: str
    env: dict[str, str] = field(default_factory=dict, repr=False)  # S3 settings; may hold secrets
    #: the Iceberg catalog's settings (CTP_CATALOG_*), from Variables and the
    #: ``ctp_catalog`` connection; may hold a password, a token or client credentials
    catalog_env: dict[str, str] = field(default_factory=dict, repr=False)

    def catalog(self) -> Any:
        """The :class:`ctp_state.table.catalog.CatalogConfig` these settings name."""
        from ctp_state.table.catalog import CatalogConfig

        return CatalogConfig.from_env({**os.environ, **self.env, **self.catalog_env})


def default_args(*, retries: int, retry_delay: timedelta, execution_timeout: timedelta) -> dict[str, object]:
    """Every ctp DAG's task defaults: the owner, and how often and how long its tasks
    may try (which differs per DAG)."""
    return {"owner": OWNER, "retries": retries, "retry_delay": retry_delay, "execution_timeout": execution_timeout}


def _home() -> str:
    return os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")


def _variable(name: str) -> str | None:
    from airflow.sdk import Variable

    # Absent -> None. Any other failure (a secrets backend down) propagates: silently
    # falling back to another store would be worse than failing the task.
    return Variable.get(name, default=None)


def _s3_env() -> dict[str, str]:
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = BaseHook.get_connection(S3_CONN_ID)
    except AirflowNotFoundException:  # the connection is optional: the environment may carry S3 settings
        return {}
    extra = conn.extra_dejson or {}
    env = {}
    if extra.get("endpoint_url"):
        env["CTP_S3_ENDPOINT_URL"] = str(extra["endpoint_url"])
    if extra.get("region_name"):
        env["AWS_DEFAULT_REGION"] = str(extra["region_name"])
    if conn.login:
        env["AWS_ACCESS_KEY_ID"] = conn.login
    if conn.password:
        env["AWS_SECRET_ACCESS_KEY"] = conn.password
    return env


def resolve() -> CtpConfig:
    """The store, the report directory and S3 settings, resolved now (inside a task)."""
    store = _variable("ctp_store") or os.environ.get("CTP_STORE") or "file://" + os.path.join(_home(), "ctp", "store")
    report = _variable("ctp_report_dir") or os.environ.get("CTP_REPORT_DIR") or store_report_dir(store)
    return CtpConfig(store, report, _s3_env(), _catalog_env())


CATALOG_CONN_ID = "ctp_catalog"


def _catalog_env() -> dict[str, str]:
    """The catalog settings Variables and the ``ctp_catalog`` connection give (the
    environment's ``CTP_CATALOG_*`` fill in the rest): Variables ``ctp_catalog_uri`` and
    ``ctp_catalog_warehouse``; the connection's password is a REST catalog's token, or
    with its login OAuth2 client credentials, and its extra may say ``auth``,
    ``oauth2_server_uri``, ``scope``, ``signing_name``, ``signing_region``."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    env = {}
    for name, value in (
        ("CTP_CATALOG_URI", _variable("ctp_catalog_uri")),
        ("CTP_CATALOG_WAREHOUSE", _variable("ctp_catalog_warehouse")),
    ):
        if value:
            env[name] = value
    try:
        conn = BaseHook.get_connection(CATALOG_CONN_ID)
    except AirflowNotFoundException:
        return env
    extra = conn.extra_dejson or {}
    for key, name in (
        ("auth", "CTP_CATALOG_AUTH"),
        ("oauth2_server_uri", "CTP_CATALOG_OAUTH2_URI"),
        ("scope", "CTP_CATALOG_SCOPE"),
        ("signing_name", "CTP_CATALOG_SIGNING_NAME"),
        ("signing_region", "CTP_CATALOG_SIGNING_REGION"),
        ("warehouse", "CTP_CATALOG_WAREHOUSE"),
    ):
        if extra.get(key) and name not in env:
            env[name] = str(extra[key])
    if conn.password:
        if conn.login:
            env["CTP_CATALOG_CREDENTIAL"] = f"{conn.login}:{conn.password}"
            env.setdefault("CTP_CATALOG_AUTH", "oauth2")
        else:
            env["CTP_CATALOG_TOKEN"] = conn.password
            env.setdefault("CTP_CATALOG_AUTH", "token")
    return env


def store_report_dir(store: str) -> str:
    """Each store's own report directory under ``$AIRFLOW_HOME/ctp/reports/``, so that
    two stores never share one (a report directory refuses a second store)."""
    from expectations.job import store_report_dir as under

    return under(os.path.join(_home(), "ctp", "reports"), store)


def open_store(cfg: CtpConfig):
    from ctp_state.storage import open_store as _open

    return _open(cfg.store, {**os.environ, **cfg.env})


def settings_params(cls: type[Any], only: Sequence[str]) -> dict[str, Param]:
    """Trigger-form Params generated from a settings class (``ctp_state.settings``):
    names, defaults, limits and help are defined there once, as for the CLI and the
    Spark app; ``ctp_state.settings.from_options(cls, params)`` reads them back."""
    out = {}
    for o in options(cls, only):
        k = o.knob
        kind = {bool: "boolean", int: "integer", float: "number", str: "string"}[k.kind]
        schema: JsonObject = {"type": kind if o.default is not None else ["null", kind]}  # a Param's JSON Schema
        if k.minimum is not None:
            schema["minimum"] = k.minimum
        if k.above is not None:
            schema["exclusiveMinimum"] = k.above
        if k.choices:
            schema["enum"] = list(k.choices)
        out[o.name] = Param(o.default, description=k.help, **schema)
    return out


class CtpSparkSubmitOperator(SparkSubmitOperator):
    """spark-submit of a ctp Spark app, with the store and its S3 settings resolved when
    the task runs (never at parse time) and passed as arguments and environment, not
    through XCom. ``settings`` is the app's settings class; the run's params (``topics``
    and the knobs in ``form``) become its arguments."""

    def __init__(self, *, settings: type[Any], form: Sequence[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ctp_settings = settings
        self.ctp_form = list(form)

    def execute(self, context):
        cfg = resolve()
        p = context["params"]
        args = ["--store", cfg.store, *to_args(from_options(self.ctp_settings, p), self.ctp_form)]
        for t in p.get("topics") or []:
            args += ["--topic", t]
        self.application_args = args
        self.env_vars = {**(self.env_vars or {}), **cfg.env}
        return super().execute(context)


def on_ctp_alert(context: Any) -> None:
    """``on_failure_callback`` of the GC DAG's ``check_m`` task: the hook point for
    paging. It logs the alert, then calls the ``module:function`` named by the Variable
    ``ctp_alert_callback`` (or ``$CTP_ALERT_CALLBACK``) with the task context -- e.g. a
    function that posts ``str(context["exception"])`` to a chat channel or a pager.
    A hook that itself fails is logged, never raised: the task has failed already."""
    log = logging.getLogger("ctp.alert")
    log.error("ctp alert: %s", context.get("exception"))
    target: str | None = "(Variable ctp_alert_callback)"
    try:
        target = _variable("ctp_alert_callback") or os.environ.get("CTP_ALERT_CALLBACK")
        if target:
            module, _, name = target.partition(":")
            getattr(importlib.import_module(module), name)(context)
    except Exception as e:
        log.error("the alert callback %r failed: %s: %s", target, type(e).__name__, e)


def repo_path(*parts: str) -> str:
    """A path inside the ctp checkout (the DAG folder is ``<repo>/dags``)."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), *parts)
