"""(From the twenty-fifth session's adversarial review.) A compaction that claims after
a GC read the partition's state writes its file at or below LR, where a GC collects
what no commit names; it may commit that file after the GC listed L1. The GC must not
collect it, whatever its clock or its graces say: the writer epoch in the file's key is
newer than any the GC's state knows, so its claim may still commit it (only a later
claim fences it). Before the fix the file went as an orphan (and, with a second GC
that deleted the files it replaced, the records were in no L1 file at all).

The races are made deterministic in one process: the GC's state read and its L1 sweep
are wrapped so that the compaction claims and writes right after the read and commits
right after the listing. One case races a real ``ctp compact`` process. Both stores."""

from __future__ import annotations

import importlib
import os
import subprocess
import threading
import time

import pytest

from ctp_state import layout
from ctp_state.compact import build_locally, run_compaction
from ctp_state.gc import l1_sweep, run_gc
from ctp_state.partition_state import L1Ref
from ctp_state.reconcile import run_reconcile
from ctp_state.settings import CompactSettings, GcSettings, ReconcileSettings
from tests.compact.test_compaction import many_small_files
from tests.support import CTP, assert_exactly_once, plog, produce_rounds

prepare = importlib.import_module("ctp_state.gc.prepare")  # the module (ctp_state.gc exports a function of its name)

SMALL = CompactSettings(max_small_files=2, target_file_bytes=1 << 20)
EVERY_LOG = GcSettings(l1_grace_s=0, l1_reader_grace_s=0, full_read_every=1)
TWO_HOURS = 7200.0


def l1_keys(store) -> set[str]:
    return {o.key for o in store.list(layout.L1_ROOT)}


def committed_missing(store, topic="t", partitions=1) -> list[str]:
    return [
        f.key
        for p in range(partitions)
        for f in plog(store, topic, p).read_state().committed_l1_files()
        if store.head(f.key) is None
    ]


def gc_racing_a_compaction(store, monkeypatch, gate, config, *, clock=time.time, fail_build=False):
    """One GC; a compaction claims and writes its file right after the GC read the
    partitions' states, and commits right after the GC's L1 sweep listed (with
    ``fail_build``, it gives up after writing instead). Returns (GC record, compaction
    summary)."""
    written, go = threading.Event(), threading.Event()
    out = {}

    def map_runs(jobs):
        builds = build_locally(store, jobs, compression="zstd")
        written.set()
        assert go.wait(60)
        if fail_build:
            raise OSError("the compactor gives up after writing its file")
        return builds

    def compactor():
        try:
            out["compaction"] = run_compaction(store, config=SMALL, map_runs=map_runs)
        except OSError as e:
            out["compaction"] = e
        finally:
            written.set()

    th = threading.Thread(target=compactor)
    real_gather, real_sweep = prepare.gather_all, l1_sweep.sweep

    def gather_all(*a, **kw):
        got = real_gather(*a, **kw)
        th.start()  # the claim comes after the GC's read
        assert written.wait(60)
        return got

    def sweep(*a, **kw):
        res = real_sweep(*a, **kw)
        go.set()  # the commit comes after the GC's listing
        th.join(60)
        return res

    with monkeypatch.context() as m:
        m.setattr(prepare, "gather_all", gather_all)
        m.setattr(l1_sweep, "sweep", sweep)
        try:
            rec = run_gc(store, gate=gate, config=config, clock=clock)
        finally:
            go.set()
            if th.is_alive() or th.ident is not None:
                th.join(60)
    return rec, out["compaction"]


def _settings(how):
    if how == "grace0":
        return GcSettings(l1_grace_s=0, l1_reader_grace_s=0, l1_full_sweep_s=0), time.time
    # every grace at its default; the GC host's clock two hours fast
    return GcSettings(l1_full_sweep_s=0), (lambda: time.time() + TWO_HOURS)


