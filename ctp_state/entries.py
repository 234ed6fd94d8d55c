"""Partition state-log entries: frozen, versioned, tagged records and their one codec.

An entry is stored as one sealed JSON object ``{"kind": ..., "v": 2, ..., "crc": ...}``
(see :mod:`ctp_state.codec`) at the key of its log offset: its CRC32C covers the bytes
written, so a flipped digit or an edit is caught when the entry is read. Version 1
entries (written before checksums) are still read; they carry no checksum. Version 3
is version 2 plus ``release_owner`` on a reconcile or advance entry (the claim given up
in the same entry); it is written only for such entries, so a ctp that predates it
refuses them by version, naming the key, and reads every other entry. Version 4 is
written only for the kinds that change a partition's committed L1 files after the
fact, ``compact`` and ``trim`` (a ctp that predates them refuses them by version, as
it must: it would read the wrong files). Version 5 is written only for ``tick``, an idle
partition's advance in one entry (a ctp that predates it refuses it by version: it
would judge the entry's writer epoch wrong, and fold the log differently). Version 6
is any kind with ``prev``, the CRC32C of the stored bytes of the entry before it (as
the writer's state knew them): an entry's bytes then say which log they were written
after, so two entries alike in every field but written after different entries never
match byte for byte (docs/design.md section 14: a reader trusts a stored state while
the entry it ends at holds the bytes it names); and, on a re-send after an unanswered
create, ``resend`` (its number), so a re-send is never the first send's bytes either.
It is written whenever the writer
knows that CRC (every append but a log's first entry); a ctp that predates it refuses
it by version. Decoding refuses an unknown version or kind, a bad checksum or a
malformed field with an error that names the key; nothing is guessed.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, ClassVar

import msgspec

from ctp_state import codec, validate
from ctp_state.errors import CorruptData, UnsupportedVersion

ENTRY_VERSION = 2
#: Written for a reconcile or advance entry that also releases its claim.
RELEASING_ENTRY_VERSION = 3
#: Written for the entries that change the committed L1 files after the fact.
L1_CHANGE_ENTRY_VERSION = 4
#: Written for ``tick`` entries, and only for them.
TICK_ENTRY_VERSION = 5
#: Written for any kind whose writer knows the CRC32C of the entry before it (``prev``).
CHAINED_ENTRY_VERSION = 6
SUPPORTED_ENTRY_VERSIONS = (1, 2, 3, 4, 5, 6)  # 1: before checksums, read but never written

# The fields' bounds, checked by the codec when an entry is read (never when one is built).
Epoch = Annotated[int, msgspec.Meta(ge=1, le=validate.MAX_EPOCH)]
Count = Annotated[int, msgspec.Meta(ge=0, le=validate.INT64_MAX)]
Positive = Annotated[int, msgspec.Meta(ge=1, le=validate.INT64_MAX)]
Crc32 = Annotated[int, msgspec.Meta(ge=0, le=0xFFFFFFFF)]
Name = Annotated[str, msgspec.Meta(min_length=1)]


class AccessMode(str, Enum):  # noqa: UP042 - str(mode) in messages names the member
    """R5 claim modes."""

    SHARED = "shared"  # coexists with other shared claims; refused while an exclusive one is live
    EXCLUSIVE = "exclusive"  # refused at once if any other owner holds a live claim
    WAIT_FOR_EXCLUSIVE = "wait_for_exclusive"  # the claimer waits, then claims exclusively


class _Entry(msgspec.Struct, frozen=True, tag_field="kind", omit_defaults=True, forbid_unknown_fields=True):
    """An entry's fields; its ``kind`` is its tag. Optional fields are written only when
    set (``omit_defaults``), so the common entry stays small."""


class Init(_Entry, tag="init", frozen=True):
    """Written once, at partition creation, with the then-current cluster epoch (R4)."""

    kind: ClassVar[str] = "init"
    epoch: Epoch


class Placeholder(_Entry, tag="placeholder", frozen=True):
    """Points at one partition's chunk inside an L0 object written under ``epoch``."""

    kind: ClassVar[str] = "placeholder"
    epoch: Epoch
    l0_key: Name
    byte_offset: Count
    byte_length: Positive
    record_count: Positive
    crc32c: Crc32
    writer_epoch: Positive | None = None  # set by producers that hold a claim
    # R8: an idempotent producer's id, the sequence number of the chunk's first record
    # among everything that producer sent to this partition, and the CRC32C of the
    # records' keys, values and headers (what a re-send of this batch must match).
    producer_id: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] | None = None
    sequence: Count | None = None
    fingerprint: Crc32 | None = None


