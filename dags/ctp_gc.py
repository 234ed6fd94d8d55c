"""
### ctp: garbage-collect L0 behind the Great Expectations gate

Runs after every successful reconcile (the `ctp://reconcile/summary` Asset) or from the
trigger form. Tasks:

1. **gate** — reads the cluster epoch C, then every partition; computes the safe epoch
   **M = min(C - 1, min M(p))**; runs the Great Expectations gate (its own in-memory GX
   run): M non-null, never decreasing over the GC history and below C; every partition's
   lower bound never below the last run's, previous_applied ≤ max_applied, lower bound
   ≤ previous_applied, no pending placeholder at or below M; newly committed L1 files
   with unique, contiguous offsets.
   **If it fails, the DAG stops here and nothing is deleted**; the log lists each failed
   expectation. It does not retry: a failed invariant needs a person.
2. **verify** — with the `verify` param, `ctp verify` first: every state-log entry's and
   snapshot's checksum, snapshot/log agreement, offset 0, every referenced L0/L1 object.
   Any error fails the DAG here (no retry), nothing deleted. It reads every entry of
   every log, so it is off by default; turn it on after an incident. Without the
   param the task only says it was skipped.
3. **collect** — runs the GC: the same gate again immediately before deleting
   (the guard that protects the deletes), then deletes every L0 object with epoch ≤ M
   and uncommitted L1 files past their grace; expires the topics' Iceberg table
   snapshots beyond `table_keep_snapshots` older than `table_snapshot_max_age_hours`
   and deletes the table files nothing reaches (kind `table_metadata` on the audit
   trail; catalog as for the reconcile DAG's `publish`); and appends the run to the GC
   history (`gc/history/` in the store) with its state pack (`gc/packs/`): the next
   run starts from it and reads from their logs only the partitions that changed;
   every `full_read_every` runs (default 12) it reads every log. With `dry_run` it only
   counts what it would delete.
4. **check_m** — fails (no retry) when the run raised an **alert**: a partition is
   quarantined (a missing or corrupt L0 chunk: its M(p) cannot move until someone
   acts), or M stayed the same over the last `alert_stall_runs` GC runs (default 4)
   while C advanced by `alert_stall_epochs` (default 3; at least the reconciler's
   `idle_lag`) or more — a stuck claim, a dead
   or overloaded reconciler. The message names the partitions and why. Its
   `on_failure_callback` is the paging hook: set the Variable `ctp_alert_callback`
   (or `$CTP_ALERT_CALLBACK`) to `module:function` and it is called with the task
   context. `alert_stall_runs` = 0 turns the stall rule off.
5. **report** — writes the operator report (`index.html`: the alert, M and C over
   time, what holds M back, every partition's status worst first, deletes per run with
   their epochs and sample keys, every validation result linked) next to the Data Docs,
   readable offline, in the
   report directory (Variable `ctp_report_dir`, `$CTP_REPORT_DIR`, or the store's own
   `$AIRFLOW_HOME/ctp/reports/<store name>-<hash>/`); with `publish_report` also into the store under
   `reports/gc/`.

The `ctp://gc/history` Asset event of every run carries `m`, `cluster_epoch`,
`status`, `deleted`, `deleted_bytes`, `would_delete` and `alert` (Assets view in the UI).

**M not moving?** The report's "What holds M back" table names the partitions at M and
why (reconciler lag, a quarantined chunk, a stuck claim, idle). `max_active_runs=1`.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta

import pendulum
from airflow.sdk import Param, dag, task
from ctp_common import GC_ASSET, RECONCILE_ASSET, default_args, on_ctp_alert, open_store, resolve, settings_params

from ctp_state.settings import GcSettings

log = logging.getLogger(__name__)


def _config(params):
    from dataclasses import replace

    from ctp_state.settings import GcSettings, from_options

    return replace(from_options(GcSettings, params), sweep_topics=tuple(params["topics"]) or None)


def _tables(store, cfg, config):
    """The topics' Iceberg tables, through the catalog the deployment names."""
    from ctp_state.table.maintenance import CatalogTables

    catalog = cfg.catalog()
    return CatalogTables.for_gc(store, catalog, config, home=os.path.expanduser("~"))


