"""A store that lost log entries in the middle (an operator's delete, a damaged bucket,
a partial restore): holes no create-if-absent append makes. The reconciler reads by
probing (GETs of the next key, no LIST) and so cannot see a hole when it reads; it
must never write into one, and the GC, which deletes by what the states commit, must
refuse the store rather than act on a state read short of a lost entry. Both scenarios
came from a review of the probing reads, where they lost data; kept as tests.

A hole can also form *under* a writer: the store loses an entry in the middle after the
writer read the log (or right after its own create, where it does not list), keeps the
ones after it, and the writer's create lands in the lost entry's slot. The placeholder
kept behind it names (``prev``) the lost entry, not the one now before it: every reader
stops there (``LogForked``), where the fold used to reject it (its producer sequence
follows the lost one) and the GC deleted its L0 object. Found by a later review."""

from __future__ import annotations

import pytest

from ctp_state import entries as en
from ctp_state.compact import run_compaction
from ctp_state.entries import Advance, Placeholder, Reconcile
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import LogForked, StateUnreadable
from ctp_state.gc import run_gc
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.read import read_partition
from ctp_state.settings import CompactSettings, GcSettings
from ctp_state.topics import create_topic
from ctp_state.verify import verify_partition
from tests.support import Wrapped, plog, produce_rounds, reconcile

# each scenario on both of the reconciler's read paths (docs/design.md 14: quiet partitions)
pytestmark = pytest.mark.usefixtures("both_read_paths")


def test_two_lost_entries_a_tick_in_the_hole_is_reported_and_the_gc_keeps_the_pending_l0_object(store, gate):
    """Placeholders at 4, 5, 6; the store loses 4 and 5. The reconciler's probing read
    stops at 4 and finds the partition idle and due: its tick lands at 4 (a tick lists
    after its create, not before), and that listing finds 6 past the gap at 5: the
    partition is reported, not advanced. The GC's listing read names the gap and the
    run stops: the L0 object the pending placeholder at 6 needs stays. (Restoring the
    lost entries means deleting the tick first: it holds no data.)"""
    produce_rounds(store, "t", partitions=1, rounds=1, per=2)  # init, placeholder 1
    assert reconcile(store).partitions_reconciled == 1  # claim 2, reconcile 3
    produce_rounds(store, "t", partitions=1, rounds=3, per=2, advance=False)  # placeholders 4, 5, 6
    log = plog(store, "t", 0, write_snapshots=False)
    (last, victim), *_ = list(log.entries(5))
    assert isinstance(victim, Placeholder) and last == 6
    for _ in range(4):
        ClusterEpoch(store).advance()
    store.delete_many([log.key(4), log.key(5)])
    s = reconcile(store)
    assert s.partitions_advanced == 0 and s.partitions_failed == 1 and "not dense" in s.partitions[0].reason, s
    assert en.decode(store.get(log.key(4)), log.key(4)).kind == "tick"  # (a listing read stops at 5)
    with pytest.raises(StateUnreadable):
        run_gc(store, gate=gate, config=GcSettings())
    assert store.head(victim.l0_key) is not None


def test_a_lost_compactor_claim_never_lets_the_gc_take_the_compacted_file_for_an_orphan(store, gate):
    """The store loses the compactor's claim (the entry before its compact). A state
    read short of it would not commit the compacted file, which a full sweep would then
    delete as an orphan, and once the entry came back from a backup the log would commit
    a file that is gone. The GC reads by listing: it names the gap and deletes nothing."""
    small = CompactSettings(max_small_files=1, target_file_bytes=1 << 20)
    sent = []
    for _ in range(3):
        sent += produce_rounds(store, "t", partitions=1, rounds=1, per=2)[0]
        assert reconcile(store).partitions_reconciled == 1
    run_compaction(store, config=small)
    log = plog(store, "t", 0, write_snapshots=False)
    kinds = [(o, e.kind) for o, e in log.entries()]
    assert [k for _, k in kinds[-2:]] == ["claim", "compact"], kinds
    (compacted,) = [f.key for f in log.read_state().committed_l1_files()]
    h = kinds[-2][0]
    saved = store.get(log.key(h))
    store.delete_many([log.key(h)])
    with pytest.raises(StateUnreadable):
        run_gc(store, gate=gate, config=GcSettings(l1_grace_s=0, l1_reader_grace_s=0, l1_full_sweep_s=0))
    store.put(log.key(h), saved)  # restored
    assert store.head(compacted) is not None
    assert [r["value"] for r in read_partition(store, "t", 0).to_pylist()] == [x.value for x in sent]


