"""The reconciler's logic: plan, build L1 files, commit (R3, R5, R6, I2, I5).

A run:

1. reads the cluster epoch C, then the selected partitions' states (from the newest
   GC's state pack where the log vouches for it, else from its snapshot; then the tail
   by GETs of the next key) -- with a pack, only the partitions it does not hold as
   quiet or that an L0 object in the store names; a quiet one whose advance is due is
   ticked from the pack's state, the others are not read
   (:mod:`ctp_state.reconcile_quiet`);
2. ticks each partition that is idle, caught up, free of claims and has a lower bound
   ``idle_lag`` or more epochs behind C (R5 + R6 in one ``tick`` entry: one object
   write, no snapshot), and claims (R5, exclusive) each other partition that has
   unreconciled placeholders or such a lower bound;
3. plans each claimed partition's pending chunks into L1 files of about
   ``target_file_bytes`` (pure: :func:`plan_files`);
4. builds the files through ``map_files`` (Spark tasks in ``spark_apps/reconcile.py``,
   threads in tests): ranged GETs of exactly the chunks, CRC32C checks, Parquet out;
5. commits per partition one ``reconcile`` entry (through-offset, L1 keys, the new
   lower bound computed from the state at commit time), then an ``advance`` entry if
   the partition is caught up and behind C (R6); the last of them also releases the
   claim (a separate ``release`` entry only when neither could), and leaves a snapshot;
6. appends a run summary to the store (``runs/reconcile/<seq>.json``, a dense sequence:
   which summary is newest is decided by the store, not by this machine's clock) and
   returns it.

Crash safety: L1 keys are deterministic, so a rerun rewrites the same files; readers
follow only committed keys, so a file written before a crash and never committed is an
orphan for the GC, never a duplicate. A partition whose chunk is corrupt or missing is
quarantined: nothing is committed for it and its M(p) stays where it was.

One run, its steps in the order above, so the order the crash-safety argument rests on
(build before commit, commit before release) reads from top to bottom; an idle
partition's tick (step 2) lives in :mod:`ctp_state.reconcile_tick`, the Spark side of
step 4 in :mod:`ctp_state.spark`, the run's reports and summary in
:mod:`ctp_state.reconcile_report`, its thread pool in :mod:`ctp_state.parallel`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from ctp_state import crashpoints, layout, state as sm
from ctp_state.entries import AccessMode, Advance, Reconcile
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import ClaimHeld, CorruptData, CtpError, ObjectNotFound, OutcomeUnknown, Rejected
from ctp_state.gc.history import PackStates, newest_pack
from ctp_state.l1 import L1Build, L1File, build_file
from ctp_state.parallel import collector_paused, pmap, write_threads
from ctp_state.partition_log import PartitionLog
from ctp_state.reconcile_quiet import plan_reads
from ctp_state.reconcile_report import Reports, summarize, verdict_status
from ctp_state.reconcile_tick import advance_due, needs_work, tick, tick_due
from ctp_state.records import ReconcileSummary
from ctp_state.settings import ReconcileSettings
from ctp_state.status import reconcile_summaries, select_topics, try_read_partition_states
from ctp_state.storage import ObjectStore
from ctp_state.topics import Topic

logger = logging.getLogger(__name__)


#: The run-start read snapshots a partition whose tail (entries after its snapshot) is
#: this long or longer, as any reader snapshots a tail of ``snapshot_every``: the
#: read-back before the run's own snapshot (``_snapshot``) then decodes the run's own
#: entries, not the tail again. A snapshot costs one object write; a shorter tail costs
#: less to read twice. (64 partitions with 18-entry tails after a 1 GiB build: the phase
#: after the build went from 0.24-0.27 s to 0.10-0.11 s, the start read from 0.07 s to
#: 0.11-0.13 s.)
START_SNAPSHOT_TAIL = 8
#: ... and an idle partition's (no placeholder pending) whose tail is this long: a tail of
#: ticks, one every ``idle_lag`` epochs, that every later read (the reconcile's, the
#: GC's, twice an epoch) would GET entry by entry. At 2 a snapshot (one PUT, every other
#: tick) saves about six GETs per idle partition per epoch against 8 (at the price list
#: of benchmarks/bench_requests.py, a PUT costs 12.5 GETs).
IDLE_SNAPSHOT_TAIL = 2


def plan_files(s: sm.PartitionState, target_file_bytes: int, max_bytes: int | None = None) -> list[L1File]:
    """Group the pending chunks, in order, into files of about ``target_file_bytes``.

    Greedy from the first pending chunk, so a rerun from the same state plans the same
    files (and so the same keys). A chunk is never split; ``max_bytes`` bounds the run.
    """
    files: list[L1File] = []
    group: list[sm.Pending] = []
    size = total = 0
    for p in s.pending:
        if max_bytes is not None and total + p.byte_length > max_bytes and (files or group):
            break
        group.append(p)
        size += p.byte_length
        total += p.byte_length
        if size >= target_file_bytes:
            files.append(L1File(s.topic, s.partition, tuple(group), s.topic_id))
            group, size = [], 0
    if group:
        files.append(L1File(s.topic, s.partition, tuple(group), s.topic_id))
    return files


# --- the run -------------------------------------------------------------------------------


def build_files_locally(
    store: ObjectStore, files: Sequence[L1File], *, threads: int = 4, compression: str = "zstd"
) -> list[L1Build]:
    """``map_files`` without Spark: threads in this process."""
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        return list(pool.map(lambda job: build_one(store, job[0], job[1], compression), enumerate(files)))


def build_one(
    store: ObjectStore, index: int, f: L1File, compression: str = "zstd", profile_dir: str | None = None
) -> L1Build:
    """Build one L1 file; a data error becomes a result, not an exception, so one bad
    partition does not fail the others. With ``profile_dir``, a cProfile of the build
    is written there."""
    try:
        if profile_dir:  # where does a worker's time go? (benchmarks/bench_reconcile.py --profile)
            import cProfile

            prof = cProfile.Profile()
            out = prof.runcall(build_file, store, f, compression=compression)
            prof.dump_stats(os.path.join(profile_dir, f"build-{os.getpid()}-{index}.prof"))
        else:
            out = build_file(store, f, compression=compression)
    except (CorruptData, ObjectNotFound) as e:
        bad = getattr(e, "key", None)  # the L0 object a chunk is read from, or the L1 file in the way
        return L1Build(key=f.key, error=str(e), l0_key=bad if bad and bad.startswith(layout.L0_ROOT) else None)
    crashpoints.reached("after_l1_write", index)
    return out


@collector_paused()
def run_reconcile(
    store: ObjectStore,
    *,
    topics: Sequence[str] | None = None,
    config: ReconcileSettings = ReconcileSettings(),
    map_files: Callable[[list[L1File]], list[L1Build]] | None = None,
    on_progress: Callable[[str, int, int], None] = lambda stage, done, total: None,
) -> ReconcileSummary:
    """Run one reconcile over ``topics`` (all when None) and return its summary."""
    started_ms = int(time.time() * 1000)
    run_id = f"{started_ms}-{uuid.uuid4().hex[:8]}"
    owner = f"reconciler:{run_id}"
    map_files = map_files or (lambda files: build_files_locally(store, files, compression=config.compression))

    c = ClusterEpoch(store).current()  # C first (R4/R6), then the partitions
    wanted: list[tuple[Topic | str, int]] = [(t, p) for t in select_topics(store, topics) for p in range(t.partitions)]
    # The newest GC's state pack, where there is one, instead of each partition's
    # snapshot: the GC ran after the last reconcile, so an idle partition's state there
    # is its log's end (a GET of that entry and of the next; docs/design.md 14).
    pack = newest_pack(store, reconcile_summaries(store).last()) if wanted else None
    # ... and of the partitions quiet there, only those an L0 object in the store names;
    # a quiet one whose advance is due is ticked from it (docs/design.md 14).
    plan = plan_reads(store, wanted, pack.states if pack else None, c, config)
    if plan.why_all is not None:
        logger.info("reading every partition: %s", plan.why_all)
    else:
        logger.info(
            "reading %d partitions; %d quiet ones ticked from the GC's pack, %d not read (nothing written to them)",
            len(plan.read),
            len(plan.tick),
            len(plan.skip),
        )
    reports = Reports()
    for s in plan.tick + plan.skip:  # (the pack's state; a tick reports what it did)
        reports.start(s.topic, s.partition, m_before=s.m)
        reports.observe(s)
    again = pmap(
        lambda s: tick(store, c, config, owner, s, reports, from_pack=True), plan.tick, write_threads(store, config)
    )
    redo = [(s.topic, s.partition) for s, read in zip(plan.tick, again) if read]
    todo = _read_and_tick(store, c, config, owner, plan.read, pack, reports)
    if redo:  # work landed after the pack's state (read from it), or the log does not vouch for it (not)
        by_name = {t.name if isinstance(t, Topic) else t: t for t, _ in wanted}
        todo += _read_and_tick(store, c, config, owner, [(by_name[t], p) for t, p in redo], pack, reports)

    # 2. claims
    mode = AccessMode.WAIT_FOR_EXCLUSIVE if config.claim_wait_s > 0 else AccessMode.EXCLUSIVE

    def claim(s: sm.PartitionState) -> tuple[PartitionLog, sm.PartitionState] | None:
        log = PartitionLog(store, s.topic, s.partition, topic_id=s.topic_id, probe=True)
        tp = (s.topic, s.partition)
        try:
            got = log.claim(s, owner, mode, lease_ms=config.lease_ms, wait_timeout_s=config.claim_wait_s)
        except ClaimHeld as e:
            reports.set(tp, status="claim_held", reason=str(e))
            return None
        except CtpError as e:  # one partition's store trouble must not stop the others
            reports.set(tp, status="error", reason=f"claim failed: {e}")
            if isinstance(e, OutcomeUnknown):
                log.release_held(owner)  # it may have landed: do not strand it
            return None
        if got.outcome.rejected is not None:
            reports.set(tp, status="claim_held", reason=str(got.outcome.rejected))
            return None
        return log, got.outcome.state

    claimed = [x for x in pmap(claim, todo, write_threads(store, config)) if x is not None]
    released: set[tuple[str, int]] = set()
    try:
        _build_and_commit(store, c, config, owner, claimed, reports, released, map_files, on_progress)
    finally:
        # Whatever failed (a Spark job, a crash of the build), release what was claimed
        # and not yet released, so other runs need not wait for the lease.
        for log, st in claimed:
            if (st.topic, st.partition) not in released:
                log.release_held(owner)

    summary = summarize(run_id, started_ms, c, config, reports)
    return reconcile_summaries(store).append(lambda seq: summary)


def _read_and_tick(
    store: ObjectStore,
    c: int,
    config: ReconcileSettings,
    owner: str,
    jobs: list[tuple[Topic | str, int]],
    pack: PackStates | None,
    reports: Reports,
) -> list[sm.PartitionState]:
    """Read ``jobs`` (from the pack's states where the log vouches for them, else their
    snapshots; the tails by GETs), report each, tick the idle ones that are due, and
    return the others that have work: the ones to claim."""
    got, unreadable = try_read_partition_states(
        store,
        jobs,
        threads=max(1, config.threads),
        snapshot_every=START_SNAPSHOT_TAIL,
        idle_snapshot_every=IDLE_SNAPSHOT_TAIL,
        probe=True,
        bases=pack.states if pack else None,
    )
    states = [s for s in got if s is not None]
    for s in states:
        reports.start(s.topic, s.partition, m_before=s.m)
        reports.observe(s)
        if not s.initialized:
            reports.set(
                (s.topic, s.partition), status="error", reason="partition has no init entry (finish `ctp topic create`)"
            )
    for t, p, why in unreadable:  # the others are reconciled; this one is reported
        reports.start(t, p, status="error", reason=f"state cannot be read: {why}")
    todo = [s for s in states if needs_work(s, c, config)]
    todo = _skip_still_lost(store, todo, reports)
    pmap(
        lambda s: tick(store, c, config, owner, s, reports),
        [s for s in todo if tick_due(s, c, config)],
        write_threads(store, config),
    )
    return [s for s in todo if not tick_due(s, c, config)]


def _skip_still_lost(store: ObjectStore, todo: list[sm.PartitionState], reports: Reports) -> list[sm.PartitionState]:
    """Partitions the newest run quarantined over a missing L0 object that is still
    missing (one HEAD each) are not claimed or read again: the run that quarantined one
    committed everything before the object's chunk, so nothing can move until an
    operator restores it. The report says so, and how."""
    try:
        newest = reconcile_summaries(store).newest()
    except CtpError as e:
        logger.warning("could not read the newest reconcile summary: %s", e)
        return todo
    lost = {
        (r.topic, r.partition): r.key
        for r in (newest.partitions if newest else ())
        if r.status == "quarantined" and r.key  # the L0 object it could not read (gone, or damaged)
    }
    out = []
    for s in todo:
        key = lost.get((s.topic, s.partition))
        first = next((p for p in s.pending if p.l0_key == key), None) if key else None
        try:
            back = first is None or store.head(key) is not None  # type: ignore[arg-type]
        except CtpError as e:  # cannot tell: let the build find out, as without the memory
            logger.warning("could not check the quarantined L0 object %s: %s", key, e)
            back = True
        if back or first is None:
            out.append(s)
            continue
        held = sum(p.record_count for p in s.pending if p.log_offset >= first.log_offset)
        reports.set(
            (s.topic, s.partition),
            status="quarantined",
            key=key,
            reason=(
                f"L0 object {key} is still missing (chunk at log offset {first.log_offset}): restore it from a "
                f"backup and the next reconcile goes on; {held} records from there on wait (nothing was re-read)"
            ),
        )
    return out


def _snapshot(store: ObjectStore, topic: str, partition: int, topic_id: str | None) -> None:
    """Leave a snapshot at the log end the run reached, so every reader after it (the
    GC's M over all partitions above all) replays no tail: an idle advance alone adds
    two entries (a claim, an advance that releases it) a run. The state is read back from the
    store, never taken from memory: a snapshot vouches only for entries whose stored
    bytes were decoded (an entry the store kept torn stops this read, and the GC, as it
    would without the snapshot). Best effort, as every snapshot (a cache of the log)."""
    try:
        PartitionLog(store, topic, partition, topic_id=topic_id, snapshot_every=1, probe=True).read_state()
    except (CtpError, OSError) as e:
        logger.warning("could not snapshot %s/%d after the run: %s", topic, partition, e)


def _build_and_commit(
    store: ObjectStore,
    c: int,
    config: ReconcileSettings,
    owner: str,
    claimed: list[tuple[PartitionLog, sm.PartitionState]],
    reports: Reports,
    released: set[tuple[str, int]],
    map_files: Callable[[list[L1File]], list[L1Build]],
    on_progress: Callable[[str, int, int], None],
) -> None:
    crashpoints.reached("after_claim")

    # 3-4. plan and build
    plans = {
        (st.topic, st.partition): plan_files(st, config.target_file_bytes, config.max_bytes_per_partition)
        for _, st in claimed
    }
    files = [f for fs in plans.values() for f in fs]
    on_progress("build", 0, len(files))
    results = map_files(files) if files else []
    by_key = {res.key: res for res in results}
    on_progress("build", len(files), len(files))
    crashpoints.reached("before_commit")

    # 5. commit
    done = [0]
    done_lock = threading.Lock()

    def commit(job: tuple[int, tuple[PartitionLog, sm.PartitionState]]) -> None:
        index, (log, st) = job
        tp = (st.topic, st.partition)
        fs = plans[tp]
        writer_epoch = st.writer_epoch
        # The claim is given up in the partition's last entry of the run (its reconcile,
        # or its advance), not in an entry of its own: one object write per partition
        # less. Whatever that entry does not release (it was rejected, or never written),
        # the separate release in ``finally`` does.
        released_by_entry = False
        try:
            # Files before the first that failed (a lost or damaged L0 chunk) are committed;
            # the rest waits, so a later run starts at the bad chunk instead of reading the
            # whole backlog again, and the partition is reported quarantined.
            first_bad = next((i for i, f in enumerate(fs) if by_key[f.key].error is not None), None)
            bad = None if first_bad is None else by_key[fs[first_bad].key]
            fs = fs if first_bad is None else fs[:first_bad]
            if bad is not None and not fs:
                reports.set(tp, status="quarantined", reason=bad.error, key=bad.l0_key)
                return
            if fs:
                through = fs[-1].chunks[-1].log_offset
                last = fs[-1].last_offset
                keys = tuple(f.key for f in fs)
                crcs = tuple(by_key[f.key].l1_crc32c for f in fs)

                def entry(fresh: sm.PartitionState, release: str | None = None) -> Reconcile:
                    bound = sm.allowed_lower_bound(fresh, through)
                    return Reconcile(through, last, keys, bound, writer_epoch, crcs, release)

                # Release here unless an advance should follow (as far as the state at
                # the claim tells: if a producer wrote since, the advance is refused and
                # the separate release runs, or it is left for the next run).
                then = sm.apply(st, st.applied_offset + 1, entry(st))
                release = (
                    None if bad is None and then.rejected is None and advance_due(then.state, c, config) else owner
                )
                out = log.append(st, lambda fresh: entry(fresh, release)).outcome
                if out.rejected is not None:
                    reports.set(tp, status=verdict_status(out.rejected), reason=str(out.rejected))
                    return
                st = out.state
                released_by_entry = release is not None
                reports.set(
                    tp,
                    status="reconciled",
                    records=sum(f.records for f in fs),
                    l0_bytes=sum(f.l0_bytes for f in fs),
                    l1_bytes=sum(by_key[f.key].l1_bytes for f in fs),
                    l1_files=keys,
                )
                crashpoints.reached("after_commit", index)
                if bad is not None:
                    reports.set(tp, status="quarantined", reason=bad.error, key=bad.l0_key)
                    return
            if not released_by_entry and advance_due(st, c, config):
                out = log.append(st, lambda _s: Advance(c, writer_epoch, owner)).outcome
                if out.rejected is None:
                    st = out.state
                    released_by_entry = True
                    if reports[tp].status == "idle":
                        reports.set(tp, status="advanced")
                # A rejected advance means a producer wrote meanwhile: next run.
        except Rejected as e:
            reports.set(tp, status=verdict_status(e), reason=str(e))
        except CtpError as e:
            reports.set(tp, status="error", reason=str(e))
        finally:
            try:
                if not released_by_entry:
                    st = log.release(st, owner, writer_epoch).outcome.state
                released.add((st.topic, st.partition))
            except CtpError:
                pass  # released by the run's own finally, or the lease runs out
            else:
                _snapshot(store, st.topic, st.partition, st.topic_id)
            reports.observe(st)
            with done_lock:
                done[0] += 1
                on_progress("commit", done[0], len(claimed))

    pmap(commit, list(enumerate(claimed)), write_threads(store, config))
