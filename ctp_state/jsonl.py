"""Producer input as JSON lines: one record per line.

Fields: ``topic`` (string), ``partition`` (int), ``value`` (utf-8 text) or
``value_b64`` (base64), optional ``key`` / ``key_b64``, ``headers`` (an object of
name -> utf-8 text, or a list of ``[name, text]`` pairs; ``headers_b64`` likewise with
base64 values), ``timestamp`` (int ms since the Unix epoch; default: now), and
``offset``, which is ignored: the partition assigns offsets. So what ``ctp read``
prints (:func:`format_record`) is valid input again: it round-trips.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Iterator
from typing import Any, TextIO

from ctp_state import validate
from ctp_state.codec import JsonObject
from ctp_state.errors import InvalidRecord
from ctp_state.l0 import Record

_FIELDS = {
    "topic",
    "partition",
    "key",
    "key_b64",
    "value",
    "value_b64",
    "headers",
    "headers_b64",
    "timestamp",
    "offset",
}


def _as_text(v: bytes) -> str | None:
    try:
        return v.decode()
    except UnicodeDecodeError:
        return None


def format_record(
    topic: str,
    partition: int,
    offset: int | None,
    timestamp_ms: int,
    key: bytes | None,
    value: bytes,
    headers: list[tuple[str, bytes]] | tuple[tuple[str, bytes], ...],
) -> JsonObject:
    """One record as a JSON-lines object, the inverse of :func:`parse_record`: keys,
    values and header values as text when they are UTF-8, else as base64 (``key_b64``,
    ``value_b64``, ``headers_b64``; the headers go all one way, so their order
    survives)."""
    out: JsonObject = {"topic": topic, "partition": partition}
    if offset is not None:
        out["offset"] = offset
    out["timestamp"] = timestamp_ms
    for name, v in (("key", key), ("value", value)):
        if v is None:
            continue
        text = _as_text(v)
        if text is not None:
            out[name] = text
        else:
            out[name + "_b64"] = base64.b64encode(v).decode()
    if headers:
        texts = [_as_text(v) for _, v in headers]
        if all(t is not None for t in texts):
            out["headers"] = [[k, t] for (k, _), t in zip(headers, texts)]
        else:
            out["headers_b64"] = [[k, base64.b64encode(v).decode()] for k, v in headers]
    return out


def _bytes(obj: JsonObject, name: str, where: str, required: bool) -> bytes | None:
    text, b64 = obj.get(name), obj.get(name + "_b64")
    if text is not None and b64 is not None:
        raise InvalidRecord(where, f"give either {name!r} or {name + '_b64'!r}, not both")
    if text is not None:
        if not isinstance(text, str):
            raise InvalidRecord(where, f"{name!r} must be a string (use {name + '_b64'!r} for binary)")
        try:
            return validate.text(text, what=repr(name))
        except ValueError as e:
            raise InvalidRecord(where, f"{e} (use {name + '_b64'!r} for binary)") from None
    if b64 is not None:
        if not isinstance(b64, str):
            raise InvalidRecord(where, f"{name + '_b64'!r} must be a base64 string")
        try:
            return base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRecord(where, f"{name + '_b64'!r} is not valid base64") from None
    if required:
        raise InvalidRecord(where, f"missing {name!r} (or {name + '_b64'!r})")
    return None


def _b64(v: str) -> bytes:
    try:
        return base64.b64decode(v, validate=True)
    except ValueError as e:  # non-ASCII text (a lone surrogate, say) is not base64 either
        raise binascii.Error(str(e)) from None


def _headers(obj: JsonObject, where: str) -> tuple[tuple[str, bytes], ...]:
    out: list[tuple[str, bytes]] = []
    for field, decode in (("headers", lambda v: validate.text(v, what="a header value")), ("headers_b64", _b64)):
        raw = obj.get(field)
        if raw is None:
            continue
        pairs = raw.items() if isinstance(raw, dict) else raw
        if not isinstance(pairs, (list, type({}.items()))):
            raise InvalidRecord(where, f"{field!r} must be an object or a list of [name, value] pairs")
        pair: Any
        for pair in pairs:
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
                raise InvalidRecord(where, f"{field!r} entries must be [name, value] string pairs")
            try:
                validate.text(pair[0], what="a header name")
            except ValueError as e:
                raise InvalidRecord(where, f"{field!r}: {e}") from None
            try:
                out.append((pair[0], decode(pair[1])))
            except binascii.Error:
                raise InvalidRecord(where, f"{field!r} value for {pair[0]!r} is not valid base64") from None
            except ValueError as e:
                raise InvalidRecord(where, f"{field!r} value for {pair[0]!r}: {e}") from None
    return tuple(out)


def parse_record(obj: Any, where: str, now_ms: int | None = None) -> tuple[str, int, Record]:
    """Validate one decoded JSON line; return ``(topic, partition, record)``."""
    if not isinstance(obj, dict):
        raise InvalidRecord(where, "a line must be a JSON object")
    unknown = set(obj) - _FIELDS
    if unknown:
        raise InvalidRecord(where, f"unknown fields {sorted(unknown)}")
    topic = obj.get("topic")
    if topic is None:
        raise InvalidRecord(where, "missing 'topic'")
    try:
        validate.topic_name(topic)
    except Exception as e:  # InvalidTopicName: re-raise with the location
        raise InvalidRecord(where, str(e)) from None
    partition = obj.get("partition")
    if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
        raise InvalidRecord(where, f"'partition' must be a non-negative integer, got {partition!r}")
    ts = obj.get("timestamp", now_ms if now_ms is not None else int(time.time() * 1000))
    try:
        validate.timestamp_ms(ts, what="'timestamp' (ms since 1970, up to year 9999)")
    except ValueError as e:
        raise InvalidRecord(where, str(e)) from None
    value = _bytes(obj, "value", where, required=True)
    key = _bytes(obj, "key", where, required=False)
    return topic, partition, Record(value, key, ts, _headers(obj, where))  # type: ignore[arg-type]


def read_records(f: TextIO, name: str) -> Iterator[tuple[str, int, Record]]:
    """Yield parsed records; raise :class:`InvalidRecord` naming ``name:line``."""
    now_ms = int(time.time() * 1000)
    for lineno, line in enumerate(f, 1):
        if not line.strip():
            continue
        where = f"{name}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise InvalidRecord(where, f"not valid JSON ({e.msg} at column {e.colno})") from None
        yield parse_record(obj, where, now_ms)
