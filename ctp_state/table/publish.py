"""Publishing a topic's committed L1 files to its Iceberg table, exactly once.

The state log stays the commit point; the table is a projection of it. Each table
snapshot ctp commits names, in its summary (``ctp.published``), a sealed *published
vector* in the store (``<table location>/published/<uuid>.json``; a table's location is
``tables/<space>/<namespace>-<uuid>/``, its own): per partition, the last
record offset whose L1 file is accounted for in the table. A publish

1. reads the table's current snapshot and its vector;
2. reads every partition's state and takes the committed L1 files past the vector
   (committed files of a partition are contiguous, so "past the vector" is exact);
3. writes the next vector, then appends exactly those files in one commit whose only
   precondition is that the snapshot of step 1 is still the table's head.

A commit that loses to a concurrent publisher fails (ctp turns pyiceberg's retries off:
they would rebase the append and could register a file twice); the publish then starts
again from step 1, where the winner's files are already accounted for. A commit whose
outcome is unknown (the catalog's response lost) is resolved the same way: if the head
now names this publish's vector, it landed. So a file is appended once, only if its
reconcile entry committed it, and none is skipped: the vector and the files travel in
one commit.

Files of L1 format 1 (``ctp_state.l1``: milliseconds, no partition column) cannot go
into an Iceberg table as they are. The publish that first meets one writes a format 2
copy of its rows beside the table (``tables/<space>/copies/<partition>/<first>-<last>.parquet``,
created once: a rerun takes over a copy holding the same rows) and appends the copy; the
committed file itself is never touched.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from ctp_state import crashpoints, layout, state as sm
from ctp_state.codec import JsonObject
from ctp_state.errors import CorruptData, CtpError
from ctp_state.partition_state import L1Ref
from ctp_state.storage import ObjectStore
from ctp_state.table import register
from ctp_state.table.catalog import (
    NO_RETRIES,
    REST_PROPERTIES,
    TOPIC_ID,
    CatalogConfig,
    drop_if_at,
    identifier,
    location,
    registered_location,
    uri_of,
)
from ctp_state.table.files import data_files
from ctp_state.table.vector import (
    DROPPED,
    PUBLISHED,
    VectorMissing,
    key_of,
    read_vector_changes,
    vector_key,
    vector_of_files,
    vector_prefix,
    write_vector,
)
from ctp_state.topic_meta import Topic

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Published:
    """What one publish did."""

    topic: str
    topic_id: str | None
    table: str  # namespace.topic
    snapshot_id: int | None  # the table's head after the publish
    files_added: int
    records_added: int
    format1_copied: int  # format 1 files appended as format 2 copies
    attempts: int  # commits tried (more than one: lost races, or an outcome looked up)
    vector: dict[int, int] = field(default_factory=dict)  # partition -> last record offset accounted for
    files_removed: int = 0  # data files a compaction or trim replaced or dropped, out of the table

    def as_dict(self) -> JsonObject:
        """JSON for the CLI and the DAG's XCom (the vector, one entry per partition, left out)."""
        return {k: v for k, v in asdict(self).items() if k != "vector"}


