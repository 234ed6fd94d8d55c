"""Partition state-log entries: frozen, versioned, tagged records and their one codec.

An entry is stored as one sealed JSON object ``{"kind": ..., "v": 2, ..., "crc": ...}``
(see :mod:`ctp_state.codec`) at the key of its log offset: its CRC32C covers the bytes
written, so a flipped digit or an edit is caught when the entry is read. Version 1
entries (written before checksums) are still read; they carry no checksum. Version 3
is version 2 plus ``release_owner`` on a reconcile or advance entry (the claim given up
in the same entry); it is written only for such entries, so a ctp that predates it
refuses them by version, naming the key, and reads every other entry. Decoding
refuses an unknown version or kind, a bad checksum or a malformed field with an error
that names the key; nothing is guessed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from enum import Enum
from typing import Any, ClassVar

from ctp_state import codec, validate
from ctp_state.errors import CorruptData, UnsupportedVersion

ENTRY_VERSION = 2
#: Written for a reconcile or advance entry that also releases its claim.
RELEASING_ENTRY_VERSION = 3
SUPPORTED_ENTRY_VERSIONS = (1, 2, 3)  # 1: before checksums, read but never written
#: Fields written only when set, so the common entry stays small.
_OPTIONAL = ("writer_epoch", "producer_id", "sequence", "fingerprint", "release_owner")
_OPTIONAL_EMPTY = ("expired", "l1_crc32c")


class AccessMode(str, Enum):  # noqa: UP042 - str(mode) in messages names the member
    """R5 claim modes."""

    SHARED = "shared"  # coexists with other shared claims; refused while an exclusive one is live
    EXCLUSIVE = "exclusive"  # refused at once if any other owner holds a live claim
    WAIT_FOR_EXCLUSIVE = "wait_for_exclusive"  # the claimer waits, then claims exclusively


@dataclass(frozen=True, slots=True)
class Init:
    """Written once, at partition creation, with the then-current cluster epoch (R4)."""

    kind: ClassVar[str] = "init"
    epoch: int


@dataclass(frozen=True, slots=True)
class Placeholder:
    """Points at one partition's chunk inside an L0 object written under ``epoch``."""

    kind: ClassVar[str] = "placeholder"
    epoch: int
    l0_key: str
    byte_offset: int
    byte_length: int
    record_count: int
    crc32c: int
    writer_epoch: int | None = None  # set by producers that hold a claim
    # R8: an idempotent producer's id, the sequence number of the chunk's first record
    # among everything that producer sent to this partition, and the CRC32C of the
    # records' keys, values and headers (what a re-send of this batch must match).
    producer_id: str | None = None
    sequence: int | None = None
    fingerprint: int | None = None


@dataclass(frozen=True, slots=True)
class Reconcile:
    """The reconciler lifted every accepted placeholder through log offset
    ``through_log_offset`` into ``l1_keys``; records up to ``last_record_offset``."""

    kind: ClassVar[str] = "reconcile"
    through_log_offset: int
    last_record_offset: int
    l1_keys: tuple[str, ...]
    min_epoch_lower_bound: int
    writer_epoch: int
    # CRC32C of each L1 file's bytes, as written: the end-to-end check that readers
    # and the GC apply to the whole file (Parquet's page checksums leave the footer out).
    l1_crc32c: tuple[int, ...] = ()
    # The owner whose claim (under ``writer_epoch``) this entry also releases, as a
    # Release right after it would: one entry, one object write, instead of two.
    release_owner: str | None = None


@dataclass(frozen=True, slots=True)
class Advance:
    """R6: moves an idle, caught-up partition's applied epochs up to ``epoch``
    (collapsing its window as recovery does) so it stops pinning M."""

    kind: ClassVar[str] = "advance"
    epoch: int
    writer_epoch: int
    release_owner: str | None = None  # as Reconcile.release_owner


