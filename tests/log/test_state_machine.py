"""The pure state machine: R1 window, R2 apply-time check, R3 lower bound, R5 claims,
R6 advance, snapshots and recovery."""

from __future__ import annotations

import pytest

from ctp_state import layout, producer_memory, snapshot, state as sm, window
from ctp_state.entries import AccessMode, Advance, Claim, Init, Placeholder, Reconcile, Release
from ctp_state.errors import (
    ClaimHeld,
    CtpError,
    EntryOutOfOrder,
    InvalidTransition,
    StaleClusterEpoch,
    UnknownWriterEpoch,
    WriterFenced,
)

T, P = "t", 0


def ph(epoch: int, n: int = 1, writer_epoch: int | None = None) -> Placeholder:
    return Placeholder(epoch, f"l0/000/{epoch:018d}/x.l0", 8, 10, n, 0, writer_epoch)


class Log:
    """A tiny in-memory log driver: appends entries and keeps the verdicts."""

    def __init__(self, init_epoch: int | None = 5):
        self.state = sm.PartitionState(T, P)
        self.entries: list = []
        if init_epoch is not None:
            self.add(Init(init_epoch))

    def add(self, entry) -> sm.Outcome:
        out = sm.apply(self.state, len(self.entries), entry)
        self.entries.append(entry)
        self.state = out.state
        return out

    def claim(self, owner="rec", mode=AccessMode.EXCLUSIVE, now=0, lease=1000) -> sm.Outcome:
        return self.add(Claim(self.state.writer_epoch + 1, owner, mode, now + lease, now))


# --- R1: the window, through the pure functions ---------------------------------------


def fence(s: sm.PartitionState, epoch: int) -> sm.PartitionState:
    verdict = window.classify(s, epoch)
    if verdict == window.STALE:
        raise StaleClusterEpoch(s.topic, s.partition, epoch, s.window)
    return window.slide(s, epoch) if verdict == window.NEWER else s


def test_window_slides_empty_then_n_then_pairs():
    s = sm.PartitionState(T, P)
    assert s.window is None
    s = fence(s, 7)
    assert s.window == (7, 7)
    s = fence(s, 8)
    assert s.window == (7, 8)
    s = fence(s, 9)
    assert s.window == (8, 9)


def test_non_contiguous_epochs_slide_and_accept_the_gap():
    s = fence(fence(sm.PartitionState(T, P), 5), 6)
    assert s.window == (5, 6)
    s = fence(s, 10)
    assert s.window == (6, 10)
    for e in (7, 8, 9):
        assert window.classify(s, e) == window.IN_WINDOW
    assert window.classify(s, 5) == window.STALE


def test_arrivals_out_of_order_reject_the_older():
    s = fence(sm.PartitionState(T, P), 11)  # N+1
    with pytest.raises(StaleClusterEpoch) as e:
        fence(s, 10)  # N
    assert e.value.window == (11, 11) and e.value.epoch == 10
    s = fence(s, 12)  # N+2
    assert s.window == (11, 12)


def test_rapid_transitions_keep_only_the_last_two():
    s = sm.PartitionState(T, P)
    for e in (10, 11, 12, 13):
        s = fence(s, e)
    assert s.window == (12, 13)
    for e in (12, 13):
        assert window.classify(s, e) == window.IN_WINDOW
    for e in (11, 10):
        assert window.classify(s, e) == window.STALE


# --- R2: apply-time check ----------------------------------------------------------------


def test_apply_rejects_below_previous_applied_deterministically():
    log = Log(init_epoch=5)
    assert log.add(ph(6)).accepted
    assert log.add(ph(7)).accepted  # previous_applied = 6, max = 7
    out = log.add(ph(5))
    assert isinstance(out.rejected, StaleClusterEpoch)
    assert out.rejected.window == (6, 7)
    assert out.state.next_offset == 2  # the rejected chunk got no offsets
    assert log.add(ph(6)).accepted  # in [previous, max]: still fine
    # Every reader folding the same entries reaches the same verdicts.
    replayed = sm.PartitionState(T, P)
    verdicts = []
    for i, e in enumerate(log.entries):
        out = sm.apply(replayed, i, e)
        replayed = out.state
        verdicts.append(out.accepted)
    assert verdicts == [True, True, True, False, True]
    assert replayed == log.state


def test_placeholder_offsets_are_dense_and_base_offsets_returned():
    log = Log()
    assert log.add(ph(5, n=3)).base_offset == 0
    assert log.add(ph(5, n=2)).base_offset == 3
    assert log.state.next_offset == 5
    assert [p.base_offset for p in log.state.pending] == [0, 3]


