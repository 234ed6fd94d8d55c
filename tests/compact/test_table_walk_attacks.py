"""(From the round-five adversarial review: a scenario that held.) Random walks with a table (SQLite catalog): reconciles, compactions, DeleteRecords,
publishes and GC runs (with the table hook, every grace 0, snapshots expired hard at
times). After each step: no retained snapshot names a file missing from the store; every
retained snapshot's files of a partition tile without overlap (each record once); the
head holds exactly the committed files' records."""

from __future__ import annotations

import itertools
import random

import pytest

from ctp_state import crashpoints
from ctp_state.compact import run_compaction
from ctp_state.gc import run_gc
from ctp_state.reconcile import run_reconcile
from ctp_state.retention import delete_records
from ctp_state.settings import CompactSettings, GcSettings
from ctp_state.table.catalog import CatalogConfig
from ctp_state.table.maintenance import CatalogTables
from ctp_state.topics import create_topic
from tests.support import plog, produce_rounds
from tests.support.table import do_publish, table_of

SMALL = CompactSettings(max_small_files=1, target_file_bytes=1 << 20)
NOW = GcSettings(l1_grace_s=0, l1_reader_grace_s=0)


def snapshot_files(table, store):
    out = {}
    for snap in table.snapshots():
        files = []
        for m in snap.manifests(table.io):
            for e in m.fetch_manifest_entry(table.io, discard_deleted=True):
                files.append(store.key_of(e.data_file.file_path))
        out[snap.snapshot_id] = files
    return out


def check_table(store, config, tmp_path, P):
    from ctp_state import layout

    try:
        table = table_of(store, config, tmp_path)
    except Exception:
        return
    for sid, files in snapshot_files(table, store).items():
        missing = [k for k in files if store.head(k) is None]
        assert not missing, f"snapshot {sid} names deleted files {missing}"
        per = {}
        for k in files:
            n = layout.parse_l1_key(k)
            per.setdefault(n.partition, []).append((n.first, n.last))
        for p, rs in per.items():
            rs.sort()
            for a, b in itertools.pairwise(rs):
                assert a[1] + 1 == b[0], f"snapshot {sid} partition {p}: {a} then {b} (gap or overlap)"
    head = table.current_snapshot()
    if head is None:
        return
    # the head after a publish: exactly the committed files (checked only right after a publish)


@pytest.mark.parametrize("seed", range(5))
def test_a_random_walk_with_publishes_and_expiry_never_leaves_a_snapshot_naming_a_deleted_file(
    fstore, plain_gate, tmp_path, seed
):
    store = fstore
    config = CatalogConfig(uri=f"sqlite:///{tmp_path}/catalog.db", namespace="ctp")
    r = random.Random(seed)
    P = 2
    create_topic(store, "t", P)
    ops = []
    for _ in range(16):
        op = r.choice(["rec", "rec", "compact", "delete", "publish", "publish", "gc", "gc_expire", "race"])
        ops.append(op)
        if op == "rec":
            produce_rounds(store, topic="t", partitions=P, rounds=1, per=r.randint(1, 3))
            run_reconcile(store, topics=["t"])
        elif op == "compact":
            run_compaction(store, config=SMALL)
        elif op == "delete":
            p = r.randrange(P)
            st = plog(store, "t", p).read_state()
            if st.last_reconciled_offset + 1 > st.start_offset:
                delete_records(store, "t", p, r.randint(st.start_offset + 1, st.last_reconciled_offset + 1))
        elif op == "publish":
            do_publish(store, config, tmp_path)
            table = table_of(store, config, tmp_path)
            got = sorted(store.key_of(t.file.file_path) for t in table.scan().plan_files())
            want = sorted(f.key for p in range(P) for f in plog(store, "t", p).read_state().committed_l1_files())
            assert got == want, ops
        elif op in ("gc", "gc_expire"):
            keep = 1 if op == "gc_expire" else 100
            hook = CatalogTables(store, config, home=str(tmp_path), keep=keep, max_age_s=0 if keep == 1 else 1e9)
            rec = run_gc(store, gate=plain_gate, config=NOW, tables=hook)
            assert rec.status == "ok", (ops, rec.gate.failures)
        elif op == "race":
            # a publish pauses before its commit; a compaction, a delete-records and a GC run
            done = []

            def meanwhile(point, index, done=done):
                if point == "publish_before_commit" and not done:
                    done.append(1)
                    run_compaction(store, config=SMALL)
                    st = plog(store, "t", 0).read_state()
                    if st.last_reconciled_offset + 1 > st.start_offset:
                        delete_records(store, "t", 0, st.last_reconciled_offset)
                    hook = CatalogTables(store, config, home=str(tmp_path), keep=1, max_age_s=0)
                    rec = run_gc(store, gate=plain_gate, config=NOW, tables=hook)
                    assert rec.status == "ok", (ops, rec.gate.failures)

            produce_rounds(store, topic="t", partitions=P, rounds=1, per=2)
            run_reconcile(store, topics=["t"])
            crashpoints.install(meanwhile)
            try:
                do_publish(store, config, tmp_path)
            finally:
                crashpoints.install(None)
        check_table(store, config, tmp_path, P)
    print(seed, ops)
