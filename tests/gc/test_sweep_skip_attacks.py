"""The L1 sweep skips a partition while its W is its last reconciled offset (LR),
whatever its log gained since the last sweep: ticks, placeholders not reconciled yet, a
claim given up (``l1_sweep.nothing_to_list``). A review briefed to make that lose data
or leak L1 files: every GC run here is prepared twice -- as ctp does it, and with the
sweep listing every partition it skipped -- and both must decide the same orphans,
retired and dropped files, checks and watermarks (a skip is a listing that would have
found nothing to act on); then the real GC runs and every committed L1 file must still
be there. Each scenario ends with full sweeps: no uncommitted L1 file is left (and
every record reads exactly once). Scenarios: ticks after a crashed reconciler's file,
forged ticks after a lapsed claim, retired files in the reader grace, snapshots set
aside, a re-created topic, a store that lost a log's tail (LR back at W, or below it),
a trim on the pack path, a late file behind W (the full sweep's); both stores. Then
the skip alone: the key order it rests on, and 100 random partitions swept both ways;
and random walks of writes, crashes, compactions, forgeries and GC runs (file store).
Kept from two reviews briefed to make the skip lose data (2026-11-29): all held."""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time

import pytest

from ctp_state import crashpoints, entries as en, layout
from ctp_state.codec import crc32c
from ctp_state.compact import run_compaction
from ctp_state.deletion import delete_topic
from ctp_state.entries import AccessMode, Claim, Tick
from ctp_state.epoch import ClusterEpoch
from ctp_state.gc import l1_sweep, run_gc
from ctp_state.gc.prepare import GateResult, prepare
from ctp_state.l0 import Record
from ctp_state.partition_state import L1Ref
from ctp_state.producer import Producer
from ctp_state.reconcile import run_reconcile
from ctp_state.retention import delete_records
from ctp_state.settings import CompactSettings, GcSettings
from ctp_state.topics import create_topic
from tests.compact.test_compaction import many_small_files
from tests.support import LAG2, assert_exactly_once, claim_given_up, plog, produce_rounds, reconcile

EVERY = GcSettings(full_read_every=1, l1_grace_s=0, l1_reader_grace_s=0, l1_full_sweep_s=86400, topic_removal_grace_s=0)


def PLAIN(frames):  # the gate's backstop still runs
    return GateResult(True, [])


def _summary(p):
    return {
        (s.topic, s.partition): {
            "orphans": sorted(o.key for o in s.orphans),
            "retired": sorted(o.key for o in s.retired),
            "dropped": sorted(d.key for d in s.dropped),
            "new_files": sorted((r.key, r.expected_first_offset, r.checksums_ok) for r in s.new_files),
            "swept_through": s.swept_through,
            "swept_log_end": s.swept_log_end,
            "skipped": s.skipped,
        }
        for s in p.sweeps
    }


def compare(store, config, monkeypatch) -> tuple[int, int]:
    """Prepare the run both ways: the same decisions. (skips, skips of the listing one)"""
    new = _summary(prepare(store, config))
    with monkeypatch.context() as m:
        m.setattr(l1_sweep, "nothing_to_list", lambda inp: False)
        listed = _summary(prepare(store, config))
    assert new.keys() == listed.keys()
    for tp in new:
        a, b = new[tp], listed[tp]
        for k in ("orphans", "retired", "dropped", "new_files", "swept_through", "swept_log_end"):
            assert a[k] == b[k], (tp, k, a, b)
    return sum(a["skipped"] for a in new.values()), sum(b["skipped"] for b in listed.values())


def committed_all(store, topic="t", partitions=1):
    keys = set()
    for p in range(partitions):
        keys |= {f.key for f in plog(store, topic, p).read_state().committed_l1_files()}
    return keys


def l1_keys(store):
    return {o.key for o in store.list(layout.L1_ROOT)}


class Skips:
    """Skips counted over a scenario's runs (``before``: with every skip listed, none)."""

    def __init__(self):
        self.now = self.before = 0


def checked_gc(store, monkeypatch, config=EVERY, topic="t", partitions=1, skips: Skips | None = None):
    now, before = compare(store, config, monkeypatch)
    if skips is not None:
        skips.now, skips.before = skips.now + now, skips.before + before
    rec = run_gc(store, gate=PLAIN, config=config)
    assert rec.status == "ok", rec.gate.failures if rec.gate else rec.error
    for k in committed_all(store, topic, partitions):
        assert store.head(k) is not None, f"committed L1 file {k} deleted"
    return rec


