"""Idle partitions created together do not all tick in the same run (#40: the run that
ticked every partition of a 100k cluster at once took 17-55 s on a file store, the runs
between ticks nothing). Each partition first ticks at a phase of its own -- an epoch of
``C mod idle_lag`` picked by its name -- and every ``idle_lag`` epochs after that, so each
run ticks about ``1/idle_lag`` of them at the same total cost; ``tick_together`` is the
old schedule. Ticking early is always allowed (R6 says no later than ``idle_lag``), so M
never trails C by more than it did."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import replace

import pytest

from ctp_state.epoch import ClusterEpoch
from ctp_state.gc import compute_m, gather
from ctp_state.gc.inputs import newest_summary
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.reconcile import run_reconcile
from ctp_state.settings import ReconcileSettings
from ctp_state.tick_schedule import due_epoch, tick_phase
from ctp_state.topics import create_topic

PARTITIONS = 24


def ticks_per_run(store, config: ReconcileSettings, runs: int) -> list[set[int]]:
    """Which partitions of topic ``t`` each of ``runs`` reconciles advanced (C moved by
    one before each), checking M's lag after each."""
    out = []
    for _ in range(runs):
        c = ClusterEpoch(store).advance()
        s = run_reconcile(store, config=config)
        assert s.ok, s
        out.append({p.partition for p in s.partitions if p.status == "advanced"})
        m = compute_m(*gather(store), now_ms=0).m
        # R6 no later than idle_lag: M (one below the least lower bound) trails C by at
        # most idle_lag + 1, spread or not
        assert m is not None and c - m <= config.idle_lag + 1, (c, m)
    return out


def test_partitions_created_together_tick_in_different_runs_once_per_lag(store):
    create_topic(store, "t", PARTITIONS)
    config = ReconcileSettings()
    lag = config.idle_lag
    runs = ticks_per_run(store, config, 3 * lag)
    steady = runs[lag:]  # after the first lag epochs every partition has ticked at its phase
    sizes = [len(r) for r in steady]
    assert max(sizes) < PARTITIONS // 2, sizes  # not all (nor half) in one run
    assert sum(1 for n in sizes if n) >= lag - 1, sizes  # most runs tick some
    for start in range(len(steady) - lag + 1):  # every window of lag runs: each ticks exactly once
        window = Counter(p for r in steady[start : start + lag] for p in r)
        assert window == Counter(range(PARTITIONS)), (start, window)
    # and each at its own phase: a run at C ticks the partitions whose phase is C mod lag
    c_last = ClusterEpoch(store).current()
    for back, r in enumerate(reversed(steady)):
        c = c_last - back
        assert r == {p for p in range(PARTITIONS) if tick_phase("t", p, lag) == c % lag}, (c, r)


def test_tick_together_is_the_old_schedule_every_partition_in_one_run(store):
    create_topic(store, "t", PARTITIONS)
    config = ReconcileSettings(tick_together=True)
    runs = ticks_per_run(store, config, 2 * config.idle_lag)
    sizes = [len(r) for r in runs]
    assert sorted(sizes) == [0] * (len(runs) - 2) + [PARTITIONS, PARTITIONS], sizes


def test_the_spread_costs_not_one_tick_more_than_ticking_together(store):
    """Over four lags from creation, a partition ticks four times either way: its first
    tick comes early (at its phase, at most ``idle_lag`` epochs after its creation) and
    each one after it ``idle_lag`` epochs later, as ticking together does."""
    create_topic(store, "spread", PARTITIONS)
    create_topic(store, "together", PARTITIONS)
    lag = ReconcileSettings().idle_lag
    ticks: Counter[tuple[str, int]] = Counter()
    for _ in range(4 * lag):
        ClusterEpoch(store).advance()
        for topic, config in (("spread", ReconcileSettings()), ("together", ReconcileSettings(tick_together=True))):
            s = run_reconcile(store, config=config, topics=[topic])
            ticks.update((p.topic, p.partition) for p in s.partitions if p.status == "advanced")
    assert set(ticks.values()) == {4}, ticks
    assert len(ticks) == 2 * PARTITIONS


@pytest.mark.parametrize("together", [False, True])
def test_the_gc_names_the_epoch_the_reconciler_advances_an_idle_partition_at(store, together):
    """The GC's reason for an idle partition at M says when it moves ("once C reaches
    N", or "the next reconcile"): checked against what the reconciles then do. Every
    partition is written first, so the first run claims them all (the claim path does
    not advance at a phase: some partitions' phase epochs pass unticked)."""
    create_topic(store, "t", PARTITIONS)
    with Producer(store, epoch_ttl_s=0) as prod:
        assert all(w.accepted for w in prod.write([(("t", p), [Record(b"x")]) for p in range(PARTITIONS)]))
    config = ReconcileSettings(tick_together=together)
    lag = config.idle_lag
    said: list[tuple[int, int, int]] = []  # (partition, C when the GC said it, the epoch it named)
    advanced_at: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    runs = 2 * lag
    for _ in range(runs):
        c = ClusterEpoch(store).advance()
        s = run_reconcile(store, config=config)
        assert s.ok, s
        for p in s.partitions:
            if p.status == "advanced":
                advanced_at[p.partition].append(c)
        views = gather(store)[1]
        summary = newest_summary(store, {})
        assert summary.ticks_spread is (not together)
        d = compute_m(c, views, now_ms=0, idle_lag=summary.idle_lag, ticks_spread=summary.ticks_spread)
        for h in d.held_by:
            why = " ".join(h.reasons)
            if h.partition is None or "idle:" not in why:  # (M < C: the cluster epoch holds it)
                continue
            if "the next reconcile advances it" in why:  # the next run is at C + 1 here
                said.append((h.partition, c, c + 1))
            else:
                got = re.search(r"once C reaches (\d+)", why)
                assert got, why
                said.append((h.partition, c, int(got.group(1))))
    last = c
    checked = 0
    for p, when, named in said:  # each run advances every partition due: the first advance after is at the named C
        if named <= last:
            assert next(e for e in advanced_at[p] if e > when) == named, (p, when, named, advanced_at[p])
            checked += 1
    assert checked >= PARTITIONS, said


def test_phases_are_stable_and_cover_the_lag():
    """The phase is a pure function of the topic's name and the partition (not Python's
    salted ``hash``): every process agrees on it."""
    lag = 6
    ph = [tick_phase("t", p, lag) for p in range(600)]
    assert ph == [tick_phase("t", p, lag) for p in range(600)]
    assert set(ph) == set(range(lag))
    assert max(Counter(ph).values()) < 2 * 600 / lag
    assert tick_phase("t", 3, 1) == 0
    assert due_epoch("t", 3, 10, 1, spread=True) == 11
    # due from the first phase epoch past the bound, never later than bound + lag
    for bound in range(20):
        due = due_epoch("t", 7, bound, lag, spread=True)
        assert bound < due <= bound + lag and due % lag == tick_phase("t", 7, lag)
        assert due_epoch("t", 7, bound, lag, spread=False) == bound + lag
    assert replace(ReconcileSettings(), tick_together=True).tick_together
