"""The L1 files' lifecycle: ``ctp compact`` (small files merged), ``ctp retention`` (each
topic's retention applied) and ``ctp delete-records`` (Kafka's DeleteRecords), each
through the partitions' state logs."""

from __future__ import annotations

from typing import Any

import click

from ctp_state import validate
from ctp_state.cli.framework import AT_LEAST_1, COUNT, _progress, command, emit, fail, main, settings_options
from ctp_state.settings import CompactSettings, from_options
from ctp_state.storage import ObjectStore


@main.command()
@click.argument("topics", nargs=-1)
@click.option("--dry-run", is_flag=True, help="Say which partitions and files would be compacted; change nothing.")
@settings_options(CompactSettings, ["target_file_bytes", "max_small_files", "lease_ms", "compression"])
@command
def compact(store: ObjectStore, as_json: bool, topics: tuple[str, ...], dry_run: bool, **knobs: Any) -> None:
    """Merge each partition's adjacent small L1 files (all topics, or TOPIC...) into
    files of about the target size, once a partition commits more small files than
    --max-small-files. Each merge commits through the partition's state log under an
    exclusive claim; the replaced files stay until `ctp gc` deletes them behind its gate."""
    from ctp_state.compact import run_compaction

    settings = from_options(CompactSettings, knobs)
    for name in topics:
        validate.topic_name(name)
    with _progress() as progress:
        task = progress.add_task("reading partitions", total=None)

        def on_progress(stage: str, done: int, total: int) -> None:
            progress.update(task, description=stage, completed=done, total=total)

        summary = run_compaction(
            store, topics=list(topics) or None, config=settings, dry_run=dry_run, on_progress=on_progress
        )
    if as_json:
        emit(True, summary.as_dict())
    else:
        verb = "would replace" if dry_run else "replaced"
        n = summary.count("planned") if dry_run else summary.count("compacted")
        click.echo(
            f"{verb} {summary.files_replaced} L1 files ({summary.bytes_in} bytes) "
            + ("" if dry_run else f"by {summary.files_written} ({summary.bytes_out} bytes, {summary.records} records) ")
            + f"in {n} partitions; {summary.seconds:.1f}s"
        )
        for p in summary.partitions:
            if p.status in ("error", "fenced", "claim_held"):
                click.echo(f"  {p.topic}/{p.partition}: {p.status}: {p.reason}")
    if summary.failed:
        fail(f"{len(summary.failed)} partition(s) were not compacted (see above)")


LEASE = click.option(
    "--lease-seconds", type=AT_LEAST_1, default=60, show_default=True, help="Claim lease of each partition it trims."
)


@main.command()
@click.argument("topics", nargs=-1)
@click.option("--dry-run", is_flag=True, help="Say which partitions would move their start offset; change nothing.")
@LEASE
@command
def retention(store: ObjectStore, as_json: bool, topics: tuple[str, ...], dry_run: bool, lease_seconds: int) -> None:
    """Apply each topic's retention (all topics, or TOPIC...; set by `ctp topic create
    --retention-*` or `ctp topic alter`): the oldest L1 files whose newest record is older
    than retention.ms, or that put the partition over retention.bytes, leave it (whole
    files, Kafka's meaning; never data not yet in L1). Each partition's start offset
    moves through its state log; the GC deletes the files behind its gate."""
    from ctp_state.retention import run_retention

    for name in topics:
        validate.topic_name(name)
    summary = run_retention(store, topics=list(topics) or None, dry_run=dry_run, lease_ms=lease_seconds * 1000)
    if as_json:
        emit(True, summary.as_dict())
    else:
        moved = [p for p in summary.partitions if p.status in ("trimmed", "planned")]
        verb = "would move" if dry_run else "moved"
        click.echo(
            f"{verb} the start offset of {len(moved)} partitions "
            f"({sum(p.files_dropped for p in moved)} L1 files out); {summary.seconds:.1f}s"
        )
        for p in summary.partitions:
            if p.status != "kept":
                click.echo(f"  {p.topic}/{p.partition}: {p.status}: {p.start_before} -> {p.start_after} ({p.reason})")
    if summary.failed:
        fail(f"{len(summary.failed)} partition(s) failed (see above)")


@main.command("delete-records")
@click.argument("topic_name")
@click.argument("partition", type=int)
@click.argument("offset", type=COUNT)
@LEASE
@command
def delete_records_cmd(
    store: ObjectStore, as_json: bool, topic_name: str, partition: int, offset: int, lease_seconds: int
) -> None:
    """Kafka's DeleteRecords: move TOPIC/PARTITION's start offset forward to OFFSET. Records
    before it are gone for `ctp read` at once; the L1 files wholly before it leave the
    table at the next publish and the store at a later GC. OFFSET must be in L1 already
    (at most the last reconciled offset + 1)."""
    from ctp_state.retention import delete_records

    r = delete_records(store, topic_name, partition, offset, lease_ms=lease_seconds * 1000)
    emit(
        as_json,
        r.__dict__,
        f"{topic_name}/{partition}: start offset {r.start_before} -> {r.start_after}"
        + ("" if r.status == "trimmed" else " (already there: nothing changed)"),
    )
