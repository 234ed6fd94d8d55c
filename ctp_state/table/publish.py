"""Publishing a topic's committed L1 files to its Iceberg table, exactly once.

The state log stays the commit point; the table is a projection of it. Each table
snapshot ctp commits names, in its summary (``ctp.published``), a sealed *published
vector* in the store (``tables/<space>/published/<uuid>.json``): per partition, the last
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
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ctp_state import codec, crashpoints, layout
from ctp_state import state as sm
from ctp_state.errors import CorruptData, CtpError, ObjectNotFound
from ctp_state.storage import ObjectStore
from ctp_state.table.catalog import NO_RETRIES, TOPIC_ID, CatalogConfig, identifier, location, uri_of
from ctp_state.topic_meta import Topic

log = logging.getLogger(__name__)

PUBLISHED = "ctp.published"  # snapshot summary property: the key of the published vector
VECTOR_VERSION = 1


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

    def as_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "topic_id": self.topic_id,
            "table": self.table,
            "snapshot_id": self.snapshot_id,
            "files_added": self.files_added,
            "records_added": self.records_added,
            "format1_copied": self.format1_copied,
            "attempts": self.attempts,
        }


def ensure_table(catalog: Any, store: ObjectStore, t: Topic, config: CatalogConfig) -> Any:
    """The table of incarnation ``t``, created if absent (schema from L1's, partitioned by
    ``identity(partition)``). A table left by a deleted incarnation of the name is
    dropped first: its files go with that incarnation."""
    from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError

    from ctp_state.table.schema import iceberg_schema, partition_spec

    ident = identifier(config, t.name)
    try:
        catalog.create_namespace_if_not_exists(config.namespace)
    except Exception:
        catalog.load_namespace_properties(config.namespace)  # raises if it is really not there
    mine = t.incarnation
    for _ in range(3):
        try:
            table = catalog.load_table(ident)
        except (OSError, ValueError) as e:
            # Registered, but its metadata is gone: the GC removed a deleted incarnation's
            # files (its catalog entry is the one thing it cannot reach). Drop the entry.
            log.warning("dropping table %s.%s: its metadata does not read (%s)", *ident, e)
            catalog.drop_table(ident)
            continue
        except NoSuchTableError:
            try:
                return catalog.create_table(
                    ident,
                    schema=iceberg_schema(),
                    partition_spec=partition_spec(),
                    location=location(store, t),
                    properties={**NO_RETRIES, TOPIC_ID: mine, "format-version": "2"},
                )
            except TableAlreadyExistsError:
                continue  # a concurrent publish created it: load that one
        theirs = table.properties.get(TOPIC_ID)
        if theirs == mine:
            return table
        log.warning(
            "dropping table %s.%s of incarnation %s: topic %s is now incarnation %s",
            *ident,
            theirs,
            t.name,
            mine,
        )
        catalog.drop_table(ident)
    raise CtpError(f"table {'.'.join(ident)} keeps changing under this publish: another incarnation's publisher?")


def read_vector(store: ObjectStore, key: str | None) -> dict[int, int]:
    if key is None:
        return {}
    try:
        body = codec.unseal(store.get(key), key, "published vector")
    except ObjectNotFound:
        raise CorruptData(key, "the table's head names a published vector that is not in the store") from None
    if body.get("v") != VECTOR_VERSION or not isinstance(body.get("through"), list):
        raise CorruptData(key, "not a published vector this ctp reads")
    return {int(p): int(o) for p, o in body["through"]}


def write_vector(store: ObjectStore, t: Topic, vector: dict[int, int]) -> str:
    key = f"{layout.TABLES_ROOT}{layout.space(t.name, t.key_id)}/published/{uuid.uuid4().hex}.json"
    body = {"v": VECTOR_VERSION, "topic": t.name, "topic_id": t.id, "through": sorted(vector.items())}
    store.put_if_absent(key, codec.seal(body))
    return key


def pending_files(states: list[sm.PartitionState], vector: dict[int, int]) -> list[tuple[int, sm.L1Ref]]:
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
) -> Published:
    """Append to ``t``'s table every committed L1 file not yet in it, exactly once."""
    from pyiceberg.exceptions import CommitFailedException

    table = ensure_table(catalog, store, t, config)
    name = ".".join(identifier(config, t.name))
    for attempt in range(1, attempts + 1):
        table = table.refresh()
        head = table.current_snapshot()
        vector = read_vector(store, head.summary.additional_properties.get(PUBLISHED) if head else None)
        todo = pending_files(read_states(t), vector)
        if not todo:
            return Published(t.name, t.id, name, head.snapshot_id if head else None, 0, 0, 0, attempt - 1, vector)
        new = dict(vector)
        paths, copied, records = [], 0, 0
        for p, ref in todo:
            new[p] = ref.last
            key = layout.l1_key(t.name, p, ref.first, ref.last, t.key_id)
            if footer_format(store, key) == "1":
                key = copy_format1(store, t, p, key, ref.crc32c)
                copied += 1
            paths.append(uri_of(store, key))
            records += ref.last - ref.first + 1
        vector_key = write_vector(store, t, new)
        crashpoints.reached("publish_before_commit")
        tx = table.transaction()
        # (no duplicate check: it reads every manifest, and the vector already proves it)
        tx.add_files(paths, snapshot_properties={PUBLISHED: vector_key}, check_duplicate_files=False)
        try:
            tx.commit_transaction()
        except CommitFailedException:
            log.info("publish of %s lost a race (attempt %d): starting again from the new head", name, attempt)
            continue
        except Exception as e:
            table = table.refresh()
            head = table.current_snapshot()
            if head is None or head.summary.additional_properties.get(PUBLISHED) != vector_key:
                log.warning("publish of %s: commit outcome unknown (%s); it did not land, again", name, e)
                continue
        crashpoints.reached("publish_after_commit")
        head = table.refresh().current_snapshot()
        return Published(
            t.name, t.id, name, head.snapshot_id if head else None, len(paths), records, copied, attempt, new
        )
    raise CtpError(f"publish of {name} lost {attempts} races in a row: is another publisher looping?")


