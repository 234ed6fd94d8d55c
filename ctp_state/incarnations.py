"""What happened to each topic name: its incarnations, deletes and removals.

A name's first incarnation is its sealed metadata at ``meta/topics/<name>.json``,
written once and never changed. Everything after it is a dense sequence of sealed
:class:`~ctp_state.records.TopicEvent` records at ``meta/history/<name>/<seq>.json``,
each created if absent, so two writers can never both decide what came next:

- ``delete`` -- a tombstone for the current incarnation (``ctp topic delete``);
- ``create`` -- a new incarnation of a deleted name, with a fresh id (``ctp topic create``);
- ``removed`` -- the GC removed a deleted incarnation's state (its logs, snapshots, L1);
- ``config`` -- the live incarnation's retention (``retention_ms``, ``retention_bytes``,
  Kafka's meaning) from here on: set by ``ctp topic create --retention-*`` and changed
  by ``ctp topic alter``, each change a record of its own, never an edit;
- ``lost`` -- an incarnation the history does not record, acknowledged deleted by an
  operator (``ctp topic delete NAME --id ID``): one whose metadata and files vanished
  without a tombstone while the GC still remembers its partitions, or stray state logs
  under an id of no incarnation. It counts as deleted from then on (the GC stops
  refusing on it, and removes what is left of it); it was never live in this history.
  A name whose first incarnation's metadata is gone has a history that begins with one.

Nothing is ever overwritten or deleted here, so no late or repeated write can bring a
deleted incarnation back or hide a new one (a conditional delete of the metadata would
be needed otherwise, and not every S3 server has one). :func:`fold` is pure: it reads
the events in order and refuses one that does not follow (a tombstone for an
incarnation that is not current, a create while one is), naming its key.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from ctp_state import codec, layout, records
from ctp_state.errors import (
    ConfigError,
    ContentionTimeout,
    CorruptData,
    CtpError,
    ObjectNotFound,
    TopicDeleted,
    TopicNotFound,
)
from ctp_state.records import TopicEvent
from ctp_state.sequence import DenseSequence, create_once
from ctp_state.storage import ObjectStore
from ctp_state.topic_meta import Topic, decode_meta, new_incarnation_id


@dataclass(frozen=True)
class NameState:
    """One name: its live incarnation, and the deleted ones whose state is still there."""

    name: str
    current: Topic | None
    #: Deleted incarnations the GC has not removed yet, oldest first, with the seq of
    #: their tombstone.
    deleting: tuple[tuple[Topic, int], ...] = ()
    #: Deleted incarnations the GC removed, oldest first.
    removed: tuple[Topic, ...] = ()
    #: The seq the next event takes.
    next_seq: int = 0
    #: The incarnations (``Topic.incarnation``) among the deleted ones that were
    #: acknowledged lost: no log of theirs is sealed (their state may be partly gone).
    lost: frozenset[str] = frozenset()
    #: The live incarnation's retention (None: keep forever), its newest config event's.
    retention_ms: int | None = None
    retention_bytes: int | None = None

    @property
    def deleted(self) -> tuple[Topic, ...]:
        """Every deleted incarnation, whether or not its state was removed yet."""
        return tuple(t for t, _ in self.deleting) + self.removed


def _same(t: Topic, e: TopicEvent) -> bool:
    return t.id == e.id and t.keyed == e.keyed


def _topic_of(e: TopicEvent) -> Topic:
    return Topic(e.name, e.partitions, e.created_ms, e.id, keyed=e.keyed)


def fold(name: str, first: Topic | None, events: list[tuple[str, TopicEvent]]) -> NameState:
    """The name's state after ``first`` and ``events`` (``(key, event)`` in seq order). Pure."""
    current, deleting, removed = first, list[tuple[Topic, int]](), list[Topic]()
    lost: set[str] = set()
    retention: tuple[int | None, int | None] = (None, None)
    if first is None and events and events[0][1].kind != "lost":
        raise CorruptData(
            events[0][0], f"topic history of {name} without its first incarnation {layout.topic_meta(name)}"
        )
    for key, e in events:
        if e.name != name or e.kind not in TopicEvent.KINDS:
            raise CorruptData(key, f"topic history record of {e.name!r} ({e.kind}) under {name!r}")
        if e.kind == "config":
            if current is None or not _same(current, e):
                raise CorruptData(
                    key, f"retention of incarnation {e.id or 'legacy'}, which is not {name}'s current one"
                )
            retention = (e.retention_ms, e.retention_bytes)
        elif e.kind == "delete":
            if current is None or not _same(current, e):
                raise CorruptData(
                    key, f"tombstone for incarnation {e.id or 'legacy'}, which is not {name}'s current one"
                )
            deleting.append((current, e.seq))
            current, retention = None, (None, None)
        elif e.kind == "lost":
            # The live incarnation itself (its metadata restored after the event): the
            # event is its tombstone, as a delete's is whatever comes back of its
            # metadata. One already deleted: nothing more. Another incarnation's keys
            # (a legacy space that is a live topic's of metadata version 3): without
            # effect -- a lost event never removes what another incarnation owns.
            gone = _topic_of(e)
            if current is not None and _same(current, e):
                deleting.append((current, e.seq))
                lost.add(current.incarnation)
                current, retention = None, (None, None)
            elif not any(
                _same(t, e) or t.key_id == gone.key_id
                for t in [*([current] if current is not None else []), *(t for t, _ in deleting), *removed]
            ):
                deleting.append((gone, e.seq))
                lost.add(gone.incarnation)
        elif e.kind == "create":
            if current is not None or e.id is None or not e.keyed:
                raise CorruptData(key, f"new incarnation {e.id} of {name} while another is live")
            current = _topic_of(e)
        else:  # removed
            i = next((i for i, (t, _) in enumerate(deleting) if _same(t, e)), None)
            if i is None:
                raise CorruptData(key, f"removal of incarnation {e.id or 'legacy'} of {name}, which was not deleted")
            removed.append(deleting.pop(i)[0])
    return NameState(
        name, current, tuple(deleting), tuple(removed), len(events), frozenset(lost), retention[0], retention[1]
    )


