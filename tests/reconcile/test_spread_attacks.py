"""Attempts to lose acknowledged data, or to push the GC's M past a pending placeholder,
with idle ticks that come early: each partition at its phase, 1 to ``idle_lag`` epochs
after its bound (``ctp_state/tick_schedule.py``, docs/design.md 14, "Spreading the
ticks"). Kept from a review briefed only to lose data, which tried 16 scenarios (54
cases, a fuzz at 24 seeds): all held. The cases kept here are the ones aimed at the
early tick; the others overlapped test_lag6_attacks and test_quiet_race_attacks.

Oracle, after every GC run (``check``): every acknowledged record whose placeholder is
pending in a full listing replay of its log has its L0 object and M < its epoch (I1,
``Acks.check``); over *every* partition, every pending placeholder's L0 object exists,
M < its epoch, M < the GC's C and M < the partition's lower bound (R3/R4). At the end
every acknowledged record reads back exactly once from L1 (I2). File store only."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading

import pytest

from ctp_state import layout
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import CtpError
from ctp_state.gc import run_gc
from ctp_state.gc.history import newest_pack
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.reconcile import run_reconcile
from ctp_state.settings import ReconcileSettings
from ctp_state.tick_schedule import due_epoch, idle_due, tick_phase
from ctp_state.topics import create_topic, list_topics
from tests.reconcile.test_quiet_race_attacks import Acks, Hook, full_state
from tests.support import assert_exactly_once, plog, with_this_checkout

DEF = ReconcileSettings()
Q1 = ReconcileSettings(quiet_min=1)
TOG = ReconcileSettings(tick_together=True)
Q1L = ReconcileSettings(quiet_min=1, lease_ms=1)
P = 10


@pytest.fixture
def store(fstore):
    return fstore


# --- oracle ----------------------------------------------------------------------------


def topic_sizes(store) -> dict[str, int]:
    return {t.name: t.partitions for t in list_topics(store)}


def check_all(store, rec) -> None:
    """Every partition, fully replayed: pending placeholders' L0 objects exist and M is
    below their epochs and below the partition's lower bound; M < C."""
    if rec is None or rec.status not in ("ok", "partial", "dry_run") or rec.m is None:
        ms = None
    else:
        ms = rec.m
        assert ms < rec.cluster_epoch, (ms, rec.cluster_epoch)
    for topic, n in topic_sizes(store).items():
        for p in range(n):
            s = full_state(store, topic, p)
            for ph in s.pending:
                assert store.head(ph.l0_key) is not None, f"{topic}/{p}: L0 {ph.l0_key} of a pending placeholder gone"
                if ms is not None:
                    assert ms < ph.epoch, f"M {ms} passed pending placeholder epoch {ph.epoch} on {topic}/{p}"
            if ms is not None and s.min_epoch_lower_bound is not None:
                assert ms <= s.min_epoch_lower_bound - 1, (topic, p, ms, s.min_epoch_lower_bound)


def gc(store, gate, acks, *, tolerate=False):
    try:
        rec = run_gc(store, gate=gate)
    except CtpError:
        if not tolerate:
            raise
        acks.check(None)
        check_all(store, None)  # nothing deleted, but every pending placeholder's L0 object still there
        return None
    acks.check(rec)
    check_all(store, rec)
    return rec


TOLERATE = {"gc": False}


def epoch(store, gate, acks, config=DEF, *, jump=1, do_gc=True):
    ce = ClusterEpoch(store)
    for _ in range(jump):
        ce.advance()
    s = run_reconcile(store, config=config)
    rec = gc(store, gate, acks, tolerate=TOLERATE["gc"]) if do_gc else None
    return s, rec


def finish(store, gate, acks, config=DEF, rounds=None, topics=None):
    rounds = rounds or config.idle_lag + 3
    for _ in range(rounds):
        epoch(store, gate, acks, config)
    sizes = topics or topic_sizes(store)
    for topic, n in sizes.items():
        for p in range(n):
            s = full_state(store, topic, p)
            if s.pending:
                from ctp_state.status import reconcile_summaries

                last = reconcile_summaries(store).newest()
                why = [(x.status, x.reason) for x in last.partitions if (x.topic, x.partition) == (topic, p)]
                raise AssertionError(f"{topic}/{p} still pending {s.pending} holders {s.holders}: {why}")
        assert_exactly_once(store, topic, {p: acks.sent.get((topic, p), []) for p in range(n)}, all_in_l1=True)


