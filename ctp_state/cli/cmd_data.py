"""``ctp``: the command line. It only parses, calls the library and prints.

Every command takes ``--store URL`` (default: ``$CTP_STORE``, else a local store under
``~/.ctp/store``), prints a human table by default and JSON with ``--json``, and exits
non-zero with a one-line cause on failure.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable
from functools import wraps
from typing import Any, overload

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from ctp_state import validate
from ctp_state.cli.demo import generate as generated_batches
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import CtpError
from ctp_state.l0 import Record
from ctp_state.records import encode
from ctp_state.settings import GcSettings, ReconcileSettings, from_options, options
from ctp_state.storage import ObjectStore, open_store, redact_url

DEFAULT_STORE = "file://" + os.path.join(os.path.expanduser("~"), ".ctp", "store")

err_console = Console(stderr=True)


def default_store_url() -> str:
    return os.environ.get("CTP_STORE") or DEFAULT_STORE


def fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


#: How a command opens its store: ``"read"`` refuses a ``file://`` store that does not
#: exist (a mistyped path must not read as an empty store), ``"create"`` creates it,
#: ``"flag"`` refuses unless ``--create-store`` is given.
StoreMode = str


@overload
def command(fn: Callable[..., Any]) -> Callable[..., Any]: ...


@overload
def command(fn: None = None, *, store: StoreMode = "read") -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...


def command(fn: Callable[..., Any] | None = None, *, store: StoreMode = "read") -> Any:
    """Add ``--store``/``--json`` (and ``--create-store`` for ``store="flag"``) and turn
    every error into one line: usage errors exit 2, everything else 1."""
    if fn is None:
        return lambda f: command(f, store=store)

    def wrapper(store_url: str, as_json: bool, create_store: bool = False, **kwargs: Any) -> None:
        from ctp_state.errors import StoreNotFound

        try:
            opened = open_store(store_url, os.environ, create=store == "create" or create_store)
            fn(opened, as_json, **kwargs)
        except click.ClickException:
            raise  # usage errors: _OneLineErrors prints "error: ..." and exits 2
        except StoreNotFound as e:
            hint = "ctp topic create creates it" + (", or pass --create-store" if store == "flag" else "")
            fail(f"{e}: check --store / $CTP_STORE; {hint}")
        except CtpError as e:
            fail(str(e))
        except (OSError, ValueError) as e:
            fail(f"{type(e).__name__}: {e}")
        except Exception as e:
            if os.environ.get("CTP_DEBUG"):
                raise
            fail(f"unexpected {type(e).__name__}: {e} (set CTP_DEBUG=1 for a traceback)")

    decorated: Callable[..., Any] = wraps(fn)(wrapper)
    if store == "flag":
        decorated = click.option(
            "--create-store", is_flag=True, help="Create the file:// store directory if it does not exist."
        )(decorated)
    decorated = click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")(decorated)
    return click.option(
        "--store",
        "store_url",
        default=default_store_url,
        show_default="$CTP_STORE or ~/.ctp/store",
        help="Store URL: file:///abs/path or s3://bucket/prefix.",
    )(decorated)


def emit(as_json: bool, data: Any, table: Table | str | None = None) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2, sort_keys=True))
    elif isinstance(table, str):
        click.echo(table)
    elif table is not None:
        # Piped output (logs, files, other programs) must not be cut to 80 columns.
        out = Console()
        if not out.is_terminal:
            out = Console(width=240)
        out.print(table)


class _OneLineErrors(click.Group):
    """Usage errors (a bad option value, a missing argument) print one line, as every
    other error does: ``error: Invalid value for '--limit': -1 is not in the range x>=0.``"""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            return super().main(*args, **kwargs)
        except click.exceptions.Exit as e:  # --help, --version
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("error: aborted", err=True)
            sys.exit(1)
        except click.ClickException as e:
            click.echo(f"error: {e.format_message()}", err=True)
            sys.exit(e.exit_code)


class _Seconds(click.ParamType):  # type: ignore[type-arg]
    """A finite number >= 0 (no nan, no inf)."""

    name = "seconds"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        try:
            f = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not (0 <= f < math.inf):
            self.fail(f"{value!r} is not a finite number >= 0", param, ctx)
        return f


SECONDS = _Seconds()


class _Positive(_Seconds):
    """A finite number > 0."""

    name = "number"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        f = super().convert(value, param, ctx)
        if f == 0:
            self.fail(f"{value!r} is not > 0", param, ctx)
        return f


POSITIVE = _Positive()
COUNT = click.IntRange(min=0)
AT_LEAST_1 = click.IntRange(min=1)


def settings_options(cls: type[Any], only: list[str]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """click options generated from a settings class (:mod:`ctp_state.settings`): the
    defaults and help live there once. Values arrive in the options' units, keyed by
    option name; :func:`from_options` turns them into settings."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        for o in reversed(options(cls, only)):
            k = o.knob
            if k.kind is bool:
                fn = click.option(o.flag, o.name, is_flag=True, default=o.default, help=k.help)(fn)
                continue
            if k.choices:
                typ: Any = click.Choice(k.choices)
            elif k.kind is int:
                typ = click.IntRange(min=int(k.minimum) if k.minimum is not None else None)
            else:
                typ = POSITIVE if k.above == 0 else SECONDS if k.minimum == 0 else float
            fn = click.option(
                o.flag, o.name, type=typ, default=o.default, show_default=o.default is not None, help=k.help
            )(fn)
        return fn

    return deco


