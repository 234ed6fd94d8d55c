"""Benchmarks for the foundation, printed as JSON with side-by-side ratios.

    python benchmarks/bench_state.py [--partitions 1000] [--entries 100] [--s3-partitions 0]

- fence: in-process fence operations per second (in-window shared fences on 1 and 4
  threads, and new-epoch fences that slide the window), next to an uncontended
  ``threading.Lock`` acquire/release on the same machine as the reference.
- state reads: time to read the current state of N partitions (snapshot + tail, as
  ``ctp status`` and the GC do) next to replaying every log from offset 0, on the
  local-filesystem store (and optionally S3: a local SeaweedFS server).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from ctp_state import layout, state as sm, window
from ctp_state.entries import AccessMode, Claim, Placeholder, encode
from ctp_state.fence import EpochFence
from ctp_state.partition_log import PartitionLog
from ctp_state.status import read_states
from ctp_state.storage import ObjectStore, open_store
from ctp_state.topics import create_topic, get_topic


def _fence() -> EpochFence:
    box = [window.slide(sm.PartitionState("t", 0), 1)]
    return EpochFence(lambda: box[0], lambda v: box.__setitem__(0, v), threading.Lock())


def bench_fence(n: int) -> dict:
    lock = threading.Lock()
    t0 = time.perf_counter()
    for _ in range(n):
        lock.acquire()
        lock.release()
    lock_ops = n / (time.perf_counter() - t0)

    f = _fence()
    t0 = time.perf_counter()
    for _ in range(n):
        with f.fence(1):
            pass
    shared_1 = n / (time.perf_counter() - t0)

    f = _fence()
    per = n // 4

    def worker() -> None:
        for _ in range(per):
            with f.fence(1):
                pass

    threads = [threading.Thread(target=worker) for _ in range(4)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    shared_4 = 4 * per / (time.perf_counter() - t0)

    f = _fence()
    t0 = time.perf_counter()
    for e in range(2, n + 2):
        with f.fence(e):
            pass
    slides = n / (time.perf_counter() - t0)
    assert f.probes.window_slides == n
    return {
        "ops": n,
        "lock_acquire_release_per_s": round(lock_ops),
        "fence_in_window_1_thread_per_s": round(shared_1),
        "fence_in_window_4_threads_per_s": round(shared_4),
        "fence_new_epoch_slide_per_s": round(slides),
        "ratio_fence_to_plain_lock": round(shared_1 / lock_ops, 4),
    }


def populate(store: ObjectStore, topic: str, partitions: int, entries: int, snapshot_every: int) -> None:
    create_topic(store, topic, partitions, exist_ok=True)

    def fill(p: int) -> None:
        log = PartitionLog(store, topic, p, snapshot_every=snapshot_every)
        s = log.read_state()
        s = log.append(s, lambda st: Claim(st.writer_epoch + 1, "bench", AccessMode.EXCLUSIVE, 1, 0)).outcome.state
        # Write the rest directly (what many producers would have appended) and let the
        # last reader write the snapshot, as in production.
        for off in range(s.applied_offset + 1, entries):
            store.put_if_absent(
                layout.log_entry(topic, p, off), encode(Placeholder(1, f"l0/000/{1:018d}/x{off}.l0", 8, 100, 10, 0))
            )
        log.read_state()

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(fill, range(partitions)))


def bench_reads(store: ObjectStore, label: str, partitions: int, entries: int, snapshot_every: int) -> dict:
    topic = f"bench-{partitions}-{entries}"
    t0 = time.perf_counter()
    populate(store, topic, partitions, entries, snapshot_every)
    setup_s = time.perf_counter() - t0
    t = get_topic(store, topic)
    t0 = time.perf_counter()
    states = read_states(store, [t])
    snap_s = time.perf_counter() - t0
    assert all(s.applied_offset == entries - 1 for s in states)

    def full(p: int) -> sm.PartitionState:
        log = PartitionLog(store, topic, p, snapshot_every=10**9)
        s = log.empty_state()
        for off, e in log.entries(-1):
            s = sm.apply(s, off, e).state
        return s

    t0 = time.perf_counter()
    with ThreadPoolExecutor(32) as pool:
        replayed = list(pool.map(full, range(partitions)))
    full_s = time.perf_counter() - t0
    assert [s.persisted for s in replayed] == [s.persisted for s in states]
    m_t0 = time.perf_counter()
    m = min(s.m for s in states)
    m_s = time.perf_counter() - m_t0
    return {
        "backend": label,
        "partitions": partitions,
        "entries_per_partition": entries,
        "snapshot_every": snapshot_every,
        "setup_seconds": round(setup_s, 2),
        "read_states_snapshot_plus_tail_seconds": round(snap_s, 3),
        "read_states_full_replay_seconds": round(full_s, 3),
        "ratio_snapshot_to_full_replay": round(snap_s / full_s, 3),
        "min_m_over_states_seconds": round(m_s, 6),
        "m": m,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fence-ops", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--entries", type=int, default=100)
    ap.add_argument("--snapshot-every", type=int, default=64)
    ap.add_argument("--s3-partitions", type=int, default=0, help="also measure S3 (a local SeaweedFS) with this many")
    args = ap.parse_args()
    out: dict = {"benchmark": "state", "cpus": os.cpu_count(), "fence": bench_fence(args.fence_ops), "state_reads": []}
    with tempfile.TemporaryDirectory() as d:
        store = open_store(f"file://{d}/store", {"CTP_FSYNC": "0"})
        out["state_reads"].append(bench_reads(store, "file", args.partitions, args.entries, args.snapshot_every))
    if args.s3_partitions:
        from ctp_state.local_s3 import LocalS3

        with tempfile.TemporaryDirectory() as d, LocalS3(d) as server:
            store = open_store(server.url("bench"), server.env)
            out["state_reads"].append(
                bench_reads(store, "s3-seaweedfs", args.s3_partitions, args.entries, args.snapshot_every)
            )
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
