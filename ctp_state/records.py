"""The run records ctp keeps and hands around, as frozen, versioned, typed values.

=====================  =================================================================
record                 where it lives
=====================  =================================================================
:class:`ReconcileSummary`  ``runs/reconcile/<seq>.json`` (sealed), one per reconcile run,
                       with a :class:`PartitionReport` per partition
:class:`GcRecord`      ``gc/history/<seq>.json`` (sealed), one per GC run
:class:`GcPartitionView`   a row of ``gc/partitions/<seq>-<run id>.parquet``: one partition as a
                       GC run saw it (M(p), lower bound, the L1 sweep's watermarks)
:class:`PartitionFacts`    one partition's state as plain data (``ctp status --json``,
                       the reconcile summary)
:class:`TopicEvent`    ``meta/history/<topic>/<seq>.json`` (sealed): a name's deletes,
                       re-creates and finished removals, after its first incarnation
:class:`ProduceMarker` ``produce/<producer id>.json`` (sealed): an input a producer id
                       completed
=====================  =================================================================

One codec: :func:`encode` turns a record into builtins (sealed by
:mod:`ctp_state.codec` in the store, returned as XCom by the DAGs); :func:`decode` turns
builtins back into the record, through the upcasters, and refuses what does not fit
with an error naming the key.

**Upcasting** (as eventsourcing's ``Mapper`` does it). Each stored record type has a
``VERSION`` and carries ``v``. To change a record's shape: bump ``VERSION`` to N+1 and
add ``UPCASTERS[N]``, a pure function from a version-N dict to a version-N+1 dict (fill
the new field, rename the old one, set ``"v": N+1``). Old records in the store are
never rewritten; :func:`decode` runs every upcaster from the record's version up to
``VERSION``. A record newer than ``VERSION`` (written by a newer ctp) is refused, never
guessed at. ``tests/formats/test_records.py`` round-trips every type and upcasts each
version kept in ``UPCASTERS``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import msgspec

from ctp_state.codec import JsonObject
from ctp_state.errors import CorruptData, UnsupportedVersion

#: A JSON scalar: statistics and settings echoed into records.
Scalar = int | float | str | bool | None

R = TypeVar("R", bound="StoredRecord")


class StoredRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A stored, versioned record. Subclasses set ``VERSION``, ``WHAT`` and ``UPCASTERS``."""

    VERSION: ClassVar[int] = 1
    WHAT: ClassVar[str] = "record"
    #: version N -> a function from a version-N dict to a version-N+1 dict
    UPCASTERS: ClassVar[dict[int, Callable[[JsonObject], JsonObject]]] = {}

    v: int = 0  # set to VERSION by encode()


def encode(rec: msgspec.Struct) -> JsonObject:
    """The record as JSON-ready builtins, stamped with its type's current version."""
    out: JsonObject = msgspec.to_builtins(rec)
    if isinstance(rec, StoredRecord):
        out["v"] = type(rec).VERSION
    return out


def decode(cls: type[R], data: JsonObject, key: str) -> R:
    """``data`` (read from ``key``) as a ``cls``: upcast to the current version, then
    checked against the type. Raises :class:`UnsupportedVersion` or :class:`CorruptData`."""
    v = data.get("v")
    supported = tuple(sorted({*cls.UPCASTERS, cls.VERSION}))
    if not isinstance(v, int) or isinstance(v, bool) or v not in supported:
        raise UnsupportedVersion(key, cls.WHAT, v, supported)
    while v < cls.VERSION:
        data = cls.UPCASTERS[v](data)
        v += 1
        data["v"] = v
    out: R = convert(cls, data, key)
    return out


def decode_current(cls: type[R], raw: bytes) -> R | None:
    """A sealed record's checked JSON straight into ``cls`` when it is of the current
    version and fits (None: anything else -- an older version to upcast, a field that
    does not fit -- which :func:`decode` then reads step by step, for the upcast or the
    error that names what is wrong). One pass instead of a dict and then a record: a
    reconcile summary of 100,000 partitions (50 MB) in a fraction of the time."""
    decoder = _DECODERS.get(cls)
    if decoder is None:
        decoder = _DECODERS.setdefault(cls, msgspec.json.Decoder(cls))
    try:
        raw.decode()  # (msgspec skips unknown members unchecked: the whole record must be UTF-8, as for decode)
        out: R = decoder.decode(raw)
    except (msgspec.MsgspecError, UnicodeError, RecursionError):
        return None
    return out if out.v == cls.VERSION else None