class Reconcile(_Entry, tag="reconcile", frozen=True):
    """The reconciler lifted every accepted placeholder through log offset
    ``through_log_offset`` into ``l1_keys``; records up to ``last_record_offset``."""

    kind: ClassVar[str] = "reconcile"
    through_log_offset: Count
    last_record_offset: Annotated[int, msgspec.Meta(ge=-1, le=validate.INT64_MAX)]
    l1_keys: tuple[Name, ...]
    min_epoch_lower_bound: Epoch
    writer_epoch: Positive
    # CRC32C of each L1 file's bytes, as written: the end-to-end check that readers
    # and the GC apply to the whole file (Parquet's page checksums leave the footer out).
    l1_crc32c: tuple[Crc32, ...] = ()
    # The owner whose claim (under ``writer_epoch``) this entry also releases, as a
    # Release right after it would: one entry, one object write, instead of two.
    release_owner: Name | None = None


class Advance(_Entry, tag="advance", frozen=True):
    """R6: moves an idle, caught-up partition's applied epochs up to ``epoch``
    (collapsing its window as recovery does) so it stops pinning M."""

    kind: ClassVar[str] = "advance"
    epoch: Epoch
    writer_epoch: Positive
    release_owner: Name | None = None  # as Reconcile.release_owner


class Tick(_Entry, tag="tick", frozen=True):
    """R5 + R6 in one entry: an idle, caught-up partition that no claim is held on moves
    its applied epochs up to ``epoch``, as a claim, an advance and a release would, in
    one object write instead of three. It takes ``writer_epoch`` (the state's next: it
    fences every older writer, as an exclusive claim does) and leaves no claim held. The
    log's create-if-absent append is its lock: an entry that lands first (a producer's
    placeholder, a claim) changes the state it is judged against, and the fold rejects
    it if the partition is no longer idle, free and behind ``epoch``."""

    kind: ClassVar[str] = "tick"
    epoch: Epoch
    writer_epoch: Positive
    owner: Name  # who wrote it (for people: the run's id)


class Claim(_Entry, tag="claim", frozen=True):
    """R5: takes (or renews) a claim; every claim bumps the writer epoch.

    ``now_ms`` is the claimer's clock when it decided the claim was free, so that
    whether a lease had expired is decided once, by the log, not by each reader's clock.
    """

    kind: ClassVar[str] = "claim"
    writer_epoch: Positive
    owner: Name
    mode: AccessMode
    lease_until_ms: Count
    now_ms: Count
    # (owner, writer epoch) of holders whose lease the claimer found over by the store's
    # clock (the time the store wrote their claim, plus the lease's length), though not
    # by their own: a holder whose clock ran fast must not block a partition past its
    # lease. The log decides once, as for now_ms.
    expired: tuple[tuple[Name, Positive], ...] = ()


class Release(_Entry, tag="release", frozen=True):
    """R5: gives up ``owner``'s claim before its lease ends."""

    kind: ClassVar[str] = "release"
    owner: Name
    writer_epoch: Positive


class Seal(_Entry, tag="seal", frozen=True):
    """R10: the partition's topic incarnation was deleted (``ctp topic delete``); every
    entry after this one is rejected, so an appender that missed the delete learns it
    from the log itself. ``at_ms`` is the sealer's clock, for people only."""

    kind: ClassVar[str] = "seal"
    at_ms: Count


