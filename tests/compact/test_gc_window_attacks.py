"""(From the twenty-fifth session's second adversarial review, of the GC's unseen-writer
rule: scenarios that held.) Other writers placed exactly between the GC's state read
and its L1 listing (or between its listing and its deletes): compactions in a row,
DeleteRecords, a reconcile, ticks that bump the writer epoch, a lapsed compactor taken
over or committing unfenced, a re-created topic. Each test: nothing committed goes
missing, every acknowledged record reads exactly once, and a GC that reads every log
after the race leaves exactly the committed files. With ``l1_sweep.unseen_writer``
switched off, the first five scenarios (and ``test_gc_compaction_race_attacks.py``)
lose a committed file; the re-created topic's is a new key space the GC never listed."""

from __future__ import annotations

import importlib
import json
import subprocess
import threading
import time

import pytest

from ctp_state.compact import build_locally, run_compaction
from ctp_state.epoch import ClusterEpoch
from ctp_state.gc import l1_sweep, run_gc
from ctp_state.reconcile import run_reconcile
from ctp_state.retention import delete_records
from ctp_state.settings import CompactSettings, GcSettings, ReconcileSettings
from tests.compact.test_compaction import many_small_files
from tests.compact.test_gc_compaction_race_attacks import SMALL, TWO_HOURS, committed_missing, l1_keys
from tests.support import CTP, assert_exactly_once, l0_keys, plog, produce_rounds

prepare = importlib.import_module("ctp_state.gc.prepare")
gc_run = importlib.import_module("ctp_state.gc.run")

FULL0 = GcSettings(l1_grace_s=0, l1_reader_grace_s=0, l1_full_sweep_s=0)
EVERY_LOG = GcSettings(l1_grace_s=0, l1_reader_grace_s=0, full_read_every=1, l1_full_sweep_s=0)
FAST = lambda: time.time() + TWO_HOURS  # noqa: E731


def committed(store, topic="t", p=0):
    return plog(store, topic, p).read_state().committed_l1_files()


def check_all(store, gate, sent, topic="t", partitions=1):
    assert not committed_missing(store, topic, partitions), "a committed L1 file was deleted"
    assert_exactly_once(store, topic, sent)
    rec = run_gc(store, gate=gate, config=EVERY_LOG)
    assert rec.status == "ok", rec.gate.failures
    assert not committed_missing(store, topic, partitions), "a committed L1 file was deleted"
    assert_exactly_once(store, topic, sent)


class Compactor:
    """A compaction in a thread: claims and writes when started, commits when ``go`` is set."""

    def __init__(self, store, *, lease_ms=None, fail=False):
        self.store = store
        self.written, self.go = threading.Event(), threading.Event()
        self.out = {}
        self.fail = fail
        cfg = (
            SMALL
            if lease_ms is None
            else CompactSettings(max_small_files=2, target_file_bytes=1 << 20, lease_ms=lease_ms)
        )
        self.cfg = cfg
        self.th = threading.Thread(target=self._run)

    def _map(self, jobs):
        builds = build_locally(self.store, jobs, compression="zstd")
        self.written.set()
        assert self.go.wait(60)
        if self.fail:
            raise OSError("gives up")
        return builds

    def _run(self):
        try:
            self.out["s"] = run_compaction(self.store, config=self.cfg, map_runs=self._map)
        except OSError as e:
            self.out["s"] = e
        finally:
            self.written.set()

    def start_and_wait_written(self):
        self.th.start()
        assert self.written.wait(60)

    def commit(self):
        self.go.set()
        self.th.join(60)
        return self.out.get("s")