class StallBefore(Wrapped):
    """Runs ``hook`` once, just before the create of ``key`` is sent: a writer stalled
    between its read (and any listing) and its create."""

    def __init__(self, inner, key, hook):
        super().__init__(inner)
        self.key, self.hook, self.fired = key, hook, False

    def put_if_absent(self, k, d):
        if k == self.key and not self.fired:
            self.fired = True
            self.hook()
        return self.inner.put_if_absent(k, d)


def _p1_p2_then_the_store_loses_p1(store, prod, log, at: int, seen: dict):
    """A producer appends P1 at ``at`` and P2 after it (both acknowledged); the store
    loses P1 and keeps P2."""

    def hook():
        for value in (b"P1", b"P2"):
            assert prod.write([(("t", 0), [Record(value, b"k", 1000)])])[0].accepted
        (o1, p1), (o2, p2) = list(log.entries(at - 1))
        assert (o1, o2) == (at, at + 1) and isinstance(p1, Placeholder) and isinstance(p2, Placeholder)
        seen["p1"], seen["p2"] = p1, p2
        store.delete_many([log.key(at)])

    return hook


def _every_reader_stops_and_nothing_is_deleted(store, gate, log, forked_at: int, p2: Placeholder) -> None:
    with pytest.raises(LogForked, match=f"placeholder at log offset {forked_at}"):
        read_partition(store, "t", 0)
    check = verify_partition(store, "t", 0)
    assert any("was written after another entry" in f.what for f in check.findings), check.findings
    for _ in range(3):  # epochs, reconciles and GCs go on: the partition is refused, nothing goes
        ClusterEpoch(store).advance()
        s = reconcile(store)
        assert s.partitions_failed == 1 and "was written after another entry" in s.partitions[0].reason, s
        with pytest.raises(StateUnreadable, match="was written after another entry"):
            run_gc(store, gate=gate, config=GcSettings(full_read_every=1))
        assert store.head(p2.l0_key) is not None  # P2's records are still in L0


def _a_reconcile_writes_into_the_hole(store, gate, prod, at: int, kind: type) -> None:
    """The reconcile's create at ``at`` stalls; meanwhile ``prod`` appends P1 there and
    P2 after it, and the store loses P1: the create lands in P1's slot."""
    log = plog(store, "t", 0, write_snapshots=False)
    seen: dict = {}
    stalled = StallBefore(store, log.key(at), _p1_p2_then_the_store_loses_p1(store, prod, log, at, seen))
    assert reconcile(stalled).partitions_reconciled == 1 and stalled.fired
    assert isinstance(dict(log.entries())[at], kind)
    _every_reader_stops_and_nothing_is_deleted(store, gate, log, at + 1, seen["p2"])


def test_a_commit_created_right_after_its_claim_into_a_hole_under_it_stops_every_reader(store, gate):
    """Claim at 2 (the reconcile's own create, so its commit at 3 does not list first);
    while it builds, a producer appends P1 at 3 and P2 at 4, and the store loses P1.
    The commit lands at 3, in P1's slot."""
    create_topic(store, "t", 1)
    ClusterEpoch(store).advance()
    prod = Producer(store, epoch_ttl_s=0)
    assert prod.write([(("t", 0), [Record(b"A", b"k", 1000)])])[0].accepted  # 1
    _a_reconcile_writes_into_the_hole(store, gate, prod, 3, Reconcile)


def test_an_advance_created_right_after_its_commit_into_a_hole_under_it_stops_every_reader(store, gate):
    """A commit that leaves the partition due an advance (R6) creates it right after its
    own create; a producer with a cached epoch appends P1 there and P2 after it first,
    and the store loses P1. The advance lands in P1's slot and moves the window to C:
    P2, of an older epoch and after a lost sequence number, used to be refused."""
    create_topic(store, "t", 1)
    ce = ClusterEpoch(store)
    ce.advance()
    prod = Producer(store, epoch_ttl_s=3600)  # keeps C = 2
    assert prod.write([(("t", 0), [Record(b"A", b"k", 1000)])])[0].accepted  # 1
    ce.advance()
    ce.advance()
    _a_reconcile_writes_into_the_hole(store, gate, prod, 4, Advance)


