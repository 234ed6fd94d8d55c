"""The partition state machine: a pure, deterministic fold over the state log.

``apply(state, offset, entry)`` returns the next state and a verdict; it does no I/O,
reads no clock and draws no random numbers, so every reader of a log reaches the same
state and the same verdict for every entry (R2), and replaying a log equals applying
it entry by entry.

Persisted fields are what a snapshot holds. The fence window (``max_seen_epoch``,
``oldest_accepted_epoch``) is volatile: it is never snapshotted and collapses to
``[max_applied_epoch]`` on recovery (R1).

Besides the epochs, the state keeps what readers need without replaying the log from
its start: the committed L1 files (as the last offset of each; they tile the records
from offset 0 to the last reconciled one) and, per idempotent producer, the sequence
numbers it has had applied (R8), so a re-sent batch is recognised and dropped.

The fold is this module's ``apply`` and the rules of the data entries (placeholders
with R2 and R9, reconciles with R3, advances, compactions and trims with R11); the
claim rules every writer entry is checked against (R5, R6: who writes under which
writer epoch, and the tick) are :mod:`ctp_state.claims`, and what a partition
remembers of its producers (R8: re-sends known by their sequence numbers) is
:mod:`ctp_state.producer_memory`. What is not the fold lives
apart: the state's types and the views readers take of them in
:mod:`ctp_state.partition_state`, the fence window in :mod:`ctp_state.window`, the
snapshot codec in :mod:`ctp_state.snapshot`.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from ctp_state import claims, layout, producer_memory

# The claim rules' views, which readers name from here too.
from ctp_state.claims import (
    WRITER_EPOCH_HISTORY as WRITER_EPOCH_HISTORY,
    end_offset_of_writer_epoch as end_offset_of_writer_epoch,
    live_holders as live_holders,
)
from ctp_state.entries import (
    Advance,
    Claim,
    Compact,
    Entry,
    Init,
    Placeholder,
    Reconcile,
    Release,
    Seal,
    Tick,
    Trim,
    TrimReason,
)
from ctp_state.errors import (
    CorruptData,
    EntryForked,
    EntryOutOfOrder,
    InvalidTransition,
    LogForked,
    OutOfOrderSequence,
    PartitionSealed,
    Rejected,
    StaleClusterEpoch,
)

# The types the fold folds, which readers name from here too (explicitly re-exported).
from ctp_state.partition_state import (
    Holder as Holder,
    PartitionState as PartitionState,
    Pending as Pending,
    ProducerBatch as ProducerBatch,
    ProducerSeq as ProducerSeq,
    ending_at as ending_at,
    evolve as evolve,
)


@dataclass(frozen=True, slots=True)
class Outcome:
    state: PartitionState
    rejected: Rejected | None = None
    base_offset: int | None = None  # for an accepted placeholder (None: a duplicate too old to know)
    duplicate: bool = False  # R8: a re-sent batch already applied; nothing changed

    @property
    def accepted(self) -> bool:
        return self.rejected is None


# --- the fold ---------------------------------------------------------------------------


#: The entries that act under a claim's writer epoch without naming the claim: one
#: written after another log than this one (``forked``) may be under another
#: claimer's epoch of the same number (the store lost the claim it was written under).
_UNDER_CLAIM = (Reconcile, Advance, Compact, Trim)


def apply(state: PartitionState, offset: int, entry: Entry, *, forked: bool = False) -> Outcome:
    """Apply ``entry``, stored at log ``offset``, to ``state``. Pure.

    A rejected entry still advances ``applied_offset`` (it is in the log, it simply has
    no effect) and carries its verdict in ``Outcome.rejected``. ``forked``: the entry
    names (``prev``) another entry than the one the log holds before it -- a reconcile,
    advance, compact or trim entry is then rejected (:class:`EntryForked`); a
    placeholder, acknowledged data, stops the fold (:class:`LogForked`: the log does not
    read until it is restored); any other kind is judged as ever (a claim or tick takes
    the next writer epoch, which the fold checks).
    """
    if offset != state.applied_offset + 1:
        raise EntryOutOfOrder(state.topic, state.partition, offset, state.applied_offset)
    if forked and isinstance(entry, _UNDER_CLAIM) and not state.sealed:
        return Outcome(evolve(state, applied_offset=offset), rejected=EntryForked(state.topic, state.partition, offset))
    if forked and isinstance(entry, Placeholder) and not state.sealed:
        # Acknowledged data written after an entry the store has since lost or replaced:
        # judged now, it may be refused (its sequence and its epoch's window followed
        # the lost entry), and the lost entry's own data is still in L0. The log does
        # not read until it is restored, so nothing more is lost.
        raise LogForked(state.topic, state.partition, offset)
    # Each _apply_* checks ``state`` and returns it copied once, with ``applied_offset``
    # moved to ``offset`` and its own changes (a replay copies a state per entry).
    try:
        if state.sealed:
            if isinstance(entry, Seal):
                return Outcome(evolve(state, applied_offset=offset))  # sealed once is enough
            raise PartitionSealed(state.topic, state.partition)
        if isinstance(entry, Placeholder):  # by far the commonest entry
            if not state.initialized:
                raise InvalidTransition(state.topic, state.partition, "partition is not initialized")
            new, base, duplicate = _apply_placeholder(state, offset, entry)
            return Outcome(new, base_offset=base, duplicate=duplicate)
        if isinstance(entry, Init):
            return Outcome(_apply_init(state, offset, entry))
        if not state.initialized:
            raise InvalidTransition(state.topic, state.partition, "partition is not initialized")
        if isinstance(entry, Reconcile):
            return Outcome(_apply_reconcile(state, offset, entry))
        if isinstance(entry, Advance):
            return Outcome(_apply_advance(state, offset, entry))
        if isinstance(entry, Tick):
            return Outcome(claims.apply_tick(state, offset, entry))
        if isinstance(entry, Claim):
            return Outcome(claims.apply_claim(state, offset, entry))
        if isinstance(entry, Release):
            return Outcome(claims.apply_release(state, offset, entry))
        if isinstance(entry, Seal):
            return Outcome(evolve(state, applied_offset=offset, sealed=True))
        if isinstance(entry, Compact):
            return Outcome(_apply_compact(state, offset, entry))
        if isinstance(entry, Trim):
            return Outcome(_apply_trim(state, offset, entry))
    except Rejected as verdict:
        return Outcome(evolve(state, applied_offset=offset), rejected=verdict)
    raise TypeError(f"not an entry: {entry!r}")


def replay(state: PartitionState, first_offset: int, entries: list[Entry]) -> PartitionState:
    """Fold ``entries`` (stored from ``first_offset`` on) into ``state``."""
    for i, entry in enumerate(entries):
        state = apply(state, first_offset + i, entry).state
    return state


def _apply_init(s: PartitionState, offset: int, e: Init) -> PartitionState:
    # The first init initializes the log. Writers put it at offset 0 and never write
    # anything else there (ctp_state.partition_log); an init at a later offset exists only in a
    # log an older ctp damaged, written by `ctp topic create` to repair it. Every entry
    # before it was rejected ("not initialized"), so nothing it follows ever took effect.
    if s.initialized:
        raise InvalidTransition(s.topic, s.partition, f"init entry at offset {offset} of an initialized log")
    return evolve(
        s,
        applied_offset=offset,
        max_applied_epoch=e.epoch,
        previous_applied_epoch=e.epoch,
        epoch_window_offset=offset,
        min_epoch_lower_bound=e.epoch,
        max_seen_epoch=e.epoch,
        oldest_accepted_epoch=e.epoch,
    )


def _apply_placeholder(s: PartitionState, offset: int, e: Placeholder) -> tuple[PartitionState, int | None, bool]:
    if e.writer_epoch is not None:
        claims.check_writer(s, e.writer_epoch)
    # R9: the key must say the same epoch, or the GC's listing (by key) and M (by the
    # entry) would disagree about this chunk.
    try:
        key_epoch: int | None = layout.parse_l0_key(e.l0_key)[1]
    except CorruptData:
        key_epoch = None
    if key_epoch != e.epoch:
        raise InvalidTransition(
            s.topic,
            s.partition,
            f"placeholder for epoch {e.epoch} points at {e.l0_key!r}, which is not an L0 key of that epoch",
        )
    known = producer_memory.known(s, e.producer_id)
    if known is not None:
        dup = producer_memory.duplicate_of(s, known, e)
        if dup is not None:
            return evolve(s, applied_offset=offset), dup[0], True
    # A producer the partition does not know (new, or forgotten after MAX_PRODUCERS
    # others wrote) starts wherever it is: its sequence is learned from this batch.
    # R2: deterministic, independent of any in-process fence.
    if e.epoch < s.previous_applied_epoch:  # type: ignore[operator]
        raise StaleClusterEpoch(
            s.topic,
            s.partition,
            e.epoch,
            (s.previous_applied_epoch, s.max_applied_epoch),  # type: ignore[arg-type]
        )
    if known is not None and e.sequence != known.last_seq + 1:
        raise OutOfOrderSequence(s.topic, s.partition, known.producer_id, e.sequence, known.last_seq + 1)  # type: ignore[arg-type]
    previous, latest, window_offset = s.previous_applied_epoch, s.max_applied_epoch, s.epoch_window_offset
    if e.epoch > latest:  # type: ignore[operator]
        previous, latest, window_offset = latest, e.epoch, offset
    base = s.next_offset
    pending = Pending(offset, e.epoch, e.l0_key, e.byte_offset, e.byte_length, e.record_count, e.crc32c, base)
    table = s.producers if e.producer_id is None else producer_memory.remember(s.producers, latest, known, e, base)  # type: ignore[arg-type]
    # Keep the volatile window at or ahead of the applied epochs (entries written by
    # other processes move the applied window; the fence window follows).
    seen, oldest = s.max_seen_epoch, s.oldest_accepted_epoch
    if seen is None or seen < latest:  # type: ignore[operator]
        seen, oldest = latest, max(oldest or 0, previous)  # type: ignore[type-var]
    new = evolve(
        s,
        applied_offset=offset,
        previous_applied_epoch=previous,
        max_applied_epoch=latest,
        epoch_window_offset=window_offset,
        next_offset=base + e.record_count,
        pending=s.pending + (pending,),
        producers=table,
        max_seen_epoch=seen,
        oldest_accepted_epoch=oldest,
    )
    return new, base, False


def allowed_lower_bound(s: PartitionState, through_log_offset: int) -> int:
    """R3: the highest ``min_epoch_lower_bound`` a reconcile through ``through_log_offset``
    may commit. Every placeholder after that offset has an epoch >= the previous
    applied epoch as of that offset; we know that value exactly only when the applied
    window has not moved since, otherwise the bound stays where it is."""
    if s.epoch_window_offset <= through_log_offset:
        assert s.previous_applied_epoch is not None and s.min_epoch_lower_bound is not None  # initialized
        return max(s.previous_applied_epoch, s.min_epoch_lower_bound)
    assert s.min_epoch_lower_bound is not None  # initialized
    return s.min_epoch_lower_bound


def _apply_reconcile(s: PartitionState, offset: int, e: Reconcile) -> PartitionState:
    claims.check_exclusive(s, e.writer_epoch, "reconcile")
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
            f"reconcile claims records through offset {e.last_record_offset}, the log has them through {expected_last}",
        )
    ends = _l1_ends_of(s, e)
    allowed = allowed_lower_bound(s, e.through_log_offset)
    if not (s.min_epoch_lower_bound <= e.min_epoch_lower_bound <= allowed):  # type: ignore[operator]
        raise InvalidTransition(
            s.topic,
            s.partition,
            f"min_epoch_lower_bound {e.min_epoch_lower_bound} is outside "
            f"[{s.min_epoch_lower_bound}, {allowed}] (R3: it never decreases and never "
            "passes the previous applied epoch)",
        )
    return evolve(
        s,
        applied_offset=offset,
        holders=claims.released(s, e.release_owner, e.writer_epoch, "reconcile"),
        last_reconciled_log_offset=e.through_log_offset,
        last_reconciled_offset=e.last_record_offset,
        min_epoch_lower_bound=e.min_epoch_lower_bound,
        pending=s.pending[len(covered) :],
        l1_ends=s.l1_ends + ends,
        l1_crcs=s.l1_crcs + (tuple(e.l1_crc32c) if e.l1_crc32c else (None,) * len(ends)),
        l1_tags=s.l1_tags + (0,) * len(ends) if s.l1_tags else (),
    )


def _l1_ends_of(s: PartitionState, e: Reconcile) -> tuple[int, ...]:
    """R9: a reconcile's L1 files must be this partition's and tile the records it
    covers, each starting where the previous ended; their last offsets."""
    first, ends = s.last_reconciled_offset + 1, []
    for key in e.l1_keys:
        try:
            name = layout.parse_l1_key(key)
        except CorruptData:
            name = layout.L1Name("", None, -1, -1, -1)
        if (name.topic, name.topic_id, name.partition, name.first, name.compacted_by) != (
            s.topic,
            s.topic_id,
            s.partition,
            first,
            0,
        ):
            raise InvalidTransition(
                s.topic,
                s.partition,
                f"reconcile names L1 file {key!r}, expected one of "
                f"{layout.l1_partition_prefix(s.topic, s.partition, s.topic_id)} starting at offset {first}",
            )
        hi = name.last
        ends.append(hi)
        first = hi + 1
    if first - 1 != e.last_record_offset:
        raise InvalidTransition(
            s.topic,
            s.partition,
            f"reconcile's L1 files end at offset {first - 1}, it claims records through {e.last_record_offset}",
        )
    return tuple(ends)


def _apply_advance(s: PartitionState, offset: int, e: Advance) -> PartitionState:
    claims.check_exclusive(s, e.writer_epoch, "advance")
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
    return evolve(
        s,
        applied_offset=offset,
        holders=claims.released(s, e.release_owner, e.writer_epoch, "advance"),
        max_applied_epoch=e.epoch,
        previous_applied_epoch=e.epoch,
        epoch_window_offset=offset,
        min_epoch_lower_bound=max(e.epoch, s.min_epoch_lower_bound),  # type: ignore[type-var]
        last_reconciled_log_offset=offset,
        max_seen_epoch=e.epoch,
        oldest_accepted_epoch=e.epoch,
    )


def _apply_compact(s: PartitionState, offset: int, e: Compact) -> PartitionState:
    """R11: a run of adjacent committed files is replaced by one file holding exactly
    their records. The entry must name the run as the state commits it (keys and
    CRC32C), and the new file by the key its writer epoch gives it."""
    claims.check_exclusive(s, e.writer_epoch, "compact")
    files = s.committed_l1_files()
    firsts = [f.first for f in files]
    i = bisect.bisect_left(firsts, e.first_offset)
    j = i + len(e.replaced) - 1
    run = files[i : j + 1]
    if i == len(files) or firsts[i] != e.first_offset or len(run) != len(e.replaced) or run[-1].last != e.last_offset:
        raise InvalidTransition(
            s.topic,
            s.partition,
            f"compact of offsets {e.first_offset}-{e.last_offset} in {len(e.replaced)} files does not match "
            "a run of committed L1 files",
        )
    if tuple(f.key for f in run) != e.replaced or tuple(f.crc32c for f in run) != e.replaced_crc32c:
        raise InvalidTransition(
            s.topic,
            s.partition,
            f"compact of offsets {e.first_offset}-{e.last_offset} names files or CRC32Cs the partition does not commit",
        )
    key = layout.l1_key(s.topic, s.partition, e.first_offset, e.last_offset, s.topic_id, e.writer_epoch)
    if e.l1_key != key:
        raise InvalidTransition(s.topic, s.partition, f"compact names L1 file {e.l1_key!r}, expected {key!r}")
    tags = s.l1_tags or (0,) * len(s.l1_ends)
    return evolve(
        s,
        applied_offset=offset,
        holders=claims.released(s, e.release_owner, e.writer_epoch, "compact"),
        l1_ends=s.l1_ends[:i] + (e.last_offset,) + s.l1_ends[j + 1 :],
        l1_crcs=s.l1_crcs[:i] + (e.l1_crc32c,) + s.l1_crcs[j + 1 :],
        l1_tags=tags[:i] + (e.writer_epoch,) + tags[j + 1 :],
        l1_changed_log_offset=offset,
    )


def _apply_trim(s: PartitionState, offset: int, e: Trim) -> PartitionState:
    """R11: the start offset moves forward, never past what is in L1; the committed
    files wholly before it leave the committed set."""
    claims.check_exclusive(s, e.writer_epoch, "trim")
    if e.start_offset <= s.start_offset:
        raise InvalidTransition(
            s.topic,
            s.partition,
            f"trim to start offset {e.start_offset} does not move it forward (it is {s.start_offset}; start offsets only grow)",
        )
    if e.start_offset > s.last_reconciled_offset + 1:
        raise InvalidTransition(
            s.topic,
            s.partition,
            f"trim to start offset {e.start_offset} passes what is in L1 (reconciled through {s.last_reconciled_offset})",
        )
    k = bisect.bisect_left(s.l1_ends, e.start_offset)  # files ending before the new start go
    return evolve(
        s,
        applied_offset=offset,
        holders=claims.released(s, e.release_owner, e.writer_epoch, "trim"),
        start_offset=e.start_offset,
        deleted_to=e.start_offset if e.reason is TrimReason.DELETE_RECORDS else s.deleted_to,
        l1_first=s.l1_ends[k - 1] + 1 if k else s.l1_first,
        l1_ends=s.l1_ends[k:],
        l1_crcs=s.l1_crcs[k:],
        l1_tags=s.l1_tags[k:] if s.l1_tags else (),
        l1_changed_log_offset=offset,
    )
