"""The GC history: an append-only audit record, one entry per GC run.

::

    gc/history/<seq:020d>.json        one record per run (dense seq, create-if-absent)
    gc/history/hint                   newest seq an appender saw (a hint, may lag)
    gc/partitions/<seq:020d>-<run id>.parquet  that run's view of every partition (M(p), lower
                                      bounds, lag, status, the L1 sweep's watermarks)
    gc/deleted/<seq:020d>-<run id>.parquet     every key that run deleted (a dry run: would
                                      delete; a run that failed part way: planned), with
                                      its epoch, size and outcome

A record is written once with create-if-absent (a :class:`~ctp_state.sequence.DenseSequence`
of sealed records), so two GC runs can never both own a seq, nothing rewrites a
record, and a flipped digit in one is caught when it is read. Readers find the newest
seq from the hint and a listing after it, then read only the tail they need: the cost
of a GC does not grow with its own history.

Which runs count for monotonic M (I3): runs whose gate passed (``ok``, ``partial``:
some deletes still failed after retries, ``dry_run``).
A ``gate_failed`` run, and a ``superseded`` one (it finished after a concurrent GC that
saw a higher M), is recorded for the audit but never becomes the reference a later run
is checked against; every record carries ``m_high_water``, the highest M any
passing run has recorded, so the check reaches back over all time, not just the tail.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from ctp_state import layout, records
from ctp_state.errors import CorruptData, CtpError, ObjectNotFound
from ctp_state.gc.pack import decode_pack
from ctp_state.records import GcPartitionView, GcRecord
from ctp_state.sequence import DenseSequence
from ctp_state.state import PartitionState
from ctp_state.storage import ObjectStore

log = logging.getLogger(__name__)

HISTORY_PREFIX = layout.GC_HISTORY
PARTITIONS_PREFIX = layout.GC_PARTITIONS
PASSED = GcRecord.PASSED

PARTITION_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("source", pa.string()),  # "log" or "summary"
        ("m", pa.int64()),
        ("min_epoch_lower_bound", pa.int64()),
        ("previous_applied_epoch", pa.int64()),
        ("max_applied_epoch", pa.int64()),
        ("last_reconciled_offset", pa.int64()),
        ("log_end_offset", pa.int64()),
        ("lag_entries", pa.int64()),
        ("lag_bytes", pa.int64()),
        ("l1_swept_through", pa.int64()),  # every L1 key whose first offset <= this is resolved
        ("l1_swept_log_end", pa.int64()),  # log end offset when the sweep last looked
        ("lag_records", pa.int64()),
        ("status", pa.string()),  # ctp_state.gc.safe_epoch.PARTITION_STATUSES
        ("status_detail", pa.string()),
        ("topic_id", pa.string()),  # the topic's incarnation (null: created before ids)
        ("start_offset", pa.int64()),  # R11: the partition's start offset (null in older views)
    ]
)
#: Every L0 object a run deleted (a dry run: would delete), and the L1 orphans it collected.
DELETES_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("kind", pa.string()),  # l0, l1_orphan, l1_retired (R11), gc_orphan, deleted_topic, table_metadata
        ("epoch", pa.int64()),  # the L0 key's epoch (null for L1)
        ("size", pa.int64()),
        ("outcome", pa.string()),  # deleted, failed (after retries), would_delete, unknown (the run failed)
    ]
)


def record_key(seq: int) -> str:
    return layout.sequence_key(HISTORY_PREFIX, seq)


def partitions_key(seq: int, run_id: str) -> str:
    return layout.gc_partitions_key(seq, run_id)


class GcHistory:
    def __init__(self, store: ObjectStore):
        self.store = store
        # version 1: records written before records were sealed
        self.seq = DenseSequence(store, HISTORY_PREFIX, GcRecord, legacy_version=1)

    def last_seq(self) -> int:
        """The newest seq in the history, -1 when empty."""
        return self.seq.last()

    def get(self, seq: int) -> GcRecord:
        return self.seq.get(seq)

    def tail(
        self, n: int, last: int | None = None, *, unreadable: list[tuple[int, str]] | None = None
    ) -> list[GcRecord]:
        """The newest ``n`` records, oldest first. With ``unreadable`` a record that does
        not read (checksum, version) is skipped and reported there as ``(seq, why)``
        instead of raising: one damaged record must not stop every later GC run."""
        return self.seq.tail(n, last, unreadable=unreadable)

    def records(self) -> Iterator[GcRecord]:
        """Every record, oldest first (for reports and audits, not for the GC's own path)."""
        return iter(self.tail(self.last_seq() + 1))

    def append(self, make: Callable[[int], GcRecord], *, attempts: int = 32) -> GcRecord:
        """Write ``make(seq)`` at the next free seq, create-if-absent; retry on a lost race.

        ``make`` is called again with the new seq after a lost race, so a record can
        reflect the runs that won before it.
        """
        return self.seq.append(make, attempts=attempts)

    # --- per-run partition views ---

    def write_partitions(self, seq: int, table: pa.Table, run_id: str) -> str:
        """Write run ``run_id``'s view for record ``seq`` (before the record is created;
        a run that then loses ``seq`` leaves its view unreferenced, never the winner's
        replaced) and return its key."""
        buf = io.BytesIO()
        pq.write_table(table.cast(PARTITION_SCHEMA), buf, compression="zstd")
        key = partitions_key(seq, run_id)
        self.store.put(key, buf.getvalue())
        return key

    def write_deletes(self, seq: int, table: pa.Table, run_id: str) -> str:
        """Write run ``run_id``'s deleted keys (:data:`DELETES_SCHEMA`) for record ``seq``,
        as :meth:`write_partitions` does its view; return the key."""
        buf = io.BytesIO()
        pq.write_table(table.cast(DELETES_SCHEMA), buf, compression="zstd")
        key = layout.gc_deletes_key(seq, run_id)
        self.store.put(key, buf.getvalue())
        return key

    def read_deletes(self, key: str) -> pa.Table:
        """A run's deleted keys as written (:data:`DELETES_SCHEMA`)."""
        return self.read_partition_table(key, what="GC deleted-keys list")

    def read_partition_table(self, key: str, *, what: str = "GC partition view") -> pa.Table:
        """A run's partition view as written (:data:`PARTITION_SCHEMA`)."""
        try:
            # (ParquetFile, not read_table: one file needs no pyarrow.dataset, a 0.7 s import)
            return pq.ParquetFile(io.BytesIO(self.store.get(key))).read()
        except ObjectNotFound:
            raise
        except Exception as e:  # pyarrow raises several types for a bad file
            raise CorruptData(key, f"{what} does not read as Parquet ({e})") from None

    def read_partitions(self, key: str) -> list[GcPartitionView]:
        """A run's partition view, one typed row per partition."""
        rows: list[GcPartitionView] = records.convert(
            list[GcPartitionView], self.read_partition_table(key).to_pylist(), key
        )
        return rows


def high_water(recs: list[GcRecord]) -> int | None:
    """The highest M any passing run recorded, as known from ``recs`` (each carries
    the high-water mark of everything before it)."""
    best: int | None = None
    for r in recs:
        for v in (r.m_high_water, r.m if r.passed else None):
            if v is not None and (best is None or v > best):
                best = v
    return best


def reference_view(
    history: GcHistory, tail: list[GcRecord], skipped: list[tuple[int, str]] | None = None
) -> tuple[GcRecord | None, list[GcPartitionView]]:
    """The GC's memory of the partitions: the newest passing run in ``tail`` whose
    partition view reads, and that view (a view that does not read is put in
    ``skipped`` as ``(seq, why)`` and the run before it is tried)."""
    for r in reversed(tail):
        if not r.passed or not r.partitions_key:
            continue
        try:
            return r, history.read_partitions(r.partitions_key)
        except (CorruptData, ObjectNotFound) as e:
            if skipped is not None:
                skipped.append((r.seq, f"its partition view does not read: {e}"))
    return None, []


#: How many of the newest GC records :func:`remembered` looks through for the newest
#: passing run's partition view.
MEMORY_RECORDS = 64


def remembered(store: ObjectStore) -> list[tuple[str, str | None, int]]:
    """The partitions the GC remembers, as ``(topic, incarnation id, partition)``: the
    newest passing run's view (what a run checks the topics' partitions against; what
    ``ctp topic delete NAME --id ID`` counts an incarnation's partitions from when the
    store has nothing left of it)."""
    history = GcHistory(store)
    _, rows = reference_view(history, history.tail(MEMORY_RECORDS, unreadable=[]))
    return [(r.topic, r.topic_id, r.partition) for r in rows]


@dataclass(frozen=True)
class PackStates:
    """The states of a GC run's pack by ``(topic, partition)``, each with the CRC32C of
    the stored bytes of the entry it ends at (a state is used only while that entry is
    still in the log, those bytes)."""

    seq: int
    states: dict[tuple[str, int], tuple[PartitionState, int | None]]


#: How many of the newest GC records :func:`newest_pack` looks through for a passing one.
PACK_RECORDS = 4
#: A pack taken before more reconcile runs than this is not a reconciler's base: with
#: the GC down, the tails after it would only grow, while the snapshots the reconciler
#: writes follow the log.
PACK_MAX_RECONCILES_BEHIND = 1


def newest_pack(store: ObjectStore, newest_summary_seq: int | None = None) -> PackStates | None:
    """The states of the newest passing GC run's pack, for a reader that would otherwise
    read every partition from its snapshot (the reconciler); None when that run wrote
    none, its pack does not read (damaged, cut short, another run's: the reader reads
    snapshots, as without a pack), or it was taken more than
    :data:`PACK_MAX_RECONCILES_BEHIND` reconcile runs before ``newest_summary_seq`` (the
    newest reconcile summary's seq, if known). Each state is checked against its log
    before use (:meth:`ctp_state.partition_log.PartitionLog.read_state`)."""
    try:
        tail = GcHistory(store).tail(PACK_RECORDS, unreadable=[])
    except CtpError as e:
        log.info("no GC state pack to start from: the GC history does not read (%s)", e)
        return None
    rec = next((r for r in reversed(tail) if r.passed), None)
    if rec is None or not rec.pack_key or rec.pack_crc32c is None or rec.pack_summary_seq is None:
        return None
    if newest_summary_seq is not None and newest_summary_seq - rec.pack_summary_seq > PACK_MAX_RECONCILES_BEHIND:
        return None
    states = read_pack(store, rec)
    return None if states is None else PackStates(rec.seq, {(s.topic, s.partition): (s, c) for s, c in states})


def read_pack(store: ObjectStore, rec: GcRecord) -> list[tuple[PartitionState, int | None]] | None:
    """The states (each with its last entry's CRC32C) of the pack GC record ``rec``
    names; None when it names none or its pack does not read (damaged, cut short,
    another run's: the reader reads the logs or snapshots instead)."""
    if not rec.pack_key or rec.pack_crc32c is None:
        return None
    try:
        return decode_pack(
            store.get(rec.pack_key), rec.pack_key, seq=rec.seq, run_id=rec.run_id, crc32c=rec.pack_crc32c
        )
    except (CorruptData, ObjectNotFound) as e:
        log.info("not starting from the state pack of GC run %d: %s", rec.seq, e)
        return None