_DECODERS: dict[type[Any], msgspec.json.Decoder[Any]] = {}


def convert(cls: type[Any], data: Any, key: str) -> Any:
    """``data`` as a ``cls`` (no versions: Parquet rows, XCom values)."""
    try:
        return msgspec.convert(data, cls)
    except msgspec.ValidationError as e:
        raise CorruptData(key, f"{getattr(cls, 'WHAT', cls.__name__)} does not match its schema: {e}") from None


# --- partitions -------------------------------------------------------------------------------


class HolderFacts(msgspec.Struct, frozen=True, kw_only=True):
    owner: str
    mode: str  # an AccessMode value
    writer_epoch: int
    lease_until_ms: int


class PartitionFacts(msgspec.Struct, frozen=True, kw_only=True):
    """One partition's state as plain data (built by :func:`ctp_state.status.facts`)."""

    topic: str
    partition: int
    initialized: bool
    window: tuple[int, int] | None = None
    max_applied_epoch: int | None = None
    previous_applied_epoch: int | None = None
    min_epoch_lower_bound: int | None = None
    m: int | None = None
    log_end_offset: int = 0
    next_offset: int = 0
    last_reconciled_offset: int = -1
    lag_entries: int = 0
    lag_records: int = 0
    lag_bytes: int = 0
    min_pending_epoch: int | None = None
    writer_epoch: int | None = None
    holders: tuple[HolderFacts, ...] = ()


# --- reconcile --------------------------------------------------------------------------------


class PartitionReport(msgspec.Struct, frozen=True, kw_only=True):
    """What one reconcile run did to one partition."""

    topic: str
    partition: int
    status: str = "idle"  # reconciled | advanced | idle | quarantined | claim_held | fenced | error
    records: int = 0
    l0_bytes: int = 0
    l1_bytes: int = 0
    l1_files: tuple[str, ...] = ()
    m_before: int | None = None
    m_after: int | None = None
    lag_entries_left: int = 0
    lag_bytes_left: int = 0
    reason: str | None = None
    key: str | None = None  # the L0 key a quarantine is about
    state: PartitionFacts | None = None  # the partition after this run

    @property
    def failed(self) -> bool:
        return self.status in ("quarantined", "fenced", "error")


class TopicEvent(StoredRecord, frozen=True, kw_only=True):
    """What happened to a topic name after its first incarnation
    (``meta/history/<topic>/<seq>.json``; :mod:`ctp_state.incarnations`)."""

    WHAT: ClassVar[str] = "topic history record"
    KINDS: ClassVar[tuple[str, ...]] = ("delete", "create", "removed", "lost", "config")

    seq: int = -1  # set by the sequence that stores it
    #: "delete": a tombstone; "create": a new incarnation; "removed": the GC removed a
    #: deleted one's state; "lost": an incarnation the history does not record (its
    #: metadata gone, or only stray state of it left), acknowledged deleted by an operator
    kind: str
    name: str
    id: str | None  # the incarnation (None: the name's first topic, created before ids)
    keyed: bool = True  # whether the id is part of the incarnation's keys
    partitions: int
    created_ms: int  # when the incarnation was created
    at_ms: int  # when this happened (the writer's clock: for people, never for decisions)
    #: "config" (``ctp topic create --retention-*``, ``ctp topic alter``): the live
    #: incarnation's retention from here on, with Kafka's meaning (None: keep forever).
    retention_ms: int | None = None
    retention_bytes: int | None = None


def _marker_v1_to_v2(d: JsonObject) -> JsonObject:
    return {**d, "topics": None}  # written before incarnation ids: about first incarnations only


class ProduceMarker(StoredRecord, frozen=True, kw_only=True):
    """A producer id completed an input (``produce/<producer id>.json``, sealed): a
    re-run of the same input into the same topic incarnations writes nothing. Only a
    shortcut: the partitions' logs know what they hold either way."""

    VERSION: ClassVar[int] = 2
    WHAT: ClassVar[str] = "produce marker"
    UPCASTERS: ClassVar[dict[int, Callable[[JsonObject], JsonObject]]] = {1: _marker_v1_to_v2}

    producer_id: str
    digest: str  # the input's SHA-256
    records: int
    completed_ms: int
    partitions: dict[str, int] = {}  # "<topic>/<partition>" -> records written there
    topics: dict[str, str | None] | None  # topic -> incarnation id; None: version 1, before ids