def idle_epochs(store, monkeypatch, n, config=EVERY, **kw):
    recs = []
    for _ in range(n):
        ClusterEpoch(store).advance()
        assert reconcile(store).ok
        recs.append(checked_gc(store, monkeypatch, config, **kw))
    return recs


def full_sweep(store, monkeypatch, **kw):
    return checked_gc(store, monkeypatch, dataclasses.replace(EVERY, l1_full_sweep_s=0), **kw)


def append_raw(store, topic, partition, entry):
    """Append ``entry`` as-is (a forged one: no fold checks it first)."""
    log = plog(store, topic, partition)
    st = log.read_state()
    off = st.applied_offset + 1
    prev = crc32c(store.get(log.key(st.applied_offset)))
    store.put_if_absent(log.key(off), en.encode(entry, prev=prev))
    return off


# --- scenarios ---------------------------------------------------------------------------


class Crash(Exception):
    pass


def test_a_crashed_reconcilers_l1_file_then_only_ticks(store, monkeypatch):
    """A reconciler dies after writing its L1 file (claim held, lapses); the next run
    takes over, commits; then the partition only ticks (every GC reads every log)."""
    sent = produce_rounds(store, partitions=1, rounds=2, per=10)
    run_reconcile(store)
    checked_gc(store, monkeypatch)
    sent[0] += produce_rounds(store, partitions=1, rounds=1, per=7)[0]

    def die(point, index):
        if point == "after_l1_write":
            raise Crash

    crashpoints.install(die)
    try:
        with pytest.raises(Crash):
            run_reconcile(store, config=dataclasses.replace(LAG2, lease_ms=1))
    finally:
        crashpoints.install(None)
    written = l1_keys(store) - committed_all(store)
    checked_gc(store, monkeypatch)  # lists: the claim is not a tick
    time.sleep(0.05)
    skips = Skips()
    idle_epochs(store, monkeypatch, 7, skips=skips)
    assert skips.now > skips.before == 0  # (the runs after the takeover's commit: ticks only)
    full_sweep(store, monkeypatch)
    assert l1_keys(store) == committed_all(store), (written, l1_keys(store) - committed_all(store))
    assert_exactly_once(store, "t", sent)


def test_a_lapsed_claim_forged_ticks_after_it_and_a_late_commit(store, monkeypatch):
    """A writer claims (short lease) with data pending; the GC lists after its claim;
    forged ticks land after it (rejected: a holder, pending data) so the log grows only
    by ticks; the writer then writes and commits (a reconcile run taking over)."""
    sent = produce_rounds(store, partitions=1, rounds=1, per=10)
    run_reconcile(store)
    checked_gc(store, monkeypatch)
    sent[0] += produce_rounds(store, partitions=1, rounds=1, per=5)[0]
    log = plog(store, "t", 0)
    log.claim(log.read_state(), "slow", AccessMode.EXCLUSIVE, lease_ms=1)
    checked_gc(store, monkeypatch)
    st = plog(store, "t", 0).read_state()
    c = ClusterEpoch(store).current()
    for i in range(3):
        append_raw(store, "t", 0, Tick(c + 5 + i, st.writer_epoch + 1 + i, "forger"))
    rec = checked_gc(store, monkeypatch)
    # a lapsed writer's file beyond LR (its key as it would write it)
    st = plog(store, "t", 0).read_state()
    late = layout.l1_key("t", 0, st.last_reconciled_offset + 1, st.last_reconciled_offset + 3, st.topic_id)
    store.put(late, store.get(sorted(committed_all(store))[-1]))
    checked_gc(store, monkeypatch)
    time.sleep(0.01)
    assert run_reconcile(store).ok
    idle_epochs(store, monkeypatch, 4)
    full_sweep(store, monkeypatch)
    assert l1_keys(store) == committed_all(store), l1_keys(store) - committed_all(store)
    assert_exactly_once(store, "t", sent)
    assert rec.status == "ok"


