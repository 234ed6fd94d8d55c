"""The snapshot codec: a partition's persisted state as one sealed record, and back.

A snapshot is only ever a cache of the log (the log is the truth): it holds the
persisted fields of :class:`~ctp_state.state.PartitionState`, never the volatile fence
window, and on load it is checked for self-consistency (R9, :func:`inconsistencies`);
one that fails is set aside by the reader and the state rebuilt from the log.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Annotated

import msgspec

from ctp_state import codec, layout, validate
from ctp_state.entries import AccessMode, Count, Crc32, Epoch, Name, Positive
from ctp_state.errors import CorruptData, UnsupportedVersion
from ctp_state.state import Holder, PartitionState, Pending, ProducerSeq
from ctp_state.window import recover

SNAPSHOT_VERSION = 2
#: Version 3 is version 2 plus what compaction and retention change (the committed
#: files' first offset and writer epochs, the start offset): written only for a
#: partition they changed, so a ctp that predates them refuses such a snapshot by its
#: version and rebuilds from the log, where it refuses the entries by theirs.
L1_CHANGE_SNAPSHOT_VERSION = 3
#: Version 1 snapshots predate checksums and the L1 file list; they are set aside and
#: the state is rebuilt from the log (a snapshot is only ever a cache of the log).
SUPPORTED_SNAPSHOT_VERSIONS = (2, 3)

Offset = Annotated[int, msgspec.Meta(ge=-1, le=validate.INT64_MAX)]  # -1: none yet
TopicId = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{32}\Z")]  # (msgspec searches: $ would pass a "\n")


# The persisted shape, field for field as version 2 writes it: the lists of a state's
# parts are positional rows (array_like), to keep a snapshot of a busy partition small;
# a row with an item more than its fields is refused, not cut short.
class _HolderRow(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    owner: Name
    mode: AccessMode
    writer_epoch: Positive
    lease_until_ms: Count
    lease_ms: Count


class _PendingRow(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    log_offset: Count
    epoch: Epoch
    l0_key: Name
    byte_offset: Count
    byte_length: Positive
    record_count: Positive
    crc32c: Count
    base_offset: Count


class SnapshotV2(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot as stored (sealed JSON; see :mod:`ctp_state.codec`)."""

    v: int
    topic: str
    topic_id: TopicId | None = None  # absent before topic incarnations
    sealed: bool = False  # absent before topic deletion
    partition: Count
    applied_offset: Offset
    max_applied_epoch: Epoch | None
    previous_applied_epoch: Epoch | None
    epoch_window_offset: Offset
    min_epoch_lower_bound: Epoch | None
    last_reconciled_log_offset: Offset
    last_reconciled_offset: Offset
    next_offset: Count
    writer_epoch: Count
    fence_floor: Count
    holders: tuple[_HolderRow, ...]
    writer_epoch_starts: tuple[tuple[Positive, Count], ...]
    pending: tuple[_PendingRow, ...]
    l1_ends: tuple[Count, ...]
    l1_crcs: tuple[Count | None, ...]
    producers: tuple[ProducerSeq, ...]  # stored as the state holds them (a row each)
    #: The CRC32C of the stored bytes of the entry at ``applied_offset``: a reader starting
    #: here checks the log still holds those bytes there (absent: written before ctp
    #: recorded it, or not known; the entry's existence is all that is checked then).
    last_crc: Crc32 | None = None


class SnapshotV3(SnapshotV2, frozen=True, kw_only=True):
    """Version 3: version 2 plus the fields compaction and retention change."""

    l1_tags: tuple[Count, ...] = ()
    l1_first: Count = 0
    start_offset: Count = 0
    deleted_to: Count = 0
    l1_changed_log_offset: Offset = -1


_V3_ONLY = ("l1_tags", "l1_first", "start_offset", "deleted_to", "l1_changed_log_offset")


#: A row's items, read off a state's part or a row alike: each row lists the fields of
#: its part of the state in the part's own order (checked by tests/formats/test_golden_bytes.py).
_HOLDER = attrgetter(*_HolderRow.__struct_fields__)
_PENDING = attrgetter(*_PendingRow.__struct_fields__)