@dataclass(frozen=True, slots=True)
class Claim:
    """R5: takes (or renews) a claim; every claim bumps the writer epoch.

    ``now_ms`` is the claimer's clock when it decided the claim was free, so that
    whether a lease had expired is decided once, by the log, not by each reader's clock.
    """

    kind: ClassVar[str] = "claim"
    writer_epoch: int
    owner: str
    mode: AccessMode
    lease_until_ms: int
    now_ms: int
    # (owner, writer epoch) of holders whose lease the claimer found over by the store's
    # clock (the time the store wrote their claim, plus the lease's length), though not
    # by their own: a holder whose clock ran fast must not block a partition past its
    # lease. The log decides once, as for now_ms.
    expired: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Release:
    """R5: gives up ``owner``'s claim before its lease ends."""

    kind: ClassVar[str] = "release"
    owner: str
    writer_epoch: int


@dataclass(frozen=True, slots=True)
class Seal:
    """R10: the partition's topic incarnation was deleted (``ctp topic delete``); every
    entry after this one is rejected, so an appender that missed the delete learns it
    from the log itself. ``at_ms`` is the sealer's clock, for people only."""

    kind: ClassVar[str] = "seal"
    at_ms: int


Entry = Init | Placeholder | Reconcile | Advance | Claim | Release | Seal
_KINDS: dict[str, type] = {c.kind: c for c in (Init, Placeholder, Reconcile, Advance, Claim, Release, Seal)}


def encode(entry: Entry) -> bytes:
    releasing = getattr(entry, "release_owner", None) is not None
    body: dict[str, Any] = {"v": RELEASING_ENTRY_VERSION if releasing else ENTRY_VERSION, "kind": entry.kind}
    for k, v in asdict(entry).items():
        if (v is None and k in _OPTIONAL) or (v == () and k in _OPTIONAL_EMPTY):
            continue
        body[k] = (
            v.value
            if isinstance(v, Enum)
            else [list(x) if isinstance(x, tuple) else x for x in v]
            if isinstance(v, tuple)
            else v
        )
    return codec.seal(body)


def decode(data: bytes, key: str) -> Entry:
    """Decode one entry; raise :class:`CorruptData`/:class:`UnsupportedVersion` naming ``key``."""
    if codec.is_sealed(data):
        body = codec.unseal(data, key, "state-log entry")
        if body.get("v") == 1:
            raise CorruptData(key, "version 1 entries are never sealed")
    else:
        body = codec.loads(data, key, "state-log entry")
        if body.get("v") in SUPPORTED_ENTRY_VERSIONS and body.get("v") != 1:
            raise CorruptData(key, f"version {body.get('v')} entry has no checksum (it is truncated or was edited)")
    version = body.pop("v", None)
    if version not in SUPPORTED_ENTRY_VERSIONS:
        raise UnsupportedVersion(key, "entry", version, SUPPORTED_ENTRY_VERSIONS)
    kind = body.pop("kind", None)
    cls = _KINDS.get(kind)
    if cls is None:
        raise CorruptData(key, f"unknown entry kind {kind!r}")
    names = {f.name for f in fields(cls)}
    if version != RELEASING_ENTRY_VERSION:
        names.discard("release_owner")
    elif body.get("release_owner") is None:
        raise CorruptData(key, f"version {version} {kind} entry releases no claim (release_owner is missing)")
    extra = set(body) - names
    if extra:
        raise CorruptData(key, f"{kind} entry has unknown fields {sorted(extra)}")
    try:
        entry = _build(cls, body)
    except (TypeError, ValueError) as e:
        raise CorruptData(key, f"malformed {kind} entry: {e}") from None
    return entry


def _epoch(body: dict[str, Any], name: str) -> int:
    return validate.int64(body[name], what=name, minimum=1, maximum=validate.MAX_EPOCH)


def _int(body: dict[str, Any], name: str, minimum: int = 0) -> int:
    return validate.int64(body[name], what=name, minimum=minimum)


def _owner(body: dict[str, Any], name: str, optional: bool = False) -> str | None:
    owner = body.get(name) if optional else body[name]
    if owner is None and optional:
        return None
    if not isinstance(owner, str) or not owner:
        raise ValueError(f"{name} must be a non-empty string")
    return owner


