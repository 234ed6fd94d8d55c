"""The GC's inputs: C, then every partition's state from its own log (R4), and the
newest reconcile summary for R7 annotations only."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field

from ctp_state import codec, entries as en, state as sm, window
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import CorruptData, CtpError, ObjectNotFound, StateUnreadable
from ctp_state.gc.history import read_pack
from ctp_state.gc.table_hook import TableHeads
from ctp_state.incarnations import NameState, all_names
from ctp_state.parallel import pmap, read_threads
from ctp_state.partition_log import PartitionLog
from ctp_state.partition_state import L1Ref, committed_files
from ctp_state.records import GcPartitionView, GcRecord, ReconcileSummary
from ctp_state.settings import GcSettings
from ctp_state.status import reconcile_summaries, try_read_partition_states, unaccounted_logs
from ctp_state.storage import ObjectStore
from ctp_state.topics import Topic

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartitionView:
    """What the GC knows of one partition; duck-types the parts of PartitionState that
    :func:`compute_m` reads."""

    topic: str
    partition: int
    source: str  # where the view came from: "log" (a partition's own state log)
    initialized: bool
    min_epoch_lower_bound: int | None
    previous_applied_epoch: int | None
    max_applied_epoch: int | None
    last_reconciled_offset: int
    log_end_offset: int
    lag_entries: int
    lag_records: int
    lag_bytes: int
    holders: tuple[sm.Holder, ...]
    #: The smallest epoch of an accepted placeholder not reconciled yet (None: none).
    min_pending_epoch: int | None = None
    l1_ends: tuple[int, ...] = ()  # the state's committed L1 files (shared, not copied)
    l1_crcs: tuple[int | None, ...] = ()
    #: The incarnation of the topic this view is of (None: a topic created before ids).
    topic_id: str | None = None
    #: The id in the partition's keys (None: keys carry only the topic's name).
    key_id: str | None = None
    l1_tags: tuple[int, ...] = ()  # as PartitionState's: compactions' writer epochs
    l1_first: int = 0
    start_offset: int = 0
    l1_changed_log_offset: int = -1
    deleted_to: int = 0
    #: Where the state came from: "log" (read from the partition's log this run), "pack"
    #: (the previous run's state pack, unchanged) or "tick" (the pack's state and the
    #: ticks the reconciler said it wrote, read by GETs). A view not from "log" is older
    #: than the log may be: it decides M (stale-safe), never what is an orphan.
    read: str = "log"
    #: The newest writer epoch the state knows (claims and ticks): a compaction's file of
    #: a newer one belongs to a claim taken after this read (see l1_sweep).
    writer_epoch: int = 0

    def l1_after(self, w: int) -> tuple[L1Ref, ...]:
        """The committed L1 files whose records come after offset ``w``."""
        return tuple(
            committed_files(
                self.topic,
                self.partition,
                self.key_id,
                self.l1_first,
                self.l1_ends,
                self.l1_crcs,
                self.l1_tags,
                w + 1,
            )
        )

    @property
    def m(self) -> int | None:
        return None if self.min_epoch_lower_bound is None else self.min_epoch_lower_bound - 1

    @classmethod
    def of_state(cls, s: sm.PartitionState, topic_id: str | None = None, read: str = "log") -> PartitionView:
        return cls(
            s.topic,
            s.partition,
            "log",
            s.initialized,
            s.min_epoch_lower_bound,
            s.previous_applied_epoch,
            s.max_applied_epoch,
            s.last_reconciled_offset,
            s.applied_offset + 1,
            s.lag_entries,
            s.lag_records,
            s.lag_bytes,
            s.holders,
            s.min_pending_epoch,
            s.l1_ends,
            s.l1_crcs,
            topic_id,
            s.topic_id,
            s.l1_tags,
            s.l1_first,
            s.start_offset,
            s.l1_changed_log_offset,
            s.deleted_to,
            read,
            s.writer_epoch,
        )


def newest_summary(store: ObjectStore, read: dict[int, ReconcileSummary] | None = None) -> ReconcileSummary | None:
    """The newest reconcile run summary by the store's sequence, for R7 annotations
    only; a summary that does not read is skipped (it cannot change M). ``read``: the
    summaries this run has read already, by seq (one of 100k partitions is about 2 s
    of JSON)."""
    summaries = reconcile_summaries(store)
    try:
        seq = summaries.last()
        if seq < 0:
            return None
        return read[seq] if read is not None and seq in read else summaries.get(seq)
    except ObjectNotFound:
        return None
    except CtpError as e:
        log.warning("ignoring the newest reconcile summary: %s", e)
        return None


@dataclass(frozen=True)
class PackBase:
    """Where a run may start from instead of every partition's log: the states of the
    previous run's pack by ``(topic, partition)``, and the log end offsets of the
    partitions the reconciler advanced since (from its summaries: the ticks it wrote)."""

    states: dict[tuple[str, int], tuple[sm.PartitionState, int | None]]  # with the CRC32C of each one's last entry
    #: ``(topic, partition) -> (log end offset, advanced only)``: the newest log end a
    #: summary reported, and whether every summary that reported it said only
    #: "advanced" or "idle" (anything else -- reconciled, a claim held -- is read from
    #: the log).
    hints: dict[tuple[str, int], tuple[int, bool]]


@dataclass(frozen=True)
class Gathered:
    c: int
    views: list[PartitionView]
    #: Every deleted incarnation, as ``(topic, incarnation)`` (``Topic.incarnation``):
    #: what an earlier run saw of one is not "gone", it was deleted (R10).
    deleted: frozenset[tuple[str, str]]
    #: Every name as its history says (deleting incarnations: the GC removes their state).
    names: list[NameState]
    #: The states the views were made of, in the same order (what this run's pack holds).
    states: list[sm.PartitionState] = field(default_factory=list)
    #: The CRC32C of the stored bytes of the entry each state ends at (None: not known).
    last_crcs: list[int | None] = field(default_factory=list)
    read_from_logs: int = 0  # how many were read from their logs (the rest: the pack)


def gather(store: ObjectStore, *, threads: int = 32) -> tuple[int, list[PartitionView]]:
    g = gather_all(store, threads=threads)
    return g.c, g.views


def gather_all(store: ObjectStore, *, threads: int = 32, pack: PackBase | None = None) -> Gathered:
    """C first, then every live topic's partitions' states from their logs (R4); a
    deleted incarnation's partitions do not count (R10). Raises
    :class:`StateUnreadable`, naming every partition that does not read, if any.

    With ``pack``, a partition the pack holds (same incarnation) keeps the pack's state,
    or, where the reconciler advanced it since, that state plus the entries it says are
    there, read by GETs, if every one is there and is a tick. Any other partition -- new,
    written to by anyone else, or an entry missing or not a tick -- is read from its log."""
    c = ClusterEpoch(store).current()
    names = all_names(store)
    topics = [st.current for st in names if st.current is not None]
    wanted: list[tuple[Topic | str, int]] = [(t, p) for t in topics for p in range(t.partitions)]
    got: list[sm.PartitionState | None] = [None] * len(wanted)
    how: list[str] = ["log"] * len(wanted)
    crcs: list[int | None] = [None] * len(wanted)
    if pack is not None:
        for i, r in enumerate(pmap(lambda job: _from_pack(store, pack, *job), wanted, read_threads(store, threads))):
            if r is not None:
                got[i], how[i], crcs[i] = r
    todo = [i for i, s in enumerate(got) if s is None]
    # Listing reads, never probing ones (``PartitionLog``): what the GC deletes follows
    # from the states, and a log read short of a lost entry would hide what it committed.
    last_crcs: dict[tuple[str, int], int | None] = {}
    # (a partition the reconciler reported work in is read from its log next run too:
    # no GET for its last entry's CRC32C)
    busy = {tp for tp, (_, ticks) in pack.hints.items() if not ticks} if pack is not None else set()
    read, problems = try_read_partition_states(
        store,
        [wanted[i] for i in todo],
        threads=threads,
        snapshot_every=LOG_READ_SNAPSHOT_TAIL,
        last_crcs=last_crcs,
        busy=busy,
    )
    for i, s in zip(todo, read):
        got[i] = s
        if s is not None:
            crcs[i] = last_crcs.get((s.topic, s.partition))
    problems += unaccounted_logs(store, topics, names)
    if problems:
        raise StateUnreadable(problems)
    ids = {t.name: t.id for t in topics}
    states = [s for s in got if s is not None]
    views = [PartitionView.of_state(s, ids[s.topic], h) for s, h in zip(states, how)]
    deleted = frozenset((st.name, t.incarnation) for st in names for t in st.deleted)
    return Gathered(c, views, deleted, names, states, [crc for s, crc in zip(got, crcs) if s is not None], len(todo))


#: A GC read from a partition's log snapshots a tail (entries after the snapshot) this
#: long: the reconciler starts an idle partition from the pack, not its snapshot, so it
#: leaves no snapshots for the tail of ticks, and the GC's full reads (every
#: ``full_read_every`` runs) would otherwise GET an ever longer tail.
LOG_READ_SNAPSHOT_TAIL = 8


#: More reconcile summaries than this since a pack: read every partition from its log
#: instead of reading them all for hints.
MAX_HINT_SUMMARIES = 16


#: A hint that sends a partition to its log (past any log end a pack's state can have).
_READ_THE_LOG = 1 << 62


def pack_base(
    store: ObjectStore,
    passed: list[GcRecord],
    reference: list[GcPartitionView],
    heads: TableHeads,
    summary_seq: int,
    seq: int,
    config: GcSettings,
    read: dict[int, ReconcileSummary] | None = None,
) -> tuple[PackBase | None, int | None]:
    """The state pack of the newest passing run (if it wrote one), and the hints of the
    reconcile summaries since it read its states (``(None, None)``: read every partition
    from its log: no pack, one that does not read, a full read due, or too many
    summaries). Also the seq of the run that last read every partition. The summaries
    it reads are put in ``read``, by seq.

    A partition whose last L1 sweep left files behind (its watermark before its last
    reconciled offset or its log end: an orphan still young, a retired file within the
    reader grace) is left out of the pack's states: it is read from its log, so the
    sweep can delete them (only a state read from the log may say a file is an orphan
    or retired)."""
    rec = passed[-1] if passed else None  # the run whose views are this run's reference
    if rec is None or not rec.pack_key or rec.pack_crc32c is None or rec.pack_full_seq is None:
        return None, None
    if rec.pack_summary_seq is None:
        return None, None
    if seq - rec.pack_full_seq >= config.full_read_every or summary_seq - rec.pack_summary_seq > MAX_HINT_SUMMARIES:
        return None, None
    packed = read_pack(store, rec)
    if packed is None:
        return None, None
    hints: dict[tuple[str, int], tuple[int, bool]] = {}
    summaries = reconcile_summaries(store)
    for n in range(rec.pack_summary_seq + 1, summary_seq + 1):
        try:
            summary = summaries.get(n)
        except (CorruptData, ObjectNotFound):
            continue  # fewer hints: those partitions keep the pack's (older) state
        if read is not None:
            read[n] = summary
        for r in summary.partitions:
            tp = (r.topic, r.partition)
            if r.status == "error":  # the reconciler could not read or write it: the GC reads its log
                hints[tp] = (_READ_THE_LOG, False)
            elif r.state is not None:
                end, ticks = hints.get(tp, (-1, True))
                hints[tp] = (max(end, r.state.log_end_offset), ticks and r.status in ("advanced", "idle"))
    unswept = {
        (r.topic, r.partition)
        for r in reference
        if r.l1_swept_through < r.last_reconciled_offset or r.l1_swept_log_end < r.log_end_offset
    }
    states = {(s.topic, s.partition): (s, c) for s, c in packed if (s.topic, s.partition) not in unswept}
    # A table that holds what a pack's state does not commit (a compaction or a
    # reconcile nobody reported, then a publish): that partition is read from its log,
    # or the gate's table checks would refuse the run for a state that is only older.
    for h in heads.heads:
        for f in h.files:
            st = states.get((h.topic, f.partition), (None, None))[0]
            if st is not None and store.key_of(f.path) not in st.committed_l1_keys():
                del states[(h.topic, f.partition)]
        held = {f.partition for f in h.files}
        for part, published in h.published.items():
            st = states.get((h.topic, part), (None, None))[0]
            if st is not None and (published > st.last_reconciled_offset or part not in held):
                del states[(h.topic, part)]  # (none held: a trim the pack may not know of)
    return PackBase(states, hints), rec.pack_full_seq


def _from_pack(
    store: ObjectStore, pack: PackBase, t: Topic | str, p: int
) -> tuple[sm.PartitionState, str, int | None] | None:
    """The partition's state from the pack: as it is, or with the ticks the reconciler
    said it wrote (``(state, read, CRC32C of its last entry)``); None: read
    it from its log."""
    name = t if isinstance(t, str) else t.name
    key_id = None if isinstance(t, str) else t.key_id
    base, crc = pack.states.get((name, p), (None, None))
    if base is None or crc is None or base.topic_id != key_id or not base.initialized:
        return None
    end, advanced_only = pack.hints.get((name, p), (-1, True))
    if 0 <= end < base.applied_offset + 1 or (end > base.applied_offset + 1 and not advanced_only):
        return None  # a reconcile saw a shorter log than the pack (the log went back), or work
    log = PartitionLog(store, name, p, topic_id=key_id)
    # The pack is only ever older than the log -- unless the store lost the log's tail
    # after the pack was taken, and something was appended where it was: a state folded
    # from entries that are no longer there could put M past that new placeholder. So
    # the entry the pack's state ends at must still be there, with the bytes it was
    # folded from (its CRC32C). Not its mtime: a create stalled between its write and
    # its link, or an S3 PUT (Last-Modified is its start), carries a time from before.
    try:
        last = store.get(log.key(base.applied_offset))
    except ObjectNotFound:
        return None
    named = sm.ending_at(base, crc)
    if log.unvouched(named, last) is not None:
        return None
    # Anything appended since nobody reported (a producer's placeholder after the
    # reconcile) is not looked for: its epoch is at or above this state's lower bound
    # (R3, R6), so M from this state is lower, never wrong, and the next reconcile
    # reports it (a HEAD of the next key here cost a request per partition per run for
    # a fresher lag only; docs/design.md 14).
    if end <= base.applied_offset + 1:
        return base, "pack", crc
    s = base
    for offset in range(base.applied_offset + 1, end):
        key = log.key(offset)
        try:
            data = store.get(key)
            entry = en.decode(data, key)
        except (ObjectNotFound, CorruptData):
            return None  # the log decides: a gap or a bad entry is found by its listing read
        if not isinstance(entry, en.Tick):
            return None
        s = sm.apply(s, offset, entry).state
        crc = codec.crc32c(data)
    return window.recover(s), "tick", crc


def vanished(
    seq: int, remembered: list[GcPartitionView], now: set[tuple[str, int]], deleted: frozenset[tuple[str, str]]
) -> list[tuple[str, int, str]]:
    """Partitions GC run ``seq`` saw (``remembered``, of the incarnations live now or of
    none) that are neither live (``now``) nor of a deleted incarnation: their state
    vanished without a tombstone (R4, R9: the GC must not forget them by itself), each
    with the command that records it deleted. Pure."""
    return [
        (
            r.topic,
            r.partition,
            f"the GC run {seq} saw this partition of incarnation {r.topic_id or 'legacy'}, and the topic metadata "
            f"no longer lists it; if the topic is gone for good, `ctp topic delete {r.topic} --id "
            f"{r.topic_id or 'legacy'}` records it deleted",
        )
        for r in remembered
        if (r.topic, r.partition) not in now and (r.topic, r.topic_id or "legacy") not in deleted
    ]


def quarantined_of(summary: ReconcileSummary | None) -> dict[tuple[str, int], tuple[str | None, str]]:
    """The partitions the summary quarantined: (topic, partition) -> (L0 key, reason)."""
    if summary is None:
        return {}
    return {
        (p.topic, p.partition): (p.key, p.reason or "quarantined")
        for p in summary.partitions
        if p.status == "quarantined"
    }


def m_digest(views: list[PartitionView]) -> str:
    h = hashlib.sha256()
    for v in sorted(views, key=lambda v: (v.topic, v.partition)):
        h.update(f"{v.topic}/{v.partition}:{v.m}\n".encode())
    return h.hexdigest()
