"""``ctp status``, ``ctp reconcile``, ``ctp read`` and ``ctp demo``."""

from __future__ import annotations

import json
import os
from typing import Any

import click
from rich.table import Table

from ctp_state import validate
from ctp_state.cli.framework import (
    AT_LEAST_1,
    COUNT,
    TOPIC_NAME,
    _progress,
    command,
    emit,
    fail,
    main,
    settings_options,
)
from ctp_state.epoch import ClusterEpoch
from ctp_state.records import encode
from ctp_state.settings import GcSettings, ReconcileSettings, from_options
from ctp_state.storage import ObjectStore, redact_url
from ctp_state.topic_meta import MAX_PARTITIONS

# --- status -----------------------------------------------------------------------------


@main.command()
@click.option("--topic", "topics", multiple=True, help="Only these topics (repeatable).")
@command
def status(store: ObjectStore, as_json: bool, topics: tuple[str, ...]) -> None:
    """Per partition: fence window, applied epochs, lower bound, M(p), reconcile lag,
    and the last record offset reconciled into L1 beside the last one published to the
    topic's Iceberg table (catalog: $CTP_CATALOG_URI, as for ctp table)."""
    from ctp_state.status import facts, read_states, select_topics
    from ctp_state.table.catalog import CatalogConfig
    from ctp_state.table.maintenance import CatalogTables

    for name in topics:
        validate.topic_name(name)
    from ctp_state.gc.history import GcHistory

    c = ClusterEpoch(store).current()
    # The tables first: published <= reconciled then holds in what is shown, too.
    published, table_errors = CatalogTables(
        store, CatalogConfig.from_env(os.environ), home=os.path.expanduser("~")
    ).published()
    for e in table_errors:
        click.echo(f"warning: a topic's table does not read: {e}", err=True)
    states = read_states(store, select_topics(store, topics))
    rows = [facts(s) for s in states]
    # (R11) where each partition starts, and how many L1 files it commits: what
    # `ctp compact` and retention act on
    l1 = {(s.topic, s.partition): (s.start_offset, len(s.l1_ends)) for s in states}
    unreadable: list[tuple[int, str]] = []
    last = GcHistory(store).tail(1, unreadable=unreadable)
    for seq, why in unreadable:  # (the next GC run goes on past it; `ctp verify` names it too)
        click.echo(f"warning: the newest GC record ({seq}) does not read: {why}", err=True)
    gc_last = last[-1] if last else None
    gc_json = (
        None
        if gc_last is None
        else {
            "seq": gc_last.seq,
            "status": gc_last.status,
            "m": gc_last.m,
            "cluster_epoch": gc_last.cluster_epoch,
            "finished_ms": gc_last.finished_ms,
            "alert": encode(gc_last.alert) if gc_last.alert else None,
        }
    )
    if as_json:
        emit(
            True,
            {
                "cluster_epoch": c,
                "store": redact_url(store.url),
                "gc": gc_json,
                "partitions": [
                    {
                        **encode(r),
                        "published_offset": published.get((r.topic, r.partition)),
                        "start_offset": l1[(r.topic, r.partition)][0],
                        "l1_files": l1[(r.topic, r.partition)][1],
                    }
                    for r in rows
                ],
            },
        )
        return
    table = Table(
        "topic",
        "part",
        "window",
        "applied",
        "prev",
        "lower bound",
        "M(p)",
        "end offset",
        "lag entries/records/bytes",
        "start",
        "reconciled",
        "published",
        "L1 files",
        "writer epoch",
        title=f"cluster epoch {c}",
    )
    for r in rows:
        w = r.window
        table.add_row(
            r.topic,
            str(r.partition),
            f"[{w[0]}, {w[1]}]" if w else "[]",
            str(r.max_applied_epoch),
            str(r.previous_applied_epoch),
            str(r.min_epoch_lower_bound),
            str(r.m),
            str(r.next_offset),
            f"{r.lag_entries}/{r.lag_records}/{r.lag_bytes}",
            str(l1[(r.topic, r.partition)][0]),
            str(r.last_reconciled_offset),
            str(published.get((r.topic, r.partition), "-")),
            str(l1[(r.topic, r.partition)][1]),
            str(r.writer_epoch),
        )
    emit(False, None, table if rows else "no partitions")
    if gc_last is None:
        click.echo(f"GC: the newest record ({unreadable[0][0]}) does not read" if unreadable else "GC: no run yet")
    else:
        click.echo(f"GC: last run {gc_last.seq} {gc_last.status}, M = {gc_last.m} (C = {gc_last.cluster_epoch})")
        if gc_last.alert:
            click.echo(f"ALERT ({gc_last.alert.kind}): {gc_last.alert.message}")