def footer_format(store: ObjectStore, key: str) -> str:
    """An L1 file's format version, from its footer alone (two ranged GETs)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        meta = pq.read_metadata(pa.PythonFile(_RangeFile(store, key), mode="r")).metadata or {}
    except (OSError, pa.ArrowException) as e:
        raise CorruptData(key, f"L1 file's footer does not read: {e}") from None
    return (meta.get(b"ctp.format_version") or b"1").decode()


def copy_format1(store: ObjectStore, t: Topic, partition: int, key: str, crc32c: int | None) -> str:
    """The key of a format 2 copy of the format 1 file ``key`` (checked against its
    committed CRC32C), written if absent."""
    from ctp_state import l1

    table = l1.read_l1(store, key, crc32c).replace_schema_metadata(None)
    name = layout.parse_l1_key(key)
    copy = (
        f"{layout.TABLES_ROOT}{layout.space(t.name, t.key_id)}/copies/{partition:06d}/"
        f"{name.first:020d}-{name.last:020d}.parquet"
    )
    l1.write_once(store, copy, l1.encode_parquet(table, t.name, partition, topic_id=t.key_id), table)
    return copy


class _RangeFile:
    """A read-only file over one store object, fetched by ranges (for Parquet footers)."""

    def __init__(self, store: ObjectStore, key: str):
        info = store.head(key)
        if info is None:
            raise ObjectNotFound(key)
        self.store, self.key, self.size, self.pos = store, key, info.size, 0
        self.closed = False

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else self.pos + offset if whence == 1 else self.size + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        n = self.size - self.pos if n is None or n < 0 else min(n, self.size - self.pos)
        if n <= 0:
            return b""
        data = self.store.get_range(self.key, self.pos, n)
        self.pos += len(data)
        return data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True
