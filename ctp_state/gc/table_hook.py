"""The GC's hook into the topics' Iceberg tables, and what crosses it.

The GC itself knows no catalog: the CLI and the DAG build a :class:`TableHook` (see
:class:`ctp_state.table.maintenance.CatalogTables`) and hand it to the run. A run asks it twice:

1. :meth:`TableHook.heads`, *before* it reads any partition's state: what each live
   topic's table holds (its head's data files and published vector). Read in this order,
   "published <= reconciled" can only fail if the table really holds something its log
   does not commit: a reconcile or publish landing between the two reads only raises the
   reconciled side.
2. :meth:`TableHook.maintain`, after the L0 deletes: expire old snapshots and find the
   table files nothing reaches, for the run to delete behind its audit trail.

A table the hook cannot read or maintain is reported (``errors``), never a reason to
stop collecting L0: the table is a projection of the state logs, which decide M.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from ctp_state.storage import ObjectInfo
from ctp_state.topic_meta import Topic


@dataclass(frozen=True)
class TableFile:
    """One data file of a table's head, as the table's manifests describe it."""

    partition: int
    first_offset: int  # the range its name gives (an L1 key, or a format 1 file's copy)
    last_offset: int
    records: int  # the manifest's record count
    min_offset: int | None  # the manifest's column bounds of ``offset`` (None: no stats)
    max_offset: int | None
    path: str
    bytes: int


@dataclass(frozen=True)
class TableHead:
    """What one live topic's table holds at its head."""

    topic: str
    topic_id: str | None  # the incarnation the table belongs to
    table: str  # namespace.topic
    snapshot_id: int | None
    published: dict[int, int]  # partition -> last record offset the head accounts for
    files: tuple[TableFile, ...]


@dataclass(frozen=True)
class TableHeads:
    heads: tuple[TableHead, ...] = ()
    errors: tuple[str, ...] = ()  # tables that could not be read, one line each


@dataclass(frozen=True)
class TableSweep:
    """What a run's table maintenance did and found: snapshots it expired, table files
    nothing reaches (for the run to delete), and the tables it could not maintain."""

    expired: int = 0
    unreachable: list[ObjectInfo] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class TableHook(Protocol):
    def heads(self) -> TableHeads:
        """Every live topic's table head (read before the partitions' states)."""
        ...

    def maintain(self, now_s: float, grace_s: float) -> TableSweep:
        """Expire old snapshots; the files nothing reaches, older than ``grace_s`` by the
        store's clock ``now_s``."""
        ...

    def fenced_refs(self, topic: str, topic_id: str | None, candidates: frozenset[str]) -> frozenset[str] | None:
        """R11 (b): the store keys of every data file a retained snapshot of the table of
        incarnation ``topic_id`` of ``topic`` names -- read after fencing publishes to it
        (a commit of the catalog's own: a publish that read the head before it fails its
        commit and starts again from the partitions' states as they are now), unless
        every one of ``candidates`` is named anyway (nothing would be deleted: no fence,
        so a table that keeps them for days does not gain a snapshot per GC run). None:
        the table could not be fenced or read (its retired files are kept); an empty
        set: no table."""
        ...

    def drop(self, t: Topic) -> str | None:
        """Drop deleted incarnation ``t``'s table from the catalog before the GC removes
        its files (a REST catalog's table would otherwise go on naming them); None, or
        why it could not."""
        ...
