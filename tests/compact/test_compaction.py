"""Compaction (R11, I7): a partition's small L1 files merged into one, exactly once
against its state log, on both stores; killed at each of its crash points; raced by a
second compactor and by reconcilers; a reader holding the old file list."""

from __future__ import annotations

import json
import subprocess

import pytest

from ctp_state import layout
from ctp_state.compact import CompactJob, build_run, plan_runs, run_compaction
from ctp_state.partition_state import L1Ref
from ctp_state.read import read_partition
from ctp_state.reconcile import run_reconcile
from ctp_state.settings import CompactSettings, ReconcileSettings
from tests.support import CTP, assert_exactly_once, plog, produce_rounds

SMALL = CompactSettings(max_small_files=2, target_file_bytes=1 << 20)


def many_small_files(store, rounds=6, partitions=2, per=5, topic="t"):
    """``rounds`` reconciled rounds: as many small committed files per partition."""
    sent: dict[int, list] = {p: [] for p in range(partitions)}
    for _ in range(rounds):
        got = produce_rounds(store, topic=topic, partitions=partitions, rounds=1, per=per)
        for p, recs in got.items():
            sent[p] += recs
        run_reconcile(store, topics=[topic], config=ReconcileSettings())
    return sent


def files_of(store, topic="t", partition=0):
    return plog(store, topic, partition).read_state().committed_l1_files()


def test_plan_runs_merges_adjacent_small_files_up_to_the_target():
    refs = [L1Ref(f"k{i}", i, i, None) for i in range(7)]
    sizes = {"k0": 40, "k1": 40, "k2": 500, "k3": 30, "k4": 30, "k5": 30, "k6": 60}
    # k2 is at the target: it ends a run; k3..k6 exceed the target together: two runs
    assert [[f.key for f in r] for r in plan_runs(refs, sizes, 100)] == [["k0", "k1"], ["k3", "k4", "k5"]]
    assert plan_runs(refs[:1], sizes, 100) == []  # one file is no run
    assert plan_runs(refs, {}, 100) == []  # sizes unknown: nothing merged


def test_a_compaction_replaces_the_small_files_and_every_record_reads_once(store):
    sent = many_small_files(store)
    before = {p: files_of(store, "t", p) for p in sent}
    assert all(len(fs) == 6 for fs in before.values())
    summary = run_compaction(store, config=SMALL)
    assert summary.count("compacted") == 2 and not summary.failed, summary.as_dict()
    for p, old in before.items():
        now = files_of(store, "t", p)
        assert len(now) == 1
        assert now[0].key == layout.l1_key(
            "t", p, 0, 29, now[0].key.split("/")[2], plog(store, "t", p).read_state().l1_tags[0]
        )
        assert layout.parse_l1_key(now[0].key).compacted_by > 0
        for f in old:  # the replaced files stay until the GC deletes them behind its gate
            assert store.head(f.key) is not None
    assert_exactly_once(store, "t", sent)
    # nothing more to do: a rerun changes nothing
    again = run_compaction(store, config=SMALL)
    assert again.count("compacted") == 0 and again.files_written == 0
    # new records after the compaction append as before
    more = produce_rounds(store, topic="t", partitions=2, rounds=1, per=3)
    run_reconcile(store, topics=["t"])
    for p in sent:
        sent[p] += more[p]
    assert_exactly_once(store, "t", sent)


def test_a_dry_run_names_the_files_and_changes_nothing(store):
    many_small_files(store, rounds=3, partitions=1)
    before = plog(store, "t", 0).read_state()
    summary = run_compaction(store, config=SMALL, dry_run=True)
    assert summary.count("planned") == 1 and summary.files_replaced == 3
    assert plog(store, "t", 0).read_state() == before


def test_below_the_threshold_no_request_is_spent_on_a_partition(store):
    many_small_files(store, rounds=2, partitions=1)
    summary = run_compaction(store, config=CompactSettings(max_small_files=2, target_file_bytes=1 << 20))
    assert summary.count("compacted") == 0 and summary.partitions[0].status == "skipped"


