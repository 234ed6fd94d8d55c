"""The safe epoch M (R4, R7) and who holds it back.

M = min(C - 1, min over partitions of M(p)), with C read before any partition. A
partition created after C was read starts at an epoch >= C, so it cannot hold data
this M deletes; stale inputs only make M smaller. A partition whose ``init`` entry is
missing (a topic creation still running, or crashed) blocks collection entirely:
its first epoch is not known yet.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ctp_state import state as sm
from ctp_state.tick_schedule import due_epoch


@dataclass(frozen=True, slots=True)
class Holdback:
    """One reason M is not higher: a partition (or the cluster epoch) at M."""

    topic: str | None  # None: the cluster epoch itself (M = C - 1)
    partition: int | None
    m: int | None
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class MDecision:
    cluster_epoch: int
    m: int | None  # None: nothing may be collected this run
    held_by: tuple[Holdback, ...]
    partitions: int


def compute_m(
    cluster_epoch: int,
    states: Sequence[sm.PartitionState],
    *,
    now_ms: int,
    quarantined: Mapping[tuple[str, int], tuple[str | None, str]] | None = None,
    idle_lag: int = 0,
    ticks_spread: bool = False,
) -> MDecision:
    """R4 over states read *after* ``cluster_epoch``; R7 reasons for the partitions at M.

    ``quarantined`` maps (topic, partition) to (L0 key, reason), ``idle_lag`` is the
    reconciler's (0: unknown) and ``ticks_spread`` whether it ticks idle partitions at
    their phase, all from the newest reconcile summary. Pure.
    """
    quarantined = quarantined or {}
    missing = [s for s in states if not s.initialized]
    if missing:
        unfinished = tuple(
            Holdback(
                s.topic,
                s.partition,
                None,
                (
                    "partition has no init entry: topic creation is unfinished "
                    "(run `ctp topic create` again); collection waits",
                ),
            )
            for s in missing
        )
        return MDecision(cluster_epoch, None, unfinished, len(states))
    m = min([cluster_epoch - 1] + [s.m for s in states])  # type: ignore[type-var]
    held: list[Holdback] = []
    if cluster_epoch - 1 == m:
        held.append(Holdback(None, None, m, (f"cluster epoch C={cluster_epoch}: M < C always",)))
    for s in states:
        # At M = C - 1 the cluster epoch is what holds M; a partition there is not behind.
        if s.m != m or m == cluster_epoch - 1:
            continue
        reasons: list[str] = []
        if (s.topic, s.partition) in quarantined:
            key, why = quarantined[(s.topic, s.partition)]
            reasons.append(f"quarantined: {why}" + (f" (L0 key {key})" if key else ""))
        if s.lag_entries:
            reasons.append(
                f"reconciler lag: {s.lag_entries} placeholders, {s.lag_records} records, {s.lag_bytes} bytes"
            )
        for h in s.holders:
            if h.lease_until_ms <= now_ms:
                reasons.append(f"stuck claim: {h.owner} ({h.mode.value}) lease ran out at {_iso(h.lease_until_ms)}")
            else:
                reasons.append(f"claim held by {h.owner} ({h.mode.value}) until {_iso(h.lease_until_ms)}")
        if not reasons:
            reasons.append(_idle_reason(s, cluster_epoch, idle_lag, ticks_spread))
        held.append(Holdback(s.topic, s.partition, m, tuple(reasons)))
    return MDecision(cluster_epoch, m, tuple(held), len(states))


def _idle_reason(s: sm.PartitionState, cluster_epoch: int, idle_lag: int, spread: bool) -> str:
    """When the reconciler advances an idle partition at M (R6): from the epoch
    :func:`~ctp_state.tick_schedule.due_epoch` names (``bound + idle_lag`` at the
    latest), as the newest reconcile summary's settings say."""
    return f"idle: lower bound {s.min_epoch_lower_bound} not advanced yet ({_when_advanced(s, cluster_epoch, idle_lag, spread)})"


def _when_advanced(s: sm.PartitionState, cluster_epoch: int, idle_lag: int, spread: bool) -> str:
    """When the reconciler advances the idle partition ``s``, in words (``idle_lag`` 0:
    not known)."""
    bound = s.min_epoch_lower_bound
    if not idle_lag or bound is None:
        return "a reconcile advances it once it trails C by its idle_lag, R6"
    due = due_epoch(s.topic, s.partition, bound, idle_lag, spread=spread)
    how = f"idle_lag {idle_lag}{', at its phase' if spread and due < bound + idle_lag else ''}, R6"
    if cluster_epoch >= due:
        return f"the next reconcile advances it: {how}"
    return f"a reconcile advances it once C reaches {due}: {how}"


#: A partition's status in the operator's view, worst first (the report orders by it).
PARTITION_STATUSES = ("quarantined", "claim held", "lagging", "idle", "caught up")


@dataclass(frozen=True, slots=True)
class PartitionStatus:
    status: str  # one of PARTITION_STATUSES
    detail: str | None  # the quarantined L0 key, the claim's owner and lease end, what is idle

    @property
    def rank(self) -> int:
        return PARTITION_STATUSES.index(self.status)


def partition_status(
    s: sm.PartitionState,
    cluster_epoch: int,
    *,
    now_ms: int,
    quarantined: Mapping[tuple[str, int], tuple[str | None, str]] | None = None,
    idle_lag: int = 0,
    ticks_spread: bool = False,
) -> PartitionStatus:
    """What an operator should know first about one partition. Pure.

    ``quarantined`` (a reconciler stopped at a corrupt L0 chunk) comes before a held
    claim (a stuck claim stops the reconciler), then reconciler lag; a partition with
    no lag is ``idle`` while its M(p) trails ``C - 1`` (a reconcile advances it once its
    lower bound trails C by ``idle_lag``, R6) and ``caught up`` once it does not hold M below ``C - 1``.
    An idle partition's detail names the epoch it is advanced at, from the newest
    reconcile's ``idle_lag`` and ``ticks_spread`` (as the GC's holdback reason does).
    """
    q = (quarantined or {}).get((s.topic, s.partition))
    if q is not None:
        key, why = q
        return PartitionStatus("quarantined", f"L0 key {key}: {why}" if key else why)
    if s.holders:
        h = max(s.holders, key=lambda h: h.lease_until_ms)
        when = _iso(h.lease_until_ms)
        lapsed = h.lease_until_ms <= now_ms
        return PartitionStatus(
            "claim held", f"{h.owner} ({h.mode.value}), lease {'ran out at' if lapsed else 'until'} {when}"
        )
    if s.lag_entries:
        return PartitionStatus(
            "lagging", f"{s.lag_entries} placeholders, {s.lag_records} records, {s.lag_bytes} bytes not in L1"
        )
    if s.m is None or s.m < cluster_epoch - 1:
        return PartitionStatus(
            "idle", f"M(p)={s.m} < C-1={cluster_epoch - 1}: {_when_advanced(s, cluster_epoch, idle_lag, ticks_spread)}"
        )
    return PartitionStatus("caught up", None)


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
