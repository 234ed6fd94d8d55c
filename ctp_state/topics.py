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

Offset 0 of a partition log is its init entry and nothing else (ctp_state.partition_log never
appends anything else to a log without one). A log that an older ctp let a producer
write to first holds a rejected placeholder at offset 0 and no init: running the
create again repairs it by appending the init after those entries (which stay
without effect), so the partition, and the GC, work again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ctp_state import incarnations, layout, validate
from ctp_state.entries import Init, decode, encode
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import ConfigError, CorruptData, InvalidTransition, KeyExists, TopicExists
from ctp_state.storage import ObjectStore
from ctp_state.topic_meta import (
    MAX_PARTITIONS,
    META_VERSION,
    SUPPORTED_META_VERSIONS,
    Topic,
    decode_meta,
    encode_meta,
    new_incarnation_id as new_incarnation_id,
)

__all__ = [  # with the names callers know topics by, from ctp_state.topic_meta
    "MAX_PARTITIONS",
    "META_VERSION",
    "SUPPORTED_META_VERSIONS",
    "Topic",
    "create_topic",
    "decode_meta",
    "encode_meta",
    "get_topic",
    "list_topics",
    "new_incarnation_id",
]

log = logging.getLogger(__name__)


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
    topic = Topic(name, partitions, int(time.time() * 1000), new_incarnation_id(), keyed=True)
    key = layout.topic_meta(name)
    resumed = False
    try:
        store.put_if_absent(key, encode_meta(topic))
    except KeyExists:
        # The name has a first incarnation: finish it if it is live, else make a new one
        # (its keys carry its own id, so nothing of the deleted one is in its way).
        live = incarnations.read_name(store, name).current
        if live is None:
            topic, made = incarnations.recreate(store, name, partitions)
            resumed = not made
        else:
            topic, resumed = live, True
        if topic.partitions != partitions:
            raise TopicExists(name, topic.partitions) from None
    # Read C only now that the topic is visible (R4; see the module docstring).
    epoch = ClusterEpoch(store).current()
    body = encode(Init(epoch))

    def init(p: int) -> bool:
        """Write partition ``p``'s init entry; True if it was missing (or repaired)."""
        entry0 = layout.log_entry(name, p, 0, topic.key_id)
        try:
            store.put_if_absent(entry0, body)
            return True
        except KeyExists:
            return resumed and _repair(store, topic, p, entry0, on_repair)

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
    store: ObjectStore, topic: Topic, partition: int, entry0: str, on_repair: Callable[[int, str], None] | None
) -> bool:
    """Give a log whose offset 0 is not an init entry its init; True if it needed one."""
    from ctp_state.partition_log import PartitionLog  # the log builds on this module's peers

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
    log.warning("%s/%d: %s", topic.name, partition, what)
    if on_repair is not None:
        on_repair(partition, what)
    return True


def get_topic(store: ObjectStore, name: str) -> Topic:
    """The live incarnation of ``name``; :class:`~ctp_state.errors.TopicNotFound`
    (:class:`~ctp_state.errors.TopicDeleted` for a deleted one) otherwise."""
    validate.topic_name(name)
    return incarnations.current(store, name)


def list_topics(store: ObjectStore) -> list[Topic]:
    """Every live topic, by name (deleted ones: :func:`incarnations.all_names`)."""
    return [st.current for st in incarnations.all_names(store) if st.current is not None]
