"""A review's attempts to lose data at the default idle_lag 6 with the quiet path on,
kept (all held): producers at epochs up to six old into partitions whose window has not
moved for as long, partitions due and not due in one run with forged footers, a topic
re-created while quiet, reconcilers at lags 2 and 6 interleaved, and seeded random
interleavings with crashes, compactions and GCs. On the file store: what is tried is
the reconciler's and the GC's logic over the store's API (the quiet path's races on both
stores: tests/reconcile/test_quiet_race_attacks.py).

Oracle (copied from tests/reconcile/test_quiet_race_attacks.py's Acks): after every GC
run, every acknowledged record whose placeholder is pending in a full replay of its log
has its L0 object and M < its epoch (I1); at the end every acknowledged record reads
back exactly once (I2)."""

from __future__ import annotations

import random

import pytest

from ctp_state import crashpoints
from ctp_state.compact import run_compaction
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import CtpError
from ctp_state.gc import run_gc
from ctp_state.gc.history import newest_pack
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.reconcile import run_reconcile
from ctp_state.settings import CompactSettings, GcSettings, ReconcileSettings
from ctp_state.topics import create_topic
from tests.reconcile.test_quiet_race_attacks import PLANS, Acks, record_plans  # noqa: F401 (a fixture)

DEF = ReconcileSettings()  # idle_lag 6, quiet_min 8
Q1 = ReconcileSettings(quiet_min=1)
P = 10


@pytest.fixture
def store(fstore):
    return fstore


@pytest.fixture(autouse=True)
def at_the_default():
    """(``record_plans``, imported, is autouse: every read plan goes to ``PLANS``.)"""
    yield
    assert DEF.idle_lag == 6 and DEF.quiet_min == 8


def gc(store, gate, acks, config=GcSettings()):
    rec = run_gc(store, gate=gate, config=config)
    acks.check(rec)
    return rec


def epoch(store, gate, acks, config=DEF, gcc=GcSettings()):
    ClusterEpoch(store).advance()
    s = run_reconcile(store, config=config)
    rec = gc(store, gate, acks, gcc)
    return s, rec


def warm(store, gate, acks, topic="t", n=P, rounds=3, config=DEF):
    create_topic(store, topic, n)
    for _ in range(rounds):
        epoch(store, gate, acks, config)
    assert newest_pack(store) is not None


def finish(store, gate, acks, sizes, config=DEF, rounds=8):
    for _ in range(rounds):
        epoch(store, gate, acks, config)
    from tests.support import assert_exactly_once

    for topic, n in sizes.items():
        assert_exactly_once(store, topic, {p: acks.sent.get((topic, p), []) for p in range(n)}, all_in_l1=True)


def quiet_taken():
    return any(x[0] is None for x in PLANS)


# 1. a producer whose cached epoch is 5 epochs old writes into an idle partition whose
#    window has not moved for 5 epochs, just before / just after its tick.
@pytest.mark.parametrize("config", [DEF, Q1], ids=["default", "quiet1"])
def test_old_cached_epoch_into_idle_window(store, gate, config):
    acks = Acks(store)
    warm(store, gate, acks, config=config)
    ce = ClusterEpoch(store)
    e0 = ce.current()
    for i in range(8):  # through the tick and past it
        c = ce.current()
        for p in range(0, P, 3):
            for old in range(max(1, c - 6), c + 1):
                acks.produce("t", p, f"old-{i}-{p}-{old}".encode(), epoch=old)
        epoch(store, gate, acks, config)
    assert ce.current() > e0
    assert quiet_taken()
    finish(store, gate, acks, {"t": P}, config)


# 2. some partitions due and others not in the same run; placeholders written to not-due
#    ones with forged footers (listing misses them) -- found only at their tick.
def test_due_and_not_due_mixed_with_forged_footers(store, gate):
    acks = Acks(store)
    create_topic(store, "t", P)
    ce = ClusterEpoch(store)
    # stagger the partitions' phases: write to a different partition each epoch
    for i in range(P):
        ce.advance()
        acks.produce("t", i, f"stagger-{i}".encode())
        run_reconcile(store, config=DEF)
        gc(store, gate, acks)
    for i in range(14):
        ce.advance()
        c = ce.current()
        p = (i * 7) % P
        acks.produce("t", p, f"forged-{i}".encode(), epoch=max(1, c - 4), forge=lambda q: (q + 1) % P)
        run_reconcile(store, config=DEF)
        gc(store, gate, acks)
    assert quiet_taken()
    finish(store, gate, acks, {"t": P})


