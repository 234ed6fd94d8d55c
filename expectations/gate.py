"""The gate the GC runs before any delete: one isolated Great Expectations run per call.

Each call builds its own in-memory (ephemeral) GX context, hands it the tables it was
given as pandas dataframes (``batch_parameters={"dataframe": df}``), validates them
against the suites from :mod:`expectations.suites` (the code is the source of truth)
and decides from those results alone. No file feeds the decision: GCs that share a
report directory cannot judge each other's tables or rewrite each other's suites.

Data Docs for operators go into the report directory (``ctp gc --report-dir``, default
``~/.ctp/reports/<store name>-<hash>/``, one per store)::

    <report-dir>/ctp-store.json                  the store this directory belongs to
    <report-dir>/gx/uncommitted/data_docs/local_site/
        index.html                               every gate run, newest first
        runs/<run>.html, runs/<run>.json         one run: verdict, failures, its pages
        validations/<suite>/<run>/<time>/*.html  GX's validation results, one set per run
        expectations/<suite>.html                GX's suite pages
        static/                                  GX's images and styles
    <report-dir>/gx/building/<run>-*/            a run's private render directory
    <report-dir>/gx/docs.lock                    held while a run publishes its pages

A run renders and localizes its pages (:func:`expectations.report.localize_data_docs`)
in its private directory; then, holding an exclusive ``flock`` on ``docs.lock``, it
moves them into the site (validation pages to paths named by its run, so no other run
writes there; shared pages by atomic rename) and rewrites the run list and index. The
newest :data:`KEEP_RUNS` runs are kept. The run name is ``gc-<seq>-m<M>-<GC run id>``
from the candidate row of ``gc_history`` (:func:`run_name_of`), so a history record and
its pages name the same run, and a listing of the validation folders reads as the GC
history does.

A report directory belongs to one store (:func:`claim`): GC histories, summary pages
and Data Docs of two stores must not mix.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec
import pyarrow as pa

from ctp_state.codec import JsonObject
from ctp_state.errors import ConfigError
from ctp_state.gc import GateResult
from expectations.report import GateRun, write_atomic
from expectations.suites import SUITES

DATASOURCE = "ctp_gc"
SITE = "local_site"
#: BASIC gives what a failure line and its page show (the unexpected count and up to ten
#: unexpected values); SUMMARY added value counts and row indexes nobody read, and took
#: half of each validation's time.
RESULT_FORMAT = {"result_format": "BASIC", "partial_unexpected_count": 10}
KEEP_RUNS = 200  # gate runs kept in the Data Docs site
STALE_BUILD_S = 3600  # private render directories older than this were left by killed runs
MARKER = "ctp-store.json"

# GX keeps an ambient "current project" per process: one gate run at a time per process.
_IN_PROCESS = threading.Lock()


# --- the report directory belongs to one store ------------------------------------------------


def claim(report_dir: str, store_url: str) -> None:
    """Make ``report_dir`` this store's on first use; raise :class:`ConfigError` if it
    belongs to another store. ``store_url`` must be redacted (``ObjectStore.url`` is)."""
    report_dir = os.path.abspath(report_dir)
    marker = os.path.join(report_dir, MARKER)
    os.makedirs(report_dir, exist_ok=True)
    if not os.path.exists(marker):
        body = (
            json.dumps(
                {
                    "store": store_url,
                    "claimed_ms": int(time.time() * 1000),
                    "note": "this report directory belongs to this store; give each store its own --report-dir",
                },
                indent=2,
            )
            + "\n"
        )
        fd, tmp = tempfile.mkstemp(prefix=".ctp-store-", dir=report_dir)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(body)
            try:
                os.link(tmp, marker)  # create-if-absent, complete or not at all
            except FileExistsError:
                pass
            except OSError:  # a file system without hard links: create-if-absent, then write
                with contextlib.suppress(FileExistsError), open(marker, "x", encoding="utf-8") as f:
                    f.write(body)
        finally:
            os.unlink(tmp)
    try:
        with open(marker, encoding="utf-8") as f:
            owner = json.load(f)["store"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"report directory {report_dir} has an unreadable store marker {marker} ({e}); "
            f"delete it if the directory is {store_url}'s, or use a different --report-dir"
        ) from None
    if owner != store_url:
        raise ConfigError(
            f"report directory {report_dir} belongs to store {owner}, not {store_url} "
            f"(see {marker}); use a different --report-dir (or $CTP_REPORT_DIR) for each store"
        )


# --- one isolated GX run -------------------------------------------------------------------------


def _context(site_dir: str) -> Any:
    """An in-memory GX context whose only Data Docs site is ``site_dir``."""
    # GX logs every datasource (de)serialisation at INFO; operators need its results.
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    from expectations.views import section_views

    config = DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
        data_docs_sites={
            SITE: {
                "class_name": "SiteBuilder",
                "show_how_to_buttons": False,
                "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": site_dir},
                "site_section_builders": section_views(),
            }
        },
        analytics_enabled=False,
        progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False),
    )
    return gx.get_context(mode="ephemeral", project_config=config)


def validate_frames(ctx: Any, frames: dict[str, pa.Table], run_name: str) -> tuple[list[Any], dt.datetime]:
    """Validate each table against its suite in ``ctx``; the results, in suite order."""
    import great_expectations as gx
    from great_expectations.core.run_identifier import RunIdentifier

    run_time = dt.datetime.now(dt.UTC)
    run_id = RunIdentifier(run_name=run_name, run_time=run_time)
    source = ctx.data_sources.add_pandas(DATASOURCE)
    results = []
    for name, make_suite in SUITES.items():
        batch = source.add_dataframe_asset(name).add_batch_definition_whole_dataframe(name)
        suite = ctx.suites.add(make_suite())
        definition = ctx.validation_definitions.add(gx.ValidationDefinition(name=name, data=batch, suite=suite))
        results.append(
            definition.run(
                batch_parameters={"dataframe": frames[name].to_pandas()}, run_id=run_id, result_format=RESULT_FORMAT
            )
        )
    return results, run_time


def _short(kwargs: JsonObject) -> str:  # an expectation's kwargs, as GX gives them
    keep = {k: v for k, v in kwargs.items() if k not in ("batch_id", "ignore_row_if", "result_format")}
    return ", ".join(f"{k}={v}" for k, v in keep.items())


def failures_of(results: Iterable[Any]) -> tuple[list[str], dict[str, int]]:
    """One line per failed expectation, and counts, from suite validation results (or a
    checkpoint result)."""
    if hasattr(results, "run_results"):
        results = results.run_results.values()
    failures: list[str] = []
    stats = {"evaluated": 0, "successful": 0, "unsuccessful": 0}
    for vr in results:
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
            detail = (
                f"{res.get('unexpected_count')} unexpected" if res.get("unexpected_count") is not None else "failed"
            )
            sample = res.get("partial_unexpected_list")
            if sample:
                detail += f", e.g. {sample[:5]}"
            if r.exception_info and r.exception_info.get("raised_exception"):
                detail = "raised: " + str(r.exception_info.get("exception_message"))[:200]
            failures.append(f"{suite}: {cfg.type}({_short(cfg.kwargs)}) {detail}" + (f" [{why}]" if why else ""))
    return failures, stats


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def run_name_of(frames: dict[str, pa.Table]) -> str:
    """The validation run's name, from the candidate row of ``gc_history``:
    ``gc-<seq>-m<M>-<GC run id>`` (the seq the run will try to own, the candidate M),
    so the Data Docs name the GC run they judged; a fresh unique name without one."""
    t = frames.get("gc_history")
    if t is not None and {"run_id", "candidate"} <= set(t.column_names):
        cols = {c: t.column(c).to_pylist() for c in ("run_id", "candidate", "seq", "m") if c in t.column_names}
        for i, cand in enumerate(cols["candidate"]):
            rid = cols["run_id"][i]
            if cand and rid:
                seq, m = (cols.get("seq") or [None] * (i + 1))[i], (cols.get("m") or [None] * (i + 1))[i]
                name = f"gc-{'x' if seq is None else seq}-m{'none' if m is None else m}-{rid}"
                return _UNSAFE.sub("_", name)[:120]
    return f"gate-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"


def gc_run_of(frames: dict[str, pa.Table]) -> tuple[str | None, int | None, int | None]:
    """The candidate row's GC run id, seq and M (None where absent)."""
    t = frames.get("gc_history")
    if t is not None and "candidate" in t.column_names:
        for row in t.to_pylist():
            if row.get("candidate"):
                return row.get("run_id"), row.get("seq"), row.get("m")
    return None, None, None


