"""``ctp topic`` (create, delete, list) and ``ctp epoch`` (show, advance)."""

from __future__ import annotations

import time

import click
from rich.table import Table

from ctp_state.cli.framework import (
    AT_LEAST_1,
    TOPIC_NAME,
    _progress,
    command,
    emit,
    main,
)
from ctp_state.codec import JsonObject
from ctp_state.epoch import ClusterEpoch
from ctp_state.storage import ObjectStore, redact_url
from ctp_state.topic_meta import MAX_PARTITIONS

# --- topics -----------------------------------------------------------------------------


@main.group()
def topic() -> None:
    """Create, list and delete topics."""


@topic.command("create")
@click.argument("name", type=TOPIC_NAME)
@click.option("--partitions", "-p", type=click.IntRange(1, MAX_PARTITIONS), required=True, help="Number of partitions.")
@click.option("--exist-ok", is_flag=True, help="Succeed if the topic exists with this partition count.")
@click.option("--retention-ms", type=AT_LEAST_1, default=None, help="Drop L1 files whose newest record is this old.")
@click.option(
    "--retention-bytes", type=AT_LEAST_1, default=None, help="Keep at most about this many L1 bytes per partition."
)
@command(store="create")
def topic_create(
    store: ObjectStore,
    as_json: bool,
    name: str,
    partitions: int,
    exist_ok: bool,
    retention_ms: int | None,
    retention_bytes: int | None,
) -> None:
    """Create topic NAME (or finish a crashed creation). Retention (`ctp retention`
    applies it, Kafka's meaning) defaults to keeping everything; `ctp topic alter`
    changes it."""
    from ctp_state.errors import TopicNotFound
    from ctp_state.incarnations import set_retention
    from ctp_state.topics import create_topic, get_topic

    existed = False
    if exist_ok:  # (for the message only: create_topic decides)
        try:
            existed = get_topic(store, name).partitions == partitions
        except TopicNotFound:
            pass
    repaired: list[JsonObject] = []  # appended to from create_topic's pool threads
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
    if retention_ms is not None or retention_bytes is not None:
        set_retention(store, name, retention_ms, retention_bytes, expect_id=t.incarnation)
    repaired.sort(key=lambda r: int(r["partition"]))
    lines = [f"repaired {t.name}/{r['partition']}: {r['repair']}" for r in repaired]
    done = "topic {} exists with {} partitions" if existed else "created topic {} with {} partitions"
    emit(
        as_json,
        {"topic": t.name, "partitions": t.partitions, "id": t.id, "repaired": repaired, "existed": existed},
        "\n".join(lines + [done.format(t.name, t.partitions) + f" in {redact_url(store.url)}"]),
    )


def _retention_value(value: str | None, option: str) -> int | str | None:
    """An option's value: a positive integer, ``none`` (keep forever), or unset."""
    if value is None:
        return "unset"
    if value.lower() == "none":
        return None
    try:
        n = int(value)
    except ValueError:
        raise click.BadParameter(f"must be a positive integer or 'none', got {value!r}", param_hint=option) from None
    if n < 1:
        raise click.BadParameter(f"must be a positive integer or 'none', got {value!r}", param_hint=option)
    return n


@topic.command("alter")
@click.argument("name")
@click.option("--retention-ms", help="Milliseconds, or 'none' to keep records forever.")
@click.option("--retention-bytes", help="Bytes per partition, or 'none' for no size bound.")
@command
def topic_alter(
    store: ObjectStore, as_json: bool, name: str, retention_ms: str | None, retention_bytes: str | None
) -> None:
    """Change topic NAME's retention from now on (a record of its own in the name's
    history; an option left out keeps its value). `ctp retention` applies it."""
    from ctp_state.incarnations import read_name, set_retention

    ms = _retention_value(retention_ms, "--retention-ms")
    by = _retention_value(retention_bytes, "--retention-bytes")
    st = read_name(store, name)
    new_ms = st.retention_ms if ms == "unset" else ms
    new_bytes = st.retention_bytes if by == "unset" else by
    assert not isinstance(new_ms, str) and not isinstance(new_bytes, str)
    t, changed = set_retention(store, name, new_ms, new_bytes)
    emit(
        as_json,
        {"topic": name, "id": t.id, "retention_ms": new_ms, "retention_bytes": new_bytes, "changed": changed},
        f"topic {name}: retention.ms {new_ms if new_ms is not None else 'none'}, retention.bytes "
        f"{new_bytes if new_bytes is not None else 'none'}" + ("" if changed else " (unchanged)"),
    )


@topic.command("delete")
@click.argument("name")
@click.option(
    "--id",
    "expect_id",
    help="Delete only the incarnation with this id (as `topic list` shows). An id the topic's history does not "
    "record (a topic whose files vanished, stray logs; `legacy` for keys named by the topic) is recorded lost "
    "and deleted, as the GC's and `ctp verify`'s messages suggest.",
)
@command
def topic_delete(store: ObjectStore, as_json: bool, name: str, expect_id: str | None) -> None:
    """Delete topic NAME: a tombstone, then every partition log sealed; the GC removes
    the rest (logs, snapshots, L1 files) once the tombstone is older than its
    --topic-removal-grace-seconds. The name can be created again at once."""
    from ctp_state.deletion import delete_topic
    from ctp_state.gc.history import remembered

    with _progress() as progress:
        task = progress.add_task("sealing partition logs", total=None)
        t, res = delete_topic(
            store,
            name,
            expect_id=expect_id,
            remembered=lambda: remembered(store),
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
            "lost": res.lost,
            "errors": errors,
        },
        (
            f"incarnation {t.incarnation} of topic {t.name} ({t.partitions} partitions), which its history did not "
            f"record, is recorded lost and deleted in {store.url}; the GC no longer waits for it; "
            if res.lost
            else f"topic {t.name} (incarnation {t.incarnation}) was deleted already; its {t.partitions} partition logs "
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
