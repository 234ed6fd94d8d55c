"""Reading a partition's records from an offset, across L1 and not-yet-reconciled L0.

Only L1 files named by *accepted* ``reconcile`` entries are read (a file a crashed
reconciler wrote but never committed is an orphan, never a duplicate), then the
pending placeholders' L0 chunks. The log is replayed from its start to find the
accepted reconcile entries, so this costs O(log length): a tool for checking that
nothing is lost, not a serving path.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from ctp_state import state as sm
from ctp_state.entries import Reconcile
from ctp_state.l1 import SCHEMA, read_chunk, read_l1, to_l1_table
from ctp_state.log import PartitionLog
from ctp_state.store import ObjectStore
from ctp_state.topics import get_topic


def committed_l1_keys(log: PartitionLog) -> tuple[list[str], sm.PartitionState]:
    """Replay the log; return the L1 keys of accepted reconciles, in order, and the state."""
    state = log.empty_state()
    keys: list[str] = []
    for offset, entry in log.entries():
        out = sm.apply(state, offset, entry)
        if isinstance(entry, Reconcile) and out.accepted:
            keys.extend(entry.l1_keys)
        state = out.state
    return keys, state


def _range_of(key: str) -> tuple[int, int]:
    first, last = key.rsplit("/", 1)[1].removesuffix(".parquet").split("-")
    return int(first), int(last)


def read_partition(store: ObjectStore, topic: str, partition: int, from_offset: int = 0,
                   limit: int | None = None) -> pa.Table:
    """Records of ``topic``/``partition`` with offset >= ``from_offset``, in offset order,
    in the L1 schema."""
    get_topic(store, topic).check_partition(partition)
    keys, state = committed_l1_keys(PartitionLog(store, topic, partition))
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

    for key in keys:
        if _range_of(key)[1] < from_offset:
            continue
        if add(read_l1(store, key).select(SCHEMA.names).cast(SCHEMA)):
            break
    else:
        for p in state.pending:
            if p.last_offset < from_offset:
                continue
            if add(to_l1_table([(p.base_offset, read_chunk(store, p))])):
                break
    return pa.concat_tables(tables) if tables else SCHEMA.empty_table()
