"""When M stops moving, say so: the stall alert (pure).

M should follow C: after every reconcile, caught-up partitions sit within the idle lag
of C (R6). When M stays put while C moves on, something holds it: a stuck or held
claim, a dead or overloaded reconciler, a quarantined chunk. The GC already records
*who* holds M back (R7); this module decides when that deserves a person:

- **quarantine** -- the newest reconcile summary quarantined a partition (a missing or
  corrupt L0 chunk): its M(p) cannot move until someone acts, so it alerts at once;
- **stall** -- M has been the same for ``stall_runs`` or more GC runs in a row that
  passed the gate (this one included), and C advanced by ``stall_epochs`` or more since
  the first of them. Runs that did not pass the gate neither break nor extend the
  streak; extra GC runs without an epoch advance do not hide a stall.

An idle partition's lower bound stays put between its ticks (R6: one every ``idle_lag``
epochs), so a cluster of idle partitions ticked in the same epoch has M flat for
``idle_lag`` runs while C moves ``idle_lag - 1``: healthy. The advance a stall needs is
therefore at least the reconciler's idle lag (its newest summary's), whatever
``stall_epochs`` says; at the default lag of 2 it changes nothing.

``stall_runs = 0`` turns the stall rule off. The alert names the partitions and their
reasons; it goes on the run's history record (so ``ctp gc --json``, ``ctp status`` and
the report show it) and fails the GC DAG's ``check_m`` task.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ctp_state.records import GcAlert, GcRecord, HeldBy

#: partitions named in an alert's message (all of them go in ``where``, up to this x 10)
NAMED = 5


def _name(topic: str | None, partition: int | None) -> str:
    return "cluster epoch" if topic is None else f"{topic}/{partition}"


def m_alert(
    *,
    m: int | None,
    cluster_epoch: int,
    held_by: Sequence[HeldBy],
    quarantined: Mapping[tuple[str, int], tuple[str | None, str]],
    previous: Sequence[GcRecord],
    stall_runs: int,
    stall_epochs: int,
    idle_lag: int = 0,
) -> GcAlert | None:
    """The alert for a run with this ``m`` and ``cluster_epoch``, or None.

    ``previous``: earlier history records, oldest first (any status; only those that
    passed the gate with an M count). ``quarantined``: (topic, partition) -> (L0 key,
    reason) from the newest reconcile summary. ``idle_lag``: that summary's (0: none).
    """
    if quarantined:
        items = sorted(quarantined.items())
        where = tuple(_name(t, p) for (t, p), _ in items)
        named = "; ".join(
            f"{_name(t, p)}: {why}" + (f" (L0 key {key})" if key else "") for (t, p), (key, why) in items[:NAMED]
        )
        more = f" and {len(items) - NAMED} more" if len(items) > NAMED else ""
        return GcAlert(
            kind="quarantine",
            message=f"{len(items)} partition(s) quarantined, M(p) frozen until fixed: {named}{more}",
            where=where[: NAMED * 10],
        )
    if stall_runs < 1 or m is None:
        return None
    # The streak: this run and the passing runs just before it with the same M.
    streak = [r for r in previous if r.passed and r.m is not None and r.cluster_epoch is not None]
    runs, first_c = 1, cluster_epoch
    for r in reversed(streak):
        if r.m != m:
            break
        runs, first_c = runs + 1, r.cluster_epoch  # type: ignore[assignment]
    if runs < stall_runs or cluster_epoch - first_c < max(stall_epochs, idle_lag):
        return None
    holders = [h for h in held_by if h.topic is not None] or list(held_by)
    named = "; ".join(f"{h.where}: {', '.join(h.reasons)}" for h in holders[:NAMED])
    more = f" and {len(holders) - NAMED} more" if len(holders) > NAMED else ""
    return GcAlert(
        kind="stall",
        message=(
            f"M stalled at {m} for {runs} GC runs while C advanced {first_c} -> {cluster_epoch}; held by {named}{more}"
        ),
        where=tuple(h.where for h in holders[: NAMED * 10]),
    )