def bound(store, topic, p) -> int:
    return full_state(store, topic, p).min_epoch_lower_bound


def record(acks, lock, v, value):
    """A verdict of a long-lived producer: record it if accepted (and new)."""
    if v.accepted and not v.duplicate:
        with lock:
            acks.sent.setdefault((v.topic, v.partition), []).append(Record(value))
            acks.keys.append((v.topic, v.partition, v.l0_key, layout.parse_l0_key(v.l0_key)[1]))


# --- 1. stale producers into partitions right after / right before their early tick ---


@pytest.mark.parametrize("lag,quiet_min", [(6, 1)])
def test_stale_epochs_around_phase_ticks(store, gate, lag, quiet_min):
    """Each epoch: into a partition that ticked (early, at its phase) last run, writes at
    its bound - 1, bound - lag (must be refused) and C; into one due next run, writes at
    its bound and at C - 1 (in the window). All acknowledged ones must survive."""
    config = ReconcileSettings(idle_lag=lag, quiet_min=quiet_min)
    acks = Acks(store)
    create_topic(store, "t", P)
    for _ in range(2):
        epoch(store, gate, acks, config)
    rng = random.Random(lag * 100 + quiet_min)
    ce = ClusterEpoch(store)
    refused_below_bound = 0
    for i in range(3 * lag + 2):
        c = ce.current()
        s, _ = epoch(store, gate, acks, config)
        c = ce.current()
        ticked = [p.partition for p in s.partitions if p.status == "advanced"]
        for p in ticked[:2]:
            b = bound(store, "t", p)
            for e in (b - 1, b - lag, c):
                if e < 1:
                    continue
                got = acks.produce("t", p, f"after-{i}-{p}-{e}".encode(), epoch=e)
                if e < b:
                    assert got is None, f"placeholder at epoch {e} below the tick's bound {b} was accepted"
                    refused_below_bound += 1
        due = [p for p in range(P) if idle_due("t", p, bound(store, "t", p), c + 1, lag, spread=True)]
        for p in rng.sample(due, min(2, len(due))):
            b = bound(store, "t", p)
            acks.produce("t", p, f"before-{i}-{p}-b".encode(), epoch=b)
            acks.produce("t", p, f"before-{i}-{p}-c1".encode(), epoch=max(b, c - 1), forge=lambda q: (q + 1) % P)
    assert refused_below_bound > 0
    finish(store, gate, acks, config)


# --- 3. placeholders racing an early tick on the quiet path ----------------------------


def _due_partition(store, config, c_next):
    pk = newest_pack(store)
    for p in range(P):
        st = pk.states[("t", p)][0] if pk is not None else full_state(store, "t", p)
        if (
            not st.pending
            and not st.holders
            and idle_due("t", p, st.min_epoch_lower_bound, c_next, config.idle_lag, spread=not config.tick_together)
            and c_next - st.min_epoch_lower_bound < config.idle_lag  # early: the old rule would not tick it
        ):
            return p, st
    return None, None


def until_early_due(store, gate, acks, config=DEF):
    """Epochs until some partition's tick in the next one is early (at its phase, before
    the lag); that partition and its state."""
    ce = ClusterEpoch(store)
    for _ in range(12):
        p, st = _due_partition(store, config, ce.current() + 1)
        if p is not None:
            return p, st
        epoch(store, gate, acks, config)
    raise AssertionError("no partition came due early in 12 epochs")


