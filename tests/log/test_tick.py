"""``tick``: an idle partition's advance in one entry (R5 + R6). The fold judges it as a
claim taken and given up around an advance would be, but stricter; the log's
create-if-absent append is its lock, so a placeholder or a claim that lands first makes
the reconciler write nothing, or the fold refuse it. Against real stores where the
store matters."""

from __future__ import annotations

import threading

import pytest

from ctp_state import codec, entries as en, layout, state as sm
from ctp_state.entries import AccessMode, Advance, Claim, Init, Placeholder, Release, Tick
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import ClaimHeld, CorruptData, InvalidTransition, UnsupportedVersion, WriterFenced
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.reconcile import run_reconcile
from ctp_state.settings import ReconcileSettings
from ctp_state.topics import create_topic
from tests.support import Wrapped, assert_exactly_once, plog


def fold(*entries: en.Entry) -> tuple[sm.PartitionState, list[sm.Outcome]]:
    s, outs = sm.PartitionState("t", 0), []
    for i, e in enumerate(entries):
        out = sm.apply(s, i, e)
        outs.append(out)
        s = out.state
    return s, outs


def ph(epoch: int) -> Placeholder:
    return Placeholder(epoch, layout.l0_key(0, epoch, "u"), 0, 10, 1, 0)


# --- the entry and its fold, pure ---------------------------------------------------------


def test_a_tick_is_a_version_5_entry_and_only_a_tick_is():
    data = en.encode(Tick(3, 1, "reconciler:r"))
    assert codec.unseal(data, "k", "entry")["v"] == 5
    assert en.decode(data, "k") == Tick(3, 1, "reconciler:r")
    body = codec.unseal(data, "k", "entry")
    with pytest.raises(CorruptData, match="tick entries are version 5"):
        en.decode(codec.seal({**body, "v": 2}), "k")
    adv = codec.unseal(en.encode(Advance(3, 1)), "k", "entry")
    with pytest.raises(CorruptData, match="tick entries are version 5"):
        en.decode(codec.seal({**adv, "v": 5}), "k")
    with pytest.raises(UnsupportedVersion):
        en.decode(codec.seal({**body, "v": 7}), "k")


def test_a_tick_moves_an_idle_partition_on_and_fences_every_older_writer():
    s, outs = fold(Init(1), Tick(3, 1, "r"))
    assert outs[1].accepted
    assert (s.min_epoch_lower_bound, s.max_applied_epoch, s.writer_epoch, s.fence_floor, s.holders) == (3, 3, 1, 1, ())
    # a writer that claimed before it (writer epoch 1 was its) and comes back: fenced
    s, outs = fold(
        Init(1), Claim(1, "z", AccessMode.EXCLUSIVE, 10**12, 0), Release("z", 1), Tick(3, 2, "r"), Advance(4, 1)
    )
    assert outs[3].accepted and isinstance(outs[4].rejected, WriterFenced)


@pytest.mark.parametrize(
    "before, tick, why",
    [
        ([Claim(1, "z", AccessMode.EXCLUSIVE, 10**12, 0)], Tick(3, 2, "r"), ClaimHeld),  # live
        ([Claim(1, "z", AccessMode.EXCLUSIVE, 1, 0)], Tick(3, 2, "r"), ClaimHeld),  # lapsed: the claim path's
        ([Claim(1, "z", AccessMode.SHARED, 10**12, 0)], Tick(3, 2, "r"), ClaimHeld),  # a producer's
        ([ph(1)], Tick(3, 1, "r"), InvalidTransition),  # a placeholder awaits reconcile
        ([], Tick(3, 2, "r"), InvalidTransition),  # not the next writer epoch
        ([], Tick(1, 1, "r"), InvalidTransition),  # does not move the lower bound
        ([Tick(3, 1, "r")], Tick(3, 2, "r"), InvalidTransition),  # a second tick to the same epoch
        ([Tick(5, 1, "r")], Tick(4, 2, "r"), InvalidTransition),  # below the applied epoch
    ],
)
def test_the_fold_refuses_a_tick_on_a_partition_that_is_not_idle_and_free(before, tick, why):
    s0, outs = fold(Init(1), *before)
    assert all(o.accepted for o in outs)
    s, outs = fold(Init(1), *before, tick)
    assert isinstance(outs[-1].rejected, why), outs[-1].rejected
    assert sm.evolve(s, applied_offset=s0.applied_offset) == s0  # it changed nothing


