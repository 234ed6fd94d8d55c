"""Review round five: the reconciler's post-release read-back, attacked with stale state.

After its release the reconciler snapshots each partition it claimed from a full
``read_state()``: the store's current snapshot and every entry after it, decoded then.
A cheaper variant (7dbf2cf, reverted) continued from the state the run read at its start
and read only the entries written since; it saved a GET or two per partition and let
the snapshot vouch for state the run had read minutes earlier. A reviewer briefed to
break it found three ways (A, B, C below) that the full read-back does not have: bytes
that went bad after the start read, a snapshot an operator removed mid-run, a topic
re-created mid-run. These scenarios, and four that held either way, stay as tests.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import msgspec
import pytest

from ctp_state import entries as en, layout, reconcile as rc, snapshot
from ctp_state.entries import AccessMode
from ctp_state.errors import StateUnreadable
from ctp_state.gc import run_gc
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.read import read_partition
from ctp_state.reconcile import run_reconcile
from ctp_state.settings import GcSettings, ReconcileSettings
from ctp_state.topics import create_topic
from ctp_state.verify import verify
from tests.support import Wrapped, assert_exactly_once, key_id, l0_keys, plog, produce_rounds
from tests.support.snapshot import advance, append_singles, converges, deep_ok, gc_ok, log_end, snap_offset


def _tear(store, key: str) -> None:
    """The stored bytes of ``key`` go bad (a lying disk whose cache served the written
    bytes until now; test-only tampering with an immutable object)."""
    store.put(key, store.get(key)[:-7] + b"garbage")


def _building_then(store, hook):
    """A ``map_files`` that builds the files locally, then runs ``hook`` (what happens
    in the store while the run's Spark job runs, after its start read and claim)."""

    def map_files(files):
        out = rc.build_files_locally(store, files)
        hook()
        return out

    return map_files


# --- A. an entry the start read decoded, torn by the time of the read-back ------------------


def test_an_entry_torn_after_the_start_read_is_not_certified_by_the_read_back(fstore, gate):
    """(Broke the reverted 7dbf2cf.) The log is short (init + 3 placeholders,
    no snapshot), so the run-start read decodes every entry from the tail. While the
    run builds, the stored bytes of placeholder 2 go bad (a lying disk: the start read
    was served the bytes written; what the store kept is torn -- the failure model's
    "corrupt bytes"). Nothing re-reads offset 2 before the release.

    The full read-back, a ``read_state()``: it meets the torn entry, writes
    no snapshot, and the GC, reading the same tail, deletes nothing (StateUnreadable),
    with every L0 object intact to repair from -- what ``_snapshot``'s own docstring
    promises ("an entry the store kept torn stops this read, and the GC").
    7dbf2cf's read-back started after offset 3 and never looked at offset 2 again; the
    snapshot covers bytes no reader ever decoded, the GC reads only that snapshot,
    moves M and deletes the L0 objects. The partition's state now rests on a cache the
    log cannot rebuild (one flipped bit in the snapshot and the partition is unreadable
    for good, its L0 copies gone)."""
    store = fstore
    produce_rounds(store, partitions=1, rounds=3, per=10)
    advance(store, 2)
    torn_key = layout.log_entry("t", 0, 2, key_id(store, "t"))
    assert snap_offset(store, "t", 0) < 0  # no snapshot: the start read decodes the tail
    s = run_reconcile(
        store,
        config=ReconcileSettings(threads=1),
        map_files=_building_then(store, lambda: _tear(store, torn_key)),
    )
    assert s.partitions_reconciled == 1, s
    before = l0_keys(store)
    try:
        run_gc(store, gate=gate, config=GcSettings(l1_grace_s=0))
    except StateUnreadable:
        pass
    assert l0_keys(store) == before, (
        f"GC deleted {len(before - l0_keys(store))} L0 objects while {torn_key} does not decode; "
        f"the post-release snapshot at offset {snap_offset(store, 't', 0)} covers it"
    )
    assert snap_offset(store, "t", 0) < 2


def test_an_entry_torn_after_the_start_snapshot_covered_it_is_found_by_verify(fstore, gate):
    """A's long-tail variant. The tail (init + 12 placeholders) reaches
    ``START_SNAPSHOT_TAIL``, so the run-start read writes a snapshot -- from bytes it
    just decoded, as any reader writes one. Placeholder 2 then goes bad while the run
    builds. The snapshot vouched for bytes that were good when read; what it rests on
    is now a cache the log cannot rebuild, as for any snapshot of an entry that goes bad
    later. That is not data loss: the placeholder's records are in L1 and read exactly
    once, the GC's M comes from the snapshot, and ``verify --deep`` names the torn key
    for the operator (the failure model's corrupt bytes)."""
    store = fstore
    sent = produce_rounds(store, partitions=1, rounds=rc.START_SNAPSHOT_TAIL + 4, per=5)
    advance(store, 2)
    torn_key = layout.log_entry("t", 0, 2, key_id(store, "t"))
    assert snap_offset(store, "t", 0) < 0
    s = run_reconcile(
        store,
        config=ReconcileSettings(threads=1),
        map_files=_building_then(store, lambda: _tear(store, torn_key)),
    )
    assert s.partitions_reconciled == 1, s
    gc_ok(store, gate)
    assert_exactly_once(store, "t", sent)
    rep = verify(store, deep=True)
    assert torn_key in {f.key for f in rep.errors}, rep.errors


# --- B. the run-start snapshot repaired (deleted) by an operator while the run builds ------------


def test_a_snapshot_repaired_mid_run_is_not_reinstalled_by_the_read_back(fstore, gate):
    """(Broke the reverted 7dbf2cf.) The partition's snapshot is sealed and
    self-consistent but wrong (forged, or left by an older ctp): it forgets the
    producer's R8 sequence memory. ``ctp verify --deep`` reports it ("disagrees with a
    replay of the log") and the operator deletes it -- it is only a cache -- while a
    reconcile that read it at its start is building. Then the producer re-sends its
    last batch (a lost response; retried under the current epoch, new L0 object, same
    sequence numbers and fingerprint).

    The full read-back reads the store (no snapshot now: the whole log), so the new
    snapshot remembers the producer and the re-send is a *duplicate* (dropped).
    7dbf2cf's read-back started from the run-start state, i.e. from the forged
    snapshot the operator just removed, and writes it back (plus the run's entries):
    the producer is forgotten again, the re-send is accepted as new records, and the
    partition holds the batch twice (I2); verify --deep flags the snapshot again."""
    store = fstore
    sent = produce_rounds(store, partitions=1, rounds=2, per=10)
    advance(store, 2)
    log = plog(store, "t", 0, write_snapshots=False)
    true_state = log.read_state()
    assert len(true_state.producers) == 1
    forged = dataclasses.replace(true_state.persisted, producers=())
    snap_key = layout.snapshot("t", 0, key_id(store, "t"))
    store.put(snap_key, snapshot.encode_snapshot(forged))
    assert log.read_snapshot(strict=True).producers == ()  # passes every check readers make

    def operator_repairs():
        rep = verify(store, deep=True)
        assert any("disagrees with a replay" in f.what for f in rep.errors), rep.errors
        store.delete_many([snap_key])

    s = run_reconcile(store, config=ReconcileSettings(threads=1), map_files=_building_then(store, operator_repairs))
    assert s.partitions_reconciled == 1, s

    # The producer re-sends its last batch (offset 2) under the current epoch.
    key2 = layout.log_entry("t", 0, 2, key_id(store, "t"))
    ph = en.decode(store.get(key2), key2)
    c = advance(store, 0)
    spread, _ = layout.parse_l0_key(ph.l0_key)
    new_l0 = layout.l0_key(spread, c, "resend0000000000000000000000000000")
    store.put(new_l0, store.get(ph.l0_key))
    resend = msgspec.structs.replace(ph, epoch=c, l0_key=new_l0)
    log_ = plog(store, "t", 0)
    got = log_.append(log_.read_state(), lambda _s: resend).outcome
    assert got.rejected is None
    assert got.duplicate, "the re-sent batch was accepted as new records: the partition forgot its producer"
    advance(store, 2)
    run_reconcile(store)
    gc_ok(store, gate)
    assert_exactly_once(store, "t", sent)
    deep_ok(store)


# --- C. the topic re-created while the run builds -----------------------------------------------


def test_a_topic_recreated_mid_run_gets_a_snapshot_of_its_new_log(fstore, gate):
    """(Broke the reverted 7dbf2cf.) An operator deletes topic ``t`` and creates it
    again while a reconcile of the old ``t`` builds; the new ``t`` gets 6 batches, so
    its log is longer than the old one. When logs were keyed by the topic's name only,
    the run's commit landed in the new log (a lost race, caught up) and was rejected
    there (unknown writer epoch), as was its release; now it meets the old log's seal.

    The full read-back folds the new log from its start: the snapshot is the new
    topic's true state; its records read exactly once.
    7dbf2cf's read-back folded the *new* log's entries after offset 3 onto the *old*
    topic's run-start state: the snapshot holds the old topic's pending chunks and
    offsets, loses the new topic's first three batches, and numbers the rest after the
    old records. Readers (and the GC, via the pending list) follow that snapshot."""
    store = fstore
    produce_rounds(store, partitions=1, rounds=3, per=10)
    advance(store, 2)
    new_sent: dict[int, list[Record]] = {}

    def recreate():
        from ctp_state.deletion import delete_topic

        delete_topic(store, "t")
        create_topic(store, "t", 1)
        new_sent[0] = []
        with Producer(store, epoch_ttl_s=0) as prod:
            for r in range(6):
                recs = [Record(f"new-{r}-{i}".encode()) for i in range(4)]
                assert prod.write([(("t", 0), recs)])[0].accepted
                new_sent[0].extend(recs)

    run_reconcile(store, config=ReconcileSettings(threads=1), map_files=_building_then(store, recreate))
    assert log_end(store, "t", 0) == 6  # its init and 6 batches: the old run's commit went to the old log
    got = [r["value"] for r in read_partition(store, "t", 0).to_pylist()]
    want = [r.value for r in new_sent[0]]
    assert got == want, (
        f"the new t/0 reads {len(got)} records ({len(set(got) - set(want))} of the old topic, "
        f"{len(set(want) - set(got))} of its own missing); snapshot pending: "
        f"{[p.log_offset for p in plog(store, 't', 0).read_state().pending]}"
    )
    assert_exactly_once(store, "t", new_sent, all_in_l1=False)
    deep_ok(store)


# --- D. the snapshot the start read used goes bad while the run builds -------------------------


def _long_snapshotted_log(store) -> dict[int, list[Record]]:
    """t/0 with 70 one-record batches and a reader's snapshot of them, then C advanced
    past the idle lag: what was sent."""
    create_topic(store, "t", 1)
    advance(store, 1)
    sent: dict[int, list[Record]] = {0: []}
    append_singles(store, 70, "r", sent)
    plog(store, "t", 0).read_state()  # a reader snapshots the long tail
    assert snap_offset(store, "t", 0) > 60
    advance(store, 2)
    return sent


def test_a_snapshot_corrupted_mid_run_is_replaced_by_the_read_back(fstore, gate):
    """A log longer than ``snapshot_every``: the start read uses (or writes) a
    snapshot. While the run builds, the snapshot's bytes flip. The read-back sets the
    bad snapshot aside, rebuilds the state from the whole log and writes a new one at
    the log end. That snapshot agrees with a replay of the log; the GC and reads are
    exactly-once."""
    store = fstore
    sent = _long_snapshotted_log(store)
    s = run_reconcile(
        store,
        config=ReconcileSettings(threads=1),
        map_files=_building_then(store, lambda: _tear(store, layout.snapshot("t", 0, key_id(store, "t")))),
    )
    assert s.partitions_reconciled == 1, s
    assert snap_offset(store, "t", 0) == log_end(store, "t", 0)
    deep_ok(store)
    gc_ok(store, gate)
    assert_exactly_once(store, "t", sent)


def test_a_snapshot_and_an_entry_it_covered_both_corrupted_mid_run(fstore, gate):
    """As above, but an old entry the snapshot covered goes bad too, so the state can
    no longer be read from the store at all. The read-back rebuilds from the log, meets
    the bad entry and writes nothing; the GC stops (StateUnreadable) with every L0
    object in place, and ``verify`` names the entry. (7dbf2cf rewrote a snapshot from
    the state it read before either went bad: plausible, but vouched for by no read of
    the store.)"""
    store = fstore
    _long_snapshotted_log(store)
    bad = layout.log_entry("t", 0, 5, key_id(store, "t"))

    def both_go_bad():
        _tear(store, bad)
        _tear(store, layout.snapshot("t", 0, key_id(store, "t")))

    s = run_reconcile(store, config=ReconcileSettings(threads=1), map_files=_building_then(store, both_go_bad))
    assert s.partitions_reconciled == 1, s
    before = l0_keys(store)
    with pytest.raises(StateUnreadable, match=bad):
        run_gc(store, gate=gate, config=GcSettings(l1_grace_s=0))
    assert l0_keys(store) == before
    rep = verify(store, deep=True)
    assert bad in {f.key for f in rep.errors}, rep.errors


# --- E. the read-back's LIST skips keys ---------------------------------------------------------


class SkippingList(Wrapped):
    """LISTs of a log, once armed, leave out the newest ``tail`` keys and one key in the
    middle (a listing that lags the writes, or skips an entry mid-link(2))."""

    def __init__(self, inner, tail: int):
        super().__init__(inner)
        self.tail, self.armed = tail, False

    def list(self, prefix="", start_after=None, end_before=None):
        got = list(self.inner.list(prefix, start_after, end_before))
        if self.armed and prefix.startswith(layout.LOGS_ROOT) and len(got) > self.tail + 1:
            got = got[:1] + got[2 : len(got) - self.tail]
        return iter(got)


def test_a_read_back_whose_listing_skips_keys_snapshots_no_further_than_it_read(fstore, gate):
    """A LIST that skips one entry in the middle and leaves out the two newest, armed
    while the reconciler reads back: the read-back reads by GETs of each next key (a
    probing log, no listing), so it is not fooled at all: its snapshot is at the log end
    and agrees with the log's replay. (A listing reader that such a LIST fooled would
    still snapshot only what it decoded.)"""
    store = fstore
    sent = produce_rounds(store, partitions=1, rounds=3, per=10)
    advance(store, 2)
    skipping = SkippingList(store, tail=2)
    orig = rc._snapshot

    def armed(_store, *args):
        skipping.armed = True
        try:
            orig(skipping, *args)
        finally:
            skipping.armed = False

    rc_snapshot_patch = pytest.MonkeyPatch()
    rc_snapshot_patch.setattr(rc, "_snapshot", armed)
    try:
        s = run_reconcile(store, config=ReconcileSettings(threads=1))
    finally:
        rc_snapshot_patch.undo()
    assert s.partitions_reconciled == 1, s
    end = log_end(store, "t", 0)
    assert snap_offset(store, "t", 0) == end
    deep_ok(store)
    gc_ok(store, gate)
    assert_exactly_once(store, "t", sent)


# --- F. a long WAIT_FOR_EXCLUSIVE wait over a busy log ---------------------------------------------


def test_a_wait_for_exclusive_claim_over_a_busy_log_snapshots_the_log(fstore, gate):
    """Another owner holds the partition; the reconciler's start state is read,
    then it waits (WAIT_FOR_EXCLUSIVE) while a producer appends 70 entries, a reader
    snapshots them (a newer snapshot than ``start``), and the holder releases. The
    read-back reads the newer snapshot and the entries after it, and its snapshot agrees with the log; nothing is lost or doubled, the GC keeps what the
    pending records need."""
    store = fstore
    sent = produce_rounds(store, partitions=1, rounds=2, per=5)
    advance(store, 2)
    log = plog(store, "t", 0)
    held = log.claim(log.read_state(), "other", AccessMode.EXCLUSIVE, lease_ms=30_000).outcome
    assert held.rejected is None
    we = held.state.writer_epoch
    errors: list[BaseException] = []

    def holder():
        try:
            time.sleep(0.5)  # the reconciler has read its start state and is waiting
            append_singles(store, 70, "busy", sent)
            plog(store, "t", 0).read_state()  # a reader snapshots them
            log_ = plog(store, "t", 0)
            assert log_.release(log_.read_state(), "other", we).outcome.rejected is None
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=holder)
    t.start()
    s = run_reconcile(store, config=ReconcileSettings(threads=1, claim_wait_s=60))
    t.join(60)
    assert not errors, errors
    assert s.partitions_reconciled == 1, s
    assert snap_offset(store, "t", 0) == log_end(store, "t", 0)
    converges(store, gate, sent, 1)