def kept_runs(docs_dir: str) -> list[GateRun]:
    """The gate runs a Data Docs site keeps (``runs/<id>.json``), newest first; an entry
    that does not read is left out."""
    runs = os.path.join(docs_dir, "runs")
    entries = []
    for name in os.listdir(runs) if os.path.isdir(runs) else ():
        if name.endswith(".json"):
            try:
                with open(os.path.join(runs, name), "rb") as f:
                    entries.append(msgspec.json.decode(f.read(), type=GateRun))
            except (OSError, msgspec.DecodeError):
                continue
    entries.sort(key=lambda e: (e.time, e.id), reverse=True)
    return entries


# --- Data Docs ------------------------------------------------------------------------------------


@contextlib.contextmanager
def locked(path: str) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created if absent) for the duration."""
    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class GxGate:
    """A callable gate for :func:`ctp_state.gc.run.run_gc`: ``GxGate(report_dir)(frames)``.

    With ``store_url`` the report directory is claimed for that store at once
    (:func:`claim`)."""

    def __init__(
        self, root: str, *, offline_docs: bool = True, store_url: str | None = None, keep_runs: int = KEEP_RUNS
    ):
        self.root = os.path.abspath(root)
        self.offline_docs = offline_docs
        self.keep_runs = keep_runs
        if store_url is not None:
            claim(self.root, store_url)

    @property
    def docs_dir(self) -> str:
        """The Data Docs site; its ``index.html`` lists every kept gate run."""
        return os.path.join(self.root, "gx", "uncommitted", "data_docs", SITE)

    def __call__(self, frames: dict[str, pa.Table]) -> GateResult:
        missing = set(SUITES) - set(frames)
        if missing:
            raise ValueError(f"the gate needs tables {sorted(missing)}")
        run_name = run_name_of(frames)
        building = os.path.join(self.root, "gx", "building")
        os.makedirs(building, exist_ok=True)
        private = tempfile.mkdtemp(prefix=f"{run_name}-", dir=building)
        try:
            with _IN_PROCESS:
                ctx = _context(private)
                results, run_time = validate_frames(ctx, frames, run_name)
                failures, stats = failures_of(results)
                success = all(r.success for r in results) and not failures
                ctx.build_data_docs(site_names=[SITE], build_index=False)
            if self.offline_docs:
                from expectations.report import localize_data_docs

                localize_data_docs(private)
            gc_run_id, seq, m = gc_run_of(frames)
            entry = GateRun(
                run=run_name,
                time=run_time.isoformat(),
                success=success,
                statistics=stats,
                failures=tuple(failures),
                gc_run_id=gc_run_id,
                seq=seq,
                m=m,
            )
            docs = self._publish(private, entry)
        finally:
            shutil.rmtree(private, ignore_errors=True)
        return GateResult(success, failures, stats, docs)

    def _publish(self, private: str, entry: GateRun) -> str:
        """Move a run's rendered pages into the site and list the run; returns the run's page."""
        from expectations.report import gate_index_page, gate_run_page

        site = self.docs_dir
        gx_dir = os.path.join(self.root, "gx")
        runs = os.path.join(site, "runs")
        with locked(os.path.join(gx_dir, "docs.lock")):
            os.makedirs(runs, exist_ok=True)
            if not os.path.isdir(os.path.join(site, "static")) and os.path.isdir(os.path.join(private, "static")):
                os.rename(os.path.join(private, "static"), os.path.join(site, "static"))
            pages: dict[str, str] = {}
            for folder, _, names in os.walk(private):
                rel_folder = os.path.relpath(folder, private)
                if rel_folder.split(os.sep)[0] == "static":
                    continue
                for name in names:
                    rel = os.path.normpath(os.path.join(rel_folder, name))
                    os.makedirs(os.path.join(site, os.path.dirname(rel)), exist_ok=True)
                    os.replace(os.path.join(private, rel), os.path.join(site, rel))
                    parts = rel.split(os.sep)
                    if parts[0] == "validations" and name.endswith(".html"):
                        pages[parts[1]] = "/".join(parts)
            run_id, n = entry.run, 1
            while os.path.exists(os.path.join(runs, f"{run_id}.json")):
                n += 1
                run_id = f"{entry.run}-{n}"
            entry = msgspec.structs.replace(
                entry, id=run_id, pages=pages, suites={s: f"expectations/{s}.html" for s in SUITES}
            )
            write_atomic(
                os.path.join(runs, f"{run_id}.json"),
                json.dumps(msgspec.to_builtins(entry), indent=1, sort_keys=True),
            )
            page = os.path.join(runs, f"{run_id}.html")
            write_atomic(page, gate_run_page(entry))
            kept = self._prune(site, runs)
            write_atomic(os.path.join(site, "index.html"), gate_index_page(kept))
            self._clean_stale_builds(os.path.join(gx_dir, "building"))
        return page

    def _prune(self, site: str, runs: str) -> list[GateRun]:
        """The kept runs, newest first; pages of older ones are removed. Under the lock."""
        entries = kept_runs(site)
        for old in entries[self.keep_runs :]:
            for rel in list(old.pages.values()):
                path = os.path.join(site, *rel.split("/"))
                with contextlib.suppress(OSError):
                    os.unlink(path)
                folder = os.path.dirname(path)
                with contextlib.suppress(OSError):  # <suite>/<run>/<time>/ and <suite>/<run>/, if empty now
                    os.rmdir(folder)
                    os.rmdir(os.path.dirname(folder))
            for ext in (".json", ".html"):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(runs, f"{old.id}{ext}"))
        return entries[: self.keep_runs]

    @staticmethod
    def _clean_stale_builds(building: str) -> None:
        now = time.time()
        for name in os.listdir(building):
            path = os.path.join(building, name)
            with contextlib.suppress(OSError):
                if now - os.stat(path).st_mtime > STALE_BUILD_S:
                    shutil.rmtree(path, ignore_errors=True)