@dag(
    dag_id="ctp_gc",
    schedule=[RECONCILE_ASSET],
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["ctp", "gc", "great_expectations"],
    doc_md=__doc__,
    params={
        **settings_params(
            GcSettings,
            [
                "dry_run",
                "max_deletes",
                "grace_s",
                "l1_grace_s",
                "l1_reader_grace_s",
                "topic_removal_grace_s",
                "alert_stall_runs",
                "alert_stall_epochs",
                "table_keep_snapshots",
                "table_snapshot_max_age_s",
                "full_read_every",
            ],
        ),
        "topics": Param(
            [],
            type="array",
            items={"type": "string"},
            description="Sweep L1 orphans only in these topics (M is always cluster-wide).",
        ),
        "publish_report": Param(False, type="boolean", description="Also copy the report into the store."),
        "verify": Param(
            False, type="boolean", description="Run `ctp verify` (every checksum and reference; slow) before deleting."
        ),
    },
    default_args=default_args(retries=1, retry_delay=timedelta(minutes=1), execution_timeout=timedelta(hours=1)),
)
def ctp_gc():
    @task(retries=0)
    def gate(params=None) -> dict:
        """The checkpoint alone; fails the DAG (no retry) if any expectation fails."""
        from airflow.sdk.exceptions import AirflowFailException

        from expectations.job import validate_job

        cfg = resolve()
        store, config = open_store(cfg), _config(params)
        v = validate_job(store, config, cfg.report_dir, tables=_tables(store, cfg, config))
        for f in v.failures:
            log.error("failed expectation: %s", f)
        log.info(
            "M = %s (C = %s, %s partitions); %s; data docs: %s",
            v.m,
            v.cluster_epoch,
            v.partitions,
            v.statistics,
            v.docs,
        )
        if not v.success:
            raise AirflowFailException(
                f"GC gate failed, nothing deleted: {v.failures[0]}"
                + (f" (and {len(v.failures) - 1} more)" if len(v.failures) > 1 else "")
            )
        return {"m": v.m, "cluster_epoch": v.cluster_epoch}

    @task(retries=0)
    def verify(params=None) -> dict:
        """`ctp verify` when the `verify` param asks; fails the DAG (no retry) on any error."""
        if not params.get("verify"):
            log.info("verify: skipped (set the `verify` param to check every checksum and reference first)")
            return {"verified": False}
        from airflow.sdk.exceptions import AirflowFailException

        from ctp_state.verify import verify as run_verify

        report = run_verify(open_store(resolve()))
        for f in report.findings:
            (log.error if f.severity == "error" else log.warning)("%s", f.line())
        log.info("verify: %d partitions, %d errors", len(report.partitions), len(report.errors))
        refusal = report.refusal()
        if refusal is not None:
            raise AirflowFailException(refusal)
        return {"verified": True}

    @task(outlets=[GC_ASSET])
    def collect(params=None, outlet_events=None) -> dict:
        """Delete L0 <= M (re-checked by the same gate first) and L1 orphans; record the run."""
        from ctp_state.errors import GateFailed, StateUnreadable
        from ctp_state.gc import run_gc
        from expectations.gate import GxGate

        cfg = resolve()

        def progress(stage: str, done: int, total: int) -> None:
            if stage == "delete" and (done == total or done % 10_000 < 1000):
                log.info("deleted %d/%d L0 objects", done, total)

        store = open_store(cfg)
        config = _config(params)
        tables = _tables(store, cfg, config)
        try:
            rec = run_gc(
                store,
                gate=GxGate(cfg.report_dir, store_url=store.url),
                config=config,
                on_progress=progress,
                tables=tables,
            )
        except (GateFailed, StateUnreadable) as e:  # nothing deleted; a person must look, not a retry
            from airflow.sdk.exceptions import AirflowFailException

            raise AirflowFailException(str(e)) from None
        from ctp_state.records import encode

        outlet_events[GC_ASSET].extra = {
            "seq": rec.seq,
            "status": rec.status,
            "m": rec.m,
            "cluster_epoch": rec.cluster_epoch,
            "deleted": rec.deleted,
            "deleted_bytes": rec.deleted_bytes,
            "would_delete": rec.would_delete,
            "partitions": rec.partitions,
            "alert": rec.alert.kind if rec.alert else None,
        }
        log.info(
            "GC run %s %s: M = %s (C = %s), deleted %s L0 objects (%s bytes), would delete %s, %s failed, in %ss",
            rec.seq,
            rec.status,
            rec.m,
            rec.cluster_epoch,
            rec.deleted,
            rec.deleted_bytes,
            rec.would_delete,
            rec.delete_errors,
            rec.seconds,
        )
        if rec.alert:
            log.warning("alert (%s): %s", rec.alert.kind, rec.alert.message)
        for h in rec.held_by[:10]:
            log.info("held at M by %s: %s", h.where, "; ".join(h.reasons))
        if rec.status == "partial":
            raise RuntimeError(
                f"{rec.delete_errors} object(s) failed to delete after retries "
                f"(e.g. {next(iter(rec.failed_keys), '?')}); the run is recorded, the next retries"
            )
        return encode(rec)  # the run's history record, as stored: check_m reads it typed

    @task(retries=0, on_failure_callback=on_ctp_alert)
    def check_m(run: dict) -> dict:
        """Fail (and call the alert hook) when the run raised an alert: M stalled or a
        partition quarantined. The GC itself has finished: this task only tells people."""
        from ctp_state.records import GcRecord, decode

        rec = decode(GcRecord, run, "the collect task's XCom")
        if rec.alert:
            from airflow.sdk.exceptions import AirflowFailException

            raise AirflowFailException(f"ctp alert ({rec.alert.kind}): {rec.alert.message}")
        log.info("no alert: M = %s, C = %s", rec.m, rec.cluster_epoch)
        return {"m": rec.m, "cluster_epoch": rec.cluster_epoch}

    @task(trigger_rule="all_done", retries=1)
    def report(params=None) -> str:
        """Write the offline report (also when the GC failed: the report shows why)."""
        from expectations.job import write_report

        cfg = resolve()
        page, n = write_report(open_store(cfg), cfg.report_dir, publish_to_store=bool(params["publish_report"]))
        log.info("report: %s%s", page, f" ({n} files published to reports/gc/)" if n else "")
        return page

    # Ordering only: collect runs the same gate again right before deleting.
    run = collect()
    gate() >> verify() >> run >> report()
    check_m(run)


ctp_gc()