_DECODER = msgspec.json.Decoder(SnapshotV3)

#: The fields a snapshot holds as the state holds them (the rest are rows, above).
_AS_IS = tuple(f for f in SnapshotV2.__struct_fields__ if f not in ("v", "holders", "pending", "last_crc"))
_AS_IS_V3 = _AS_IS + _V3_ONLY


def encode_snapshot(s: PartitionState) -> bytes:
    v3 = s.l1_changed_log_offset >= 0
    cls, names = (SnapshotV3, _AS_IS_V3) if v3 else (SnapshotV2, _AS_IS)
    snap = cls(
        v=L1_CHANGE_SNAPSHOT_VERSION if v3 else SNAPSHOT_VERSION,
        **{name: getattr(s, name) for name in names},
        holders=tuple(_HolderRow(*_HOLDER(h)) for h in s.holders),
        pending=tuple(_PendingRow(*_PENDING(p)) for p in s.pending),
        last_crc=s.last_crc,
    )
    body = msgspec.to_builtins(snap)
    if body["last_crc"] is None:
        del body["last_crc"]  # (what a snapshot without it always looked like)
    return codec.seal(body, floats=False)


def decode_snapshot(data: bytes, key: str) -> PartitionState:
    """Decode a snapshot into a recovered state (window collapsed). Raises
    :class:`CorruptData` if its checksum fails, a field is malformed, or it is not
    self-consistent (see :func:`inconsistencies`)."""
    raw = codec.checked_if_sealed(data, key, "snapshot")
    if raw is None:
        b = codec.loads(data, key, "snapshot")
        if b.get("v") == 1:
            raise UnsupportedVersion(key, "snapshot", 1, SUPPORTED_SNAPSHOT_VERSIONS)
        raise CorruptData(key, "snapshot has no checksum (it is truncated, or was edited)")
    try:  # the common case in one pass: a well-formed snapshot of this version
        raw.decode()  # (msgspec skips unknown members unchecked: the whole record must be UTF-8)
        snap = _DECODER.decode(raw)
    except (msgspec.MsgspecError, UnicodeError, RecursionError):
        snap = None
    if snap is None or snap.v not in SUPPORTED_SNAPSHOT_VERSIONS:
        # Anything else is read as before, step by step, for the error that names what
        # is wrong (an unsupported version, a malformed field, JSON that does not parse).
        b = codec.loads(raw, key, "snapshot")
        if b.get("v") not in SUPPORTED_SNAPSHOT_VERSIONS:
            raise UnsupportedVersion(key, "snapshot", b.get("v"), SUPPORTED_SNAPSHOT_VERSIONS)
        try:
            snap = msgspec.convert(b, SnapshotV3)
        except (msgspec.ValidationError, ValueError) as e:  # (a lone surrogate: UnicodeEncodeError)
            raise CorruptData(key, f"malformed snapshot: {e}") from None
    try:
        validate.topic_name(snap.topic)
    except ValueError as e:
        raise CorruptData(key, f"malformed snapshot: {e}") from None
    if snap.v == SNAPSHOT_VERSION and snap.l1_changed_log_offset >= 0:
        raise CorruptData(key, "malformed snapshot: a version 2 snapshot holds a compaction's or trim's fields")
    s = PartitionState(
        **{name: getattr(snap, name) for name in _AS_IS_V3},
        max_seen_epoch=snap.max_applied_epoch,  # recovered: the window collapsed to [max_applied_epoch]
        oldest_accepted_epoch=snap.max_applied_epoch,
        holders=tuple(Holder(*_HOLDER(h)) for h in snap.holders),
        pending=tuple(Pending(*_PENDING(p)) for p in snap.pending),
        last_entry=None if snap.last_crc is None else (snap.applied_offset, snap.last_crc),
    )
    problems = inconsistencies(s)
    if problems:
        raise CorruptData(key, "snapshot is not self-consistent: " + "; ".join(problems[:3]))
    return recover(s)