def test_retired_files_kept_by_the_reader_grace_through_ticks(store, monkeypatch):
    sent = many_small_files(store, rounds=5, partitions=1)
    checked_gc(store, monkeypatch)
    run_compaction(store, config=CompactSettings(max_small_files=2, target_file_bytes=1 << 20))
    held = dataclasses.replace(EVERY, l1_reader_grace_s=3600)
    checked_gc(store, monkeypatch, held)
    for _ in range(4):  # ticks while the retired files are kept
        ClusterEpoch(store).advance()
        assert reconcile(store).ok
        rec = checked_gc(store, monkeypatch, held)
        assert rec.l1_retired_kept > 0
    rec = checked_gc(store, monkeypatch)  # grace over
    assert rec.l1_retired_deleted > 0
    idle_epochs(store, monkeypatch, 3)
    full_sweep(store, monkeypatch)
    assert l1_keys(store) == committed_all(store)
    assert_exactly_once(store, "t", sent)


def test_a_snapshot_set_aside_or_removed_between_runs_of_ticks(store, monkeypatch):
    sent = produce_rounds(store, partitions=2, rounds=2, per=10)
    run_reconcile(store)
    checked_gc(store, monkeypatch, partitions=2)
    idle_epochs(store, monkeypatch, 3, partitions=2)
    # partition 0: its snapshot removed; partition 1: its snapshot corrupted
    k0 = layout.snapshot("t", 0, plog(store, "t", 0).topic_id)
    k1 = layout.snapshot("t", 1, plog(store, "t", 1).topic_id)
    for k in (k0, k1):
        if store.head(k) is not None:
            store.delete_many([k])
    store.put(k1, b"garbage")
    # an orphan behind W for the full sweep, and one beyond LR
    st = plog(store, "t", 0).read_state()
    ref = st.committed_l1_files()[0]
    behind = layout.l1_key("t", 0, ref.first, ref.first + 1, st.topic_id)
    store.put(behind, store.get(ref.key))
    idle_epochs(store, monkeypatch, 4, partitions=2)
    full_sweep(store, monkeypatch, partitions=2)
    assert store.head(behind) is None
    assert l1_keys(store) == committed_all(store, partitions=2)
    assert_exactly_once(store, "t", sent)


def test_a_topic_re_created_then_ticks(store, monkeypatch):
    produce_rounds(store, partitions=1, rounds=2, per=10)
    run_reconcile(store)
    checked_gc(store, monkeypatch)
    idle_epochs(store, monkeypatch, 2)
    delete_topic(store, "t")
    checked_gc(store, monkeypatch, partitions=0)
    create_topic(store, "t", 1)
    sent = produce_rounds(store, partitions=1, rounds=2, per=10)
    run_reconcile(store)
    checked_gc(store, monkeypatch)
    idle_epochs(store, monkeypatch, 4)
    full_sweep(store, monkeypatch)
    full_sweep(store, monkeypatch)
    assert l1_keys(store) == committed_all(store)
    assert_exactly_once(store, "t", sent)


# --- a store that lost a log's tail, a trim on the pack path, a late file behind W ----------


def _drop_tail(store, topic, p, n):
    log = plog(store, topic, p)
    st = log.read_state()
    keys = [log.key(o) for o in range(st.applied_offset - n + 1, st.applied_offset + 1)]
    store.delete_many(keys + [layout.snapshot(topic, p, log.topic_id)])


def _drop_claim_too(store):
    entries = list(plog(store, "t", 0).entries())
    if isinstance(entries[-1][1], Claim):
        _drop_tail(store, "t", 0, 1)


def _placeholder(store, p=0, v=b"v"):
    with Producer(store, epoch_ttl_s=0) as prod:
        got = prod.write([(("t", p), [Record(v, b"k", 1000, ())])])[0]
    assert got.accepted, got.error
    return Record(v, b"k", 1000, ())


def _lose_the_second_commit(store, monkeypatch, *, gc_between: bool) -> None:
    """Two reconciles (a GC after the first, and with ``gc_between`` after the second
    too); then the store loses the log's tail until LR goes back before the second
    commit, and the claim before it."""
    produce_rounds(store, partitions=1, rounds=2, per=5)
    assert run_reconcile(store).ok
    checked_gc(store, monkeypatch)
    produce_rounds(store, partitions=1, rounds=1, per=3)
    assert run_reconcile(store).ok
    if gc_between:
        checked_gc(store, monkeypatch)
    before = plog(store, "t", 0).read_state()
    while plog(store, "t", 0).read_state().last_reconciled_offset == before.last_reconciled_offset:
        _drop_tail(store, "t", 0, 1)
    _drop_claim_too(store)


