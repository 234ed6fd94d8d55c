"""Validation of names and numbers that come from users or from the store."""

from __future__ import annotations

import re

from ctp_state.errors import InvalidEpoch, InvalidTopicName

INT64_MAX = 2**63 - 1
#: The largest cluster epoch: L0 keys and epoch markers hold an epoch in 18 zero-padded
#: digits, so that key order is epoch order. A 19-digit epoch would break both.
MAX_EPOCH = 10**18 - 1
#: Record timestamps, in ms since the Unix epoch: 1970-01-01 to 9999-12-31T23:59:59.999Z,
#: what every Parquet reader and datetime library can represent.
MAX_TIMESTAMP_MS = 253_402_300_799_999

# Kafka's rule for topic names. It also keeps names safe as object-key and path parts:
# no '/', and '.' / '..' are refused below.
_TOPIC_RE = re.compile(r"[A-Za-z0-9._-]{1,249}")


def topic_name(name: object) -> str:
    """Return ``name`` if it is a valid topic name, else raise :class:`InvalidTopicName`."""
    if not isinstance(name, str):
        raise InvalidTopicName(repr(name), "must be a string")
    if name in (".", ".."):
        raise InvalidTopicName(name, "'.' and '..' are reserved")
    if not _TOPIC_RE.fullmatch(name):
        if not name:
            raise InvalidTopicName(name, "must not be empty")
        if len(name) > 249:
            raise InvalidTopicName(name[:40] + "...", f"is {len(name)} characters, at most 249 allowed")
        raise InvalidTopicName(name, "only letters, digits, '.', '_' and '-' are allowed")
    return name


def epoch(value: object, *, what: str = "epoch") -> int:
    """Return ``value`` as a cluster epoch (an int64 >= 1) or raise :class:`InvalidEpoch`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidEpoch(value, f"{what} must be an integer")
    if value < 1:
        raise InvalidEpoch(value, f"{what} must be >= 1")
    if value > MAX_EPOCH:
        raise InvalidEpoch(value, f"{what} must fit in the 18 digits of an L0 key (<= {MAX_EPOCH})")
    return value


def int64(value: object, *, what: str, minimum: int = 0, maximum: int = INT64_MAX) -> int:
    """Return ``value`` if it is an int in [minimum, maximum], else raise ValueError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    if value < minimum or value > maximum:
        raise ValueError(f"{what} must be in [{minimum}, {maximum}], got {value}")
    return value


def timestamp_ms(value: object, *, what: str = "timestamp") -> int:
    """Return ``value`` as a record timestamp or raise ValueError."""
    return int64(value, what=what, minimum=0, maximum=MAX_TIMESTAMP_MS)


def text(value: str, *, what: str) -> bytes:
    """``value`` as UTF-8, or ValueError naming it (a lone surrogate is valid JSON but
    not encodable)."""
    try:
        return value.encode()
    except UnicodeEncodeError:
        raise ValueError(f"{what} is not valid Unicode text (a lone surrogate?)") from None