def test_a_producer_appending_from_its_cached_state_into_a_hole_stops_every_reader(store, gate):
    """The case docs/failure-model.md left open: producer X appends X0 at 1; producer Y's
    cached state ends at its own entry at 2; X appends P1 at 3 and P2 at 4; the store
    loses P1; Y, within its recheck time, creates its placeholder at 3. P2 names the
    lost P1, and its producer sequence follows P1's: refused, where it was acknowledged."""
    create_topic(store, "t", 1)
    ClusterEpoch(store).advance()
    x, y = Producer(store), Producer(store)
    assert x.write([(("t", 0), [Record(b"X0", b"k", 1000)])])[0].accepted  # 1
    assert y.write([(("t", 0), [Record(b"Y1", b"k", 1000)])])[0].accepted  # 2
    log = plog(store, "t", 0, write_snapshots=False)
    seen: dict = {}
    _p1_p2_then_the_store_loses_p1(store, x, log, 3, seen)()
    assert y.write([(("t", 0), [Record(b"Y2", b"k", 1001)])])[0].accepted  # 3: into the hole
    assert isinstance(dict(log.entries())[3], Placeholder)
    _every_reader_stops_and_nothing_is_deleted(store, gate, log, 4, seen["p2"])


def test_a_placeholder_the_fold_would_take_behind_a_filled_hole_stops_too_and_the_lost_one_is_kept(store, gate):
    """The same, but P2 is X's first placeholder in this log, so the fold would take it.
    The store still lost P1, whose data is in L0: taking P2 and going on would let the
    GC delete P1's object, where a hole left alone stops every listing read until an
    operator restores P1's entry (a sixth review: a tick, listing after its create,
    filled such a hole and nothing stopped). The log stops all the same."""
    create_topic(store, "t", 1)
    ClusterEpoch(store).advance()
    y = Producer(store)
    assert y.write([(("t", 0), [Record(b"Y1", b"k", 1000)])])[0].accepted  # 1
    log = plog(store, "t", 0, write_snapshots=False)
    seen: dict = {}
    _p1_p2_then_the_store_loses_p1(store, Producer(store), log, 2, seen)()
    assert y.write([(("t", 0), [Record(b"Y2", b"k", 1001)])])[0].accepted  # 2: into the hole
    assert store.head(seen["p1"].l0_key) is not None
    _every_reader_stops_and_nothing_is_deleted(store, gate, log, 3, seen["p2"])
    assert store.head(seen["p1"].l0_key) is not None


def test_a_tick_created_into_a_hole_formed_after_the_runs_read_is_reported_and_m_stays_below(store, gate):
    """Found by the fifth review: the tick's listing was taken before its create, and a
    hole that formed between the two took the tick -- which the GC folds from its pack
    without reading the key after it, so M passed the placeholder kept behind the hole
    and the GC deleted its L0 object. A tick now lists after its create: P2, past it,
    names the lost P1 and would be refused (an older epoch than the tick's window, a
    sequence after a lost one): the partition is reported, and the GC keeps its state
    from before the tick (M stays below P2) and reads its log, where it stops."""
    create_topic(store, "t", 1)
    ce = ClusterEpoch(store)
    ce.advance()  # C = 2
    prod = Producer(store, epoch_ttl_s=3600)  # keeps C = 2
    assert prod.write([(("t", 0), [Record(b"A", b"k", 1000)])])[0].accepted  # 1
    assert reconcile(store).partitions_reconciled == 1  # claim 2, commit 3
    assert run_gc(store, gate=gate, config=GcSettings()).status == "ok"  # the pack
    ce.advance()
    ce.advance()  # C = 4: the idle partition is due a tick
    log = plog(store, "t", 0, write_snapshots=False)
    seen: dict = {}
    stalled = StallBefore(store, log.key(4), _p1_p2_then_the_store_loses_p1(store, prod, log, 4, seen))
    s = reconcile(stalled)
    assert stalled.fired and dict(log.entries())[4].kind == "tick"
    assert s.partitions_advanced == 0 and s.partitions_failed == 1, s
    assert "after its tick at log offset 4" in s.partitions[0].reason, s.partitions[0].reason
    assert "placeholder at log offset 5 was written after another entry" in s.partitions[0].reason
    with pytest.raises(StateUnreadable, match="was written after another entry"):
        run_gc(store, gate=gate, config=GcSettings())  # from its pack: the reported partition from its log
    assert store.head(seen["p2"].l0_key) is not None
    _every_reader_stops_and_nothing_is_deleted(store, gate, log, 5, seen["p2"])


