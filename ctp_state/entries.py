"""Partition state-log entries: frozen, versioned, tagged records and their one codec.

An entry is stored as one JSON object ``{"v": 1, "kind": ..., ...}`` at the key of its
log offset. Decoding refuses an unknown version or kind with an error that names the
key; nothing is guessed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from enum import Enum
from typing import Any, ClassVar, Union

from ctp_state import validate
from ctp_state.errors import CorruptData, UnsupportedVersion

ENTRY_VERSION = 1
SUPPORTED_ENTRY_VERSIONS = (1,)


class AccessMode(str, Enum):
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


@dataclass(frozen=True, slots=True)
class Advance:
    """R6: moves an idle, caught-up partition's applied epochs up to ``epoch``
    (collapsing its window as recovery does) so it stops pinning M."""

    kind: ClassVar[str] = "advance"
    epoch: int
    writer_epoch: int


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


@dataclass(frozen=True, slots=True)
class Release:
    """R5: gives up ``owner``'s claim before its lease ends."""

    kind: ClassVar[str] = "release"
    owner: str
    writer_epoch: int


Entry = Union[Init, Placeholder, Reconcile, Advance, Claim, Release]
_KINDS: dict[str, type] = {c.kind: c for c in (Init, Placeholder, Reconcile, Advance, Claim, Release)}


def encode(entry: Entry) -> bytes:
    body: dict[str, Any] = {"v": ENTRY_VERSION, "kind": entry.kind}
    for k, v in asdict(entry).items():
        body[k] = v.value if isinstance(v, Enum) else list(v) if isinstance(v, tuple) else v
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def decode(data: bytes, key: str) -> Entry:
    """Decode one entry; raise :class:`CorruptData`/:class:`UnsupportedVersion` naming ``key``."""
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptData(key, f"entry is not valid JSON ({e.msg if hasattr(e, 'msg') else e})") from None
    if not isinstance(body, dict):
        raise CorruptData(key, "entry is not a JSON object")
    version = body.pop("v", None)
    if version not in SUPPORTED_ENTRY_VERSIONS:
        raise UnsupportedVersion(key, "entry", version, SUPPORTED_ENTRY_VERSIONS)
    kind = body.pop("kind", None)
    cls = _KINDS.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise CorruptData(key, f"unknown entry kind {kind!r}")
    names = {f.name for f in fields(cls)}
    extra = set(body) - names
    if extra:
        raise CorruptData(key, f"{kind} entry has unknown fields {sorted(extra)}")
    try:
        entry = _build(cls, body)
    except (TypeError, ValueError) as e:
        raise CorruptData(key, f"malformed {kind} entry: {e}") from None
    return entry


def _int(body: dict, name: str, minimum: int = 0) -> int:
    return validate.int64(body[name], what=name, minimum=minimum)


def _build(cls: type, body: dict) -> Entry:
    try:
        if cls is Init:
            return Init(epoch=_int(body, "epoch", 1))
        if cls is Placeholder:
            l0_key = body["l0_key"]
            if not isinstance(l0_key, str) or not l0_key:
                raise ValueError("l0_key must be a non-empty string")
            crc = _int(body, "crc32c")
            if crc > 0xFFFFFFFF:
                raise ValueError("crc32c must fit in 32 bits")
            we = body.get("writer_epoch")
            return Placeholder(
                epoch=_int(body, "epoch", 1),
                l0_key=l0_key,
                byte_offset=_int(body, "byte_offset"),
                byte_length=_int(body, "byte_length", 1),
                record_count=_int(body, "record_count", 1),
                crc32c=crc,
                writer_epoch=None if we is None else validate.int64(we, what="writer_epoch", minimum=1),
            )
        if cls is Reconcile:
            keys = body["l1_keys"]
            if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
                raise ValueError("l1_keys must be a list of non-empty strings")
            return Reconcile(
                through_log_offset=_int(body, "through_log_offset"),
                last_record_offset=_int(body, "last_record_offset", -1),
                l1_keys=tuple(keys),
                min_epoch_lower_bound=_int(body, "min_epoch_lower_bound", 1),
                writer_epoch=_int(body, "writer_epoch", 1),
            )
        if cls is Advance:
            return Advance(epoch=_int(body, "epoch", 1), writer_epoch=_int(body, "writer_epoch", 1))
        if cls is Claim:
            owner = body["owner"]
            if not isinstance(owner, str) or not owner:
                raise ValueError("owner must be a non-empty string")
            return Claim(
                writer_epoch=_int(body, "writer_epoch", 1),
                owner=owner,
                mode=AccessMode(body["mode"]),
                lease_until_ms=_int(body, "lease_until_ms"),
                now_ms=_int(body, "now_ms"),
            )
        if cls is Release:
            owner = body["owner"]
            if not isinstance(owner, str) or not owner:
                raise ValueError("owner must be a non-empty string")
            return Release(owner=owner, writer_epoch=_int(body, "writer_epoch", 1))
    except KeyError as e:
        raise ValueError(f"missing field {e.args[0]!r}") from None
    raise AssertionError(cls)  # pragma: no cover
