"""Reading a partition's state log: its snapshot, its entries, and whether the log
still vouches for a stored state (:class:`LogReader`; :class:`~ctp_state.partition_log.PartitionLog`
adds appending and claims).

Reading a partition's current state costs one GET (the newest snapshot), one GET of
the entry the snapshot ends at, one LIST (entries after it) and one GET per tail entry.
A stored state (a snapshot, the GC's state pack) names the CRC32C of the entry it ends
at, and is used only while the log holds those bytes there (and, for an entry that
names no writer of its own, its writer's claim): a store that lost that entry and took
another writer's in its slot would otherwise hide the new entry behind the state (a
snapshot the log does not vouch for is set aside and the log read from its start).

A *probing* log (``probe=True``: the reconciler's, which reads every partition every
run to find work) lists nothing when it reads: it GETs the key after the snapshot's
offset, and the next, until one is not there (a 404 is a GET-class request, a LIST a
PUT-class one, which costs 12.5 times as much). A log of create-if-absent appends has
no holes, so the first missing key is its end -- unless the store lost entries in the
middle, which only a listing can see (:class:`~ctp_state.errors.LogGap`); so a
probing log lists before it writes instead (see :mod:`ctp_state.partition_log`).
Readers that decide from the state what to delete (the GC) read by listing: a state
read short of a lost entry would not know what that entry committed.

A reader that folds a tail of ``snapshot_every`` entries or more from the store writes
a new snapshot, so the tail stays short. A snapshot only ever covers entries decoded
from the store: appenders, whose states hold entries they wrote and never read back,
do not write them. A snapshot is only a cache of the log: one that fails its checksum
or its self-consistency check is set aside (logged, counted) and the state is rebuilt
from the log's first entry, then the snapshot is rewritten. Writing a snapshot is best
effort: an append that landed is never reported as failed because its snapshot was not.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

from ctp_state import codec, entries as en, layout, snapshot, state as sm, window
from ctp_state.entries import Advance, Claim, Compact, Entry, Reconcile, Trim
from ctp_state.errors import CorruptData, LogGap, ObjectNotFound, StoreError
from ctp_state.storage import ObjectStore
from ctp_state.topic_meta import Topic

DEFAULT_SNAPSHOT_EVERY = 64
log = logging.getLogger(__name__)


class _Counter:
    """A process-wide count (thread-safe enough for a metric: ``+=`` under the GIL is
    not atomic, so a lock keeps it exact for the tests that read it)."""

    def __init__(self) -> None:
        self._n, self._lock = 0, threading.Lock()

    def inc(self) -> None:
        with self._lock:
            self._n += 1

    @property
    def value(self) -> int:
        return self._n


#: The entries of a claim holder that name no writer of their own when they do not
#: release the claim (see :meth:`LogReader.unvouched`).
_NAMELESS = (Reconcile, Advance, Compact, Trim)

#: Snapshots set aside because the log does not reach the offset they claim to cover.
SNAPSHOTS_SET_ASIDE = _Counter()


class NotVouched(Exception):
    """The log does not hold the entry a stored state ends at (``why``; ``absent``: no
    entry there at all -- a removed log -- rather than other bytes: a store that lost it)."""

    def __init__(self, offset: int, why: str, *, absent: bool = False):
        self.offset, self.why, self.absent = offset, why, absent


def _item(offset: int, data: bytes, key: str) -> tuple[int, Entry, int, int | None]:
    entry, prev = en.decode_chained(data, key)
    return offset, entry, codec.crc32c(data), prev


class LogReader:
    """Reads for one partition's log. Holds no state of its own except the offset of
    the newest snapshot it knows of; thread-safe."""

    def __init__(
        self,
        store: ObjectStore,
        topic: Topic | str,
        partition: int,
        *,
        topic_id: str | None = None,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
        write_snapshots: bool = True,
        probe: bool = False,  # read tails by GETs of the next key, not a LIST (see above)
        idle_snapshot_every: int | None = None,  # snapshot an idle partition's (nothing pending) shorter tail
    ):
        name = topic.name if isinstance(topic, Topic) else topic
        if isinstance(topic, Topic):
            topic_id = topic.key_id
        #: The incarnation id in this log's keys (None: a topic whose keys carry only its name).
        self.store, self.topic, self.partition, self.topic_id = store, name, partition, topic_id
        self.prefix = layout.log_prefix(name, partition, topic_id)
        self.snapshot_every = snapshot_every
        self._snapshot_offset = -1
        self.write_snapshots = write_snapshots  # False: a reader that must change nothing
        #: Why the last snapshot read was set aside (None when it was fine or absent).
        self.snapshot_problem: str | None = None
        self._seen_at = time.monotonic()  # when this log was last read or written
        self.probe = probe
        self.idle_snapshot_every = idle_snapshot_every

    def key(self, offset: int) -> str:
        return layout.log_entry(self.topic, self.partition, offset, self.topic_id)

    def empty_state(self) -> sm.PartitionState:
        return sm.PartitionState(self.topic, self.partition, topic_id=self.topic_id)

    def read_snapshot(self, *, strict: bool = False) -> sm.PartitionState:
        """The newest snapshot's state, or the empty state when there is none. A
        snapshot that does not check out is set aside (the empty state is returned and
        ``snapshot_problem`` says why) unless ``strict``, which raises."""
        key = layout.snapshot(self.topic, self.partition, self.topic_id)
        self.snapshot_problem = None
        try:
            data = self.store.get(key)
        except ObjectNotFound:
            return self.empty_state()
        try:
            st = snapshot.decode_snapshot(data, key)
            if (st.topic, st.partition, st.topic_id) != (self.topic, self.partition, self.topic_id):
                raise CorruptData(
                    key, f"snapshot belongs to {st.topic}/{st.partition} of incarnation {st.topic_id or 'legacy'}"
                )
        except CorruptData as e:
            if strict:
                raise
            self.snapshot_problem = str(e)
            log.warning("%s; rebuilding %s/%d from its log", e, self.topic, self.partition)
            self._snapshot_offset = -1
            return self.empty_state()
        self._snapshot_offset = max(self._snapshot_offset, st.applied_offset)
        return st

    def read_state(self, base: sm.PartitionState | None = None, base_crc: int | None = None) -> sm.PartitionState:
        """The current state, recovered: from the newest snapshot plus the tail, with
        the fence window collapsed to ``[max_applied_epoch]`` (a process that reads the
        state is a restart, whether a snapshot covers the newest entry or not; the
        window is volatile and no verdict depends on it, R2).

        With ``base`` (a state of this log from the GC's state pack, ``base_crc`` the
        CRC32C of the stored bytes of the entry it ends at), from that state instead of
        the snapshot, if the log vouches for it (see :meth:`_from_base`); else as
        without it."""
        if base is not None and base_crc is not None:
            state = self._from_base(base, base_crc)
            if state is not None:
                return state
        snap = self.read_snapshot()
        try:
            state = self.catch_up(snap, reach=True)
        except NotVouched as e:
            # A snapshot is trusted only as far as the log vouches for it: one that covers
            # entries the log does not hold (it landed late, or was put there), or whose
            # last entry holds other bytes now (the store lost it and took another entry
            # in its slot), is not this log's summary: set aside, counted like a corrupt one.
            key = layout.snapshot(self.topic, self.partition, self.topic_id)
            self.snapshot_problem = (
                f"{key}: snapshot covers log offset {snap.applied_offset} but the log holds {e.why} at "
                f"{e.offset}; set aside"
            )
            SNAPSHOTS_SET_ASIDE.inc()
            log.warning("%s; rebuilding %s/%d from its log", self.snapshot_problem, self.topic, self.partition)
            self._snapshot_offset = -1
            state = self.catch_up(self.empty_state())
        self._maybe_snapshot(state)
        return window.recover(state)

    def _from_base(self, base: sm.PartitionState, crc: int) -> sm.PartitionState | None:
        """The state from ``base`` and the entries after it, or None: read it as usual.

        ``base`` is used only if it is this incarnation's, initialized, and the entry it
        ends at is still in the log with the very bytes it was folded from (one GET, its
        CRC32C): a base is only ever older than the log -- unless the store lost the
        log's tail after it was taken and something was appended where it was; a state
        folded from entries no longer there would hide that placeholder (the GC's rule
        for its pack, docs/design.md section 14). An entry's mtime cannot say so: a
        create stalled between its write and its link (or an S3 PUT, whose Last-Modified
        is its start) lands with a time from before the pack was read. The tail after
        it is read as after a snapshot, and a snapshot is written by the same rule,
        counted from the base: every entry the base folds was decoded from the store by
        the run that wrote the pack."""
        if (base.topic, base.partition, base.topic_id) != (self.topic, self.partition, self.topic_id):
            return None
        if not base.initialized or base.applied_offset < 0:
            return None
        try:
            base = self._vouched(sm.ending_at(base, crc))
        except NotVouched:
            return None
        state = self.catch_up(base, vouched=True)
        self._snapshot_offset = max(self._snapshot_offset, base.applied_offset)
        self._maybe_snapshot(state)
        return window.recover(state)

    def last_entry_crc(self, state: sm.PartitionState, *, fetch: bool = True) -> int | None:
        """The CRC32C of the stored bytes of the entry ``state`` ends at: as the state
        knows it (read or written by a log), else (with ``fetch``) one GET (None: not
        known, or no such entry)."""
        if state.last_crc is not None:
            return state.last_crc
        if state.applied_offset < 0 or not fetch:
            return None
        try:
            return codec.crc32c(self.store.get(self.key(state.applied_offset)))
        except ObjectNotFound:
            return None

    def vouch(self, state: sm.PartitionState) -> sm.PartitionState:
        """``state`` (a stored one: a pack's), if the log vouches for it; else
        :class:`NotVouched` (:meth:`_vouched`: one GET, no read of the tail after it)."""
        return self._vouched(state)

    def _vouched(self, state: sm.PartitionState) -> sm.PartitionState:
        """``state``, if the log still holds the entry it ends at with the bytes it was
        folded from or written with (one GET; see :meth:`unvouched`). Raises
        :class:`NotVouched` if not: a store that lost the entry and took another in its
        slot (a producer appending from its cached state) must not have that entry
        hidden behind the state."""
        offset = state.applied_offset
        if offset < 0:
            return state
        try:
            data = self.store.get(self.key(offset))
        except ObjectNotFound:
            raise NotVouched(offset, "no entry", absent=True) from None
        why = self.unvouched(state, data)
        if why is not None:
            raise NotVouched(offset, why)
        return state

    def unvouched(self, state: sm.PartitionState, data: bytes) -> str | None:
        """Why ``data``, the stored bytes of the entry ``state`` ends at, do not vouch
        for ``state`` (None: they do). They must be the bytes the state names
        (:attr:`~ctp_state.partition_state.PartitionState.last_crc`; a state that names
        none -- a snapshot from before ctp recorded it -- is not vouched for).

        An entry of version 6 names the CRC32C of the entry before it (``prev``): two
        entries alike in every field but written after different entries differ in
        bytes, so its bytes vouch for the log before it as well. An older entry that
        names no writer of its own (a claim holder's reconcile, advance, compact or trim
        that does not release: its bytes follow from the state before it, so another
        run that claimed the same writer epoch after the store lost the claim could
        write them again) is vouched for only while its writer epoch's claim entry is
        still the claim of the owner the state holds (one more GET)."""
        if state.last_crc is None:
            return "an entry the stored state names no checksum of"
        if codec.crc32c(data) != state.last_crc:
            return "another entry"
        key = self.key(state.applied_offset)
        try:
            entry, prev = en.decode_chained(data, key)
        except CorruptData:
            return "an entry that does not read"
        if prev is not None or not isinstance(entry, _NAMELESS) or entry.release_owner is not None:
            return None
        we = entry.writer_epoch
        holder = next((h.owner for h in state.holders if h.writer_epoch == we), None)
        start = next((o for e, o in state.writer_epoch_starts if e == we), None)
        if holder is None or start is None:
            return f"an entry of writer epoch {we}, whose claim the stored state does not hold"
        try:
            claim = en.decode(self.store.get(self.key(start)), self.key(start))
        except (ObjectNotFound, CorruptData):
            claim = None
        if not isinstance(claim, Claim) or (claim.owner, claim.writer_epoch) != (holder, we):
            return f"an entry of writer epoch {we} whose claim at {start} is not {holder!r}'s"
        return None

    def entries(self, after: int = -1) -> Iterator[tuple[int, Entry]]:
        """Yield ``(offset, entry)`` for every entry after log offset ``after``."""
        for offset, entry, _crc, _prev in self._read(after):
            yield offset, entry

    def _read(self, after: int) -> Iterator[tuple[int, Entry, int, int | None]]:
        """:meth:`entries`, each with the CRC32C of its stored bytes and its ``prev``."""
        if self.probe:
            yield from self._probed(after)
            return
        start_after = self.key(after) if after >= 0 else None
        expected = after + 1
        for info in self.store.list(self.prefix, start_after=start_after):
            offset = layout.log_offset_of(info.key, self.prefix)
            # A log of create-if-absent appends has no holes, but a listing taken while
            # it grows may skip an entry and return a later one (a directory read during
            # link(2)s on the local store). Read the skipped keys themselves; only one
            # that is really absent is a gap.
            while expected < offset:
                key = self.key(expected)
                try:
                    data = self.store.get(key)
                except ObjectNotFound:
                    raise LogGap(info.key, expected, offset) from None
                yield _item(expected, data, key)
                expected += 1
            if offset != expected:
                raise LogGap(info.key, expected, offset)
            yield _item(offset, self.store.get(info.key), info.key)
            expected += 1

    def _probed(self, after: int) -> Iterator[tuple[int, Entry, int, int | None]]:
        """:meth:`_read` by GETs of each next key until one is missing: no listing."""
        offset = after + 1
        while True:
            key = self.key(offset)
            try:
                data = self.store.get(key)
            except ObjectNotFound:
                break
            yield _item(offset, data, key)
            offset += 1

    def catch_up(
        self, state: sm.PartitionState, *, reach: bool = False, vouched: bool = False, own: bool = False
    ) -> sm.PartitionState:
        """Apply every entry after ``state.applied_offset`` (with ``reach``, first check
        the log still holds the entry the state ends at, with its bytes: :meth:`_vouched`;
        ``vouched``: the caller did).

        ``own``: ``state`` is a writer's own, which lost a race at the offset after it.
        The entry that won names (``prev``) the entry it was written after; if that is
        not the entry the writer's state ends at, the writer's state is not the log's
        (the store lost the writer's newest entry and another took its slot) and
        :class:`NotVouched` is raised (the append is refused:
        :class:`~ctp_state.errors.WriterStateLost`): folding the log onto that state
        would keep the lost entry (its producer sequence, its window) in it, and the
        writer would acknowledge by a fold no reader shares. No request: the bytes are
        read anyway.

        Each entry is applied as *forked* when it names (``prev``) another entry than the
        one before it in the log (:func:`ctp_state.state.apply`): known from the bytes
        read here, and for the first one from the state's own last entry when the log
        vouched for it (a writer's state that the log did not vouch for may be the
        stale one).

        Never snapshots: ``state`` may hold entries its caller appended and never read
        back. Only :meth:`read_state`, whose state is folded from bytes read from the
        store (the snapshot and every entry after it), writes snapshots: a snapshot
        must never vouch for an entry whose stored bytes nobody decoded (a torn write
        or a lying disk would then be hidden from every reader and from the GC)."""
        if reach:
            state = self._vouched(state)
        last = None
        before = state.last_crc if reach or vouched else None
        for offset, entry, crc, prev in self._read(state.applied_offset):
            if own and last is None and None not in (prev, state.last_crc) and prev != state.last_crc:
                raise NotVouched(state.applied_offset, f"the entry at {offset} follows another entry")
            forked = prev is not None and before is not None and prev != before
            state = sm.apply(state, offset, entry, forked=forked).state
            last, before = (offset, crc), crc
        if last is not None:
            state = sm.evolve(state, last_entry=last)
        self._seen_at = time.monotonic()
        return state

    def _maybe_snapshot(self, state: sm.PartitionState) -> None:
        if not self.write_snapshots:
            return
        tail = state.applied_offset - self._snapshot_offset
        stale = tail >= self.snapshot_every or (
            self.idle_snapshot_every is not None and not state.pending and tail >= self.idle_snapshot_every
        )
        if stale or (self.snapshot_problem is not None and state.applied_offset >= 0):
            try:
                self.write_snapshot(state)
            except (StoreError, OSError) as e:  # a cache: the next reader writes it
                log.warning("could not write the snapshot of %s/%d: %s", self.topic, self.partition, e)
            else:
                self.snapshot_problem = None

    def write_snapshot(self, state: sm.PartitionState) -> None:
        # A plain overwrite is safe: snapshots are deterministic and a racing writer
        # that installs an older one only makes the next reader's tail longer.
        self.store.put(layout.snapshot(self.topic, self.partition, self.topic_id), snapshot.encode_snapshot(state))
        self._snapshot_offset = max(self._snapshot_offset, state.applied_offset)
