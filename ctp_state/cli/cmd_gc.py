"""``ctp gc``, ``ctp validate`` and ``ctp verify``."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import click

from ctp_state import validate
from ctp_state.cli.framework import _progress, command, emit, fail, main, settings_options
from ctp_state.records import encode
from ctp_state.settings import GcSettings, from_options
from ctp_state.storage import ObjectStore

# --- gc and validate -----------------------------------------------------------------


def _gc_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option(
        "--report-dir",
        type=click.Path(file_okay=False),
        default=None,
        help="Where the GX project, Data Docs and the GC summary page go [default: $CTP_REPORT_DIR, else this "
        "store's own directory under ~/.ctp/reports/].",
    )(fn)
    return settings_options(GcSettings, ["grace_s", "l1_grace_s", "l1_reader_grace_s"])(fn)


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
        "full_read_every",
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
            click.echo(f"  {f.line()}", err=True)
        refusal = checked.refusal()
        if refusal is not None:
            fail(refusal)
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
                f"and {rec.l1_orphans} L1 orphans ({rec.l1_orphan_bytes} bytes) and {rec.l1_retired} replaced L1 "
                f"files ({rec.l1_retired_bytes} bytes); nothing deleted"
            )
        else:
            click.echo(
                f"deleted {rec.deleted} L0 objects ({rec.deleted_bytes} bytes) and "
                f"{rec.l1_orphans_deleted} L1 orphans and {rec.l1_retired_deleted} replaced L1 files "
                f"({rec.l1_retired_kept} kept for later"
                + (
                    f", {rec.l1_dropped_held} of them dropped by a trim nothing allows now"
                    if rec.l1_dropped_held
                    else ""
                )
                + f"); {rec.delete_errors} failed"
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
