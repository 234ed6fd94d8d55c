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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ctp_state import crashpoints, incarnations, layout, validate
from ctp_state.entries import Seal
from ctp_state.errors import CtpError
from ctp_state.incarnations import NameState
from ctp_state.log import PartitionLog
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
    uninitialized: int = 0  # partitions whose log has no init (nothing can append to them)
    errors: list[tuple[int, str]] = field(default_factory=list)


def seal_incarnation(
    store: ObjectStore,
    t: Topic,
    *,
    threads: int = 16,
    on_progress: Callable[[int, int], None] = lambda done, total: None,
) -> SealResult:
    """Append a seal entry to every partition log of deleted incarnation ``t`` that has
    none (idempotent). A partition that fails is reported in ``errors``, never skipped
    silently: the GC removes nothing of ``t`` until every log is sealed."""
    res = SealResult()
    now_ms = int(time.time() * 1000)

    def one(p: int) -> tuple[str, str | None]:
        plog = PartitionLog(store, t, p)
        try:
            st = plog.read_state()
            if st.sealed:
                return "already", None
            if not st.initialized:
                return "uninitialized", None
            plog.append(st, lambda _s: Seal(now_ms))
            return "sealed", None
        except CtpError as e:
            return "error", str(e)

    on_progress(0, t.partitions)
    with ThreadPoolExecutor(max_workers=max(1, min(threads, t.partitions))) as pool:
        for p, (what, why) in enumerate(pool.map(one, range(t.partitions))):
            if what == "error":
                res.errors.append((p, why or ""))
            else:
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
) -> tuple[Topic, SealResult]:
    """Delete ``name``'s live incarnation (``expect_id``: only if it is that one): the
    tombstone, then the seals. Raises :class:`~ctp_state.errors.TopicNotFound` (or
    ``TopicDeleted``) when there is nothing live to delete."""
    validate.topic_name(name)
    t = incarnations.tombstone(store, name, expect_id=expect_id)
    crashpoints.reached("delete_after_tombstone")
    return t, seal_incarnation(store, t, threads=threads, on_progress=on_progress)


# --- the GC's part ------------------------------------------------------------------------


#: The order a deleted incarnation's state goes in: its logs (and their seals) last.
REMOVAL_ORDER = (layout.L1_ROOT, layout.SNAPSHOTS_ROOT, layout.LOGS_ROOT)


def state_keys(store: ObjectStore, t: Topic, root: str) -> list[ObjectInfo]:
    """Every key of incarnation ``t`` under ``root`` (logs, snapshots or L1). An
    incarnation whose keys carry only its name owns the 6-digit partition directories
    under ``<root><name>/``; an id directory there belongs to another incarnation."""
    if t.key_id is not None:
        return list(store.list(f"{root}{layout.space(t.name, t.key_id)}/"))
    top = f"{root}{t.name}/"
    out: list[ObjectInfo] = []
    for d in store.list_level(top)[0]:
        if layout.is_partition_dir(d, top):
            out.extend(store.list(d))
    return out


@dataclass
class RemoveResult:
    removed: list[Topic] = field(default_factory=list)  # incarnations whose state is gone now
    waiting: list[Topic] = field(default_factory=list)  # tombstones younger than the grace period
    deleted: list[ObjectInfo] = field(default_factory=list)
    failed: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)


def due(store: ObjectStore, names: list[NameState], *, now_s: float, grace_s: float) -> tuple[list[Topic], list[Topic]]:
    """The deleted incarnations whose state may go now (tombstone at least ``grace_s``
    old by the store's clock: the time it wrote the record), and those that must wait."""
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
) -> RemoveResult:
    """Remove the state of every deleted incarnation that is due (see the module
    docstring for the order). ``delete(objects)`` deletes and returns the keys that
    still failed. An incarnation with a failure stays "deleting" for the next run."""
    res = RemoveResult()
    ready, res.waiting = due(store, names, now_s=now_s, grace_s=grace_s)
    for t in ready:
        what = f"{t.name} (incarnation {t.incarnation})"
        try:
            sealed = seal_incarnation(store, t)
            if sealed.errors:
                p, why = sealed.errors[0]
                res.errors.append(f"{what}: partition {p} could not be sealed: {why}")
                continue
            ok = True
            for root in REMOVAL_ORDER:
                objs = state_keys(store, t, root)
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