def race(
    monkeypatch,
    store,
    gate,
    config,
    *,
    after_read,
    after_sweep=lambda: None,
    before_deletes=lambda: None,
    clock=time.time,
):
    real_gather, real_sweep, real_delete = prepare.gather_all, l1_sweep.sweep, gc_run.delete_objects
    state = {"read": False, "sweep": False, "del": 0}

    def gather_all(*a, **kw):
        got = real_gather(*a, **kw)
        if not state["read"]:
            state["read"] = True
            after_read()
        return got

    def sweep(*a, **kw):
        res = real_sweep(*a, **kw)
        if not state["sweep"]:
            state["sweep"] = True
            after_sweep()
        return res

    def delete_objects(*a, **kw):
        state["del"] += 1
        if state["del"] == 2:  # the L1 orphans' call (after the L0 one)
            before_deletes()
        return real_delete(*a, **kw)

    with monkeypatch.context() as m:
        m.setattr(prepare, "gather_all", gather_all)
        m.setattr(l1_sweep, "sweep", sweep)
        m.setattr(gc_run, "delete_objects", delete_objects)
        return run_gc(store, gate=gate, config=config, clock=clock)


def _cfg(how):
    return (FULL0, time.time) if how == "grace0" else (GcSettings(l1_full_sweep_s=0), FAST)


PAIRS = CompactSettings(max_small_files=2, target_file_bytes=7000)  # runs of two ~3 KB files


@pytest.mark.parametrize("how", ["grace0", "fast_clock"])
def test_two_compactions_in_a_row_after_the_read_the_second_recompacting_the_first(store, monkeypatch, plain_gate, how):
    """After the GC's read: compaction N merges pairs (C1..C4, committed); compaction
    N+1 merges C1..C4 into E (written); E commits after the GC's listing. Every file at
    or below the GC's LR."""
    sent = many_small_files(store, rounds=8, partitions=1)
    config, clock = _cfg(how)
    c2 = Compactor(store)

    def after_read():
        s1 = run_compaction(store, config=PAIRS)  # N
        assert s1.count("compacted") == 1 and s1.files_written == 4, s1.as_dict()
        c2.start_and_wait_written()  # N+1: C1..C4 -> E, written

    rec = race(monkeypatch, store, plain_gate, config, after_read=after_read, after_sweep=c2.commit, clock=clock)
    s2 = c2.out["s"]
    assert s2.count("compacted") == 1 and s2.files_replaced == 4, s2.as_dict()
    assert rec.status == "ok", rec.gate.failures
    check_all(store, plain_gate, sent)
    assert l1_keys(store) == {f.key for f in committed(store)}


@pytest.mark.parametrize("how", ["grace0", "fast_clock"])
def test_second_compaction_commits_between_listing_and_deletes(store, monkeypatch, plain_gate, how):
    """GC reads S (C committed); N+1 re-compacts C after the listing, commits before the
    GC's deletes; a GC whose listing saw C as committed must not be fooled."""
    sent = many_small_files(store, rounds=4, partitions=1)
    run_compaction(store, config=SMALL)
    for _ in range(3):
        got = produce_rounds(store, topic="t", partitions=1, rounds=1, per=5)
        sent[0] += got[0]
        run_reconcile(store, topics=["t"], config=ReconcileSettings())
    config, clock = _cfg(how)

    def before_deletes():
        s = run_compaction(store, config=SMALL)
        assert s.count("compacted") == 1

    rec = race(
        monkeypatch, store, plain_gate, config, after_read=lambda: None, before_deletes=before_deletes, clock=clock
    )
    assert rec.status == "ok", rec.gate.failures
    check_all(store, plain_gate, sent)


@pytest.mark.parametrize("how", ["grace0", "fast_clock"])
def test_delete_records_then_a_compaction_after_the_read(store, monkeypatch, plain_gate, how):
    sent = many_small_files(store, rounds=6, partitions=1)
    config, clock = _cfg(how)
    c = Compactor(store)

    def after_read():
        delete_records(store, "t", 0, 12)  # drops the first two files (5 records each)
        c.start_and_wait_written()

    rec = race(monkeypatch, store, plain_gate, config, after_read=after_read, after_sweep=c.commit, clock=clock)
    assert c.out["s"].count("compacted") == 1, c.out["s"].as_dict()
    assert rec.status == "ok", rec.gate.failures
    assert not committed_missing(store)
    check_after_trim(store, sent)
    assert run_gc(store, gate=plain_gate, config=EVERY_LOG).status == "ok"
    assert not committed_missing(store)
    check_after_trim(store, sent)


