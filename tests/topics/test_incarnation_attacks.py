"""Review of three changes: topic incarnation ids (produce markers v2, GC partition views
with ``topic_id``), GC runs' own files collected (``finish`` and ``gc_run_orphans``), and
the partial commit / ``_skip_still_lost`` of a partition whose L0 object is lost.

Each scenario tries to make ctp lose acknowledged data, serve wrong data, delete a file
a GC record names, or wedge the GC or the reconciler for good. Those that hold say HELD
in their docstring; the three that broke say what broke and how it is fixed (each failed
before its fix).
"""

from __future__ import annotations

import hashlib
import json

import pytest

from ctp_state import codec, layout
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import GateFailed, StateUnreadable, StoreError
from ctp_state.gc import run_gc
from ctp_state.gc.history import GcHistory
from ctp_state.ingest import produce_input
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.read import committed_l1_keys
from ctp_state.settings import GcSettings, ReconcileSettings
from ctp_state.status import reconcile_summaries
from ctp_state.topics import Topic, create_topic, encode_meta, get_topic
from tests.support import LostResponses, Wrapped, key_id, l0_keys, plog, reconcile, values
from tests.support.gc import named, run_files
from tests.support.topics import remove_by_hand

ONE_PER_CHUNK = ReconcileSettings(idle_lag=2, target_file_bytes=1)


# --- helpers ---------------------------------------------------------------------------------


def write(store, topic: str, partition: int, tag: str, n: int = 5) -> list[bytes]:
    """One flush (one L0 object) of ``n`` records into ``topic/partition``."""
    recs = [Record(f"{tag}-{i}".encode(), None, 1000 + i) for i in range(n)]
    with Producer(store, epoch_ttl_s=0) as prod:
        assert prod.write([((topic, partition), recs)])[0].accepted
    return [r.value for r in recs]


def settle(store, ce: ClusterEpoch, n: int = 3) -> None:
    for _ in range(n):
        ce.advance()
    reconcile(store)


# --- commit 2: a GC run's own files ------------------------------------------------------------


def test_a_gc_record_whose_create_response_was_lost_keeps_the_files_it_names(fstore, gate):
    """Broke, fixed (the run keeps the files of the last seq it tried). The history record lands but its response is lost and the history stays
    unreachable, so ``create_once`` raises CreateOutcomeUnknown: ``rec`` is None in
    ``finish`` and its ``finally`` deletes every file it wrote, including the partition
    view and the deleted-keys list that the landed record names (the audit trail of the
    L0 keys it deleted is gone, and the view a later run takes as its reference)."""
    create_topic(fstore, "t", 1)
    ClusterEpoch(fstore).advance()
    flaky = LostResponses(fstore, r"^gc/history/\d", times=1, then_unreachable=True)
    with pytest.raises(StoreError):
        run_gc(flaky, gate=gate)
    rec = GcHistory(fstore).get(0)  # the record did land
    assert rec.status == "ok" and rec.partitions_key and rec.deletes_key
    missing = [k for k in (rec.partitions_key, rec.deletes_key) if fstore.head(k) is None]
    assert not missing, f"GC record 0 names {missing}, which its own run deleted"


class ListRacesAnotherGc(Wrapped):
    """While a GC lists gc/partitions/ for orphans, a whole other GC run records the next
    seq (its files are written then named)."""

    def __init__(self, inner, gate):
        super().__init__(inner)
        self.gate, self.raced = gate, False

    def list(self, prefix="", start_after=None, end_before=None):
        if prefix == layout.GC_PARTITIONS and not self.raced:
            self.raced = True
            assert run_gc(self.inner, gate=self.gate).status == "ok"
        return self.inner.list(prefix, start_after, end_before)