@pytest.mark.parametrize(
    "where,which",
    [("created", "c-1"), ("created", "c"), ("create", "forged-bound"), ("vouch", "bound"), ("listing", "c-1")],
)
def test_placeholder_races_early_quiet_tick(store, gate, where, which):
    acks = Acks(store)
    create_topic(store, "t", P)
    for _ in range(3):
        epoch(store, gate, acks)
    ce = ClusterEpoch(store)
    p, st = until_early_due(store, gate, acks)
    log = plog(store, "t", p)
    c_next = ce.current() + 1
    e = {"bound": st.min_epoch_lower_bound, "forged-bound": st.min_epoch_lower_bound, "c-1": c_next - 1, "c": c_next}[
        which
    ]
    forge = (lambda q: (q + 1) % P) if which.startswith("forged") else None
    target = {
        "vouch": ("get", log.key(st.applied_offset)),
        "create": ("create", log.key(st.applied_offset + 1)),
        "created": ("created", log.key(st.applied_offset + 1)),
        "listing": ("list", layout.L0_ROOT),
    }[where]
    fired = []

    def on(v, k):
        if (v, k) == target and not fired:
            fired.append(1)
            acks.produce("t", p, f"race-{where}-{which}".encode(), epoch=e, forge=forge)

    ce.advance()
    s = run_reconcile(Hook(store, on), config=DEF)
    assert fired, (where, which)
    status = next(x.status for x in s.partitions if x.partition == p)
    accepted = any(k[0:2] == ("t", p) and k[3] == e for k in acks.keys)
    after = full_state(store, "t", p)
    OUTCOMES.append((where, which, status, accepted, st.min_epoch_lower_bound, c_next, after.min_epoch_lower_bound))
    if where == "created":  # the early tick landed first: below its epoch is refused
        assert status == "advanced" and after.min_epoch_lower_bound in (c_next, st.min_epoch_lower_bound)
        assert accepted == (e >= c_next), OUTCOMES[-1]
    if where in ("create", "vouch") and accepted:  # the tick lost the race: the run read it
        assert status == "reconciled", OUTCOMES[-1]
    gc(store, gate, acks)
    # no early tick may have passed the placeholder: if accepted it is pending or in L1
    finish(store, gate, acks)


OUTCOMES: list = []


# --- 4. reconcilers with different schedules and lags (the fuzz below interleaves them) -------------------------


CONFIGS = [
    DEF,
    Q1,
    TOG,
    ReconcileSettings(tick_together=True, quiet_min=1),
    ReconcileSettings(idle_lag=2, quiet_min=1),
    ReconcileSettings(idle_lag=7),
    ReconcileSettings(idle_lag=1, quiet_min=1),
    ReconcileSettings(idle_lag=13, quiet_min=1),
    ReconcileSettings(idle_lag=3, tick_together=True),
]


# --- 11. a reconcile process SIGKILLed mid-run (many early ticks in flight) ----------------------


KILL_SCRIPT = """
import os, signal, sys, threading
from ctp_state.storage import open_store
from ctp_state.reconcile import run_reconcile
from ctp_state.settings import ReconcileSettings
from tests.support import Wrapped
store = open_store(sys.argv[1], {})
at = int(sys.argv[3])
n = [0]
lock = threading.Lock()
class Killer(Wrapped):
    def put_if_absent(self, k, d):
        r = self.inner.put_if_absent(k, d)
        if k.startswith("logs/"):
            with lock:
                n[0] += 1
                if n[0] == at:
                    os.kill(os.getpid(), signal.SIGKILL)
        return r
    def bulk(self):
        return self
run_reconcile(Killer(store), config=ReconcileSettings(quiet_min=int(sys.argv[2]), lease_ms=1))
print("done")
"""


@pytest.mark.parametrize("quiet_min", [1])
def test_sigkill_mid_reconcile(store, gate, tmp_path, quiet_min):
    """A reconcile process SIGKILLed right after its k-th log create (ticks, claims,
    commits in flight in its threads), k random; producers before and after."""
    n = 60
    acks = Acks(store)
    create_topic(store, "t", n)
    for _ in range(3):
        epoch(store, gate, acks)
    ce = ClusterEpoch(store)
    env = with_this_checkout(dict(os.environ))
    rng = random.Random(quiet_min)
    kills = 0
    for rnd in range(10):
        for p in rng.sample(range(n), 4):
            c = ce.current()
            acks.produce("t", p, f"k-{rnd}-{p}".encode(), epoch=rng.choice([c, c - 1, bound(store, "t", p)]))
        ce.advance()
        r = subprocess.run(
            [sys.executable, "-c", KILL_SCRIPT, store.url, str(quiet_min), str(rng.randrange(1, 12))],
            env=env,
            capture_output=True,
            text=True,
            cwd=os.getcwd(),
        )
        kills += r.returncode == -signal.SIGKILL
        for p in rng.sample(range(n), 3):
            c = ce.current()
            acks.produce("t", p, f"after-kill-{rnd}-{p}".encode(), epoch=rng.choice([c, c - 1]))
        gc(store, gate, acks, tolerate=True)
    finish(store, gate, acks, config=ReconcileSettings(lease_ms=1), rounds=9)
    assert kills >= 5, kills


# --- 12. pure schedule properties the safety argument leans on ----------------------------------


