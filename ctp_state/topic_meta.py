"""A topic's sealed metadata: its name, partition count and incarnation id.

The first incarnation of a name is kept at ``meta/topics/<name>.json``; later ones are
records of the name's history (:mod:`ctp_state.incarnations`). Both carry a
:class:`Topic`.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from ctp_state import codec, validate
from ctp_state.errors import CorruptData, InvalidTopicName, PartitionNotFound, UnsupportedVersion

META_VERSION = 4
#: 1: before checksums; 2: before incarnation ids; 3: an id, but keys named by the topic only
SUPPORTED_META_VERSIONS = (1, 2, 3, 4)
_ID_RE = re.compile(r"[0-9a-f]{32}")
MAX_PARTITIONS = 100_000


def new_incarnation_id() -> str:
    """A fresh incarnation id: 128 random bits as 32 lowercase hex digits."""
    return secrets.token_hex(16)


@dataclass(frozen=True, slots=True)
class Topic:
    name: str
    partitions: int
    created_ms: int
    #: The incarnation id (None: a topic created before ids, its name's legacy incarnation).
    id: str | None = None
    #: Whether the id is part of the topic's keys (metadata version 4 on; see
    #: :func:`ctp_state.layout.space`). Older topics keep keys named by the topic only.
    keyed: bool = False

    @property
    def key_id(self) -> str | None:
        """The id as it appears in the topic's keys (None: keys carry only the name)."""
        return self.id if self.keyed else None

    @property
    def incarnation(self) -> str:
        """The id, or ``"legacy"`` for a topic created before ids (for messages)."""
        return self.id or "legacy"

    def check_partition(self, partition: int) -> int:
        if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < self.partitions:
            raise PartitionNotFound(self.name, partition, self.partitions)
        return partition


def decode_meta(data: bytes, key: str) -> Topic:
    """Topic metadata decides which partitions the GC reads (R4), so it is sealed like
    the state log (version 1, written before checksums, is still read)."""
    sealed = codec.is_sealed(data)
    b = codec.unseal(data, key, "topic metadata") if sealed else codec.loads(data, key, "topic metadata")
    if b.get("v") not in SUPPORTED_META_VERSIONS:
        raise UnsupportedVersion(key, "topic metadata", b.get("v"), SUPPORTED_META_VERSIONS)
    if b["v"] != 1 and not sealed:
        raise CorruptData(key, "topic metadata has no checksum (it is truncated, or was edited)")
    try:
        partitions = validate.int64(b["partitions"], what="partitions", minimum=1, maximum=MAX_PARTITIONS)
        tid = None
        if b["v"] >= 3:
            tid = b["id"]
            if not isinstance(tid, str) or not _ID_RE.fullmatch(tid):
                raise ValueError(f"incarnation id must be 32 lowercase hex digits, got {tid!r}")
        return Topic(
            validate.topic_name(b["name"]),
            partitions,
            validate.int64(b["created_ms"], what="created_ms"),
            tid,
            keyed=b["v"] >= 4,
        )
    except (ValueError, KeyError, TypeError, InvalidTopicName) as e:
        raise CorruptData(key, f"malformed topic metadata: {e}") from None


def encode_meta(topic: Topic) -> bytes:
    body = {"name": topic.name, "partitions": topic.partitions, "created_ms": topic.created_ms}
    if topic.id is None:  # a legacy topic written again as it was (tests of old stores)
        return codec.seal({"v": 2, **body})
    return codec.seal({"v": META_VERSION if topic.keyed else 3, **body, "id": topic.id})
