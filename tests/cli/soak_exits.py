"""Soak: the commands that read Parquet, each run many times in a fresh process, with
nothing injected; every status that is not 0 is counted and shown (an abort at exit is
-6 or 134). ``tests/cli/test_exit_status.py`` runs it small; the full run is by hand::

    python -m tests.cli.soak_exits --runs 300 [--jobs 2]

It builds a store of its own (topic t, two partitions, reconciled and published) under
a temporary directory and prints JSON: per command, runs, failures and their statuses,
and seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

COMMANDS = {
    "read": ["read", "t", "0", "--limit", "5"],
    "verify --deep": ["verify", "--deep"],
    "table publish": ["table", "publish"],
    "gc": ["gc"],
}


def build(home: str) -> dict[str, str]:
    from ctp_state.epoch import ClusterEpoch
    from ctp_state.reconcile import run_reconcile
    from ctp_state.storage import open_store
    from tests.support import produce_rounds, with_this_checkout

    url = f"file://{home}/store"
    store = open_store(url, {}, create=True)
    produce_rounds(store, topic="t", partitions=2, rounds=3, per=200)
    run_reconcile(store)
    ClusterEpoch(store).advance()
    run_reconcile(store)
    env = with_this_checkout({**os.environ, "CTP_STORE": url, "HOME": home})
    env.pop("CTP_TEST_ABORT_AT_EXIT", None)
    return env


def soak(runs: int, jobs: int = 1, commands: dict[str, list[str]] = COMMANDS) -> dict[str, dict[str, object]]:
    ctp = os.path.join(os.path.dirname(sys.executable), "ctp")
    out: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix="ctp-soak-") as home:
        env = build(home)

        def once(args: list[str]) -> tuple[int, str]:
            r = subprocess.run([ctp, *args], env=env, capture_output=True, text=True, timeout=600)
            return r.returncode, (r.stderr.strip().splitlines() or [""])[-1]

        for name, args in commands.items():
            started = time.monotonic()
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                results = list(pool.map(once, [args] * runs))
            bad = [(rc, last) for rc, last in results if rc != 0]
            out[name] = {
                "runs": runs,
                "failures": len(bad),
                "statuses": dict(Counter(str(rc) for rc, _ in bad)),
                "first_failure": bad[0][1] if bad else None,
                "seconds": round(time.monotonic() - started, 1),
            }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--jobs", type=int, default=1)
    a = ap.parse_args()
    result = soak(a.runs, a.jobs)
    print(json.dumps(result, indent=2))
    return 1 if any(r["failures"] for r in result.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
