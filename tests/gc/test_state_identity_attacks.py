"""Found by review: a reader that starts from a stored state (the GC's state pack, a
snapshot) must know the log still ends where that state ends, by the *bytes* of the
entry it ends at -- and that entry's bytes must say which log they were written after.

Both scenarios need a store that loses acknowledged writes (S3 does not; a file system
that loses its newest writes does), and each loses a record without the fix:

- A re-send. Producer P1's create of offset K is written, its response lost. Before it
  re-sends, the GC packs the state at K, the store loses offsets K-1 and K, and producer
  P2 lands at K-1. P1's re-send of the very same bytes at K then matches the pack byte
  for byte, and every reader from the pack skips P2's placeholder: the reconciler
  commits past it, M passes its epoch and its L0 object is deleted. A writer re-sends an
  entry only while the entry before it is still the one its state ends at.
- A snapshot trusted for the mere existence of its last entry. A snapshot ends at a tick
  at N, the store loses N, and a long-lived producer appending from its cached state
  lands at N: a reader from the snapshot found *an* entry at N (a HEAD) and skipped it.
  A snapshot names the CRC32C of the entry it ends at; a reader GETs that entry and
  compares (a snapshot that names none is not used).
"""

from __future__ import annotations

import pytest

from ctp_state import codec, layout, state as sm
from ctp_state.entries import Placeholder, Tick
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import OutcomeUnknown, StateUnreadable, StoreError
from ctp_state.gc import run_gc
from ctp_state.gc.history import newest_pack
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.settings import GcSettings
from ctp_state.topics import create_topic
from tests.support import Wrapped, assert_exactly_once, plog, reconcile

# each scenario on both of the reconciler's read paths (docs/design.md 14: quiet partitions)
pytestmark = pytest.mark.usefixtures("both_read_paths")


def gc(store, gate, *, full=False):
    """One GC run; ``full``: every log read (by listing), as every ``full_read_every``
    runs -- a run from the pack keeps an older state of a partition nobody reported,
    and these scenarios need a pack that ends at the newest entry."""
    rec = run_gc(store, gate=gate, config=GcSettings(full_read_every=1) if full else GcSettings())
    assert rec.status == "ok", rec.gate.failures if rec.gate else rec.error
    return rec


def epoch(store, gate, *, gc_first=False):
    ClusterEpoch(store).advance()
    if gc_first:
        gc(store, gate)
    s = reconcile(store)
    assert s.ok, [(p.topic, p.partition, p.status, p.reason) for p in s.partitions if p.failed]
    gc(store, gate)


class LoseResponse(Wrapped):
    """The first create of ``key`` lands, ``meanwhile()`` runs (what happens while its
    response is on its way), and the response is lost. The second (the re-send) runs
    ``between()`` first, if given: the writer stalled between its check of the entry
    before it and the send."""

    def __init__(self, inner, key, meanwhile, between=None):
        super().__init__(inner)
        self.key, self.meanwhile, self.between, self.n = key, meanwhile, between, 0

    def put_if_absent(self, k, d):
        if k == self.key:
            self.n += 1
            if self.n == 1:
                self.inner.put_if_absent(k, d)
                self.meanwhile()
                raise StoreError(f"connection reset after the request for {k!r} was sent")
            if self.n == 2 and self.between is not None:
                self.between()
        return self.inner.put_if_absent(k, d)


def a_written_then_next_offset(store, gate):
    """Two epochs reconciled, the cluster epoch advanced and ``a`` written: the log and
    the offset the next entry lands at (K)."""
    create_topic(store, "t", 1)
    for _ in range(2):
        epoch(store, gate)
    log = plog(store, "t", 0)
    ClusterEpoch(store).advance()
    with Producer(store, epoch_ttl_s=0) as p0:
        assert p0.write([(("t", 0), [Record(b"a")])])[0].accepted
    return log, log.read_state().applied_offset + 1


@pytest.mark.parametrize("first", ["reconcile", "gc"])
def test_a_resent_entry_after_the_store_lost_the_one_before_it_hides_nothing(store, gate, first):
    log, k = a_written_then_next_offset(store, gate)
    landed = {}

    def meanwhile():
        gc(store, gate, full=True)  # the GC packs the state at K (P1's entry folded in)
        pack = newest_pack(store)
        st, crc = pack.states[("t", 0)]
        assert (st.applied_offset, crc) == (k, log.last_entry_crc(st)), "the pack does not end at K"
        store.delete_many([log.key(k - 1), log.key(k)])  # the store loses its two newest entries
        with Producer(store, epoch_ttl_s=0) as p2:
            landed["c"] = p2.write([(("t", 0), [Record(b"c")])])[0]

    with Producer(LoseResponse(store, log.key(k), meanwhile), epoch_ttl_s=0) as p1:
        vb = p1.write([(("t", 0), [Record(b"b")])])[0]
    assert landed["c"].accepted, landed["c"].error
    assert isinstance(dict(log.entries())[k - 1], Placeholder)
    resent = log.key(k) in {o.key for o in store.list(log.prefix)}
    for _ in range(4):
        epoch(store, gate, gc_first=first == "gc")
    # (a was lost by the store: its entry is gone; the producer was told it landed)
    assert_exactly_once(store, "t", {0: [Record(b"c")] + ([Record(b"b")] if vb.accepted else [])}, all_in_l1=True)
    # The entry before P1's is no longer the one its state ends at: its re-send is not
    # sent, and its outcome is unknown (it did land once): the producer re-sends the batch.
    assert not vb.accepted and isinstance(vb.error, OutcomeUnknown), vb
    assert "no longer the one this writer's state ends at" in str(vb.error)
    assert not resent


