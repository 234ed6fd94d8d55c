"""Deleting a topic: a tombstone, sealed logs, and the GC's removal of what is left (R10).

``ctp topic delete NAME`` does two things, in this order:

1. **Tombstone.** A sealed ``delete`` record in the name's history
   (:func:`ctp_state.incarnations.tombstone`). From here on the name resolves to
   nothing (``get_topic`` raises :class:`~ctp_state.errors.TopicDeleted`), the GC stops
   counting the incarnation's partitions for M (their L0 chunks become garbage as M
   passes them), and ``ctp topic create NAME`` makes a new incarnation whose keys carry
   its own id, so nothing of the old one is in its way.
2. **Seals.** A ``seal`` entry appended to every partition log of the incarnation
   (:func:`seal_incarnation`). The fold rejects every entry after it, so a producer or
   reconciler that read the topic before the tombstone learns of the delete from the
   log itself, on its next append: a record is either in the log before the seal (and
   goes with the topic) or rejected, never acknowledged into a deleted topic after the
   command returned.

A crash between the two leaves a tombstone with unsealed logs: the GC seals them before
it removes anything. The GC removes a deleted incarnation's state (:func:`remove`) once
its tombstone is older than a grace period by the store's clock: L1 files first, then
snapshots, then logs (the seals last, so they fence appenders as long as possible), then
a ``removed`` record in the history. Every step is a delete of keys in one incarnation's
own space, so a rerun after ``kill -9`` just does it again; nothing outside that space is
touched, whatever happened to the name since.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ctp_state import crashpoints, incarnations, layout, validate
from ctp_state.entries import Init, Seal
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import ConfigError, CtpError, InvalidTransition
from ctp_state.incarnations import NameState
from ctp_state.partition_log import PartitionLog
from ctp_state.storage import ObjectInfo, ObjectStore
from ctp_state.topic_meta import Topic

log = logging.getLogger(__name__)

#: GC: remove a deleted incarnation's state once its tombstone is this old (seconds,
#: store clock): long enough for every request in flight when it was deleted to land.
DEFAULT_REMOVAL_GRACE_S = 3600.0


@dataclass
class SealResult:
    sealed: int = 0  # seal entries appended now
    already: int = 0  # partitions sealed before
    initialized: int = 0  # partitions whose init (of a create still running) the seal had to go after
    errors: list[tuple[int, str]] = field(default_factory=list)
    already_deleted: bool = False  # the incarnation was deleted before this call (its seals finished now)
    lost: bool = False  # an incarnation the history did not record, recorded lost and deleted (no seals)


def seal_incarnation(
    store: ObjectStore,
    t: Topic,
    *,
    threads: int = 16,
    on_progress: Callable[[int, int], None] = lambda done, total: None,
) -> SealResult:
    """Append a seal entry to every partition log of deleted incarnation ``t`` that has
    none (idempotent). A partition that fails is reported in ``errors``, never skipped
    silently: the GC removes nothing of ``t`` until every log is sealed.

    A partition without its init (a ``topic create`` still writing them, or killed) gets
    one first -- offset 0 is an init and nothing else -- and then the seal: a create
    that writes its init later finds it there, and nothing can ever append to the log."""
    res = SealResult()
    now_ms = int(time.time() * 1000)

    def one(p: int) -> tuple[str, str | None]:
        plog = PartitionLog(store, t, p)
        try:
            st = plog.read_state()
            if st.sealed:
                return "already", None
            what = "sealed"
            if not st.initialized:
                epoch = ClusterEpoch(store).current()
                try:
                    st = plog.append(st, lambda _s: Init(epoch)).outcome.state
                except InvalidTransition:
                    st = plog.read_state()  # the create's init landed first
                what = "initialized"
            if not st.sealed:
                plog.append(st, lambda _s: Seal(now_ms))
            return what, None
        except CtpError as e:
            return "error", str(e)

    on_progress(0, t.partitions)
    with ThreadPoolExecutor(max_workers=max(1, min(threads, t.partitions))) as pool:
        for p, (what, why) in enumerate(pool.map(one, range(t.partitions))):
            if what == "error":
                res.errors.append((p, why or ""))
            else:
                if what == "initialized":
                    res.initialized += 1
                    what = "sealed"
                setattr(res, what, getattr(res, what) + 1)
            crashpoints.reached("delete_after_seal", p)
            if (p + 1) % 1000 == 0:
                on_progress(p + 1, t.partitions)
    on_progress(t.partitions, t.partitions)
    return res


def delete_topic(
    store: ObjectStore,
    name: str,
    *,
    expect_id: str | None = None,
    threads: int = 16,
    on_progress: Callable[[int, int], None] = lambda done, total: None,
    remembered: Callable[[], Iterable[tuple[str, str | None, int]]] = lambda: (),
) -> tuple[Topic, SealResult]:
    """Delete ``name``'s live incarnation (``expect_id``: only if it is that one): the
    tombstone, then the seals. Raises :class:`~ctp_state.errors.TopicNotFound` (or
    ``TopicDeleted``) when there is nothing live to delete. An ``expect_id`` the name's
    history does not record is acknowledged lost (:func:`acknowledge_lost`; ``remembered``:
    the partitions the GC remembers, as ``(topic, incarnation id, partition)``).

    With ``expect_id``, doing it again is safe (a retried Airflow task, a rerun after
    ``kill -9``): an incarnation already deleted has its seals finished, and nothing
    else is touched -- in particular not a newer incarnation of the name."""
    validate.topic_name(name)
    st = incarnations.read_name(store, name)
    # Done before (a rerun after kill -9, a retried task): finish the seals of that
    # incarnation -- the one asked for, or the name's last one when it is not live --
    # and touch nothing else, a newer incarnation least of all.
    if expect_id is not None:
        done = next((t for t, _ in st.deleting if t.incarnation == expect_id), None)
        gone = next((t for t in st.removed if t.incarnation == expect_id), None)
        recorded = done or gone or (st.current if st.current and st.current.incarnation == expect_id else None)
        if recorded is None:
            return acknowledge_lost(store, st, expect_id, remembered()), SealResult(lost=True)
    else:
        done = st.deleting[-1][0] if st.current is None and st.deleting else None
        gone = None
        if st.current is not None:
            _refuse_if_a_delete_is_unfinished(store, st, st.current)
    if done is not None and done.incarnation in st.lost:
        return done, seal_lost(store, done)
    if done is not None:
        log.info("%s (incarnation %s) was deleted already; finishing its seals", name, done.incarnation)
        res = seal_incarnation(store, done, threads=threads, on_progress=on_progress)
        res.already_deleted = True
        return done, res
    if gone is not None:
        return gone, SealResult(already_deleted=True)
    t = incarnations.tombstone(store, name, expect_id=expect_id)
    crashpoints.reached("delete_after_tombstone")
    return t, seal_incarnation(store, t, threads=threads, on_progress=on_progress)


def _refuse_if_a_delete_is_unfinished(store: ObjectStore, st: NameState, live: Topic) -> None:
    """A delete without an id, while an earlier delete of the name left logs unsealed (a
    ``ctp topic delete`` killed after its tombstone, then the name created again): the
    operator may be running the interrupted command again, and the live incarnation is
    not the one it chose. Say both, and delete neither."""
    for t, _ in reversed(st.deleting):
        if t.incarnation in st.lost:
            continue
        if not all(PartitionLog(store, t, p).read_state().sealed for p in range(t.partitions)):
            raise CtpError(
                f"topic {st.name}: incarnation {t.incarnation} was deleted and not every log of it is sealed yet "
                f"(an interrupted delete), and incarnation {live.incarnation} is live now: say which with --id "
                f"({t.incarnation} finishes that delete, {live.incarnation} deletes the live one)"
            )


def acknowledge_lost(
    store: ObjectStore, st: NameState, incarnation: str, remembered: Iterable[tuple[str, str | None, int]] = ()
) -> Topic:
    """Record ``incarnation`` of ``st.name``, which the name's history does not record,
    as lost and deleted (``ctp topic delete NAME --id ID``). It must leave a trace: state
    under its space in the store, or partitions the GC remembers of it (``remembered``:
    ``(topic, incarnation id, partition)``, :func:`ctp_state.gc.history.remembered`). Its
    partition count is the most either shows; what can be sealed of it is sealed, and
    the GC stops refusing on it and removes the rest after the grace period."""
    from ctp_state.errors import TopicNotFound

    key_id = None if incarnation == "legacy" else incarnation
    if key_id is not None and not layout.is_id_dir(f"{key_id}/", ""):
        raise ConfigError(f"--id {incarnation!r} is not an incarnation id (32 lowercase hex digits, or 'legacy')")
    owner = next((x for x in (st.current, *st.deleted) if x is not None and x.key_id == key_id), None)
    if owner is not None:  # e.g. --id legacy of a live topic whose keys carry only its name
        raise CtpError(
            f"topic {st.name}: the keys of incarnation {incarnation} are incarnation {owner.incarnation}'s "
            f"(keys named by the topic only); delete that one with --id {owner.incarnation}"
        )
    partitions = 0
    for root in (layout.LOGS_ROOT, layout.SNAPSHOTS_ROOT, layout.L1_ROOT):
        top = f"{root}{layout.space(st.name, key_id)}/"
        for d in store.list_level(top)[0]:
            if layout.is_partition_dir(d, top) and next(iter(store.list(d)), None) is not None:
                partitions = max(partitions, int(d[len(top) : -1]) + 1)
    for topic, topic_id, partition in remembered:
        if topic == st.name and (topic_id or "legacy") == incarnation:
            partitions = max(partitions, partition + 1)
    if partitions == 0:
        live = f"; the live one is {st.current.incarnation}" if st.current is not None else ""
        raise TopicNotFound(
            f"{st.name} (incarnation {incarnation}: neither the topic's history, its state in the store nor the "
            f"GC's memory knows it{live})"
        )
    t = Topic(st.name, partitions, 0, key_id, keyed=key_id is not None)
    if incarnations.acknowledge_lost(store, t):
        log.warning("%s: incarnation %s recorded lost and deleted (%d partitions)", st.name, incarnation, partitions)
        seal_lost(store, t)
        return t
    now = incarnations.read_name(store, st.name)
    if now.current is not None and now.current.incarnation == incarnation:
        raise CtpError(
            f"topic {st.name}: incarnation {incarnation} is live (created meanwhile); run the delete again to delete it"
        )
    return next(x for x in now.deleted if x.incarnation == incarnation)  # recorded by a racing run


def seal_lost(store: ObjectStore, t: Topic) -> SealResult:
    """Seal every log of lost incarnation ``t`` that reads and has its init, as a delete
    seals a recorded one: a writer still holding ``t`` is then refused, never
    acknowledged into an incarnation the GC no longer counts. A log that is gone, or
    does not read, is left as it is (nothing can be sealed there; a writer whose entry
    is gone is refused by the log itself)."""
    res = SealResult(already_deleted=True, lost=True)
    now_ms = int(time.time() * 1000)

    def one(p: int) -> str:
        plog = PartitionLog(store, t, p)
        try:
            st = plog.read_state()
            if st.sealed:
                return "already"
            if not st.initialized:
                return "skipped"
            plog.append(st, lambda _s: Seal(now_ms))
            return "sealed"
        except CtpError:
            return "skipped"

    with ThreadPoolExecutor(max_workers=max(1, min(16, t.partitions))) as pool:
        for what in pool.map(one, range(t.partitions)):
            if what == "sealed":
                res.sealed += 1
            elif what == "already":
                res.already += 1
    return res


# --- the GC's part ------------------------------------------------------------------------


#: The order a deleted incarnation's state goes in: its Iceberg table's files first (they
#: name L1 files), its logs (and their seals) last.
REMOVAL_ORDER = (layout.TABLES_ROOT, layout.L1_ROOT, layout.SNAPSHOTS_ROOT, layout.LOGS_ROOT)


def state_keys(store: ObjectStore, t: Topic, root: str) -> list[ObjectInfo]:
    """Every key of incarnation ``t`` under ``root`` (its table, L1, snapshots or logs).
    An incarnation whose keys carry only its name owns the 6-digit partition directories
    under ``<root><name>/`` (under ``tables/<name>/``, everything but id directories);
    an id directory there belongs to another incarnation. Each listing is taken whole
    (:meth:`ObjectStore.list_all`): under ``tables/<space>/`` names are namespaces."""
    if t.key_id is not None:
        return store.list_all(f"{root}{layout.space(t.name, t.key_id)}/")
    top = f"{root}{t.name}/"
    out: list[ObjectInfo] = []
    dirs, files = store.list_level(top)
    for d in dirs:
        if layout.is_partition_dir(d, top) or (root == layout.TABLES_ROOT and not layout.is_id_dir(d, top)):
            out.extend(store.list_all(d))
    if root == layout.TABLES_ROOT:
        out.extend(files)
    return out


@dataclass
class RemoveResult:
    removed: list[Topic] = field(default_factory=list)  # incarnations whose state is gone now
    waiting: list[Topic] = field(default_factory=list)  # tombstones younger than the grace period
    deleted: list[ObjectInfo] = field(default_factory=list)
    failed: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)


def leftovers(store: ObjectStore, names: list[NameState]) -> list[ObjectInfo]:
    """Keys in the spaces of removed incarnations (written after their removal)."""
    return [o for st in names for t in st.removed for root in REMOVAL_ORDER for o in state_keys(store, t, root)]


def _removal_begun(store: ObjectStore, t: Topic, partition: int) -> bool:
    return store.head(layout.log_entry(t.name, partition, 0, t.key_id)) is None and any(
        True for _ in store.list(layout.log_prefix(t.name, partition, t.key_id))
    )


def store_now(store: ObjectStore) -> float:
    """The store's clock: the mtime of an object written now (a writer's clock never
    decides a delete, R9)."""
    store.put(CLOCK_KEY, b"")
    info = store.head(CLOCK_KEY)
    return info.mtime if info is not None else time.time()


#: An empty object the GC writes to read the store's clock.
CLOCK_KEY = "gc/clock"


def due(store: ObjectStore, names: list[NameState], *, now_s: float, grace_s: float) -> tuple[list[Topic], list[Topic]]:
    """The deleted incarnations whose state may go now (tombstone at least ``grace_s``
    old: the store's time when it wrote the record against ``now_s``, the store's time
    now -- see :func:`store_now`), and those that must wait."""
    ready, waiting = [], []
    for st in names:
        for t, seq in st.deleting:
            info = store.head(incarnations.history(store, st.name).key(seq))
            if info is not None and now_s - info.mtime >= grace_s:
                ready.append(t)
            else:
                waiting.append(t)
    return ready, waiting


def remove(
    store: ObjectStore,
    names: list[NameState],
    *,
    now_s: float,
    grace_s: float = DEFAULT_REMOVAL_GRACE_S,
    delete: Callable[[list[ObjectInfo]], set[str]],
    sweep_removed: bool = False,
    drop_table: Callable[[Topic], str | None] = lambda t: None,
) -> RemoveResult:
    """Remove the state of every deleted incarnation that is due (see the module
    docstring for the order). ``delete(objects)`` deletes and returns the keys that
    still failed. An incarnation with a failure stays "deleting" for the next run."""
    res = RemoveResult()
    if sweep_removed:
        # Keys a writer stalled past the grace period put into a removed incarnation's
        # space after its removal: never read or counted, collected once a period.
        late = leftovers(store, names)
        if late:
            res.failed |= delete(late)
            res.deleted.extend(late)
    if not any(st.deleting for st in names):
        return res
    ready, res.waiting = due(store, names, now_s=min(now_s, store_now(store)), grace_s=grace_s)
    lost = {(st.name, x) for st in names for x in st.lost}
    for t in ready:
        what = f"{t.name} (incarnation {t.incarnation})"
        try:
            if (t.name, t.incarnation) in lost:
                seal_lost(store, t)  # (again: an acknowledgement cut before its seals)
            else:
                sealed = seal_incarnation(store, t)
                # A log whose init is gone while other entries remain is one an earlier run
                # (killed, or failing on some keys) had begun to remove: it cannot be read,
                # so it cannot be sealed, and it needs no seal -- nothing can append to it.
                unsealed = [(p, why) for p, why in sealed.errors if not _removal_begun(store, t, p)]
                if unsealed:
                    p, why = unsealed[0]
                    res.errors.append(f"{what}: partition {p} could not be sealed: {why}")
                    continue
            # The table's catalog entry first: it names the files about to go (a REST
            # catalog's table would be loadable and unreadable). Not a reason to wait.
            not_dropped = drop_table(t)
            if not_dropped:
                res.errors.append(f"{what}: its table was not dropped: {not_dropped}")
            ok = True
            for root in REMOVAL_ORDER:
                objs = state_keys(store, t, root)
                if root == layout.LOGS_ROOT:
                    # Every log's offset 0 first, alone: a removal cut anywhere after it
                    # leaves logs whose init is gone (begun, above), never an init with a
                    # hole behind it (batches in flight at once land in any order), which
                    # no reader could read and no run could seal.
                    heads = [o for o in objs if o.key.endswith(f"/{0:020d}.json")]
                    failed = delete(heads) if heads else set()
                    if not failed:
                        rest = [o for o in objs if not o.key.endswith(f"/{0:020d}.json")]
                        failed = delete(rest) if rest else set()
                else:
                    failed = delete(objs) if objs else set()
                res.deleted.extend(objs)
                res.failed |= failed
                crashpoints.reached("gc_remove_after_" + root.rstrip("/"))
                if failed:
                    res.errors.append(f"{what}: {len(failed)} keys under {root} could not be deleted")
                    ok = False
                    break
            if ok:
                incarnations.mark_removed(store, t)
                res.removed.append(t)
        except CtpError as e:
            res.errors.append(f"{what}: {e}")
    return res