class ReconcileSummary(StoredRecord, frozen=True, kw_only=True):
    """One reconcile run (``runs/reconcile/<seq>.json``)."""

    VERSION: ClassVar[int] = 2
    WHAT: ClassVar[str] = "reconcile run summary"
    UPCASTERS: ClassVar[dict[int, Callable[[JsonObject], JsonObject]]] = {}  # sealed since version 2

    seq: int = -1  # set by the sequence that stores it
    run_id: str
    started_ms: int
    finished_ms: int
    seconds: float
    cluster_epoch: int
    idle_lag: int
    ticks_spread: bool = False  # idle partitions tick at their phase (ctp_state.tick_schedule); False before it
    partitions_reconciled: int = 0
    partitions_advanced: int = 0
    partitions_quarantined: int = 0
    partitions_claim_held: int = 0
    partitions_fenced: int = 0
    partitions_failed: int = 0
    records: int = 0
    l0_bytes: int = 0
    l1_bytes: int = 0
    l1_files: int = 0
    lag_entries_left: int = 0
    lag_bytes_left: int = 0
    ok: bool = True
    partitions: tuple[PartitionReport, ...] = ()

    @property
    def failed(self) -> tuple[PartitionReport, ...]:
        """The partitions that were quarantined, fenced or failed."""
        return tuple(p for p in self.partitions if p.failed)


# --- GC ---------------------------------------------------------------------------------------


class HeldBy(msgspec.Struct, frozen=True, kw_only=True):
    """A partition (topic None: the cluster epoch) at M, and why (R7)."""

    topic: str | None
    partition: int | None
    m: int | None
    reasons: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        return "cluster epoch" if self.topic is None else f"{self.topic}/{self.partition}"


class GateInfo(msgspec.Struct, frozen=True, kw_only=True):
    success: bool
    failures: tuple[str, ...] = ()
    statistics: dict[str, Scalar] = {}
    docs: str | None = None


class HistorySkip(msgspec.Struct, frozen=True, kw_only=True):
    seq: int
    why: str


class GcAlert(msgspec.Struct, frozen=True, kw_only=True):
    """Why a GC run needs a person (:mod:`ctp_state.gc.alert`): ``kind`` is
    ``quarantine`` or ``stall``; ``where`` names the partitions."""

    kind: str
    message: str
    where: tuple[str, ...] = ()


def _gc_v1_to_v2(d: JsonObject) -> JsonObject:
    """Version 1 records were not sealed; their fields are the same."""
    return dict(d)


def _gc_v2_to_v3(d: JsonObject) -> JsonObject:
    """Version 3 adds ``alert``; runs before it raised none."""
    return {**d, "alert": None}


def _gc_v3_to_v4(d: JsonObject) -> JsonObject:
    """Version 4 adds what was deleted (epoch range, a sample of keys, the key list's
    Parquet); earlier runs kept only counts."""
    return {**d, "delete_epochs": None, "delete_sample": [], "deletes_key": None}