def test_a_tick_that_fills_a_hole_already_there_stops_the_log_and_keeps_the_lost_placeholders_data(store, gate):
    """Found by a sixth review: the store lost P in the middle (Q, another producer's,
    of the same epoch, kept after it) before the reconciler read the log. The tick,
    listing after its create, lands in P's slot; Q names P, and the fold would take it:
    had it been taken, the log would read as whole again and M would pass P's epoch --
    the GC deleted P's L0 object, where a listing before the tick stopped every run on
    the hole. Q stops the log instead: reported, the GC stops, P's data stays in L0
    (restore P's entry: delete the tick first)."""
    produce_rounds(store, "t", partitions=1, rounds=1, per=2)
    assert reconcile(store).partitions_reconciled == 1
    assert run_gc(store, gate=gate, config=GcSettings()).status == "ok"  # the pack
    for _ in range(3):
        ClusterEpoch(store).advance()
    log = plog(store, "t", 0, write_snapshots=False)
    k = log.read_state().applied_offset + 1
    with Producer(store, epoch_ttl_s=0) as a, Producer(store, epoch_ttl_s=0) as b:
        assert a.write([(("t", 0), [Record(b"P", b"k", 1000)])])[0].accepted
        assert b.write([(("t", 0), [Record(b"Q", b"k", 1000)])])[0].accepted
    ents = dict(log.entries(k - 1))
    p, q = ents[k], ents[k + 1]
    assert isinstance(p, Placeholder) and isinstance(q, Placeholder) and p.epoch == q.epoch
    store.delete_many([log.key(k)])  # the store loses P
    s = reconcile(store)
    assert en.decode(store.get(log.key(k)), log.key(k)).kind == "tick"  # in P's slot
    assert s.partitions_failed == 1 and f"after its tick at log offset {k}" in s.partitions[0].reason, s
    with pytest.raises(StateUnreadable, match="was written after another entry"):
        run_gc(store, gate=gate, config=GcSettings())
    _every_reader_stops_and_nothing_is_deleted(store, gate, log, k + 1, q)
    assert store.head(p.l0_key) is not None


def test_a_lost_claim_refilled_by_a_producer_from_its_cache_is_named_by_verify(store):
    """A seventh review: producer Y writes A (1), a reconcile claims (2) and commits (3),
    the store loses the claim, and Y, within its recheck window (its cached state ends at
    1), writes P into slot 2. The commit behind it names the lost claim: it is forked
    and has no effect, and no placeholder is behind the hole to stop the fold. Every
    stored state (the snapshot, the GC's pack) ends at the commit, whose bytes are
    unchanged, so readers starting from one never see P -- the case docs/design.md
    section 14 leaves open. ``ctp verify`` replays the log from its start: it names the
    forked commit and the snapshot that disagrees with the replay."""
    create_topic(store, "t", 1)
    ClusterEpoch(store).advance()
    y = Producer(store, epoch_ttl_s=0)
    assert y.write([(("t", 0), [Record(b"A", b"k", 1000)])])[0].accepted  # 1
    assert reconcile(store).partitions_reconciled == 1  # claim 2, commit 3, a snapshot at 3
    log = plog(store, "t", 0, write_snapshots=False)
    store.delete_many([log.key(2)])
    assert y.write([(("t", 0), [Record(b"P", b"k", 1001)])])[0].accepted  # into slot 2
    assert isinstance(en.decode(store.get(log.key(2)), log.key(2)), Placeholder)
    check = verify_partition(store, "t", 0)
    errors = [f.what for f in check.findings if f.severity == "error"]
    assert any("entry at log offset 3 was written after an entry the log no longer holds" in w for w in errors), errors
    assert any("disagrees with a replay of the log at offset 3" in w for w in errors), errors
    assert not check.ok