def test_lr_back_to_w_after_a_lost_tail_then_a_recommit(store, monkeypatch):
    """W = LR = L; more is reconciled (LR = L2, no GC); the store loses the commit entry:
    LR back at L == W (skip); a placeholder lands; then reconcile again."""
    _lose_the_second_commit(store, monkeypatch, gc_between=False)
    sk = Skips()
    checked_gc(store, monkeypatch, skips=sk)
    _placeholder(store)
    checked_gc(store, monkeypatch, skips=sk)
    ClusterEpoch(store).advance()
    reconcile(store)
    checked_gc(store, monkeypatch, skips=sk)
    idle_epochs(store, monkeypatch, 3, skips=sk)
    full_sweep(store, monkeypatch)
    assert l1_keys(store) == committed_all(store), l1_keys(store) - committed_all(store)
    assert sk.now > 0


def test_w_past_lr_after_a_lost_tail(store, monkeypatch):
    """GC at LR = L2 (W = L2); the store loses the commit: LR = L < W; lists (W > LR),
    W back to L; then pending placeholders and a claim given up (skips), then a
    recommit with a different split."""
    _lose_the_second_commit(store, monkeypatch, gc_between=True)
    sk = Skips()
    # (M would go back: the gate refuses these runs; compare the prepares only)
    compare(store, EVERY, monkeypatch)
    _placeholder(store)
    claim_given_up(store)
    compare(store, EVERY, monkeypatch)
    ClusterEpoch(store).advance()
    reconcile(store)
    checked_gc(store, monkeypatch, skips=sk)
    idle_epochs(store, monkeypatch, 3, skips=sk)
    full_sweep(store, monkeypatch)
    assert l1_keys(store) == committed_all(store), l1_keys(store) - committed_all(store)
    assert sk.now > 0


def test_trim_then_placeholders_and_a_claim_given_up_on_the_pack_path(store, monkeypatch):
    """delete_records moves l1_first past files; the GC runs from the pack
    (full_read_every=3) while placeholders are pending and a claim is given up."""
    sent = many_small_files(store, rounds=4, partitions=1)
    cfg = dataclasses.replace(EVERY, full_read_every=3)
    checked_gc(store, monkeypatch, cfg)
    st = plog(store, "t", 0).read_state()
    refs = st.committed_l1_files()
    assert len(refs) >= 2
    delete_records(store, "t", 0, refs[1].first)
    sk = Skips()
    for i in range(6):
        _placeholder(store, v=f"x{i}".encode())
        sent[0].append(Record(f"x{i}".encode(), b"k", 1000, ()))
        claim_given_up(store)
        checked_gc(store, monkeypatch, cfg, skips=sk)
        if i % 2:
            ClusterEpoch(store).advance()
            reconcile(store)
            checked_gc(store, monkeypatch, cfg, skips=sk)
    idle_epochs(store, monkeypatch, 3, config=cfg, skips=sk)
    full_sweep(store, monkeypatch)
    assert l1_keys(store) == committed_all(store), l1_keys(store) - committed_all(store)
    assert store.head(refs[0].key) is None
    assert sk.now > 0


def test_a_lapsed_writers_file_behind_w_after_skips_goes_at_the_full_sweep(store, monkeypatch):
    """A writer's file at offsets <= LR lands after W reached LR; skips follow (W == LR);
    an incremental sweep never sees it, the full sweep collects it."""
    produce_rounds(store, partitions=1, rounds=2, per=5)
    assert run_reconcile(store).ok
    checked_gc(store, monkeypatch)
    st = plog(store, "t", 0).read_state()
    ref = st.committed_l1_files()[-1]
    # a compactor of a claim the log holds, given up (a claim the GC has not seen yet
    # keeps its file: test_gc_compaction_race_attacks.py)
    late = layout.l1_key("t", 0, ref.first, st.last_reconciled_offset, st.topic_id, compacted_by=st.writer_epoch)
    late2 = layout.l1_key("t", 0, st.last_reconciled_offset, st.last_reconciled_offset, st.topic_id)
    store.put(late, store.get(ref.key))
    store.put(late2, store.get(ref.key))
    sk = Skips()
    _placeholder(store)
    checked_gc(store, monkeypatch, skips=sk)
    idle_epochs(store, monkeypatch, 3, skips=sk)
    assert store.head(late) is not None
    full_sweep(store, monkeypatch)
    assert store.head(late) is None and store.head(late2) is None
    assert l1_keys(store) == committed_all(store)