# --- reconcile and read -----------------------------------------------------------------


@main.command()
@click.option("--topic", "topics", multiple=True, help="Only these topics (repeatable).")
@click.option(
    "--master",
    default=lambda: os.environ.get("CTP_SPARK_MASTER", "local[*]"),
    show_default="$CTP_SPARK_MASTER or local[*]",
    help="Spark master.",
)
@click.option(
    "--remote",
    default=lambda: os.environ.get("SPARK_REMOTE") or None,
    help="Reconcile through this Spark Connect server (sc://host:port) instead of a local Spark "
    "[default: $SPARK_REMOTE].",
)
@settings_options(
    ReconcileSettings, ["target_file_bytes", "max_bytes_per_partition", "idle_lag", "tick_together", "claim_wait_s"]
)
@command(store="flag")
def reconcile(
    store: ObjectStore, as_json: bool, topics: tuple[str, ...], master: str, remote: str | None, **knobs: Any
) -> None:
    """Run the Spark reconciler (the same app Airflow submits) on a local Spark, a
    cluster master, or through a Spark Connect server."""
    from ctp_state.cli.spark import reconcile_with_spark
    from ctp_state.spark.session import inline_plan_mb
    from ctp_state.status import select_topics

    settings = from_options(ReconcileSettings, knobs)
    select_topics(store, topics)  # a topic that does not exist is one line before Spark starts
    inline_plan_mb(os.environ)
    with _progress() as progress:
        task = progress.add_task("starting Spark", total=None)

        def on_progress(stage: str, done: int, total: int) -> None:
            progress.update(task, description=f"{stage}", completed=done, total=total)

        summary = reconcile_with_spark(
            store, settings, master=master, remote=remote, topics=list(topics) or None, on_progress=on_progress
        )
    if as_json:
        emit(True, encode(summary))
    else:
        click.echo(
            f"reconciled {summary.records} records ({summary.l0_bytes} L0 bytes -> {summary.l1_files} L1 "
            f"files, {summary.l1_bytes} bytes) in {summary.partitions_reconciled} partitions; "
            f"advanced {summary.partitions_advanced} idle partitions; lag left {summary.lag_entries_left} "
            f"placeholders; {summary.seconds}s"
        )
        for p in summary.partitions:
            if p.failed or p.status == "claim_held":
                click.echo(f"  {p.topic}/{p.partition}: {p.status}: {p.reason}")
    if not summary.ok:
        fail(f"{len(summary.failed)} partition(s) were not reconciled (see the summary above)")


