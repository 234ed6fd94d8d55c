"""What the CLI and the DAGs call: publish topics' tables, and describe them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ctp_state.codec import JsonObject
from ctp_state.gc.table_hook import TableFile
from ctp_state.status import read_states
from ctp_state.storage import ObjectStore
from ctp_state.table.catalog import CatalogConfig, identifier, open_catalog
from ctp_state.table.files import data_files, published_vector
from ctp_state.table.publish import Published, publish
from ctp_state.topics import get_topic, list_topics


def publish_topics(
    store: ObjectStore,
    config: CatalogConfig,
    *,
    home: str,
    topics: Sequence[str] | None = None,
    rebuild: bool = False,
) -> list[Published]:
    """Publish every live topic's committed L1 files (or ``topics``') to its table
    (``rebuild``: each table dropped and published again from the state log)."""
    catalog = open_catalog(store, config, home=home)
    chosen = [get_topic(store, n) for n in topics] if topics else list_topics(store)
    return [
        publish(store, catalog, t, config, read_states=lambda t: read_states(store, [t]), rebuild=rebuild)
        for t in chosen
    ]


@dataclass(frozen=True)
class PartitionProgress:
    """One partition: the last record offset reconciled (committed to L1) and published."""

    partition: int
    reconciled: int  # -1: nothing reconciled yet
    published: int  # -1: nothing in the table yet


@dataclass(frozen=True)
class TableView:
    topic: str
    table: str
    exists: bool
    snapshot_id: int | None
    snapshots: int
    metadata_location: str | None
    files: list[TableFile]
    partitions: list[PartitionProgress]

    def as_dict(self) -> JsonObject:  # what `ctp table show --json` prints
        return {
            "topic": self.topic,
            "table": self.table,
            "exists": self.exists,
            "snapshot_id": self.snapshot_id,
            "snapshots": self.snapshots,
            "metadata_location": self.metadata_location,
            "files": len(self.files),
            "records": sum(f.records for f in self.files),
            "partitions": [vars(p) for p in self.partitions],
        }


def describe(store: ObjectStore, config: CatalogConfig, topic: str, *, home: str) -> TableView:
    """A topic's table as it stands, beside what its state logs have reconciled."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    t = get_topic(store, topic)
    catalog = open_catalog(store, config, home=home)
    name = ".".join(identifier(config, t.name))
    states = read_states(store, [t])
    try:
        table = catalog.load_table(identifier(config, t.name))
    except (NoSuchTableError, NoSuchNamespaceError, OSError, ValueError):  # none, or a removed incarnation's
        table = None
    if table is not None and table.properties.get("ctp.topic_id") != t.incarnation:
        table = None  # another incarnation's: the next publish replaces it
    vector = published_vector(store, table) if table is not None else {}
    head = table.current_snapshot() if table is not None else None
    return TableView(
        t.name,
        name,
        table is not None,
        head.snapshot_id if head else None,
        len(table.snapshots()) if table is not None else 0,
        table.metadata_location if table is not None else None,
        data_files(table) if table is not None else [],
        [PartitionProgress(st.partition, st.last_reconciled_offset, vector.get(st.partition, -1)) for st in states],
    )