def inconsistencies(s: PartitionState) -> list[str]:
    """What is wrong with a persisted state, as sentences; empty when it is consistent.

    These hold for every state the fold produces, so a snapshot that breaks one was
    damaged or forged (R9): pending epochs at or above the lower bound, the applied
    epochs ordered, offsets that line up, L1 files that tile what was reconciled.
    """
    out: list[str] = []
    if not s.initialized:
        if (
            (s.previous_applied_epoch, s.min_epoch_lower_bound) != (None, None)
            or s.pending
            or s.l1_ends
            or s.producers
            or s.next_offset
            or s.last_reconciled_offset != -1
        ):
            out.append("an uninitialized state holds data")
        return out
    lb, prev, top = s.min_epoch_lower_bound, s.previous_applied_epoch, s.max_applied_epoch
    if lb is None or prev is None or not (lb <= prev <= top):  # type: ignore[operator]
        out.append(f"epochs out of order: lower bound {lb}, previous applied {prev}, max applied {top}")
        return out
    if not (-1 <= s.epoch_window_offset <= s.applied_offset and -1 <= s.last_reconciled_log_offset <= s.applied_offset):
        out.append("log offsets past the applied offset")
    expected_base, last_log = s.last_reconciled_offset + 1, s.last_reconciled_log_offset
    for p in s.pending:
        if p.epoch < lb or p.epoch > top:  # type: ignore[operator]
            out.append(
                f"pending placeholder at log offset {p.log_offset} has epoch {p.epoch}, "
                f"outside [lower bound {lb}, max applied {top}]"
            )
        if p.log_offset <= last_log or p.log_offset > s.applied_offset:
            out.append(f"pending placeholder at log offset {p.log_offset} is out of order")
        if p.base_offset != expected_base:
            out.append(
                f"pending placeholder at log offset {p.log_offset} starts at record {p.base_offset}, "
                f"expected {expected_base}"
            )
        try:
            if layout.parse_l0_key(p.l0_key)[1] != p.epoch:
                out.append(f"pending placeholder at log offset {p.log_offset} names an L0 key of another epoch")
        except CorruptData:
            out.append(f"pending placeholder at log offset {p.log_offset} names a key that is not an L0 key")
        last_log, expected_base = p.log_offset, p.last_offset + 1
    if s.next_offset != expected_base:
        out.append(f"next record offset {s.next_offset}, the pending placeholders end at {expected_base - 1}")
    if (
        any(b <= a for a, b in zip(s.l1_ends, s.l1_ends[1:]))
        or (s.l1_ends[-1] if s.l1_ends else s.l1_first - 1) != s.last_reconciled_offset
        or (s.l1_ends and s.l1_ends[0] < s.l1_first)
        or len(s.l1_crcs) != len(s.l1_ends)
        or (s.l1_tags and len(s.l1_tags) != len(s.l1_ends))
    ):
        out.append(f"L1 files do not tile the records through the last reconciled offset {s.last_reconciled_offset}")
    if not (s.l1_first <= s.start_offset <= s.last_reconciled_offset + 1) or (
        s.l1_ends and s.l1_ends[0] < s.start_offset
    ):
        out.append(
            f"start offset {s.start_offset} is outside the committed files (from {s.l1_first}, "
            f"reconciled through {s.last_reconciled_offset})"
        )
    if s.deleted_to > s.start_offset:
        out.append(f"records deleted to {s.deleted_to}, past the start offset {s.start_offset}")
    if s.l1_changed_log_offset > s.applied_offset or (
        s.l1_changed_log_offset < 0 and (s.l1_first or s.start_offset or s.deleted_to or any(s.l1_tags))
    ):
        out.append("the committed files were changed by no compact or trim entry the log has")
    if s.fence_floor > s.writer_epoch or any(h.writer_epoch > s.writer_epoch for h in s.holders):
        out.append(f"a claim is ahead of the writer epoch {s.writer_epoch}")
    if len({p.producer_id for p in s.producers}) != len(s.producers) or any(
        b.last_seq > p.last_seq or b.base_offset >= s.next_offset for p in s.producers for b in p.batches
    ):
        out.append("producer sequences are inconsistent")
    return out