def ensure_table(catalog: Any, store: ObjectStore, t: Topic, config: CatalogConfig) -> Any:
    """The table of incarnation ``t``, created if absent (schema from L1's, partitioned by
    ``identity(partition)``), in a location of its own under the incarnation's space.

    ``t`` must be the name's live incarnation (else :class:`TopicChanged`). A table at the
    name that belongs to a *deleted* incarnation is dropped -- only that table: the drop
    is conditional on the metadata it was judged by, so two publishers replacing it never
    drop each other's new table. A table of any other incarnation is never dropped."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError, TableAlreadyExistsError

    from ctp_state.table.schema import iceberg_schema, partition_spec

    ident = identifier(config, t.name)
    name = ".".join(ident)
    _check_live(store, t)
    mine = t.incarnation
    for _ in range(5):
        try:
            table = catalog.load_table(ident)
        except (NoSuchTableError, NoSuchNamespaceError):  # (a REST catalog says which is missing)
            _ensure_namespace(catalog, config.namespace)  # (only when a table is made: one query less)
            try:
                return catalog.create_table(
                    ident,
                    schema=iceberg_schema(),
                    partition_spec=partition_spec(),
                    # A REST catalog decides where a table's metadata lives (its warehouse),
                    # and keeps it small there (REST_PROPERTIES); a SQL catalog's tables
                    # live in the topic's space, where the GC keeps them small.
                    location=None if config.is_rest else f"{location(store, t)}/{config.namespace}-{uuid.uuid4().hex}",
                    properties={
                        **NO_RETRIES,
                        **register.METRICS,
                        **(REST_PROPERTIES if config.is_rest else {}),
                        TOPIC_ID: mine,
                        "format-version": "2",
                    },
                )
            except TableAlreadyExistsError:
                continue  # a concurrent publish created it: load that one
            except NoSuchNamespaceError:
                continue  # created by a racing publish, not visible yet: ensure it again
        except (OSError, ValueError) as e:
            # Registered, but its metadata does not read. If the store no longer has it, the
            # GC removed a deleted incarnation's table (the catalog entry is the one thing it
            # cannot reach): drop that entry. Anything else is an error to look at.
            where = registered_location(catalog, ident)
            if where is None or store.head(key_of(store, where)) is not None:
                raise CtpError(f"table {name} does not load: {type(e).__name__}: {e}") from None
            log.warning("dropping table %s: its metadata %s is gone from the store", name, where)
            drop_if_at(catalog, ident, where)
            continue
        theirs = table.properties.get(TOPIC_ID)
        if theirs == mine:
            return table
        if theirs not in _deleted_incarnations(store, t.name):
            raise TopicChanged(t, f"table {name} belongs to its incarnation {theirs}")
        log.warning(
            "dropping table %s of deleted incarnation %s (topic %s is incarnation %s)", name, theirs, t.name, mine
        )
        drop_if_at(catalog, ident, table.metadata_location)
    raise CtpError(f"table {name} keeps changing under this publish: is another publisher looping?")


def _ensure_namespace(catalog: Any, namespace: str, attempts: int = 5) -> None:
    """The namespace, created if absent. Publishers racing to create it: the loser's
    create fails (an integrity error, a conflict) and the winner's may not be visible
    yet (a REST catalog answers NoSuchNamespace for a moment): look again, a few times."""
    from pyiceberg.exceptions import NoSuchNamespaceError

    for attempt in range(attempts):
        try:
            catalog.create_namespace_if_not_exists(namespace)
            return
        except Exception:  # a concurrent publish created it first
            try:
                catalog.load_namespace_properties(namespace)
                return
            except NoSuchNamespaceError:
                if attempt == attempts - 1:
                    raise
                time.sleep(0.1 * (attempt + 1))


class TopicChanged(CtpError):
    """The topic a publish was asked to publish is no longer the name's live incarnation."""

    def __init__(self, t: Topic, why: str):
        super().__init__(
            f"topic {t.name} is no longer incarnation {t.incarnation} ({why}): deleted since this publish began; "
            "nothing published for it"
        )


def _check_live(store: ObjectStore, t: Topic) -> None:
    from ctp_state.topics import get_topic

    try:
        live = get_topic(store, t.name)
    except CtpError as e:
        raise TopicChanged(t, str(e)) from None
    if live.incarnation != t.incarnation:
        raise TopicChanged(t, f"it is incarnation {live.incarnation} now")


def _deleted_incarnations(store: ObjectStore, name: str) -> set[str]:
    from ctp_state.incarnations import read_name

    st = read_name(store, name)
    return {d.incarnation for d, _ in st.deleting} | {r.incarnation for r in st.removed}


def pending_files(states: list[sm.PartitionState], vector: dict[int, int]) -> list[tuple[int, L1Ref]]:
    """The committed L1 files past ``vector``, per partition in offset order. Pure."""
    out = []
    for st in states:
        through = vector.get(st.partition, -1)
        for ref in st.committed_l1_files():
            if ref.last <= through:
                continue
            if ref.first != through + 1:
                raise CorruptData(
                    layout.l1_key(st.topic, st.partition, ref.first, ref.last, st.topic_id),
                    f"committed L1 file does not follow the table's published offset {through} of partition "
                    f"{st.partition}",
                )
            out.append((st.partition, ref))
            through = ref.last
    return out


