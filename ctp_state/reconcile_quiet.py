"""Which partitions a reconcile run reads (docs/design.md section 14, "quiet partitions").

The reconciler used to read every partition every run to find work: a GET of the entry
the GC's pack state ends at and a GET of the key after it, two GET-class requests per
idle partition per epoch. But a producer's placeholder points into an L0 object the
producer wrote *before* it appended the placeholder, and every L0 object's footer names
the partitions it holds chunks for. So one listing of the L0 root (a page per 1,000
objects, whatever the partitions) and a footer read per object say which partitions
may have been written to since the pack's state:

- a partition whose pack state has work (pending placeholders, a claim held), is not
  this incarnation's, or that an L0 object still in the store names, is **read** as
  before;
- a *quiet* one (none of that) whose advance is due (R6) is **ticked** from the pack's
  state: one GET of the entry that state ends at (its bytes, as every writer starting
  from a stored state checks), then the tick's create, which is the probe -- whatever
  landed at that offset since wins the race and the partition is read after all;
- any other quiet one is **not read**: its pack state stands, reported as idle.

Every object still in the store counts, whatever its epoch: a placeholder accepted
after a state carries an epoch at or above that state's lower bound (R3, R6), but a
store that lost the entry a pack's state ends at, and took a producer's placeholder in
its slot, holds one of a lower epoch -- which is exactly the placeholder the read must
find (the log then does not vouch for the pack's state, and the partition is read from
its snapshot). And the listing is only ever a way to find work sooner, never a reason
to raise M: the GC decides M from its own reads and checks of the pack (design.md 14),
and a partition the reconciler misses -- its L0 object lost, a footer forged -- is one
it reports nothing new of, as when a placeholder lands after its read; it is read at
the latest at its tick, whose create collides with whatever is at its log's end, and
whose GET before it finds an entry the store replaced. A listing or footer that does
not read (a stray key, a damaged object) makes the run read every partition, as before.

It pays where partitions are many and L0 objects few: at fewer than
``quiet_min`` (8) quiet partitions the listing (a PUT-class request, priced as 12.5
GETs) costs more than the reads it saves, and a run whose L0 holds more objects than
it has quiet partitions reads every partition instead of every footer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ctp_state import layout, state as sm, window
from ctp_state.errors import CorruptData, CtpError, ObjectNotFound
from ctp_state.l0 import FOOTER_READ, ChunkRef, footer_tail_length, parse_footer_tail
from ctp_state.parallel import pmap, read_threads
from ctp_state.reconcile_tick import needs_work, tick_due
from ctp_state.settings import ReconcileSettings
from ctp_state.status import Job
from ctp_state.storage import ObjectStore


@dataclass(frozen=True)
class ReadPlan:
    """What a run reads: ``read`` as before; ``tick`` (quiet and due) from the pack's
    state after a GET of its last entry; ``skip`` (quiet, not due) not at all."""

    read: list[Job]
    tick: list[sm.PartitionState] = field(default_factory=list)
    skip: list[sm.PartitionState] = field(default_factory=list)
    why_all: str | None = None  # why every partition is read (None: the plan above)


def plan_reads(
    store: ObjectStore,
    wanted: list[Job],
    pack: Mapping[tuple[str, int], tuple[sm.PartitionState, int | None]] | None,
    c: int,
    config: ReconcileSettings,
) -> ReadPlan:
    """Split ``wanted`` by the pack's states (each with its last entry's CRC32C) and what
    the L0 objects name (see the module's docstring)."""
    if not pack:
        return ReadPlan(list(wanted), why_all="no GC state pack to start from")
    quiet: dict[tuple[str, int], tuple[Job, sm.PartitionState]] = {}
    for job in wanted:
        s = _quiet_state(job, pack)
        if s is not None:
            quiet[(s.topic, s.partition)] = (job, s)
    if len(quiet) < config.quiet_min:
        return ReadPlan(list(wanted), why_all=f"{len(quiet)} quiet partitions: listing L0 would cost more")
    written = written_partitions(store, max_objects=len(quiet))
    if isinstance(written, str):
        return ReadPlan(list(wanted), why_all=written)
    plan = ReadPlan([])
    for job in wanted:
        tp = (job[0] if isinstance(job[0], str) else job[0].name, job[1])
        got = quiet.get(tp)
        if got is None or tp in written:
            plan.read.append(job)
        elif tick_due(got[1], c, config):
            plan.tick.append(got[1])
        elif not needs_work(got[1], c, config):
            plan.skip.append(got[1])
        else:  # due but not tickable from here (C behind its newest epoch): as before
            plan.read.append(job)
    return plan


def _quiet_state(
    job: Job, pack: Mapping[tuple[str, int], tuple[sm.PartitionState, int | None]]
) -> sm.PartitionState | None:
    """The pack's state of ``job`` if it is quiet: this incarnation's, initialized, its
    last entry's CRC32C known, nothing pending and no claim held (live or lapsed)."""
    t, p = job
    name, key_id = (t, None) if isinstance(t, str) else (t.name, t.key_id)
    base, crc = pack.get((name, p), (None, None))
    if base is None or crc is None or base.topic_id != key_id or not base.initialized or base.applied_offset < 0:
        return None
    if base.pending or base.holders:
        return None
    return window.recover(sm.ending_at(base, crc))


def written_partitions(store: ObjectStore, *, max_objects: int) -> set[tuple[str, int]] | str:
    """The ``(topic, partition)`` every L0 object in the store names (one listing of the
    L0 root, a footer read each: every object not yet deleted, so every one M has not
    passed); or why it cannot tell (a key that does not parse, a footer that does not
    read, more than ``max_objects`` objects): then every partition is read."""
    keys: list[str] = []
    try:
        for info in store.list(layout.L0_ROOT):
            try:
                layout.parse_l0_key(info.key)
            except CorruptData as e:
                return f"the L0 listing holds a key ctp did not write ({e})"
            keys.append(info.key)
            if len(keys) > max_objects:
                return f"more than {max_objects} L0 objects to read: reading every partition is cheaper"
    except CtpError as e:
        return f"the L0 root does not list ({e})"

    def footer(key: str) -> list[tuple[str, int]] | str | None:
        try:
            refs = read_footer(store, key)
        except ObjectNotFound:
            return None  # deleted since it was listed: its epoch was at or below M
        except CtpError as e:
            return f"an L0 footer does not read ({e})"
        return [(r.topic, r.partition) for r in refs]

    out: set[tuple[str, int]] = set()
    for named in pmap(footer, keys, read_threads(store, 32)):
        if isinstance(named, str):
            return named
        out.update(named or ())
    return out


def read_footer(store: ObjectStore, key: str) -> list[ChunkRef]:
    """The chunks the L0 object at ``key`` holds, from its footer: one ranged GET of its
    last :data:`~ctp_state.l0.FOOTER_READ` bytes (a second for a longer footer). Raises
    :class:`ObjectNotFound`, or :class:`CorruptData` naming the key."""
    tail, size = store.get_tail(key, FOOTER_READ)
    need = footer_tail_length(tail, size, key)
    if need > len(tail):
        tail = store.get_range(key, size - need, need)
    return parse_footer_tail(tail, size, key)[1]