# --- the reconciler writes it -------------------------------------------------------------


class LandsFirst(Wrapped):
    """Lets ``land`` append to the log just before the run's first write to it."""

    def __init__(self, inner, prefix: str, land):
        super().__init__(inner)
        self.prefix, self.land, self.done = prefix, land, False

    def put_if_absent(self, key, data):
        if key.startswith(self.prefix) and not self.done:
            self.done = True
            self.land()
        return self.inner.put_if_absent(key, data)


def due(store, topic="t", partitions=1):
    create_topic(store, topic, partitions)
    for _ in range(ReconcileSettings().idle_lag):
        ClusterEpoch(store).advance()


def test_a_placeholder_that_lands_before_the_tick_leaves_the_log_with_no_tick(store):
    """The producer wins the race to the next offset: the run rebuilds the entry from
    the fresh state, finds the partition no longer idle, and writes nothing; the next
    run reconciles the record."""
    due(store)
    log = plog(store, "t", 0)
    sent: dict[int, list[Record]] = {0: [Record(b"v", None, 1)]}

    def produce():
        with Producer(store, epoch_ttl_s=0) as prod:
            assert prod.write([(("t", 0), sent[0])])[0].accepted

    s = run_reconcile(LandsFirst(store, log.prefix, produce))
    assert s.partitions_advanced == 0, s
    assert [e.kind for _, e in log.entries()] == ["init", "placeholder"]
    assert run_reconcile(store).partitions_reconciled == 1
    assert_exactly_once(store, "t", sent)


def test_a_claim_that_lands_before_the_tick_keeps_the_tick_out(store):
    due(store)
    log = plog(store, "t", 0)
    holder = {}

    def claim():
        holder["we"] = log.claim(log.read_state(), "other", AccessMode.EXCLUSIVE, lease_ms=60_000).outcome.state

    s = run_reconcile(LandsFirst(store, log.prefix, claim))
    assert s.partitions_advanced == 0, s
    assert [e.kind for _, e in log.entries()] == ["init", "claim"]
    st = log.read_state()
    assert st.holders and st.min_epoch_lower_bound == 1  # the holder's, untouched


def test_reconcilers_racing_on_idle_partitions_tick_each_once_per_epoch(store):
    """Four runs at once over 6 due partitions: each partition gains one tick, the
    others write nothing or lose the race to the offset and then write nothing."""
    due(store, partitions=6)
    c = ClusterEpoch(store).current()
    go = threading.Barrier(4)
    results = []

    def run():
        go.wait()
        results.append(run_reconcile(store, config=ReconcileSettings(threads=3)))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.partitions_advanced for r in results) == 6, results
    assert not any(r.partitions_failed for r in results)
    for p in range(6):
        log = plog(store, "t", p)
        assert [e.kind for _, e in log.entries()] == ["init", "tick"], p
        st = log.read_state()
        assert (st.min_epoch_lower_bound, st.writer_epoch, st.holders) == (c, 1, ())


# --- probing reads (no LIST) and a store that lost an entry -------------------------------


def lose_entry(store, topic: str, p: int, offset: int) -> None:
    """The store lost one entry in the middle of a log (an operator's delete, a damaged
    bucket): a hole no create-if-absent append makes."""
    store.delete_many([plog(store, topic, p).key(offset)])