def publish(
    store: ObjectStore,
    catalog: Any,
    t: Topic,
    config: CatalogConfig,
    *,
    read_states: Callable[[Topic], list[sm.PartitionState]],
    attempts: int = 10,
    rebuild: bool = False,
) -> Published:
    """Append to ``t``'s table every committed L1 file not yet in it, exactly once.

    A head that names a published vector no longer in the store is repaired from the
    head's own data files; a head whose manifest list or manifests are gone from the
    store cannot say what it holds, and the table is rebuilt: dropped (only at the
    metadata it was judged by) and published again from the state log, which it
    follows. ``rebuild`` does that whatever the head (``ctp table publish --rebuild``)."""
    from pyiceberg.exceptions import CommitFailedException

    name = ".".join(identifier(config, t.name))
    if rebuild:
        _drop_own(catalog, store, t, config, "asked to rebuild it")
    table = ensure_table(catalog, store, t, config)
    for attempt in range(1, attempts + 1):
        if attempt > 1:  # (the first attempt has the table ensure_table just loaded)
            try:
                table = table.refresh()
            except ValueError:  # the table at the name was replaced (its UUID changed): look again
                table = ensure_table(catalog, store, t, config)
        if table.properties.get(TOPIC_ID) != t.incarnation:
            raise TopicChanged(t, f"table {name} belongs to incarnation {table.properties.get(TOPIC_ID)}")
        head = table.current_snapshot()
        repair = False
        changed: dict[int, int] = {}
        try:
            vector, changed = read_vector_changes(store, vector_key(head))
        except VectorMissing as e:
            if _head_moved(table, head):
                continue  # the head moved on, and the GC swept what only the old one reached
            # A head left naming a vector that is gone (an older ctp's sweep robbed a
            # publish in flight, or a hand): its own data files say the same, checked.
            try:
                vector = vector_of_files(data_files(table), name)
            except OSError as gone:
                if not _head_files_missing(store, table):
                    raise
                _drop_own(catalog, store, t, config, f"its head's files are gone from the store ({gone})", table)
                table = ensure_table(catalog, store, t, config)
                continue
            log.warning("table %s: %s; rebuilt from the head's data files, a new head names it", name, e)
            repair = True
        except CorruptData:
            if _head_moved(table, head):
                continue
            raise
        states = read_states(t)
        # Partitions whose files a compaction or trim changed since the table last
        # followed them: their files in the table are replaced by the committed ones.
        moved = [st for st in states if st.l1_changed_log_offset > changed.get(st.partition, -1)]
        todo = pending_files([st for st in states if st not in moved], vector)
        removed: list[Any] = []
        new_changed = dict(changed)
        if moved:
            todo_moved, removed = _replacements(store, table, t, moved)
            todo += todo_moved
            for st in moved:
                new_changed[st.partition] = st.l1_changed_log_offset
        if not todo and not removed and not repair and new_changed == changed:
            return Published(t.name, t.id, name, head.snapshot_id if head else None, 0, 0, 0, attempt - 1, vector)
        new = dict(vector)
        for st in moved:
            new[st.partition] = st.last_reconciled_offset
        keys = [ref.key for _p, ref in todo]
        footers = _read_footers(store, keys)
        chosen, copied, records = [], 0, 0
        for (p, ref), footer in zip(todo, footers):
            new[p] = max(new.get(p, -1), ref.last)
            if footer.format_version == "1":
                footer = register.read_footer(store, copy_format1(store, t, p, footer.key, ref.crc32c))
                copied += 1
            chosen.append((uri_of(store, footer.key), footer))
            records += ref.last - ref.first + 1
        new_key = write_vector(store, table, t, new, new_changed)
        tx = register.transaction(table)
        try:
            # (no duplicate check: it reads every manifest, and the vector already proves it)
            files = register.data_files(tx.table_metadata, chosen)
            if removed:  # one snapshot: the replaced files out, their replacement in
                register.replace(tx, removed, files, {PUBLISHED: new_key})
            else:
                register.append(tx, files, {PUBLISHED: new_key})
        except OSError as gone:
            # The append reads the head's manifest list: gone means the head moved on and
            # the GC expired the one read here. Nothing was committed: from the new head.
            if _head_moved(table, head):
                continue
            if not _head_files_missing(store, table):
                raise
            _drop_own(catalog, store, t, config, f"its head's manifest list is gone from the store ({gone})", table)
            table = ensure_table(catalog, store, t, config)
            continue
        crashpoints.reached("publish_before_commit")
        try:
            table = tx.commit_transaction()  # the table as this commit left it
        except CommitFailedException:
            log.info("publish of %s lost a race (attempt %d): starting again from the new head", name, attempt)
            continue
        except Exception as e:
            table = table.refresh()
            head = table.current_snapshot()
            if vector_key(head) != new_key:
                log.warning("publish of %s: commit outcome unknown (%s); it did not land, again", name, e)
                continue
        crashpoints.reached("publish_after_commit")
        head = table.current_snapshot()
        return Published(
            t.name,
            t.id,
            name,
            head.snapshot_id if head else None,
            len(chosen),
            records,
            copied,
            attempt,
            new,
            files_removed=len(removed),
        )
    raise CtpError(f"publish of {name} lost {attempts} races in a row: is another publisher looping?")


