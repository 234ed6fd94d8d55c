"""Keeping a topic's table small: expiring old snapshots, and finding the files nothing
reaches any more (pyiceberg deletes none: it has no orphan cleanup, and its expiry only
edits the metadata).

The GC runs this after its L0 deletes and deletes what :func:`unreachable` returns
behind the same audit trail (``gc/deleted/...``, kind ``table_metadata``). Reachable are:
the head's metadata file and the metadata files its log names, the manifest lists of
the snapshots it keeps, the manifests they list, and the published vectors those
snapshots name. Anything else under ``tables/<space>/metadata/`` or ``.../published/``
is unreachable -- once it is older than a grace period by the store's clock, so that a
publish in flight (its new metadata, manifests and vector written, its commit not yet
made) is never robbed. Data files are never touched here: a table's data files are
committed L1 files (the L1 sweep keeps every committed file) or format 2 copies of them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ctp_state import layout
from ctp_state.errors import CtpError
from ctp_state.gc.table_hook import TableHeads, TableSweep
from ctp_state.settings import GcSettings
from ctp_state.storage import ObjectInfo, ObjectStore
from ctp_state.table.catalog import TOPIC_ID, CatalogConfig, default_path, drop_if_at, identifier, open_catalog
from ctp_state.table.files import published_vector, table_head
from ctp_state.table.vector import DROPPED, vector_key, vector_prefix
from ctp_state.topic_meta import Topic
from ctp_state.topics import list_topics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Expired:
    snapshots: int  # expired by this call
    kept: int


def expire(table: Any, *, keep: int, max_age_ms: int, now_ms: int) -> Expired:
    """Expire every snapshot but the newest ``keep`` and those younger than
    ``max_age_ms`` (by their commit time against ``now_ms``); never the head. A commit
    that loses to a concurrent publish expires nothing (the next run does)."""
    from pyiceberg.exceptions import CommitFailedException

    snaps = sorted(table.snapshots(), key=lambda s: s.timestamp_ms)
    head = table.current_snapshot()
    old = [
        s.snapshot_id
        for s in snaps[: max(0, len(snaps) - keep)]
        if now_ms - s.timestamp_ms > max_age_ms and (head is None or s.snapshot_id != head.snapshot_id)
    ]
    if not old:
        return Expired(0, len(snaps))
    try:
        table.maintenance.expire_snapshots().by_ids(old).commit()
    except CommitFailedException:
        log.info("snapshot expiry of %s lost to a concurrent commit: the next run expires them", table.name())
        return Expired(0, len(snaps))
    return Expired(len(old), len(snaps) - len(old))


def reachable(table: Any) -> set[str]:
    """The URIs of every metadata file, manifest list, manifest and published vector the
    table's current metadata reaches."""
    io = table.io
    meta = table.metadata
    out = {table.metadata_location, *(e.metadata_file for e in meta.metadata_log)}
    for snap in meta.snapshots:
        out.add(snap.manifest_list)
        out.update(m.manifest_path for m in snap.manifests(io))
        vector = vector_key(snap)
        if vector:
            out.add(vector)  # a store key
    return out


#: How far apart two objects' mtimes may be on the store's clock for writes in one order
#: (the store's front ends' clocks, a Last-Modified of whole seconds): a file is older
#: than the head only if it is older by more than this.
CLOCK_SLACK_S = 1.0


def unreachable(
    store: ObjectStore, table: Any, t: Topic, *, now_s: float, grace_s: float, slack_s: float = CLOCK_SLACK_S
) -> list[ObjectInfo]:
    """The files of ``t``'s table in the store that nothing reaches, older than
    ``grace_s`` by the store's clock (``now_s``: see :func:`ctp_state.deletion.store_now`)
    -- and older than the table's head.

    What is looked at is what ctp owns: the table's published vectors, and its
    ``metadata/`` when the table's location is in the store (a SQL catalog's). A table
    whose location its catalog decides (a REST catalog's warehouse) keeps its metadata
    there, and nothing there is ctp's to delete.

    Age alone cannot tell garbage from a publish in flight: a publish paused between
    writing its files (vector, manifests, manifest list, metadata file) and its commit,
    for any length of time, would find them gone and commit a head that names them. The
    head can: a commit lands only on the head it was made from (the catalog's condition),
    and a publish made from the current head ``S`` loaded ``S`` after ``S`` was committed,
    so every file it writes is newer than the vector ``S`` names (written before ``S``'s
    commit). A file older than that vector (by more than ``slack_s``) was written for an
    older head, by a commit that can never land. With no head, or a head whose vector is
    not in the store, nothing is unreachable (a first publish in flight; a head the next
    publish repairs)."""
    own = store.key_of(table.location().rstrip("/"))
    space = f"{layout.TABLES_ROOT}{layout.space(t.name, t.key_id)}/"
    if own is not None and not (own + "/").startswith(space):
        # Only under the table's own location: another table of the topic (another
        # namespace, another catalog) has its own, and nothing here reaches into it.
        raise CtpError(f"table {table.name()} lives at {own}, outside the topic's space {space} in the store")
    head_vector = vector_key(table.current_snapshot())
    listed = store.head(head_vector) if head_vector is not None else None
    if listed is None:
        return []
    older_than_head = listed.mtime - slack_s
    # (as keys: a table written through another spelling of the store's root names the
    # same files by other URIs)
    keep = {store.key_of(uri) or uri for uri in reachable(table)}
    prefixes = [vector_prefix(store, table, t)] + ([own + "/metadata/"] if own is not None else [])
    out = []
    for prefix in prefixes:
        for o in store.list_all(prefix):
            if o.key in keep:
                continue
            if now_s - o.mtime >= grace_s and o.mtime < older_than_head:
                out.append(o)
    return out