def test_a_compacted_file_that_does_not_hold_the_replaced_records_is_never_committed(store):
    """A replaced file damaged after its commit: its CRC32C fails, nothing is written or
    committed for its run, and the partition reports the error."""
    many_small_files(store, rounds=3, partitions=1)
    victim = files_of(store)[1]
    data = bytearray(store.get(victim.key))
    data[len(data) // 2] ^= 0xFF
    store.delete_many([victim.key])
    store.put_if_absent(victim.key, bytes(data))
    before = plog(store, "t", 0).read_state()
    summary = run_compaction(store, config=SMALL)
    assert [p.status for p in summary.partitions] == ["error"] and "CRC32C" in summary.partitions[0].reason
    after = plog(store, "t", 0).read_state()
    assert after.committed_l1_files() == before.committed_l1_files() and not after.holders


def test_the_build_checks_offsets_exactly_once(store):
    """A run whose files do not tile (a forged job) is refused before anything is written."""
    many_small_files(store, rounds=3, partitions=1)
    fs = files_of(store)
    job = CompactJob("t", 0, plog(store, "t", 0).read_state().topic_id, 99, (fs[0], fs[2]))
    b = build_run(store, job)
    assert b.error is not None and "exactly once" in b.error
    assert store.head(job.key) is None


def test_a_fenced_compactor_never_commits(store, monkeypatch):
    """A compactor whose claim is taken over between its build and its commit (its lease
    ran out): its compact entries are rejected, the files stay as the log commits them."""
    from ctp_state import crashpoints
    from ctp_state.entries import AccessMode

    sent = many_small_files(store, rounds=3, partitions=1)
    log = plog(store, "t", 0)

    def take_over(point, index):
        if point == "compact_before_commit":
            st = log.read_state()
            holder = st.holders[0]
            # the lease as the log judges it: a claim stamped after it lapsed
            from ctp_state.entries import Claim

            log.append(
                st,
                lambda s: Claim(
                    s.writer_epoch + 1,
                    "other",
                    AccessMode.EXCLUSIVE,
                    holder.lease_until_ms + 10**6,
                    holder.lease_until_ms + 1,
                ),
            )

    crashpoints.install(take_over)
    try:
        summary = run_compaction(store, config=SMALL)
    finally:
        crashpoints.install(None)
    assert summary.partitions[0].status == "fenced", summary.as_dict()
    assert len(files_of(store)) == 3
    assert_exactly_once(store, "t", sent)


def test_compaction_across_a_trim_keeps_the_start_offset(store):
    from ctp_state.entries import AccessMode, Trim, TrimReason

    sent = many_small_files(store, rounds=4, partitions=1)
    log = plog(store, "t", 0)
    st = log.claim(log.read_state(), "op", AccessMode.EXCLUSIVE, lease_ms=60_000).outcome.state
    st = log.append(st, lambda s: Trim(7, TrimReason.DELETE_RECORDS, s.writer_epoch, "op")).outcome.state
    assert [(f.first, f.last) for f in st.committed_l1_files()] == [(5, 9), (10, 14), (15, 19)]
    run_compaction(store, config=SMALL)
    rows = read_partition(store, "t", 0).to_pylist()
    assert [r["offset"] for r in rows] == list(range(7, 20))
    assert [r["value"] for r in rows] == [r.value for r in sent[0][7:]]
    from ctp_state.errors import OffsetBeforeStart

    with pytest.raises(OffsetBeforeStart, match="start offset 7"):
        read_partition(store, "t", 0, 3)
    assert read_partition(store, "t", 0, 3, from_start=True).num_rows == 13


def test_a_reader_holding_the_old_file_list_still_reads_after_a_compaction(store):
    """The replaced files stay until the GC collects them behind the reader grace."""
    sent = many_small_files(store, rounds=3, partitions=1)
    old = files_of(store)
    run_compaction(store, config=SMALL)
    from ctp_state.l1 import read_l1

    offsets = [o for f in old for o in read_l1(store, f.key, f.crc32c).column("offset").to_pylist()]
    assert offsets == list(range(len(sent[0])))


# --- kill -9 at each crash point, then a rerun ------------------------------------------


@pytest.mark.parametrize(
    "fault", ["compact_after_claim", "compact_after_write", "compact_before_commit", "compact_after_commit"]
)
def test_kill_9_at_each_compaction_crash_point_then_a_rerun_converges(store, subprocess_env, fault):
    sent = many_small_files(store, rounds=4, partitions=2)
    env = {**subprocess_env, "CTP_FAULT": fault}
    args = ["compact", "--max-small-files", "2", "--json"]
    r = subprocess.run([CTP, *args], env=env, capture_output=True, text=True, timeout=120, start_new_session=True)
    assert r.returncode == -9, (r.returncode, r.stderr[-2000:])
    assert_exactly_once(store, "t", sent)  # killed anywhere: every record reads once
    env.pop("CTP_FAULT")
    # The killed run's claim holds until its lease lapses; a rerun with a short wait
    # would be refused: the test stands in for the lease by releasing it by hand.
    from ctp_state.entries import Release

    for p in sent:
        log = plog(store, "t", p)
        st = log.read_state()
        for h in st.holders:
            st = log.append(st, lambda s, h=h: Release(h.owner, h.writer_epoch)).outcome.state
    r = subprocess.run([CTP, *args], env=env, capture_output=True, text=True, timeout=120, start_new_session=True)
    assert r.returncode == 0, r.stderr[-2000:]
    for p in sent:
        assert len(files_of(store, "t", p)) == 1, json.loads(r.stdout)
    assert_exactly_once(store, "t", sent)


def test_two_compactors_racing_replace_each_file_once(store):
    """Two runs at once on the same partitions: the claims let one merge each partition;
    the other finds the claim held or nothing left to do. No file is replaced twice."""
    import threading

    sent = many_small_files(store, rounds=5, partitions=3)
    out = []
    barrier = threading.Barrier(2)

    def one():
        barrier.wait()
        out.append(run_compaction(store, config=SMALL))

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    statuses = [p.status for s in out for p in s.partitions]
    assert statuses.count("compacted") == 3 and not [s for s in statuses if s in ("error", "fenced")], statuses
    assert sum(s.files_replaced for s in out) == 15
    for p in sent:
        assert len(files_of(store, "t", p)) == 1
    assert_exactly_once(store, "t", sent)
