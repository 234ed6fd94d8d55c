"""``ctp table``: a topic's Iceberg table (publish, show, files)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import click
from rich.table import Table

from ctp_state.cli.framework import command, emit, main
from ctp_state.storage import ObjectStore
from ctp_state.table.catalog import CatalogConfig


def _catalog_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option(
        "--namespace",
        default=None,
        help="Iceberg namespace of the tables [default: $CTP_TABLE_NAMESPACE, else ctp].",
    )(fn)
    fn = click.option(
        "--catalog-warehouse",
        "catalog_warehouse",
        default=None,
        help="A REST catalog's warehouse, as the catalog names it [default: $CTP_CATALOG_WAREHOUSE]. "
        "Its authentication comes from $CTP_CATALOG_AUTH and friends (docs/tables.md).",
    )(fn)
    return click.option(
        "--catalog",
        "catalog_uri",
        default=None,
        help="Catalog: a SQLAlchemy URL (sqlite:///..., postgresql+psycopg://...) or a REST catalog's http(s) URI "
        "[default: $CTP_CATALOG_URI, else a SQLite file inside a file:// store, or under ~/.ctp/catalogs/]. "
        "Prefer the variable when the URL holds a password.",
    )(fn)


def _config(catalog_uri: str | None, namespace: str | None, warehouse: str | None = None) -> CatalogConfig:
    """The catalog settings of the environment, with the options given on top."""
    env = dict(os.environ)
    for name, value in (
        ("CTP_CATALOG_URI", catalog_uri),
        ("CTP_TABLE_NAMESPACE", namespace),
        ("CTP_CATALOG_WAREHOUSE", warehouse),
    ):
        if value:
            env[name] = value
    return CatalogConfig.from_env(env)


def _home() -> str:
    return os.path.expanduser("~")


@main.group()
def table() -> None:
    """A topic's Apache Iceberg table: its committed records, for any engine."""


@table.command("publish")
@click.argument("topics", nargs=-1)
@_catalog_options
@click.option(
    "--rebuild",
    is_flag=True,
    help="Drop each table and publish it again from the state log (a table whose files were lost; "
    "its snapshot history goes, its records do not).",
)
@command
def table_publish(
    store: ObjectStore,
    as_json: bool,
    topics: tuple[str, ...],
    catalog_uri: str | None,
    namespace: str | None,
    catalog_warehouse: str | None,
    rebuild: bool,
) -> None:
    """Append every committed L1 file not yet in its topic's table (all topics, or
    TOPICS), exactly once. Safe to run again, and beside another publisher. A head that
    names a lost published vector is repaired; one whose manifests are lost is rebuilt."""
    from ctp_state.table.jobs import publish_topics

    done = publish_topics(
        store,
        _config(catalog_uri, namespace, catalog_warehouse),
        home=_home(),
        topics=topics or None,
        rebuild=rebuild,
    )
    out = Table("table", "files added", "records added", "files removed", "format 1 copies", "snapshot")
    for p in done:
        out.add_row(
            p.table,
            str(p.files_added),
            str(p.records_added),
            str(p.files_removed),
            str(p.format1_copied),
            str(p.snapshot_id),
        )
    emit(as_json, [p.as_dict() for p in done], out if done else "no topics")


@table.command("show")
@click.argument("topic")
@_catalog_options
@command
def table_show(
    store: ObjectStore,
    as_json: bool,
    topic: str,
    catalog_uri: str | None,
    namespace: str | None,
    catalog_warehouse: str | None,
) -> None:
    """A topic's table: its head, and per partition what is reconciled and published."""
    from ctp_state.table.jobs import describe

    view = describe(store, _config(catalog_uri, namespace, catalog_warehouse), topic, home=_home())
    out = Table("partition", "reconciled through", "published through", "behind")
    for p in view.partitions:
        out.add_row(str(p.partition), str(p.reconciled), str(p.published), str(p.reconciled - p.published))
    head = (
        f"table {view.table}: snapshot {view.snapshot_id} ({view.snapshots} snapshots), {len(view.files)} files, "
        f"{sum(f.records for f in view.files)} records\nmetadata: {view.metadata_location}"
        if view.exists
        else f"table {view.table}: not published yet (ctp table publish {topic})"
    )
    if as_json:
        emit(True, view.as_dict())
    else:
        click.echo(head)
        emit(False, None, out)


@table.command("files")
@click.argument("topic")
@_catalog_options
@command
def table_files(
    store: ObjectStore,
    as_json: bool,
    topic: str,
    catalog_uri: str | None,
    namespace: str | None,
    catalog_warehouse: str | None,
) -> None:
    """The data files of a topic's table head, one per line: what a Spark job reads
    (spark.read.parquet(*paths))."""
    from ctp_state.table.jobs import describe

    view = describe(store, _config(catalog_uri, namespace, catalog_warehouse), topic, home=_home())
    if as_json:
        emit(True, [vars(f) for f in view.files])
    else:
        if view.snapshot_id is None:  # (stderr: stdout stays a list of paths for scripts)
            click.echo(f"table {view.table}: not published yet (ctp table publish {topic})", err=True)
        for f in view.files:
            click.echo(f.path)
