"""One GC run: :mod:`ctp_state.gc.prepare` (inputs, M, the gate's tables, the gate),
then deletes and the history record.

5. If the gate fails, the run is recorded as ``gate_failed`` and :class:`GateFailed` is
   raised: nothing was deleted. Otherwise list L0 per spread prefix up to M, then
   (unless a dry run) delete L0 objects and L1 orphans, remove what is left of deleted
   topics, and maintain the topics' tables.
6. Append the history record and this run's partition view.

A run killed at any point leaves no record (the history only holds finished runs) and
nothing half-done that matters: deletes are idempotent and the next run lists again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pyarrow as pa

from ctp_state import crashpoints, deletion, layout
from ctp_state.codec import crc32c
from ctp_state.errors import CtpError, GateFailed, StateUnreadable
from ctp_state.gc.delete import GcCounters, delete_objects, plan_l0_deletes
from ctp_state.gc.history import PASSED, GcHistory, high_water
from ctp_state.gc.inputs import m_digest
from ctp_state.gc.outcome import Outcome, RunFacts, counts
from ctp_state.gc.pack import encode_pack, pack_key, pack_seq
from ctp_state.gc.prepare import Gate, Prepared, check, held_by, prepare
from ctp_state.gc.table_hook import TableHook, TableSweep
from ctp_state.gc.tables import (
    deletes_table,
    partition_view_table,
)
from ctp_state.parallel import collector_paused
from ctp_state.records import GateInfo, GcRecord, HeldBy, HistorySkip
from ctp_state.settings import GcSettings
from ctp_state.storage import ObjectInfo, ObjectStore

log = logging.getLogger(__name__)

SAMPLE_KEYS = 10  # L0 keys a history record names; the full list is in its deletes Parquet


@collector_paused()
def run_gc(
    store: ObjectStore,
    *,
    gate: Gate,
    config: GcSettings = GcSettings(),
    on_progress: Callable[[str, int, int], None] = lambda stage, done, total: None,
    clock: Callable[[], float] = time.time,
    tables: TableHook | None = None,
) -> GcRecord:
    """One GC run; returns its history record. With ``tables`` (see
    :class:`ctp_state.table.maintenance.CatalogTables`), the gate also checks the topics' Iceberg
    tables against their state logs, and the run expires old table snapshots and deletes
    the table files nothing reaches any more. Raises :class:`GateFailed` (nothing
    deleted) when the checkpoint fails, :class:`StateUnreadable` (nothing deleted, the
    run recorded as ``failed``) when a partition's state cannot be read."""
    try:
        p = prepare(store, config, on_progress=on_progress, clock=clock, tables=tables)
    except StateUnreadable as e:
        _record_unreadable(store, config, e, clock)
        raise
    decision, history = p.decision, p.history
    base: RunFacts = {
        "run_id": p.run_id,
        "started_ms": p.started_ms,
        "dry_run": config.dry_run,
        "cluster_epoch": p.cluster_epoch,
        "m": decision.m,
        "m_high_water_before": p.m_high_water_before,
        "partitions": len(p.views),
        "summary_run_id": p.summary_used,
        "m_digest": m_digest(p.views),
        "history_skipped": tuple(HistorySkip(seq=seq, why=why) for seq, why in p.history_skipped),
        "held_by": tuple(held_by(h) for h in decision.held_by[:20]),
        "held_by_count": len(decision.held_by),
        "alert": p.alert,
        "config": {"grace_s": config.grace_s, "l1_grace_s": config.l1_grace_s, "max_deletes": config.max_deletes},
    }

    def finish(
        status: str,
        extra: Outcome,
        *,
        with_view: bool,
        marks: dict[tuple[str, int], tuple[int, int]] | None = None,
        deletes: pa.Table | None = None,
    ) -> GcRecord:
        written: dict[int, list[str]] = {}  # this run's view and deleted-keys files, by the seq tried

        def make(seq: int) -> GcRecord:
            nonlocal status
            finished_ms = int(clock() * 1000)
            between = history.tail(seq - p.last_seq - 1, seq - 1, unreadable=[]) if seq > p.last_seq + 1 else []
            # Another GC recorded a run after this one read the history. If it saw a higher
            # M (it read newer states), this run's lower M must not become the reference,
            # or the history would decrease: it is recorded as superseded. Its deletes were
            # at or below its own M, so below the other's: safe.
            if status in PASSED and any(
                r.passed and (r.m if r.m is not None else -1) > (decision.m if decision.m is not None else -1)
                for r in between
            ):
                status = "superseded"
            passed_now = status in PASSED and decision.m is not None
            hw = max(
                [
                    x
                    for x in (p.m_high_water_before, high_water(between), decision.m if passed_now else None)
                    if x is not None
                ],
                default=None,
            )
            view = (
                history.write_partitions(
                    seq,
                    partition_view_table(p.views, marks if marks is not None else p.watermarks, p.statuses),
                    p.run_id,
                )
                if with_view
                else None
            )
            listed = history.write_deletes(seq, deletes, p.run_id) if deletes is not None else None
            # The states this run decided on, for the next run to start from: only a run
            # whose gate passed, and that is not superseded, leaves one.
            pack = write_pack(store, seq, p) if with_view and status in PASSED else None
            written.setdefault(seq, []).extend(k for k in (view, listed, pack and pack[0]) if k is not None)
            crashpoints.reached("gc_before_record")
            return GcRecord(
                **base,
                **extra,
                status=status,
                finished_ms=finished_ms,
                seconds=round((finished_ms - p.started_ms) / 1000, 3),
                m_high_water=hw,
                partitions_key=view,
                deletes_key=listed,
                pack_key=pack and pack[0],
                pack_crc32c=pack and pack[1],
                pack_full_seq=(seq if p.pack_full_seq is None else p.pack_full_seq) if pack else None,
                pack_summary_seq=p.pack_summary_seq if pack else None,
                partitions_read=p.partitions_read,
            )

        rec: GcRecord | None = None
        try:
            rec = history.append(make)
            if rec.pack_key:
                drop_old_packs(store, rec.seq)
            return rec
        finally:
            # A seq lost to a concurrent GC leaves files no record names: this run's own,
            # so it removes them now. The seq it holds is kept, and so is the last one it
            # tried when the append failed: that record may have landed (its response
            # lost); if it did not, the run that takes the seq collects them
            # (gc_run_orphans).
            keep = rec.seq if rec is not None else max(written, default=-1)
            stale = [k for seq, keys in written.items() if seq != keep for k in keys]
            if stale:
                try:
                    store.delete_many(stale)
                except CtpError as err:  # the next runs collect them (gc_run_orphans)
                    log.warning("could not remove this run's unrecorded files %s: %s", stale, err)

    on_progress("gate", 0, 1)
    result, failures = check(p, gate)
    on_progress("gate", 1, 1)
    gate_info: Outcome = {
        "gate": GateInfo(success=not failures, statistics=result.statistics, failures=tuple(failures), docs=result.docs)
    }
    if failures:
        # The view goes on record for the operator (the report shows why the gate
        # failed beside each partition's status); only passing runs' views are ever a
        # reference for later runs.
        finish("gate_failed", gate_info, with_view=True)
        raise GateFailed(failures, result.statistics, result.docs)

    counters = GcCounters()
    l1_orphans = [o for s in p.sweeps for o in s.orphans]
    l1_retired = [o for s in p.sweeps for o in s.retired]
    l1_info: Outcome = {
        "l1_retired": len(l1_retired),
        "l1_retired_bytes": sum(o.size for o in l1_retired),
        "l1_retired_kept": sum(s.retired_kept for s in p.sweeps),
        "l1_dropped_held": sum(s.dropped_held for s in p.sweeps),
        "l1_listed": sum(s.listed for s in p.sweeps),
        "l1_new_files_checked": sum(len(s.new_files) for s in p.sweeps),
        "l1_orphans": len(l1_orphans),
        "l1_orphan_bytes": sum(o.size for o in l1_orphans),
        "l1_young_skipped": sum(s.young for s in p.sweeps),
        "l1_partitions_unchanged": sum(1 for s in p.sweeps if s.skipped),
        "l1_full_sweep": p.full_sweep,
        "l1_full_sweep_ms": p.last_full_sweep_ms,
    }
    bulk = store.bulk()  # listing and deletes pace themselves (AIMD per spread prefix)
    todo: list[ObjectInfo] | None = None  # planned: the audit trail of a run that fails part way
    l1_res, gc_res, retired_res = GcCounters(), GcCounters(), GcCounters()
    gc_orphans: list[ObjectInfo] = []
    removal = deletion.RemoveResult()
    swept = TableSweep()
    table_res = GcCounters()

    def deletes(planned: list[ObjectInfo], *, interrupted: bool = False) -> pa.Table:
        """Every key this run deleted (or, ``interrupted``, may have), on its audit trail."""
        return deletes_table(
            planned,
            set(counters.failed_keys),
            l1_orphans,
            set(l1_res.failed_keys),
            dry_run=False,
            interrupted=interrupted,
            gc_files=gc_orphans,
            gc_failed=frozenset(gc_res.failed_keys),
            topic_files=removal.deleted,
            topic_failed=frozenset(removal.failed),
            table_files=swept.unreachable,
            table_failed=frozenset(table_res.failed_keys),
            retired_files=l1_retired,
            retired_failed=frozenset(retired_res.failed_keys),
        )

    try:
        on_progress("list", 0, 1)
        assert decision.m is not None  # a null M failed the gate above
        todo, counters = plan_l0_deletes(
            store,
            decision.m,
            now_s=clock(),
            grace_s=config.grace_s,
            threads=config.list_threads,
            counters=counters,
            bulk=bulk,
        )
        on_progress("list", 1, 1)
        limited = 0
        if config.max_deletes is not None and len(todo) > config.max_deletes:
            todo.sort(key=lambda o: (layout.parse_l0_key(o.key)[1], o.key))  # lowest epochs first
            limited = len(todo) - config.max_deletes
            todo = todo[: config.max_deletes]
        epochs = sorted(layout.parse_l0_key(o.key)[1] for o in todo)
        plan: Outcome = {
            "would_delete": len(todo),
            "would_delete_bytes": sum(o.size for o in todo),
            "skipped_max_deletes": limited,
            "delete_epochs": (epochs[0], epochs[-1]) if epochs else None,
            "delete_sample": tuple(sorted(o.key for o in todo)[:SAMPLE_KEYS]),
        }
        if config.dry_run:
            return finish(
                "dry_run",
                {**gate_info, **counts(counters), **plan, **l1_info},
                with_view=True,
                deletes=deletes_table(todo, set(), l1_orphans, set(), dry_run=True, retired_files=l1_retired),
            )
        delete_objects(
            bulk,
            todo,
            counters=counters,
            in_flight=config.in_flight,
            on_progress=lambda d, t: on_progress("delete", d, t),
        )
        l1_res = delete_objects(bulk, l1_orphans, in_flight=config.in_flight)
        # R11: retired L1 files, behind the gate that checked their replacements
        retired_res = delete_objects(bulk, l1_retired, in_flight=config.in_flight)
        gc_orphans = gc_run_orphans(store, p.tail, p.last_seq)
        gc_res = delete_objects(bulk, gc_orphans, in_flight=config.in_flight)
        # Deleted topic incarnations (R10): not counted for M above; their state goes
        # here once their tombstone is older than the grace period.
        removal = deletion.remove(
            store,
            p.names,
            now_s=clock(),
            grace_s=config.topic_removal_grace_s,
            delete=lambda objs: set(delete_objects(bulk, objs, in_flight=config.in_flight).failed_keys),
            sweep_removed=p.full_sweep,
            drop_table=tables.drop if tables is not None else lambda t: None,
        )
        for err in removal.errors:
            log.warning("removing a deleted topic: %s", err)
        if tables is not None:
            swept = tables.maintain(deletion.store_now(store), config.l1_grace_s)
            table_res = delete_objects(bulk, swept.unreachable, in_flight=config.in_flight)
            for err in swept.errors:
                log.warning("maintaining a topic's table: %s", err)
        l1_info.update(
            Outcome(
                l1_orphans_deleted=l1_res.deleted,
                l1_orphan_bytes_deleted=l1_res.deleted_bytes,
                l1_delete_errors=l1_res.delete_errors + retired_res.delete_errors,
                l1_retired_deleted=retired_res.deleted,
                l1_retired_bytes_deleted=retired_res.deleted_bytes,
                gc_orphans_deleted=gc_res.deleted,
                topic_incarnations_removed=len(removal.removed),
                topic_incarnations_waiting=len(removal.waiting),
                topic_objects_deleted=len(removal.deleted) - len(removal.failed),
                topic_removal_errors=tuple(removal.errors),
                table_snapshots_expired=swept.expired,
                table_files_deleted=table_res.deleted,
                table_errors=(*p.table_heads.errors, *swept.errors),
                tmp_deleted=store.sweep_temporary(config.tmp_grace_s, clock()),
            )
        )
    except CtpError as e:
        try:
            finish(
                "failed",
                {**gate_info, **counts(counters), **l1_info, "error": str(e)},
                with_view=False,
                deletes=None if todo is None or config.dry_run else deletes(todo, interrupted=True),
            )
        except CtpError as err:  # the store is down: the operator needs the first error, not this one
            log.warning("could not record the failed GC run: %s", err)
        raise e
    finally:
        if bulk is not store:
            try:
                bulk.close()
            except Exception as err:  # never hide the run's own error behind this one
                log.warning("could not close the GC's bulk S3 client: %s", err)
    # Keys that still fail after every retry make the run "partial": M stands, the
    # objects are listed again next run. L1 watermarks only move if every orphan went.
    failed_any = (
        counters.delete_errors
        or l1_res.delete_errors
        or gc_res.delete_errors
        or removal.errors
        or table_res.delete_errors
        or retired_res.delete_errors
    )
    status = "partial" if failed_any else "ok"
    if p.full_sweep and not l1_res.delete_errors:  # a full sweep counts once every orphan it found went
        l1_info["l1_full_sweep_ms"] = p.started_ms
    return finish(
        status,
        {**gate_info, **counts(counters), **plan, **l1_info},
        with_view=True,
        marks=p.new_marks if not l1_res.delete_errors else None,
        deletes=deletes(todo),
    )


