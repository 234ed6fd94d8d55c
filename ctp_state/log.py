"""The partition state log in the object store: dense, append-only, with snapshots.

An append is a create-if-absent of the key for the next offset, so two writers can
never both win an offset. The loser reads the entries it missed, re-applies them, and
retries with an entry rebuilt from the fresher state, a bounded number of times.

Reading a partition's current state costs one GET (the newest snapshot), one LIST
(entries after it) and one GET per tail entry; whoever sees a tail of
``snapshot_every`` entries or more writes a new snapshot, so the tail stays short.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ctp_state import entries as en
from ctp_state import layout
from ctp_state import state as sm
from ctp_state.entries import AccessMode, Claim, Entry, Release
from ctp_state.errors import ClaimHeld, ContentionTimeout, CorruptData, KeyExists, LogGap, ObjectNotFound
from ctp_state.store import ObjectStore

DEFAULT_SNAPSHOT_EVERY = 64
DEFAULT_APPEND_ATTEMPTS = 64


@dataclass(frozen=True, slots=True)
class Appended:
    offset: int
    outcome: sm.Outcome


class PartitionLog:
    """I/O for one partition's log. Holds no state of its own except the offset of the
    newest snapshot it knows of; thread-safe."""

    def __init__(
        self,
        store: ObjectStore,
        topic: str,
        partition: int,
        *,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
        max_attempts: int = DEFAULT_APPEND_ATTEMPTS,
    ):
        self.store, self.topic, self.partition = store, topic, partition
        self.prefix = layout.log_prefix(topic, partition)
        self.snapshot_every = snapshot_every
        self.max_attempts = max_attempts
        self._snapshot_offset = -1

    def key(self, offset: int) -> str:
        return layout.log_entry(self.topic, self.partition, offset)

    def empty_state(self) -> sm.PartitionState:
        return sm.PartitionState(self.topic, self.partition)

    # --- reading ---

    def read_snapshot(self) -> sm.PartitionState:
        key = layout.snapshot(self.topic, self.partition)
        try:
            data = self.store.get(key)
        except ObjectNotFound:
            return self.empty_state()
        st = sm.decode_snapshot(data, key)
        if (st.topic, st.partition) != (self.topic, self.partition):
            raise CorruptData(key, f"snapshot belongs to {st.topic}/{st.partition}")
        self._snapshot_offset = max(self._snapshot_offset, st.applied_offset)
        return st

    def read_state(self) -> sm.PartitionState:
        """The current state, recovered: from the newest snapshot plus the tail."""
        return self.catch_up(self.read_snapshot())

    def entries(self, after: int = -1) -> Iterator[tuple[int, Entry]]:
        """Yield ``(offset, entry)`` for every entry after log offset ``after``."""
        start_after = self.key(after) if after >= 0 else None
        expected = after + 1
        for info in self.store.list(self.prefix, start_after=start_after):
            offset = layout.log_offset_of(info.key, self.prefix)
            if offset != expected:
                raise LogGap(info.key, expected, offset)
            yield offset, en.decode(self.store.get(info.key), info.key)
            expected += 1

    def catch_up(self, state: sm.PartitionState) -> sm.PartitionState:
        """Apply every entry after ``state.applied_offset``; snapshot if the tail was long."""
        for offset, entry in self.entries(state.applied_offset):
            state = sm.apply(state, offset, entry).state
        self._maybe_snapshot(state)
        return state

    def _maybe_snapshot(self, state: sm.PartitionState) -> None:
        if state.applied_offset - self._snapshot_offset >= self.snapshot_every:
            self.write_snapshot(state)

    def write_snapshot(self, state: sm.PartitionState) -> None:
        # A plain overwrite is safe: snapshots are deterministic and a racing writer
        # that installs an older one only makes the next reader's tail longer.
        self.store.put(layout.snapshot(self.topic, self.partition), sm.encode_snapshot(state))
        self._snapshot_offset = max(self._snapshot_offset, state.applied_offset)

    # --- appending ---

    def append(
        self,
        state: sm.PartitionState,
        make_entry: Callable[[sm.PartitionState], Entry],
    ) -> Appended:
        """Append ``make_entry(state)`` at the next offset, catching up and rebuilding
        the entry on every lost race. Returns the offset and the verdict of ``apply``.

        Idempotent under retried requests: if the contested offset holds exactly the
        bytes we tried to write (our own PUT whose response was lost), it is ours.
        """
        for _ in range(self.max_attempts):
            entry = make_entry(state)
            data = en.encode(entry)
            offset = state.applied_offset + 1
            try:
                self.store.put_if_absent(self.key(offset), data)
            except KeyExists:
                key = self.key(offset)
                if self.store.get(key) == data:
                    outcome = sm.apply(state, offset, entry)
                    self._maybe_snapshot(outcome.state)
                    return Appended(offset, outcome)
                state = self.catch_up(state)
                continue
            outcome = sm.apply(state, offset, entry)
            self._maybe_snapshot(outcome.state)
            return Appended(offset, outcome)
        raise ContentionTimeout(f"append to {self.topic}/{self.partition}", self.max_attempts)

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
            if others:
                h = others[0]
                raise ClaimHeld(self.topic, self.partition, h.owner, h.mode.value, h.lease_until_ms)
            return Claim(s.writer_epoch + 1, owner, mode, now + lease_ms, now)

        while True:
            try:
                return self.append(state, make)
            except ClaimHeld as held:
                if mode is not AccessMode.WAIT_FOR_EXCLUSIVE or time.monotonic() >= deadline:
                    raise
                wait_s = max(0.05, min(1.0, (held.lease_until_ms - clock_ms()) / 1000))
                sleep(min(wait_s, max(0.0, deadline - time.monotonic())))
                state = self.catch_up(state)

    def release(self, state: sm.PartitionState, owner: str, writer_epoch: int) -> Appended:
        return self.append(state, lambda s: Release(owner, writer_epoch))