def test_a_probing_reader_stops_at_a_lost_entry_and_never_writes_into_it(store, gate):
    """A log 0-4 loses entry 2. The reconciler's probing read sees the state through
    entry 1: older, true. Due to tick or claim there, it refuses to write into the hole
    (its listing before the write finds entry 3): nothing is written, the partition is
    reported, and the listing readers (the GC's) name the gap."""
    from ctp_state.errors import LogGap, StateUnreadable
    from ctp_state.gc import run_gc
    from ctp_state.settings import GcSettings
    from tests.support import produce_rounds

    produce_rounds(store, "t", partitions=1, rounds=4, per=2, advance=False)  # init + 4 placeholders
    for _ in range(3):
        ClusterEpoch(store).advance()
    log = plog(store, "t", 0, write_snapshots=False)
    lose_entry(store, "t", 0, 2)
    keys = sorted(o.key for o in store.list(log.prefix))
    probed = plog(store, "t", 0, write_snapshots=False, probe=True).read_state()
    assert probed.applied_offset == 1 and len(probed.pending) == 1
    s = run_reconcile(store)
    assert s.partitions_failed == 1 and "not dense" in s.partitions[0].reason, s
    assert sorted(o.key for o in store.list(log.prefix)) == keys  # nothing written into the hole
    with pytest.raises(LogGap):
        log.read_state()
    with pytest.raises(StateUnreadable):  # the GC reads by listing: it names the gap
        run_gc(store, gate=gate, config=GcSettings(dry_run=True))


def test_a_probing_appender_that_lost_the_race_to_two_offsets_catches_up(store):
    """Between a probing reader's read and its append, another writer appended twice:
    the listing before the write starts at the key itself: a lost race, not a hole; the
    append lands after both."""
    create_topic(store, "t", 1)
    mine = plog(store, "t", 0, probe=True)
    st = mine.read_state()
    other = plog(store, "t", 0)
    o = other.read_state()
    o = other.claim(o, "a", AccessMode.EXCLUSIVE, lease_ms=60_000).outcome.state
    other.release(o, "a", o.writer_epoch)
    out = mine.append(st, lambda fresh: Claim(fresh.writer_epoch + 1, "b", AccessMode.EXCLUSIVE, 10**13, 0))
    assert out.offset == 3 and out.outcome.accepted
    assert [e.kind for _, e in plog(store, "t", 0).entries()] == ["init", "claim", "release", "claim"]


def test_a_claim_holders_forked_entry_has_no_effect_and_other_kinds_are_judged_as_ever():
    """``forked``: the entry names (prev) another entry than the one the log holds before
    it. A reconcile or advance is then rejected (EntryForked) and changes nothing; a
    placeholder (acknowledged data) stops the fold (LogForked, tests/log/test_hole_attacks.py),
    whether the fold would take it or not; a claim, a tick and a release are judged as
    ever."""
    from ctp_state.entries import Reconcile
    from ctp_state.errors import EntryForked, LogForked

    s, _ = fold(Init(1), Claim(1, "r", AccessMode.EXCLUSIVE, 10**12, 0), ph(1))
    claimed, _ = fold(Init(1), Claim(1, "r", AccessMode.EXCLUSIVE, 10**12, 0))
    l1 = layout.l1_key("t", 0, 0, 0)
    for st, entry in ((s, Reconcile(2, 0, (l1,), 1, 1)), (claimed, Advance(3, 1))):
        at = st.applied_offset + 1
        out = sm.apply(st, at, entry, forked=True)
        assert isinstance(out.rejected, EntryForked) and "has no effect" in str(out.rejected)
        assert out.state == sm.evolve(st, applied_offset=at)
        assert sm.apply(st, at, entry).rejected is None  # the same entry, not forked: applied
    assert sm.apply(s, 3, ph(1)).accepted
    with pytest.raises(LogForked, match="placeholder at log offset 3"):
        sm.apply(s, 3, ph(1), forked=True)
    moved, _ = fold(Init(1), ph(3), ph(5))  # the window moved past epoch 1
    assert sm.apply(moved, 3, ph(1)).rejected is not None  # refused, where the log is one
    with pytest.raises(LogForked, match="placeholder at log offset 3"):
        sm.apply(moved, 3, ph(1), forked=True)
    assert sm.apply(s, 3, Release("r", 1), forked=True).accepted
    free, _ = fold(Init(1))
    assert sm.apply(free, 1, Tick(3, 1, "t"), forked=True).accepted
    assert sm.apply(free, 1, Claim(1, "z", AccessMode.EXCLUSIVE, 10**12, 0), forked=True).accepted