@pytest.mark.parametrize("legacy", [False, True], ids=["snapshot", "snapshot-without-checksum"])
def test_a_placeholder_in_a_snapshots_lost_last_entry_is_seen(store, gate, legacy):
    """(With ``legacy``, the snapshot as a ctp that predates the checksum wrote it: it is
    not vouched for by its entry's mere existence either; the log is read whole.)"""
    create_topic(store, "t", 1)
    epoch(store, gate)
    log = plog(store, "t", 0)
    with Producer(store, epoch_ttl_s=0) as prod:  # long-lived: it appends from its cached state
        ClusterEpoch(store).advance()
        assert prod.write([(("t", 0), [Record(b"a")])])[0].accepted
        for _ in range(8):
            epoch(store, gate)
            if isinstance(list(log.entries())[-1][1], Tick) and not log.read_state().pending:
                break
        else:
            raise AssertionError("the partition never ticked")
        state = log.read_state()
        n = state.applied_offset
        # a reader that folded the log snapshots it at the tick
        log.write_snapshot(sm.evolve(state, last_entry=None) if legacy else state)
        store.delete_many([log.key(n)])  # the store loses the tick
        vb = prod.write([(("t", 0), [Record(b"b")])])[0]
        assert vb.accepted, vb.error
        assert isinstance(dict(log.entries())[n], Placeholder)  # in the lost tick's slot
    for _ in range(4):
        epoch(store, gate)
    assert_exactly_once(store, "t", {0: [Record(b"a"), Record(b"b")]}, all_in_l1=True)


def test_a_snapshot_whose_last_entry_was_replaced_is_set_aside_by_every_reader(store):
    """The log's own readers, without the GC or reconciler around them: a listing read
    and a probing read from a snapshot whose last entry holds other bytes now."""
    create_topic(store, "t", 1)
    ClusterEpoch(store).advance()
    with Producer(store, epoch_ttl_s=0) as prod:
        assert prod.write([(("t", 0), [Record(b"a")])])[0].accepted
        log = plog(store, "t", 0)
        state = log.read_state()
        log.write_snapshot(state)
        n = state.applied_offset
        snap = layout.snapshot("t", 0, log.topic_id)
        late = store.get(snap)
        store.delete_many([log.key(n)])
        with Producer(store, epoch_ttl_s=0) as other:
            assert other.write([(("t", 0), [Record(b"b")])])[0].accepted  # lands at n
        store.put(snap, late)  # a slow snapshot PUT lands last (a plain overwrite)
    for probe in (False, True):
        st = plog(store, "t", 0, probe=probe, write_snapshots=False).read_state()
        assert [p.record_count for p in st.pending] == [1] and st.applied_offset == n
        assert st.pending[0].l0_key != state.pending[0].l0_key  # b's placeholder, not a's


def test_a_resend_stalled_after_its_check_puts_back_no_bytes_a_pack_names(store, gate):
    """Found by the third review: the re-send's check of the entry before it is a check,
    then a send. P1's create at K lands, its response is lost; the GC packs the state at
    K; P1's re-send checks K-1 (still a's) and stalls; the store loses K-1 and K and P2's
    c lands at K-1; P1's re-send lands at K. Were it the first send's bytes, the pack
    would vouch for them and hide c (the reconciler committed past it and the GC deleted
    its L0 object). A re-send is the same entry as other bytes (its re-send number).
    And b names a, which the store lost, not c: the log does not read (LogForked) until
    it is restored, and nothing is deleted meanwhile -- a's data, in L0, included."""
    log, k = a_written_then_next_offset(store, gate)
    seen = {"a": dict(log.entries(k - 2))[k - 1]}

    def meanwhile():
        gc(store, gate, full=True)  # the GC packs the state at K (P1's entry folded in)
        st, crc = newest_pack(store).states[("t", 0)]
        assert st.applied_offset == k
        seen["pack_crc"] = crc

    def between():
        store.delete_many([log.key(k - 1), log.key(k)])
        with Producer(store, epoch_ttl_s=0) as p2:
            seen["c"] = p2.write([(("t", 0), [Record(b"c")])])[0]

    with Producer(LoseResponse(store, log.key(k), meanwhile, between), epoch_ttl_s=0) as p1:
        vb = p1.write([(("t", 0), [Record(b"b")])])[0]
    assert seen["c"].accepted, seen["c"].error
    ents = dict(log.entries())
    assert isinstance(ents[k - 1], Placeholder) and ents[k - 1].l0_key == seen["c"].l0_key
    assert vb.accepted and codec.crc32c(store.get(log.key(k))) != seen["pack_crc"]
    kept = {seen["a"].l0_key, seen["c"].l0_key, ents[k].l0_key}
    for _ in range(3):
        ClusterEpoch(store).advance()
        s = reconcile(store)
        assert s.partitions_failed == 1 and "was written after another entry" in s.partitions[0].reason, s
        with pytest.raises(StateUnreadable, match="was written after another entry"):
            run_gc(store, gate=gate, config=GcSettings())
        assert all(store.head(key) is not None for key in kept)