def check_after_trim(store, sent, topic="t", p=0):
    from ctp_state.read import read_partition

    st = plog(store, topic, p).read_state()
    rows = read_partition(store, topic, p).to_pylist()
    assert [r["offset"] for r in rows] == list(range(st.start_offset, len(sent[p])))
    for row in rows:
        assert row["value"] == sent[p][row["offset"]].value


def produce_big(store, n=5, size=150_000, topic="t", p=0):
    import os as _os

    from ctp_state.l0 import Record
    from ctp_state.producer import Producer

    ClusterEpoch(store).advance()
    recs = [Record(_os.urandom(size), f"b{i}".encode(), 5000 + i, ()) for i in range(n)]
    with Producer(store, epoch_ttl_s=0) as prod:
        for v in prod.write([((topic, p), recs)]):
            assert v.accepted, v.error
    return recs


MID = CompactSettings(max_small_files=2, target_file_bytes=512 * 1024)


@pytest.mark.parametrize("how", ["grace0", "fast_clock"])
def test_a_reconcile_and_a_compaction_claimed_after_the_read(store, monkeypatch, plain_gate, how):
    """After the read: a reconcile commits a big file past the GC's LR, then a
    compaction (of the small files only, at or below LR) claims and writes."""
    sent = many_small_files(store, rounds=4, partitions=1)
    config, clock = _cfg(how)
    c = Compactor(store)
    c.cfg = MID

    def after_read():
        sent[0] += produce_big(store)
        run_reconcile(store, topics=["t"], config=ReconcileSettings())
        c.start_and_wait_written()

    rec = race(monkeypatch, store, plain_gate, config, after_read=after_read, after_sweep=c.commit, clock=clock)
    assert c.out["s"].count("compacted") == 1 and c.out["s"].files_replaced == 4, c.out["s"].as_dict()
    assert rec.status == "ok", rec.gate.failures
    check_all(store, plain_gate, sent)


@pytest.mark.parametrize("how", ["grace0", "fast_clock"])
def test_ticks_after_the_read_then_a_compaction(store, monkeypatch, plain_gate, how):
    sent = many_small_files(store, rounds=4, partitions=1)
    config, clock = _cfg(how)
    c = Compactor(store)
    ticks = ReconcileSettings(idle_lag=1, tick_together=True)

    def after_read():
        we0 = plog(store, "t", 0).read_state().writer_epoch
        for _ in range(3):
            ClusterEpoch(store).advance()
            run_reconcile(store, topics=["t"], config=ticks)
        assert plog(store, "t", 0).read_state().writer_epoch >= we0 + 3
        c.start_and_wait_written()

    rec = race(monkeypatch, store, plain_gate, config, after_read=after_read, after_sweep=c.commit, clock=clock)
    assert c.out["s"].count("compacted") == 1
    assert rec.status == "ok", rec.gate.failures
    check_all(store, plain_gate, sent)


def test_a_lapsed_compactor_then_another_claims_after_the_read(store, monkeypatch, plain_gate):
    """Compactor A claims before the GC's read, its lease lapses (the GC's state holds
    it, lapsed: collect is on); after the read compactor B takes over (fencing A) and
    writes; B commits after the listing; A tries to commit after that."""
    sent = many_small_files(store, rounds=4, partitions=1)
    a = Compactor(store, lease_ms=300)
    a.start_and_wait_written()
    time.sleep(0.5)  # A's lease lapses
    b = Compactor(store)

    rec = race(monkeypatch, store, plain_gate, FULL0, after_read=b.start_and_wait_written, after_sweep=b.commit)
    sa = a.commit()
    assert b.out["s"].count("compacted") == 1, b.out["s"].as_dict()
    assert sa.count("compacted") == 0
    assert rec.status == "ok", rec.gate.failures
    check_all(store, plain_gate, sent)
    assert l1_keys(store) == {f.key for f in committed(store)}


