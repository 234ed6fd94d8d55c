"""Reading many partitions' states at once, for ``ctp status`` and the GC."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from ctp_state import incarnations, layout, state as sm
from ctp_state.errors import CtpError, TopicNotFound
from ctp_state.incarnations import NameState
from ctp_state.parallel import pmap, read_threads
from ctp_state.partition_log import DEFAULT_SNAPSHOT_EVERY, PartitionLog
from ctp_state.records import HolderFacts, PartitionFacts, ReconcileSummary
from ctp_state.sequence import DenseSequence
from ctp_state.storage import ObjectStore
from ctp_state.topics import Topic, get_topic, list_topics


def reconcile_summaries(store: ObjectStore) -> DenseSequence[ReconcileSummary]:
    """The reconcile run summaries (``runs/reconcile/``), oldest first by seq."""
    return DenseSequence(store, layout.RECONCILE_RUNS, ReconcileSummary)


def select_topics(store: ObjectStore, names: Iterable[str] | None = None) -> list[Topic]:
    if names:
        return [get_topic(store, n) for n in names]
    return list_topics(store)


def read_states(store: ObjectStore, topics: list[Topic], *, threads: int = 32) -> list[sm.PartitionState]:
    """Read every partition's current state, ``threads`` partitions at a time."""
    return read_partition_states(store, [(t, p) for t in topics for p in range(t.partitions)], threads=threads)


#: A partition to read: its topic (a :class:`Topic`; a bare name means a topic whose
#: keys carry only its name) and its number.
Job = tuple[Topic | str, int]


def _name(t: Topic | str) -> str:
    return t if isinstance(t, str) else t.name


def read_partition_states(store: ObjectStore, partitions: list[Job], *, threads: int = 32) -> list[sm.PartitionState]:
    """The current state of each (topic, partition), in the order given."""
    return pmap(lambda job: PartitionLog(store, *job).read_state(), partitions, read_threads(store, threads))


def try_read_partition_states(
    store: ObjectStore,
    partitions: list[Job],
    *,
    threads: int = 32,
    snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
    idle_snapshot_every: int | None = None,
    probe: bool = False,
    bases: Mapping[tuple[str, int], tuple[sm.PartitionState, int | None]] | None = None,
    last_crcs: dict[tuple[str, int], int | None] | None = None,
    busy: Collection[tuple[str, int]] = (),
) -> tuple[list[sm.PartitionState | None], list[tuple[str, int, str]]]:
    """Like :func:`read_partition_states`, but a partition that does not read is
    reported as ``(topic, partition, why)`` (its slot is None) instead of raising.
    A partition whose tail (entries after its snapshot) is ``snapshot_every`` or longer
    gets a new snapshot, as any reader writes one (an idle one, no placeholder pending,
    already at ``idle_snapshot_every``). With ``probe``, tails are read by GETs of the
    next key, not listed (:class:`PartitionLog`). With ``bases`` (the GC's state pack:
    each state with the CRC32C of the entry it ends at), a partition starts from its
    state there instead of its snapshot, where the log vouches for it
    (:meth:`PartitionLog.read_state`). With ``last_crcs``, each state's last entry's
    CRC32C is put there (what a pack of these states names; None where it would cost a
    GET for a partition with placeholders pending, or one in ``busy``)."""

    def one(job: Job) -> sm.PartitionState | str:
        base, crc = bases.get((_name(job[0]), job[1]), (None, None)) if bases else (None, None)
        try:
            log = PartitionLog(
                store, *job, snapshot_every=snapshot_every, idle_snapshot_every=idle_snapshot_every, probe=probe
            )
            state = log.read_state(base, crc)
            if last_crcs is not None:
                # A GET for it only where a pack may stand in for the log next time: not
                # for a partition with work pending or just done (``busy``), which the
                # next run reads from its log anyway.
                tp = (_name(job[0]), job[1])
                last_crcs[tp] = log.last_entry_crc(state, fetch=not state.pending and tp not in busy)
            return state
        except CtpError as e:
            return str(e)

    got = pmap(one, partitions, read_threads(store, threads))
    problems = [(_name(t), p, r) for (t, p), r in zip(partitions, got) if isinstance(r, str)]
    return [None if isinstance(r, str) else r for r in got], problems