@click.group(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """ctp: epoch-based reconciliation and garbage collection for object-storage topics."""


# --- topics -----------------------------------------------------------------------------


@main.group()
def topic() -> None:
    """Create, list and delete topics."""


@topic.command("create")
@click.argument("name")
@click.option("--partitions", "-p", type=int, required=True, help="Number of partitions.")
@click.option("--exist-ok", is_flag=True, help="Succeed if the topic exists with this partition count.")
@command(store="create")
def topic_create(store: ObjectStore, as_json: bool, name: str, partitions: int, exist_ok: bool) -> None:
    """Create topic NAME (or finish a crashed creation)."""
    from ctp_state.topics import create_topic

    repaired: list[dict[str, Any]] = []  # appended to from create_topic's pool threads
    with _progress() as progress:
        task = progress.add_task("writing partition inits", total=partitions)
        t = create_topic(
            store,
            name,
            partitions,
            exist_ok=exist_ok,
            on_repair=lambda p, what: repaired.append({"partition": p, "repair": what}),
            on_progress=lambda done, total: progress.update(task, completed=done, total=total),
        )
    repaired.sort(key=lambda r: int(r["partition"]))
    lines = [f"repaired {t.name}/{r['partition']}: {r['repair']}" for r in repaired]
    emit(
        as_json,
        {"topic": t.name, "partitions": t.partitions, "id": t.id, "repaired": repaired},
        "\n".join(lines + [f"created topic {t.name} with {t.partitions} partitions in {store.url}"]),
    )


@topic.command("delete")
@click.argument("name")
@click.option("--id", "expect_id", help="Delete only if the live incarnation has this id (as `topic list` shows).")
@command
def topic_delete(store: ObjectStore, as_json: bool, name: str, expect_id: str | None) -> None:
    """Delete topic NAME: a tombstone, then every partition log sealed; the GC removes
    the rest (logs, snapshots, L1 files) once the tombstone is older than its
    --topic-removal-grace-seconds. The name can be created again at once."""
    from ctp_state.deletion import delete_topic

    with _progress() as progress:
        task = progress.add_task("sealing partition logs", total=None)
        t, res = delete_topic(
            store,
            name,
            expect_id=expect_id,
            on_progress=lambda done, total: progress.update(task, completed=done, total=total),
        )
    errors = [{"partition": p, "error": why} for p, why in res.errors]
    emit(
        as_json,
        {
            "topic": t.name,
            "id": t.id,
            "partitions": t.partitions,
            "sealed": res.sealed + res.already,
            "already_deleted": res.already_deleted,
            "errors": errors,
        },
        (
            f"topic {t.name} (incarnation {t.incarnation}) was deleted already; its {t.partitions} partition logs "
            f"are sealed now in {store.url}; "
            if res.already_deleted
            else f"deleted topic {t.name} (incarnation {t.incarnation}, {t.partitions} partitions) in {store.url}; "
        )
        + (
            f"{len(errors)} partition logs could not be sealed now (the GC seals them before removing "
            f"anything; first: {t.name}/{errors[0]['partition']}: {errors[0]['error']}); "
            if errors
            else ""
        )
        + "the GC removes its state after the grace period",
    )


@topic.command("list")
@command
def topic_list(store: ObjectStore, as_json: bool) -> None:
    """List topics, with deleted ones whose state the GC has not removed yet."""
    from ctp_state.incarnations import all_names

    rows = []
    for st in all_names(store):
        for t, state in [(d, "deleting") for d, _ in st.deleting] + ([(st.current, "live")] if st.current else []):
            rows.append((t, state))
    table = Table("topic", "partitions", "created", "incarnation", "state")
    for t, state in rows:
        table.add_row(
            t.name,
            str(t.partitions),
            time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t.created_ms / 1000)),
            t.incarnation,
            state,
        )
    emit(
        as_json,
        [
            {"topic": t.name, "partitions": t.partitions, "created_ms": t.created_ms, "id": t.id, "state": state}
            for t, state in rows
        ],
        table if rows else "no topics",
    )


