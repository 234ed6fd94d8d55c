"""HELD: a reconciler whose lease runs out mid-run (timed by the store's modification
time of its claim entry, ctp_state/partition_log.py ``_lapsed_by_store_clock``) is named lapsed
by a second reconciler, which claims, builds the same L1 keys and commits. The first
one then commits: it is fenced (writer epoch below the fence floor), its release has
nothing to release, and its rewrite of the same deterministic L1 keys after the
commit changes no record. Every record is read back once, byte-identical, and a GC
afterwards deletes only what is safe."""

from __future__ import annotations

import threading
import time

from ctp_state.epoch import ClusterEpoch
from ctp_state.gc import run_gc
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.reconcile import build_files_locally, run_reconcile
from ctp_state.settings import ReconcileSettings
from ctp_state.topics import create_topic
from tests.support import plog, values


def test_a_reconciler_named_lapsed_mid_run_is_fenced_and_nothing_is_doubled(store, gate):
    create_topic(store, "t", 1)
    ce = ClusterEpoch(store)
    ce.advance()
    recs = [Record(f"r{i}".encode(), None, 1000 + i) for i in range(20)]
    with Producer(store, epoch_ttl_s=0) as prod:
        for i in range(0, 20, 5):
            assert prod.write([(("t", 0), recs[i : i + 5])])[0].accepted
    built = threading.Event()
    go_on = threading.Event()

    def slow_map(files):
        out = build_files_locally(store, files)
        built.set()
        go_on.wait(30)  # the first reconciler stalls after writing its files (GC pause, slow Spark)
        return out

    first: list = []
    cfg = ReconcileSettings(lease_ms=1500, target_file_bytes=1)  # one L1 file per chunk
    t = threading.Thread(target=lambda: first.append(run_reconcile(store, config=cfg, map_files=slow_map)))
    t.start()
    assert built.wait(30)
    time.sleep(3.2)  # past the lease by the store's clock (S3 mtimes have 1 s resolution)
    second = run_reconcile(store, config=ReconcileSettings(target_file_bytes=1))
    with Producer(store, epoch_ttl_s=0) as prod:  # more data between the two commits
        assert prod.write([(("t", 0), [Record(b"late", None, 5000)])])[0].accepted
    go_on.set()
    t.join(60)
    (p1,), (p2,) = first[0].partitions, second.partitions
    assert p2.status in ("reconciled", "advanced"), p2
    assert p1.status == "fenced", p1
    st = plog(store, "t", 0).read_state()
    assert st.last_reconciled_offset == 19 and [p.base_offset for p in st.pending] == [20]
    assert values(store) == [r.value for r in recs] + [b"late"]
    for _ in range(3):
        ce.advance()
    run_reconcile(store)
    run_gc(store, gate=gate)
    assert values(store) == [r.value for r in recs] + [b"late"]