def _named_data_files(store: ObjectStore, table: Any) -> set[str]:
    """The store keys of every data file a snapshot of ``table`` names (each manifest read
    once, however many snapshots share it)."""
    io = table.io
    seen: set[str] = set()
    out: set[str] = set()
    for snap in table.snapshots():
        for m in snap.manifests(io):
            if m.manifest_path in seen:
                continue
            seen.add(m.manifest_path)
            for entry in m.fetch_manifest_entry(io, discard_deleted=True):
                out.add(store.key_of(entry.data_file.file_path) or entry.data_file.file_path)
    return out


class CatalogTables:
    """The GC's hook into the topics' tables (:class:`ctp_state.gc.table_hook.TableHook`)
    through one catalog. A table it cannot read or maintain is reported, never a reason
    to fail the run. With the default catalog and no catalog file yet (nothing ever
    published), there are no tables."""

    def __init__(
        self,
        store: ObjectStore,
        config: CatalogConfig,
        *,
        home: str,
        keep: int = GcSettings.table_keep_snapshots,
        max_age_s: float = GcSettings.table_snapshot_max_age_s,
    ):
        self.store, self.config, self.home = store, config, home
        self.keep, self.max_age_s = keep, max_age_s

    @classmethod
    def for_gc(cls, store: ObjectStore, config: CatalogConfig, gc: GcSettings, *, home: str) -> CatalogTables:
        """The hook a GC run with settings ``gc`` uses (keep and age of snapshots)."""
        return cls(store, config, home=home, keep=gc.table_keep_snapshots, max_age_s=gc.table_snapshot_max_age_s)

    def _tables(self, errors: list[str]) -> Iterator[tuple[Topic, Any]]:
        """Each live topic with a table of its own incarnation, and that table."""
        if self.config.uri is None and not os.path.exists(default_path(self.store, self.home)):
            return
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        try:
            catalog = open_catalog(self.store, self.config, home=self.home)
        except CtpError as e:
            errors.append(str(e))
            return
        for t in list_topics(self.store):
            try:
                table = catalog.load_table(identifier(self.config, t.name))
            except (NoSuchTableError, NoSuchNamespaceError):
                continue
            except Exception as e:  # a catalog or a table file in trouble: report it
                errors.append(f"{'.'.join(identifier(self.config, t.name))}: {type(e).__name__}: {e}")
                continue
            if table.properties.get(TOPIC_ID) == t.incarnation:  # else: the next publish replaces it
                yield t, table

    def heads(self) -> TableHeads:
        errors: list[str] = []
        heads = []
        for t, table in self._tables(errors):
            try:
                heads.append(table_head(self.store, table, t))
            except Exception as e:
                errors.append(f"{'.'.join(table.name())}: {type(e).__name__}: {e}")
        return TableHeads(tuple(heads), tuple(errors))

    def published(self) -> tuple[dict[tuple[str, int], int], list[str]]:
        """Per (topic, partition) of every live topic with a table, the last record
        offset its table's head publishes (-1: none yet); and the tables that did not
        read. Only the heads' vectors are read, not their manifests."""
        errors: list[str] = []
        out: dict[tuple[str, int], int] = {}
        for t, table in self._tables(errors):
            try:
                vector = published_vector(self.store, table)
            except Exception as e:
                errors.append(f"{'.'.join(table.name())}: {type(e).__name__}: {e}")
                continue
            out.update({(t.name, p): vector.get(p, -1) for p in range(t.partitions)})
        return out, errors

    def drop(self, t: Topic) -> str | None:
        if self.config.uri is None and not os.path.exists(default_path(self.store, self.home)):
            return None
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        ident = identifier(self.config, t.name)
        try:
            catalog = open_catalog(self.store, self.config, home=self.home)
            table = catalog.load_table(ident)
        except (NoSuchTableError, NoSuchNamespaceError):
            return None
        except Exception as e:  # a catalog in trouble, or metadata already gone (SQL)
            return f"{'.'.join(ident)}: {type(e).__name__}: {e}"
        if table.properties.get(TOPIC_ID) != t.incarnation:
            return None  # another incarnation's (a new one published already)
        try:
            if drop_if_at(catalog, ident, table.metadata_location):
                log.info("dropped table %s of deleted incarnation %s", ".".join(ident), t.incarnation)
        except Exception as e:
            return f"{'.'.join(ident)}: {type(e).__name__}: {e}"
        return None

    def fenced_refs(self, topic: str, topic_id: str | None, candidates: frozenset[str]) -> frozenset[str] | None:
        from pyiceberg.exceptions import CommitFailedException, NoSuchNamespaceError, NoSuchTableError

        from ctp_state.table import register
        from ctp_state.table.vector import PUBLISHED
        from ctp_state.topics import get_topic

        try:
            t = get_topic(self.store, topic)
        except CtpError:  # deleted since the run read its states: the next run decides
            return None
        if t.id != topic_id:
            return None  # re-created since the run read its states: the next run decides
        space = f"{layout.TABLES_ROOT}{layout.space(t.name, t.key_id)}/"
        dirs = [d for d in self.store.list_level(space)[0] if d != space + "copies/"]
        if self.config.uri is None and not os.path.exists(default_path(self.store, self.home)):
            return None if dirs else frozenset()  # (a table this GC's catalog does not know may name them)
        ident = identifier(self.config, topic)
        try:
            catalog = open_catalog(self.store, self.config, home=self.home)
            table = catalog.load_table(ident)
        except (NoSuchTableError, NoSuchNamespaceError):
            if dirs:
                log.warning(
                    "topic %s has table files in the store (%s) its catalog does not know: retired L1 files are kept",
                    topic,
                    dirs[0],
                )
                return None
            return frozenset()
        except Exception as e:
            log.warning("table %s: cannot read it to fence it (%s): its retired L1 files are kept", ".".join(ident), e)
            return None
        if table.properties.get(TOPIC_ID) != t.incarnation:
            return None  # another incarnation's table at the name: this one's may be elsewhere
        own = vector_prefix(self.store, table, t)[: -len("published/")]
        others = [d for d in dirs if d != own and not self._dropped(d)]
        if others:
            # Another table of the topic (another namespace or catalog, one this GC does
            # not maintain) may name the retired files: they stay until it is gone.
            log.warning("topic %s: table %s is not %s's: retired L1 files are kept", topic, others[0], ".".join(ident))
            return None
        try:
            named = frozenset(_named_data_files(self.store, table))
        except Exception as e:
            log.warning("table %s: cannot list its snapshots' files (%s): retired L1 files kept", ".".join(ident), e)
            return None
        if candidates <= named:
            return named  # all still named (snapshots not expired yet): nothing to fence for
        for _ in range(5):
            # The fence: a snapshot of the catalog's own (no files added, the head's vector
            # named again). A publish that read the old head cannot commit on it.
            head = table.current_snapshot()
            props = {PUBLISHED: vk} if (vk := vector_key(head)) is not None else {}
            try:
                tx = register.transaction(table)
                with tx.update_snapshot(snapshot_properties=props).fast_append():
                    pass
                table = tx.commit_transaction()
                break
            except CommitFailedException:
                table = table.refresh()
            except Exception as e:
                log.warning("table %s: cannot fence it (%s): its retired L1 files are kept", ".".join(ident), e)
                return None
        else:
            return None
        try:
            return frozenset(_named_data_files(self.store, table))
        except Exception as e:
            log.warning("table %s: cannot list its snapshots' files (%s): retired L1 files kept", ".".join(ident), e)
            return None

    def _dropped(self, d: str) -> bool:
        """Whether table directory ``d`` belongs to a table ctp dropped (a rebuild)."""
        return self.store.head(d + DROPPED) is not None

    def maintain(self, now_s: float, grace_s: float) -> TableSweep:
        errors: list[str] = []
        expired, found = 0, []
        for t, table in self._tables(errors):
            try:
                expired += expire(
                    table, keep=self.keep, max_age_ms=int(self.max_age_s * 1000), now_ms=int(now_s * 1000)
                ).snapshots
                found += unreachable(self.store, table.refresh(), t, now_s=now_s, grace_s=grace_s)
            except Exception as e:
                errors.append(f"{'.'.join(table.name())}: {type(e).__name__}: {e}")
        return TableSweep(expired, found, errors)
