"""A reconcile run's per-partition reports and the summary it appends.

Each partition's :class:`~ctp_state.records.PartitionReport` is replaced as the run
works on it (:class:`Reports`); :func:`summarize` totals them into the run's
:class:`~ctp_state.records.ReconcileSummary`. Bookkeeping only: what the run does is
in :mod:`ctp_state.reconcile`.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from ctp_state import state as sm
from ctp_state.records import PartitionReport, ReconcileSummary
from ctp_state.settings import ReconcileSettings
from ctp_state.status import facts


class Reports:
    """Each partition's :class:`~ctp_state.records.PartitionReport` as the run works on
    it: a frozen record, replaced on every change (one partition per thread)."""

    def __init__(self) -> None:
        self._by: dict[tuple[str, int], PartitionReport] = {}

    def start(self, topic: str, partition: int, **fields: Any) -> None:
        self._by[(topic, partition)] = PartitionReport(topic=topic, partition=partition, **fields)

    def __getitem__(self, tp: tuple[str, int]) -> PartitionReport:
        return self._by[tp]

    def set(self, tp: tuple[str, int], **changes: Any) -> None:
        self._by[tp] = msgspec.structs.replace(self._by[tp], **changes)

    def observe(self, s: sm.PartitionState) -> None:
        """The partition's state after what this run did to it."""
        self.set(
            (s.topic, s.partition),
            m_after=s.m,
            lag_entries_left=s.lag_entries,
            lag_bytes_left=s.lag_bytes,
            state=facts(s),
        )

    def all(self) -> tuple[PartitionReport, ...]:
        return tuple(r for _, r in sorted(self._by.items()))


def verdict_status(e: Exception) -> str:
    return "fenced" if getattr(e, "code", "") in ("writer_fenced", "unknown_writer_epoch") else "error"


def summarize(run_id: str, started_ms: int, c: int, config: ReconcileSettings, reports: Reports) -> ReconcileSummary:
    parts = reports.all()

    def count(status: str) -> int:
        return sum(1 for p in parts if p.status == status)

    finished_ms = int(time.time() * 1000)
    return ReconcileSummary(
        run_id=run_id,
        started_ms=started_ms,
        finished_ms=finished_ms,
        seconds=round((finished_ms - started_ms) / 1000, 3),
        cluster_epoch=c,
        idle_lag=config.idle_lag,
        ticks_spread=not config.tick_together,
        partitions_reconciled=count("reconciled"),
        partitions_advanced=count("advanced"),
        partitions_quarantined=count("quarantined"),
        partitions_claim_held=count("claim_held"),
        partitions_fenced=count("fenced"),
        partitions_failed=count("error"),
        records=sum(p.records for p in parts),
        l0_bytes=sum(p.l0_bytes for p in parts),
        l1_bytes=sum(p.l1_bytes for p in parts),
        l1_files=sum(len(p.l1_files) for p in parts),
        lag_entries_left=sum(p.lag_entries_left for p in parts),
        lag_bytes_left=sum(p.lag_bytes_left for p in parts),
        ok=not any(p.failed for p in parts),
        partitions=parts,
    )
