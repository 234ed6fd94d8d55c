"""The operator report and the Data Docs, read in headless Chromium with the network
off: every link from the report and from the Data Docs index opens a page with visible
content, no page asks for anything but local files, and the report shows what an
operator acts on (the alert, failed expectations, each partition's status worst first,
deleted epochs and keys, every validation result linked directly)."""

from __future__ import annotations

import os
import shutil
from urllib.parse import urldefrag, urlparse

import pytest

from ctp_state.gc.history import GcHistory
from ctp_state.storage import open_store
from expectations.suites import SUITES
from tests.report import sample

CHROMIUM = shutil.which(os.environ.get("CTP_CHROMIUM", "chromium")) or "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser():
    if not shutil.which(CHROMIUM):
        pytest.fail(f"headless Chromium is needed at {CHROMIUM} (scripts/test.sh installs Debian's chromium as root)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("report-sample")
    store = open_store(f"file://{root}/store", dict(os.environ), create=True)
    gate = sample.build(store, str(root / "report"))
    page = sample.finish(store, gate, str(root / "report"))
    return store, root / "report", page


@pytest.fixture
def offline(browser):
    """A page in a context with the network off; every request that is not a local
    file is refused and remembered."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    ctx.set_offline(True)
    remote: list[str] = []

    def guard(route):
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            remote.append(route.request.url)
            route.abort()

    ctx.route("**/*", guard)
    page = ctx.new_page()
    yield page, remote
    ctx.close()


def _links(page) -> list[str]:
    hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
    return sorted({urldefrag(h)[0] for h in hrefs if urldefrag(h)[0] != urldefrag(page.url)[0]})


def _visible_text(page) -> str:
    return page.evaluate("document.body ? document.body.innerText : ''")


def _open(page, url: str) -> None:
    assert urlparse(url).scheme == "file", url
    assert os.path.isfile(urlparse(url).path), f"link to a missing file: {url}"
    page.goto(url)


def test_every_link_from_the_report_and_the_data_docs_index_shows_content_offline(offline, report):
    page, remote = offline
    store, _, index = report
    _open(page, f"file://{index}")
    assert "ctp GC report" in page.title()
    links = _links(page)
    docs_index = [u for u in links if u.endswith("/local_site/index.html")]
    assert len(docs_index) == 1
    validation_links = page.eval_on_selector_all("a.validation-link", "els => els.map(e => e.href)")
    history = GcHistory(store)
    gate_runs = [r for r in history.records() if r.gate is not None]
    assert len(validation_links) == len(SUITES) * len(gate_runs)  # every suite of a run, each linked directly

    _open(page, docs_index[0])
    rows = page.locator("table tr").count()
    assert rows == 1 + len(gate_runs), "the Data Docs index lists every gate run without JavaScript"
    links += _links(page)

    seen = 0
    for url in sorted(set(links)):
        _open(page, url)
        text = _visible_text(page)
        assert len(text.strip()) > 200, f"{url} shows almost nothing: {text[:200]!r}"
        if "/validations/" in url:
            # a GX validation result: its expectations are rows of a rendered table
            assert page.locator("table tr").count() >= 3, url
            assert "Expectation" in text or "expect" in text.lower(), url
        seen += 1
    assert seen >= len(SUITES) * len(gate_runs) + len(gate_runs) + 1
    assert remote == [], f"pages asked for the network: {remote[:5]}"


def test_the_report_shows_what_an_operator_acts_on(offline, report, tmp_path):
    page, remote = offline
    store, _, index = report
    _open(page, f"file://{index}")
    text = _visible_text(page)
    history = list(GcHistory(store).records())
    latest = history[-1]

    # the alert comes first, above the latest run
    assert text.index("ALERT (quarantine)") < text.index("Latest run")
    # failed expectations are shown and highlighted
    failed = page.locator("tr.failed-expectation")
    assert failed.count() >= 2 and "expect_column_pair_values_a_to_be_greater_than_b" in failed.first.inner_text()
    # partitions worst first: quarantined (with its L0 key), claim held (owner, lease end), lagging, idle
    statuses = page.locator("#partition-table tr td:nth-child(3)").all_inner_texts()
    assert statuses[:4] == ["quarantined", "claim held", "lagging", "lagging"], statuses
    assert len(statuses) == sample.PARTITIONS
    details = page.locator("#partition-table tr td:nth-child(9)").all_inner_texts()
    assert details[0].startswith("L0 key l0/") and "reconciler:dead (exclusive), lease until" in details[1]
    # each run: epoch range and sample keys of what it deleted, the audit list's key
    deleting = [r for r in history if r.deleted and not r.dry_run]
    assert deleting
    r = deleting[-1]
    assert f"{r.delete_epochs[0]}\u2013{r.delete_epochs[1]}" in text
    assert r.delete_sample[0] in page.content() and r.deletes_key in page.content()
    # charts: time on the x axis, labelled epochs on the y axis, a second chart of deletes
    svgs = page.locator("svg.chart")
    assert svgs.count() == 2
    ticks = svgs.first.locator("text").all_text_contents()
    assert sum(t.count(":") == 2 for t in ticks) >= 2, ticks  # HH:MM:SS time ticks
    epochs = sorted(int(t) for t in ticks if t.isdigit())
    assert len(epochs) >= 3 and epochs[-1] >= latest.cluster_epoch and epochs[0] <= history[0].m, ticks
    assert "bytes" in svgs.nth(1).inner_html() and "objects" in svgs.nth(1).inner_html()
    # the page needs nothing but itself
    assert page.locator("script").count() == 0 and page.locator("link[rel=stylesheet]").count() == 0
    shot = tmp_path / "report.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 50_000
    assert remote == []


def test_a_report_over_ten_thousand_partitions_lists_the_worst_first_and_caps_the_table(offline, tmp_path):
    from ctp_state.records import GcPartitionView
    from expectations.report import PARTITION_ROWS, partitions_view, write_summary_page

    page, _ = offline
    rows = [
        GcPartitionView(topic="t", partition=i, m=9, min_epoch_lower_bound=10, status="caught up")
        for i in range(10_000)
    ]
    rows[7_777] = GcPartitionView(topic="t", partition=7_777, m=3, lag_entries=4, lag_bytes=999, status="lagging")
    rows[9_999] = GcPartitionView(topic="t", partition=9_999, m=2, status="quarantined", status_detail="L0 key l0/x")
    view = partitions_view(5, "gc/partitions/x.parquet", rows)
    path = write_summary_page(str(tmp_path), [], partitions=view)
    _open(page, f"file://{path}")
    cells = page.locator("#partition-table tr td:nth-child(2)").all_inner_texts()
    assert len(cells) == PARTITION_ROWS and cells[:2] == ["9999", "7777"]
    text = _visible_text(page)
    assert "10000 partitions: 1 quarantined, 1 lagging, 9998 caught up" in text
    assert f"the first {PARTITION_ROWS} are shown" in text and "gc/partitions/x.parquet" in text
