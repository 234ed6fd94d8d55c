"""M (R4), the epoch the GC may delete through, with who holds it back (R7)."""

from __future__ import annotations

from ctp_state import layout, state as sm
from ctp_state.entries import AccessMode, Claim, Init, Placeholder
from ctp_state.epoch import ClusterEpoch
from ctp_state.gc import compute_m, plan_l0_deletes
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.status import read_states, select_topics
from ctp_state.topics import create_topic


def st(topic: str, p: int, *entries) -> sm.PartitionState:
    return sm.replay(sm.PartitionState(topic, p), 0, list(entries))


def test_m_with_no_partitions_is_c_minus_1():
    d = compute_m(7, [], now_ms=0)
    assert d.m == 6 and d.held_by[0].topic is None and "C=7" in d.held_by[0].reasons[0]


def test_m_is_the_minimum_and_says_why():
    busy = st("t", 0, Init(3), Placeholder(3, layout.l0_key(0, 3, "k"), 8, 100, 5, 0))  # M(p) = 2, lag 1
    stuck = st("t", 1, Init(3), Claim(1, "rec-x", AccessMode.EXCLUSIVE, 50, 0))  # lease over at 50
    fresh = st("t", 2, Init(9))
    q = st("t", 3, Init(3))
    d = compute_m(10, [busy, stuck, fresh, q], now_ms=100, quarantined={("t", 3): ("l0/001/x.l0", "CRC32C mismatch")})
    assert d.m == 2
    why = {(h.topic, h.partition): " | ".join(h.reasons) for h in d.held_by}
    assert set(why) == {("t", 0), ("t", 1), ("t", 3)}
    assert "reconciler lag: 1 placeholders, 5 records, 100 bytes" in why[("t", 0)]
    assert "stuck claim: rec-x" in why[("t", 1)]
    assert "quarantined: CRC32C mismatch (L0 key l0/001/x.l0)" in why[("t", 3)]


def test_an_uninitialized_partition_blocks_collection():
    d = compute_m(10, [st("t", 0, Init(3)), sm.PartitionState("t", 1)], now_ms=0)
    assert d.m is None and d.held_by[0].partition == 1 and "no init entry" in d.held_by[0].reasons[0]


def test_a_partition_created_while_a_gc_runs_keeps_its_data(store):
    create_topic(store, "old", 1)
    ce = ClusterEpoch(store)
    for _ in range(3):
        ce.advance()
    c = ce.current()  # the GC reads C first ...
    states = read_states(store, select_topics(store))
    create_topic(store, "new", 1)  # ... a topic appears while it runs ...
    with Producer(store, epoch_ttl_s=0) as prod:
        v = prod.write([(("new", 0), [Record(b"keep me")])])[0]
    assert v.accepted
    d = compute_m(c, states, now_ms=0)  # ... and M comes from what it read
    todo, _ = plan_l0_deletes(store, d.m, now_s=0)
    assert v.l0_key not in {o.key for o in todo}


def test_partitions_at_c_minus_1_are_not_reported_as_holding_m_back():
    d = compute_m(5, [st("t", 0, Init(5)), st("t", 1, Init(5))], now_ms=0)
    assert d.m == 4 and [h.topic for h in d.held_by] == [None]


def test_an_idle_partition_at_m_says_when_the_reconciler_advances_it():
    # Lower bound 3 at C = 6: with the reconciler's idle_lag 6 (its newest summary's), the
    # tick comes at C = 9, not at the next reconcile.
    idle = st("t", 0, Init(3))
    (h,) = compute_m(6, [idle, st("t", 1, Init(6))], now_ms=0, idle_lag=6).held_by
    assert h.partition == 0 and h.reasons == (
        "idle: lower bound 3 not advanced yet (a reconcile advances it once C reaches 9: idle_lag 6, R6)",
    )
    # Due now (C - 3 >= 2): the next reconcile.
    (h,) = compute_m(6, [idle, st("t", 1, Init(6))], now_ms=0, idle_lag=2).held_by
    assert h.reasons == ("idle: lower bound 3 not advanced yet (the next reconcile advances it: idle_lag 2, R6)",)
    # No reconcile summary: the lag is not known here.
    (h,) = compute_m(6, [idle, st("t", 1, Init(6))], now_ms=0).held_by
    assert h.reasons == (
        "idle: lower bound 3 not advanced yet (a reconcile advances it once it trails C by its idle_lag, R6)",
    )
