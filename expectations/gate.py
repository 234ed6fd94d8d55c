"""The checkpoint the GC runs before any delete, in a file-mode GX project.

The project lives under a report directory (``ctp gc --report-dir``, default
``./ctp-report``)::

    <report-dir>/inputs/<table>.parquet   the tables of the newest run (what was checked)
    <report-dir>/gx/                      the GX project: suites, validation definitions,
                                          the ``ctp_gc_gate`` checkpoint, Data Docs under
                                          gx/uncommitted/data_docs/local_site/

Suites are written from :mod:`expectations.suites` on every run: the code is the
source of truth, the YAML/JSON GX keeps is a copy. One report directory serves one GC
at a time.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ctp_state.gc_run import GateResult
from expectations.suites import SUITES

DATASOURCE = "ctp_gc"
CHECKPOINT = "ctp_gc_gate"


def _context(root: str) -> Any:
    # GX logs every datasource (de)serialisation at INFO; operators need its results.
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    ctx = gx.get_context(mode="file", project_root_dir=root)
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    ctx.variables.save()
    return ctx


def build_checkpoint(root: str) -> Any:
    """The GX context's checkpoint over the three GC tables, (re)written from code."""
    import great_expectations as gx

    inputs = os.path.join(root, "inputs")
    ctx = _context(root)
    ds = ctx.data_sources.add_or_update_pandas_filesystem(DATASOURCE, base_directory=inputs)
    definitions = []
    for name, make_suite in SUITES.items():
        asset = ds.get_asset(name) if name in ds.get_asset_names() else ds.add_parquet_asset(name)
        names = [b.name for b in asset.batch_definitions]
        batch = asset.get_batch_definition(name) if name in names else \
            asset.add_batch_definition_path(name, path=f"{name}.parquet")
        suite = ctx.suites.add_or_update(make_suite())
        definitions.append(ctx.validation_definitions.add_or_update(
            gx.ValidationDefinition(name=name, data=batch, suite=suite)))
    return ctx.checkpoints.add_or_update(gx.Checkpoint(
        name=CHECKPOINT, validation_definitions=definitions,
        actions=[gx.checkpoint.UpdateDataDocsAction(name="update_data_docs")],
        result_format={"result_format": "SUMMARY", "partial_unexpected_count": 10},
    )), ctx


def _short(kwargs: dict[str, Any]) -> str:
    keep = {k: v for k, v in kwargs.items() if k not in ("batch_id", "ignore_row_if", "result_format")}
    return ", ".join(f"{k}={v}" for k, v in keep.items())


def failures_of(result: Any) -> tuple[list[str], dict[str, int]]:
    failures: list[str] = []
    stats = {"evaluated": 0, "successful": 0, "unsuccessful": 0}
    for vr in result.run_results.values():
        suite = vr.suite_name
        for r in vr.results:
            stats["evaluated"] += 1
            if r.success:
                stats["successful"] += 1
                continue
            stats["unsuccessful"] += 1
            cfg = r.expectation_config
            res = r.result or {}
            why = (cfg.meta or {}).get("why")
            detail = f"{res.get('unexpected_count')} unexpected" if res.get("unexpected_count") is not None else "failed"
            sample = res.get("partial_unexpected_list")
            if sample:
                detail += f", e.g. {sample[:5]}"
            if r.exception_info and r.exception_info.get("raised_exception"):
                detail = "raised: " + str(r.exception_info.get("exception_message"))[:200]
            failures.append(f"{suite}: {cfg.type}({_short(cfg.kwargs)}) {detail}" + (f" [{why}]" if why else ""))
    return failures, stats


class GxGate:
    """A callable gate for :func:`ctp_state.gc_run.run_gc`."""

    def __init__(self, root: str, *, offline_docs: bool = True):
        self.root = os.path.abspath(root)
        self.offline_docs = offline_docs

    @property
    def docs_dir(self) -> str:
        return os.path.join(self.root, "gx", "uncommitted", "data_docs", "local_site")

    def __call__(self, frames: dict[str, pa.Table]) -> GateResult:
        missing = set(SUITES) - set(frames)
        if missing:
            raise ValueError(f"the gate needs tables {sorted(missing)}")
        inputs = os.path.join(self.root, "inputs")
        os.makedirs(inputs, exist_ok=True)
        for name in SUITES:
            pq.write_table(frames[name], os.path.join(inputs, f"{name}.parquet"))
        checkpoint, _ = build_checkpoint(self.root)
        result = checkpoint.run()
        failures, stats = failures_of(result)
        if self.offline_docs:
            from expectations.report import localize_data_docs

            localize_data_docs(self.docs_dir)
        return GateResult(bool(result.success) and not failures, failures, stats,
                          os.path.join(self.docs_dir, "index.html"))
