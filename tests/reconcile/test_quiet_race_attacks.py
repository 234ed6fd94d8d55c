"""Races on the reconciler's quiet path (ctp_state/reconcile_quiet.py, docs/design.md
14): a producer's placeholder landing right after the run's L0 listing, between the
tick's GET of the pack state's last entry and its create, right after the create; a
reconciler that reads every partition running inside a quiet one; three reconcilers in
threads. Most placeholders' L0 footers are forged to name another partition, so the
listing misses them and only the tick can find them.

Every scenario records each acknowledged record (its L0 key and epoch) and, after every
GC run, checks against a full listing replay of each log: while a record's placeholder
is pending, its L0 object exists and M < its epoch (I1). At the end everything is
reconciled and read back exactly once (I2). A review's scenarios, all held: kept so
that they keep holding. On both stores."""

from __future__ import annotations

import threading

import pytest

from ctp_state import layout, state as sm
from ctp_state.epoch import ClusterEpoch
from ctp_state.gc import run_gc
from ctp_state.gc.history import newest_pack
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.reconcile import run_reconcile
from ctp_state.settings import ReconcileSettings
from ctp_state.tick_schedule import idle_due
from ctp_state.topics import create_topic
from tests.support import Wrapped, assert_exactly_once, l0_keys, plog, rewrite_footer

P = 10

PLANS: list = []


@pytest.fixture(autouse=True)
def record_plans(monkeypatch):
    from ctp_state import reconcile

    real = reconcile.plan_reads

    def spy(*a, **kw):
        plan = real(*a, **kw)
        PLANS.append((plan.why_all, len(plan.read), len(plan.tick), len(plan.skip)))
        return plan

    monkeypatch.setattr(reconcile, "plan_reads", spy)
    PLANS.clear()
    FIRED.clear()
    yield
    quiet = [x for x in PLANS if x[0] is None]
    assert quiet, PLANS  # the quiet path was taken


# --- oracle ---------------------------------------------------------------------------


class Acks:
    def __init__(self, store):
        self.store = store
        self.sent: dict[tuple[str, int], list[Record]] = {}
        self.keys: list[tuple[str, int, str, int]] = []  # topic, partition, l0 key, epoch
        self.m_checked = 0

    def produce(self, topic, partition, value: bytes, *, store=None, epoch=None, prod=None, forge=None):
        st = store or self.store
        before = l0_keys(self.store)
        own = prod is None
        prod = prod or Producer(st, epoch_ttl_s=0)
        try:
            got = prod.write([((topic, partition), [Record(value)])], epoch=epoch)[0]
        finally:
            if own:
                prod.close()
        new = l0_keys(self.store) - before
        if got.accepted:
            (key,) = new
            self.sent.setdefault((topic, partition), []).append(Record(value))
            self.keys.append((topic, partition, key, layout.parse_l0_key(key)[1]))
            if forge is not None:
                rewrite_footer(self.store, key, forge)
            return key
        return None

    def check(self, rec):
        """I1 after a GC run ``rec``: every acknowledged record's placeholder that is
        pending in a full replay of its log (or whose log does not replay) has its L0
        object, and M (of a passing run) is below its epoch."""
        for topic, p, key, e in self.keys:
            try:
                s = full_state(self.store, topic, p)
                pending = {x.l0_key for x in s.pending}
                waiting = key in pending
            except Exception:
                waiting = True
            if waiting:
                assert self.store.head(key) is not None, f"L0 object {key} of a pending placeholder was deleted"
                if rec is not None and rec.status == "ok" and rec.m is not None:
                    self.m_checked += 1
                    assert rec.m < e, f"M {rec.m} passed the pending placeholder of epoch {e} ({topic}/{p})"

    def final(self, store, gate, topics_sizes, rounds=ReconcileSettings().idle_lag, config=ReconcileSettings()):
        # rounds: a partition whose placeholder no L0 footer names (forged away) is read
        # at its tick, which comes within idle_lag epochs (at its phase, or the lag)
        for _ in range(rounds):
            ClusterEpoch(store).advance()
            run_reconcile(store, config=config)
            rec = run_gc(store, gate=gate)
            self.check(rec)
        for topic, n in topics_sizes.items():
            assert_exactly_once(store, topic, {p: self.sent.get((topic, p), []) for p in range(n)}, all_in_l1=True)


def full_state(store, topic, p) -> sm.PartitionState:
    log = plog(store, topic, p, write_snapshots=False)
    s = log.empty_state()
    for off, e in log.entries():
        s = sm.apply(s, off, e).state
    return s


def away(p):  # a footer naming partition 9 for every chunk
    return 9


def epoch(store, gate, acks, config=ReconcileSettings(), *, ok=True):
    ClusterEpoch(store).advance()
    s = run_reconcile(store, config=config)
    rec = run_gc(store, gate=gate)
    acks.check(rec)
    if ok:
        assert rec.status == "ok", rec.gate.failures if rec.gate else rec.error
    return s, rec


def warm(store, gate, acks, topic="t", n=P, config=ReconcileSettings()):
    create_topic(store, topic, n)
    for _ in range(4):
        epoch(store, gate, acks, config)
    assert newest_pack(store) is not None


