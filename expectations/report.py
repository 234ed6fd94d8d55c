"""The operator report: Data Docs made readable offline, and the GC summary page.

The stock Data Docs pull Bootstrap, jQuery, Font Awesome and Vega from public CDNs, so
on a closed network they render unstyled and without icons. Their content is rendered
on the server side, though, so :func:`localize_data_docs` drops every remote stylesheet
and script, points the remote logo at the copy GX ships in ``static/``, and inlines a
small stylesheet (tables, status icons as text glyphs). The result reads the same with
no network at all.

:func:`write_summary_page` writes ``index.html`` at the top of the report directory: an
alert banner, the latest run, what holds M back, M and C against time and deletes per
run (inline SVG with labelled ticks), every partition's status worst first (capped),
each run with its deleted epoch range and sample keys, and every kept validation result
linked directly. It is a single file with no script and no external reference. Every
page is a Jinja2 template under ``expectations/templates/``, autoescaped.

:func:`gate_index_page` and :func:`gate_run_page` are the Data Docs site's own index and
per-run pages (the gate, :mod:`expectations.gate`, lists its runs with them); pages are
written with :func:`write_atomic`, as GCs of one store may share a report directory.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from ctp_state import layout
from ctp_state.gc.safe_epoch import PARTITION_STATUSES
from ctp_state.records import GcPartitionView, GcRecord
from ctp_state.storage import ObjectStore
from expectations.charts import delete_chart, human_bytes, m_chart, when

_REMOTE_LINK = re.compile(r"<link\b[^>]*href=\"https?://[^\"]*\"[^>]*>\s*", re.I)
_REMOTE_SCRIPT = re.compile(r"<script\b[^>]*src=\"https?://[^\"]*\"[^>]*>\s*</script>\s*", re.I)
_REMOTE_IMG = re.compile(r"(<img\b[^>]*src=\")https?://[^\"]*(\")", re.I)
_MARK = "<!-- ctp: offline -->"

OFFLINE_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:0 auto;max-width:1200px;
padding:16px;color:#212529;line-height:1.45}
a{color:#0b5cad}table{border-collapse:collapse;width:100%;margin:8px 0}
td,th{border:1px solid #dee2e6;padding:4px 8px;vertical-align:top;text-align:left}
th{background:#f1f3f5}.card{border:1px solid #dee2e6;border-radius:6px;margin:12px 0;padding:8px 12px}
.card-header{font-weight:600;font-size:1.1em;border-bottom:1px solid #dee2e6;margin-bottom:6px}
.col-md-2,.col-md-3,.sticky,.ge-walkthrough-modal,.modal,footer,#ge-cta-footer,.popover,.cooltip .top{display:none!important}
.fa,.fas,.far{font-style:normal}
.fa-check-circle::before{content:"\\2714";color:#2b8a3e}
.fa-times::before,.fa-times-circle::before,.fa-exclamation-triangle::before{content:"\\2718";color:#c92a2a}
.text-success{color:#2b8a3e}.text-danger{color:#c92a2a}
img{max-height:40px}nav,.navbar,.fixed-top{position:static!important}.container{padding-top:0!important}
"""


def write_atomic(path: str, text: str) -> None:
    """Readers see the old file or the new one, never a torn one."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def localize_data_docs(site_dir: str) -> int:
    """Rewrite every HTML page under ``site_dir`` to need no network; return how many
    pages changed. Idempotent."""
    changed = 0
    logo = os.path.join(site_dir, "static", "images", "logo-long.png")
    for folder, _, names in os.walk(site_dir):
        for name in names:
            if not name.endswith(".html"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            if _MARK in text:
                continue
            rel_logo = os.path.relpath(logo, folder).replace(os.sep, "/")
            text = _REMOTE_LINK.sub("", text)
            text = _REMOTE_SCRIPT.sub("", text)
            text = _REMOTE_IMG.sub(lambda m, logo=rel_logo: m.group(1) + logo + m.group(2), text)
            text = text.replace("</head>", f"{_MARK}<style>{OFFLINE_CSS}</style></head>", 1)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            changed += 1
    return changed


# --- templates --------------------------------------------------------------------------------

_ENV: Any = None


def _env() -> Any:
    """The Jinja2 environment: templates beside this module, HTML autoescaped."""
    global _ENV
    if _ENV is None:
        import jinja2

        _ENV = jinja2.Environment(
            loader=jinja2.FileSystemLoader(os.path.join(os.path.dirname(__file__), "templates")),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        _ENV.filters["when"] = when
        _ENV.filters["size"] = human_bytes
    return _ENV


def render(template: str, **context: Any) -> str:
    """Render ``template`` (under ``expectations/templates/``) with the offline CSS."""
    return str(_env().get_template(template).render(css=OFFLINE_CSS, **context))


# --- the gate's runs in the Data Docs site ---------------------------------------------------


class GateRun(msgspec.Struct, frozen=True, kw_only=True):
    """One gate run as the Data Docs site keeps it (``runs/<id>.json``) and the pages
    show it. Fields an older entry lacks take their defaults."""

    run: str  # the validation run's name (:func:`run_name_of`)
    id: str = ""  # ``run``, made unique in the site
    time: str = ""  # when it validated, ISO 8601 UTC
    success: bool = False
    statistics: dict[str, int] = {}  # evaluated, successful, unsuccessful
    failures: tuple[str, ...] = ()
    gc_run_id: str | None = None  # the GC run it judged, its seq and candidate M
    seq: int | None = None
    m: int | None = None
    pages: dict[str, str] = {}  # suite -> its validation result page, relative to the site
    suites: dict[str, str] = {}  # suite -> its expectation suite page


def gate_run_page(entry: GateRun) -> str:
    """One gate run (``runs/<id>.html`` in the Data Docs site): verdict, failed
    expectations, and links to its validation result pages."""
    return render("gate_run.html.j2", title=f"GC gate run {entry.id or entry.run}", entry=entry)


def gate_index_page(entries: Sequence[GateRun]) -> str:
    """The Data Docs site's ``index.html``: every kept gate run, newest first, with
    plain links (no JavaScript) to each validation result."""
    return render("gate_index.html.j2", title="ctp GC gate: Data Docs", entries=entries)


# --- the GC summary page ---------------------------------------------------------------------

PARTITION_ROWS = 200  # partitions listed on the summary page, worst first


@dataclass(frozen=True)
class PartitionsView:
    """The partitions as one GC run saw them, worst first, capped for the page."""

    seq: int
    key: str
    total: int
    counts: list[tuple[str, int]]
    rows: list[GcPartitionView]
    shown: int


def partitions_view(seq: int, key: str, rows: Sequence[GcPartitionView], cap: int = PARTITION_ROWS) -> PartitionsView:
    """Order ``rows`` worst first: by status (quarantined, claim held, lagging, idle,
    caught up; unknown after), then most lag bytes, then lowest M(p); keep ``cap``."""

    def rank(r: GcPartitionView) -> tuple[int, int, int, str, int]:
        s = PARTITION_STATUSES.index(r.status) if r.status in PARTITION_STATUSES else len(PARTITION_STATUSES)
        return (s, -r.lag_bytes, r.m if r.m is not None else -1, r.topic, r.partition)

    ordered = heapq.nsmallest(cap, rows, key=rank)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status or "unknown"] = counts.get(r.status or "unknown", 0) + 1
    order = [*PARTITION_STATUSES, "unknown"]
    return PartitionsView(
        seq,
        key,
        len(rows),
        sorted(counts.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)),
        ordered,
        len(ordered),
    )


@dataclass(frozen=True)
class ValidationRow:
    """A row of the report's validation table: one gate run, linked to its pages."""

    id: str
    page: str
    time: str
    success: bool
    successful: int
    evaluated: int
    links: list[tuple[str, str]]  # (suite, page)
    failures: Sequence[str]
    gc_run_id: str | None


