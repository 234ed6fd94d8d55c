"""Topics: a name and a partition count; each partition's log starts with ``init``.

Creation order matters for R4. The topic's metadata is written first, and only then
is the cluster epoch read for the ``init`` entries. So a GC that does not see the
topic (it lists topics after reading C) knows the inits will carry an epoch >= its C;
a GC that sees the topic but finds a partition without its init must not collect
(see ``ctp_state.gc``). A crashed create is finished by running it again.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from ctp_state import layout, validate
from ctp_state.entries import Init, encode
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import (
    ConfigError,
    CorruptData,
    KeyExists,
    ObjectNotFound,
    PartitionNotFound,
    TopicExists,
    TopicNotFound,
    UnsupportedVersion,
)
from ctp_state.store import ObjectStore

META_VERSION = 1
MAX_PARTITIONS = 100_000


@dataclass(frozen=True, slots=True)
class Topic:
    name: str
    partitions: int
    created_ms: int

    def check_partition(self, partition: int) -> int:
        if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < self.partitions:
            raise PartitionNotFound(self.name, partition, self.partitions)  # type: ignore[arg-type]
        return partition


def _decode(data: bytes, key: str) -> Topic:
    try:
        b = json.loads(data)
        if b.get("v") != META_VERSION:
            raise UnsupportedVersion(key, "topic metadata", b.get("v"), (META_VERSION,))
        return Topic(validate.topic_name(b["name"]), int(b["partitions"]), int(b["created_ms"]))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CorruptData(key, f"malformed topic metadata: {e}") from None


def create_topic(store: ObjectStore, name: str, partitions: int, *, exist_ok: bool = False) -> Topic:
    """Create ``name`` with ``partitions`` partitions, or finish a crashed creation."""
    validate.topic_name(name)
    if isinstance(partitions, bool) or not isinstance(partitions, int) or not 1 <= partitions <= MAX_PARTITIONS:
        raise ConfigError(f"partition count must be an integer in [1, {MAX_PARTITIONS}], got {partitions!r}")
    topic = Topic(name, partitions, int(time.time() * 1000))
    key = layout.topic_meta(name)
    body = {"v": META_VERSION, "name": name, "partitions": partitions, "created_ms": topic.created_ms}
    resumed = False
    try:
        store.put_if_absent(key, json.dumps(body).encode())
    except KeyExists:
        topic = _decode(store.get(key), key)
        if topic.partitions != partitions:
            raise TopicExists(name, topic.partitions) from None
        resumed = True
    # Read C only now that the topic is visible (R4; see the module docstring).
    epoch = ClusterEpoch(store).current()
    missing = 0
    for p in range(partitions):
        try:
            store.put_if_absent(layout.log_entry(name, p, 0), encode(Init(epoch)))
            missing += 1
        except KeyExists:
            pass
    if resumed and not missing and not exist_ok:
        raise TopicExists(name, topic.partitions)
    return topic


def get_topic(store: ObjectStore, name: str) -> Topic:
    validate.topic_name(name)
    key = layout.topic_meta(name)
    try:
        return _decode(store.get(key), key)
    except ObjectNotFound:
        raise TopicNotFound(name) from None


def list_topics(store: ObjectStore) -> list[Topic]:
    out = []
    for info in store.list(layout.TOPICS):
        if info.key.endswith(".json"):
            out.append(_decode(store.get(info.key), info.key))
    return out
