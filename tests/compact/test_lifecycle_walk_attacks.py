"""(From the round-five adversarial review: a scenario that held.) Random walks over the whole L1 lifecycle on a file store: reconciles (some crashing
before their commit: orphans), compactions (some crashing before their commit: .w
orphans), DeleteRecords anywhere, GC runs with every grace at 0. After each step: every
committed file is in the store and every retained record reads exactly once. At the end,
with full sweeps, nothing but committed files is left."""

from __future__ import annotations

import random

import pytest

from ctp_state import crashpoints, layout
from ctp_state.compact import run_compaction
from ctp_state.gc import run_gc
from ctp_state.read import read_partition
from ctp_state.reconcile import run_reconcile
from ctp_state.retention import delete_records
from ctp_state.settings import CompactSettings, GcSettings
from tests.support import plog, produce_rounds

SMALL = CompactSettings(max_small_files=1, target_file_bytes=1 << 20)
FAST = GcSettings(l1_grace_s=0, l1_reader_grace_s=0)
FULL = GcSettings(l1_grace_s=0, l1_reader_grace_s=0, l1_full_sweep_s=0)


class Boom(Exception):
    pass


def crash_at(point):
    def h(p, i):
        if p == point:
            raise Boom(p)

    return h


def check(store, sent, P):
    for p in range(P):
        st = plog(store, "t", p).read_state()
        for f in st.committed_l1_files():
            assert store.head(f.key) is not None, f"committed file missing: {f.key}"
        rows = read_partition(store, "t", p).to_pylist()
        want = sent[p][st.start_offset :]
        assert [r["offset"] for r in rows] == list(range(st.start_offset, st.start_offset + len(want))), p
        assert [r["value"] for r in rows] == [x.value for x in want]


@pytest.mark.parametrize("seed", range(6))
def test_a_random_walk_of_reconciles_compactions_delete_records_crashes_and_gcs_keeps_every_retained_record_once(
    fstore, plain_gate, seed
):
    store = fstore
    r = random.Random(seed)
    P = 1
    sent = {p: [] for p in range(P)}
    log = []
    import collections

    stats = collections.Counter()
    from ctp_state.topics import create_topic

    create_topic(store, "t", P)
    for _ in range(20):
        op = r.choice(["rec", "rec", "crash_rec", "compact", "crash_compact", "delete", "gc", "gc"])
        log.append(op)
        if op in ("rec", "crash_rec"):
            got = produce_rounds(store, topic="t", partitions=P, rounds=1, per=r.randint(1, 4))
            for p in got:
                sent[p] += got[p]
            if op == "crash_rec":
                crashpoints.install(crash_at("before_commit"))
            try:
                run_reconcile(store, topics=["t"])
            except Boom:
                pass
            finally:
                crashpoints.install(None)
        elif op in ("compact", "crash_compact"):
            if op == "crash_compact":
                crashpoints.install(crash_at("compact_before_commit"))
            try:
                sm_ = run_compaction(store, config=SMALL)
                stats["compacted"] += sm_.count("compacted")
            except Boom:
                stats["crashed_compact"] += 1
                pass
            finally:
                crashpoints.install(None)
        elif op == "delete":
            for p in range(P):
                st = plog(store, "t", p).read_state()
                if st.last_reconciled_offset + 1 > st.start_offset:
                    delete_records(store, "t", p, r.randint(st.start_offset + 1, st.last_reconciled_offset + 1))
        else:
            rec = run_gc(store, gate=plain_gate, config=r.choice([FAST, FULL]))
            assert rec.status == "ok", (log, rec.gate.failures)
            stats["retired"] += rec.l1_retired_deleted or 0
            stats["orphans"] += rec.l1_orphans_deleted or 0
        check(store, sent, P)
    # settle: everything reconciled, three full GCs
    run_reconcile(store, topics=["t"])
    for _ in range(3):
        rec = run_gc(store, gate=plain_gate, config=FULL)
        assert rec.status == "ok", (log, rec.gate.failures)
    check(store, sent, P)
    print(seed, dict(stats), log)
    committed = {f.key for p in range(P) for f in plog(store, "t", p).read_state().committed_l1_files()}
    left = {o.key for o in store.list(layout.L1_ROOT)}
    assert left == committed, (log, sorted(k.split("/")[-1] for k in left - committed))
