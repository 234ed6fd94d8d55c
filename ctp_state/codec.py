"""Sealed JSON: the one codec for every record ctp keeps in the store and must trust.

A sealed record is compact, key-sorted JSON whose last member is ``"crc"``: the
CRC32C (8 hex digits) of the record's bytes without that member. ::

    {"epoch":3,"kind":"init","v":2,"crc":"1c291ca3"}

The check covers the exact bytes that were written, so it does not depend on how a
reader would re-encode the record; a flipped digit, a truncated write or a hand edit
that keeps the JSON valid all fail it. Records are still plain JSON an operator can
read. Used for state-log entries, snapshots, GC history records and reconcile
summaries.
"""

from __future__ import annotations

import json
import re
from typing import Any

import google_crc32c
import msgspec

from ctp_state.errors import CorruptData

#: A decoded JSON object: the one type at ctp's JSON edges -- the codec and its
#: upcasters, ``--json`` output, JSON input, what GX and Airflow hand over -- where a
#: typed record is made or taken apart. Everywhere else values are typed records.
JsonObject = dict[str, Any]

_JSON = msgspec.json.Decoder()
_ENCODER = msgspec.json.Encoder(order="sorted")
_TRAILER = re.compile(rb',"crc":"([0-9a-f]{8})"\}\s*\Z')
_TRAILER_LEN = len(b',"crc":"00000000"}')


def crc32c(data: bytes) -> int:
    return int(google_crc32c.value(data))


def dumps(body: JsonObject, *, floats: bool = True) -> bytes:
    """Compact, key-sorted JSON: the canonical bytes that get sealed.

    ``floats=False``: the caller's body holds no float (a log entry, a snapshot: their
    types have none; ``tests/formats/test_codec_fast_path.py`` checks both). msgspec's
    encoder then writes it, 8 times faster, and its bytes are the standard library's
    whenever they are ASCII without DEL: the two differ only in floats' exponents and
    NaN, and in how characters from DEL up are written (escaped by the one, raw by the
    other), and such a body goes the standard library's way, as does one msgspec does
    not encode (a lone surrogate)."""
    if not floats:
        try:
            raw = _ENCODER.encode(body)
        except (msgspec.MsgspecError, ValueError, TypeError, OverflowError):
            raw = b"\x7f"  # (a lone surrogate: as the standard library writes it)
        if raw.isascii() and b"\x7f" not in raw:
            return raw
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def seal(body: JsonObject, *, floats: bool = True) -> bytes:
    """``body`` as sealed JSON. ``body`` must be a non-empty mapping without ``crc``
    (``floats``: as :func:`dumps`)."""
    if not body or "crc" in body:
        raise ValueError("a sealed record is a non-empty object without a 'crc' member")
    raw = dumps(body, floats=floats)
    return raw[:-1] + b',"crc":"%08x"}' % crc32c(raw)


def _trailer(data: bytes) -> re.Match[bytes] | None:
    # The trailer is the last 18 bytes before any trailing whitespace: look only there
    # (a search of the whole record costs as much as decoding a large snapshot).
    return _TRAILER.search(data, max(0, len(data.rstrip()) - _TRAILER_LEN))


def is_sealed(data: bytes) -> bool:
    return _trailer(data) is not None


def unseal(data: bytes, key: str, what: str = "record") -> JsonObject:
    """Check and decode a sealed record; raise :class:`CorruptData` naming ``key``."""
    return loads(checked(data, key, what), key, what)


def checked(data: bytes, key: str, what: str = "record") -> bytes:
    """A sealed record's JSON (without its ``crc``), once its checksum is checked; raise
    :class:`CorruptData` naming ``key``. For a reader that decodes it straight into its
    type (see :func:`ctp_state.snapshot.decode_snapshot`)."""
    raw = checked_if_sealed(data, key, what)
    if raw is None:
        raise CorruptData(key, f"{what} has no checksum (it is truncated, or not a sealed record)")
    return raw


def checked_if_sealed(data: bytes, key: str, what: str = "record") -> bytes | None:
    """:func:`checked` for a record that may be sealed; None: it is not (a reader of
    unsealed legacy records decides what that means). One look for the trailer, where
    :func:`is_sealed` and then :func:`checked` take two: every log entry and snapshot
    read goes through here."""
    m = _trailer(data)
    if m is None:
        return None
    raw = data[: m.start()] + b"}"
    if crc32c(raw) != int(m.group(1), 16):
        raise CorruptData(key, f"{what} fails its CRC32C check: its bytes changed after they were written")
    return raw


def loads(data: bytes, key: str, what: str = "record") -> JsonObject:
    """Decode a JSON object; raise :class:`CorruptData`. msgspec's parser, not the
    standard library's: a state-log entry parses in 0.4 us instead of 3 (every read of
    every partition goes through here). It is stricter: UTF-8 only (no BOM, no UTF-16),
    no NaN or Infinity, no lone surrogate, no number past 64-bit floats' range -- none
    of which ctp writes, and each a CorruptData as any record that does not parse."""
    try:
        body = _JSON.decode(data)
    # Not JSON, not UTF-8, a number out of range, or nested too deep.
    except (ValueError, RecursionError) as e:
        raise CorruptData(key, f"{what} is not valid JSON ({getattr(e, 'msg', e)})") from None
    if not isinstance(body, dict):
        raise CorruptData(key, f"{what} is not a JSON object")
    return body
