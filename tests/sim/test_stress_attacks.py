"""Everything at once (HELD): producers, an epoch advancer, reconcilers and GCs running
concurrently on one store for a while, the GC behind a gate that passes everything (so
only M and the I1 backstop protect the data). Afterwards every acknowledged record is
read back at its offset, byte-identical, exactly once, and no rejected record appears.
"""

from __future__ import annotations

import random
import threading
import time

from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import CtpError, GateFailed
from ctp_state.gc import GateResult, run_gc
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.read import read_partition
from ctp_state.reconcile import run_reconcile
from ctp_state.settings import GcSettings, ReconcileSettings
from ctp_state.topics import create_topic

PARTITIONS = 3
SECONDS = 20


def test_producers_reconcilers_gcs_and_advances_together_lose_and_duplicate_nothing(fstore):
    store = fstore
    create_topic(store, "t", PARTITIONS)
    stop = threading.Event()
    accepted: dict[int, dict[int, bytes]] = {p: {} for p in range(PARTITIONS)}
    not_accepted: set[bytes] = set()
    errors: list[str] = []
    lock = threading.Lock()
    gc_runs = []

    def producer(n: int) -> None:
        rng = random.Random(n)
        with Producer(store, epoch_ttl_s=0.2, append_threads=4) as prod:
            i = 0
            while not stop.is_set():
                chunks = []
                for p in rng.sample(range(PARTITIONS), rng.randint(1, PARTITIONS)):
                    recs = [Record(f"p{n}-{i}-{p}-{j}".encode()) for j in range(rng.randint(1, 4))]
                    chunks.append((("t", p), recs))
                i += 1
                for v, (_, recs) in zip(prod.write(chunks), chunks):
                    with lock:
                        if v.accepted and not v.duplicate:
                            for k, r in enumerate(recs):
                                accepted[v.partition][v.base_offset + k] = r.value
                        elif v.outcome == "rejected":
                            not_accepted.update(r.value for r in recs)

    def advancer() -> None:
        ce = ClusterEpoch(store)
        while not stop.is_set():
            ce.advance()
            time.sleep(0.3)

    def reconciler() -> None:
        while not stop.is_set():
            try:
                run_reconcile(store, config=ReconcileSettings(lease_ms=3000, target_file_bytes=2000, idle_lag=1))
            except CtpError as e:
                errors.append(f"reconcile: {e}")
            time.sleep(0.2)

    def gc() -> None:
        while not stop.is_set():
            try:
                gc_runs.append(run_gc(store, gate=lambda frames: GateResult(True, []), config=GcSettings(l1_grace_s=0)))
            except (CtpError, GateFailed) as e:
                errors.append(f"gc: {e}")
            time.sleep(0.2)

    threads = [threading.Thread(target=producer, args=(n,)) for n in range(2)]
    threads += [
        threading.Thread(target=advancer),
        threading.Thread(target=reconciler),
        threading.Thread(target=reconciler),
        threading.Thread(target=gc),
    ]
    for t in threads:
        t.start()
    time.sleep(SECONDS)
    stop.set()
    for t in threads:
        t.join(120)

    deleted = sum(r.deleted for r in gc_runs)
    assert gc_runs and deleted > 0, (len(gc_runs), errors[:5])
    for p in range(PARTITIONS):
        rows = read_partition(store, "t", p).to_pylist()
        got = {r["offset"]: r["value"] for r in rows}
        assert [r["offset"] for r in rows] == list(range(len(rows)))
        assert got == accepted[p], f"t/{p}: {len(got)} read, {len(accepted[p])} acknowledged"
        assert not (set(got.values()) & not_accepted)
    print(
        f"acknowledged {sum(map(len, accepted.values()))} records, {len(not_accepted)} rejected, "
        f"{len(gc_runs)} GC runs deleted {deleted} L0 objects, {len(errors)} run errors: {errors[:3]}"
    )
