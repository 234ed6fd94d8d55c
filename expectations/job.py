"""The GC as one job, shared by ``ctp gc``/``ctp validate`` and the Airflow GC DAG:
the GX gate around :func:`ctp_state.gc.run.run_gc`, then the report."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import msgspec

from ctp_state.errors import CorruptData, GateFailed, ObjectNotFound
from ctp_state.gc import run_gate, run_gc
from ctp_state.gc.history import GcHistory
from ctp_state.gc.prepare import held_by
from ctp_state.gc.table_hook import TableHook
from ctp_state.records import GcRecord, HeldBy, Scalar
from ctp_state.settings import GcSettings
from ctp_state.storage import ObjectStore
from expectations.gate import GxGate, claim, kept_runs
from expectations.report import PartitionsView, partitions_view, publish, write_summary_page

REPORT_RUNS = 200  # runs shown on the summary page


def store_report_dir(root: str, store_url: str) -> str:
    """The report directory of one store under ``root``: ``<root>/<name>-<hash>``, the
    name being the URL's last path segment (or bucket) and the hash the first 12 hex of
    the SHA-256 of the redacted URL, so two stores never share (and so never overwrite)
    a report, and the same store always finds its own."""
    import hashlib
    import re

    from ctp_state.storage import redact_url

    url = redact_url(store_url).rstrip("/")
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", url.rsplit("/", 1)[-1] or "store")[:40].strip("._") or "store"
    digest = hashlib.sha256(url.encode()).hexdigest()[:12]
    return os.path.join(root, f"{name}-{digest}")


def default_report_dir(store_url: str, home: str) -> str:
    """The report directory of one store for a command: ``<home>/.ctp/reports/<name>-<hash>``
    (:func:`store_report_dir`; the DAGs keep theirs under ``$AIRFLOW_HOME/ctp/reports/``)."""
    return store_report_dir(os.path.join(home, ".ctp", "reports"), store_url)


def report_dir_from_env(env: Mapping[str, str], store_url: str) -> str:
    """``$CTP_REPORT_DIR`` from the caller's environment, else the store's own
    directory under ``$HOME/.ctp/reports/`` (:func:`default_report_dir`)."""
    if env.get("CTP_REPORT_DIR"):
        path = os.path.abspath(env["CTP_REPORT_DIR"])
        if os.path.exists(path) and not os.path.isdir(path):
            from ctp_state.errors import ConfigError

            raise ConfigError(f"CTP_REPORT_DIR {path} is not a directory")
        return path
    return default_report_dir(store_url, env.get("HOME") or os.path.expanduser("~"))


@dataclass
class GcOutcome:
    record: GcRecord | None
    report: str
    docs: str | None
    published: int = 0
    error: GateFailed | None = None


def write_report(
    store: ObjectStore, report_dir: str, gate: GxGate | None = None, *, publish_to_store: bool = False
) -> tuple[str, int]:
    claim(report_dir, store.url)  # before anything is written: the directory is this store's
    history = GcHistory(store)
    records = history.tail(REPORT_RUNS, unreadable=[])  # a damaged record must not stop the report
    docs_dir = gate.docs_dir if gate else GxGate(report_dir).docs_dir
    docs = os.path.join(docs_dir, "index.html")
    page = write_summary_page(
        report_dir,
        records,
        docs_index=docs if os.path.exists(docs) else None,
        partitions=newest_partitions(history, records),
        validations=kept_runs(docs_dir),
    )
    return page, publish(store, report_dir) if publish_to_store else 0


def newest_partitions(history: GcHistory, records: list[GcRecord]) -> PartitionsView | None:
    """The newest run's partition view that reads, worst first, for the report."""
    for r in reversed(records):
        if not r.partitions_key:
            continue
        try:
            return partitions_view(r.seq, r.partitions_key, history.read_partitions(r.partitions_key))
        except (CorruptData, ObjectNotFound):
            continue  # the report shows the newest view that reads
    return None


def gc_job(
    store: ObjectStore,
    config: GcSettings,
    report_dir: str,
    *,
    publish_to_store: bool = False,
    on_progress: Callable[[str, int, int], None] = lambda stage, done, total: None,
    tables: TableHook | None = None,
) -> GcOutcome:
    """Run one GC behind the GX gate and write the report. A failed gate is returned in
    ``error`` (the report shows it) rather than raised, so callers report first. A report
    directory of another store raises :class:`ConfigError` before anything is read."""
    gate = GxGate(report_dir, store_url=store.url)
    record, error = None, None
    try:
        record = run_gc(store, gate=gate, config=config, on_progress=on_progress, tables=tables)
    except GateFailed as e:
        error = e
    page, n = write_report(store, report_dir, gate, publish_to_store=publish_to_store)
    return GcOutcome(record, page, os.path.join(gate.docs_dir, "index.html"), n, error)


class Validation(msgspec.Struct, frozen=True, kw_only=True):
    """What ``ctp validate`` and the GC DAG's gate task report."""

    success: bool
    failures: tuple[str, ...]
    statistics: dict[str, Scalar]
    m: int | None
    cluster_epoch: int
    partitions: int
    docs: str | None
    held_by: tuple[HeldBy, ...]


def validate_job(
    store: ObjectStore, config: GcSettings, report_dir: str, *, tables: TableHook | None = None
) -> Validation:
    """The gate alone: nothing is listed for deletion, deleted or recorded."""
    gate = GxGate(report_dir, store_url=store.url)
    result, failures, p = run_gate(store, gate, config, tables=tables)
    return Validation(
        success=not failures,
        failures=tuple(failures),
        statistics=result.statistics,
        m=p.decision.m,
        cluster_epoch=p.cluster_epoch,
        partitions=len(p.views),
        docs=result.docs,
        held_by=tuple(held_by(h) for h in p.decision.held_by[:20]),
    )