def test_uninitialized_partition_refuses_placeholders():
    log = Log(init_epoch=None)
    out = log.add(ph(5))
    assert isinstance(out.rejected, InvalidTransition)
    assert "not initialized" in str(out.rejected)


@pytest.mark.parametrize("offset", [0, 2, -1])
def test_an_entry_at_the_wrong_offset_is_a_ctp_error_naming_the_partition(offset):
    """The fold's one precondition (entries in offset order) fails as a CtpError the
    readers and the GC already handle, not a bare ValueError."""
    log = Log()
    with pytest.raises(EntryOutOfOrder) as e:
        sm.apply(log.state, offset, ph(5))
    assert isinstance(e.value, CtpError)
    assert str(e.value) == f"t/0: entry at offset {offset} applied after offset 0 (expected 1)"


def test_second_init_is_refused():
    log = Log()
    assert isinstance(log.add(Init(9)).rejected, InvalidTransition)
    assert log.state.max_applied_epoch == 5


# --- R3: lower bound -----------------------------------------------------------------


def reconcile_all(log: Log, lb: int | None = None) -> sm.Outcome:
    s = log.state
    through = s.applied_offset
    last = s.pending[-1].last_offset if s.pending else s.last_reconciled_offset
    bound = sm.allowed_lower_bound(s, through) if lb is None else lb
    keys = (layout.l1_key(T, P, s.last_reconciled_offset + 1, last),) if last > s.last_reconciled_offset else ()
    return log.add(Reconcile(through, last, keys, bound, s.fence_floor))


def test_lower_bound_follows_previous_applied_and_never_passes_it():
    log = Log(init_epoch=5)
    log.claim()
    log.add(ph(6))
    log.add(ph(7))  # previous 6, max 7
    assert sm.allowed_lower_bound(log.state, log.state.applied_offset) == 6
    too_far = reconcile_all(log, lb=7)
    assert isinstance(too_far.rejected, InvalidTransition)
    assert log.state.min_epoch_lower_bound == 5
    assert reconcile_all(log).accepted
    assert log.state.min_epoch_lower_bound == 6 and log.state.m == 5
    assert log.state.pending == ()


def test_lower_bound_never_decreases():
    log = Log(init_epoch=5)
    log.claim()
    log.add(ph(6))
    log.add(ph(7))
    reconcile_all(log)
    assert log.state.min_epoch_lower_bound == 6
    out = reconcile_all(log, lb=5)
    assert isinstance(out.rejected, InvalidTransition)
    assert log.state.min_epoch_lower_bound == 6


def test_reconcile_before_window_moved_keeps_the_bound():
    log = Log(init_epoch=5)
    log.claim()
    log.add(ph(6))  # offset 2: window [5,6]
    through = log.state.applied_offset
    log.add(ph(8))  # offset 3: window [6,8], moved after `through`
    assert sm.allowed_lower_bound(log.state, through) == 5


def test_reconcile_must_name_the_exact_record_range():
    log = Log()
    log.claim()
    log.add(ph(5, n=4))
    s = log.state
    out = log.add(Reconcile(s.applied_offset, 2, ("l1/x",), 5, s.fence_floor))
    assert isinstance(out.rejected, InvalidTransition)


# --- R5: claims and writer epochs ---------------------------------------------------------


def test_claims_bump_writer_epoch_and_fence_older_writers():
    log = Log()
    assert log.claim("a").accepted and log.state.writer_epoch == 1
    assert isinstance(log.claim("b", now=10).rejected, ClaimHeld)  # exclusive, held by a
    assert log.claim("b", now=5000).accepted  # a's lease ran out
    assert log.state.writer_epoch == 2 and log.state.fence_floor == 2
    # a, still thinking it holds writer epoch 1, is fenced; stays fenced.
    log.add(ph(5))
    s = log.state
    out = log.add(Reconcile(s.applied_offset, 0, ("l1/x",), 5, 1))
    assert isinstance(out.rejected, WriterFenced) and out.rejected.current == 2
    assert isinstance(log.add(ph(5, writer_epoch=1)).rejected, WriterFenced)
    # a writer epoch ahead of the log is "refresh", not "fenced"
    assert isinstance(log.add(ph(5, writer_epoch=9)).rejected, UnknownWriterEpoch)
    assert log.add(ph(5, writer_epoch=2)).accepted