class Compact(_Entry, tag="compact", frozen=True):
    """R11: the adjacent committed L1 files ``replaced`` (keys and CRC32C as the
    partition committed them, in offset order, together holding records ``first_offset``
    through ``last_offset``) are replaced by the one file ``l1_key``, which holds exactly
    their records (``record_count`` of them), written under ``writer_epoch``'s exclusive
    claim. The replaced files leave the committed set here; the GC deletes them later,
    behind the gate."""

    kind: ClassVar[str] = "compact"
    first_offset: Count
    last_offset: Count
    replaced: tuple[Name, ...]
    replaced_crc32c: tuple[Crc32 | None, ...]
    l1_key: Name
    l1_crc32c: Crc32
    record_count: Positive
    writer_epoch: Positive
    release_owner: Name | None = None  # as Reconcile.release_owner


class TrimReason(str, Enum):  # noqa: UP042 - as AccessMode
    """Why a partition's start offset moved (Kafka's three ways to lose a log's head)."""

    RETENTION_MS = "retention_ms"  # the dropped files' newest record is older than the topic's retention.ms
    RETENTION_BYTES = "retention_bytes"  # the partition was over the topic's retention.bytes
    DELETE_RECORDS = "delete_records"  # an operator asked (Kafka's DeleteRecords)


class Trim(_Entry, tag="trim", frozen=True):
    """R11: the partition's start offset moves forward to ``start_offset`` (records
    before it are gone for readers); committed L1 files wholly before it leave the
    committed set. Never past what is in L1: ``start_offset`` <= the last reconciled
    offset + 1. Written under ``writer_epoch``'s exclusive claim."""

    kind: ClassVar[str] = "trim"
    start_offset: Count
    reason: TrimReason
    writer_epoch: Positive
    release_owner: Name | None = None  # as Reconcile.release_owner


Entry = Init | Placeholder | Reconcile | Advance | Claim | Release | Seal | Compact | Trim | Tick
_KINDS: dict[str, type[Entry]] = {
    c.kind: c for c in (Init, Placeholder, Reconcile, Advance, Claim, Release, Seal, Compact, Trim, Tick)
}
_RELEASING = ("reconcile", "advance")
_L1_CHANGES = ("compact", "trim")


def encode(entry: Entry, prev: int | None = None, resend: int = 0) -> bytes:
    """The entry as sealed JSON: its fields (those at their default left out), its
    ``kind`` and its version; with ``prev`` (the CRC32C of the stored bytes of the entry
    before it), version 6 and ``prev``, and a re-send's number (``resend`` > 0: the
    same entry as other bytes, see :func:`ctp_state.sequence.create_sent`)."""
    body: codec.JsonObject = msgspec.to_builtins(entry)
    if prev is not None:
        if not 0 <= prev <= 0xFFFFFFFF:
            raise ValueError(f"prev {prev} is not a CRC32C")
        body["v"], body["prev"] = CHAINED_ENTRY_VERSION, prev
        if resend:
            body["resend"] = resend
    elif entry.kind in _L1_CHANGES:
        body["v"] = L1_CHANGE_ENTRY_VERSION
    elif entry.kind == "tick":
        body["v"] = TICK_ENTRY_VERSION
    elif getattr(entry, "release_owner", None) is not None:
        body["v"] = RELEASING_ENTRY_VERSION
    else:
        body["v"] = ENTRY_VERSION
    return codec.seal(body, floats=False)


def decode(data: bytes, key: str) -> Entry:
    """Decode one entry; raise :class:`CorruptData`/:class:`UnsupportedVersion` naming ``key``."""
    return decode_chained(data, key)[0]


