"""Reading a partition's records from an offset, across L1 and not-yet-reconciled L0.

The partition's state is read as every other reader reads it (the newest snapshot plus
the entries after it): it names the committed L1 files (those of accepted ``reconcile``
entries; a file a crashed reconciler wrote but never committed is an orphan, never a
duplicate) and the pending placeholders, whose L0 chunks hold the rest. So a read
costs what a state read costs, plus the data, and an old entry that went bad after a
snapshot covered it does not stop reads (``ctp verify`` reports it).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from ctp_state import state as sm
from ctp_state.errors import OffsetBeforeStart
from ctp_state.l1 import SCHEMA, read_chunk, read_l1, to_l1_table
from ctp_state.partition_log import PartitionLog
from ctp_state.storage import ObjectStore
from ctp_state.topics import get_topic


def committed_l1_keys(log: PartitionLog) -> tuple[list[str], sm.PartitionState]:
    """The keys of the committed L1 files, in offset order, and the state they come from."""
    state = log.read_state()
    return state.committed_l1_keys(), state


def read_partition(
    store: ObjectStore,
    topic: str,
    partition: int,
    from_offset: int | None = None,
    limit: int | None = None,
    *,
    from_start: bool = False,
) -> pa.Table:
    """Records of ``topic``/``partition`` with offset >= ``from_offset`` (None: from the
    partition's start offset), in offset order, in the L1 schema. An offset before the
    start offset raises :class:`OffsetBeforeStart`, unless ``from_start``: then the read
    starts at the start offset. Records before the start offset are never returned (a
    trim may leave some in a file it keeps)."""
    t = get_topic(store, topic)
    t.check_partition(partition)
    state = PartitionLog(store, t, partition).read_state()
    if from_offset is None or (from_start and from_offset < state.start_offset):
        from_offset = state.start_offset
    if from_offset < state.start_offset:
        raise OffsetBeforeStart(topic, partition, from_offset, state.start_offset)
    tables: list[pa.Table] = []
    rows = 0

    def add(t: pa.Table) -> bool:
        nonlocal rows
        t = t.filter(pc.greater_equal(t.column("offset"), from_offset)) if from_offset else t
        if limit is not None:
            t = t.slice(0, max(0, limit - rows))
        tables.append(t)
        rows += t.num_rows
        return limit is not None and rows >= limit

    for f in state.committed_l1_files(from_offset):
        if add(read_l1(store, f.key, f.crc32c).replace_schema_metadata(None)):
            break
    else:
        for p in state.pending:
            if p.last_offset < from_offset:
                continue
            if add(to_l1_table([(p.base_offset, read_chunk(store, p))], partition)):
                break
    return pa.concat_tables(tables) if tables else SCHEMA.empty_table()