def test_shared_claims_coexist_and_exclusive_waits_for_them():
    log = Log()
    assert log.claim("p1", AccessMode.SHARED).accepted
    assert log.claim("p2", AccessMode.SHARED).accepted
    assert log.state.fence_floor == 0  # shared claims fence nobody
    assert log.add(ph(5, writer_epoch=1)).accepted
    assert isinstance(log.claim("rec", AccessMode.EXCLUSIVE, now=10).rejected, ClaimHeld)
    log.add(Release("p1", 1))
    log.add(Release("p2", 2))
    assert log.claim("rec", AccessMode.EXCLUSIVE, now=10).accepted
    assert isinstance(log.claim("p3", AccessMode.SHARED, now=20).rejected, ClaimHeld)
    assert isinstance(log.add(ph(5, writer_epoch=1)).rejected, WriterFenced)


def test_release_of_a_claim_not_held_is_invalid():
    log = Log()
    assert isinstance(log.add(Release("ghost", 1)).rejected, InvalidTransition)


def test_a_reconcile_or_advance_may_release_its_claim_in_the_same_entry():
    """``release_owner``: the entry takes effect and the claim is gone, as with a
    Release right after it. Naming an owner that does not hold the claim rejects the
    whole entry (the reconcile does not take effect either), and the claim stays."""
    log = Log()
    log.claim("rec")
    log.add(ph(6, n=2))
    s = log.state
    key = layout.l1_key(T, P, 0, 1)
    wrong = log.add(Reconcile(s.applied_offset, 1, (key,), 5, 1, (), "someone-else"))
    assert isinstance(wrong.rejected, InvalidTransition) and "which it does not hold" in str(wrong.rejected)
    assert log.state.pending and [h.owner for h in log.state.holders] == ["rec"]
    out = log.add(Reconcile(s.applied_offset, 1, (key,), 5, 1, (), "rec"))
    assert out.accepted and not log.state.pending and log.state.holders == ()
    assert log.state.l1_ends == (1,)
    # the claim is gone: a second reconcile or advance under it is refused
    assert isinstance(log.add(Advance(9, 1)).rejected, InvalidTransition)
    log.claim("rec", now=10)
    adv = log.add(Advance(9, 2, "rec"))
    assert adv.accepted and log.state.holders == () and log.state.min_epoch_lower_bound == 9
    # both forms replay to the same state as the entries with a separate release
    two = Log()
    two.claim("rec")
    two.add(ph(6, n=2))
    two.add(Reconcile(s.applied_offset, 1, (key,), 5, 1))
    two.add(Release("rec", 1))
    assert two.state.holders == () and two.state.l1_ends == (1,) and two.state.pending == ()


def test_reconcile_needs_the_exclusive_claim():
    log = Log()
    log.claim("p", AccessMode.SHARED)
    log.add(ph(5))
    s = log.state
    out = log.add(Reconcile(s.applied_offset, 0, ("l1/x",), 5, 1))
    assert isinstance(out.rejected, InvalidTransition) and "exclusive" in str(out.rejected)


def test_end_offset_of_writer_epoch():
    log = Log()
    log.claim("a")  # offset 1, writer epoch 1
    log.add(ph(5))  # 2
    log.claim("a", now=1)  # offset 3, writer epoch 2 (renewal by the same owner)
    log.add(ph(5))  # 4
    s = log.state
    assert sm.end_offset_of_writer_epoch(s, 0) == 1
    assert sm.end_offset_of_writer_epoch(s, 1) == 3
    assert sm.end_offset_of_writer_epoch(s, 2) == 5  # current: the log end
    with pytest.raises(UnknownWriterEpoch):
        sm.end_offset_of_writer_epoch(s, 3)


# --- R6: idle partitions advance ------------------------------------------------------------


def test_advance_moves_an_idle_caught_up_partition_to_the_cluster_epoch():
    log = Log(init_epoch=5)
    log.claim()
    log.add(ph(6))
    assert isinstance(log.add(Advance(20, 1)).rejected, InvalidTransition)  # not caught up
    reconcile_all(log)
    assert log.add(Advance(20, 1)).accepted
    s = log.state
    assert (s.previous_applied_epoch, s.max_applied_epoch, s.min_epoch_lower_bound, s.m) == (20, 20, 20, 19)
    assert s.window == (20, 20)
    assert isinstance(log.add(ph(19)).rejected, StaleClusterEpoch)
    assert log.add(ph(20)).accepted


def test_advance_never_moves_backwards():
    log = Log(init_epoch=5)
    log.claim()
    log.add(ph(9))
    reconcile_all(log)
    assert isinstance(log.add(Advance(8, 1)).rejected, InvalidTransition)