# --- epoch ------------------------------------------------------------------------------


@main.group()
def epoch() -> None:
    """Show or advance the cluster epoch."""


@epoch.command("show")
@command
def epoch_show(store: ObjectStore, as_json: bool) -> None:
    """Print the current cluster epoch."""
    c = ClusterEpoch(store).current()
    emit(as_json, {"epoch": c}, str(c))


@epoch.command("advance")
@command(store="flag")
def epoch_advance(store: ObjectStore, as_json: bool) -> None:
    """Atomically advance the cluster epoch by one and print the new value."""
    c = ClusterEpoch(store).advance()
    emit(as_json, {"epoch": c}, str(c))


# --- produce ----------------------------------------------------------------------------


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=err_console,
        transient=False,
        disable=not err_console.is_terminal,
    )


@main.command()
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True), required=False)
@click.option("--generate", is_flag=True, help="Produce synthetic records instead of reading FILE.")
@click.option("--topic", "topic_name", help="Topic for --generate.")
@click.option("--records", type=COUNT, default=10_000, show_default=True, help="Records to generate.")
@click.option("--value-size", type=COUNT, default=100, show_default=True, help="Bytes per generated value.")
@click.option(
    "--batch-records", type=AT_LEAST_1, default=5_000, show_default=True, help="Records per flush (one L0 object each)."
)
@click.option("--seed", type=int, default=None, help="Seed for --generate (repeatable data).")
@click.option(
    "--producer-id",
    default=None,
    help="A name for the producer. For FILE the id is this name plus a digest of FILE's bytes (default: "
    "the digest alone), so running the same command again never duplicates and the same name with "
    "other bytes is another producer; to write a file twice on purpose, give a new name. For "
    "--generate the id itself (default: a fresh one).",
)
@click.option(
    "--replay-limit",
    type=COUNT,
    default=200_000,
    show_default=True,
    help="A partition that forgot this producer id and holds one of its entries that the progress record "
    "cannot settle is replayed from its first entry if that entry's offset is at most this; beyond, its "
    "records are reported unknown with the offset.",
)
@command(store="flag")
def produce(
    store: ObjectStore,
    as_json: bool,
    file: str | None,
    generate: bool,
    topic_name: str | None,
    records: int,
    value_size: int,
    batch_records: int,
    seed: int | None,
    producer_id: str | None,
    replay_limit: int,
) -> None:
    """Produce records from a JSON-lines FILE ('-' for stdin) or with --generate.

    Each line: {"topic": ..., "partition": N, "value": "text" | "value_b64": "...",
    "key"/"key_b64", "headers": {"name": "text"}, "timestamp": ms}.

    Every record ends accepted (written now), a duplicate (written before, by an earlier
    run with the same producer id), rejected (not written), unknown (the store did not
    say; it may be written) or not sent (an earlier batch of its partition was not
    accepted). Exit 1 if any was rejected, else 3 if any outcome is unknown: running
    the same command again then writes what is missing and nothing twice.
    """
    from ctp_state.ingest import ProduceReport, input_producer_id, produce_input, send_batches
    from ctp_state.producer import Producer

    if generate == (file is not None):
        raise click.UsageError("give either FILE or --generate")
    if batch_records < 1:
        raise click.UsageError("--batch-records must be >= 1")
    started = time.monotonic()
    with _progress() as progress:
        task = progress.add_task("producing", total=records if generate else None)
        advance = lambda n: progress.advance(task, n)  # noqa: E731
        if generate:
            with Producer(store, producer_id=producer_id) as producer:
                report = ProduceReport(producer.producer_id)
                send_batches(
                    producer,
                    generated_batches(store, topic_name, records, value_size, batch_records, seed),
                    report,
                    records,
                    advance,
                )
        else:
            parsed, digest = _read_input(store, file)  # type: ignore[arg-type]
            progress.update(task, total=len(parsed))
            report = produce_input(
                store,
                parsed,
                producer_id=input_producer_id(digest, producer_id),
                digest=digest,
                batch_records=batch_records,
                on_progress=advance,
                replay_limit=replay_limit,
            )
    seconds = time.monotonic() - started
    total = report.accepted + report.duplicates + report.rejected + report.unknown + report.not_sent
    summary = {
        **report.as_dict(),
        "seconds": round(seconds, 3),
        "records_per_second": round(total / max(seconds, 1e-9)),
    }
    if report.completed_before is not None:
        text = (
            f"already written: producer id {report.producer_id} completed this input before "
            f"({report.completed_before.get('records')} records); nothing written"
        )
    else:
        text = (
            f"accepted {report.accepted} records"
            + (f", {report.duplicates} already written (not written twice)" if report.duplicates else "")
            + f", rejected {report.rejected}"
            + (f", unknown {report.unknown}" if report.unknown else "")
            + (f", not sent {report.not_sent}" if report.not_sent else "")
            + f" in {seconds:.1f}s"
            + (
                f" ({dict(report.rejected_by_reason)}; first: {report.first_error})"
                if report.rejected or report.unknown
                else ""
            )
        )
        for d in report.in_doubt:
            text += (
                f"\n{d['topic']}/{d['partition']} no longer remembers producer {report.producer_id}: records "
                f"{d['first_seq']}-{d['last_seq']} of its sequence may be in the log (entry {d['log_offset']}); "
                f"run again with --replay-limit {d['log_offset']} or more to settle it by reading the partition's "
                "log from its first entry"
            )
        if (report.unknown or report.not_sent) and not report.in_doubt:
            text += (
                "\nsome outcomes are unknown or records were not sent: run the same command again "
                f"(producer id {report.producer_id}); records already written are recognised and not written twice"
            )
    emit(as_json, summary, text)
    if report.rejected:
        sys.exit(1)
    if report.unknown or report.not_sent:
        sys.exit(3)


