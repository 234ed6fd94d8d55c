"""Where everything lives in the store. Every key ctp writes is built here.

::

    cluster/epoch/hint                          newest epoch seen by an advancer (a hint)
    cluster/epoch/markers/<epoch:018d>          one create-if-absent marker per epoch
    meta/topics/<topic>.json                    a name's first incarnation (partition count, id)
    meta/history/<topic>/<seq:020d>.json        what happened to the name since: deletes, re-creates
    logs/<space>/<partition:06d>/<offset:020d>.json        state-log entries
    snapshots/<space>/<partition:06d>/latest.json          newest state snapshot
    l0/<spread:03d>/<epoch:018d>/<uuid>.l0     L0 objects (docs/design.md, section 7)
    l1/<space>/<partition:06d>/<first:020d>-<last:020d>.parquet   L1 files
    runs/produce/<producer id>.json             an input produced completely (ctp produce)
    runs/produce-progress/<producer id>.json    how far each partition held an input (ctp produce)
    runs/reconcile/<seq:020d>.json              reconcile run summaries (a dense sequence)
    tables/<space>/<ns>-<uuid>/metadata/...     a topic's Iceberg table metadata (ctp table publish)
    tables/<space>/<ns>-<uuid>/published/...    a published vector (what a table snapshot holds)
    tables/<space>/copies/<partition:06d>/...   format 2 copies of format 1 L1 files, for the table
    gc/history/<seq:020d>.json                  GC history records (a dense sequence)
    gc/partitions/<seq:020d>-<run id>.parquet   each GC run's partition view
    gc/deleted/<seq:020d>-<run id>.parquet      the keys each GC run deleted
    reports/gc/...                              the published operator report

A topic's *space* is ``<topic>/<incarnation id>``: every log, snapshot and L1 file of
one incarnation lives under its own id, so nothing an old incarnation writes, however
late, lands among a newer one's keys (docs/design.md, "Topic incarnations"). Topics
created before ids were part of keys (metadata versions 1-3) keep the space
``<topic>``: its partition directories are 6 digits, an id 32 hex digits, so the two
never share a key.

Zero-padding makes byte-wise key order equal numeric order, so listing a log lists
offsets in order and listing an L0 spread prefix lists epochs in order.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from ctp_state.errors import CorruptData

EPOCH_HINT = "cluster/epoch/hint"
EPOCH_MARKERS = "cluster/epoch/markers/"
TOPICS = "meta/topics/"
L0_ROOT = "l0/"
L1_ROOT = "l1/"
RECONCILE_RUNS = "runs/reconcile/"
TABLES_ROOT = "tables/"
GC_HISTORY = "gc/history/"
GC_PARTITIONS = "gc/partitions/"
GC_DELETES = "gc/deleted/"
GC_PACKS = "gc/packs/"
REPORTS = "reports/gc/"
_SEQ_RE = re.compile(r"([0-9]{20})\.json")


def sequence_key(prefix: str, seq: int) -> str:
    """Record ``seq`` of the dense sequence under ``prefix`` (:mod:`ctp_state.sequence`)."""
    return f"{prefix}{seq:020d}.json"


def parse_sequence_name(name: str) -> int | None:
    """The seq of a name under a sequence's prefix; None for anything else (the hint)."""
    m = _SEQ_RE.fullmatch(name)
    return int(m.group(1)) if m else None


def gc_partitions_key(seq: int, run_id: str) -> str:
    """The partition view of GC run ``run_id``, written before it tries to own record
    ``seq``: named by the run too, so a run that loses the race for ``seq`` never
    overwrites the winner's view."""
    return f"{GC_PARTITIONS}{seq:020d}-{run_id}.parquet"


def gc_deletes_key(seq: int, run_id: str) -> str:
    """The keys GC run ``run_id`` deleted (named like :func:`gc_partitions_key`)."""
    return f"{GC_DELETES}{seq:020d}-{run_id}.parquet"


_GC_RUN_FILE_RE = re.compile(r"([0-9]{20})-([0-9A-Za-z_-]+)\.parquet")


