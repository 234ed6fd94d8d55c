"""The snapshot codec: a partition's persisted state as one sealed record, and back.

A snapshot is only ever a cache of the log (the log is the truth): it holds the
persisted fields of :class:`~ctp_state.state.PartitionState`, never the volatile fence
window, and on load it is checked for self-consistency (R9, :func:`inconsistencies`);
one that fails is set aside by the reader and the state rebuilt from the log.
"""

from __future__ import annotations

from typing import Any

from ctp_state import codec, layout, validate
from ctp_state.entries import AccessMode
from ctp_state.errors import CorruptData, UnsupportedVersion
from ctp_state.state import Holder, PartitionState, Pending, ProducerBatch, ProducerSeq
from ctp_state.window import recover

SNAPSHOT_VERSION = 2
#: Version 1 snapshots predate checksums and the L1 file list; they are set aside and
#: the state is rebuilt from the log (a snapshot is only ever a cache of the log).
SUPPORTED_SNAPSHOT_VERSIONS = (2,)


def encode_snapshot(s: PartitionState) -> bytes:
    body: dict[str, Any] = {
        "v": SNAPSHOT_VERSION,
        "topic": s.topic,
        "topic_id": s.topic_id,
        "sealed": s.sealed,
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
        "holders": [[h.owner, h.mode.value, h.writer_epoch, h.lease_until_ms, h.lease_ms] for h in s.holders],
        "writer_epoch_starts": [list(x) for x in s.writer_epoch_starts],
        "pending": [
            [p.log_offset, p.epoch, p.l0_key, p.byte_offset, p.byte_length, p.record_count, p.crc32c, p.base_offset]
            for p in s.pending
        ],
        "l1_ends": list(s.l1_ends),
        "l1_crcs": list(s.l1_crcs),
        "producers": [
            [
                p.producer_id,
                p.last_seq,
                p.last_epoch,
                [[b.first_seq, b.record_count, b.base_offset, b.fingerprint] for b in p.batches],
            ]
            for p in s.producers
        ],
    }
    return codec.seal(body)


def decode_snapshot(data: bytes, key: str) -> PartitionState:
    """Decode a snapshot into a recovered state (window collapsed). Raises
    :class:`CorruptData` if its checksum fails, a field is malformed, or it is not
    self-consistent (see :func:`inconsistencies`)."""
    if not codec.is_sealed(data):
        b = codec.loads(data, key, "snapshot")
        if b.get("v") == 1:
            raise UnsupportedVersion(key, "snapshot", 1, SUPPORTED_SNAPSHOT_VERSIONS)
        raise CorruptData(key, "snapshot has no checksum (it is truncated, or was edited)")
    b = codec.unseal(data, key, "snapshot")
    if b.get("v") not in SUPPORTED_SNAPSHOT_VERSIONS:
        raise UnsupportedVersion(key, "snapshot", b.get("v"), SUPPORTED_SNAPSHOT_VERSIONS)
    try:

        def opt(name: str) -> int | None:
            return (
                None if b[name] is None else validate.int64(b[name], what=name, minimum=1, maximum=validate.MAX_EPOCH)
            )

        def num(name: str, lo: int = -1) -> int:
            return validate.int64(b[name], what=name, minimum=lo)

        def i64(v: object, what: str, lo: int = 0) -> int:
            return validate.int64(v, what=what, minimum=lo)

        max_applied = opt("max_applied_epoch")
        s = PartitionState(
            topic=validate.topic_name(b["topic"]),
            topic_id=_topic_id(b.get("topic_id")),
            sealed=b.get("sealed", False) is True,
            partition=num("partition", 0),
            applied_offset=num("applied_offset"),
            max_applied_epoch=max_applied,
            max_seen_epoch=max_applied,  # recovered: the window collapsed to [max_applied_epoch]
            oldest_accepted_epoch=max_applied,
            previous_applied_epoch=opt("previous_applied_epoch"),
            epoch_window_offset=num("epoch_window_offset"),
            min_epoch_lower_bound=opt("min_epoch_lower_bound"),
            last_reconciled_log_offset=num("last_reconciled_log_offset"),
            last_reconciled_offset=num("last_reconciled_offset"),
            next_offset=num("next_offset", 0),
            writer_epoch=num("writer_epoch", 0),
            fence_floor=num("fence_floor", 0),
            holders=tuple(
                Holder(
                    _str(o, "holder owner"),
                    AccessMode(m),
                    i64(we, "holder writer epoch", 1),
                    i64(lu, "lease"),
                    i64(ln, "lease length"),
                )
                for o, m, we, lu, ln in b["holders"]
            ),
            writer_epoch_starts=tuple(
                (i64(we, "writer epoch", 1), i64(off, "writer epoch start")) for we, off in b["writer_epoch_starts"]
            ),
            pending=tuple(
                Pending(
                    i64(a, "pending log offset"),
                    i64(e, "pending epoch", 1),
                    _str(k, "pending L0 key"),
                    i64(bo, "byte offset"),
                    i64(bl, "byte length", 1),
                    i64(rc, "record count", 1),
                    i64(c, "chunk crc32c"),
                    i64(base, "base offset"),
                )
                for a, e, k, bo, bl, rc, c, base in b["pending"]
            ),
            l1_ends=tuple(i64(x, "L1 file end") for x in b["l1_ends"]),
            l1_crcs=tuple(None if x is None else i64(x, "L1 file CRC32C") for x in b["l1_crcs"]),
            producers=tuple(
                ProducerSeq(
                    _str(pid, "producer id"),
                    i64(last, "producer sequence"),
                    tuple(
                        ProducerBatch(
                            i64(f, "batch sequence"),
                            i64(n, "batch records", 1),
                            i64(base, "batch offset"),
                            i64(c, "batch fingerprint"),
                        )
                        for f, n, base, c in batches
                    ),
                    i64(epoch, "producer epoch", 1),
                )
                for pid, last, epoch, batches in b["producers"]
            ),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptData(key, f"malformed snapshot: {e}") from None
    problems = inconsistencies(s)
    if problems:
        raise CorruptData(key, "snapshot is not self-consistent: " + "; ".join(problems[:3]))
    return recover(s)


def _topic_id(v: object) -> str | None:
    if v is not None and not (isinstance(v, str) and len(v) == 32 and all(c in "0123456789abcdef" for c in v)):
        raise ValueError(f"topic_id must be 32 lowercase hex digits, got {v!r}")
    return v


def _str(v: object, what: str) -> str:
    if not isinstance(v, str) or not v:
        raise ValueError(f"{what} must be a non-empty string")
    return v


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
        or (s.l1_ends[-1] if s.l1_ends else -1) != s.last_reconciled_offset
        or len(s.l1_crcs) != len(s.l1_ends)
    ):
        out.append(f"L1 files do not tile the records through the last reconciled offset {s.last_reconciled_offset}")
    if s.fence_floor > s.writer_epoch or any(h.writer_epoch > s.writer_epoch for h in s.holders):
        out.append(f"a claim is ahead of the writer epoch {s.writer_epoch}")
    if len({p.producer_id for p in s.producers}) != len(s.producers) or any(
        b.last_seq > p.last_seq or b.base_offset >= s.next_offset for p in s.producers for b in p.batches
    ):
        out.append("producer sequences are inconsistent")
    return out
