"""The operator report: Data Docs made readable offline, and the GC summary page.

The stock Data Docs pull Bootstrap, jQuery, Font Awesome and Vega from public CDNs, so
on a closed network they render unstyled and without icons. Their content is rendered
on the server side, though, so :func:`localize_data_docs` drops every remote stylesheet
and script, points the remote logo at the copy GX ships in ``static/``, and inlines a
small stylesheet (tables, status icons as text glyphs). The result reads the same with
no network at all.

:func:`write_summary_page` writes ``index.html`` at the top of the report directory: M
and C over time (inline SVG), what holds M back now, deletes per run, failures, and a
link to the Data Docs. It is a single file with no external references.

:func:`gate_index_page` and :func:`gate_run_page` are the Data Docs site's own index and
per-run pages (the gate, :mod:`expectations.gate`, lists its runs with them); pages are
written with :func:`write_atomic`, as GCs of one store may share a report directory.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import html
import os
import re
import tempfile
from collections.abc import Sequence
from typing import Any

from ctp_state import layout
from ctp_state.records import GcRecord
from ctp_state.storage import ObjectStore

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


# --- the gate's runs in the Data Docs site ---------------------------------------------------


def _page(title: str, body: str) -> str:
    e = html.escape
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>'
        f"<style>{OFFLINE_CSS} .ok{{color:#2b8a3e}} .bad{{color:#c92a2a}} code{{font-size:.9em}}</style>"
        f"</head><body><h1>{e(title)}</h1>{body}</body></html>"
    )


def _verdict(entry: dict[str, Any]) -> str:
    st = entry.get("statistics") or {}
    ok = entry.get("success")
    return (
        f'<span class="{"ok" if ok else "bad"}">{"passed" if ok else "FAILED"}</span> '
        f"{st.get('successful', 0)}/{st.get('evaluated', 0)}"
    )


def gate_run_page(entry: dict[str, Any]) -> str:
    """One gate run (``runs/<id>.html`` in the Data Docs site): verdict, failures, and
    links to its validation result pages."""
    e = html.escape
    rows = "".join(
        f'<tr><td>{e(suite)}</td><td><a href="../{e(rel)}">validation result</a></td>'
        f'<td><a href="../{e(entry.get("suites", {}).get(suite, ""))}">suite</a></td></tr>'
        for suite, rel in sorted(entry.get("pages", {}).items())
    )
    fails = "".join(f"<li><code>{e(f)}</code></li>" for f in entry.get("failures", []))
    body = (
        f"<p>{_verdict(entry)} expectations; validated {e(entry.get('time', ''))}. "
        f'<a href="../index.html">All gate runs</a></p>'
        + (f'<h2 class="bad">Failures (the GC deleted nothing)</h2><ul>{fails}</ul>' if fails else "")
        + f"<table><tr><th>table</th><th>result</th><th>expectations</th></tr>{rows}</table>"
    )
    return _page(f"GC gate run {entry.get('id', entry.get('run', ''))}", body)


def gate_index_page(entries: Sequence[dict[str, Any]]) -> str:
    """The Data Docs site's ``index.html``: every kept gate run, newest first."""
    e = html.escape
    rows = []
    for en in entries:
        links = " ".join(f'<a href="{e(rel)}">{e(suite)}</a>' for suite, rel in sorted(en.get("pages", {}).items()))
        first = en.get("failures") or []
        rows.append(
            f'<tr><td><a href="runs/{e(en["id"])}.html">{e(en["id"])}</a></td><td>{e(en.get("time", ""))}</td>'
            f"<td>{_verdict(en)}</td><td>{links}</td>"
            f"<td>{'<code>' + e(first[0][:200]) + '</code>' if first else ''}"
            f"{f' and {len(first) - 1} more' if len(first) > 1 else ''}</td></tr>"
        )
    body = (
        (
            "<p>Great Expectations validation results of the GC gate, newest first. The run is the GC run id.</p>"
            "<table><tr><th>run</th><th>validated (UTC)</th><th>result</th><th>validation results</th>"
            "<th>first failure</th></tr>" + "".join(rows) + "</table>"
        )
        if rows
        else "<p>No gate run yet.</p>"
    )
    return _page("ctp GC gate: Data Docs", body)


# --- the GC summary page ---------------------------------------------------------------------


def _when(ms: int | None) -> str:
    if not ms:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _bytes(n: int | None) -> str:
    n = n or 0
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _chart(records: Sequence[GcRecord], width: int = 900, height: int = 220) -> str:
    pts = [(r.seq, r.m, r.cluster_epoch) for r in records if r.m is not None]
    if not pts:
        return "<p>No run with an M yet.</p>"
    xs = [p[0] for p in pts]
    ys = [v for p in pts for v in (p[1], p[2]) if v is not None]
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y0, y1 = min(ys), max(ys) if max(ys) > min(ys) else min(ys) + 1
    pad = 40

    def xy(x: float, y: float) -> str:
        return f"{pad + (x - x0) / (x1 - x0) * (width - 2 * pad):.1f},{height - pad - (y - y0) / (y1 - y0) * (height - 2 * pad):.1f}"

    m_line = " ".join(xy(s, m) for s, m, _ in pts)
    c_line = " ".join(xy(s, c) for s, _, c in pts if c is not None)
    dots = "".join(
        f'<circle cx="{xy(s, m).split(",")[0]}" cy="{xy(s, m).split(",")[1]}" r="3" fill="#1971c2">'
        f"<title>run {s}: M={m}, C={c}</title></circle>"
        for s, m, c in pts
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="M and C over GC runs">'
        f'<rect width="100%" height="100%" fill="#fff" stroke="#dee2e6"/>'
        f'<polyline fill="none" stroke="#adb5bd" stroke-dasharray="4 3" stroke-width="2" points="{c_line}"/>'
        f'<polyline fill="none" stroke="#1971c2" stroke-width="2" points="{m_line}"/>{dots}'
        f'<text x="{pad}" y="16" font-size="12">epoch {y1}</text>'
        f'<text x="{pad}" y="{height - 8}" font-size="12">epoch {y0}; runs {x0}..{x1}</text>'
        f'<text x="{width - 230}" y="16" font-size="12" fill="#1971c2">&#9473; M</text>'
        f'<text x="{width - 190}" y="16" font-size="12" fill="#868e96">&#9476; C (cluster epoch)</text></svg>'
    )