@pytest.mark.parametrize("how", ["grace0", "fast_clock"])
@pytest.mark.parametrize("listing", ["full_sweep", "whole_after_a_compaction"])
def test_a_compaction_claimed_after_the_gcs_read_keeps_its_file_through_the_gcs_listing(
    store, monkeypatch, plain_gate, how, listing
):
    sent = many_small_files(store, rounds=4, partitions=1)
    if listing == "whole_after_a_compaction":
        # the steady state after a compaction: its retired files wait out the reader
        # grace, so every run lists the partition whole; a second compaction races one
        run_compaction(store, config=SMALL)
        for _ in range(3):
            got = produce_rounds(store, topic="t", partitions=1, rounds=1, per=5)
            sent[0] += got[0]
            run_reconcile(store, topics=["t"], config=ReconcileSettings())
        first = run_gc(store, gate=plain_gate, config=GcSettings(l1_grace_s=0))
        assert first.status == "ok" and first.l1_retired_kept > 0
    config, clock = _settings(how)
    rec, summary = gc_racing_a_compaction(store, monkeypatch, plain_gate, config, clock=clock)
    assert summary.count("compacted") == 1, summary.as_dict()
    assert rec.status == "ok", rec.gate.failures
    assert rec.l1_orphans_deleted == 0
    assert not committed_missing(store), "a committed L1 file was deleted by the GC"
    assert_exactly_once(store, "t", sent)
    # a run that reads the log sees the commit: the files it replaced go, and only those
    assert run_gc(store, gate=plain_gate, config=EVERY_LOG).status == "ok"
    assert l1_keys(store) == {f.key for f in plog(store, "t", 0).read_state().committed_l1_files()}
    assert_exactly_once(store, "t", sent)


def _age(root, seconds):
    """Every object of the file store written ``seconds`` earlier (time passing, as
    the store's clock sees it)."""
    for dirpath, _, names in os.walk(root):
        for name in names:
            f = os.path.join(dirpath, name)
            st = os.stat(f)
            os.utime(f, (st.st_atime - seconds, st.st_mtime - seconds))


def _two_gcs(store, monkeypatch, gate, cfg1, cfg2, *, clock1=time.time, between=lambda: None):
    """GC1 reads the states and stalls; a compaction claims, writes and commits; GC2 runs
    whole (its state names the compaction: it checks the new file and deletes the ones it
    replaced); then GC1 lists L1 and goes on."""
    seen = {}
    real_gather = prepare.gather_all

    def gather_all(*a, **kw):
        got = real_gather(*a, **kw)
        if "gc2" not in seen:
            seen["gc2"] = None
            seen["compaction"] = run_compaction(store, config=SMALL)
            between()
            seen["gc2"] = run_gc(store, gate=gate, config=cfg2)
        return got

    with monkeypatch.context() as m:
        m.setattr(prepare, "gather_all", gather_all)
        rec1 = run_gc(store, gate=gate, config=cfg1, clock=clock1)
    return rec1, seen["gc2"], seen["compaction"]


def test_a_gc_stalled_after_its_read_while_a_compaction_and_another_gc_run_deletes_neither_copy(
    store, monkeypatch, plain_gate
):
    sent = many_small_files(store, rounds=4, partitions=1)
    assert run_gc(store, gate=plain_gate, config=GcSettings(l1_grace_s=0)).status == "ok"  # W at LR
    cfg1 = GcSettings(l1_grace_s=0, l1_reader_grace_s=0, l1_full_sweep_s=0)  # the day's full sweep
    cfg2 = GcSettings(l1_grace_s=0, l1_reader_grace_s=0, full_read_every=1)  # a run that reads every log
    rec1, rec2, summary = _two_gcs(store, monkeypatch, plain_gate, cfg1, cfg2)
    assert summary.count("compacted") == 1
    assert rec2.status == "ok" and rec2.l1_retired_deleted == 4  # GC2 deleted the replaced files
    assert rec1.status == "ok" and rec1.l1_orphans_deleted == 0  # GC1 left the compacted one
    assert not committed_missing(store)
    assert_exactly_once(store, "t", sent)


def test_with_every_default_a_gc_stalled_two_hours_after_its_read_deletes_neither_copy(
    fstore, monkeypatch, plain_gate, tmp_path
):
    store = fstore
    root = tmp_path / "store"
    assert root.is_dir()
    sent = many_small_files(store, rounds=4, partitions=1)
    assert run_gc(store, gate=plain_gate, config=GcSettings(l1_grace_s=0)).status == "ok"  # W at LR
    _age(root, TWO_HOURS)  # the small files are old, as in production
    rec1, rec2, summary = _two_gcs(
        store,
        monkeypatch,
        plain_gate,
        GcSettings(l1_full_sweep_s=0),  # GC1: the day's full sweep, every other setting its default
        GcSettings(full_read_every=1),  # GC2: the next run that reads every log
        clock1=lambda: time.time() + TWO_HOURS,  # GC1 resumes two hours after its read
        between=lambda: _age(root, TWO_HOURS),
    )
    assert summary.count("compacted") == 1
    assert rec2.status == "ok" and rec2.l1_retired_deleted == 4
    assert rec1.status == "ok" and rec1.l1_orphans_deleted == 0
    assert not committed_missing(store)
    assert_exactly_once(store, "t", sent)