@main.command()
@click.argument("topic_name")
@click.argument("partition", type=int)
@click.option(
    "--from", "from_offset", type=COUNT, default=None, help="First offset (default: the partition's start offset)."
)
@click.option(
    "--from-start", is_flag=True, help="If --from is before the partition's start offset, read from the start offset."
)
@click.option("--limit", type=COUNT, default=None, help="At most this many records.")
@command
def read(
    store: ObjectStore,
    as_json: bool,
    topic_name: str,
    partition: int,
    from_offset: int | None,
    from_start: bool,
    limit: int | None,
) -> None:
    """Print a partition's records from an offset, across L1 and not-yet-reconciled L0,
    one JSON object per line.

    Keys, values and header values print as text when they are UTF-8, else as base64
    (key_b64/value_b64/headers_b64): the output is valid `ctp produce` input (its
    offsets are ignored there).
    """
    import pyarrow as pa

    from ctp_state.jsonl import format_record
    from ctp_state.read import read_partition

    table = read_partition(store, topic_name, partition, from_offset, limit, from_start=from_start)
    # Milliseconds straight from the column: no datetime conversion that a timestamp
    # outside Python's range (written before ctp bounded them) could break.
    ms = table.column("timestamp").cast(pa.timestamp("ms", tz="UTC")).cast(pa.int64()).to_pylist()
    for row, ts in zip(table.drop_columns(["timestamp"]).to_pylist(), ms):
        headers = [(h["key"], h["value"]) for h in row["headers"] or ()]
        line = format_record(topic_name, partition, row["offset"], ts, row["key"], row["value"], headers)
        click.echo(json.dumps(line))  # ASCII: any terminal or pipe encoding takes it


# --- demo -------------------------------------------------------------------------------


@main.command()
@click.option("--topic", "topic_name", type=TOPIC_NAME, default="demo", show_default=True)
@click.option("--partitions", type=click.IntRange(1, MAX_PARTITIONS), default=8, show_default=True)
@click.option("--rounds", type=AT_LEAST_1, default=4, show_default=True, help="Epoch advances, one flush each.")
@click.option("--records", type=COUNT, default=20_000, show_default=True, help="Records per round.")
@click.option(
    "--master",
    default=lambda: os.environ.get("CTP_SPARK_MASTER", "local[2]"),
    show_default="$CTP_SPARK_MASTER or local[2]",
    help="Spark master for the reconcile step.",
)
@click.option("--no-reconcile", is_flag=True, help="Skip the Spark reconcile step.")
@click.option("--no-gc", is_flag=True, help="Skip the GC step.")
@command(store="create")
def demo(
    store: ObjectStore,
    as_json: bool,
    topic_name: str,
    partitions: int,
    rounds: int,
    records: int,
    master: str,
    no_reconcile: bool,
    no_gc: bool,
) -> None:
    """Run the end-to-end flow on this store and print what happened (the topic's
    Iceberg table too: catalog from $CTP_CATALOG_URI, as for ctp table)."""
    from ctp_state.cli.demo import run_demo
    from ctp_state.table.catalog import CatalogConfig

    say = (lambda _msg: None) if as_json else click.echo

    def reconcile() -> Any:
        from ctp_state.cli.spark import reconcile_with_spark

        return reconcile_with_spark(store, ReconcileSettings(), master=master, topics=[topic_name], app_name="ctp-demo")

    catalog = CatalogConfig.from_env(os.environ)
    home = os.path.expanduser("~")

    def publish() -> Any:
        from ctp_state.table.jobs import publish_topics

        (done,) = publish_topics(store, catalog, home=home, topics=[topic_name])
        return done

    def gc(dry_run: bool) -> Any:
        from ctp_state.table.maintenance import CatalogTables
        from expectations.job import gc_job, report_dir_from_env

        settings = GcSettings(dry_run=dry_run)
        tables = CatalogTables.for_gc(store, catalog, settings, home=home)
        out = gc_job(store, settings, report_dir_from_env(os.environ, store.url), tables=tables)
        if out.error is not None:
            raise out.error
        return out.record, out.report

    summary = run_demo(
        store,
        topic=topic_name,
        partitions=partitions,
        rounds=rounds,
        records_per_round=records,
        say=say,
        reconcile=None if no_reconcile else reconcile,
        publish=None if no_reconcile else publish,
        gc=None if no_gc else gc,
    )
    if as_json:
        emit(True, summary)
    else:
        click.echo(f"done in {summary['seconds']}s; inspect with: ctp status --store {redact_url(store.url)}")


if __name__ == "__main__":  # pragma: no cover
    main()