def parse_gc_run_file(key: str, prefix: str) -> int | None:
    """The seq of a GC run's file under ``prefix`` (:func:`gc_partitions_key`,
    :func:`gc_deletes_key`); None for a key that is not one."""
    m = _GC_RUN_FILE_RE.fullmatch(key[len(prefix) :]) if key.startswith(prefix) else None
    return int(m.group(1)) if m else None


def _epoch18(epoch: int) -> str:
    # Imported here: validate imports errors only, so there is no cycle, but keep the
    # layout module importable on its own.
    from ctp_state.validate import epoch as check

    return f"{check(epoch):018d}"


def epoch_marker(epoch: int) -> str:
    return f"{EPOCH_MARKERS}{_epoch18(epoch)}"


_MARKER_RE = re.compile(r"cluster/epoch/markers/([0-9]{18})")


def parse_epoch_marker(key: str) -> int:
    """The epoch of a marker key; raise :class:`CorruptData` naming a key that is not one."""
    m = _MARKER_RE.fullmatch(key)
    if not m or int(m.group(1)) < 1:
        raise CorruptData(key, "key under cluster/epoch/markers/ is not an 18-digit epoch marker")
    return int(m.group(1))


def topic_meta(topic: str) -> str:
    return f"{TOPICS}{topic}.json"


TOPIC_HISTORY = "meta/history/"


def topic_history(topic: str) -> str:
    """The prefix of the dense sequence of what happened to a name after its first
    incarnation (:mod:`ctp_state.topics`)."""
    return f"{TOPIC_HISTORY}{topic}/"


def space(topic: str, topic_id: str | None) -> str:
    """The key space of one incarnation of ``topic`` (``topic_id`` None: a topic whose
    keys carry only its name)."""
    return topic if topic_id is None else f"{topic}/{topic_id}"


LOGS_ROOT = "logs/"
SNAPSHOTS_ROOT = "snapshots/"


def is_partition_dir(d: str, parent: str) -> bool:
    """Whether ``d`` is ``<parent><6 ASCII digits>/`` (a partition's directory)."""
    name = d[len(parent) : -1] if d.startswith(parent) and d.endswith("/") else ""
    return len(name) == 6 and name.isascii() and name.isdigit()


def is_id_dir(d: str, parent: str) -> bool:
    """Whether ``d`` is ``<parent><32 lowercase hex digits>/`` (an incarnation's space)."""
    name = d[len(parent) : -1] if d.startswith(parent) and d.endswith("/") else ""
    return len(name) == 32 and all(c in "0123456789abcdef" for c in name)


def log_prefix(topic: str, partition: int, topic_id: str | None = None) -> str:
    return f"{LOGS_ROOT}{space(topic, topic_id)}/{partition:06d}/"


def log_entry(topic: str, partition: int, offset: int, topic_id: str | None = None) -> str:
    return f"{log_prefix(topic, partition, topic_id)}{offset:020d}.json"


_ENTRY_RE = re.compile(r"([0-9]{20})\.json")


def log_offset_of(key: str, prefix: str) -> int:
    m = _ENTRY_RE.fullmatch(key[len(prefix) :])
    if not m:
        raise CorruptData(key, "not a state-log entry key")
    return int(m.group(1))


def snapshot(topic: str, partition: int, topic_id: str | None = None) -> str:
    return f"{SNAPSHOTS_ROOT}{space(topic, topic_id)}/{partition:06d}/latest.json"


def l0_key(spread: int, epoch: int, unique: str) -> str:
    return f"{L0_ROOT}{spread:03d}/{_epoch18(epoch)}/{unique}.l0"


def is_spread_prefix(prefix: str) -> bool:
    """Whether ``prefix`` is ``l0/<3 ASCII digits>/`` (the names ctp writes)."""
    name = prefix[len(L0_ROOT) : -1] if prefix.startswith(L0_ROOT) and prefix.endswith("/") else ""
    return len(name) == 3 and name.isascii() and name.isdigit()


def l0_epoch_prefix(spread_prefix: str, epoch: int) -> str:
    """Where epoch ``epoch``'s keys start under ``spread_prefix`` (``l0/<spread>/``):
    every key of a lower epoch sorts before it, every key of this or a higher epoch
    at or after it."""
    return f"{spread_prefix}{_epoch18(epoch)}/"