#: State packs kept behind the newest run's (a run that read the history just before a
#: newer one landed still finds the pack it starts from).
KEEP_PACKS = 2


def write_pack(store: ObjectStore, seq: int, p: Prepared) -> tuple[str, int]:
    """Write the run's state pack for record ``seq``; ``(key, CRC32C)``."""
    data = encode_pack(seq, p.run_id, p.pack_states, p.pack_crcs)
    key = pack_key(seq, p.run_id)
    store.put(key, data)
    return key, crc32c(data)


def drop_old_packs(store: ObjectStore, seq: int) -> None:
    """Delete the packs of runs more than :data:`KEEP_PACKS` before ``seq`` (a cache:
    one left behind costs bytes, and the next run tries again)."""
    try:
        old = [
            i.key
            for i in store.list(layout.GC_PACKS, end_before=f"{layout.GC_PACKS}{max(0, seq - KEEP_PACKS):020d}")
            if pack_seq(i.key) is not None
        ]
        if old:
            store.delete_many(old)
    except CtpError as e:
        log.warning("could not delete old GC state packs: %s", e)


def gc_run_orphans(store: ObjectStore, tail: list[GcRecord], last_seq: int) -> list[ObjectInfo]:
    """Files of GC runs that no record names, among the seqs of ``tail`` (records that
    read, up to ``last_seq``): each seq's record names its own run's view and deleted-keys
    files, so any other file with that seq is a dead run's (killed after writing it,
    before its record; a run that loses a seq removes its own). A seq whose record does
    not read keeps its files. Bounded by the tail: older seqs were looked at by earlier
    runs."""
    if not tail:
        return []
    named = {r.seq: {r.partitions_key, r.deletes_key} for r in tail}
    first = min(named)
    out: list[ObjectInfo] = []
    for prefix in (layout.GC_PARTITIONS, layout.GC_DELETES):
        start = f"{prefix}{first - 1:020d}-~" if first > 0 else None  # '~' sorts after every run id
        for info in store.list(prefix, start_after=start, end_before=f"{prefix}{last_seq + 1:020d}"):
            seq = layout.parse_gc_run_file(info.key, prefix)
            if seq is not None and seq in named and info.key not in named[seq]:
                out.append(info)
    return out


def _record_unreadable(store: ObjectStore, config: GcSettings, e: StateUnreadable, clock: Callable[[], float]) -> None:
    """Put a run that could not read every partition on record: which ones, and why."""
    now = int(clock() * 1000)
    held = tuple(
        HeldBy(topic=t, partition=p, m=None, reasons=(f"state cannot be read: {why}",)) for t, p, why in e.problems[:20]
    )
    history = GcHistory(store)
    tail = history.tail(1, unreadable=[])
    rec = GcRecord(
        run_id=f"{now}-unreadable",
        started_ms=now,
        finished_ms=now,
        seconds=0.0,
        dry_run=config.dry_run,
        status="failed",
        error=str(e),
        m=None,
        m_high_water=high_water(tail),
        held_by=held,
        held_by_count=len(e.problems),
    )
    try:
        history.append(lambda seq: rec)
    except CtpError as err:  # the run stays failed either way; say so in the log
        log.warning("could not record the failed GC run: %s", err)
