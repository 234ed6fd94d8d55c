"""Steps 1-4 of a GC run: read, compute M, sweep L1 (listing only), build the gate's
tables -- and the gate itself with its plain-Python backstop. Nothing here deletes.

1. Read the topics' Iceberg table heads, if the run was given its tables (first: see
   :mod:`ctp_state.gc.table_hook`), then the cluster epoch C, then every partition of
   every topic from its state log (R4): the newest snapshot plus the entries after it,
   as every reader reads it. If any partition's state cannot be read, the run deletes
   nothing (R9). Reconcile run summaries never decide M; the newest one (by the store's
   sequence, not a clock) only adds why a partition is held back (a quarantined chunk, R7).
2. M = min(C - 1, min M(p)), with the partitions that set it and why (R7).
3. Sweep L1 for orphans (listing only what is new since the last sweep) and check the
   newly committed L1 files' offsets.
4. The gate: the Great Expectations checkpoint (passed in as ``gate``; see
   ``expectations/``) over five tables: the GC history with the candidate M, the
   partition states against the previous run's, the new L1 files, and each table's files
   and partitions beside the state logs. A plain-Python backstop repeats the
   monotonic-M check, the table checks, and checks, independently of the lower bounds,
   that no pending placeholder anywhere has an epoch <= M (I1).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ctp_state import layout
from ctp_state.codec import JsonObject
from ctp_state.deletion import store_now
from ctp_state.errors import StateUnreadable
from ctp_state.gc import l1_sweep
from ctp_state.gc.alert import m_alert
from ctp_state.gc.history import GcHistory, high_water, reference_view
from ctp_state.gc.inputs import PartitionView, gather_all, newest_summary, pack_base, quarantined_of, vanished
from ctp_state.gc.safe_epoch import Holdback, MDecision, PartitionStatus, compute_m, partition_status
from ctp_state.gc.table_hook import TableHeads, TableHook
from ctp_state.gc.tables import (
    HistoryCandidate,
    authorize_drop,
    dropped_table,
    history_table,
    state_table,
    table_files_table,
    table_partitions_table,
)
from ctp_state.incarnations import NameState
from ctp_state.records import GcAlert, GcRecord, HeldBy, ReconcileSummary
from ctp_state.settings import GcSettings
from ctp_state.state import PartitionState
from ctp_state.status import reconcile_summaries
from ctp_state.storage import ObjectStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GateResult:
    success: bool
    failures: list[str]
    statistics: JsonObject = field(default_factory=dict)  # as GX reports them
    docs: str | None = None


Gate = Callable[[dict[str, pa.Table]], GateResult]


def held_by(h: Holdback) -> HeldBy:
    return HeldBy(topic=h.topic, partition=h.partition, m=h.m, reasons=h.reasons)


@dataclass
class Prepared:
    """Everything a run computes before the gate: inputs, M, the L1 sweep, the tables."""

    run_id: str
    started_ms: int
    history: GcHistory
    last_seq: int
    m_high_water_before: int | None
    cluster_epoch: int
    views: list[PartitionView]
    decision: MDecision
    summary_used: str | None  # the reconcile summary the R7 reasons came from
    sweeps: list[l1_sweep.SweepResult]
    watermarks: dict[tuple[str, int], tuple[int, int]]
    new_marks: dict[tuple[str, int], tuple[int, int]]
    frames: dict[str, pa.Table]
    history_skipped: list[tuple[int, str]] = field(default_factory=list)
    full_sweep: bool = False  # this run lists every L1 file (l1_sweep "Full sweeps")
    last_full_sweep_ms: int | None = None  # when the last completed full sweep started
    alert: GcAlert | None = None  # M stalled or a partition quarantined (gc/alert.py)
    statuses: dict[tuple[str, int], PartitionStatus] = field(default_factory=dict)  # for the operator's view
    tail: list[GcRecord] = field(default_factory=list)  # the newest history records that read
    names: list[NameState] = field(default_factory=list)  # every topic name (deleted incarnations to remove)
    table_heads: TableHeads = field(default_factory=TableHeads)  # the topics' tables, read before the states
    pack_states: list[PartitionState] = field(default_factory=list)  # the states decided on (this run's pack)
    pack_crcs: list[int | None] = field(default_factory=list)  # the CRC32C of each one's last entry
    pack_full_seq: int | None = None  # the run that last read every log (None: this one did)
    pack_summary_seq: int = -1  # the newest reconcile summary before the states were read
    partitions_read: int = 0  # states read from their logs (the rest came from the pack)


def prepare(
    store: ObjectStore,
    config: GcSettings = GcSettings(),
    *,
    on_progress: Callable[[str, int, int], None] = lambda stage, done, total: None,
    clock: Callable[[], float] = time.time,
    tables: TableHook | None = None,
) -> Prepared:
    """Steps 1-3: read, compute M, sweep L1 (listing only), build the gate's tables.
    With ``tables``, the topics' Iceberg tables are read first (see
    :mod:`ctp_state.gc.table_hook` for why first) and checked against the states."""
    started_ms = int(clock() * 1000)
    run_id = f"{started_ms}-{uuid.uuid4().hex[:8]}"
    history = GcHistory(store)
    last = history.last_seq()
    # A history record or view that does not read is skipped and put on this run's
    # record: failing every later run over it would stop collection for good. The I3
    # check then rests on the newest records that do read (each carries the high water
    # of everything before it).
    skipped: list[tuple[int, str]] = []
    tail = history.tail(config.history_tail, last, unreadable=skipped)
    passed = [r for r in tail if r.passed]
    hw_before = high_water(tail)

    # The reference for lower bounds and L1 watermarks: the newest passing run's view
    # that reads (a dry run's view carries the watermarks it was given, unchanged).
    ref, pt = reference_view(history, passed, skipped)
    last_full = ref.l1_full_sweep_ms if ref else None
    full = last_full is None or started_ms - last_full >= config.l1_full_sweep_s * 1000

    on_progress("read", 0, 1)
    heads = tables.heads() if tables is not None else TableHeads()
    summary_seq = reconcile_summaries(store).last()  # before the states: its entries are in them
    read: dict[int, ReconcileSummary] = {}
    base, pack_full_seq = (
        (None, None) if full else pack_base(store, passed, pt, heads, summary_seq, last + 1, config, read)
    )
    gathered = gather_all(store, threads=config.read_threads, pack=base)
    c, views = gathered.c, gathered.views
    summary = newest_summary(store, read)
    summary_used = summary.run_id if summary else None
    on_progress("read", 1, 1)
    quarantined = quarantined_of(summary)
    decision: MDecision = compute_m(
        c,
        views,  # type: ignore[arg-type]
        now_ms=started_ms,
        quarantined=quarantined,
        idle_lag=summary.idle_lag if summary else 0,
        ticks_spread=summary.ticks_spread if summary else False,
    )
    alert = m_alert(
        m=decision.m,
        cluster_epoch=c,
        held_by=[held_by(h) for h in decision.held_by],
        quarantined=quarantined,
        previous=tail,
        stall_runs=config.alert_stall_runs,
        stall_epochs=config.alert_stall_epochs,
        idle_lag=summary.idle_lag if summary else 0,  # (between ticks an idle partition's M(p) stays put)
    )
    statuses = {
        (v.topic, v.partition): partition_status(
            v,  # type: ignore[arg-type]
            c,
            now_ms=started_ms,
            quarantined=quarantined,
            idle_lag=summary.idle_lag if summary else 0,
            ticks_spread=summary.ticks_spread if summary else False,
        )
        for v in views
    }

    previous_lb: dict[tuple[str, int], int] = {}
    previous_start: dict[tuple[str, int], int] = {}
    watermarks: dict[tuple[str, int], tuple[int, int]] = {}
    if ref:
        # What the reference run learnt of a partition holds only for the same incarnation
        # of its topic: a topic deleted and created again (with any partition count)
        # starts with no watermark (every L1 file of the new incarnation is checked) and
        # no earlier lower bound, and the old incarnation's partitions are not "gone".
        incarnation = {v.topic: v.topic_id for v in views}
        same = [r for r in pt if r.topic not in incarnation or incarnation[r.topic] == r.topic_id]
        gone = vanished(ref.seq, same, {(v.topic, v.partition) for v in views}, gathered.deleted)
        if gone:
            raise StateUnreadable(gone)
        previous_lb = {
            (r.topic, r.partition): r.min_epoch_lower_bound for r in same if r.min_epoch_lower_bound is not None
        }
        previous_start = {(r.topic, r.partition): r.start_offset for r in same if r.start_offset is not None}
        watermarks = {(r.topic, r.partition): (r.l1_swept_through, r.l1_swept_log_end) for r in same}

    # Every partition's new committed L1 files are checked (their L0 sources may go this
    # run); orphans are collected only where no claim is live (a reconciler may be
    # writing), in the topics asked for, and from states read from the logs this run (a
    # pack's state may not know a commit). Once a period, every L1 file is listed.
    inputs = []
    for v in views:
        if not v.initialized:
            continue
        w, log_end = watermarks.get((v.topic, v.partition), (-1, -1))
        changed_p = v.l1_changed_log_offset >= 0  # compacted or trimmed (R11)
        collect = (
            v.read == "log"
            and not any(h.lease_until_ms > started_ms for h in v.holders)
            and (not config.sweep_topics or v.topic in config.sweep_topics)
        )
        inputs.append(
            l1_sweep.SweepInput(
                v.topic,
                v.partition,
                v.last_reconciled_offset,
                v.log_end_offset,
                w,
                log_end,
                v.l1_after(w),
                collect,
                full,
                frozenset(r.key for r in v.l1_after(-1)) if full else frozenset(),
                v.key_id,
                all_refs=v.l1_after(-1) if changed_p else (),
                l1_first=v.l1_first,
                changed_log_offset=v.l1_changed_log_offset,
                changed_entry_key=layout.log_entry(v.topic, v.partition, v.l1_changed_log_offset, v.key_id)
                if changed_p
                else None,
                holders=frozenset(h.writer_epoch for h in v.holders),
                writer_epoch=v.writer_epoch,
            )
        )
    on_progress("l1-check", 0, len(inputs))
    changed = any(i.changed_log_offset >= 0 for i in inputs)
    now_store = store_now(store) if changed else None
    sweeps = l1_sweep.sweep(
        store,
        inputs,
        now_s=clock(),
        grace_s=config.l1_grace_s,
        reader_grace_s=config.l1_reader_grace_s,
        store_now_s=now_store,
    )
    by_tp = {(v.topic, v.partition): v for v in views}
    _spare_what_tables_name(store, sweeps, by_tp, tables)
    dropped = _hold_what_nothing_allows(
        sweeps,
        by_tp,
        {n.name: (n.retention_ms, n.retention_bytes) for n in gathered.names if n.current is not None},
        int((now_store if now_store is not None else clock()) * 1000),
    )
    on_progress("l1-check", len(inputs), len(inputs))
    new_marks = dict(watermarks)
    new_marks.update({(s.topic, s.partition): (s.swept_through, s.swept_log_end) for s in sweeps})

    frames = {
        "gc_history": history_table(
            tail,
            HistoryCandidate(
                seq=last + 1,
                m=decision.m,
                cluster_epoch=c,
                m_high_water_before=hw_before,
                started_ms=started_ms,
                run_id=run_id,
            ),
        ),
        "partition_state": state_table(views, previous_lb, decision.m, previous_start),
        "l1_files": l1_sweep.check_table(sweeps),
        "table_files": table_files_table(heads.heads, views, store.key_of),
        "l1_dropped": dropped_table(dropped),
        "table_partitions": table_partitions_table(heads.heads, views),
    }
    return Prepared(
        run_id,
        started_ms,
        history,
        last,
        hw_before,
        c,
        views,
        decision,
        summary_used,
        sweeps,
        watermarks,
        new_marks,
        frames,
        skipped,
        full,
        last_full,
        alert=alert,
        statuses=statuses,
        tail=tail,
        names=gathered.names,
        table_heads=heads,
        pack_states=gathered.states,
        pack_crcs=gathered.last_crcs,
        pack_full_seq=pack_full_seq,
        pack_summary_seq=summary_seq,
        partitions_read=gathered.read_from_logs,
    )


def _spare_what_tables_name(
    store: ObjectStore,
    sweeps: list[l1_sweep.SweepResult],
    views: dict[tuple[str, int], PartitionView],
    tables: TableHook | None,
) -> None:
    """R11 (b): a retired L1 file goes only if no retained snapshot of its topic's table
    names it. The hook fences publishes first (a publish that read the states before the
    compaction cannot commit after it), then lists what every retained snapshot names.
    Without the hook, a topic that may have a table (anything under its ``tables/``
    space) keeps its retired files: nothing here can tell what its snapshots name."""
    by_topic: dict[tuple[str, str | None], list[l1_sweep.SweepResult]] = {}
    for s in sweeps:
        if s.retired:
            v = views[(s.topic, s.partition)]
            by_topic.setdefault((s.topic, v.topic_id), []).append(s)
    for (topic, topic_id), results in by_topic.items():
        v = views[(results[0].topic, results[0].partition)]
        named: frozenset[str] | None
        if tables is not None:
            named = tables.fenced_refs(topic, topic_id, frozenset(o.key for s in results for o in s.retired))
        elif next(iter(store.list(f"{layout.TABLES_ROOT}{layout.space(topic, v.key_id)}/")), None) is not None:
            named = None
        else:
            named = frozenset()
        for s in results:
            keep = [o for o in s.retired if named is None or o.key in named]
            if keep:
                kept = {o.key for o in keep}
                s.retired = [o for o in s.retired if o.key not in kept]
                s.dropped = [d for d in s.dropped if d.key not in kept]
                s.retired_kept += len(keep)
                s.swept_log_end = min(s.swept_log_end, views[(s.topic, s.partition)].l1_changed_log_offset)


def _hold_what_nothing_allows(
    sweeps: list[l1_sweep.SweepResult],
    views: dict[tuple[str, int], PartitionView],
    retention: dict[str, tuple[int | None, int | None]],
    now_ms: int,
) -> list[tuple[PartitionView, l1_sweep.Dropped, bool, str, bool]]:
    """R11: a dropped L1 file goes only if something allows it now (see
    :func:`tables.authorize_drop`). One that nothing allows is kept, with a warning, and
    only it: a trim that looks wrong (or a retention an operator loosened since) holds
    back its own files, not every other partition's garbage. The gate still checks that
    nothing this run deletes lacks an authorization."""
    rows = []
    for s in sweeps:
        v = views[(s.topic, s.partition)]
        held, judged = set(), []
        for d in s.dropped:
            ok, why = authorize_drop(v, d, retention.get(v.topic, (None, None)), now_ms)
            if not ok:
                held.add(d.key)
                log.warning(
                    "%s/%d: L1 file %s kept: its trim is not allowed now (%s)", v.topic, v.partition, d.key, why
                )
            judged.append((d, ok, why))
        if held:
            s.retired = [o for o in s.retired if o.key not in held]
            s.dropped = [d for d in s.dropped if d.key not in held]
            s.retired_kept += len(held)
            s.dropped_held += len(held)
            s.swept_log_end = min(s.swept_log_end, v.l1_changed_log_offset)
        deleting = {o.key for o in s.retired}
        rows += [(v, d, ok, why, d.key in deleting) for d, ok, why in judged]
    return rows


def check(p: Prepared, gate: Gate) -> tuple[GateResult, list[str]]:
    """Run the gate, plus the plain-Python backstop; return the result and all failures."""
    result = gate(p.frames)
    failures = list(result.failures)
    m, hw = p.decision.m, p.m_high_water_before
    if result.success and m is not None and hw is not None and m < hw:
        failures.append(f"backstop: candidate M={m} is below the highest recorded M={hw}")
    for row in p.frames["l1_files"].to_pylist():  # I2: the L1 copy reads before its L0 sources go
        if row.get("checksums_ok") is False:
            failures.append(
                f"backstop: L1 file {row['key']} is missing or fails its checks "
                "(CRC32C as committed, page checksums, schema)"
            )
    for row in p.frames["table_partitions"].to_pylist():  # the table follows its log, never leads it
        rec = row["reconciled_through"]
        if rec is not None and row["published_through"] > rec:
            failures.append(
                f"backstop: table {row['table']} publishes partition {row['partition']} through offset "
                f"{row['published_through']}, its state log has reconciled only through {rec}"
            )
    for row in p.frames["table_files"].to_pylist():
        if row["committed"] is False:
            failures.append(
                f"backstop: table {row['table']} partition {row['partition']}: file {row['path']} is not a committed "
                f"L1 file of the topic's live incarnation (offsets {row['first_offset']}-{row['last_offset']})"
            )
        if row["first_offset"] != row["expected_first_offset"]:
            failures.append(
                f"backstop: table {row['table']} partition {row['partition']}: file {row['path']} starts at "
                f"offset {row['first_offset']}, expected {row['expected_first_offset']} (a gap or an overlap)"
            )
    for row in p.frames["partition_state"].to_pylist():  # R11: start offsets only grow
        if row["previous_start_offset"] is not None and row["start_offset"] < row["previous_start_offset"]:
            failures.append(
                f"backstop: {row['topic']}/{row['partition']}: start offset {row['start_offset']} is below the "
                f"{row['previous_start_offset']} the last passing GC saw (start offsets only grow)"
            )
    for row in p.frames["l1_dropped"].to_pylist():  # R11: retention drops only what it may
        if row["deleting"] and not row["authorized"]:
            failures.append(
                f"backstop: L1 file {row['key']} would be deleted though nothing allows its trim ({row['why']})"
            )
    if m is not None:  # I1, independently of the lower bounds that gave M
        low = [v for v in p.views if v.min_pending_epoch is not None and v.min_pending_epoch <= m]
        for v in low[:10]:
            failures.append(
                f"backstop: {v.topic}/{v.partition} has a pending placeholder at epoch "
                f"{v.min_pending_epoch} <= M={m} (I1: its L0 object must not be deleted)"
            )
    if m is None and not failures:
        failures.append("M is null: " + "; ".join(r for h in p.decision.held_by for r in h.reasons)[:300])
    return result, failures


def run_gate(
    store: ObjectStore, gate: Gate, config: GcSettings = GcSettings(), **kw: Any
) -> tuple[GateResult, list[str], Prepared]:
    """The checkpoint alone (``ctp validate``): nothing is listed for deletion, deleted
    or recorded."""
    p = prepare(store, config, **kw)
    result, failures = check(p, gate)
    return result, failures, p
