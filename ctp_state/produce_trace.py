"""Where a re-run of an input resumes once a partition has forgotten its producer.

A partition answers "how many of producer P's records do you hold?" from its memory of
P (``ctp_state.producer_memory``: a day of epochs, then only while it has room). When it has
forgotten P, the answer is in its log all the same, but the fold's verdict on each of
P's entries depended on state a reader no longer has. So every ``ctp produce`` run
records, per partition, a :class:`Trace`: a few numbers that are true of the fold at one
log offset (how many of P's records the log holds, whether the fold remembers P, and
bounds on the applied epochs). :func:`follow` carries a trace forward over the entries
appended since, deciding each of P's entries the way the fold did -- or, when the
bounds are not enough to tell, stopping there and saying so (:class:`InDoubt`). It is
conservative by construction: it decides only what every state consistent with the
trace would decide alike (``tests/produce/test_produce_trace.py`` checks that against the
fold itself on random logs).

Pure: no store, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from ctp_state import layout, producer_memory, state as sm
from ctp_state.entries import Advance, Entry, Init, Placeholder, Seal, Tick
from ctp_state.errors import CorruptData

#: A trace's fields in its stored form (a list, in this order).
FIELDS = (
    "held",
    "offset",
    "known",
    "last_epoch",
    "max_ub",
    "prev_ub",
    "prev_lb",
    "producers_ub",
    "sealed",
    "initialized",
)


@dataclass(frozen=True, slots=True)
class Trace:
    """What is true of one partition's fold at log offset ``offset``, about producer P."""

    held: int  # how many records of P's sequence the log holds: the next sequence number to send
    offset: int  # the log offset this is true at
    known: str  # does the fold remember P here: "yes", "no" or "maybe"
    last_epoch: int  # epoch of P's last applied batch (-1: none)
    max_ub: int  # upper bound of the partition's max applied epoch
    prev_ub: int  # upper bound of its previous applied epoch
    prev_lb: int  # lower bound of its previous applied epoch (it never decreases)
    producers_ub: int  # upper bound of how many producers the fold remembers
    sealed: bool = False  # the log took a seal: nothing after it applies
    initialized: bool = True  # the log took its init: before it, nothing applies

    def encode(self) -> list[int | str | bool]:
        return [getattr(self, f) for f in FIELDS]

    @classmethod
    def decode(cls, v: object, where: str) -> Trace:
        if not isinstance(v, list) or len(v) != len(FIELDS):
            raise CorruptData(where, f"a trace is a list of {len(FIELDS)} values, got {v!r}")
        t = cls(*v)
        if (
            t.known not in ("yes", "no", "maybe")
            or not all(type(getattr(t, f)) is int for f in FIELDS if f not in ("known", "sealed", "initialized"))
            or not (type(t.sealed) is bool and type(t.initialized) is bool)
        ):
            raise CorruptData(where, f"trace {v!r} does not hold the values its fields need")
        return t


@dataclass(frozen=True, slots=True)
class InDoubt:
    """An entry of P the trace cannot decide: whether the fold applied it depends on
    state the trace does not bound. Its records may or may not be in the partition."""

    log_offset: int
    first_seq: int
    last_seq: int


def of_state(st: sm.PartitionState, producer_id: str, held_if_forgotten: int = 0) -> Trace:
    """The trace of a folded state ``st`` (at ``st.applied_offset``). When ``st`` does
    not remember the producer, ``held_if_forgotten`` is how many of its records the log
    is known to hold (0 if it never wrote any)."""
    known = next((p for p in st.producers if p.producer_id == producer_id), None)
    top = st.max_applied_epoch if st.max_applied_epoch is not None else -1
    prev = st.previous_applied_epoch if st.previous_applied_epoch is not None else -1
    return Trace(
        held=known.last_seq + 1 if known else held_if_forgotten,
        offset=st.applied_offset,
        known="yes" if known else "no",
        last_epoch=known.last_epoch if known else -1,
        max_ub=top,
        prev_ub=prev,
        prev_lb=prev,
        producers_ub=len(st.producers),
        sealed=st.sealed,
        initialized=st.initialized,
    )


