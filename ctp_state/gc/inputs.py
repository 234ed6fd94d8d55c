"""The GC's inputs: C, then every partition's state from its own log (R4), and the
newest reconcile summary for R7 annotations only."""

from __future__ import annotations

import bisect
import hashlib
import logging
from dataclasses import dataclass
from typing import Any

from ctp_state import layout
from ctp_state import state as sm
from ctp_state.entries import AccessMode
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import CtpError, StateUnreadable
from ctp_state.reconcile import state_fields, summaries
from ctp_state.status import select_topics, try_read_partition_states, unaccounted_logs
from ctp_state.storage import ObjectStore

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

    def l1_after(self, w: int) -> tuple[sm.L1Ref, ...]:
        """The committed L1 files whose records come after offset ``w``."""
        i = bisect.bisect_right(self.l1_ends, w)
        first = self.l1_ends[i - 1] + 1 if i else 0
        out = []
        for last, crc in zip(self.l1_ends[i:], self.l1_crcs[i:]):
            out.append(sm.L1Ref(layout.l1_key(self.topic, self.partition, first, last), first, last, crc))
            first = last + 1
        return tuple(out)

    @property
    def m(self) -> int | None:
        return None if self.min_epoch_lower_bound is None else self.min_epoch_lower_bound - 1

    @classmethod
    def of_state(cls, s: sm.PartitionState) -> PartitionView:
        f = state_fields(s)
        holders = tuple(sm.Holder(o, AccessMode(m), 0, int(lu)) for o, m, lu in f["holders"])
        return cls(s.topic, s.partition, "log", f["initialized"], f["min_epoch_lower_bound"],
                   f["previous_applied_epoch"], f["max_applied_epoch"], f["last_reconciled_offset"],
                   f["log_end_offset"], f["lag_entries"], f["lag_records"], f["lag_bytes"], holders,
                   f["min_pending_epoch"], s.l1_ends, s.l1_crcs)


def newest_summary(store: ObjectStore) -> dict[str, Any] | None:
    """The newest reconcile run summary by the store's sequence, for R7 annotations
    only; a summary that does not read is skipped (it cannot change M)."""
    try:
        return summaries(store).newest()
    except CtpError as e:
        log.warning("ignoring the newest reconcile summary: %s", e)
        return None


def gather(store: ObjectStore, *, threads: int = 32) -> tuple[int, list[PartitionView]]:
    """C first, then every partition's state from its log (R4). Raises
    :class:`StateUnreadable`, naming every partition that does not read, if any."""
    c = ClusterEpoch(store).current()
    topics = select_topics(store)
    wanted = [(t.name, p) for t in topics for p in range(t.partitions)]
    states, problems = try_read_partition_states(store, wanted, threads=threads)
    problems += unaccounted_logs(store, topics)
    if problems:
        raise StateUnreadable(problems)
    return c, [PartitionView.of_state(s) for s in states]  # type: ignore[arg-type]


def quarantined_of(summary: dict[str, Any] | None) -> dict[tuple[str, int], tuple[str | None, str]]:
    if not summary:
        return {}
    return {(p["topic"], p["partition"]): (p.get("key"), p.get("reason") or "quarantined")
            for p in summary.get("partitions", []) if p.get("status") == "quarantined"}


def m_digest(views: list[PartitionView]) -> str:
    h = hashlib.sha256()
    for v in sorted(views, key=lambda v: (v.topic, v.partition)):
        h.update(f"{v.topic}/{v.partition}:{v.m}\n".encode())
    return h.hexdigest()