def test_a_lapsed_compactor_commits_after_the_listing_nobody_fenced(store, monkeypatch, plain_gate):
    """A claims before the read, lapses, and commits after the GC listed (nobody
    claimed): its file is a holder's."""
    sent = many_small_files(store, rounds=4, partitions=1)
    a = Compactor(store, lease_ms=300)
    a.start_and_wait_written()
    time.sleep(0.5)
    import ctp_state.compact as cm

    with monkeypatch.context() as m:
        m.setattr(cm, "_now_ms", lambda: 0)  # its own lease check passes (a slow clock)
        rec = race(monkeypatch, store, plain_gate, FULL0, after_read=lambda: None, after_sweep=lambda: None)
        sa = a.commit()
    assert sa.count("compacted") == 1, sa.as_dict()
    assert rec.status == "ok", rec.gate.failures
    check_all(store, plain_gate, sent)


def test_topic_deleted_and_recreated_after_the_read_then_compacted(store, monkeypatch, plain_gate):
    from ctp_state.deletion import delete_topic
    from ctp_state.topics import create_topic

    many_small_files(store, rounds=4, partitions=1)
    c = Compactor(store)
    sent2 = {}

    def after_read():
        delete_topic(store, "t")
        create_topic(store, "t", 1)
        sent2.update(many_small_files(store, rounds=4, partitions=1))
        c.start_and_wait_written()

    cfg = GcSettings(l1_grace_s=0, l1_reader_grace_s=0, l1_full_sweep_s=0, topic_removal_grace_s=0)
    rec = race(monkeypatch, store, plain_gate, cfg, after_read=after_read, after_sweep=c.commit)
    assert c.out["s"].count("compacted") == 1
    assert rec.status in ("ok", "partial"), rec
    assert not committed_missing(store)
    assert_exactly_once(store, "t", sent2)
    rec = run_gc(store, gate=plain_gate, config=cfg)
    assert not committed_missing(store)
    assert_exactly_once(store, "t", sent2)


# --- a real ctp gc process, stalled between its listing and its L1 deletes ------------------


def test_a_ctp_gc_stalled_before_its_l1_deletes_while_compactions_and_another_gc_run(
    store, plain_gate, subprocess_env, tmp_path
):
    sent = many_small_files(store, rounds=8, partitions=1)
    run_compaction(store, config=PAIRS)  # C1..C4 committed; A..H retired
    for _ in range(2):  # fresh L0 garbage, so the child has an L0 batch to pause after
        got = produce_rounds(store, topic="t", partitions=1, rounds=1, per=5)
        sent[0] += got[0]
        run_reconcile(store, topics=["t"], config=ReconcileSettings())
    before = len(l0_keys(store))
    assert before > 0
    child = subprocess.Popen(
        [
            CTP,
            "gc",
            "--json",
            "--report-dir",
            str(tmp_path / "rep"),
            "--l1-grace-seconds",
            "0",
            "--l1-reader-grace-seconds",
            "0",
            "--l1-full-sweep-hours",
            "0",
        ],
        env={**subprocess_env, "CTP_PAUSE": "gc_after_delete_batch=6"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.time() + 120
    while len(l0_keys(store)) == before:
        assert child.poll() is None, child.communicate()[1][-3000:]
        assert time.time() < deadline
        time.sleep(0.05)
    # the child is paused after its L0 batch; its L1 lists are made
    s = run_compaction(store, config=SMALL)  # C1..C4 + the new files -> E
    assert s.count("compacted") == 1, s.as_dict()
    rec = run_gc(store, gate=plain_gate, config=EVERY_LOG)
    assert rec.status == "ok", rec.gate.failures
    out, err = child.communicate(timeout=300)
    assert child.returncode == 0, err[-3000:]
    assert not committed_missing(store), json.loads(out) if out.strip().startswith("{") else out[-2000:]
    assert_exactly_once(store, "t", sent)
    assert run_gc(store, gate=plain_gate, config=EVERY_LOG).status == "ok"
    assert l1_keys(store) == {f.key for f in committed(store)}
    assert_exactly_once(store, "t", sent)
