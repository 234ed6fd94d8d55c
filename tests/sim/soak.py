"""The simulation from the command line: the soak, and replays.

    python -m tests.sim.soak --backend both --steps 10000          # soak: seeds until 10,000 steps
    python -m tests.sim.soak --backend s3 --seeds 7 --steps 200     # one seed
    python -m tests.sim.soak --backend file --replay /tmp/ctp-sim-7-x/replay.jsonl

Prints one line per run and a JSON summary last; exits 1 when any run found a violation
(its seed and the path of its replayable step list are printed with it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from tests.sim.driver import SimReport, run_sim
from tests.sim.model import Params, Step


@contextlib.contextmanager
def backend_store(backend: str, seed: int) -> Iterator[tuple[str, dict[str, str], Any]]:
    """``(url, env, proxy)`` of a fresh store: a directory, or a prefix on a local
    SeaweedFS S3 server behind the fault proxy."""
    if backend == "file":
        root = tempfile.mkdtemp(prefix=f"ctp-sim-store-{seed}-")
        yield f"file://{root}", {}, None
        return
    from tests.support import proxy_env
    from tests.support.s3_fault_proxy import S3FaultProxy

    server = _s3_server()
    with S3FaultProxy.for_server(server, seed=seed) as proxy:
        yield server.url("sim"), proxy_env(server, proxy), proxy


_S3: Any = None


def _s3_server() -> Any:
    """One SeaweedFS server for the whole soak, stopped at exit (and with this process)."""
    global _S3
    if _S3 is None:
        import atexit

        from ctp_state.local_s3 import LocalS3

        _S3 = LocalS3(tempfile.mkdtemp(prefix="ctp-sim-seaweedfs-")).start()
        atexit.register(_S3.stop)
    return _S3


def run_one(
    backend: str, seed: int, params: Params, *, plant: str | None = None, steps: list[Step] | None = None
) -> SimReport:
    with backend_store(backend, seed) as (url, env, proxy):
        return run_sim(seed, params, backend=backend, url=url, env=env, proxy=proxy, plant=plant, steps=steps)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.sim.soak", description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=["file", "s3", "both"], default="both")
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (default: 1, 2, ... until --steps)")
    ap.add_argument("--steps", type=int, default=10_000, help="total steps (with --seeds: steps per run)")
    ap.add_argument("--run-steps", type=int, default=250, help="steps per run when seeding until --steps")
    ap.add_argument("--spark", type=int, default=1, help="spark-submit reconciles per run")
    ap.add_argument("--plant", default=None, help="run with a planted bug (lower_bound_plus_one)")
    ap.add_argument("--replay", default=None, help="replay a step list a failing run wrote")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.run_steps < 1:
        ap.error("--steps and --run-steps must be >= 1")
    backends = ["file", "s3"] if args.backend == "both" else [args.backend]
    reports: list[SimReport] = []
    started = time.monotonic()
    try:
        if args.replay:
            with open(args.replay) as f:
                head = json.loads(f.readline())
                steps = [Step.from_json(line) for line in f if line.strip()]
            for b in backends:
                reports.append(run_one(b, head["seed"], Params(), plant=head.get("plant") or args.plant, steps=steps))
                print(reports[-1].text(), flush=True)
        else:
            seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
            total, seed, i = 0, 0, 0
            while (seeds is not None and i < len(seeds)) or (seeds is None and total < args.steps):
                seed = seeds[i] if seeds is not None else i + 1
                n = args.steps if seeds is not None else min(args.run_steps, args.steps - total)
                b = backends[i % len(backends)]
                params = Params(steps=n, s3=b == "s3", spark=args.spark)
                reports.append(run_one(b, seed, params, plant=args.plant))
                print(reports[-1].text(), flush=True)
                total += reports[-1].steps
                i += 1
    finally:
        if _S3 is not None:
            _S3.stop()
    summary: dict[str, Any] = {
        "runs": len(reports),
        "steps": sum(r.steps for r in reports),
        "kills": sum(r.kills for r in reports),
        "crash_points": dict(sum((r.crashes for r in reports), Counter())),
        "faults": dict(sum((r.faults for r in reports), Counter())),
        "records": dict(sum((r.records for r in reports), Counter())),
        "violations": sum(len(r.violations) for r in reports),
        "failing_seeds": [[r.backend, r.seed, r.replay] for r in reports if r.violations],
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(summary), flush=True)
    return 1 if summary["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
