"""(From the round-five adversarial review: a scenario that held.) Topic delete + re-create while a compaction / a retention run is in flight (idea 7)."""

from __future__ import annotations

from ctp_state import layout
from ctp_state.compact import build_locally, run_compaction
from ctp_state.deletion import delete_topic
from ctp_state.gc import run_gc
from ctp_state.read import read_partition
from ctp_state.reconcile import run_reconcile
from ctp_state.settings import CompactSettings, GcSettings
from ctp_state.topics import create_topic
from tests.compact.test_compaction import many_small_files
from tests.support import plog, produce_rounds

SMALL = CompactSettings(max_small_files=2, target_file_bytes=1 << 20)
NOW = GcSettings(l1_grace_s=0, l1_reader_grace_s=0, topic_removal_grace_s=0, l1_full_sweep_s=0)


def test_a_compaction_across_a_delete_and_recreate_commits_nothing_into_either(fstore, plain_gate):
    store = fstore
    many_small_files(store, rounds=3, partitions=1)
    new_sent = {}

    def build(jobs):
        out = build_locally(store, jobs, compression="zstd")
        delete_topic(store, "t")
        create_topic(store, "t", 1)
        for _ in range(3):
            got = produce_rounds(store, topic="t", partitions=1, rounds=1, per=4)
            new_sent.setdefault(0, []).extend(got[0])
            run_reconcile(store, topics=["t"])
        return out

    s = run_compaction(store, config=SMALL, map_runs=build)
    print(s.as_dict()["partitions"])
    assert s.count("compacted") == 0
    for _ in range(3):
        rec = run_gc(store, gate=plain_gate, config=NOW)
        assert rec.status == "ok", rec.gate.failures
    # the new incarnation: whole and once
    rows = read_partition(store, "t", 0).to_pylist()
    assert [r["value"] for r in rows] == [x.value for x in new_sent[0]]
    # compact the new one, gc, read
    s = run_compaction(store, config=SMALL)
    assert s.count("compacted") == 1
    for _ in range(2):
        assert run_gc(store, gate=plain_gate, config=NOW).status == "ok"
    rows = read_partition(store, "t", 0).to_pylist()
    assert [r["value"] for r in rows] == [x.value for x in new_sent[0]]
    committed = {f.key for f in plog(store, "t", 0).read_state().committed_l1_files()}
    assert {o.key for o in store.list(layout.L1_ROOT)} == committed
