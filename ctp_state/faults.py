"""Crash injection for tests: ``CTP_FAULT=point[:n]`` kills the process group with
SIGKILL when the named point is reached (the n-th time, or for item n).

Used only by the crash tests, which start the process under test in its own session
(``setsid``), so the whole application (Spark driver, JVM, Python workers) dies at
once, as on a machine failure. Unset in production: ``hit`` is then a dictionary lookup.
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


def _session_pids(sid: int) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # field 6 of stat: the session id
            pids.append(int(name))
    return pids


def hit(point: str, index: int = 0) -> None:
    """Die here if ``CTP_FAULT`` names ``point`` with this ``index`` (default 0).

    Kills every process of this session (PySpark workers sit in process groups of
    their own, so a group kill from a task would spare the driver and the JVM)."""
    target = _target(point)
    if target is None or target != index:
        return
    me = os.getpid()
    try:
        for pid in _session_pids(os.getsid(0)):
            if pid != me:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
    finally:
        os.kill(me, signal.SIGKILL)
