"""``ctp_state.produce_trace``: carrying what is known of a producer past the point a
partition forgot it. Its decisions are checked against the fold itself on random logs:
whatever it decides about one of P's entries, the fold decided the same."""

from __future__ import annotations

import random

import pytest

from ctp_state import producer_memory, state as sm
from ctp_state.entries import Advance, Init, Placeholder, Reconcile, Seal
from ctp_state.errors import CorruptData
from ctp_state.produce_trace import InDoubt, Trace, follow, of_state
from tests.support.produce import P, assert_true_of


@pytest.fixture(autouse=True)
def small_memory(monkeypatch):
    monkeypatch.setattr(producer_memory, "MAX_PRODUCERS", 3)
    monkeypatch.setattr(producer_memory, "PRODUCER_RETENTION_EPOCHS", 2)


def ph(epoch: int, producer: str | None, seq: int | None, n: int = 2, key_epoch: int | None = None) -> Placeholder:
    k = epoch if key_epoch is None else key_epoch
    return Placeholder(epoch, f"l0/000/{k:018d}/{random.getrandbits(64):016x}.l0", 0, 1, n, 0, None, producer, seq, 7)


def fold(entries):
    """The states after each entry, and each entry's verdict (applied as new or not)."""
    st = sm.PartitionState("t", 0)
    states, applied = [], []
    for i, e in enumerate(entries):
        out = sm.apply(st, i, e)
        st = out.state
        states.append(st)
        applied.append(out.accepted and not out.duplicate and isinstance(e, Placeholder))
    return states, applied


def random_log(rng: random.Random, n: int) -> list:
    entries: list = [Init(1)]
    epoch, sent = 1, 0  # P's records the generator believes applied
    quiet = range(n // 3, 2 * n // 3) if rng.random() < 0.5 else range(0)  # P silent: forgotten
    tidy = rng.random() < 0.5  # every placeholder at the current epoch: the bounds stay tight
    for i in range(n):
        r = rng.random()
        if r < (0.4 if i in quiet else 0.15):
            epoch += 1
        if r < 0.004:
            entries.append(Seal(0))
            continue
        if r < 0.05:
            entries.append(Advance(epoch, 1))  # never held: the fold rejects it
            continue
        if r < 0.08:
            entries.append(Reconcile(len(entries) - 1, -1, (), 1, 1))
            continue
        e = epoch if tidy else max(1, epoch - rng.choice([0, 0, 0, 0, 1, 2]))
        if i not in quiet and rng.random() < 0.35:
            seq = rng.choice([sent, sent, sent, max(0, sent - 2), sent + 2, 0])
            key_epoch = e if rng.random() > 0.03 else e + 1
            entries.append(ph(e, P, seq, key_epoch=key_epoch))
            sent = max(sent, seq + 2)
        else:
            who = rng.choice([None, "a", "b", "c", "d", "e", "f"])
            entries.append(ph(e, who, rng.randrange(0, 50) if who else None, n=1))
    return entries


@pytest.mark.parametrize("seed", range(400))
def test_follow_never_contradicts_the_fold(seed):
    rng = random.Random(seed)
    random.seed(seed)
    entries = random_log(rng, rng.randrange(5, 60))
    states, applied = fold(entries)
    cut = rng.randrange(0, len(entries))
    t = of_state(states[cut], P, held_if_forgotten=rng.randrange(0, 6))
    # what follow decided, entry by entry
    decided, cur = [], t
    for off in range(cut + 1, len(entries)):
        nxt, doubt = follow(cur, P, [(off, entries[off])])
        if doubt is not None:
            assert isinstance(entries[off], Placeholder) and entries[off].producer_id == P
            break
        if isinstance(entries[off], Placeholder) and entries[off].producer_id == P:
            decided.append((off, nxt.held != cur.held or nxt.last_epoch != cur.last_epoch or nxt.known != cur.known))
        cur = nxt
    for off, said_applied in decided:
        assert said_applied == applied[off], (seed, off, entries[off], said_applied, applied[off])
    # and what it says of the fold's memory where it stopped is true
    assert_true_of(states[cur.offset], cur, seed)


def test_follow_decides_the_common_case_a_batch_that_landed_after_the_last_progress():
    entries = [Init(1), ph(1, P, 0), ph(1, "a", 0, n=1), ph(1, P, 2), ph(2, "b", 0, n=1)]
    states, _ = fold(entries)
    t, doubt = follow(of_state(states[1], P), P, list(enumerate(entries))[2:])
    assert doubt is None and (t.held, t.known, t.offset) == (4, "yes", 4)


def test_follow_stops_at_an_entry_it_cannot_decide():
    """P's entry at epoch 1 after others applied epochs 2 and 3: stale for the fold, but
    the trace only bounds the previous applied epoch by [1, 2]."""
    entries = [Init(1), ph(1, P, 0), ph(2, "a", 0, n=1), ph(3, "b", 0, n=1), ph(1, P, 2)]
    states, applied = fold(entries)
    t, doubt = follow(of_state(states[1], P), P, list(enumerate(entries))[2:])
    assert doubt == InDoubt(4, 2, 3) and t.offset == 3 and t.held == 2
    assert applied[4] is False  # the fold did reject it: the trace could not know


def test_a_forgotten_producer_whose_batch_repeats_held_records_is_in_doubt():
    """P forgotten, then one of its re-sends taken as new: those records are in the log
    twice; the trace does not pretend to know where P's sequence stands."""
    t = Trace(held=4, offset=0, known="no", last_epoch=-1, max_ub=1, prev_ub=1, prev_lb=1, producers_ub=0)
    _, doubt = follow(t, P, [(1, ph(1, P, 0))])
    assert doubt == InDoubt(1, 0, 1)


def test_a_trace_round_trips_and_a_damaged_one_is_refused_naming_where():
    t = Trace(3, 10, "maybe", 2, 5, 4, 1, 7, False)
    assert Trace.decode(t.encode(), "k") == t
    with pytest.raises(CorruptData, match="runs/x"):
        Trace.decode([3, 10, "perhaps", 2, 5, 4, 1, 7, False], "runs/x")
    with pytest.raises(CorruptData, match="runs/x"):
        Trace.decode([3, 10], "runs/x")