# --- snapshots and recovery -----------------------------------------------------------------


def test_snapshot_roundtrip_drops_the_window_and_recovery_collapses_it():
    log = Log(init_epoch=5)
    log.claim()
    log.add(ph(6, n=3))
    log.add(ph(8, n=2))
    s = window.slide(log.state, 11)  # an in-process fence moved the window ahead
    assert s.window == (8, 11)
    data = snapshot.encode_snapshot(s)
    assert b"max_seen" not in data and b"oldest_accepted" not in data
    restored = snapshot.decode_snapshot(data, "k")
    assert restored == s  # every persisted field survives
    assert restored.window == (8, 8)  # [max_applied]


def test_replay_after_snapshot_equals_full_replay():
    log = Log(init_epoch=5)
    log.claim()
    for e in (5, 6, 6, 7, 4, 9):
        log.add(ph(e))
    mid = 4
    head = sm.replay(sm.PartitionState(T, P), 0, log.entries[: mid + 1])
    snap = snapshot.decode_snapshot(snapshot.encode_snapshot(head), "k")
    tail = sm.replay(snap, mid + 1, log.entries[mid + 1 :])
    assert tail == log.state


def test_a_claim_may_name_holders_it_found_lapsed_by_the_store_clock():
    log = Log()
    assert log.add(Claim(1, "fast", AccessMode.EXCLUSIVE, 10**12, 10**12 - 1000)).accepted  # a clock far ahead
    assert log.state.holders[0].lease_ms == 1000
    blocked = log.add(Claim(2, "next", AccessMode.EXCLUSIVE, 6000, 5000))
    assert isinstance(blocked.rejected, ClaimHeld)  # by its own clock the holder is live
    took = log.add(Claim(2, "next", AccessMode.EXCLUSIVE, 6000, 5000, (("fast", 1),)))
    assert took.accepted and [h.owner for h in log.state.holders] == ["next"]
    assert log.state.fence_floor == 2  # the lapsed holder is fenced from here on
    assert isinstance(log.add(ph(5, writer_epoch=1)).rejected, WriterFenced)


def test_producers_are_remembered_for_the_retention_and_forgotten_oldest_first_after():
    def batch(epoch: int, pid: str) -> Placeholder:
        return Placeholder(epoch, f"l0/000/{epoch:018d}/{pid}.l0", 8, 10, 1, 0, None, pid, 0, 7)

    log = Log(init_epoch=1)
    n = producer_memory.MAX_PRODUCERS + 50
    for i in range(n):  # all within the retention: none is forgotten, past the soft limit
        assert log.add(batch(1, f"p{i}")).accepted
    assert len(log.state.producers) == n
    later = 1 + producer_memory.PRODUCER_RETENTION_EPOCHS + 1
    assert log.add(batch(later, "new")).accepted  # the old ones are now past the retention
    ids = [p.producer_id for p in log.state.producers]
    assert len(ids) == producer_memory.MAX_PRODUCERS and ids[-1] == "new" and "p0" not in ids and f"p{n - 1}" in ids
    # A forgotten producer starts wherever it is (Kafka's reset): its batch is new.
    assert log.add(Placeholder(later, f"l0/000/{later:018d}/p0b.l0", 8, 10, 1, 0, None, "p0", 1, 9)).accepted
    # A remembered one re-sending is a duplicate.
    dup = log.add(batch(later, f"p{n - 1}"))
    assert dup.accepted and dup.duplicate


def test_evolve_copies_every_field_as_dataclasses_replace_does():
    """The fold's fast copy: every slot, volatile window included, set from the changes
    or the original; an unknown field is an error, as for ``replace``."""
    import dataclasses

    s = sm.PartitionState(
        "t", 3, applied_offset=7, max_applied_epoch=4, previous_applied_epoch=3, max_seen_epoch=5,
        oldest_accepted_epoch=3, pending=(sm.Pending(6, 4, "l0/000/x", 8, 10, 1, 0, 0),), l1_ends=(4,),
    )  # fmt: skip
    for name in sm.PartitionState.__slots__:
        changed = sm.evolve(s, **{name: None})
        assert getattr(changed, name) is None
        for other in sm.PartitionState.__slots__:
            if other != name:
                assert getattr(changed, other) is getattr(s, other), (name, other)
    assert sm.evolve(s) == s and sm.evolve(s) is not s
    assert sm.evolve(s, applied_offset=8) == dataclasses.replace(s, applied_offset=8)
    with pytest.raises(TypeError, match="nope"):
        sm.evolve(s, nope=1)
