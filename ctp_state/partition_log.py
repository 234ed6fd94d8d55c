"""The partition state log in the object store: dense, append-only, with snapshots.

:class:`PartitionLog` appends and claims; what it reads, it reads as a
:class:`~ctp_state.log_reader.LogReader` (snapshots, entries, stored states vouched
for by the log).

An append is a create-if-absent of the key for the next offset, so two writers can
never both win an offset. The loser reads the entries it missed, re-applies them, and
retries with an entry rebuilt from the fresher state, a bounded number of times.

A probing log (the reconciler's) reads by GETs of the next key, which cannot see a hole
the store left in the middle of a log; so it lists before it writes instead: before a
create, one page of the keys from its own on (not when its own create was the offset
before: a reconcile's commit after its claim); any key after its own while its own is
missing is a hole, and it refuses with ``LogGap`` rather than write into it (its own
key there is a lost race). Writes are rarer than reads (an idle partition is written
once every ``idle_lag`` epochs, read every epoch).

Offset 0 is the partition's init entry and nothing else: nothing but an init is ever
appended to a log that has none (R9).

When the store fails an append's create (a lost response, a 5xx after the write), the
append sends the same entry to the same key again -- once it has checked that the
entry before it is still the one its state ends at, and as other bytes (its re-send
number: a re-send never puts back bytes a stored state may name) -- and any of its
sends at that offset is its own, another entry there means it lost the race. If the store stays
unreachable, or the entry before it changed, the outcome is
:class:`~ctp_state.errors.OutcomeUnknown`, never a rejection (I4).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from ctp_state import codec, entries as en, layout, state as sm
from ctp_state.entries import AccessMode, Claim, Entry, Init, Release
from ctp_state.errors import (
    ClaimHeld,
    CtpError,
    InvalidTransition,
    LogGap,
    LogRewound,
    ObjectNotFound,
    OutcomeUnknown,
    StoreError,
    WriterStateLost,
)
from ctp_state.log_reader import (
    DEFAULT_SNAPSHOT_EVERY as DEFAULT_SNAPSHOT_EVERY,
    SNAPSHOTS_SET_ASIDE as SNAPSHOTS_SET_ASIDE,
    LogReader,
    NotVouched,
)
from ctp_state.sequence import CreateOutcomeUnknown, create_next, create_sent
from ctp_state.storage import ObjectStore
from ctp_state.topic_meta import Topic

#: A writer whose view of the log is older than this checks, before its next append,
#: that the log still holds the entry its state ends at (one GET, its bytes): a log
#: removed meanwhile -- its topic deleted and the GC done -- is refused instead of
#: written to afresh. The GC's ``--topic-removal-grace-seconds`` must stay well above it
#: (docs/design.md, section 10).
DEFAULT_RECHECK_AFTER_S = 30.0
DEFAULT_APPEND_ATTEMPTS = 64
#: Attempts to learn an append's outcome after the store failed it (each after a backoff).
DEFAULT_RESOLVE_ATTEMPTS = 6
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Appended:
    offset: int
    outcome: sm.Outcome


class PartitionLog(LogReader):
    """I/O for one partition's log: its reads (:class:`~ctp_state.log_reader.LogReader`),
    appends and R5 claims. Holds no state of its own except the offset of the newest
    snapshot it knows of and of its own last create; thread-safe."""

    def __init__(
        self,
        store: ObjectStore,
        topic: Topic | str,
        partition: int,
        *,
        topic_id: str | None = None,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
        max_attempts: int = DEFAULT_APPEND_ATTEMPTS,
        resolve_attempts: int = DEFAULT_RESOLVE_ATTEMPTS,
        resolve_backoff_s: float = 0.1,
        sleep: Callable[[float], None] = time.sleep,
        write_snapshots: bool = True,
        recheck_after_s: float | None = None,  # None: DEFAULT_RECHECK_AFTER_S
        probe: bool = False,  # read tails by GETs of the next key, not a LIST (see log_reader)
        idle_snapshot_every: int | None = None,  # snapshot an idle partition's (nothing pending) shorter tail
        list_before_create: bool = True,  # a probing log: one page of a listing before each create
    ):
        super().__init__(
            store,
            topic,
            partition,
            topic_id=topic_id,
            snapshot_every=snapshot_every,
            write_snapshots=write_snapshots,
            probe=probe,
            idle_snapshot_every=idle_snapshot_every,
        )
        self.max_attempts = max_attempts
        self.resolve_attempts, self.resolve_backoff_s, self._sleep = resolve_attempts, resolve_backoff_s, sleep
        self.recheck_after_s = DEFAULT_RECHECK_AFTER_S if recheck_after_s is None else recheck_after_s
        self._created = -2  # the offset of this log's last create (a probing log's next needs no listing)
        self.list_before_create = list_before_create

    # --- appending ---

    def append(
        self,
        state: sm.PartitionState,
        make_entry: Callable[[sm.PartitionState], Entry],
    ) -> Appended:
        """Append ``make_entry(state)`` at the next offset, catching up and rebuilding
        the entry on every lost race. Returns the offset and the verdict of ``apply``.

        Raises :class:`InvalidTransition` without writing anything if the log has no
        init entry and this is not one, and :class:`OutcomeUnknown` if the store failed
        the write and kept failing while the append tried to learn its outcome.
        """
        if not state.initialized:
            state = self.catch_up(state)  # the init may have landed meanwhile
        elif time.monotonic() - self._seen_at > self.recheck_after_s:
            try:
                state = self.catch_up(state, reach=True)
            except NotVouched as e:
                raise self._not_the_logs(e) from None
        self._seen_at = time.monotonic()
        current = {"state": state}
        built: dict[int, tuple[Entry, bytes]] = {}

        def build(offset: int) -> tuple[str, bytes]:
            st = current["state"]
            entry = make_entry(st)
            if st.initialized == isinstance(entry, Init):
                raise InvalidTransition(
                    self.topic,
                    self.partition,
                    "partition is not initialized (its topic creation is unfinished: run `ctp topic create` "
                    "again); nothing was written"
                    if not st.initialized
                    else "the log already has its init entry",
                )
            # (with the CRC32C of the entry it follows: its bytes say which log they follow)
            data = en.encode(entry, prev=st.last_crc)
            built[offset] = (entry, data)
            return self.key(offset), data

        def create(offset: int, key: str, data: bytes) -> bool:
            entry, st = built[offset][0], current["state"]
            landed = self._create(
                key,
                lambda attempt: data if attempt == 0 else en.encode(entry, prev=st.last_crc, resend=attempt),
                offset,
                st,
            )
            if landed is None:
                return False
            built[offset] = (entry, landed)  # (the send that landed: a re-send's bytes differ)
            return True

        def after_loss(_offset: int) -> int:
            # the entry that won, and any after it -- if it follows this writer's state
            current["state"] = self.catch_up(current["state"], own=True)
            return current["state"].applied_offset + 1

        try:
            offset = create_next(
                self.store,
                state.applied_offset + 1,
                build,
                after_loss=after_loss,
                what=f"append to {self.topic}/{self.partition}",
                attempts=self.max_attempts,
                create=create,
            )
        except NotVouched as e:  # (nothing of this writer's landed: it lost every race it ran)
            raise self._not_the_logs(e) from None
        entry, data = built[offset]
        outcome = sm.apply(current["state"], offset, entry)
        outcome = replace(outcome, state=sm.evolve(outcome.state, last_entry=(offset, codec.crc32c(data))))
        return Appended(offset, outcome)  # no snapshot: this entry was never read back (see catch_up)

    def _not_the_logs(self, e: NotVouched) -> LogRewound | WriterStateLost:
        """Why an append is refused when the log does not hold the entry the writer's
        state ends at: no entry there -- the log was removed with its topic -- or another
        entry there -- the store lost the writer's and another took its slot (the writer
        reads the log afresh). Nothing was written either way."""
        return (LogRewound if e.absent else WriterStateLost)(self.topic, self.partition, e.offset)

    def _create(self, key: str, sends: Callable[[int], bytes], offset: int, after: sm.PartitionState) -> bytes | None:
        """Create ``key`` holding ``sends(0)`` (an entry built on ``after``, the state it
        follows; ``sends(n)``: its n-th re-send, the same entry as other bytes): the
        bytes there when they are ours, None when another writer's entry is there. Raises :class:`OutcomeUnknown` when the store keeps failing. A probing
        log first checks that it is not writing into a hole (see the module's
        docstring), with one page of a listing from its key on: a later key there and
        this one not is a :class:`LogGap`; this one there, a writer got ahead of this
        one (a lost race).

        A create whose response was lost is sent again only while the entry before it
        is still the one ``after`` ends at (its bytes, one GET per re-send): the first
        send may have landed, been read (by the GC, into its state pack) and been lost
        by the store with the entry before it, and another writer may have landed in
        that slot since; the very same bytes at ``offset`` would then match what the
        pack names, and hide that writer's entry from every reader starting there. The
        outcome is unknown then (:class:`OutcomeUnknown`): the first send may have landed."""
        if self.probe and self.list_before_create and offset != self._created + 1:
            # (right after its own create no hole can be before it; one can form *at* it,
            # which the placeholder kept behind it shows every reader: state.LogForked)
            first = next(iter(self.store.list(self.prefix, start_after=self.key(offset - 1) if offset else None)), None)
            if first is not None:
                if first.key != key:
                    raise LogGap(first.key, offset, layout.log_offset_of(first.key, self.prefix))
                return None

        def still_after() -> str | None:
            if after.applied_offset < 0:
                return None
            try:
                crc = codec.crc32c(self.store.get(self.key(after.applied_offset)))
            except ObjectNotFound:
                crc = None
            if crc is not None and crc == after.last_crc:
                return None
            return (
                f"the entry before it (log offset {after.applied_offset}) is no longer the one this "
                "writer's state ends at (the store lost entries it had acknowledged); not sent again"
            )

        try:
            landed = create_sent(
                self.store,
                key,
                sends,
                attempts=self.resolve_attempts,
                backoff_s=self.resolve_backoff_s,
                sleep=self._sleep,
                before_resend=still_after,
            )
            if landed is not None:
                self._created = offset
            return landed
        except CreateOutcomeUnknown as e:
            raise OutcomeUnknown(self.topic, self.partition, offset, e.cause) from None

    # --- R5 claims ---

    def claim(
        self,
        state: sm.PartitionState,
        owner: str,
        mode: AccessMode,
        *,
        lease_ms: int = 60_000,
        wait_timeout_s: float = 60.0,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        sleep: Callable[[float], None] = time.sleep,
    ) -> Appended:
        """Take a claim. ``EXCLUSIVE`` fails at once with :class:`ClaimHeld` if another
        owner holds a live claim; ``WAIT_FOR_EXCLUSIVE`` polls until the holder
        releases or its lease runs out (or ``wait_timeout_s`` passes); ``SHARED``
        fails only while another owner holds a live exclusive claim. The verdict of
        the appended claim entry is final (another claimer may have won the race)."""
        deadline = time.monotonic() + wait_timeout_s

        def make(s: sm.PartitionState) -> Entry:
            now = clock_ms()
            others = [h for h in sm.live_holders(s, now) if h.owner != owner]
            if mode is AccessMode.SHARED:
                others = [h for h in others if h.mode is not AccessMode.SHARED]
            lapsed = [h for h in others if self._lapsed_by_store_clock(s, h, now)]
            others = [h for h in others if h not in lapsed]
            if others:
                h = others[0]
                raise ClaimHeld(self.topic, self.partition, h.owner, h.mode.value, h.lease_until_ms)
            return Claim(
                s.writer_epoch + 1, owner, mode, now + lease_ms, now, tuple((h.owner, h.writer_epoch) for h in lapsed)
            )

        while True:
            try:
                return self.append(state, make)
            except ClaimHeld as held:
                if mode is not AccessMode.WAIT_FOR_EXCLUSIVE or time.monotonic() >= deadline:
                    raise
                wait_s = max(0.05, min(1.0, (held.lease_until_ms - clock_ms()) / 1000))
                sleep(min(wait_s, max(0.0, deadline - time.monotonic())))
                state = self.catch_up(state)

    def _lapsed_by_store_clock(self, s: sm.PartitionState, h: sm.Holder, now_ms: int) -> bool:
        """Whether ``h``'s lease is over when timed from the moment the store wrote its
        claim entry (its modification time) rather than from the holder's own clock: a
        holder whose clock ran fast, and that died, must not block the partition past
        its lease. Costs one HEAD, only for a holder that blocks this claim."""
        if h.lease_ms <= 0:
            return False
        start = next((off for we, off in s.writer_epoch_starts if we == h.writer_epoch), None)
        if start is None:
            return False
        try:
            info = self.store.head(self.key(start))
        except (StoreError, OSError):
            return False
        return info is not None and now_ms >= info.mtime * 1000 + h.lease_ms

    def release(self, state: sm.PartitionState, owner: str, writer_epoch: int) -> Appended:
        return self.append(state, lambda s: Release(owner, writer_epoch))

    def release_held(self, owner: str) -> None:
        """Best effort: release every claim ``owner`` holds (a run's cleanup after a
        failure); a store in trouble leaves them to their leases."""
        try:
            st = self.read_state()
            for h in [h for h in st.holders if h.owner == owner]:
                st = self.release(st, owner, h.writer_epoch).outcome.state
        except CtpError:
            pass
