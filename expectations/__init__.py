"""Great Expectations 1.x suites, checkpoint and the operator report for ctp's GC.

- :mod:`expectations.suites` — the suites, as code (the source of truth: they are
  written into the GX project on every run);
- :mod:`expectations.gate` — the checkpoint the GC runs before any delete;
- :mod:`expectations.report` — Data Docs made readable offline, and the GC summary page.
"""