def _producer_whose_newest_entry_the_store_lost(store):
    """Producer Y acknowledged Y0 at 1 and Y1 at 2; the store then lost Y1, the log's
    newest entry (a lost suffix). Y still holds a state that ends at Y1."""
    create_topic(store, "t", 1)
    ClusterEpoch(store).advance()
    y = Producer(store, epoch_ttl_s=0)
    assert y.write([(("t", 0), [Record(b"Y0", b"k", 1000)])])[0].accepted  # 1
    assert y.write([(("t", 0), [Record(b"Y1", b"k", 1001)])])[0].accepted  # 2
    log = plog(store, "t", 0, write_snapshots=False)
    store.delete_many([log.key(2)])
    return y, log


def test_a_writer_whose_newest_entry_was_lost_acknowledges_nothing_by_its_own_fold(store, gate):
    """Found by a seventh review. Producer Y writes Y0 at 1 and Y1 at 2; the store loses
    Y1 (the log's newest entry: a lost suffix); producer X lands X1 at 2 and X2 at 3.
    Y's next create, at 3, loses its race, and Y used to catch up by folding X2 onto its
    *own* state -- which still held the lost Y1 -- and acknowledge Y2 at 4 by that fold:
    every reader of the log refuses Y2 (its producer sequence follows Y1, which the log
    does not hold), and its L0 object went with the next GC. X2 names X1, not Y1: the
    writer's state is not the log's, and Y2 is refused to Y (nothing written; its next
    write reads the log afresh)."""
    y, log = _producer_whose_newest_entry_the_store_lost(store)
    x = Producer(store, epoch_ttl_s=0)
    assert x.write([(("t", 0), [Record(b"X1", b"k", 1002)])])[0].accepted  # 2
    assert x.write([(("t", 0), [Record(b"X2", b"k", 1003)])])[0].accepted  # 3
    v = y.write([(("t", 0), [Record(b"Y2", b"k", 1004)])])[0]  # its create at 3 loses the race
    assert not v.accepted and v.reason == "writer_state_lost" and "the store lost it" in str(v.error), v
    assert log.read_state().applied_offset == 3  # nothing of Y2's was written
    assert y.writer("t", 0).state.last_entry == log.read_state().last_entry  # Y holds the log's state now
    # (the store lost part of Y's producer sequence: R8 refuses Y's id from here on, as
    # for any producer whose batch the store lost; a producer with a new id goes on)
    z = Producer(store, epoch_ttl_s=0).write([(("t", 0), [Record(b"Z", b"k", 1005)])])[0]
    assert z.accepted and z.base_offset == 3, z.error
    for _ in range(3):
        epoch(store, gate)
    # (Y1 was lost by the store; everything acknowledged after it is read once, from L1)
    assert_exactly_once(
        store,
        "t",
        {
            0: [
                Record(b"Y0", b"k", 1000),
                Record(b"X1", b"k", 1002),
                Record(b"X2", b"k", 1003),
                Record(b"Z", b"k", 1005),
            ]
        },
        all_in_l1=True,
    )


def test_a_writer_that_rechecks_a_replaced_entry_is_told_the_store_lost_it_not_that_the_topic_went(store, gate):
    """The same lost entry found by a writer's recheck (its view older than
    ``recheck_after_s``): the entry its state ends at holds another producer's bytes.
    That is the store losing an entry, not the topic deleted (an absent log): the write
    is refused as ``writer_state_lost`` and the writer reads the log afresh, where it
    used to be refused as ``topic_deleted`` -- which made a producer forget the topic,
    and a ``ctp produce`` run bound to it refuse the rest of its input as deleted."""
    y, log = _producer_whose_newest_entry_the_store_lost(store)
    assert Producer(store, epoch_ttl_s=0).write([(("t", 0), [Record(b"X1", b"k", 1002)])])[0].accepted  # 2
    y.writer("t", 0).log.recheck_after_s = 0  # (its view is old: it checks before it appends)
    v = y.write([(("t", 0), [Record(b"Y2", b"k", 1003)])])[0]
    assert not v.accepted and v.reason == "writer_state_lost", v
    assert log.read_state().applied_offset == 2  # nothing written
    assert y.writer("t", 0).state.last_entry == log.read_state().last_entry