def test_orphan_collection_racing_a_gc_that_wins_the_next_seq_never_deletes_a_named_file(fstore, gate):
    """HELD. The racer writes and names files at seq last+1, which the listing bound
    (end_before seq last+1) keeps out; the listing run then loses nothing and records
    at last+2. Every named file exists and none is unnamed."""
    create_topic(fstore, "t", 2)
    ClusterEpoch(fstore).advance()
    for _ in range(3):
        run_gc(fstore, gate=gate)
    racer = ListRacesAnotherGc(fstore, gate)
    rec = run_gc(racer, gate=gate)
    assert racer.raced and rec.seq == 4
    assert all(fstore.head(k) is not None for k in named(fstore))
    run_gc(fstore, gate=gate)
    assert run_files(fstore) == named(fstore)


def test_files_of_a_seq_whose_record_does_not_read_are_kept(fstore, gate):
    """HELD. A damaged history record is skipped by the tail; its seq is not in
    ``named``, so its view and deleted-keys list are left (they may be what it names)."""
    create_topic(fstore, "t", 1)
    ClusterEpoch(fstore).advance()
    for _ in range(3):
        run_gc(fstore, gate=gate)
    h = GcHistory(fstore)
    rec1 = h.get(1)
    key = layout.sequence_key(layout.GC_HISTORY, 1)
    data = bytearray(fstore.get(key))
    data[len(data) // 2] ^= 0x01
    fstore.put(key, bytes(data))
    for _ in range(3):
        run_gc(fstore, gate=gate)
    assert fstore.head(rec1.partitions_key) is not None and fstore.head(rec1.deletes_key) is not None


def test_a_run_id_that_sorts_around_the_bounds_is_judged_by_its_seq(store, gate):
    """HELD. Files of the seq just before the tail (run ids sort before '~') and of the
    seq just after it (a run still working) are never listed; a dead run's file inside
    the tail is collected."""
    create_topic(store, "t", 1)
    ClusterEpoch(store).advance()
    for _ in range(2):
        run_gc(store, gate=gate)
    last = GcHistory(store).last_seq()
    after = layout.gc_partitions_key(last + 1, "zzzz-zzzz")  # a run writing for the next seq
    dead = layout.gc_deletes_key(last, "0-dead")  # a dead run's file in the tail
    for k in (after, dead):
        store.put(k, b"x")
    rec = run_gc(store, gate=gate, config=GcSettings(history_tail=1))
    assert rec.gc_orphans_deleted == 1
    assert store.head(after) is not None and store.head(dead) is None
    assert all(store.head(k) is not None for k in named(store))


# --- commit 1: incarnations ------------------------------------------------------------------------


def test_a_topic_recreated_with_fewer_partitions_does_not_wedge_the_gc(fstore, gate):
    """Broke, fixed (incarnation filter before the "gone" check). The reference view (newest passing run) has t/0 and t/1 of the deleted
    incarnation. ``prepare`` checks that every partition of the reference still exists
    before it filters rows by incarnation, so t/1 (of an incarnation that no longer
    exists) is "gone": StateUnreadable, the run is recorded as failed, and since a failed
    run never becomes the reference, every later run fails the same way, for good."""
    create_topic(fstore, "t", 2)
    ce = ClusterEpoch(fstore)
    ce.advance()
    assert run_gc(fstore, gate=gate).status == "ok"
    remove_by_hand(fstore, "t")
    create_topic(fstore, "t", 1)  # the name again, one partition
    ce.advance()
    failed = []
    for _ in range(3):
        try:
            assert run_gc(fstore, gate=gate).status == "ok"
        except StateUnreadable as e:
            failed.append(str(e))
    assert not failed, f"{len(failed)} of 3 GC runs after re-creating t with 1 partition: {failed[-1]}"


def recreate_with_a_damaged_first_file_and_gc(fstore, ce, gate, *, partitions: int) -> None:
    """Remove t by hand, create it again with ``partitions``, reconcile 20 records into
    its first file, flip a bit in it: the gate must read it and fail, keeping its L0."""
    remove_by_hand(fstore, "t")
    create_topic(fstore, "t", partitions)
    write(fstore, "t", 0, "new", 20)
    reconcile(fstore)
    (l1,), _ = committed_l1_keys(plog(fstore, "t", 0))
    data = bytearray(fstore.get(l1))
    data[len(data) // 2] ^= 0x10
    fstore.put(l1, bytes(data))
    before = l0_keys(fstore)
    settle(fstore, ce)
    with pytest.raises(GateFailed, match="checksums_ok"):
        run_gc(fstore, gate=gate)
    assert l0_keys(fstore) == before


def test_a_topic_recreated_with_more_partitions_reads_every_new_file(fstore, gate):
    """HELD. Rows of the old incarnation give no watermark; the new incarnation's t/0
    first file, damaged, fails the gate and its L0 source stays."""
    create_topic(fstore, "t", 1)
    ce = ClusterEpoch(fstore)
    ce.advance()
    write(fstore, "t", 0, "old", 20)
    settle(fstore, ce)
    assert run_gc(fstore, gate=gate).status == "ok"
    recreate_with_a_damaged_first_file_and_gc(fstore, ce, gate, partitions=3)


def test_a_legacy_topic_recreated_does_not_inherit_its_watermark(fstore, gate):
    """HELD. A legacy topic's rows carry topic_id null; the re-created name has an id,
    so its first file is read whole before its L0 source may go."""
    fstore.put(layout.topic_meta("t"), encode_meta(Topic("t", 1, 1_700_000_000_000)))
    create_topic(fstore, "t", 1, exist_ok=True)  # finishes the inits
    assert get_topic(fstore, "t").id is None
    ce = ClusterEpoch(fstore)
    ce.advance()
    write(fstore, "t", 0, "old", 20)
    settle(fstore, ce)
    assert run_gc(fstore, gate=gate).status == "ok"
    recreate_with_a_damaged_first_file_and_gc(fstore, ce, gate, partitions=1)


class RecreateWhileReadingMarker(Wrapped):
    """Run A of an input reads its topics' incarnations; at its marker read, t is deleted
    by hand, created again, and run B of the same input writes it completely into the
    new incarnation. A then finishes with the old incarnation in hand."""

    def __init__(self, inner, marker, on_marker):
        super().__init__(inner)
        self.marker, self.on_marker, self.fired = marker, on_marker, False

    def get(self, k):
        if k == self.marker and not self.fired:
            self.fired = True
            self.on_marker()
        return self.inner.get(k)


def test_a_late_run_from_the_old_incarnation_only_makes_the_marker_ignored(fstore):
    """HELD. The late run's marker check fails (B's marker names the new incarnation).
    The run is bound to the incarnation it looked up (round-four review, defect 1): it
    writes nothing into the new one and no marker (its old incarnation's logs are gone,
    so nothing is accepted), and B's marker stands: the next run writes nothing again.
    Every record is there exactly once."""
    create_topic(fstore, "t", 2)
    rows = [("t", i % 2, Record(f"v{i}".encode(), None, 1000 + i)) for i in range(10)]
    digest = hashlib.sha256(json.dumps([r[2].value.decode() for r in rows]).encode()).hexdigest()
    pid = "file-" + digest[:32]
    first = produce_input(fstore, rows, producer_id=pid, digest=digest)
    assert first.accepted == 10

    import ctp_state.ingest as ingest

    real = ingest.get_topic

    def recreate_and_run_b():
        ingest.get_topic = real
        remove_by_hand(fstore, "t")
        create_topic(fstore, "t", 2)
        b = produce_input(fstore, rows, producer_id=pid, digest=digest)
        assert b.accepted == 10 and b.duplicates == 0

    late = RecreateWhileReadingMarker(fstore, layout.produce_marker(pid), recreate_and_run_b)
    # the late run read the incarnations before t was deleted: the old one is in its hand
    old = get_topic(fstore, "t")
    ingest.get_topic = lambda store, t: old
    try:
        a = produce_input(late, rows, producer_id=pid, digest=digest)
    finally:
        ingest.get_topic = real
    there = codec.unseal(fstore.get(layout.produce_marker(pid)), "marker", "produce marker")
    assert there["topics"] == {"t": get_topic(fstore, "t").id} != {"t": old.id}  # B's, still
    assert late.fired and a.completed_before is None and a.accepted == 0 and a.duplicates == 0
    assert a.rejected + a.not_sent + a.unknown == 10 and a.topics == {"t": old.id}, a.as_dict()
    c = produce_input(fstore, rows, producer_id=pid, digest=digest)
    assert c.accepted == 0 and c.duplicates == 10 and c.completed_before is not None
    assert sorted(values(fstore, "t", 0) + values(fstore, "t", 1)) == sorted(r[2].value for r in rows)


# --- commit 3: a lost L0 object ------------------------------------------------------------


def lose_fourth_chunk(store, topic="t", partition=0) -> tuple[list[bytes], str, bytes]:
    sent: list[bytes] = []
    for b in range(6):
        sent += write(store, topic, partition, f"b{b}")
    lost = plog(store, topic, partition).read_state().pending[3].l0_key
    backup = store.get(lost)
    store.delete_many([lost])
    return sent, lost, backup


def test_files_built_after_the_lost_chunk_are_checked_by_the_gc_once_committed(fstore, gate):
    """HELD. The quarantining run wrote the files after the bad chunk without committing
    them; the GC's watermark stays at the last reconciled offset (they are beyond it),
    so once the restored object lets them be committed (the rerun reuses the files in
    place) they are read whole: bit rot in one fails the gate, its L0 source stays."""
    create_topic(fstore, "t", 1)
    ce = ClusterEpoch(fstore)
    ce.advance()
    sent, lost, backup = lose_fourth_chunk(fstore)
    (p,) = reconcile(fstore, config=ONE_PER_CHUNK).partitions
    assert p.status == "quarantined" and p.key == lost
    after = layout.l1_key("t", 0, 25, 29, key_id(fstore, "t"))  # built from the sixth chunk, not committed
    assert fstore.head(after) is not None
    for _ in range(3):
        ce.advance()
    assert run_gc(fstore, gate=gate, config=GcSettings(l1_grace_s=0, l1_full_sweep_s=0)).status == "ok"
    assert fstore.head(after) is not None  # beyond LR: a live writer may still commit it
    fstore.put(lost, backup)
    (p,) = reconcile(fstore, config=ONE_PER_CHUNK).partitions
    assert p.status == "reconciled", p
    assert values(fstore) == sent
    keys, _ = committed_l1_keys(plog(fstore, "t", 0))
    assert after in keys
    data = bytearray(fstore.get(after))
    data[len(data) // 2] ^= 0x10
    fstore.put(after, bytes(data))
    before = l0_keys(fstore)
    for _ in range(3):
        ce.advance()
    with pytest.raises(GateFailed, match="checksums_ok"):
        run_gc(fstore, gate=gate)
    assert l0_keys(fstore) == before


def test_a_stale_quarantine_summary_does_not_hold_a_partition_whose_object_the_gc_took(fstore, gate):
    """HELD. A slow reconciler's summary (quarantined t/0 over K) lands after the object
    was restored, reconciled and then legitimately deleted by the GC; K is missing
    again, but no pending placeholder names it, so new records are reconciled."""
    create_topic(fstore, "t", 1)
    ce = ClusterEpoch(fstore)
    ce.advance()
    sent, lost, backup = lose_fourth_chunk(fstore)
    stale = reconcile(fstore, config=ONE_PER_CHUNK)
    fstore.put(lost, backup)
    reconcile(fstore)
    settle(fstore, ce)
    run_gc(fstore, gate=gate)
    assert fstore.head(lost) is None  # reconciled, below M: deleted by the GC
    reconcile_summaries(fstore).append(lambda seq: stale)  # the slow run's summary, newest
    sent += write(fstore, "t", 0, "later")
    (p,) = reconcile(fstore).partitions
    assert p.status == "reconciled", p
    assert values(fstore) == sent


def test_a_summary_of_the_deleted_incarnation_does_not_hold_the_new_one(fstore):
    """HELD. The newest summary quarantined t/0 of the deleted incarnation over K (still
    missing); the new incarnation's pending placeholders name other L0 objects."""
    create_topic(fstore, "t", 1)
    ClusterEpoch(fstore).advance()
    _, lost, _ = lose_fourth_chunk(fstore)
    (p,) = reconcile(fstore, config=ONE_PER_CHUNK).partitions
    assert p.status == "quarantined" and p.key == lost
    remove_by_hand(fstore, "t")
    create_topic(fstore, "t", 1)
    sent = write(fstore, "t", 0, "new")
    (p,) = reconcile(fstore).partitions
    assert p.status == "reconciled", p
    assert values(fstore) == sent


def test_the_gc_keeps_every_l0_object_behind_a_partial_commit(fstore, gate):
    """HELD. After the partial commit the lost chunk and every chunk after it stay
    pending: M stays below their epochs (and the I1 backstop checks it), so the GC deletes
    none of the pending chunks' L0 objects, and after the restore every record reads once,
    in order. (It does not delete the committed chunks' objects either: the commit's
    lower bound stays put since the applied window moved after it, R3; liveness only.)"""
    create_topic(fstore, "t", 1)
    ce = ClusterEpoch(fstore)
    ce.advance()
    sent = []
    for b in range(6):
        ce.advance()  # one epoch per object: M could pass the later ones if it were wrong
        sent += write(fstore, "t", 0, f"b{b}")
    pending = plog(fstore, "t", 0).read_state().pending
    lost = pending[3].l0_key
    backup = fstore.get(lost)
    fstore.delete_many([lost])
    (p,) = reconcile(fstore, config=ONE_PER_CHUNK).partitions
    assert p.status == "quarantined"
    for _ in range(5):
        settle(fstore, ce)
        rec = run_gc(fstore, gate=gate, config=GcSettings(grace_s=0))
        assert rec.status == "ok" and rec.m is not None and rec.m < pending[3].epoch
    assert {q.l0_key for q in pending[4:]} <= l0_keys(fstore)
    fstore.put(lost, backup)
    reconcile(fstore, config=ONE_PER_CHUNK)
    assert values(fstore) == sent


class HeadFailsOnce(Wrapped):
    def __init__(self, inner, key):
        super().__init__(inner)
        self.key, self.failed = key, False

    def head(self, k):
        if k == self.key and not self.failed:
            self.failed = True
            raise StoreError(f"HEAD {k!r}: 503 SlowDown")
        return self.inner.head(k)


def test_one_failed_head_of_a_lost_object_does_not_stop_every_other_partition(fstore):
    """Broke, fixed (a HEAD that fails is not a decision). Availability, not data: ``_skip_still_lost`` HEADs each quarantined
    partition's lost object outside any try: one transient error on that HEAD raises out
    of ``run_reconcile`` before anything is claimed, so no partition of any topic is
    reconciled that run and no summary is written. Every other per-partition store
    error (claim, commit) is reported on that partition alone; a store that keeps
    failing that HEAD (a policy denying it, a bad replica) stops every reconcile."""
    create_topic(fstore, "t", 2)
    ClusterEpoch(fstore).advance()
    _, lost, _ = lose_fourth_chunk(fstore, "t", 0)
    reconcile(fstore, config=ONE_PER_CHUNK)
    more = write(fstore, "t", 1, "other")
    flaky = HeadFailsOnce(fstore, lost)
    try:
        summary = reconcile(flaky)
    except StoreError as e:
        pytest.fail(f"one HEAD of t/0's lost object failed, and so did the whole run: {e}")
    by = {(r.topic, r.partition): r for r in summary.partitions}
    assert by[("t", 1)].status == "reconciled", by[("t", 1)]
    assert values(fstore, "t", 1) == more
