"""Round four: the reconciler's snapshot after its release (commit 80721d0).

``_build_and_commit`` -> ``commit()`` now writes, after a partition's claim is released,
a snapshot of the state the reconciler holds in memory (best effort). The scenarios
below attack that write: a reconciler whose lease lapsed mid-run (fenced commit,
rejected release), a release whose response is lost or whose outcome stays unknown,
kill -9 between the release and the snapshot, racing reconcilers/producers/GCs, a
delayed snapshot overwriting a newer one, and an entry whose bytes on the store are not
the bytes the writer folded in memory. Every test checks I1/I2 (exactly-once reads,
nothing the log still needs deleted by the GC) and, where it applies, that the snapshot
agrees with a replay of the log (``ctp verify --deep``).

Held: every scenario whose log is intact. Broke, then fixed: the snapshot covered an
entry nobody ever read back (a torn ``reconcile`` entry was hidden from the GC, which
then deleted the L0 objects it rested on), and a delayed snapshot regressed a newer one.
The reconciler now reads the partition's state back from the store after its release
(the newest snapshot plus every entry after it, decoded) and snapshots that; appenders
never snapshot. Each test's docstring says what it attacks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from ctp_state import layout, reconcile as rc
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import CtpError, StateUnreadable, StoreError
from ctp_state.gc import run_gc
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.settings import GcSettings, ReconcileSettings
from ctp_state.topics import create_topic
from tests.support import Wrapped, assert_exactly_once, key_id, l0_keys, plog, produce_rounds, reconcile
from tests.support.snapshot import (
    advance,
    append_singles,
    converges,
    deep_ok,
    gc_ok,
    log_end,
    no_pending_l0_below_m,
    snap_offset,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --- 1. the plain path --------------------------------------------------------------------


def test_snapshot_after_release_agrees_with_replay_and_gc_keeps_exactly_once(store, gate):
    """The baseline: after a reconcile every claimed partition's snapshot sits at the
    log end, agrees with a full replay (verify --deep), and a GC that reads only the
    snapshots deletes what it may and nothing any record still needs."""
    sent = produce_rounds(store, partitions=3, rounds=3, per=20)
    advance(store, 2)
    s = reconcile(store)
    assert s.partitions_reconciled == 3
    for p in range(3):
        assert snap_offset(store, "t", p) == log_end(store, "t", p)
    deep_ok(store)
    rec = gc_ok(store, gate)
    assert rec.deleted > 0
    assert_exactly_once(store, "t", sent)
    # A second reconcile (an idle advance: one tick entry, no snapshot after it) and GC:
    # the snapshot stays one entry behind, and every reader folds the tick on top.
    advance(store, 2)
    reconcile(store)
    for p in range(3):
        assert log_end(store, "t", p) - snap_offset(store, "t", p) == 1
    deep_ok(store)
    gc_ok(store, gate)
    assert_exactly_once(store, "t", sent)


# --- 2. a reconciler whose lease lapsed mid-run ---------------------------------------------


def test_lapsed_reconciler_fenced_commit_and_rejected_release_snapshot_the_log(fstore, gate):
    """Reconciler A claims (short lease) and stalls in its build; its lease lapses;
    B claims (naming A lapsed), reconciles, releases and snapshots; a producer writes
    more. Then A commits: its reconcile entry is fenced, its release is *rejected*
    (B's claim dropped A), and it still snapshots, from its stale in-memory ``st`` caught
    up through the append. The snapshot must equal the log's replay, nothing may be
    lost or doubled, and the GC must keep what the late records need."""
    store = fstore
    sent = produce_rounds(store, partitions=2, rounds=2, per=10)
    advance(store, 1)
    late: dict[int, list[Record]] = {0: [], 1: []}
    cfg_a = ReconcileSettings(idle_lag=2, lease_ms=200, threads=1)

    def slow_build(files):
        out = rc.build_files_locally(store, files)
        time.sleep(0.4)  # A's lease lapses
        b = reconcile(store, config=ReconcileSettings(idle_lag=2, threads=1))
        assert b.partitions_reconciled == 2, b
        with Producer(store, epoch_ttl_s=0) as prod:
            for p in (0, 1):
                recs = [Record(f"late-{p}-{i}".encode()) for i in range(5)]
                assert prod.write([(("t", p), recs)])[0].accepted
                late[p].extend(recs)
        return out

    a = reconcile(store, config=cfg_a, map_files=slow_build)
    assert a.partitions_fenced == 2, a
    for p in (0, 1):
        sent[p].extend(late[p])
        # A's snapshot (at its rejected release) is what the log says there.
        assert snap_offset(store, "t", p) == log_end(store, "t", p)
        st = plog(store, "t", p).read_state()
        assert not st.holders and len(st.pending) == 1
    converges(store, gate, sent, 2)


# --- 3. the release's response lost, or its outcome unknown -----------------------------------


class ReleaseFaults(Wrapped):
    """The create of an entry that releases a claim (a ``release``, or a reconcile or
    advance with ``release_owner``) persists, then its response is lost; with
    ``unreachable`` every later request on that partition's log fails for ``for_s``
    seconds, so the release's outcome stays unknown to the run."""

    def __init__(self, inner, *, unreachable: bool, times: int = 1):
        super().__init__(inner)
        self.unreachable, self.times = unreachable, times
        self.cut: set[str] = set()
        self.fired = 0
        self.lock = threading.Lock()

    def _blocked(self, key):
        return any(key.startswith(c) for c in self.cut)

    def put_if_absent(self, k, d):
        if self._blocked(k):
            raise StoreError(f"connection refused for {k!r}")
        self.inner.put_if_absent(k, d)
        if b'"kind":"release"' in d or b'"release_owner"' in d:
            with self.lock:
                if self.fired < self.times:
                    self.fired += 1
                    if self.unreachable:
                        self.cut.add(k.rsplit("/", 1)[0] + "/")
                    raise StoreError(f"connection reset after {k!r} was sent")

    def get(self, k):
        if self._blocked(k):
            raise StoreError(f"connection refused for {k!r}")
        return self.inner.get(k)

    def list(self, prefix="", start_after=None, end_before=None):
        if self._blocked(prefix):
            raise StoreError(f"connection refused for {prefix!r}")
        return self.inner.list(prefix, start_after, end_before)


def test_release_whose_response_was_lost_resolves_and_snapshots_the_log_end(fstore, gate):
    """The release lands, its response is lost; the append re-sends the same bytes,
    finds them and goes on to snapshot. The snapshot covers the release exactly once."""
    store = fstore
    sent = produce_rounds(store, partitions=2, rounds=2, per=10)
    advance(store, 2)
    lossy = ReleaseFaults(store, unreachable=False, times=2)
    s = reconcile(lossy, config=ReconcileSettings(idle_lag=2, threads=1))
    assert s.partitions_reconciled == 2 and lossy.fired == 2, s
    for p in (0, 1):
        assert snap_offset(store, "t", p) == log_end(store, "t", p)
        assert not plog(store, "t", p).read_state().holders
    deep_ok(store)
    gc_ok(store, gate)
    assert_exactly_once(store, "t", sent)


def test_release_with_unknown_outcome_writes_no_snapshot_and_converges(fstore, gate):
    """The release lands but the partition's log is unreachable afterwards: the
    outcome is unknown, so no snapshot may claim it (and the run's own finally cannot
    release either). The snapshot stays where it was (or absent); the next reader
    replays the tail; a GC and a later reconcile converge with every record once."""
    store = fstore
    sent = produce_rounds(store, partitions=2, rounds=2, per=10)
    advance(store, 2)
    before = {}
    for p in (0, 1):
        try:
            before[p] = snap_offset(store, "t", p)
        except CtpError:
            before[p] = None
    lossy = ReleaseFaults(store, unreachable=True, times=1)
    s = reconcile(lossy, config=ReconcileSettings(idle_lag=2, threads=1, lease_ms=300))
    assert lossy.fired == 1
    cut = next(iter(lossy.cut))
    p_cut = int(cut.rstrip("/").rsplit("/", 1)[1])
    # The cut partition committed its reconcile and its release landed, but no snapshot
    # at or past the release was written by the run.
    st = plog(store, "t", p_cut, write_snapshots=False).read_state()
    assert not st.holders and not st.pending
    snap = plog(store, "t", p_cut, write_snapshots=False).read_snapshot()
    assert snap.applied_offset < log_end(store, "t", p_cut), (s, snap.applied_offset)
    deep_ok(store)
    gc_ok(store, gate)
    assert_exactly_once(store, "t", sent)
    advance(store, 2)
    reconcile(store)
    gc_ok(store, gate)
    assert_exactly_once(store, "t", sent)
    deep_ok(store)


# --- 4. kill -9 between the release and the snapshot ---------------------------------------

KILLED_BETWEEN = """
import os, signal, sys
from ctp_state import reconcile as rc
from ctp_state.storage import open_store
from ctp_state.settings import ReconcileSettings

def die(store, topic, partition, topic_id):
    os.kill(os.getpid(), signal.SIGKILL)

rc._snapshot = die
rc.run_reconcile(open_store(sys.argv[1], os.environ), config=ReconcileSettings(idle_lag=2, lease_ms=800, threads=2))
"""


def test_kill_9_between_release_and_snapshot_converges(fstore, gate):
    """The whole reconcile process is SIGKILLed at its first post-release snapshot
    (other partitions mid-commit, their claims held until the lease ends). Nothing is
    half applied: the log is the truth, a rerun converges, the GC keeps what is needed."""
    store = fstore
    sent = produce_rounds(store, partitions=4, rounds=2, per=10)
    advance(store, 2)
    env = {**os.environ, "PYTHONPATH": ROOT}
    p = subprocess.run(
        [sys.executable, "-c", KILLED_BETWEEN, store.url],
        env=env,
        start_new_session=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stderr[-800:])
    deep_ok(store)
    rec = run_gc(store, gate=gate, config=GcSettings(l1_grace_s=0))
    assert rec.status == "ok"
    no_pending_l0_below_m(store, "t", 4, rec.m)
    assert_exactly_once(store, "t", sent, all_in_l1=False)
    time.sleep(1.0)  # the dead run's leases end
    reconcile(store)
    gc_ok(store, gate)
    assert_exactly_once(store, "t", sent)
    deep_ok(store)


# --- 5. an entry whose bytes on the store are not what the writer folded ---------------------


class TornEntries(Wrapped):
    """A store that acknowledges the create of a ``reconcile`` entry but keeps other
    bytes (a torn write, a lying disk: the failure-model's "corrupt bytes"). The writer
    folds the entry it meant to write; nobody has read the stored bytes back."""

    def __init__(self, inner, kind: bytes = b'"kind":"reconcile"'):
        super().__init__(inner)
        self.kind, self.torn = kind, []

    def put_if_absent(self, k, d):
        if self.kind in d:
            self.torn.append(k)
            d = d[:-7] + b"garbage"
        return self.inner.put_if_absent(k, d)


def _torn_reconcile(store, *, snapshot_after_release: bool, monkeypatch):
    sent = produce_rounds(store, partitions=1, rounds=3, per=10)
    advance(store, 2)
    if not snapshot_after_release:  # the code before 80721d0
        monkeypatch.setattr(rc, "_snapshot", lambda store, topic, partition, topic_id: None)
    torn = TornEntries(store)
    s = reconcile(torn, config=ReconcileSettings(idle_lag=2, threads=1))
    assert s.partitions_reconciled == 1 and len(torn.torn) == 1, s
    return sent, torn.torn[0]


def test_before_the_change_a_torn_reconcile_entry_stops_the_gc(fstore, gate, monkeypatch):
    """Control for the next test: without the post-release snapshot the GC reads the
    reconciler's entries from the log tail, finds the torn one and deletes nothing; the
    L0 objects stay, so the records are still there to repair from."""
    store = fstore
    _sent, torn_key = _torn_reconcile(store, snapshot_after_release=False, monkeypatch=monkeypatch)
    before = l0_keys(store)
    with pytest.raises(StateUnreadable, match=torn_key):
        run_gc(store, gate=gate, config=GcSettings(l1_grace_s=0))
    assert l0_keys(store) == before


def test_a_torn_reconcile_entry_is_not_certified_by_the_post_release_snapshot(fstore, gate, monkeypatch):
    """BROKE in 80721d0, fixed (the snapshot is read back from the store). The store keeps other bytes than the reconcile entry the reconciler
    folded. The reconciler snapshots its in-memory state after the release, so the
    snapshot -- "only a cache of the log" -- now covers an entry the log cannot replay,
    and no reader ever read it back: the GC reads only the snapshot, moves M past the
    partition's L0 objects and deletes them. From then on the records' only index is
    the snapshot: when that cache is set aside (one flipped bit: R9 says rebuild from
    the log) the state cannot be rebuilt, every read of the partition fails and the GC
    is wedged for good, with the L0 copies gone. Before the change the same torn entry
    stopped the GC with L0 intact (previous test)."""
    store = fstore
    _sent, torn_key = _torn_reconcile(store, snapshot_after_release=True, monkeypatch=monkeypatch)
    before = l0_keys(store)
    try:
        run_gc(store, gate=gate, config=GcSettings(l1_grace_s=0))
    except StateUnreadable:
        pass
    # the invariant the control test shows held before 80721d0: nothing deleted while
    # an entry the partition's state rests on does not read
    assert l0_keys(store) == before, f"GC deleted {len(before - l0_keys(store))} L0 objects over {torn_key}"
    assert snap_offset(store, "t", 0) < layout.log_offset_of(torn_key, layout.log_prefix("t", 0, key_id(store, "t")))


# --- 6. a delayed snapshot overwriting a newer one ----------------------------------------------


def _delayed(store, sent, seen, corrupt_covered: bool):
    """A ``_snapshot`` delayed past a producer's 70 appends and a reader that snapshots
    them (a newer snapshot than the release offset); with ``corrupt_covered``, an entry
    the newer snapshot covers then goes bad."""
    orig = rc._snapshot

    def delayed(s, topic, partition, topic_id):
        released = plog(store, topic, partition, write_snapshots=False).read_state().applied_offset
        append_singles(store, 70, "mid", sent)
        plog(store, topic, partition).read_state()  # a reader: tail >= 64, it snapshots
        seen["newer"], seen["release"] = snap_offset(store, "t", 0), released
        if corrupt_covered:
            bad = layout.log_entry("t", 0, released + 3, key_id(store, "t"))  # covered by the newer snapshot
            store.put(bad, store.get(bad)[:-7] + b"garbage")
            # the promise holds here: the state reads from the newer snapshot
            assert plog(store, "t", 0, write_snapshots=False).read_state().applied_offset == seen["newer"]
        orig(s, topic, partition, topic_id)

    return delayed


def _run_delayed(store, monkeypatch, *, corrupt_covered: bool) -> tuple[dict[int, list[Record]], dict[str, int]]:
    """Two rounds produced, then one reconcile whose post-release snapshot is delayed
    (``_delayed``): what was sent, and the offsets the delay saw."""
    sent = produce_rounds(store, partitions=1, rounds=2, per=5)
    advance(store, 2)
    seen: dict[str, int] = {}
    monkeypatch.setattr(rc, "_snapshot", _delayed(store, sent, seen, corrupt_covered=corrupt_covered))
    reconcile(store, config=ReconcileSettings(idle_lag=2, threads=1))
    return sent, seen


def test_a_delayed_post_release_snapshot_never_regresses_a_newer_one(fstore, gate, monkeypatch):
    """The reconciler is delayed between its release and its snapshot; meanwhile a
    producer appends 70 entries and a reader snapshots them. The reconciler's snapshot
    is read back from the store, starting at that newer snapshot: it never installs an
    older one (80721d0 put its in-memory state, older, over the newer)."""
    store = fstore
    sent, seen = _run_delayed(store, monkeypatch, corrupt_covered=False)
    assert seen["newer"] > seen["release"]
    assert snap_offset(store, "t", 0) >= seen["newer"]
    deep_ok(store)
    monkeypatch.undo()
    advance(store, 2)
    gc_ok(store, gate)
    assert_exactly_once(store, "t", sent, all_in_l1=False)
    reconcile(store)
    gc_ok(store, gate)
    assert_exactly_once(store, "t", sent)


def test_a_delayed_post_release_snapshot_does_not_uncover_an_entry_the_newer_one_covered(fstore, gate, monkeypatch):
    """BROKE in 80721d0, fixed. As above, but an entry the newer snapshot covered then
    goes bad -- which the failure model promises "does not stop reads or the GC". The
    reconciler's late in-memory snapshot, older, made that entry part of every reader's
    tail again: reads failed and the GC was wedged. Read back from the store, it starts
    at the newer snapshot and the entry stays covered. (Two slow readers can still race
    their snapshot PUTs this way: a plain overwrite; the window is one LIST and a PUT.)"""
    store = fstore
    sent, seen = _run_delayed(store, monkeypatch, corrupt_covered=True)
    assert snap_offset(store, "t", 0) >= seen["newer"]
    monkeypatch.undo()
    advance(store, 2)
    gc_ok(store, gate)
    assert_exactly_once(store, "t", sent, all_in_l1=False)


def test_a_torn_reconcile_entry_on_a_long_log_stops_the_gc(fstore, gate):
    """A log of 64 entries and more: the reconciler's first read of the state snapshots
    it (a reader), but nothing the run appends is ever in a snapshot until read back --
    before the fix, ``append`` snapshotted its in-memory state once right after the
    claim on such a log (a torn claim was certified), and 80721d0 every entry of the
    run. A torn reconcile entry stays in every reader's tail: the GC stops, nothing is
    deleted."""
    store = fstore
    create_topic(store, "t", 1)
    advance(store, 1)
    append_singles(store, 70, "r")  # a log longer than snapshot_every
    advance(store, 2)
    torn = TornEntries(store)
    s = reconcile(torn, config=ReconcileSettings(idle_lag=2, threads=1))
    assert s.partitions_reconciled == 1 and len(torn.torn) == 1
    torn_offset = layout.log_offset_of(torn.torn[0], plog(store, "t", 0).prefix)
    assert snap_offset(store, "t", 0) < torn_offset
    before = l0_keys(store)
    with pytest.raises(StateUnreadable, match=torn.torn[0]):
        run_gc(store, gate=gate, config=GcSettings(l1_grace_s=0))
    assert l0_keys(store) == before


# --- 7. racing reconcilers, a producer and GCs ---------------------------------------------------


def test_racing_reconcilers_producer_and_gcs_keep_exactly_once_and_snapshots_agree(fstore, gate):
    """Two reconcilers with short leases (so claims lapse and are taken over mid-run),
    a producer and an epoch advancer run at once in threads, and a GC runs between
    rounds; every post-release snapshot races the others' appends and snapshots. After
    quiescing: every snapshot agrees with its log's replay, no L0 object a pending
    placeholder needs is gone, and every accepted record reads exactly once."""
    store = fstore
    parts = 3
    create_topic(store, "t", parts)
    advance(store, 1)
    sent: dict[int, list[Record]] = {p: [] for p in range(parts)}
    stop = threading.Event()
    errors: list[BaseException] = []

    def guard(fn):
        def run():
            try:
                while not stop.is_set():
                    fn()
            except BaseException as e:  # reported below
                errors.append(e)

        return run

    counter = [0]

    def produce():
        with Producer(store, epoch_ttl_s=0) as prod:
            i = counter[0]
            chunks = [(("t", p), [Record(f"v{i}-{p}-{j}".encode()) for j in range(3)]) for p in range(parts)]
            for v, (_, recs) in zip(prod.write(chunks), chunks):
                if v.accepted:
                    sent[v.partition].extend(recs)
                else:
                    assert v.outcome == "rejected", v  # stale epoch: not written
            counter[0] += 1

    def reconcile_loop(lease_ms):
        def one():
            reconcile(store, config=ReconcileSettings(idle_lag=2, lease_ms=lease_ms, threads=2, target_file_bytes=300))

        return one

    def epochs():
        ClusterEpoch(store).advance()
        time.sleep(0.05)

    threads = [
        threading.Thread(target=guard(produce)),
        threading.Thread(target=guard(reconcile_loop(30))),
        threading.Thread(target=guard(reconcile_loop(5000))),
        threading.Thread(target=guard(epochs)),
    ]
    for t in threads:
        t.start()
    try:
        for _ in range(3):
            time.sleep(2.0)
            rec = run_gc(store, gate=gate, config=GcSettings(l1_grace_s=3600))
            assert rec.status in ("ok", "superseded"), rec
            no_pending_l0_below_m(store, "t", parts, rec.m)
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    assert not errors, errors
    assert counter[0] > 5
    deep_ok(store)
    assert_exactly_once(store, "t", sent, all_in_l1=False)
    time.sleep(0.1)
    advance(store, 2)
    reconcile(store)
    gc_ok(store, gate)
    deep_ok(store)
    assert_exactly_once(store, "t", sent)