def _build(cls: type, body: dict[str, Any]) -> Entry:
    try:
        if cls is Init:
            return Init(epoch=_epoch(body, "epoch"))
        if cls is Placeholder:
            l0_key = body["l0_key"]
            if not isinstance(l0_key, str) or not l0_key:
                raise ValueError("l0_key must be a non-empty string")
            crc = _int(body, "crc32c")
            if crc > 0xFFFFFFFF:
                raise ValueError("crc32c must fit in 32 bits")
            we = body.get("writer_epoch")
            pid, seq, fp = body.get("producer_id"), body.get("sequence"), body.get("fingerprint")
            if not ((pid is None) == (seq is None) == (fp is None)):
                raise ValueError("producer_id, sequence and fingerprint come together")
            if pid is not None and (not isinstance(pid, str) or not pid or len(pid) > 128):
                raise ValueError("producer_id must be a non-empty string of at most 128 characters")
            return Placeholder(
                epoch=_epoch(body, "epoch"),
                l0_key=l0_key,
                byte_offset=_int(body, "byte_offset"),
                byte_length=_int(body, "byte_length", 1),
                record_count=_int(body, "record_count", 1),
                crc32c=crc,
                writer_epoch=None if we is None else validate.int64(we, what="writer_epoch", minimum=1),
                producer_id=pid,
                sequence=None if seq is None else validate.int64(seq, what="sequence"),
                fingerprint=None if fp is None else validate.int64(fp, what="fingerprint", maximum=0xFFFFFFFF),
            )
        if cls is Reconcile:
            keys = body["l1_keys"]
            if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
                raise ValueError("l1_keys must be a list of non-empty strings")
            crcs = body.get("l1_crc32c", [])
            if not isinstance(crcs, list) or (crcs and len(crcs) != len(keys)):
                raise ValueError("l1_crc32c must list one CRC32C per L1 key")
            return Reconcile(
                through_log_offset=_int(body, "through_log_offset"),
                last_record_offset=_int(body, "last_record_offset", -1),
                l1_keys=tuple(keys),
                min_epoch_lower_bound=_epoch(body, "min_epoch_lower_bound"),
                writer_epoch=_int(body, "writer_epoch", 1),
                l1_crc32c=tuple(validate.int64(c, what="l1_crc32c", maximum=0xFFFFFFFF) for c in crcs),
                release_owner=_owner(body, "release_owner", optional=True),
            )
        if cls is Advance:
            return Advance(
                epoch=_epoch(body, "epoch"),
                writer_epoch=_int(body, "writer_epoch", 1),
                release_owner=_owner(body, "release_owner", optional=True),
            )
        if cls is Claim:
            owner = body["owner"]
            if not isinstance(owner, str) or not owner:
                raise ValueError("owner must be a non-empty string")
            expired = body.get("expired", [])
            if not isinstance(expired, list) or not all(
                isinstance(x, list) and len(x) == 2 and isinstance(x[0], str) and x[0] for x in expired
            ):
                raise ValueError("expired must be a list of [owner, writer epoch] pairs")
            return Claim(
                writer_epoch=_int(body, "writer_epoch", 1),
                owner=owner,
                mode=AccessMode(body["mode"]),
                lease_until_ms=_int(body, "lease_until_ms"),
                now_ms=_int(body, "now_ms"),
                expired=tuple((o, validate.int64(we, what="expired writer epoch", minimum=1)) for o, we in expired),
            )
        if cls is Seal:
            return Seal(at_ms=_int(body, "at_ms"))
        if cls is Release:
            owner = body["owner"]
            if not isinstance(owner, str) or not owner:
                raise ValueError("owner must be a non-empty string")
            return Release(owner=owner, writer_epoch=_int(body, "writer_epoch", 1))
    except KeyError as e:
        raise ValueError(f"missing field {e.args[0]!r}") from None
    raise AssertionError(cls)  # pragma: no cover
