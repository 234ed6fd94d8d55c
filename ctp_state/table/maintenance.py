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
from dataclasses import dataclass
from typing import Any

from ctp_state import layout
from ctp_state.errors import CtpError
from ctp_state.gc.run import TableMaintainer, TableSweep
from ctp_state.storage import ObjectInfo, ObjectStore
from ctp_state.table.catalog import TOPIC_ID, CatalogConfig, default_path, identifier, open_catalog, uri_of
from ctp_state.table.publish import PUBLISHED
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
        vector = snap.summary.additional_properties.get(PUBLISHED) if snap.summary else None
        if vector:
            out.add(vector)  # a store key
    return out


def unreachable(store: ObjectStore, table: Any, t: Topic, *, now_s: float, grace_s: float) -> list[ObjectInfo]:
    """The metadata files and published vectors of ``t``'s table that nothing reaches,
    older than ``grace_s`` by the store's clock (``now_s``: see
    :func:`ctp_state.deletion.store_now`)."""
    keep = reachable(table)
    # Only under the table's own location: another table of the topic (another
    # namespace, another catalog) has its own, and nothing here reaches into it.
    own = table.location().rstrip("/") + "/"
    root = store.url.rstrip("/") + "/"
    space = f"{layout.TABLES_ROOT}{layout.space(t.name, t.key_id)}/"
    if not own.startswith(root + space):
        raise CtpError(f"table {table.name()} lives at {own}, outside the topic's space {space} in the store")
    out = []
    for sub in ("metadata/", "published/"):
        for o in store.list(own[len(root) :] + sub):
            if o.key in keep or uri_of(store, o.key) in keep:
                continue
            if now_s - o.mtime >= grace_s:
                out.append(o)
    return out


def maintainer(store: ObjectStore, config: CatalogConfig, *, home: str, keep: int, max_age_s: float) -> TableMaintainer:
    """The GC's hook (:data:`ctp_state.gc.run.TableMaintainer`): for every live topic
    with a table, expire its old snapshots, then find what nothing reaches. A table it
    cannot maintain is reported, never a reason to fail the run. With the default
    catalog and no catalog file yet (nothing ever published), it does nothing."""

    def run(now_s: float, grace_s: float) -> TableSweep:
        if config.uri is None and not os.path.exists(default_path(store, home)):
            return TableSweep()
        from pyiceberg.exceptions import NoSuchTableError

        try:
            catalog = open_catalog(store, config, home=home)
        except CtpError as e:
            return TableSweep(errors=[str(e)])
        expired, found, errors = 0, [], []
        for t in list_topics(store):
            name = ".".join(identifier(config, t.name))
            try:
                table = catalog.load_table(identifier(config, t.name))
                if table.properties.get(TOPIC_ID) != t.incarnation:
                    continue  # another incarnation's: the next publish of the name replaces it
                expired += expire(
                    table, keep=keep, max_age_ms=int(max_age_s * 1000), now_ms=int(now_s * 1000)
                ).snapshots
                found += unreachable(store, table.refresh(), t, now_s=now_s, grace_s=grace_s)
            except NoSuchTableError:
                continue
            except Exception as e:  # a catalog or a table file in trouble: report it
                errors.append(f"{name}: {type(e).__name__}: {e}")
        return TableSweep(expired, found, errors)

    return run
