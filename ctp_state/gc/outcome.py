"""What a GC run's history record is built from, typed: the facts every record of a
run states (:class:`RunFacts`) and what the run found and did as it went
(:class:`Outcome`). Each key is a :class:`~ctp_state.records.GcRecord` field, so mypy
checks ``GcRecord(**facts, **outcome)``; the L0 counters come from
:class:`~ctp_state.gc.delete.GcCounters`' own fields (:func:`counts`)."""

from __future__ import annotations

from dataclasses import fields
from typing import TypedDict, cast

from ctp_state.gc.delete import GcCounters
from ctp_state.records import GateInfo, GcAlert, HeldBy, HistorySkip, Scalar


def counts(c: GcCounters) -> Outcome:
    """The run's L0 counters as :class:`GcRecord` fields: each counter of
    :class:`GcCounters` under its own name (defined once, there), the delete limit
    rounded, and at most 20 of the failed keys."""
    out = {f.name: getattr(c, f.name) for f in fields(c) if f.name not in ("lowest_limit", "failed_keys")}
    out["lowest_delete_limit"] = round(c.lowest_limit, 2)
    out["failed_keys"] = dict(list(c.failed_keys.items())[:20])
    # (built from GcCounters' own fields, so a counter is named once; Outcome lists them
    # for the type checker, and tests/gc/test_record_pieces.py holds the three together)
    return cast(Outcome, out)


class RunFacts(TypedDict):
    """What every record of a run says, whatever its outcome."""

    run_id: str
    started_ms: int
    dry_run: bool
    cluster_epoch: int | None
    m: int | None
    m_high_water_before: int | None
    partitions: int
    summary_run_id: str | None
    m_digest: str | None
    history_skipped: tuple[HistorySkip, ...]
    held_by: tuple[HeldBy, ...]
    held_by_count: int
    alert: GcAlert | None
    config: dict[str, Scalar]


class Outcome(TypedDict, total=False):
    """What a run found and did, gathered as it goes: the gate, the L0 counters, the
    delete plan, the L1 sweep, removals and table maintenance (each a GcRecord field)."""

    gate: GateInfo
    error: str
    listed: int
    deleted: int
    deleted_bytes: int
    skipped_above_m: int
    skipped_too_young: int
    list_errors: int
    delete_errors: int
    delete_retries: int
    list_retries: int
    throttled: int
    lowest_delete_limit: float
    min_epoch_seen: int | None
    max_epoch_seen: int | None
    failed_keys: dict[str, str]
    would_delete: int
    would_delete_bytes: int
    skipped_max_deletes: int
    delete_epochs: tuple[int, int] | None
    delete_sample: tuple[str, ...]
    l1_listed: int
    l1_new_files_checked: int
    l1_orphans: int
    l1_orphan_bytes: int
    l1_young_skipped: int
    l1_partitions_unchanged: int
    l1_full_sweep: bool
    l1_full_sweep_ms: int | None
    l1_orphans_deleted: int
    l1_orphan_bytes_deleted: int
    l1_delete_errors: int
    l1_retired: int
    l1_retired_bytes: int
    l1_retired_kept: int
    l1_dropped_held: int
    l1_retired_deleted: int
    l1_retired_bytes_deleted: int
    tmp_deleted: int
    gc_orphans_deleted: int
    topic_incarnations_removed: int
    topic_incarnations_waiting: int
    topic_objects_deleted: int
    topic_removal_errors: tuple[str, ...]
    table_snapshots_expired: int
    table_files_deleted: int
    table_errors: tuple[str, ...]
