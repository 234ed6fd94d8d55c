"""Crash injection for tests: ``CTP_FAULT=point[:n]`` kills the process group with
SIGKILL when the named point is reached (the n-th time, or for item n).

Used only by the crash tests, which start the process under test in its own session,
so the whole application (Spark driver, JVM, Python workers) dies at once, as on a
machine failure. Unset in production: ``hit`` is then a dictionary lookup.
"""

from __future__ import annotations

import os
import signal


def _target(point: str) -> int | None:
    spec = os.environ.get("CTP_FAULT", "")
    for item in spec.split(","):
        name, _, n = item.strip().partition(":")
        if name == point:
            return int(n) if n else 0
    return None


def hit(point: str, index: int = 0) -> None:
    """Die here if ``CTP_FAULT`` names ``point`` with this ``index`` (default 0)."""
    target = _target(point)
    if target is not None and target == index:
        try:
            os.killpg(os.getpgrp(), signal.SIGKILL)
        finally:  # if the group kill was refused, still die
            os.kill(os.getpid(), signal.SIGKILL)