def unaccounted_logs(
    store: ObjectStore, topics: list[Topic], names: list[NameState] | None = None
) -> list[tuple[str, int, str]]:
    """State logs the topic metadata does not account for, as ``(topic, partition, why)``
    (partition -1: a whole topic). A partition whose metadata went missing or shrank
    would drop out of M and of every check; the GC must see it (R4, R9). The logs of a
    deleted incarnation are accounted for by its tombstone (``names``: every name's
    history, read here when not given)."""
    names = incarnations.all_names(store) if names is None else names
    deleted = {st.name: st.deleted for st in names}
    known = {t.name: t for t in topics}
    problems: list[tuple[str, int, str]] = []
    topic_dirs, _ = store.list_level(layout.LOGS_ROOT)
    for d in topic_dirs:
        name = d[len(layout.LOGS_ROOT) : -1]
        if name in known or name in deleted:
            continue
        try:
            get_topic(store, name)
            continue  # created after ``topics`` was listed: its inits carry an epoch >= C (R4)
        except TopicNotFound:
            if next(iter(store.list(d)), None) is None:
                continue  # an emptied directory some S3 servers keep listing
            ids = _spaces_under(store, d)
            problems.append(
                (
                    name,
                    -1,
                    f"state logs exist under {d} but the topic has no metadata ({layout.topic_meta(name)} is missing); "
                    + _acknowledge(name, ids),
                )
            )
        except CtpError as e:
            problems.append((name, -1, f"state logs exist under {d} but the topic's metadata does not read: {e}"))
    for name in sorted(set(known) | set(deleted)):
        top = f"{layout.LOGS_ROOT}{name}/"
        dirs, _ = store.list_level(top)
        t = known.get(name)
        gone = deleted.get(name, ())
        spaces = {f"{layout.LOGS_ROOT}{layout.space(name, x.key_id)}/" for x in gone if x.key_id is not None}
        legacy_gone = any(x.key_id is None for x in gone)
        own = f"{layout.LOGS_ROOT}{layout.space(name, t.key_id)}/" if t is not None else None
        fresh: list[str] | None = None  # the name's spaces re-read: one created after ``names`` was
        for d in dirs:
            if d == own or d in spaces:
                continue
            if layout.is_partition_dir(d, top) and ((t is not None and t.key_id is None) or legacy_gone):
                continue  # the partitions of an incarnation whose keys carry only the name
            if fresh is None:
                now = incarnations.read_name(store, name)
                every = [x for x in (now.current, *now.deleted) if x is not None and x.key_id is not None]
                fresh = [f"{layout.LOGS_ROOT}{layout.space(name, x.key_id)}/" for x in every]
            if d in fresh:
                continue  # an incarnation created after the names were read (R4: its inits carry an epoch >= C)
            if next(iter(store.list(d)), None) is not None:  # an emptied directory some S3 servers keep listing
                which = d[len(top) : -1]
                ids = [which] if layout.is_id_dir(d, top) else ["legacy"] if layout.is_partition_dir(d, top) else []
                problems.append(
                    (
                        name,
                        -1,
                        f"state logs exist under {d} but belong to no incarnation of {name}; "
                        + _acknowledge(name, ids),
                    )
                )
        if t is None:
            continue
        part_dirs = store.list_level(own)[0] if own is not None and t.key_id is not None else dirs
        for d in part_dirs:
            part = d.rstrip("/").rsplit("/", 1)[1]
            if not layout.is_partition_dir(d, own or top):
                continue  # reported above
            if (
                int(part) >= t.partitions
                and not (t.key_id is None and legacy_gone)
                and next(iter(store.list(d)), None) is not None
            ):
                problems.append(
                    (
                        t.name,
                        int(part),
                        f"a state log exists under {d} but the topic's metadata says it has {t.partitions} partitions",
                    )
                )
    return problems


def _spaces_under(store: ObjectStore, top: str) -> list[str]:
    """The incarnations whose state logs ``top`` (``logs/<name>/``) holds: each id
    directory, and ``legacy`` for partition directories of keys named by the topic."""
    dirs = store.list_level(top)[0]
    ids = [d[len(top) : -1] for d in dirs if layout.is_id_dir(d, top)]
    return ids + (["legacy"] if any(layout.is_partition_dir(d, top) for d in dirs) else [])


def _acknowledge(name: str, ids: list[str]) -> str:
    """What an operator runs to record an incarnation nobody recorded as deleted."""
    if not ids:
        return "nothing ctp wrote is named so: move it out of logs/ by hand"
    cmds = " and ".join(f"`ctp topic delete {name} --id {i}`" for i in ids)
    return f"if it is not to be kept, {cmds} records it deleted (the GC then removes it)"


def facts(s: sm.PartitionState) -> PartitionFacts:
    """One partition's state as a plain record (``ctp status --json``, run summaries,
    the GC's inputs)."""
    return PartitionFacts(
        topic=s.topic,
        partition=s.partition,
        initialized=s.initialized,
        window=(s.window[0], s.window[1]) if s.window else None,
        max_applied_epoch=s.max_applied_epoch,
        previous_applied_epoch=s.previous_applied_epoch,
        min_epoch_lower_bound=s.min_epoch_lower_bound,
        m=s.m,
        log_end_offset=s.applied_offset + 1,
        next_offset=s.next_offset,
        last_reconciled_offset=s.last_reconciled_offset,
        lag_entries=s.lag_entries,
        lag_records=s.lag_records,
        lag_bytes=s.lag_bytes,
        min_pending_epoch=s.min_pending_epoch,
        writer_epoch=s.writer_epoch,
        holders=tuple(
            HolderFacts(owner=h.owner, mode=h.mode.value, writer_epoch=h.writer_epoch, lease_until_ms=h.lease_until_ms)
            for h in s.holders
        ),
    )
