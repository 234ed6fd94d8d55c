"""Named crash points: the moments a process may die at that the design promises to
survive (a claim held, L1 files written but not committed, a commit done, a delete batch
gone). The product only marks them; it does nothing there. A test harness installs a
handler that kills the process at a chosen point (the project's crash tests and the
fault simulation do, from ``tests/hooks/sitecustomize.py``), so the recovery story in
``docs/failure-model.md`` is exercised by real kills rather than by argument.
"""

from __future__ import annotations

from collections.abc import Callable

#: Every point the product marks, in the order a reconcile then a GC reaches them.
POINTS = (
    "produce_after_flush",  # ctp produce: flush n acknowledged, its progress not yet recorded
    "after_claim",
    "after_l1_write",
    "before_commit",
    "after_commit",
    "gc_after_delete_batch",
    "gc_before_record",  # a GC run's view and deleted-keys files written, its history record not
    "delete_after_tombstone",  # ctp topic delete: the tombstone written, no log sealed
    "delete_after_seal",  # ... partition n's log sealed (or found sealed)
    "gc_remove_after_tables",  # a GC removing a deleted incarnation: its table's files gone
    "gc_remove_after_l1",  # ... and its L1 files
    "gc_remove_after_snapshots",  # ... and its snapshots
    "gc_remove_after_logs",  # ... and its logs, the removal not yet recorded
    "publish_before_commit",  # ctp table publish: its vector, manifests and manifest list written, not committed
    "table_commit_before_update",  # a SQL catalog commit: the new metadata file written, the catalog row not moved
    "publish_after_commit",  # ... the table committed, the publish not yet returned
    "compact_after_claim",  # ctp compact: its partitions claimed, nothing written
    "compact_after_write",  # ... compacted file n written, not checked back or committed
    "compact_before_commit",  # ... every file written and checked, nothing committed
    "compact_after_commit",  # ... run n of a partition committed (the last releases the claim)
    "trim_before_commit",  # ctp retention / delete-records: the partition claimed, its trim not appended
)

_handler: Callable[[str, int], None] | None = None


def install(handler: Callable[[str, int], None] | None) -> None:
    """Call ``handler(point, index)`` at every crash point from now on (None: stop)."""
    global _handler
    _handler = handler


def reached(point: str, index: int = 0) -> None:
    """Mark crash point ``point`` (for item ``index``: a task, a batch). A no-op unless a
    handler is installed."""
    handler = _handler
    if handler is not None:
        handler(point, index)