# --- the skip, pure: the key order it rests on, and a skip against a forced listing ----------

MAX = 10**20 - 1  # the largest offset a key holds


def test_l1_after_sorts_after_every_key_shape_at_or_before_w():
    """What the skip rests on: an incremental listing starts at ``l1_after(W)``, and every
    key whose first offset is <= W sorts before it (reconcile keys, compaction keys of
    any writer epoch, offsets of any width), every key past W after it."""
    W = 41
    after = layout.l1_after("t", 3, W, "a" * 32)
    for first in (0, 1, 9, 10, 40, 41):
        for last in (first, 41, 42, 99, 100, 10**6, MAX):
            if last < first or (first == W and last == MAX):
                continue  # (sorts after: beyond LR anyway)
            for by in (0, 1, 7, 10**19):
                k = layout.l1_key("t", 3, first, last, "a" * 32, by)
                assert k < after, k
    for first in (42, 43, 99, 100, 1000, 10**12):
        for last in (first, first + 1, MAX):
            for by in (0, 1, 10**19):
                k = layout.l1_key("t", 3, first, last, "a" * 32, by)
                assert k > after, k
    # (the one shape that sorts after it with first <= W: first == W and last at the
    # 20-digit maximum -- past LR, never acted on)


def _ref(first, last, by=0):
    return L1Ref(layout.l1_key("t", 0, first, last, None, by), first, last, 0)


@pytest.mark.parametrize("seed", range(100))
def test_a_skipped_partitions_result_is_a_listings(fstore, seed, monkeypatch):
    """Random partitions at W == LR (committed files, compaction keys, files at first ==
    W, orphans before and past W, changes before the last sweep, holders, grace): swept
    as ctp does and with the listing forced, the same result but for the counts."""
    rnd = random.Random(seed)
    store = fstore
    lr = rnd.randint(0, 60)
    w = lr
    # committed files: contiguous, through LR
    refs, at = [], rnd.randint(0, 5)
    l1_first = at
    while at <= lr:
        last = min(lr, at + rnd.randint(0, 8))
        refs.append(_ref(at, last, rnd.choice([0, 0, 0, rnd.randint(1, 9)])))
        at = last + 1
    keys = set()
    for r in refs:
        store.put(r.key, b"x")
        keys.add(r.key)
    # random other files
    for _ in range(rnd.randint(0, 12)):
        first = rnd.randint(0, lr + 10)
        last = rnd.choice([first + rnd.randint(0, 6), MAX]) if first == w else first + rnd.randint(0, 6)
        k = layout.l1_key("t", 0, first, last, None, rnd.choice([0, 0, rnd.randint(1, 9)]))
        store.put(k, b"x")
    log_end = rnd.randint(lr + 1, lr + 30)
    swept_log_end = rnd.randint(-1, log_end)
    changed = rnd.choice([-1, -1, rnd.randint(0, max(0, swept_log_end - 1))]) if swept_log_end > 0 else -1
    inp = l1_sweep.SweepInput(
        "t",
        0,
        lr,
        log_end,
        w,
        swept_log_end,
        tuple(r for r in refs if r.last > w),
        rnd.random() < 0.7,
        False,
        frozenset(),
        None,
        all_refs=tuple(refs) if changed >= 0 else (),
        l1_first=l1_first if changed >= 0 else 0,
        changed_log_offset=changed,
        changed_entry_key=None,
        holders=frozenset(rnd.sample(range(1, 10), rnd.randint(0, 3))),
    )
    assert l1_sweep.nothing_to_list(inp) or changed >= swept_log_end
    grace = rnd.choice([0, 10**11])
    a = l1_sweep.sweep_partition(store, inp, now_s=10**10, grace_s=grace, reader_grace_s=0)
    with monkeypatch.context() as m:
        m.setattr(l1_sweep, "nothing_to_list", lambda i: False)
        b = l1_sweep.sweep_partition(store, inp, now_s=10**10, grace_s=grace, reader_grace_s=0)
    da, db = dataclasses.asdict(a), dataclasses.asdict(b)
    for k in ("listed", "skipped", "beyond_lr", "young"):
        da.pop(k), db.pop(k)
    assert da == db, (inp, da, db)


