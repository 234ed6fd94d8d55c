"""Topics: a name and a partition count; each partition's log starts with ``init``.

Creation order matters for R4. The topic's metadata is written first, and only then
is the cluster epoch read for the ``init`` entries. So a GC that does not see the
topic (it lists topics after reading C) knows the inits will carry an epoch >= its C;
a GC that sees the topic but finds a partition without its init must not collect
(see ``ctp_state.gc``). A crashed create is finished by running it again.

Each topic has an **incarnation id**, minted at creation and sealed into its metadata:
deleting a topic and creating the name again makes another incarnation with another
id, and whatever records state about a topic (produce completion markers, the GC's
partition views with their L1 watermarks) says which incarnation it was about, so
nothing learnt about one incarnation is believed of the next (docs/design.md, "Topic
incarnations"). Topics created before ids have none (metadata version 1 and 2): each
is its name's only, legacy, incarnation, and works as before.

Offset 0 of a partition log is its init entry and nothing else (ctp_state.log never
appends anything else to a log without one). A log that an older ctp let a producer
write to first holds a rejected placeholder at offset 0 and no init: running the
create again repairs it by appending the init after those entries (which stay
without effect), so the partition, and the GC, work again.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ctp_state import codec, layout, validate
from ctp_state.entries import Init, decode, encode
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import (
    ConfigError,
    CorruptData,
    InvalidTopicName,
    InvalidTransition,
    KeyExists,
    ObjectNotFound,
    PartitionNotFound,
    TopicExists,
    TopicNotFound,
    UnsupportedVersion,
)
from ctp_state.storage import ObjectStore

META_VERSION = 3
SUPPORTED_META_VERSIONS = (1, 2, 3)  # 1: before checksums; 2: before incarnation ids
_ID_RE = re.compile(r"[0-9a-f]{32}")
MAX_PARTITIONS = 100_000
log = logging.getLogger(__name__)


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

    @property
    def incarnation(self) -> str:
        """The id, or ``"legacy"`` for a topic created before ids (for messages)."""
        return self.id or "legacy"

    def check_partition(self, partition: int) -> int:
        if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < self.partitions:
            raise PartitionNotFound(self.name, partition, self.partitions)
        return partition


def _decode(data: bytes, key: str) -> Topic:
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
            validate.topic_name(b["name"]), partitions, validate.int64(b["created_ms"], what="created_ms"), tid
        )
    except (ValueError, KeyError, TypeError, InvalidTopicName) as e:
        raise CorruptData(key, f"malformed topic metadata: {e}") from None


def encode_meta(topic: Topic) -> bytes:
    body = {"name": topic.name, "partitions": topic.partitions, "created_ms": topic.created_ms}
    if topic.id is None:  # a legacy topic written again as it was (tests of old stores)
        return codec.seal({"v": 2, **body})
    return codec.seal({"v": META_VERSION, **body, "id": topic.id})


def create_topic(
    store: ObjectStore,
    name: str,
    partitions: int,
    *,
    exist_ok: bool = False,
    on_repair: Callable[[int, str], None] | None = None,
    on_progress: Callable[[int, int], None] = lambda done, total: None,
    threads: int = 16,
) -> Topic:
    """Create ``name`` with ``partitions`` partitions, or finish a crashed creation
    (and repair logs an older ctp damaged; ``on_repair(partition, what)`` hears of each,
    from the thread that wrote that partition's init). ``on_progress(done, total)`` is
    called from this thread as the partitions' inits land, every 1,000 and at the end."""
    validate.topic_name(name)
    if isinstance(partitions, bool) or not isinstance(partitions, int) or not 1 <= partitions <= MAX_PARTITIONS:
        raise ConfigError(f"partition count must be an integer in [1, {MAX_PARTITIONS}], got {partitions!r}")
    topic = Topic(name, partitions, int(time.time() * 1000), new_incarnation_id())
    key = layout.topic_meta(name)
    resumed = False
    try:
        store.put_if_absent(key, encode_meta(topic))
    except KeyExists:
        topic = _decode(store.get(key), key)
        if topic.partitions != partitions:
            raise TopicExists(name, topic.partitions) from None
        resumed = True
    # Read C only now that the topic is visible (R4; see the module docstring).
    epoch = ClusterEpoch(store).current()
    body = encode(Init(epoch))

    def init(p: int) -> bool:
        """Write partition ``p``'s init entry; True if it was missing (or repaired)."""
        entry0 = layout.log_entry(name, p, 0)
        try:
            store.put_if_absent(entry0, body)
            return True
        except KeyExists:
            return resumed and _repair(store, name, p, entry0, on_repair)

    # Each init is one create-if-absent: independent, so many go at once (a topic of
    # 100k partitions is 100k round trips, or fsyncs on a file store).
    on_progress(0, partitions)
    missing = 0
    if partitions == 1:
        missing = int(init(0))
    else:
        with ThreadPoolExecutor(max_workers=max(1, min(threads, partitions))) as pool:
            for done, wrote in enumerate(pool.map(init, range(partitions), chunksize=64), 1):
                missing += wrote
                if done % 1000 == 0:
                    on_progress(done, partitions)
    on_progress(partitions, partitions)
    if resumed and not missing and not exist_ok:
        raise TopicExists(name, topic.partitions)
    return topic


def _repair(
    store: ObjectStore, topic: str, partition: int, entry0: str, on_repair: Callable[[int, str], None] | None
) -> bool:
    """Give a log whose offset 0 is not an init entry its init; True if it needed one."""
    from ctp_state.log import PartitionLog  # the log builds on this module's peers

    try:
        if isinstance(decode(store.get(entry0), entry0), Init):
            return False
    except CorruptData:
        pass  # unreadable offset 0: the log's own reader reports it below
    plog = PartitionLog(store, topic, partition)
    state = plog.read_state()
    if state.initialized:
        return False  # repaired already (by a racing create, or an earlier run)
    epoch = ClusterEpoch(store).current()
    try:
        appended = plog.append(state, lambda _s: Init(epoch))
    except InvalidTransition:
        if plog.read_state().initialized:
            return False  # a racing create repaired it first
        raise
    what = (
        f"offset 0 held no init entry (written by an older ctp); appended the init at offset "
        f"{appended.offset} with epoch {epoch}; the {appended.offset} entries before it stay without effect"
    )
    log.warning("%s/%d: %s", topic, partition, what)
    if on_repair is not None:
        on_repair(partition, what)
    return True


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