def follow(trace: Trace, producer_id: str, entries: Iterable[tuple[int, Entry]]) -> tuple[Trace, InDoubt | None]:
    """Carry ``trace`` over ``entries`` (offset, entry; those after ``trace.offset``, in
    order). Returns the trace at the last entry read, and the first of P's entries it
    could not decide (reading stops there: the trace is then at the entry before it)."""
    t = trace
    for offset, e in entries:
        if offset <= t.offset:
            continue
        if offset != t.offset + 1:
            raise ValueError(f"entries skip from log offset {t.offset} to {offset}")
        if t.sealed:
            t = replace(t, offset=offset)  # nothing after a seal applies
        elif not t.initialized:
            # Before the init nothing applies; the init sets both applied epochs.
            if isinstance(e, Init):
                t = replace(t, offset=offset, initialized=True, max_ub=e.epoch, prev_ub=e.epoch, prev_lb=e.epoch)
            else:
                t = replace(t, offset=offset)
        elif isinstance(e, Seal):
            t = replace(t, offset=offset, sealed=True)
        elif isinstance(e, (Advance, Tick)):  # an advance (a tick is one, in one entry)
            t = replace(t, offset=offset, max_ub=max(t.max_ub, e.epoch), prev_ub=max(t.prev_ub, e.epoch))
        elif isinstance(e, Placeholder) and e.producer_id == producer_id:
            after = _decide(t, e)
            if after is None:
                return t, InDoubt(offset, e.sequence or 0, (e.sequence or 0) + e.record_count - 1)
            t = replace(after, offset=offset)
        elif isinstance(e, Placeholder):
            t = _forgetting(
                replace(
                    t,
                    offset=offset,
                    prev_ub=max(t.prev_ub, min(e.epoch, t.max_ub)),
                    max_ub=max(t.max_ub, e.epoch),
                    producers_ub=t.producers_ub + (e.producer_id is not None),
                )
            )
        else:  # a second init (rejected), reconcile, claim, release: P's memory and the epochs stay
            t = replace(t, offset=offset)
    return t, None


def _forgetting(t: Trace) -> Trace:
    """P may have been forgotten by now: it was quiet past the retention, or more
    producers may have written than the hard bound keeps."""
    if t.known == "yes" and (
        t.last_epoch < t.max_ub - producer_memory.PRODUCER_RETENTION_EPOCHS
        or t.producers_ub > producer_memory.MAX_PRODUCERS_HARD
    ):
        return replace(t, known="maybe")
    return t


def _decide(t: Trace, e: Placeholder) -> Trace | None:
    """The trace after the fold applied or rejected P's entry ``e``, if every state the
    trace allows decides it alike; None if not."""
    if e.writer_epoch is not None or e.sequence is None:
        return None  # fenced by a claim P's runs do not hold: no bound on it here
    try:
        key_epoch: int | None = layout.parse_l0_key(e.l0_key)[1]
    except CorruptData:
        key_epoch = None
    if key_epoch != e.epoch:
        return t  # rejected whatever the state
    first, count = e.sequence, e.record_count
    worlds = {"yes": ("yes",), "no": ("no",), "maybe": ("yes", "no")}[t.known]
    stale = (True,) if e.epoch < t.prev_lb else (False,) if e.epoch >= t.prev_ub else (True, False)
    results: set[str | None] = set()
    for known in worlds:
        if known == "yes" and first <= t.held - 1:
            results.add(None)  # a re-send (duplicate) or a partial one: nothing applied
            continue
        for is_stale in stale:
            if is_stale or (known == "yes" and first != t.held):
                results.add(None)  # stale epoch, or out of order: rejected
            elif first == t.held:
                results.add("applied")
            else:
                results.add("unclear")  # a forgotten P's batch taken as new elsewhere than where it stopped
    if len(results) != 1 or "unclear" in results:
        return None
    if results == {None}:
        return t
    return _forgetting(
        replace(
            t,
            held=first + count,
            known="yes",
            last_epoch=e.epoch,
            prev_ub=max(t.prev_ub, min(e.epoch, t.max_ub)),
            max_ub=max(t.max_ub, e.epoch),
            producers_ub=t.producers_ub + (t.known != "yes"),
        )
    )