def test_due_epoch_properties():
    for lag in (1, 2, 3, 6, 7, 13):
        for p in range(50):
            for b in range(0, 40):
                d = due_epoch("t", p, b, lag, spread=True)
                assert b < d <= b + lag
                assert d % lag == tick_phase("t", p, lag)
                assert due_epoch("t", p, b, lag, spread=False) == b + lag


# --- 13. a reconciler paused mid-run (stale C, stale pack) while the world moves on --------------


@pytest.mark.parametrize("pause_at", ["create"])
def test_paused_reconciler_with_stale_c(store, gate, pause_at):
    """Run A reads C and the pack, and stops at its first early tick (its GET of the
    pack state's last entry, or its create); meanwhile producers write into that
    partition at several epochs, another reconciler runs, C moves on three epochs, a GC
    runs; then A goes on with its stale C and pack."""
    acks = Acks(store)
    create_topic(store, "t", P)
    for _ in range(3):
        epoch(store, gate, acks)
    ce = ClusterEpoch(store)
    for rnd in range(4):
        p, st = until_early_due(store, gate, acks)
        log = plog(store, "t", p)
        key = log.key(st.applied_offset) if pause_at == "vouch" else log.key(st.applied_offset + 1)
        verb = "get" if pause_at == "vouch" else "create"
        reached, go = threading.Event(), threading.Event()

        def on(v, k, verb=verb, key=key, reached=reached, go=go):
            if v == verb and k == key and not reached.is_set():
                reached.set()
                go.wait(60)

        ce.advance()
        c_a = ce.current()
        out = {}
        a = threading.Thread(
            target=lambda out=out, on=on: out.setdefault("s", run_reconcile(Hook(store, on), config=DEF))
        )
        a.start()
        assert reached.wait(30)
        acks.produce("t", p, f"pa-{rnd}-1".encode(), epoch=c_a - 1, forge=lambda q: (q + 1) % P)
        run_reconcile(store, config=Q1 if rnd % 2 else TOG)
        for _ in range(3):
            ce.advance()
        acks.produce("t", p, f"pa-{rnd}-2".encode(), epoch=ce.current(), forge=lambda q: (q + 1) % P)
        gc(store, gate, acks)
        acks.produce("t", p, f"pa-{rnd}-3".encode(), epoch=c_a, forge=lambda q: (q + 1) % P)
        go.set()
        a.join()
        gc(store, gate, acks)
        epoch(store, gate, acks)
    finish(store, gate, acks)


# --- 14. a GC run in the middle of a reconcile: after its early ticks, before its summary ---------


def test_gc_between_ticks_and_summary(store, gate):
    acks = Acks(store)
    create_topic(store, "t", P)
    for _ in range(3):
        epoch(store, gate, acks)
    ce = ClusterEpoch(store)
    from ctp_state import reconcile as rmod

    real = rmod.summarize
    fired = []
    for rnd in range(10):
        c = ce.current()
        p = rnd % P
        acks.produce("t", p, f"g-{rnd}".encode(), epoch=max(1, c - 1), forge=lambda q: (q + 4) % P)

        def mid(*a, rnd=rnd, **kw):
            # ticks and commits are written, the summary is not: producers, then a GC
            for q in range(P):
                b = bound(store, "t", q)
                acks.produce("t", q, f"mid-{rnd}-{q}".encode(), epoch=b, forge=lambda x: (x + 1) % P)
            gc(store, gate, acks)
            fired.append(1)
            return real(*a, **kw)

        rmod.summarize = mid
        try:
            ce.advance()
            run_reconcile(store, config=Q1 if rnd % 2 else DEF)
        finally:
            rmod.summarize = real
        gc(store, gate, acks)
    assert len(fired) == 10
    finish(store, gate, acks)


# --- 15. heavier seeded fuzz: schedules, lags, C jumps, stale and long-lived producers, ticks
#         that die at their create, GCs (CTP_SPREAD_SEEDS widens it: 24 seeds held)


