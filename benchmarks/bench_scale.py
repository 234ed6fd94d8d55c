"""Scale: many partitions, mostly idle, on the local store. Printed as JSON.

    python benchmarks/bench_scale.py [--partitions 10000,100000] [--topic-size 10000]

For each size N, on a fresh store (fsync off, as the other benchmarks), each phase runs
in its own process after a sync (so no phase pays for the writeback of the one before),
timed, with that process's peak RSS:

- create: ``create_topic`` of N partitions (topics of ``--topic-size``; the limit of one
  topic is 100,000);
- m: C and every partition's state from its log, M and who holds it back (what the GC
  reads first);
- reconcile: one reconcile run after C advanced by the idle lag, nothing to lift: every
  partition is idle and trails C, so R6 advances each (one claim, one advance, one
  release entry a partition) and a snapshot at the log end of each;
- m_after: M again, as every GC after a reconcile reads it;
- gc: one whole GC run behind the Great Expectations gate (the store has no L0 objects:
  nothing to delete), including the history record and the partition view; importing the gate
  (Great Expectations, pandas), which a GC process pays once, is timed apart
  (``gate_import_seconds``). Being the first, it reads every log, and leaves the state
  pack later runs start from;
- reconcile_pack: C advanced by the idle lag, one reconcile run starting from the GC's
  state pack (a GET of each partition's last entry, the 404 after it, and a tick each):
  every partition due at once, as after C moved by the lag with no reconcile between;
- gc_pack: the GC run after it, from its pack: M from the pack's states and the ticks
  the reconcile reported (a GET of each last entry and of each tick, no listing), the
  gate and the records, as every GC between full reads (``partitions_read`` says how
  many it read from their logs: 0);
- reconcile_spread: C advanced by one, one reconcile run from that GC's pack at the
  defaults: the partitions whose phase this epoch is tick (about ``1/idle_lag`` of
  them), the others are not read: the steady state of an idle cluster, every run;
- reconcile_quiet: C advanced by one more, one reconcile run with ``tick_together``:
  every partition is quiet and none is due by the lag, so none is read (one listing of
  the empty L0 root; ``advanced``: 0): the reconcile between ticks when every partition
  ticks in the same run.

The GC phases also report ``m_inputs_seconds``: from the run's start until C and every
partition's state are read (its history, the pack, the summaries, the logs or ticks),
after which M is a pure function of them.

Per-partition figures (seconds per 1,000 partitions) at each size show what grows
faster than linearly.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

PHASES = (
    "create",
    "m",
    "reconcile",
    "m_after",
    "gc",
    "reconcile_pack",
    "gc_pack",
    "reconcile_spread",
    "reconcile_quiet",
)


def phase(name: str, root: str, partitions: int, topic_size: int) -> dict:
    """One phase in this process; returns its time and this process's peak RSS."""
    from ctp_state.epoch import ClusterEpoch
    from ctp_state.gc import compute_m, gather, run_gc
    from ctp_state.reconcile import run_reconcile
    from ctp_state.settings import GcSettings, ReconcileSettings
    from ctp_state.storage import LocalStore
    from ctp_state.topics import create_topic

    store = LocalStore(os.path.join(root, "store"), fsync=False)
    out: dict = {}
    if name in ("gc", "gc_pack"):  # a GC task pays this once per process: reported apart from the run
        t0 = time.perf_counter()
        from expectations.gate import GxGate

        out["gate_import_seconds"] = round(time.perf_counter() - t0, 3)
    t0 = time.perf_counter()
    if name == "create":
        for t in range(0, partitions, topic_size):
            create_topic(store, f"t{t // topic_size}", min(topic_size, partitions - t))
    elif name in ("m", "m_after"):
        c, views = gather(store)
        d = compute_m(c, views, now_ms=int(time.time() * 1000))  # type: ignore[arg-type]
        out.update(m=d.m, held_by=len(d.held_by), partitions_read=len(views))
    elif name in ("reconcile", "reconcile_pack", "reconcile_quiet", "reconcile_spread"):
        # every partition now trails C enough for R6; or, between ticks, by one epoch
        between = name in ("reconcile_quiet", "reconcile_spread")
        for _ in range(1 if between else ReconcileSettings().idle_lag):
            ClusterEpoch(store).advance()
        s = run_reconcile(store, config=ReconcileSettings(tick_together=name == "reconcile_quiet"))
        out.update(advanced=s.partitions_advanced, reconciled=s.partitions_reconciled, ok=s.ok)
    elif name in ("gc", "gc_pack"):
        # Not a dry run (the store has no L0 objects: nothing to delete), so the L1 sweep
        # leaves its watermarks and the next run may start from the pack.
        read_done: list[float] = []

        def progress(stage: str, done: int, total: int) -> None:
            if stage == "read" and done == total and not read_done:
                read_done.append(time.perf_counter() - t0)

        rec = run_gc(store, gate=GxGate(os.path.join(root, "report")), config=GcSettings(), on_progress=progress)
        out.update(status=rec.status, m=rec.m, cluster_epoch=rec.cluster_epoch, partitions_read=rec.partitions_read)
        out["m_inputs_seconds"] = round(read_done[0], 3)  # the run's start to M's inputs read (C, every state)
    took = time.perf_counter() - t0
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"phase": name, "seconds": round(took, 3), "peak_rss_mib": round(rss_mib), **out}


def run_size(partitions: int, topic_size: int) -> dict:
    root = tempfile.mkdtemp(prefix="ctp-bench-scale-")
    env = {**os.environ, "CTP_FSYNC": "0"}
    row: dict = {"partitions": partitions}
    try:
        for name in PHASES:
            os.sync()  # not timed: the previous phase's writes are not this phase's cost
            cmd = [sys.executable, __file__, "--phase", name, "--root", root, "--partitions", str(partitions)]
            cmd += ["--topic-size", str(topic_size)]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"phase {name} at {partitions} partitions failed:\n{done.stderr[-3000:]}")
            res = json.loads(done.stdout.strip().splitlines()[-1])
            res["s_per_1k_partitions"] = round(res["seconds"] / partitions * 1000, 4)
            row[name] = res
            print(json.dumps({"scale": {"partitions": partitions, **res}}), file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", default="10000,100000")
    ap.add_argument("--topic-size", type=int, default=10_000)
    ap.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phase:
        print(json.dumps(phase(args.phase, args.root, int(args.partitions), args.topic_size)))
        return
    sizes = [int(x) for x in args.partitions.split(",")]
    rows = [run_size(n, args.topic_size) for n in sizes]
    result: dict = {"machine": {"cpus": os.cpu_count()}, "scale": rows}
    if len(rows) > 1:  # growth per partition from the smallest size to each larger one
        first = rows[0]
        result["per_partition_growth"] = {
            f"{first['partitions']}->{r['partitions']}": {
                p: round(r[p]["s_per_1k_partitions"] / first[p]["s_per_1k_partitions"], 2) for p in PHASES
            }
            for r in rows[1:]
        }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