_L0_RE = re.compile(r"l0/([0-9]{3})/([0-9]{18})/([0-9A-Za-z_-]+)\.l0")  # ASCII digits: \d takes any Unicode digit


def parse_l0_key(key: str) -> tuple[int, int]:
    """Return ``(spread, epoch)`` of an L0 key; raise :class:`CorruptData` naming it."""
    m = _L0_RE.fullmatch(key)
    if not m:
        raise CorruptData(key, "key under the L0 root does not parse as l0/<spread>/<epoch>/<id>.l0")
    return int(m.group(1)), int(m.group(2))


def l1_key(
    topic: str, partition: int, first: int, last: int, topic_id: str | None = None, compacted_by: int = 0
) -> str:
    """An L1 file's key: ``<first>-<last>.parquet`` as a reconcile writes it, or
    ``<first>-<last>.w<writer epoch>.parquet`` as a compaction under that writer epoch
    writes it. A compaction's key names its writer epoch so that it never meets a file
    another writer left at the same range (a crashed reconcile's orphan, another
    compactor's): a key is written by one claim only, and never overwritten."""
    tail = f".w{compacted_by:020d}" if compacted_by else ""
    return f"{l1_partition_prefix(topic, partition, topic_id)}{first:020d}-{last:020d}{tail}.parquet"


def l1_copy_key(topic: str, partition: int, first: int, last: int, topic_id: str | None = None) -> str:
    """Where a table keeps the format 2 copy of the format 1 L1 file of ``first``-``last``
    (:func:`ctp_state.table.publish.copy_format1`)."""
    return f"{TABLES_ROOT}{space(topic, topic_id)}/copies/{partition:06d}/{first:020d}-{last:020d}.parquet"


def l1_partition_prefix(topic: str, partition: int, topic_id: str | None = None) -> str:
    """Where one partition's L1 files live (listing it lists them in offset order)."""
    return f"{L1_ROOT}{space(topic, topic_id)}/{partition:06d}/"


def l1_after(topic: str, partition: int, offset: int, topic_id: str | None = None) -> str:
    """A key that sorts after every L1 file of the partition whose first offset is <=
    ``offset`` and before every one that starts later (a listing's start-after)."""
    return f"{l1_partition_prefix(topic, partition, topic_id)}{offset:020d}-99999999999999999999"


_L1_RE = re.compile(
    r"l1/([A-Za-z0-9._-]{1,249})/(?:([0-9a-f]{32})/)?([0-9]{6})/([0-9]{20})-([0-9]{20})(?:\.w([0-9]{20}))?\.parquet"
)


class L1Name(NamedTuple):
    topic: str
    topic_id: str | None  # None: a topic whose keys carry only its name
    partition: int
    first: int
    last: int
    compacted_by: int = 0  # the writer epoch of the compaction that wrote it (0: a reconcile)


def parse_l1_key(key: str) -> L1Name:
    """The topic, incarnation, partition and offsets an L1 key names; raise
    :class:`CorruptData` naming a key that is not one."""
    m = _L1_RE.fullmatch(key)
    if not m or int(m.group(5)) < int(m.group(4)) or (m.group(6) is not None and int(m.group(6)) == 0):
        raise CorruptData(key, "not an L1 key l1/<topic>[/<id>]/<partition>/<first>-<last>[.w<writer epoch>].parquet")
    return L1Name(m.group(1), m.group(2), int(m.group(3)), int(m.group(4)), int(m.group(5)), int(m.group(6) or 0))


_PRODUCER_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")


def check_producer_id(producer_id: str) -> str:
    """A producer id is 1-128 of ``[A-Za-z0-9._-]`` (it names a key)."""
    if not isinstance(producer_id, str) or not _PRODUCER_ID_RE.fullmatch(producer_id) or producer_id in (".", ".."):
        raise ValueError(f"producer id {producer_id!r} must be 1-128 characters of letters, digits, '.', '_', '-'")
    return producer_id


def produce_marker(producer_id: str) -> str:
    return f"runs/produce/{check_producer_id(producer_id)}.json"


def produce_progress(producer_id: str) -> str:
    return f"runs/produce-progress/{check_producer_id(producer_id)}.json"