# 3. a topic re-created while its partitions are quiet; producers holding the old
#    incarnation / writing at old epochs into the new one.
def test_recreated_topic_while_quiet(store, gate):
    from ctp_state.deletion import delete_topic

    acks = Acks(store)
    warm(store, gate, acks, rounds=4)
    create_topic(store, "u", P)
    ce = ClusterEpoch(store)
    for _ in range(3):
        epoch(store, gate, acks)
    old_prod = Producer(store, epoch_ttl_s=3600)
    old_prod.write([(("u", 1), [Record(b"warm")])])  # bind the writer to the old incarnation
    acks.sent.setdefault(("u", 1), [])
    delete_topic(store, "u")
    create_topic(store, "u", P)
    acks.sent = {k: v for k, v in acks.sent.items() if k[0] != "u"}
    acks.keys = [k for k in acks.keys if k[0] != "u"]
    for i in range(8):
        c = ce.current()
        acks.produce("u", i % P, f"new-{i}".encode(), epoch=max(1, c - 5))
        v = old_prod.write([(("u", 1), [Record(f"oldinc-{i}".encode())])])[0]
        if v.accepted:  # written to whatever incarnation it holds: must be readable there
            acks.sent.setdefault(("u", 1), []).append(Record(f"oldinc-{i}".encode()))
        epoch(store, gate, acks)
    old_prod.close()
    finish(store, gate, acks, {"t": P, "u": P})


# 4. reconcilers at lag 2 and lag 6 interleaved (CLI at one lag, DAG at the default).
def test_mixed_lags(store, gate):
    acks = Acks(store)
    warm(store, gate, acks)
    ce = ClusterEpoch(store)
    lag2 = ReconcileSettings(idle_lag=2)
    for i in range(12):
        ce.advance()
        c = ce.current()
        acks.produce("t", (3 * i) % P, f"m{i}".encode(), epoch=max(1, c - 2))
        run_reconcile(store, config=lag2 if i % 2 else DEF)
        gc(store, gate, acks)
    finish(store, gate, acks, {"t": P})


# 5. seeded random interleavings: long-lived producers (cached epochs, cached states),
#    producers at old epochs, forged footers, reconciles at default / quiet_min 1, GCs,
#    compactions, crashes.
@pytest.mark.parametrize("seed", range(2))
def test_fuzz_lag6(store, gate, seed):
    rng = random.Random(seed)
    acks = Acks(store)
    create_topic(store, "t", P)
    ce = ClusterEpoch(store)
    prods = [Producer(store, epoch_ttl_s=rng.choice([0, 3600])) for _ in range(2)]

    def lp_write(i):
        prod = rng.choice(prods)
        p = rng.randrange(P)
        val = f"lp-{seed}-{i}".encode()
        v = prod.write([(("t", p), [Record(val)])])[0]
        if v.accepted and not v.duplicate:
            acks.sent.setdefault(("t", p), []).append(Record(val))
            from ctp_state import layout

            acks.keys.append(("t", p, v.l0_key, layout.parse_l0_key(v.l0_key)[1]))

    try:
        for i in range(45):
            r = rng.random()
            if r < 0.2:
                ce.advance()
            elif r < 0.4:
                c = ce.current()
                forge = (lambda q: (q + 3) % P) if rng.random() < 0.3 else None
                acks.produce(
                    "t", rng.randrange(P), f"op-{seed}-{i}".encode(), epoch=max(1, c - rng.randrange(7)), forge=forge
                )
            elif r < 0.5:
                lp_write(i)
            elif r < 0.7:
                run_reconcile(store, config=rng.choice([DEF, Q1]))
            elif r < 0.75:

                def h(pt, idx):
                    if pt == rng.choice(["after_claim", "before_commit", "after_commit"]):
                        raise RuntimeError("crash")

                crashpoints.install(h)
                try:
                    run_reconcile(store, config=ReconcileSettings(quiet_min=1, lease_ms=1))
                except RuntimeError:
                    pass
                finally:
                    crashpoints.install(None)
            elif r < 0.78:
                run_compaction(store, config=CompactSettings(max_small_files=2))
            else:
                try:
                    gc(store, gate, acks, GcSettings(full_read_every=rng.choice([12, 3])))
                except CtpError:  # a gate refusal / unreadable state deletes nothing
                    pass
    finally:
        for p in prods:
            p.close()
    finish(store, gate, acks, {"t": P}, rounds=9)
