"""The partition state machine: a pure, deterministic fold over the state log.

``apply(state, offset, entry)`` returns the next state and a verdict; it does no I/O,
reads no clock and draws no random numbers, so every reader of a log reaches the same
state and the same verdict for every entry (R2), and replaying a log equals applying
it entry by entry.

Persisted fields are what a snapshot holds. The fence window (``max_seen_epoch``,
``oldest_accepted_epoch``) is volatile: it is never snapshotted and collapses to
``[max_applied_epoch]`` on recovery (R1).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from ctp_state import validate
from ctp_state.entries import (
    AccessMode,
    Advance,
    Claim,
    Entry,
    Init,
    Placeholder,
    Reconcile,
    Release,
)
from ctp_state.errors import (
    ClaimHeld,
    CorruptData,
    InvalidTransition,
    Rejected,
    StaleClusterEpoch,
    UnknownWriterEpoch,
    UnsupportedVersion,
    WriterFenced,
)

SNAPSHOT_VERSION = 1
SUPPORTED_SNAPSHOT_VERSIONS = (1,)
#: How many writer-epoch start offsets a partition remembers (for end-offset queries).
WRITER_EPOCH_HISTORY = 256


@dataclass(frozen=True, slots=True)
class Pending:
    """An accepted placeholder the reconciler has not lifted into L1 yet."""

    log_offset: int
    epoch: int
    l0_key: str
    byte_offset: int
    byte_length: int
    record_count: int
    crc32c: int
    base_offset: int  # record offset of the chunk's first record

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.record_count - 1


@dataclass(frozen=True, slots=True)
class Holder:
    owner: str
    mode: AccessMode
    writer_epoch: int
    lease_until_ms: int


@dataclass(frozen=True, slots=True)
class PartitionState:
    topic: str
    partition: int
    # --- persisted ---
    applied_offset: int = -1  # last log offset applied
    max_applied_epoch: int | None = None
    previous_applied_epoch: int | None = None
    epoch_window_offset: int = -1  # log offset at which max_applied_epoch took its value
    min_epoch_lower_bound: int | None = None
    last_reconciled_log_offset: int = -1
    last_reconciled_offset: int = -1  # record offset
    next_offset: int = 0  # next record offset
    writer_epoch: int = 0
    fence_floor: int = 0  # writer epoch of the newest exclusive claim
    holders: tuple[Holder, ...] = ()
    writer_epoch_starts: tuple[tuple[int, int], ...] = ()  # (writer epoch, log offset)
    pending: tuple[Pending, ...] = ()
    # --- volatile: the sliding fence window, never snapshotted ---
    max_seen_epoch: int | None = field(default=None, compare=False)
    oldest_accepted_epoch: int | None = field(default=None, compare=False)

    # -- derived views --

    @property
    def initialized(self) -> bool:
        return self.max_applied_epoch is not None

    @property
    def window(self) -> tuple[int, int] | None:
        """The fence window ``(oldest_accepted, latest_seen)``, or None before any epoch."""
        if self.max_seen_epoch is None:
            return None
        return (self.oldest_accepted_epoch, self.max_seen_epoch)  # type: ignore[return-value]

    @property
    def m(self) -> int | None:
        """M(p) = min_epoch_lower_bound - 1: every L0 epoch <= this is garbage for p (R3)."""
        return None if self.min_epoch_lower_bound is None else self.min_epoch_lower_bound - 1

    @property
    def lag_entries(self) -> int:
        return len(self.pending)

    @property
    def lag_bytes(self) -> int:
        return sum(p.byte_length for p in self.pending)

    @property
    def lag_records(self) -> int:
        return sum(p.record_count for p in self.pending)

    @property
    def persisted(self) -> PartitionState:
        """This state as a snapshot holds it: the window dropped."""
        return replace(self, max_seen_epoch=None, oldest_accepted_epoch=None)


@dataclass(frozen=True, slots=True)
class Outcome:
    state: PartitionState
    rejected: Rejected | None = None
    base_offset: int | None = None  # for an accepted placeholder

    @property
    def accepted(self) -> bool:
        return self.rejected is None


# --- the fold ---------------------------------------------------------------------------


def apply(state: PartitionState, offset: int, entry: Entry) -> Outcome:
    """Apply ``entry``, stored at log ``offset``, to ``state``. Pure.

    A rejected entry still advances ``applied_offset`` (it is in the log, it simply has
    no effect) and carries its verdict in ``Outcome.rejected``.
    """
    if offset != state.applied_offset + 1:
        raise ValueError(
            f"{state.topic}/{state.partition}: entry at offset {offset} applied after "
            f"offset {state.applied_offset}"
        )
    moved = replace(state, applied_offset=offset)
    try:
        if isinstance(entry, Init):
            return Outcome(_apply_init(moved, offset, entry))
        if not state.initialized:
            raise InvalidTransition(state.topic, state.partition, "partition is not initialized")
        if isinstance(entry, Placeholder):
            new, base = _apply_placeholder(moved, offset, entry)
            return Outcome(new, base_offset=base)
        if isinstance(entry, Reconcile):
            return Outcome(_apply_reconcile(moved, offset, entry))
        if isinstance(entry, Advance):
            return Outcome(_apply_advance(moved, offset, entry))
        if isinstance(entry, Claim):
            return Outcome(_apply_claim(moved, offset, entry))
        if isinstance(entry, Release):
            return Outcome(_apply_release(moved, entry))
    except Rejected as verdict:
        return Outcome(moved, rejected=verdict)
    raise TypeError(f"not an entry: {entry!r}")


def replay(state: PartitionState, first_offset: int, entries: list[Entry]) -> PartitionState:
    """Fold ``entries`` (stored from ``first_offset`` on) into ``state``."""
    for i, entry in enumerate(entries):
        state = apply(state, first_offset + i, entry).state
    return state


def _apply_init(s: PartitionState, offset: int, e: Init) -> PartitionState:
    if s.initialized or offset != 0:
        raise InvalidTransition(s.topic, s.partition, f"init entry at offset {offset} of an initialized log")
    return replace(
        s,
        max_applied_epoch=e.epoch,
        previous_applied_epoch=e.epoch,
        epoch_window_offset=offset,
        min_epoch_lower_bound=e.epoch,
        max_seen_epoch=e.epoch,
        oldest_accepted_epoch=e.epoch,
    )


def _check_writer(s: PartitionState, writer_epoch: int) -> None:
    if writer_epoch < s.fence_floor:
        raise WriterFenced(s.topic, s.partition, writer_epoch, s.fence_floor)
    if writer_epoch > s.writer_epoch:
        raise UnknownWriterEpoch(s.topic, s.partition, writer_epoch, s.writer_epoch)


def _check_exclusive(s: PartitionState, writer_epoch: int, what: str) -> None:
    _check_writer(s, writer_epoch)
    if writer_epoch != s.fence_floor or not any(h.writer_epoch == writer_epoch for h in s.holders):
        raise InvalidTransition(
            s.topic, s.partition, f"{what} needs a live exclusive claim, writer epoch {writer_epoch} holds none"
        )


def _slide_seen(s: PartitionState) -> PartitionState:
    """Keep the volatile window at or ahead of the applied epochs (entries written by
    other processes move the applied window; the fence window follows)."""
    latest = s.max_seen_epoch
    if latest is not None and latest >= s.max_applied_epoch:  # type: ignore[operator]
        return s
    oldest = max(s.oldest_accepted_epoch or 0, s.previous_applied_epoch)  # type: ignore[type-var]
    return replace(s, max_seen_epoch=s.max_applied_epoch, oldest_accepted_epoch=oldest)


def _apply_placeholder(s: PartitionState, offset: int, e: Placeholder) -> tuple[PartitionState, int]:
    if e.writer_epoch is not None:
        _check_writer(s, e.writer_epoch)
    # R2: deterministic, independent of any in-process fence.
    if e.epoch < s.previous_applied_epoch:  # type: ignore[operator]
        raise StaleClusterEpoch(
            s.topic, s.partition, e.epoch, (s.previous_applied_epoch, s.max_applied_epoch)  # type: ignore[arg-type]
        )
    if e.epoch > s.max_applied_epoch:  # type: ignore[operator]
        s = replace(
            s,
            previous_applied_epoch=s.max_applied_epoch,
            max_applied_epoch=e.epoch,
            epoch_window_offset=offset,
        )
    base = s.next_offset
    pending = Pending(offset, e.epoch, e.l0_key, e.byte_offset, e.byte_length, e.record_count, e.crc32c, base)
    s = replace(s, next_offset=base + e.record_count, pending=s.pending + (pending,))
    return _slide_seen(s), base


def allowed_lower_bound(s: PartitionState, through_log_offset: int) -> int:
    """R3: the highest ``min_epoch_lower_bound`` a reconcile through ``through_log_offset``
    may commit. Every placeholder after that offset has an epoch >= the previous
    applied epoch as of that offset; we know that value exactly only when the applied
    window has not moved since, otherwise the bound stays where it is."""
    if s.epoch_window_offset <= through_log_offset:
        return max(s.previous_applied_epoch, s.min_epoch_lower_bound)  # type: ignore[type-var]
    return s.min_epoch_lower_bound  # type: ignore[return-value]


def _apply_reconcile(s: PartitionState, offset: int, e: Reconcile) -> PartitionState:
    _check_exclusive(s, e.writer_epoch, "reconcile")
    if not (s.last_reconciled_log_offset <= e.through_log_offset < offset):
        raise InvalidTransition(
            s.topic,
            s.partition,
            f"reconcile through log offset {e.through_log_offset} is outside "
            f"[{s.last_reconciled_log_offset}, {offset - 1}]",
        )
    covered = [p for p in s.pending if p.log_offset <= e.through_log_offset]
    expected_last = covered[-1].last_offset if covered else s.last_reconciled_offset
    if e.last_record_offset != expected_last:
        raise InvalidTransition(
            s.topic,
            s.partition,
            f"reconcile claims records through offset {e.last_record_offset}, "
            f"the log has them through {expected_last}",
        )
    allowed = allowed_lower_bound(s, e.through_log_offset)
    if not (s.min_epoch_lower_bound <= e.min_epoch_lower_bound <= allowed):  # type: ignore[operator]
        raise InvalidTransition(
            s.topic,
            s.partition,
            f"min_epoch_lower_bound {e.min_epoch_lower_bound} is outside "
            f"[{s.min_epoch_lower_bound}, {allowed}] (R3: it never decreases and never "
            "passes the previous applied epoch)",
        )
    return replace(
        s,
        last_reconciled_log_offset=e.through_log_offset,
        last_reconciled_offset=e.last_record_offset,
        min_epoch_lower_bound=e.min_epoch_lower_bound,
        pending=s.pending[len(covered) :],
    )


def _apply_advance(s: PartitionState, offset: int, e: Advance) -> PartitionState:
    _check_exclusive(s, e.writer_epoch, "advance")
    if s.pending:
        raise InvalidTransition(
            s.topic, s.partition, f"advance to epoch {e.epoch} while {len(s.pending)} placeholders await reconcile"
        )
    if e.epoch < s.max_applied_epoch:  # type: ignore[operator]
        raise InvalidTransition(
            s.topic, s.partition, f"advance to epoch {e.epoch} below the applied epoch {s.max_applied_epoch}"
        )
    # Caught up at this offset: every later placeholder must carry an epoch >= e.epoch,
    # so the lower bound may follow. The window collapses as on recovery.
    return replace(
        s,
        max_applied_epoch=e.epoch,
        previous_applied_epoch=e.epoch,
        epoch_window_offset=offset,
        min_epoch_lower_bound=max(e.epoch, s.min_epoch_lower_bound),  # type: ignore[type-var]
        last_reconciled_log_offset=offset,
        max_seen_epoch=e.epoch,
        oldest_accepted_epoch=e.epoch,
    )


def live_holders(s: PartitionState, now_ms: int) -> tuple[Holder, ...]:
    return tuple(h for h in s.holders if h.lease_until_ms > now_ms)


def _apply_claim(s: PartitionState, offset: int, e: Claim) -> PartitionState:
    if e.writer_epoch != s.writer_epoch + 1:
        raise InvalidTransition(
            s.topic, s.partition, f"claim for writer epoch {e.writer_epoch}, expected {s.writer_epoch + 1}"
        )
    exclusive = e.mode is not AccessMode.SHARED
    others = tuple(h for h in live_holders(s, e.now_ms) if h.owner != e.owner)
    blocking = others if exclusive else tuple(h for h in others if h.mode is not AccessMode.SHARED)
    if blocking:
        h = blocking[0]
        raise ClaimHeld(s.topic, s.partition, h.owner, h.mode.value, h.lease_until_ms)
    holder = Holder(e.owner, AccessMode.EXCLUSIVE if exclusive else AccessMode.SHARED, e.writer_epoch, e.lease_until_ms)
    starts = (s.writer_epoch_starts + ((e.writer_epoch, offset),))[-WRITER_EPOCH_HISTORY:]
    return replace(
        s,
        writer_epoch=e.writer_epoch,
        fence_floor=e.writer_epoch if exclusive else s.fence_floor,
        holders=others + (holder,),
        writer_epoch_starts=starts,
    )


def _apply_release(s: PartitionState, e: Release) -> PartitionState:
    kept = tuple(h for h in s.holders if not (h.owner == e.owner and h.writer_epoch == e.writer_epoch))
    if len(kept) == len(s.holders):
        raise InvalidTransition(
            s.topic, s.partition, f"release by {e.owner!r} of writer epoch {e.writer_epoch}, which it does not hold"
        )
    return replace(s, holders=kept)


def end_offset_of_writer_epoch(s: PartitionState, writer_epoch: int) -> int:
    """The log offset one past the last entry written under ``writer_epoch``, as Kafka's
    OffsetForLeaderEpoch: the start of the next newer writer epoch, or the log end."""
    if writer_epoch > s.writer_epoch:
        raise UnknownWriterEpoch(s.topic, s.partition, writer_epoch, s.writer_epoch)
    if s.writer_epoch_starts and writer_epoch < s.writer_epoch_starts[0][0] - 1:
        raise InvalidTransition(
            s.topic, s.partition, f"writer epoch {writer_epoch} is older than the retained history"
        )
    for we, start in s.writer_epoch_starts:
        if we > writer_epoch:
            return start
    return s.applied_offset + 1


# --- R1: the fence window, as pure functions (the lock lives in ctp_state.fence) ---------

IN_WINDOW, NEWER, STALE = "in_window", "newer", "stale"


def classify(s: PartitionState, epoch: int) -> str:
    w = s.window
    if w is None or epoch > w[1]:
        return NEWER
    if epoch >= w[0]:
        return IN_WINDOW
    return STALE


def slide(s: PartitionState, epoch: int) -> PartitionState:
    """Move the window for a newer epoch: the old latest becomes the oldest accepted."""
    w = s.window
    oldest = epoch if w is None else w[1]
    return replace(s, max_seen_epoch=epoch, oldest_accepted_epoch=oldest)


def recover(s: PartitionState) -> PartitionState:
    """After recovery the window collapses to ``[max_applied_epoch]``."""
    return replace(s, max_seen_epoch=s.max_applied_epoch, oldest_accepted_epoch=s.max_applied_epoch)


# --- snapshots ----------------------------------------------------------------------------


def encode_snapshot(s: PartitionState) -> bytes:
    body: dict[str, Any] = {
        "v": SNAPSHOT_VERSION,
        "topic": s.topic,
        "partition": s.partition,
        "applied_offset": s.applied_offset,
        "max_applied_epoch": s.max_applied_epoch,
        "previous_applied_epoch": s.previous_applied_epoch,
        "epoch_window_offset": s.epoch_window_offset,
        "min_epoch_lower_bound": s.min_epoch_lower_bound,
        "last_reconciled_log_offset": s.last_reconciled_log_offset,
        "last_reconciled_offset": s.last_reconciled_offset,
        "next_offset": s.next_offset,
        "writer_epoch": s.writer_epoch,
        "fence_floor": s.fence_floor,
        "holders": [[h.owner, h.mode.value, h.writer_epoch, h.lease_until_ms] for h in s.holders],
        "writer_epoch_starts": [list(x) for x in s.writer_epoch_starts],
        "pending": [
            [p.log_offset, p.epoch, p.l0_key, p.byte_offset, p.byte_length, p.record_count, p.crc32c, p.base_offset]
            for p in s.pending
        ],
    }
    return json.dumps(body, separators=(",", ":")).encode()


def decode_snapshot(data: bytes, key: str) -> PartitionState:
    """Decode a snapshot into a recovered state (window collapsed)."""
    try:
        b = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptData(key, f"snapshot is not valid JSON ({e})") from None
    if not isinstance(b, dict):
        raise CorruptData(key, "snapshot is not a JSON object")
    if b.get("v") not in SUPPORTED_SNAPSHOT_VERSIONS:
        raise UnsupportedVersion(key, "snapshot", b.get("v"), SUPPORTED_SNAPSHOT_VERSIONS)
    try:
        opt = lambda name: None if b[name] is None else validate.int64(b[name], what=name, minimum=1)  # noqa: E731
        num = lambda name, lo=-1: validate.int64(b[name], what=name, minimum=lo)  # noqa: E731
        s = PartitionState(
            topic=validate.topic_name(b["topic"]),
            partition=num("partition", 0),
            applied_offset=num("applied_offset"),
            max_applied_epoch=opt("max_applied_epoch"),
            previous_applied_epoch=opt("previous_applied_epoch"),
            epoch_window_offset=num("epoch_window_offset"),
            min_epoch_lower_bound=opt("min_epoch_lower_bound"),
            last_reconciled_log_offset=num("last_reconciled_log_offset"),
            last_reconciled_offset=num("last_reconciled_offset"),
            next_offset=num("next_offset", 0),
            writer_epoch=num("writer_epoch", 0),
            fence_floor=num("fence_floor", 0),
            holders=tuple(Holder(o, AccessMode(m), int(we), int(lu)) for o, m, we, lu in b["holders"]),
            writer_epoch_starts=tuple((int(we), int(off)) for we, off in b["writer_epoch_starts"]),
            pending=tuple(
                Pending(int(a), int(e), str(k), int(bo), int(bl), int(rc), int(c), int(base))
                for a, e, k, bo, bl, rc, c, base in b["pending"]
            ),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptData(key, f"malformed snapshot: {e}") from None
    return recover(s)