class GcRecord(StoredRecord, frozen=True, kw_only=True):
    """One GC run (``gc/history/<seq>.json``). Statuses: ``ok``, ``partial`` (some
    deletes still failed after retries), ``dry_run`` -- these passed the gate and count
    for monotonic M --, ``gate_failed``, ``superseded``, ``failed``."""

    VERSION: ClassVar[int] = 4
    WHAT: ClassVar[str] = "GC history record"
    UPCASTERS: ClassVar[dict[int, Callable[[JsonObject], JsonObject]]] = {
        1: _gc_v1_to_v2,
        2: _gc_v2_to_v3,
        3: _gc_v3_to_v4,
    }
    PASSED: ClassVar[tuple[str, ...]] = ("ok", "partial", "dry_run")

    seq: int = -1  # set by the history
    run_id: str
    status: str
    started_ms: int
    finished_ms: int
    seconds: float
    dry_run: bool = False
    error: str | None = None
    cluster_epoch: int | None = None
    m: int | None = None
    m_high_water_before: int | None = None
    m_high_water: int | None = None  # the highest M any passing run recorded, up to this one
    partitions: int = 0
    partitions_key: str | None = None  # gc/partitions/<seq>-<run id>.parquet: this run's GcPartitionView rows
    # The state pack (ctp_state.gc.pack): the states this run decided on, for the next run
    pack_key: str | None = None  # gc/packs/<seq>-<run id>.pack
    pack_crc32c: int | None = None
    pack_full_seq: int | None = None  # the run that last read every partition from its log
    pack_summary_seq: int | None = None  # the newest reconcile summary when this run read the states
    pack_read_at_ms: int | None = None  # (written by pack v1 runs only; packs now name their last entries' CRC32C)
    partitions_read: int | None = None  # of ``partitions``, read from their logs (the rest from the pack)
    summary_run_id: str | None = None
    m_digest: str | None = None
    history_skipped: tuple[HistorySkip, ...] = ()
    held_by: tuple[HeldBy, ...] = ()
    held_by_count: int = 0
    alert: GcAlert | None = None  # M stalled or a partition quarantined (ctp_state.gc.alert)
    config: dict[str, Scalar] = {}
    gate: GateInfo | None = None
    # L0: listing and deletes
    listed: int = 0
    deleted: int = 0
    deleted_bytes: int = 0
    skipped_above_m: int = 0
    skipped_too_young: int = 0
    list_errors: int = 0
    delete_errors: int = 0
    delete_retries: int = 0
    list_retries: int = 0
    throttled: int = 0
    lowest_delete_limit: float = 0.0
    min_epoch_seen: int | None = None
    max_epoch_seen: int | None = None
    failed_keys: dict[str, str] = {}
    would_delete: int = 0
    would_delete_bytes: int = 0
    skipped_max_deletes: int = 0
    # What the L0 deletes were (a dry run: would be): lowest and highest epoch, a few
    # keys, and every key (with its epoch, size and outcome) in gc/deleted/<seq>-<run id>.parquet
    delete_epochs: tuple[int, int] | None = None
    delete_sample: tuple[str, ...] = ()
    deletes_key: str | None = None
    # L1: new files checked, orphans collected
    l1_listed: int = 0
    l1_new_files_checked: int = 0
    l1_orphans: int = 0
    l1_orphan_bytes: int = 0
    l1_young_skipped: int = 0
    l1_partitions_unchanged: int = 0
    l1_full_sweep: bool = False
    l1_full_sweep_ms: int | None = None
    l1_orphans_deleted: int = 0
    l1_orphan_bytes_deleted: int = 0
    l1_delete_errors: int = 0
    # R11: L1 files a compaction or trim took out of the committed set
    l1_retired: int = 0  # past the reader grace, their replacement checked: to delete
    l1_retired_bytes: int = 0
    l1_retired_kept: int = 0  # left for a later run (reader grace, a live claim, a table names them)
    l1_dropped_held: int = 0  # of those, dropped files whose trim nothing allows now (R11)
    l1_retired_deleted: int = 0
    l1_retired_bytes_deleted: int = 0
    tmp_deleted: int = 0
    gc_orphans_deleted: int = 0  # files of dead GC runs that no record names (gc/partitions, gc/deleted)
    topic_incarnations_removed: int = 0  # deleted topic incarnations whose state this run removed
    topic_incarnations_waiting: int = 0  # deleted ones whose tombstone is younger than the grace period
    topic_objects_deleted: int = 0  # their logs, snapshots and L1 files
    topic_removal_errors: tuple[str, ...] = ()
    table_snapshots_expired: int = 0  # Iceberg table snapshots this run expired
    table_files_deleted: int = 0  # table metadata files and published vectors nothing reached
    table_errors: tuple[str, ...] = ()  # a table this run could not maintain, and why

    @property
    def passed(self) -> bool:
        """The gate passed: this run counts for monotonic M (I3)."""
        return self.status in self.PASSED


class GcPartitionView(msgspec.Struct, frozen=True, kw_only=True):
    """One partition as a GC run saw it: a row of ``gc/partitions/<seq>-<run id>.parquet``."""

    WHAT: ClassVar[str] = "GC partition view"

    topic: str
    partition: int
    source: str = "log"
    m: int | None = None
    min_epoch_lower_bound: int | None = None
    previous_applied_epoch: int | None = None
    max_applied_epoch: int | None = None
    last_reconciled_offset: int = -1
    log_end_offset: int = 0
    lag_entries: int = 0
    lag_bytes: int = 0
    l1_swept_through: int = -1  # every L1 key whose first offset <= this is resolved
    l1_swept_log_end: int = -1  # log end offset when the sweep last looked
    # Added after the first views (absent in older files: the defaults apply)
    lag_records: int = 0
    status: str | None = None  # ctp_state.gc.safe_epoch.PARTITION_STATUSES
    status_detail: str | None = None  # the quarantined L0 key, the claim's owner and lease end
    topic_id: str | None = None  # the topic's incarnation (None: created before ids, or an older view)
    start_offset: int | None = None  # R11: the partition's start offset (None: an older view)
