"""The reconciler's idle partitions (R6): an idle, caught-up partition whose lower bound
trails C by ``idle_lag`` is advanced by one ``tick`` entry -- a claim, an advance and a
release in one object write, no snapshot -- instead of the claim path; a partition the
run claimed and caught up is advanced after its commit (:func:`advance_due`). Split from
:mod:`ctp_state.reconcile`, whose run calls :func:`tick` for each partition
:func:`tick_due` picks (docs/design.md section 14: what an idle partition costs, and why
the tick lists after its create).
"""

from __future__ import annotations

from ctp_state import state as sm
from ctp_state.entries import Tick
from ctp_state.errors import CtpError
from ctp_state.log_reader import NotVouched
from ctp_state.partition_log import PartitionLog
from ctp_state.reconcile_report import Reports, verdict_status
from ctp_state.settings import ReconcileSettings
from ctp_state.storage import ObjectStore
from ctp_state.tick_schedule import idle_due


class _NoLongerIdle(Exception):
    """The partition changed before its tick landed: nothing is written."""


def needs_work(s: sm.PartitionState, cluster_epoch: int, config: ReconcileSettings) -> bool:
    """A partition is worth claiming if it has pending placeholders, or if it is idle
    and its lower bound trails C by ``idle_lag`` or more (R6); or worth a tick
    (:func:`tick_due`: at its phase, earlier)."""
    if not s.initialized:
        return False
    if s.pending or cluster_epoch - s.min_epoch_lower_bound >= config.idle_lag:  # type: ignore[operator]
        return True
    return tick_due(s, cluster_epoch, config)


def tick_due(s: sm.PartitionState, c: int, config: ReconcileSettings) -> bool:
    """R6 by a ``tick``: idle, caught up, behind C, no claim held on it (a partition with
    holders, live or lapsed, takes the claim path), and due: trailing C by ``idle_lag``,
    or at its phase (:mod:`ctp_state.tick_schedule`; not with ``tick_together``)."""
    if not s.initialized or s.holders or s.pending or c < s.max_applied_epoch:  # type: ignore[operator]
        return False
    spread = not config.tick_together
    return idle_due(s.topic, s.partition, s.min_epoch_lower_bound, c, config.idle_lag, spread=spread)  # type: ignore[arg-type]


def tick(
    store: ObjectStore,
    c: int,
    config: ReconcileSettings,
    owner: str,
    s: sm.PartitionState,
    reports: Reports,
    *,
    from_pack: bool = False,
) -> bool:
    """One idle partition's advance in one entry (:class:`~ctp_state.entries.Tick`): a
    claim, an advance and a release in one object write, and no snapshot after it (the
    tail grew by one entry; the next reader that finds it long enough leaves one). If
    the log moved since the run read it (a producer's placeholder, a claim), the entry is
    rebuilt from the fresh state, or not written at all once the partition is no
    longer idle and free: the next run sees it.

    Its one page of a listing is taken *after* the create, not before it as other
    writes do (the same one request): a listing before is a check with a window, and a
    hole that forms in it (the store losing an entry in the middle, keeping the ones
    after it) takes the tick -- which the GC folds from its pack without reading the key
    after it, so M could pass the placeholder kept behind the hole. After the create,
    anything past the tick is seen: a producer's placeholder written right after it is
    read into the state the run reports (so the GC reads the log), a placeholder kept
    behind a hole the tick filled stops the read (``LogForked``), a gap is a ``LogGap``;
    either is reported, and the GC reads that log. (docs/design.md section 14.)

    ``from_pack``: ``s`` is the GC's pack state of a quiet partition, not read this run
    (:mod:`ctp_state.reconcile_quiet`): first the log must vouch for it (one GET of
    the entry it ends at, its bytes), and the create is the only look at what is after
    it. Returns True when the partition must be read after all: the log does not vouch
    for the state, or something landed after it (a producer's placeholder: work)."""
    tp = (s.topic, s.partition)
    log = PartitionLog(store, s.topic, s.partition, topic_id=s.topic_id, probe=True, list_before_create=False)
    if from_pack:
        try:
            log.vouch(s)
        except NotVouched:
            return True
        except CtpError as e:
            reports.set(tp, status="error", reason=f"tick failed: {e}")
            return False

    def make(fresh: sm.PartitionState) -> Tick:
        if not tick_due(fresh, c, config):
            raise _NoLongerIdle
        return Tick(c, fresh.writer_epoch + 1, owner)

    try:
        appended = log.append(s, make)
    except _NoLongerIdle:
        return from_pack  # (read this run, it waits for the next one)
    except CtpError as e:
        reports.set(tp, status="error", reason=f"tick failed: {e}")
        return False
    out = appended.outcome
    if out.rejected is not None:
        reports.set(tp, status=verdict_status(out.rejected), reason=str(out.rejected))
        return False
    try:
        # what is past the tick: one listing from it, each entry there read (a key the
        # listing skipped while the log grew is read by itself; only an absent one is a
        # gap), folded from the tick's own bytes (a placeholder naming another is forked)
        listing = PartitionLog(store, s.topic, s.partition, topic_id=s.topic_id, write_snapshots=False)
        state = listing.catch_up(out.state, vouched=True)
    except CtpError as e:
        reports.set(tp, status="error", reason=f"after its tick at log offset {appended.offset}: {e}")
        return False
    reports.set(tp, status="advanced")
    reports.observe(state)
    return False


def advance_due(s: sm.PartitionState, c: int, config: ReconcileSettings) -> bool:
    """R6 after a commit: ``s`` is caught up and its lower bound trails C by ``idle_lag``
    or more. Not at its phase, as a tick is: a claimed partition's advance is an entry of
    its own (the commit would release the claim), a written partition's bound moves with
    its writes, and an idle one's next tick finds it at its phase."""
    assert s.min_epoch_lower_bound is not None and s.max_applied_epoch is not None  # claimed: initialized
    return not s.pending and c - s.min_epoch_lower_bound >= config.idle_lag and c >= s.max_applied_epoch