def _replacements(
    store: ObjectStore, table: Any, t: Topic, moved: list[sm.PartitionState]
) -> tuple[list[tuple[int, L1Ref]], list[Any]]:
    """For partitions whose committed files a compaction or trim changed: the committed
    files the table's head lacks (to add), and the head's data files that are no longer
    committed (to remove), so that after the commit the table holds exactly the
    committed files, each record once. One scan of the head's manifests."""
    wanted = {st.partition: st.committed_l1_files() for st in moved}
    keep: dict[int, set[str]] = {p: set() for p in wanted}
    removed = []
    if table.current_snapshot() is not None:
        for task in table.scan().plan_files():
            f = task.file
            p = int(f.partition[0])
            if p not in wanted:
                continue
            k = key_of(store, f.file_path)
            ok = {ref.key for ref in wanted[p]} | {
                layout.l1_copy_key(t.name, p, ref.first, ref.last, t.key_id) for ref in wanted[p]
            }
            if k in ok:
                keep[p].add(k)
            else:
                removed.append(f)
    adds = []
    for p, refs in sorted(wanted.items()):
        for ref in refs:
            if ref.key not in keep[p] and layout.l1_copy_key(t.name, p, ref.first, ref.last, t.key_id) not in keep[p]:
                adds.append((p, ref))
    return adds, removed


def _head_files_missing(store: ObjectStore, table: Any) -> bool:
    """Whether the store says (absent, not unreadable) that a file the table's head needs
    is gone: its manifest list, or a manifest it lists."""
    head = table.current_snapshot()
    if head is None:
        return False
    if store.head(key_of(store, head.manifest_list)) is None:
        return True
    return any(store.head(key_of(store, m.manifest_path)) is None for m in head.manifests(table.io))


def _drop_own(catalog: Any, store: ObjectStore, t: Topic, config: CatalogConfig, why: str, table: Any = None) -> None:
    """Drop incarnation ``t``'s table at the metadata it was judged by (``table``, or as
    the catalog names it now), so the next :func:`ensure_table` creates it again and the
    publish fills it from the state log. A table of another incarnation is left alone."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    ident = identifier(config, t.name)
    if table is None:
        try:
            table = catalog.load_table(ident)
        except (NoSuchTableError, NoSuchNamespaceError):
            return
        except (OSError, ValueError):
            return  # its metadata does not load: ensure_table drops the entry if the store lost it
    if table.properties.get(TOPIC_ID) != t.incarnation:
        return
    log.warning("rebuilding table %s from the state log: %s", ".".join(ident), why)
    if drop_if_at(catalog, ident, table.metadata_location):
        # Its directory names a table no catalog holds now (the GC's R11 check reads this).
        store.put(vector_prefix(store, table, t)[: -len("published/")] + DROPPED, b"")


def _head_moved(table: Any, head: Any) -> bool:
    now = table.refresh().current_snapshot()
    return (now.snapshot_id if now else None) != (head.snapshot_id if head else None)


def _read_footers(store: ObjectStore, keys: list[str], threads: int = 16) -> list[register.Footer]:
    """The footers of ``keys``, in order, ``threads`` at a time (two ranged GETs each)."""
    threads = min(threads, store.read_concurrency, len(keys))
    if threads <= 1:  # a local store: a pool costs more than it saves
        return [register.read_footer(store, k) for k in keys]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(lambda k: register.read_footer(store, k), keys))


def copy_format1(store: ObjectStore, t: Topic, partition: int, key: str, crc32c: int | None) -> str:
    """The key of a format 2 copy of the format 1 file ``key`` (checked against its
    committed CRC32C), written if absent."""
    from ctp_state import l1

    table = l1.read_l1(store, key, crc32c).replace_schema_metadata(None)
    name = layout.parse_l1_key(key)
    copy = layout.l1_copy_key(t.name, partition, name.first, name.last, t.key_id)
    l1.write_once(store, copy, l1.encode_parquet(table, t.name, partition, topic_id=t.key_id), table)
    return copy