def _read_input(store: ObjectStore, file: str) -> tuple[list[tuple[str, int, Record]], str]:
    """Read and validate the whole input (bad input writes nothing); return the records
    and the input's SHA-256."""
    import io

    from ctp_state.errors import InvalidRecord
    from ctp_state.ingest import input_digest
    from ctp_state.jsonl import read_records
    from ctp_state.topics import get_topic

    name = "<stdin>" if file == "-" else file
    try:
        with click.open_file(file, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise CtpError(f"{name}: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise InvalidRecord(f"{name}:{line}", f"not UTF-8 (byte {e.start} of the file)") from None
    parsed = list(read_records(io.StringIO(text), name))
    topics: dict[str, Any] = {}
    for i, (t, p, _) in enumerate(parsed):
        try:
            if t not in topics:
                topics[t] = get_topic(store, t)
            topics[t].check_partition(p)
        except CtpError as e:
            raise CtpError(f"{name}: record {i + 1}: {e}") from None
    return parsed, input_digest(raw)


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
    rows = [facts(s) for s in read_states(store, select_topics(store, topics))]
    last = GcHistory(store).tail(1, unreadable=[])
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
                    {**encode(r), "published_offset": published.get((r.topic, r.partition))} for r in rows
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
        "reconciled",
        "published",
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
            str(r.last_reconciled_offset),
            str(published.get((r.topic, r.partition), "-")),
            str(r.writer_epoch),
        )
    emit(False, None, table if rows else "no partitions")
    if gc_last is None:
        click.echo("GC: no run yet")
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
    show_default="local[*]",
    help="Spark master.",
)
@click.option(
    "--remote",
    default=lambda: os.environ.get("SPARK_REMOTE") or None,
    help="Reconcile through this Spark Connect server (sc://host:port) instead of a local Spark "
    "[default: $SPARK_REMOTE].",
)
@settings_options(ReconcileSettings, ["target_file_bytes", "max_bytes_per_partition", "idle_lag", "claim_wait_s"])
@command(store="flag")
def reconcile(
    store: ObjectStore, as_json: bool, topics: tuple[str, ...], master: str, remote: str | None, **knobs: Any
) -> None:
    """Run the Spark reconciler (the same app Airflow submits) on a local Spark, a
    cluster master, or through a Spark Connect server."""
    from ctp_state.cli.spark import reconcile_with_spark

    settings = from_options(ReconcileSettings, knobs)
    for name in topics:
        validate.topic_name(name)
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
@click.option("--from", "from_offset", type=COUNT, default=0, show_default=True, help="First offset.")
@click.option("--limit", type=COUNT, default=None, help="At most this many records.")
@command
def read(
    store: ObjectStore, as_json: bool, topic_name: str, partition: int, from_offset: int, limit: int | None
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

    table = read_partition(store, topic_name, partition, from_offset, limit)
    # Milliseconds straight from the column: no datetime conversion that a timestamp
    # outside Python's range (written before ctp bounded them) could break.
    ms = table.column("timestamp").cast(pa.timestamp("ms", tz="UTC")).cast(pa.int64()).to_pylist()
    for row, ts in zip(table.drop_columns(["timestamp"]).to_pylist(), ms):
        headers = [(h["key"], h["value"]) for h in row["headers"] or ()]
        line = format_record(topic_name, partition, row["offset"], ts, row["key"], row["value"], headers)
        click.echo(json.dumps(line))  # ASCII: any terminal or pipe encoding takes it


# --- gc and validate -----------------------------------------------------------------


def _gc_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option(
        "--report-dir",
        type=click.Path(file_okay=False),
        default=None,
        help="Where the GX project, Data Docs and the GC summary page go [default: $CTP_REPORT_DIR, else this "
        "store's own directory under ~/.ctp/reports/].",
    )(fn)
    return settings_options(GcSettings, ["grace_s", "l1_grace_s"])(fn)


@main.command()
@settings_options(GcSettings, ["dry_run", "max_deletes", "in_flight"])
@click.option("--publish-report", is_flag=True, help="Also copy the report into the store under reports/gc/.")
@click.option(
    "--verify",
    "verify_first",
    is_flag=True,
    help="Run `ctp verify` first (every checksum and reference; slow); any error stops the GC.",
)
@settings_options(
    GcSettings,
    [
        "l1_full_sweep_s",
        "tmp_grace_s",
        "topic_removal_grace_s",
        "alert_stall_runs",
        "alert_stall_epochs",
        "table_keep_snapshots",
        "table_snapshot_max_age_s",
    ],
)
@_gc_options
@command
def gc(
    store: ObjectStore, as_json: bool, publish_report: bool, verify_first: bool, report_dir: str | None, **knobs: Any
) -> None:
    """Garbage-collect L0 objects with epoch <= M, behind the Great Expectations gate.

    Reads C, then every partition; M = min(C - 1, min M(p)); runs the checkpoint (M
    monotonic, partition states, L1 offsets) and deletes nothing if it fails; then
    deletes L0 objects at or below M and uncommitted L1 files; expires old snapshots of
    the topics' Iceberg tables (catalog: $CTP_CATALOG_URI, as for ctp table) and deletes
    their files nothing reaches; records the run in the GC history and writes the report.
    """
    from expectations.job import gc_job, report_dir_from_env

    config = from_options(GcSettings, knobs)
    tables = _table_hook(store, config)
    if verify_first:
        from ctp_state.verify import verify as run_verify

        checked = run_verify(store)
        for f in checked.errors:
            click.echo(f"  {f.severity}: {f.where}: {f.what}" + (f" [{f.key}]" if f.key else ""), err=True)
        if not checked.ok:
            fail(
                f"verify found {len(checked.errors)} problem(s), nothing deleted; first: "
                f"{checked.errors[0].where}: {checked.errors[0].what}"
            )
    report_dir = os.path.abspath(report_dir) if report_dir else report_dir_from_env(os.environ, store.url)
    with _progress() as progress:
        task = progress.add_task("reading partitions", total=None)

        def on_progress(stage: str, done: int, total: int) -> None:
            progress.update(task, description=stage, completed=done, total=total)

        out = gc_job(store, config, report_dir, publish_to_store=publish_report, on_progress=on_progress, tables=tables)
    if out.error is not None:
        if as_json:
            emit(True, {"status": "gate_failed", "failures": out.error.failures, "report": out.report})
        # One line: every failure is in the report (and in --json).
        fail(f"{out.error} (report: {out.report})")
    rec = out.record
    assert rec is not None  # gc_job returns a record or an error
    if as_json:
        emit(True, {**encode(rec), "report": out.report, "data_docs": out.docs, "published_files": out.published})
    else:
        if rec.dry_run:
            click.echo(
                f"dry run: would delete {rec.would_delete} L0 objects ({rec.would_delete_bytes} bytes) "
                f"and {rec.l1_orphans} L1 orphans ({rec.l1_orphan_bytes} bytes); nothing deleted"
            )
        else:
            click.echo(
                f"deleted {rec.deleted} L0 objects ({rec.deleted_bytes} bytes) and "
                f"{rec.l1_orphans_deleted} L1 orphans; {rec.delete_errors} failed"
            )
        click.echo(
            f"M = {rec.m} (C = {rec.cluster_epoch}, {rec.partitions} partitions); "
            f"listed {rec.listed}, too young {rec.skipped_too_young}; run {rec.seq} in {rec.seconds}s"
        )
        for h in rec.held_by[:10]:
            click.echo(f"  held at M by {h.where}: {'; '.join(h.reasons)}")
        if rec.held_by_count > 10:
            click.echo(f"  ... and {rec.held_by_count - 10} more")
        if rec.alert:
            click.echo(f"ALERT ({rec.alert.kind}): {rec.alert.message}")
        click.echo(f"report: {out.report}")
    if rec.status == "partial":
        fail(
            f"{rec.delete_errors} L0 object(s) and {rec.l1_delete_errors} L1 file(s) failed to "
            f"delete after retries (e.g. {next(iter(rec.failed_keys), '?')}); the next run retries them"
        )


def _table_hook(store: ObjectStore, config: GcSettings) -> Any:
    """The topics' Iceberg tables for a GC or its gate (catalog: $CTP_CATALOG_URI, as for ctp table)."""
    from ctp_state.table.catalog import CatalogConfig
    from ctp_state.table.maintenance import CatalogTables

    return CatalogTables.for_gc(store, CatalogConfig.from_env(os.environ), config, home=os.path.expanduser("~"))


@main.command(name="validate")
@_gc_options
@command
def validate_cmd(store: ObjectStore, as_json: bool, report_dir: str | None, **knobs: Any) -> None:
    """Run the Great Expectations checkpoint alone: nothing is deleted or recorded."""
    from expectations.job import report_dir_from_env, validate_job

    config = from_options(GcSettings, {**knobs, "dry_run": True})
    report_dir = os.path.abspath(report_dir) if report_dir else report_dir_from_env(os.environ, store.url)
    v = validate_job(store, config, report_dir, tables=_table_hook(store, config))
    if as_json:
        emit(True, encode(v))
    else:
        st = v.statistics
        click.echo(
            f"{'passed' if v.success else 'FAILED'}: {st.get('successful', 0)}/{st.get('evaluated', 0)} "
            f"expectations; M = {v.m} (C = {v.cluster_epoch}, {v.partitions} partitions)"
        )
        for f in v.failures:
            click.echo(f"  failed: {f}")
        click.echo(f"data docs: {v.docs}")
    if not v.success:
        fail(f"{len(v.failures)} expectation(s) failed: {v.failures[0]}")


@main.command()
@click.option("--topic", "topics", multiple=True, help="Only these topics (repeatable).")
@click.option("--no-objects", is_flag=True, help="Skip checking that referenced L0/L1 objects exist.")
@click.option("--deep", is_flag=True, help="Also read every committed L1 file whole (page checksums, offsets).")
@command
def verify(store: ObjectStore, as_json: bool, topics: tuple[str, ...], no_objects: bool, deep: bool) -> None:
    """Check every state-log entry and snapshot (checksums, agreement), offset 0, and
    that every L0/L1 object the state points at exists; change nothing.

    Reports problems per partition; exits 1 if any is an error.
    """
    from ctp_state.verify import verify as run_verify

    for name in topics:
        validate.topic_name(name)
    with _progress() as progress:
        task = progress.add_task("verifying partitions", total=None)
        report = run_verify(
            store,
            topics or None,
            check_objects=not no_objects,
            deep=deep,
            on_progress=lambda d, t: progress.update(task, completed=d, total=t),
        )
    if as_json:
        emit(True, report.to_json())
    else:
        for f in report.findings:
            click.echo(f"{f.severity}: {f.where}: {f.what}" + (f" [{f.key}]" if f.key else ""))
        n = len(report.partitions)
        click.echo(
            f"checked {n} partitions ({sum(p.entries for p in report.partitions)} entries, "
            f"{sum(p.l0_checked for p in report.partitions)} L0 chunks, "
            f"{sum(p.l1_checked for p in report.partitions)} L1 files): "
            f"{len(report.errors)} errors, {len(report.findings) - len(report.errors)} warnings"
        )
    if not report.ok:
        first = report.errors[0]
        fail(f"{len(report.errors)} problem(s), first: {first.where}: {first.what}")


# --- demo -------------------------------------------------------------------------------


@main.command()
@click.option("--topic", "topic_name", default="demo", show_default=True)
@click.option("--partitions", type=AT_LEAST_1, default=8, show_default=True)
@click.option("--rounds", type=AT_LEAST_1, default=4, show_default=True, help="Epoch advances, one flush each.")
@click.option("--records", type=COUNT, default=20_000, show_default=True, help="Records per round.")
@click.option(
    "--master",
    default=lambda: os.environ.get("CTP_SPARK_MASTER", "local[2]"),
    show_default="local[2]",
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
    """Run the end-to-end flow on this store and print what happened."""
    from ctp_state.cli.demo import run_demo

    say = (lambda _msg: None) if as_json else click.echo

    def reconcile() -> Any:
        from ctp_state.cli.spark import reconcile_with_spark

        return reconcile_with_spark(store, ReconcileSettings(), master=master, topics=[topic_name], app_name="ctp-demo")

    def gc(dry_run: bool) -> Any:
        from expectations.job import gc_job, report_dir_from_env

        out = gc_job(store, GcSettings(dry_run=dry_run), report_dir_from_env(os.environ, store.url))
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
        gc=None if no_gc else gc,
    )
    if as_json:
        emit(True, summary)
    else:
        click.echo(f"done in {summary['seconds']}s; inspect with: ctp status --store {redact_url(store.url)}")


if __name__ == "__main__":  # pragma: no cover
    main()