@dataclass(frozen=True)
class RunRow:
    """A row of the report's runs table: a GC run, what it deleted (a dry run: would
    have), why it failed, and its gate run's page."""

    rec: GcRecord
    deleted: int
    bytes: int
    failures: list[str]
    gate_page: str | None
    gate_ok: bool | None


def _validations(entries: Sequence[GateRun], site_rel: str) -> list[ValidationRow]:
    """The rows of the report's validation table (the template's own view of a run)."""
    return [
        ValidationRow(
            id=en.id or en.run,
            page=f"{site_rel}/runs/{en.id or en.run}.html",
            time=en.time,
            success=en.success,
            successful=en.statistics.get("successful", 0),
            evaluated=en.statistics.get("evaluated", 0),
            links=[(suite, f"{site_rel}/{rel}") for suite, rel in sorted(en.pages.items())],
            failures=en.failures,
            gc_run_id=en.gc_run_id,
        )
        for en in entries
    ]


def write_summary_page(
    report_dir: str,
    records: Sequence[GcRecord],
    *,
    docs_index: str | None = None,
    partitions: PartitionsView | None = None,
    validations: Sequence[GateRun] = (),
    title: str = "ctp GC report",
) -> str:
    """Write ``<report_dir>/index.html`` from GC history ``records`` (oldest first),
    the newest partition view, and the gate runs the Data Docs site keeps (newest
    first). One self-contained page: inline CSS and SVG, no script, plain links."""
    os.makedirs(report_dir, exist_ok=True)
    site_rel = os.path.relpath(os.path.dirname(docs_index), report_dir).replace(os.sep, "/") if docs_index else "."
    vals = _validations(validations, site_rel)
    by_run = {v.gc_run_id: v for v in vals if v.gc_run_id}
    shown = list(records[-REPORT_CHART_RUNS:])
    runs = []
    for r in reversed(shown):
        v = by_run.get(r.run_id)
        runs.append(
            RunRow(
                rec=r,
                deleted=r.would_delete if r.dry_run else r.deleted,
                bytes=r.would_delete_bytes if r.dry_run else r.deleted_bytes,
                failures=[*(r.gate.failures if r.gate else ()), *(f"{k}: {e}" for k, e in r.failed_keys.items())],
                gate_page=v.page if v else None,
                gate_ok=v.success if v else None,
            )
        )
    page = render(
        "report.html.j2",
        title=title,
        latest=records[-1] if records else None,
        docs_index=f"{site_rel}/index.html" if docs_index else None,
        m_chart=m_chart(shown),
        delete_chart=delete_chart(shown),
        partitions=partitions,
        runs=runs,
        validations=vals,
    )
    path = os.path.join(report_dir, "index.html")
    write_atomic(path, page)  # GCs of one store may share the directory
    return path


REPORT_CHART_RUNS = 200  # runs in the charts and the runs table


def publish(store: ObjectStore, report_dir: str, prefix: str = layout.REPORTS) -> int:
    """Copy the summary page and the Data Docs site into the store under ``prefix``
    (the same relative layout, so links keep working); return how many files."""
    n = 0
    site = os.path.join("gx", "uncommitted", "data_docs", "local_site")
    paths = [os.path.join(report_dir, "index.html")]
    for folder, _, names in os.walk(os.path.join(report_dir, site)):
        paths += [os.path.join(folder, name) for name in names if not name.startswith(".tmp-")]
    for path in paths:
        if not os.path.isfile(path):
            continue
        rel = os.path.relpath(path, report_dir).replace(os.sep, "/")
        with open(path, "rb") as f:
            store.put(prefix + rel, f.read())
        n += 1
    return n
