"""A partition's state as the fold of its log leaves it: the persisted fields a
snapshot holds, the volatile fence window, the views readers take of it (the committed
L1 files, the lag, M(p)), and ``evolve``, the fold's copy-with-changes.

The fold itself (:func:`ctp_state.state.apply`) and its rules live in
:mod:`ctp_state.state`; the snapshot codec in :mod:`ctp_state.snapshot`. These types are
what the three share, and what every reader of a state (the GC, the reconciler, the
table's publish, ``ctp status``) holds.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from ctp_state import layout
from ctp_state.entries import AccessMode, Count, Epoch, Name, Positive


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
    lease_until_ms: int  # by the claimer's clock
    lease_ms: int = 0  # the lease's length: what other claimers time from the store's clock


class ProducerBatch(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """One applied batch of an idempotent producer: its first sequence number, record
    count, the record offset it got and its records' fingerprint.

    A struct, not a dataclass, and stored as it is (a snapshot's row of four numbers,
    bounds checked when read): a busy partition's snapshot holds thousands, and
    building each from a row in Python cost more than reading the snapshot."""

    first_seq: Count
    record_count: Positive
    base_offset: Count
    fingerprint: Count

    @property
    def last_seq(self) -> int:
        return self.first_seq + self.record_count - 1


class ProducerSeq(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """R8: what a partition remembers of one idempotent producer (a struct stored as it
    is, a snapshot's row, as :class:`ProducerBatch`)."""

    producer_id: Name
    last_seq: Count  # sequence number of the last record applied
    last_epoch: Epoch  # epoch of its last applied placeholder: how long it is remembered
    batches: tuple[ProducerBatch, ...]  # its newest batches, oldest first


@dataclass(frozen=True, slots=True)
class L1Ref:
    """A committed L1 file: its key, offsets and the CRC32C of its bytes (None for files
    committed before ctp recorded one)."""

    key: str
    first: int
    last: int
    crc32c: int | None


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
    l1_ends: tuple[int, ...] = ()  # last record offset of each committed L1 file, in order
    l1_crcs: tuple[int | None, ...] = ()  # CRC32C of each committed L1 file (None: committed without one)
    #: Per committed L1 file, the writer epoch of the compaction that wrote it (0: a
    #: reconcile did); empty while no compaction ever committed (every file a reconcile's).
    l1_tags: tuple[int, ...] = ()
    l1_first: int = 0  # first record offset of the first committed L1 file (files tile from it)
    #: The partition's start offset (Kafka's log start offset): records before it are
    #: gone for readers (retention or DeleteRecords, a trim entry). l1_first <= it.
    start_offset: int = 0
    #: The highest start offset an operator's DeleteRecords set (the GC's gate lets the
    #: files before it go whatever the topic's retention says).
    deleted_to: int = 0
    #: The log offset of the newest compact or trim entry (-1: none): when the committed
    #: files last changed other than by a reconcile (the table's publish and the GC's
    #: clock for files that left the committed set follow it).
    l1_changed_log_offset: int = -1
    producers: tuple[ProducerSeq, ...] = ()  # least recently written first
    #: The incarnation id in the partition's keys (None: a topic whose keys carry only
    #: its name); a snapshot says which incarnation it summarises.
    topic_id: str | None = None
    #: R10: the topic incarnation was deleted; the log takes nothing more (a seal entry).
    sealed: bool = False
    #: ``(log offset, CRC32C of its stored bytes)`` of the entry this state ends at, as
    #: the state's reader decoded it or its writer wrote it (None: not known). It names
    #: *which* log the state is the fold of: a store that lost the entry and took
    #: another in its slot holds other bytes there (docs/design.md section 14). Only
    #: meaningful while the offset is ``applied_offset`` (see :attr:`last_crc`); not part
    #: of the state's value (two reads of one log are equal states).
    last_entry: tuple[int, int] | None = field(default=None, compare=False)
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
    def last_crc(self) -> int | None:
        """The CRC32C of the stored bytes of the entry this state ends at (None: not known)."""
        e = self.last_entry
        return e[1] if e is not None and e[0] == self.applied_offset and self.applied_offset >= 0 else None

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
    def min_pending_epoch(self) -> int | None:
        """The smallest epoch any pending placeholder carries: the GC's independent
        check is that this is above M (I1)."""
        return min((p.epoch for p in self.pending), default=None)

    def committed_l1_keys(self, from_offset: int = 0) -> list[str]:
        """Keys of the committed L1 files holding offsets >= ``from_offset``, in order."""
        return [f.key for f in self.committed_l1_files(from_offset)]

    def committed_l1_files(self, from_offset: int = 0) -> list[L1Ref]:
        """The committed L1 files holding offsets >= ``from_offset``, in order."""
        return committed_files(
            self.topic,
            self.partition,
            self.topic_id,
            self.l1_first,
            self.l1_ends,
            self.l1_crcs,
            self.l1_tags,
            from_offset,
        )

    @property
    def l1_compacted(self) -> bool:
        """Whether any compaction or trim ever changed the committed files."""
        return self.l1_changed_log_offset >= 0

    @property
    def persisted(self) -> PartitionState:
        """This state as a snapshot holds it: the window dropped."""
        return replace(self, max_seen_epoch=None, oldest_accepted_epoch=None)


def committed_files(
    topic: str,
    partition: int,
    topic_id: str | None,
    l1_first: int,
    l1_ends: tuple[int, ...],
    l1_crcs: tuple[int | None, ...],
    l1_tags: tuple[int, ...],
    from_offset: int = 0,
) -> list[L1Ref]:
    """The committed L1 files a state's lists describe (they tile the records from
    ``l1_first``), those holding offsets >= ``from_offset``, in order: the one place
    their keys are derived (a compaction's output names its writer epoch)."""
    i = bisect.bisect_left(l1_ends, from_offset)
    first = l1_ends[i - 1] + 1 if i else l1_first
    out = []
    for j in range(i, len(l1_ends)):
        last = l1_ends[j]
        tag = l1_tags[j] if l1_tags else 0
        out.append(L1Ref(layout.l1_key(topic, partition, first, last, topic_id, tag), first, last, l1_crcs[j]))
        first = last + 1
    return out


def _make_evolve() -> Any:
    """``evolve(state, **changes)``: ``dataclasses.replace`` for :class:`PartitionState`
    without its generic per-field loop and ``__init__`` (no ``__post_init__`` to skip):
    the fold copies a state once per applied entry, and that copy was most of a
    replay's CPU (a log's tail is replayed by every reader)."""
    names = PartitionState.__slots__
    lines = ["def evolve(s, **ch):", "    n = _new(_cls)"]
    for name in names:
        lines.append(f"    _set(n, {name!r}, ch[{name!r}] if {name!r} in ch else s.{name})")
    lines.append(
        "    if len(ch) > 0 and not ch.keys() <= _names: raise TypeError(f'not fields: {sorted(ch.keys() - _names)}')"
    )
    lines.append("    return n")
    scope: dict[str, object] = {
        "_new": object.__new__,
        "_set": object.__setattr__,
        "_cls": PartitionState,
        "_names": frozenset(names),
    }
    exec("\n".join(lines), scope)  # generated from the class's own slots, nothing else
    return scope["evolve"]


evolve: Callable[..., PartitionState] = _make_evolve()


def ending_at(s: PartitionState, crc: int) -> PartitionState:
    """``s`` naming ``crc`` as the CRC32C of the stored bytes of the entry it ends at
    (a pack's state, whose checksum the pack keeps beside it): what a reader that
    starts from it compares the log's bytes against."""
    if s.last_entry == (s.applied_offset, crc):
        return s
    return evolve(s, last_entry=(s.applied_offset, crc))