# --- a random walk, every GC run compared with every skipped partition listed ------------

POINTS = (
    "after_claim",
    "after_l1_write",
    "before_commit",
    "after_commit",
    "compact_after_claim",
    "compact_after_write",
    "compact_before_commit",
    "compact_after_commit",
)


OPS = ("produce", "reconcile", "reconcile", "crash", "compact", "forge", "orphan", "snap", "gc", "gc", "gc", "tick")


@pytest.mark.parametrize("seed", range(4))
def test_a_random_walk_of_writes_crashes_compactions_forgeries_and_gc_runs(fstore, monkeypatch, seed):
    rnd = random.Random(seed)
    store = fstore
    P2 = 2
    create_topic(store, "t", P2)
    sent = {p: [] for p in range(P2)}
    small = CompactSettings(max_small_files=2, target_file_bytes=1 << 20)
    short = CompactSettings(max_small_files=2, target_file_bytes=1 << 20, lease_ms=300)
    for _ in range(40):
        op = rnd.choice(OPS)
        if op == "produce":
            got = produce_rounds(store, partitions=P2, rounds=1, per=rnd.randint(1, 6))
            for p, r in got.items():
                sent[p] += r
        elif op in ("reconcile", "tick"):
            ClusterEpoch(store).advance()
            reconcile(store)
        elif op == "crash":
            point = rnd.choice(POINTS)

            def die(pt, index, point=point):
                if pt == point:
                    raise Crash(pt)

            crashpoints.install(die)
            try:
                with contextlib.suppress(Crash):
                    if point.startswith("compact"):
                        run_compaction(store, config=short)
                    else:
                        run_reconcile(store, config=dataclasses.replace(LAG2, lease_ms=300))
            finally:
                crashpoints.install(None)
            time.sleep(0.35)
        elif op == "compact":
            run_compaction(store, config=small)
        elif op == "forge":
            p = rnd.randrange(P2)
            st = plog(store, "t", p).read_state()
            if st.initialized:
                c = ClusterEpoch(store).current()
                append_raw(
                    store,
                    "t",
                    p,
                    Tick(max(1, c - rnd.randint(0, 1)), max(1, st.writer_epoch + rnd.randint(0, 2)), "forger"),
                )
        elif op == "orphan":
            p = rnd.randrange(P2)
            st = plog(store, "t", p).read_state()
            refs = st.committed_l1_files()
            if refs:
                ref = rnd.choice(refs)
                lr = st.last_reconciled_offset
                first = rnd.randint(ref.first, lr + 3)
                last = first + rnd.randint(0, 4)
                k = layout.l1_key("t", p, first, last, st.topic_id)
                if store.head(k) is None:
                    store.put(k, store.get(ref.key))
        elif op == "snap":
            p = rnd.randrange(P2)
            k = layout.snapshot("t", p, plog(store, "t", p).topic_id)
            if rnd.random() < 0.5:
                if store.head(k) is not None:
                    store.delete_many([k])
            else:
                store.put(k, b"junk")
        elif op == "gc":
            cfg = dataclasses.replace(
                EVERY,
                full_read_every=rnd.choice([1, 1, 3]),
                l1_reader_grace_s=rnd.choice([0, 3600]),
                l1_grace_s=rnd.choice([0, 0, 3600]),
                l1_full_sweep_s=rnd.choice([0, 86400, 86400, 86400]),
            )
            checked_gc(store, monkeypatch, cfg, partitions=P2)
    # settle: everything reconciled, LR past every file, then full sweeps
    for _ in range(3):
        got = produce_rounds(store, partitions=P2, rounds=1, per=20)
        for p, r in got.items():
            sent[p] += r
        ClusterEpoch(store).advance()
        assert run_reconcile(store, config=LAG2).ok
    time.sleep(0.02)
    idle_epochs(store, monkeypatch, 3, partitions=P2)
    full_sweep(store, monkeypatch, partitions=P2)
    full_sweep(store, monkeypatch, partitions=P2)
    left = l1_keys(store) - committed_all(store, partitions=P2)
    assert not left, left
    assert_exactly_once(store, "t", sent)