def test_a_ctp_compact_process_that_claims_after_the_gcs_read_commits_a_file_the_gc_kept(
    store, monkeypatch, plain_gate, subprocess_env
):
    """A real ``ctp compact`` started right after the GC read the states, paused before
    its commit (the tests' hooks) while the GC lists, then left to commit."""
    sent = many_small_files(store, rounds=4, partitions=1)
    real_gather = prepare.gather_all
    child: dict[str, subprocess.Popen] = {}

    def gather_all(*a, **kw):
        got = real_gather(*a, **kw)
        child["p"] = subprocess.Popen(
            [CTP, "compact", "--max-small-files", "2", "--json"],
            env={**subprocess_env, "CTP_PAUSE": "compact_before_commit=4"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        deadline = time.time() + 60
        while not any(layout.parse_l1_key(k).compacted_by for k in l1_keys(store)):
            assert time.time() < deadline and child["p"].poll() is None, "the compactor wrote no file"
            time.sleep(0.05)
        return got

    with monkeypatch.context() as m:
        m.setattr(prepare, "gather_all", gather_all)
        rec = run_gc(store, gate=plain_gate, config=GcSettings(l1_grace_s=0, l1_full_sweep_s=0))
    _, err = child["p"].communicate(timeout=120)
    assert child["p"].returncode == 0, err[-2000:]
    assert rec.status == "ok" and rec.l1_orphans_deleted == 0
    assert not committed_missing(store)
    assert_exactly_once(store, "t", sent)


def test_the_file_of_a_claim_given_up_after_the_gcs_read_is_collected_once_a_later_run_sees_it_end(
    store, monkeypatch, plain_gate
):
    """No leak: the file the race keeps is an orphan as soon as a state read shows its
    claim gone, and the next listing collects it."""
    sent = many_small_files(store, rounds=4, partitions=1)
    full = GcSettings(l1_grace_s=0, l1_reader_grace_s=0, l1_full_sweep_s=0)
    rec, err = gc_racing_a_compaction(store, monkeypatch, plain_gate, full, fail_build=True)
    orphan = {k for k in l1_keys(store) if layout.parse_l1_key(k).compacted_by}
    assert len(orphan) == 1 and rec.l1_orphans_deleted == 0, (err, rec)
    st = plog(store, "t", 0).read_state()
    assert not st.holders  # the compactor released its claim when it gave up
    rec = run_gc(store, gate=plain_gate, config=full)
    assert rec.status == "ok" and rec.l1_orphans_deleted == 1
    assert not (orphan & l1_keys(store))
    assert_exactly_once(store, "t", sent)


@pytest.mark.parametrize("shape", ["orphan", "inside_a_compactions_file"])
def test_the_sweep_never_collects_a_file_of_a_writer_epoch_newer_than_its_state(store, shape):
    """The rule alone: a compaction's file at or below LR that no commit names is kept
    while its writer epoch is newer than the state's (that claim came after the read),
    whatever the graces; once the state knows the epoch and no claim of it holds, it is
    an orphan, or a retired file."""
    lr, we = 99, 7
    committed = (
        (L1Ref(layout.l1_key("t", 0, 0, 99, None, 3), 0, 99, None),)
        if shape == "inside_a_compactions_file"
        else (
            L1Ref(layout.l1_key("t", 0, 0, 49, None), 0, 49, None),
            L1Ref(layout.l1_key("t", 0, 50, 99, None), 50, 99, None),
        )
    )
    for r in committed:
        store.put(r.key, b"x")
    stray = layout.l1_key("t", 0, 10, 60, None, we) if shape == "orphan" else layout.l1_key("t", 0, 0, 99, None, we)
    store.put(stray, b"x")
    change = "t/0/change-entry"  # the compact entry whose store time starts the reader grace
    store.put(change, b"x")

    def sweep(writer_epoch):
        inp = l1_sweep.SweepInput(
            "t",
            0,
            lr,
            120,
            -1,
            -1,
            committed,
            True,
            True,
            frozenset(r.key for r in committed),
            None,
            all_refs=committed,
            changed_log_offset=100 if shape == "inside_a_compactions_file" else -1,
            changed_entry_key=change,
            writer_epoch=writer_epoch,
        )
        return l1_sweep.sweep_partition(store, inp, now_s=10**10, grace_s=0, reader_grace_s=0, store_now_s=10**10)

    kept = sweep(we - 1)
    assert (kept.orphans, kept.retired, kept.young) == ([], [], 1)
    seen = sweep(we)
    went = [i.key for i in (seen.orphans if shape == "orphan" else seen.retired)]
    assert went == [stray]