def due_next(store, topic, p, config=ReconcileSettings()) -> bool:
    st = newest_pack(store).states[(topic, p)][0]
    c = ClusterEpoch(store).current() + 1
    return idle_due(topic, p, st.min_epoch_lower_bound, c, config.idle_lag, spread=not config.tick_together)


def to_phase(store, gate, acks, due: bool, config=ReconcileSettings(), topic="t"):
    """Epochs until partition 0's tick is (due) / is not (not due) in the next epoch."""
    for _ in range(10):
        if due_next(store, topic, 0, config) == due:
            return
        epoch(store, gate, acks, config)
    raise AssertionError("phase not reached")


class Hook(Wrapped):
    """Calls ``on(verb, key)`` before each request (once per (verb, key) match)."""

    def __init__(self, inner, on):
        super().__init__(inner)
        self.on = on

    def get(self, k):
        self.on("get", k)
        return self.inner.get(k)

    def get_range(self, k, s, n):
        self.on("get_range", k)
        return self.inner.get_range(k, s, n)

    def get_tail(self, k, n):
        self.on("get_tail", k)
        return self.inner.get_tail(k, n)

    def put_if_absent(self, k, d):
        self.on("create", k)
        r = self.inner.put_if_absent(k, d)
        self.on("created", k)
        return r

    def list(self, prefix="", start_after=None, end_before=None):
        self.on("list", prefix)
        return self.inner.list(prefix, start_after, end_before)

    def bulk(self):
        return self


FIRED: list = []


def once(fn):
    done = []

    def run(*a):
        FIRED.append(1)
        if not done:
            done.append(1)
            fn(*a)

    return run


# --- scenarios ------------------------------------------------------------------------


def race(store, gate, acks, verb: str, key: str, action):
    """One epoch whose reconcile runs ``action`` once, at its first request ``verb`` on
    ``key`` (just before it; "created": just after a create), then a GC, checked.
    Returns the reconcile's summary."""
    fire = once(action)

    def on(v, k):
        if v == verb and k == key:
            fire()

    ClusterEpoch(store).advance()
    s = run_reconcile(Hook(store, on))
    assert FIRED
    acks.check(run_gc(store, gate=gate))
    return s


@pytest.mark.parametrize("due", [True, False])
def test_placeholder_between_listing_and_tick(store, gate, due):
    """A producer appends to quiet partitions right after the reconciler's L0 listing
    (its object is not in the listing): partition 0 (due or not), with an honest footer
    and with a footer forged away."""
    acks = Acks(store)
    warm(store, gate, acks)
    to_phase(store, gate, acks, due)
    both = lambda: (acks.produce("t", 0, b"after-listing"), acks.produce("t", 1, b"forged", forge=away))  # noqa: E731
    race(store, gate, acks, "list", layout.L0_ROOT, both)
    acks.final(store, gate, {"t": P})


def test_placeholder_between_vouch_and_tick_create(store, gate):
    """The placeholder lands after the tick's GET of the pack state's last entry and
    before its create (the create is the probe)."""
    acks = Acks(store)
    warm(store, gate, acks)
    to_phase(store, gate, acks, True)
    st = newest_pack(store).states[("t", 0)][0]
    vouch_key = plog(store, "t", 0).key(st.applied_offset)
    s = race(store, gate, acks, "get", vouch_key, lambda: acks.produce("t", 0, b"between", forge=away))
    assert next(p for p in s.partitions if p.partition == 0).status == "reconciled", s
    acks.final(store, gate, {"t": P})


def test_placeholder_right_after_tick_create(store, gate):
    """The placeholder lands right after the tick's create, before its listing."""
    acks = Acks(store)
    warm(store, gate, acks)
    to_phase(store, gate, acks, True)
    st = newest_pack(store).states[("t", 0)][0]
    tick_key = plog(store, "t", 0).key(st.applied_offset + 1)
    race(store, gate, acks, "created", tick_key, lambda: acks.produce("t", 0, b"after-tick", forge=away))
    acks.final(store, gate, {"t": P})


@pytest.mark.parametrize("due", [True, False])
def test_two_reconcilers_race(store, gate, due):
    """A reconciler reading every partition (quiet_min 1000) runs in the middle of a
    quiet one (after its listing), with placeholders landed before and after."""
    acks = Acks(store)
    warm(store, gate, acks)
    to_phase(store, gate, acks, due)
    acks.produce("t", 2, b"before", forge=away)
    full = ReconcileSettings(quiet_min=1000)

    def other():
        acks.produce("t", 3, b"mid", forge=away)
        run_reconcile(store, config=full)
        acks.produce("t", 0, b"mid2", forge=away)

    race(store, gate, acks, "list", layout.L0_ROOT, other)
    acks.final(store, gate, {"t": P})


def test_two_reconcilers_concurrently_threads(store, gate):
    acks = Acks(store)
    warm(store, gate, acks)
    for r in range(4):
        for p in range(0, P, 3):
            acks.produce("t", p, b"c%d-%d" % (r, p), forge=away if p % 2 else None)
        ClusterEpoch(store).advance()
        ts = [
            threading.Thread(target=run_reconcile, args=(store,), kwargs={"config": cfg})
            for cfg in (ReconcileSettings(), ReconcileSettings(quiet_min=1000), ReconcileSettings())
        ]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        acks.check(run_gc(store, gate=gate))
    acks.final(store, gate, {"t": P})