def decode_chained(data: bytes, key: str) -> tuple[Entry, int | None]:
    """:func:`decode`, and the entry's ``prev`` (None: an entry of version 5 or older)."""
    raw = codec.checked_if_sealed(data, key, "state-log entry")
    if raw is not None:
        body = codec.loads(raw, key, "state-log entry")
        if body.get("v") == 1:
            raise CorruptData(key, "version 1 entries are never sealed")
    else:
        body = codec.loads(data, key, "state-log entry")
        if body.get("v") in SUPPORTED_ENTRY_VERSIONS and body.get("v") != 1:
            raise CorruptData(key, f"version {body.get('v')} entry has no checksum (it is truncated or was edited)")
    version = body.pop("v", None)
    if version not in SUPPORTED_ENTRY_VERSIONS:
        raise UnsupportedVersion(key, "entry", version, SUPPORTED_ENTRY_VERSIONS)
    kind = body.get("kind")
    if not isinstance(kind, str) or kind not in _KINDS:
        raise CorruptData(key, f"unknown entry kind {kind!r}")
    prev = body.pop("prev", None) if version == CHAINED_ENTRY_VERSION else None
    if version == CHAINED_ENTRY_VERSION:
        if type(prev) is not int or not 0 <= prev <= 0xFFFFFFFF:
            raise CorruptData(key, f"version 6 {kind} entry has no CRC32C of the entry before it (prev {prev!r})")
        resend = body.pop("resend", 1)
        if type(resend) is not int or not 1 <= resend <= 1 << 16:
            raise CorruptData(key, f"version 6 {kind} entry has a re-send number that is not one ({resend!r})")
        # Version 6 carries what versions 2-5 carry, on the kinds they allow it on.
        if "release_owner" in body and kind not in _RELEASING and kind not in _L1_CHANGES:
            raise CorruptData(key, f"{kind} entry has unknown fields ['release_owner'] (version {version})")
        return _converted(body, kind, key), prev
    # Version 4 is written for the L1-changing kinds and only for them (release_owner
    # optional on them, as on version 2's releasing kinds).
    if (version == L1_CHANGE_ENTRY_VERSION) != (kind in _L1_CHANGES):
        raise CorruptData(key, f"{kind} entry of version {version} (compact and trim entries are version 4, only they)")
    if (version == TICK_ENTRY_VERSION) != (kind == "tick"):
        raise CorruptData(key, f"{kind} entry of version {version} (tick entries are version 5, only they)")
    # Version 3 is version 2 plus release_owner, on the two kinds that release: an entry
    # of version 3 releases a claim, and only such an entry carries release_owner.
    releasing = kind in _RELEASING or kind in _L1_CHANGES
    if "release_owner" in body and not (releasing and version in (RELEASING_ENTRY_VERSION, L1_CHANGE_ENTRY_VERSION)):
        raise CorruptData(key, f"{kind} entry has unknown fields ['release_owner'] (version {version})")
    if version == RELEASING_ENTRY_VERSION and body.get("release_owner") is None:
        raise CorruptData(key, f"version {version} {kind} entry releases no claim (release_owner is missing)")
    return _converted(body, kind, key), None


def _converted(body: codec.JsonObject, kind: str, key: str) -> Entry:
    try:
        # To the kind's own type, not the union: msgspec builds a union's decoder on
        # every call (12 us an entry against 0.7 us), and the kind is checked above.
        entry: Entry = msgspec.convert(body, _KINDS[kind])
    except msgspec.ValidationError as e:
        raise CorruptData(key, f"malformed {kind} entry: {e}") from None
    except UnicodeError:  # msgspec quoting a lone surrogate in its own message
        raise CorruptData(key, f"malformed {kind} entry: a field holds text that is not valid Unicode") from None
    problem = _mismatch(entry)
    if problem:
        raise CorruptData(key, f"malformed {kind} entry: {problem}")
    return entry


def _mismatch(entry: Entry) -> str | None:
    """What ties between an entry's fields it breaks (checked when read: a producer
    builds a placeholder in steps)."""
    if isinstance(entry, Placeholder) and not (
        (entry.producer_id is None) == (entry.sequence is None) == (entry.fingerprint is None)
    ):
        return "producer_id, sequence and fingerprint come together"
    if isinstance(entry, Reconcile) and entry.l1_crc32c and len(entry.l1_crc32c) != len(entry.l1_keys):
        return "l1_crc32c must list one CRC32C per L1 key"
    if isinstance(entry, Compact):
        if len(entry.replaced) < 2 or len(entry.replaced_crc32c) != len(entry.replaced):
            return "a compaction replaces two files or more, with one CRC32C (or null) per replaced key"
        if entry.last_offset < entry.first_offset or entry.record_count != entry.last_offset - entry.first_offset + 1:
            return f"record_count {entry.record_count} is not the offsets {entry.first_offset}-{entry.last_offset}"
    return None
