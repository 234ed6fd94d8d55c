"""The published vector: per partition, the last record offset a table snapshot accounts
for. Each snapshot ctp commits names its vector in its summary (:data:`PUBLISHED`), a
sealed object under the table's own location (``<location>/published/<uuid>.json``),
written once before the commit. A publish reads the head's vector to know which
committed L1 files the table lacks (:mod:`ctp_state.table.publish`).

A head whose vector is gone from the store (deleted by hand, or by an older ctp's sweep
that robbed a publish in flight) is not a dead end: the head's own data files say the
same thing, and :func:`vector_of_files` rebuilds it from them, checked.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from ctp_state import codec, layout
from ctp_state.errors import CorruptData, ObjectNotFound
from ctp_state.gc.table_hook import TableFile
from ctp_state.storage import ObjectStore
from ctp_state.topic_meta import Topic

PUBLISHED = "ctp.published"  # snapshot summary property: the key of the published vector
#: Written into a table's directory (beside ``published/``) when ctp drops that table to
#: rebuild it: the directory then names a table no catalog holds (it never blocks the
#: GC's R11 deletes).
DROPPED = "dropped"
VECTOR_VERSION = 1
#: Version 2 adds, per partition, the log offset of the newest compact or trim entry the
#: table reflects (``changed``): a publish that finds the partition's files changed since
#: replaces them in the table. Written only once a partition was compacted or trimmed.
VECTOR_VERSION_CHANGES = 2


class VectorMissing(CorruptData):
    """The table's head names a published vector that is not in the store."""

    def __init__(self, key: str):
        super().__init__(
            key,
            "the table's head names a published vector that is not in the store "
            "(`ctp table publish` rebuilds it from the head's data files)",
        )


def key_of(store: ObjectStore, uri: str) -> str:
    """The store key of a URI under the store (:func:`ctp_state.table.catalog.uri_of`'s
    inverse, whichever spelling of the store's root it has); a URI elsewhere is returned
    as it is."""
    return store.key_of(uri) or uri


def vector_key(snapshot: Any) -> str | None:
    """The key of the vector ``snapshot`` names (None: no snapshot, or one ctp did not make)."""
    if snapshot is None or snapshot.summary is None:
        return None
    key: str | None = snapshot.summary.additional_properties.get(PUBLISHED)
    return key


def read_vector(store: ObjectStore, key: str | None) -> dict[int, int]:
    """The vector at ``key`` (``{}`` for None: nothing published yet); raise
    :class:`VectorMissing` if it is not in the store, :class:`CorruptData` if it does
    not read."""
    return read_vector_changes(store, key)[0]


def read_vector_changes(store: ObjectStore, key: str | None) -> tuple[dict[int, int], dict[int, int]]:
    """The vector at ``key`` and, per partition, the log offset of the newest compact or
    trim entry it reflects (absent: none)."""
    if key is None:
        return {}, {}
    try:
        body = codec.unseal(store.get(key), key, "published vector")
    except ObjectNotFound:
        raise VectorMissing(key) from None
    v = body.get("v")
    changes = body.get("changed", []) if v == VECTOR_VERSION_CHANGES else []
    if v not in (VECTOR_VERSION, VECTOR_VERSION_CHANGES) or not isinstance(body.get("through"), list):
        raise CorruptData(key, "not a published vector this ctp reads")
    try:
        return {int(p): int(o) for p, o in body["through"]}, {int(p): int(o) for p, o in changes}
    except (TypeError, ValueError):
        raise CorruptData(key, "not a published vector this ctp reads") from None


def vector_prefix(store: ObjectStore, table: Any, t: Topic) -> str:
    """Where ``t``'s table keeps its vectors in the store: under the table's own location
    (``.../published/``) when that is in the store; for a table whose location its
    catalog decides (a REST catalog's warehouse), under a location of ctp's own named
    like one, ``tables/<space>/<namespace>-<table uuid>/published/``."""
    own = store.key_of(table.location().rstrip("/"))
    if own is not None:
        return own + "/published/"
    namespace: str = table.name()[0] if len(table.name()) > 1 else "table"
    return (
        f"{layout.TABLES_ROOT}{layout.space(t.name, t.key_id)}/{namespace}-{table.metadata.table_uuid.hex}/published/"
    )


def write_vector(
    store: ObjectStore, table: Any, t: Topic, vector: dict[int, int], changed: dict[int, int] | None = None
) -> str:
    """A new sealed vector, in the table's :func:`vector_prefix`."""
    key = f"{vector_prefix(store, table, t)}{uuid.uuid4().hex}.json"
    body: dict[str, Any] = {"v": VECTOR_VERSION, "topic": t.name, "topic_id": t.id, "through": sorted(vector.items())}
    if changed:
        body["v"] = VECTOR_VERSION_CHANGES
        body["changed"] = sorted(changed.items())
    store.put_if_absent(key, codec.seal(body))
    return key


def vector_of_files(files: Iterable[TableFile], where: str) -> dict[int, int]:
    """The vector a snapshot's data files account for: per partition, the last offset of
    files that tile the partition from its first file on, each once. Files that leave a gap or
    overlap are refused (:class:`CorruptData` naming the file and ``where``, the table):
    such a table cannot say what it holds, and nothing is built on it. Pure."""
    out: dict[int, int] = {}
    for f in sorted(files, key=lambda f: (f.partition, f.first_offset)):
        through = out.get(f.partition, f.first_offset - 1)  # (a trimmed partition starts later)
        if f.first_offset != through + 1 or f.last_offset < f.first_offset:
            raise CorruptData(
                f.path,
                f"{where}: data file of partition {f.partition} holds offsets {f.first_offset}-{f.last_offset}, "
                f"where the files before it end at {through}: the table's files do not tile the partition",
            )
        out[f.partition] = f.last_offset
    return out