@pytest.mark.parametrize("seed", range(int(os.environ.get("CTP_SPREAD_SEEDS", "1"))))
def test_spread_fuzz_heavy(store, gate, seed):
    rng = random.Random(1000 + seed)
    acks = Acks(store)
    lock = threading.Lock()
    create_topic(store, "t", P)
    ce = ClusterEpoch(store)
    prods = [Producer(store, epoch_ttl_s=rng.choice([0, 3600]), producer_id=f"lp{seed}-{k}") for k in range(2)]
    early = 0
    try:
        for i in range(90):
            r = rng.random()
            c = ce.current()
            if r < 0.2:
                for _ in range(1 if rng.random() < 0.8 else rng.randrange(2, 20)):
                    ce.advance()
            elif r < 0.4:
                p = rng.randrange(P)
                b = bound(store, "t", p)
                e = max(1, rng.choice([c, c - 1, b, b - 1, b + 1, c - rng.randrange(14)]))
                e = min(e, c)
                forge = (lambda q: (q + 3) % P) if rng.random() < 0.4 else None
                got = acks.produce("t", p, f"hz-{seed}-{i}".encode(), epoch=e, forge=forge)
                if e < b:
                    assert got is None, (p, e, b)
            elif r < 0.5:
                prod = rng.choice(prods)
                p = rng.randrange(P)
                val = f"lp-{seed}-{i}".encode()
                record(acks, lock, prod.write([(("t", p), [Record(val)])])[0], val)
            elif r < 0.75:
                cfg = rng.choice(CONFIGS)
                before = {p: bound(store, "t", p) for p in range(P)}
                s = run_reconcile(store, config=cfg)
                early += sum(
                    1
                    for x in s.partitions
                    if x.status == "advanced" and s.cluster_epoch - before[x.partition] < cfg.idle_lag
                )
            elif r < 0.82:
                victim = rng.randrange(P)
                vlog = plog(store, "t", victim)

                def on(v, k, vlog=vlog):
                    if v == "create" and k.startswith(vlog.key(0).rsplit("/", 1)[0]) and rng.random() < 0.5:
                        raise RuntimeError("killed at a create")

                try:
                    # (lease 1 ms: a release that dies leaves a claim the next run takes over)
                    run_reconcile(Hook(store, on), config=rng.choice([ReconcileSettings(lease_ms=1), Q1L]))
                except Exception:
                    pass
            else:
                gc(store, gate, acks, tolerate=True)
    finally:
        for pr in prods:
            pr.close()
    assert early > 0
    finish(store, gate, acks, rounds=16, config=ReconcileSettings(lease_ms=1))


# --- 16. the store loses an early tick at a log's tail; a producer's placeholder at an epoch
#         below it lands in its slot (the GC's pack and the reconciler's quiet path end at it)


@pytest.mark.parametrize("gc_before_refill", [True])
@pytest.mark.parametrize("config", [Q1], ids=["q1"])
def test_lost_early_tick_refilled_by_lower_epoch(store, gate, gc_before_refill, config, monkeypatch):
    """(Once the store lost an entry the GC's gate refuses every run -- I3, a lower bound
    went down -- and deletes nothing: that is the expected outcome; the checks are that
    nothing acknowledged is lost and every pending placeholder's L0 object stays.)"""
    monkeypatch.setitem(TOLERATE, "gc", False)
    acks = Acks(store)
    create_topic(store, "t", P)
    for _ in range(3):
        epoch(store, gate, acks, config)
    for rnd in range(3):
        p, st = until_early_due(store, gate, acks, config)
        s, _ = epoch(store, gate, acks, config)  # the early tick, then a GC packs it
        assert next(x.status for x in s.partitions if x.partition == p) == "advanced"
        after = full_state(store, "t", p)
        c_tick = after.min_epoch_lower_bound
        assert c_tick > st.min_epoch_lower_bound
        log = plog(store, "t", p)
        tick_key = log.key(after.applied_offset)
        # the store loses the tick (and any snapshot that reaches it)
        doomed = [tick_key] + [o.key for o in store.list(log.key(0).rsplit("/", 2)[0]) if "snap" in o.key]
        store.delete_many(doomed)
        TOLERATE["gc"] = True
        if gc_before_refill:
            gc(store, gate, acks, tolerate=True)
        e = max(st.min_epoch_lower_bound, c_tick - 1)
        got = acks.produce("t", p, f"refill-{rnd}".encode(), epoch=e, forge=lambda q: (q + 1) % P)
        if rnd == 0:  # the log without its tick takes it, in the tick's slot
            assert got is not None and e < c_tick, (e, c_tick)
            assert any(x.l0_key == got for x in full_state(store, "t", p).pending)
        gc(store, gate, acks, tolerate=True)
        epoch(store, gate, acks, config)
    finish(store, gate, acks, config)