def history(store: ObjectStore, name: str) -> DenseSequence[TopicEvent]:
    return DenseSequence(store, layout.topic_history(name), TopicEvent)


def _events(store: ObjectStore, name: str) -> list[tuple[str, TopicEvent]]:
    """Every event of ``name``, in seq order: one LIST (almost always empty) and a GET each."""
    seq = history(store, name)
    out: list[tuple[str, TopicEvent]] = []
    for info in store.list(seq.prefix):
        n = layout.parse_sequence_name(info.key[len(seq.prefix) :])
        if n is None:
            continue  # the sequence's hint
        if n != len(out):
            raise CorruptData(info.key, f"topic history of {name} has no record {len(out)}")
        out.append((info.key, seq.decode(store.get(info.key), info.key)))
    return out


def read_first(store: ObjectStore, name: str) -> Topic | None:
    key = layout.topic_meta(name)
    try:
        return decode_meta(store.get(key), key)
    except ObjectNotFound:
        return None


def read_name(store: ObjectStore, name: str) -> NameState:
    """``name`` as the store holds it now (a GET, and a LIST of its history)."""
    first = read_first(store, name)
    events = _events(store, name)
    if first is None and not events:
        return NameState(name, None)
    return fold(name, first, events)


def all_names(store: ObjectStore) -> list[NameState]:
    """Every name ever created, by name: one LIST of the first incarnations and one of
    every history, then a GET per record. Both listings cross the level of topic names,
    where a server may list directory by directory (``t/`` before ``t-2/``): each is
    taken whole and ordered here (:meth:`ObjectStore.list_all`)."""
    firsts = {}
    for info in store.list_all(layout.TOPICS):
        if info.key.endswith(".json"):
            t = decode_meta(store.get(info.key), info.key)
            firsts[t.name] = t
    events: dict[str, list[tuple[str, TopicEvent]]] = {}
    for info in store.list_all(layout.TOPIC_HISTORY):
        name, _, tail = info.key[len(layout.TOPIC_HISTORY) :].rpartition("/")
        if layout.parse_sequence_name(tail) is None:
            continue
        e = history(store, name).decode(store.get(info.key), info.key)
        events.setdefault(name, []).append((info.key, e))
    out = []
    for name in sorted(set(firsts) | set(events)):
        evs = events.get(name, [])
        for i, (key, e) in enumerate(evs):
            if e.seq != i:
                raise CorruptData(key, f"topic history of {name} has no record {i}")
        out.append(fold(name, firsts.get(name), evs))  # (a history without a first: refused unless lost)
    return out


def current(store: ObjectStore, name: str) -> Topic:
    """The live incarnation of ``name``; :class:`TopicNotFound` (or :class:`TopicDeleted`)."""
    st = read_name(store, name)
    if st.current is not None:
        return st.current
    if st.deleting or st.removed:
        last = (st.deleting[-1][0] if st.deleting else st.removed[-1]).incarnation
        raise TopicDeleted(name, last)
    raise TopicNotFound(name)


def _append(
    store: ObjectStore, name: str, decide: Callable[[NameState], TopicEvent | None], *, attempts: int = 32
) -> tuple[NameState, TopicEvent | None]:
    """Append ``decide(state)`` at the seq after the last event ``state`` holds, deciding
    again on a re-read state after every lost race; ``decide`` returns None to write
    nothing, or raises. The seq always follows what was read, so the history stays dense."""
    seq = history(store, name)
    for _ in range(attempts):
        st = read_name(store, name)
        ev = decide(st)
        if ev is None:
            return st, None
        ev = msgspec.structs.replace(ev, seq=st.next_seq, v=TopicEvent.VERSION)
        if create_once(store, seq.key(st.next_seq), codec.seal(records.encode(ev))):
            return st, ev
    raise ContentionTimeout(f"appending to {seq.prefix}", attempts)


