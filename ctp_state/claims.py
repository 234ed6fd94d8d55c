"""The claim rules of the fold (R5, R6): who may write under which writer epoch.

A claim takes the next writer epoch and, when exclusive, fences every older one
(``fence_floor``); a release, or an entry that names its owner, gives it up; a tick is a
claim taken and given up around an advance in one entry. The entries that act under a
claim (reconcile, advance, compact, trim) are checked here for a live exclusive claim of
their writer epoch. Pure, like the rest of the fold (:func:`ctp_state.state.apply`,
which dispatches to these).
"""

from __future__ import annotations

from ctp_state.entries import AccessMode, Claim, Release, Tick
from ctp_state.errors import ClaimHeld, InvalidTransition, UnknownWriterEpoch, WriterFenced
from ctp_state.partition_state import Holder, PartitionState, evolve

#: How many writer-epoch start offsets a partition remembers (for end-offset queries).
WRITER_EPOCH_HISTORY = 256


def check_writer(s: PartitionState, writer_epoch: int) -> None:
    if writer_epoch < s.fence_floor:
        raise WriterFenced(s.topic, s.partition, writer_epoch, s.fence_floor)
    if writer_epoch > s.writer_epoch:
        raise UnknownWriterEpoch(s.topic, s.partition, writer_epoch, s.writer_epoch)


def check_exclusive(s: PartitionState, writer_epoch: int, what: str) -> None:
    check_writer(s, writer_epoch)
    if writer_epoch != s.fence_floor or not any(h.writer_epoch == writer_epoch for h in s.holders):
        raise InvalidTransition(
            s.topic, s.partition, f"{what} needs a live exclusive claim, writer epoch {writer_epoch} holds none"
        )


def apply_tick(s: PartitionState, offset: int, e: Tick) -> PartitionState:
    """R5 + R6 in one entry (see :class:`~ctp_state.entries.Tick`): a claim taken and
    given up around an advance. Judged as that claim would be, but stricter: any holder,
    live or lapsed, refuses it (the claim path, with its lease takeovers, is for those)."""
    if s.holders:
        h = s.holders[0]
        raise ClaimHeld(s.topic, s.partition, h.owner, h.mode.value, h.lease_until_ms)
    if e.writer_epoch != s.writer_epoch + 1:
        raise InvalidTransition(
            s.topic, s.partition, f"tick for writer epoch {e.writer_epoch}, expected {s.writer_epoch + 1}"
        )
    if s.pending:
        raise InvalidTransition(
            s.topic, s.partition, f"tick to epoch {e.epoch} while {len(s.pending)} placeholders await reconcile"
        )
    if e.epoch < s.max_applied_epoch or e.epoch <= s.min_epoch_lower_bound:  # type: ignore[operator]
        raise InvalidTransition(
            s.topic,
            s.partition,
            f"tick to epoch {e.epoch} does not move the partition on (applied epoch {s.max_applied_epoch}, "
            f"lower bound {s.min_epoch_lower_bound})",
        )
    starts = (s.writer_epoch_starts + ((e.writer_epoch, offset),))[-WRITER_EPOCH_HISTORY:]
    return evolve(
        s,
        applied_offset=offset,
        writer_epoch=e.writer_epoch,
        fence_floor=e.writer_epoch,
        writer_epoch_starts=starts,
        max_applied_epoch=e.epoch,
        previous_applied_epoch=e.epoch,
        epoch_window_offset=offset,
        min_epoch_lower_bound=e.epoch,
        last_reconciled_log_offset=offset,
        max_seen_epoch=e.epoch,
        oldest_accepted_epoch=e.epoch,
    )


def live_holders(s: PartitionState, now_ms: int) -> tuple[Holder, ...]:
    return tuple(h for h in s.holders if h.lease_until_ms > now_ms)


def apply_claim(s: PartitionState, offset: int, e: Claim) -> PartitionState:
    if e.writer_epoch != s.writer_epoch + 1:
        raise InvalidTransition(
            s.topic, s.partition, f"claim for writer epoch {e.writer_epoch}, expected {s.writer_epoch + 1}"
        )
    exclusive = e.mode is not AccessMode.SHARED
    lapsed = set(e.expired)  # holders the claimer found lapsed by the store's clock
    others = tuple(
        h for h in live_holders(s, e.now_ms) if h.owner != e.owner and (h.owner, h.writer_epoch) not in lapsed
    )
    blocking = others if exclusive else tuple(h for h in others if h.mode is not AccessMode.SHARED)
    if blocking:
        h = blocking[0]
        raise ClaimHeld(s.topic, s.partition, h.owner, h.mode.value, h.lease_until_ms)
    holder = Holder(
        e.owner,
        AccessMode.EXCLUSIVE if exclusive else AccessMode.SHARED,
        e.writer_epoch,
        e.lease_until_ms,
        max(0, e.lease_until_ms - e.now_ms),
    )
    starts = (s.writer_epoch_starts + ((e.writer_epoch, offset),))[-WRITER_EPOCH_HISTORY:]
    return evolve(
        s,
        applied_offset=offset,
        writer_epoch=e.writer_epoch,
        fence_floor=e.writer_epoch if exclusive else s.fence_floor,
        holders=others + (holder,),
        writer_epoch_starts=starts,
    )


def apply_release(s: PartitionState, offset: int, e: Release) -> PartitionState:
    return evolve(s, applied_offset=offset, holders=released(s, e.owner, e.writer_epoch, "release"))


def released(s: PartitionState, owner: str | None, writer_epoch: int, what: str) -> tuple[Holder, ...]:
    """The holders once ``owner`` gives up its claim under ``writer_epoch`` (all of them
    when ``owner`` is None: the entry releases nothing). The whole entry is rejected if
    that claim is not held: a reconcile or advance naming the wrong owner changes
    nothing, as such a release would not."""
    if owner is None:
        return s.holders
    kept = tuple(h for h in s.holders if not (h.owner == owner and h.writer_epoch == writer_epoch))
    if len(kept) == len(s.holders):
        raise InvalidTransition(
            s.topic,
            s.partition,
            f"release by {owner!r} of writer epoch {writer_epoch}, which it does not hold"
            + ("" if what == "release" else f" (in a {what} entry)"),
        )
    return kept


def end_offset_of_writer_epoch(s: PartitionState, writer_epoch: int) -> int:
    """The log offset one past the last entry written under ``writer_epoch``, as Kafka's
    OffsetForLeaderEpoch: the start of the next newer writer epoch, or the log end."""
    if writer_epoch > s.writer_epoch:
        raise UnknownWriterEpoch(s.topic, s.partition, writer_epoch, s.writer_epoch)
    if s.writer_epoch_starts and writer_epoch < s.writer_epoch_starts[0][0] - 1:
        raise InvalidTransition(s.topic, s.partition, f"writer epoch {writer_epoch} is older than the retained history")
    for we, start in s.writer_epoch_starts:
        if we > writer_epoch:
            return start
    return s.applied_offset + 1
