"""Render the operator report over a sample store and keep a screenshot of it.

    python scripts/report_screenshot.py [docs/report.png]

The sample (tests/report/sample.py) has healthy runs, a dry run, a gate that failed
once, a stuck claim, a quarantined chunk and lag; Chromium (headless, network off)
takes the full page. tests/report/ checks the same page link by link.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ctp_state.storage import open_store
from tests.report import sample
from tests.report.test_report_offline import ARGS


def main(out: str) -> None:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which(os.environ.get("CTP_CHROMIUM", "chromium"))
    if not chromium:
        sys.exit("error: chromium is not on PATH (apt-get install chromium, or set CTP_CHROMIUM)")
    with tempfile.TemporaryDirectory() as root:
        store = open_store(f"file://{root}/store", dict(os.environ), create=True)
        gate = sample.build(store, f"{root}/report")
        page_path = sample.finish(store, gate, f"{root}/report")
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=ARGS)
            ctx = browser.new_context(viewport={"width": 1280, "height": 900}, offline=True)
            page = ctx.new_page()
            page.goto(f"file://{page_path}")
            page.screenshot(path=out, full_page=True)
            browser.close()
    print(out)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "docs/report.png")