def write_summary_page(
    report_dir: str, records: Sequence[GcRecord], *, docs_index: str | None = None, title: str = "ctp GC report"
) -> str:
    """Write ``<report_dir>/index.html`` from GC history ``records`` (oldest first)."""
    os.makedirs(report_dir, exist_ok=True)
    e = html.escape
    latest = records[-1] if records else None
    parts = [
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>'
        f"<style>{OFFLINE_CSS} .ok{{color:#2b8a3e}} .bad{{color:#c92a2a}} code{{font-size:.9em}}</style>"
        f"</head><body><h1>{e(title)}</h1>"
    ]
    if docs_index:
        rel = os.path.relpath(docs_index, report_dir).replace(os.sep, "/")
        parts.append(f'<p>Great Expectations validation results: <a href="{e(rel)}">Data Docs</a> (offline copy).</p>')
    if latest is None:
        parts.append("<p>No GC run recorded yet.</p></body></html>")
    else:
        ok = latest.status in ("ok", "dry_run")
        verb = "would delete" if latest.dry_run else "deleted"
        n = latest.would_delete if latest.dry_run else latest.deleted
        b = latest.would_delete_bytes if latest.dry_run else latest.deleted_bytes
        parts.append(
            f'<div class="card"><div class="card-header">Latest run: seq {latest.seq}, '
            f'<span class="{"ok" if ok else "bad"}">{e(latest.status)}</span></div>'
            f"<p>{_when(latest.started_ms)}, {latest.seconds} s. "
            f"Cluster epoch C = {latest.cluster_epoch}, M = {latest.m} "
            f"(highest M so far: {latest.m_high_water}). {latest.partitions} partitions, "
            f"each read from its state log.</p>"
            f"<p>L0: listed {latest.listed}, {verb} {n} objects ({_bytes(b)}), "
            f"failed {latest.delete_errors}, too young {latest.skipped_too_young}. "
            f"L1 orphans: {latest.l1_orphans} ({_bytes(latest.l1_orphan_bytes)}).</p>"
        )
        if latest.alert is not None:
            parts.append(
                f'<div class="card"><div class="card-header bad">ALERT ({e(latest.alert.kind)})</div>'
                f"<p>{e(latest.alert.message)}</p></div>"
            )
        if latest.gate is not None and latest.gate.failures:
            parts.append(
                '<h3 class="bad">Gate failures (nothing was deleted)</h3><ul>'
                + "".join(f"<li><code>{e(f)}</code></li>" for f in latest.gate.failures)
                + "</ul>"
            )
        if latest.error:
            parts.append(f'<p class="bad">Error: <code>{e(latest.error)}</code></p>')
        if latest.failed_keys:
            parts.append(
                '<h3 class="bad">Keys that failed to delete</h3><ul>'
                + "".join(f"<li><code>{e(k)}</code>: {e(str(v))}</li>" for k, v in latest.failed_keys.items())
                + "</ul>"
            )
        held = latest.held_by
        parts.append(
            f"<h2>What holds M back ({latest.held_by_count or len(held)} partitions/reasons)</h2>"
            "<table><tr><th>topic</th><th>partition</th><th>M(p)</th><th>why</th></tr>"
            + "".join(
                f"<tr><td>{e(h.topic or '(cluster)')}</td><td>{'' if h.partition is None else h.partition}"
                f"</td><td>{h.m}</td><td>{'<br>'.join(e(r) for r in h.reasons)}</td></tr>"
                for h in held
            )
            + "</table>"
        )
    if records:
        parts.append("<h2>M over time</h2>" + _chart(records[-200:]))
        rows = []
        for r in reversed(records[-200:]):
            cls = "ok" if r.status in ("ok", "dry_run") else "bad"
            dele = f"{r.would_delete} (dry)" if r.dry_run else str(r.deleted)
            byts = _bytes(r.would_delete_bytes if r.dry_run else r.deleted_bytes)
            nfail = len(r.gate.failures if r.gate else ()) + r.delete_errors
            rows.append(
                f'<tr><td>{r.seq}</td><td>{_when(r.started_ms)}</td><td class="{cls}">'
                f"{e(r.status)}</td><td>{r.m}</td><td>{r.cluster_epoch}</td><td>{dele}</td>"
                f"<td>{byts}</td><td>{r.l1_orphans_deleted}</td><td>{nfail}</td>"
                f"<td>{r.seconds}</td></tr>"
            )
        parts.append(
            "<h2>Runs</h2><table><tr><th>seq</th><th>started</th><th>status</th><th>M</th><th>C</th>"
            "<th>L0 deleted</th><th>bytes</th><th>L1 orphans deleted</th><th>failures</th><th>s</th></tr>"
            + "".join(rows)
            + "</table>"
        )
    parts.append("</body></html>")
    path = os.path.join(report_dir, "index.html")
    write_atomic(path, "".join(parts))  # GCs of one store may share the directory
    return path


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