def _live(st: NameState, name: str, expect_id: str | None) -> Topic:
    """The name's live incarnation (``expect_id``: only if it is that one)."""
    t = st.current
    if t is None:
        raise TopicDeleted(name, st.deleting[-1][0].incarnation) if st.deleting else TopicNotFound(name)
    if expect_id is not None and t.incarnation != expect_id:
        raise TopicNotFound(f"{name} (incarnation {expect_id}; the live one is {t.incarnation})")
    return t


def _event(kind: str, t: Topic, *, retention_ms: int | None = None, retention_bytes: int | None = None) -> TopicEvent:
    """A history record of ``kind`` about incarnation ``t``, stamped now (for people)."""
    return TopicEvent(
        kind=kind,
        name=t.name,
        id=t.id,
        keyed=t.keyed,
        partitions=t.partitions,
        created_ms=t.created_ms,
        at_ms=int(time.time() * 1000),
        retention_ms=retention_ms,
        retention_bytes=retention_bytes,
    )


def tombstone(store: ObjectStore, name: str, *, expect_id: str | None = None) -> Topic:
    """Write the tombstone of ``name``'s live incarnation (``expect_id``: only if it is
    that one); return the incarnation deleted. The name resolves to nothing from here on
    (:func:`current`); its partitions stop counting for M."""

    def decide(st: NameState) -> TopicEvent:
        t = _live(st, name, expect_id)
        return _event("delete", t)

    _, ev = _append(store, name, decide)
    assert ev is not None
    return _topic_of(ev)


def recreate(store: ObjectStore, name: str, partitions: int) -> tuple[Topic, bool]:
    """Make a new incarnation of a deleted ``name``, or return the live one. ``(topic,
    made)``: ``made`` False when an incarnation was live already (a racing create, or an
    earlier run of this one)."""
    fresh = Topic(name, partitions, int(time.time() * 1000), new_incarnation_id(), keyed=True)

    def decide(st: NameState) -> TopicEvent | None:
        if st.current is not None:
            return None
        return TopicEvent(
            kind="create",
            name=name,
            id=fresh.id,
            keyed=True,
            partitions=partitions,
            created_ms=fresh.created_ms,
            at_ms=fresh.created_ms,
        )

    st, ev = _append(store, name, decide)
    if ev is None:
        assert st.current is not None
        return st.current, False
    return fresh, True


def mark_removed(store: ObjectStore, t: Topic) -> bool:
    """Record that the GC removed deleted incarnation ``t``'s state; False if an earlier
    (or racing) run recorded it already."""

    def decide(st: NameState) -> TopicEvent | None:
        if not any(d.incarnation == t.incarnation and d.keyed == t.keyed for d, _ in st.deleting):
            return None
        return _event("removed", t)

    return _append(store, t.name, decide)[1] is not None


def set_retention(
    store: ObjectStore,
    name: str,
    retention_ms: int | None,
    retention_bytes: int | None,
    *,
    expect_id: str | None = None,
) -> tuple[Topic, bool]:
    """Record the live incarnation's retention from now on (None: keep forever), as a
    record of its own in the name's history; ``(topic, changed)``: nothing is written when
    it is already so. ``expect_id``: only for that incarnation."""
    for what, v in (("retention_ms", retention_ms), ("retention_bytes", retention_bytes)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(f"{what} must be a positive integer or none, got {v!r}")

    def decide(st: NameState) -> TopicEvent | None:
        t = _live(st, name, expect_id)
        if (st.retention_ms, st.retention_bytes) == (retention_ms, retention_bytes):
            return None
        return _event("config", t, retention_ms=retention_ms, retention_bytes=retention_bytes)

    st, ev = _append(store, name, decide)
    assert st.current is not None
    return st.current, ev is not None


def acknowledge_lost(store: ObjectStore, t: Topic) -> bool:
    """Record incarnation ``t`` of ``t.name``, which the history does not record, as
    lost and deleted; False if it is recorded already (a rerun, a racing operator)."""

    def decide(st: NameState) -> TopicEvent | None:
        recorded = [x for x in (st.current, *st.deleted) if x is not None]
        if any(x.incarnation == t.incarnation and x.keyed == t.keyed for x in recorded):
            return None
        owner = next((x for x in recorded if x.key_id == t.key_id), None)
        if owner is not None:  # its keys are a recorded incarnation's: not lost, and not to be removed
            raise CtpError(
                f"topic {t.name}: the keys of incarnation {t.incarnation} are incarnation {owner.incarnation}'s "
                f"(keys named by the topic only); delete that one with --id {owner.incarnation}"
            )
        return _event("lost", t)

    return _append(store, t.name, decide)[1] is not None


__all__ = [
    "NameState",
    "acknowledge_lost",
    "all_names",
    "current",
    "fold",
    "mark_removed",
    "read_name",
    "recreate",
    "set_retention",
    "tombstone",
]
