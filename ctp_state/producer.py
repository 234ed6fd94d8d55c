"""The producer: buffer records for many partitions, flush them as one L0 object.

A flush (1) reads the cluster epoch (through a TTL cache), (2) uploads one L0 object
whose key embeds that epoch, (3) for each partition's chunk fences the epoch (R1) and
appends one placeholder to the partition's state log, and (4) returns one verdict per
partition: accepted with its base offset, a duplicate of a batch already in the log,
rejected with the reason and the partition's window, or unknown (I4). A rejected write
is always reported; the L0 object of a rejected chunk becomes garbage that the GC
collects once its epoch is <= M.

Produce is idempotent (R8, Kafka's idempotent producer): a producer has an id, and
each placeholder carries the sequence number of its first record among everything the
producer sent to that partition. The state machine drops a batch it already applied,
so re-sending after a lost response never duplicates. A producer's next sequence
number for a partition moves past a batch only when the log took it (accepted or
duplicate); a rejected or unknown batch leaves it, so re-sending those records re-uses
their sequence numbers. A producer id names one sequence of records: two producers
must never share one, unless one re-sends exactly what the other sent, in order
(``ctp produce`` derives its id from its input for that reason).
"""

from __future__ import annotations

import contextlib
import random
import threading
import uuid
from collections import defaultdict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import msgspec

from ctp_state import layout, state as sm, validate
from ctp_state.entries import Placeholder
from ctp_state.epoch import ClusterEpoch, EpochCache
from ctp_state.errors import (
    CtpError,
    IncarnationDeleted,
    OutcomeUnknown,
    OutOfOrderSequence,
    PartitionSealed,
    Rejected,
    SequenceConflict,
    UnverifiableDuplicate,
    WriterStateLost,
)
from ctp_state.fence import EpochFence
from ctp_state.l0 import ChunkRef, Record, build_object
from ctp_state.partition_log import PartitionLog
from ctp_state.storage import ObjectStore
from ctp_state.topics import Topic, get_topic

DEFAULT_SPREAD_WIDTH = 16


class PartitionWriter:
    """One process's handle on one partition: its state, its fence, its log."""

    def __init__(self, log: PartitionLog, writer_epoch: int | None = None, producer_id: str | None = None):
        self.log = log
        self.writer_epoch = writer_epoch
        self.producer_id = producer_id
        self.next_seq = 0  # R8: sequence number of the next record to send, when idempotent
        self._state_lock = threading.Lock()
        # Re-entrant: the lazy state load below may run while an append holds it.
        self._append_lock = threading.RLock()
        self._state: sm.PartitionState | None = None
        self.fence = EpochFence(self._get_state, self._set_state, self._state_lock)

    def resume(self) -> int:
        """Continue this writer's producer id where the log left it: the next sequence
        number becomes one past the last the partition applied for the id (0 if it does
        not know the id). Returns that number: how many records of the id's sequence the
        partition already holds."""
        if self.producer_id is None:
            raise ValueError("only an idempotent writer (one with a producer id) can resume")
        with self._append_lock:
            st = self.log.catch_up(self._get_state())
            self._install(st)
            known = next((p for p in st.producers if p.producer_id == self.producer_id), None)
            self.next_seq = 0 if known is None else known.last_seq + 1
            return self.next_seq

    def _get_state(self) -> sm.PartitionState:
        if self._state is None:
            with self._append_lock:
                if self._state is None:
                    self._state = self.log.read_state()
        return self._state

    def _set_state(self, st: sm.PartitionState) -> None:
        self._state = st

    @property
    def state(self) -> sm.PartitionState:
        return self._get_state()

    def _install(self, new: sm.PartitionState) -> None:
        """Adopt a state produced by an append, keeping a window a concurrent fence
        may have slid meanwhile."""
        with self._state_lock:
            cur = self._state
            if (
                cur is not None
                and cur.max_seen_epoch is not None
                and (new.max_seen_epoch is None or cur.max_seen_epoch > new.max_seen_epoch)
            ):
                new = replace(new, max_seen_epoch=cur.max_seen_epoch, oldest_accepted_epoch=cur.oldest_accepted_epoch)
            self._state = new

    def append_placeholder(self, ph: Placeholder) -> tuple[int, sm.Outcome]:
        """Fence ``ph.epoch`` and append ``ph`` (with this writer's producer id and next
        sequence number, if it has an id). Raises StaleClusterEpoch if the fence
        refuses, OutcomeUnknown if the store left the outcome open; otherwise returns
        the log offset and the apply verdict (R2 may still reject it: the log, not this
        process's window, has the last word)."""
        with self.fence.fence(ph.epoch), self._append_lock:
            if self.producer_id is not None:
                ph = msgspec.structs.replace(ph, producer_id=self.producer_id, sequence=self.next_seq)
            try:
                appended = self.log.append(self._get_state(), lambda s: ph)
            except WriterStateLost:
                # Not the log's: read it afresh now (never left unset: a fence that
                # loads a missing state waits for this lock while holding its own).
                with contextlib.suppress(CtpError, OSError):  # (else the next append finds out again)
                    self._install(self.log.read_state())
                raise
            self._install(appended.outcome.state)
            if self.producer_id is not None:
                self._follow_sequence(appended.outcome, ph.record_count)
        return appended.offset, appended.outcome

    def _follow_sequence(self, outcome: sm.Outcome, records: int) -> None:
        """Move past a batch the log took. After a sequence verdict (an earlier batch
        whose outcome was unknown did land under these numbers, or the partition forgot
        this producer), continue from what the log remembers: the refused records were
        not written, and a re-send gets fresh numbers."""
        if outcome.accepted:
            self.next_seq += records
        elif isinstance(outcome.rejected, (OutOfOrderSequence, SequenceConflict, UnverifiableDuplicate)):
            known = next((p for p in outcome.state.producers if p.producer_id == self.producer_id), None)
            self.next_seq = 0 if known is None else known.last_seq + 1


@dataclass(frozen=True, slots=True)
class Verdict:
    """What happened to one partition's records in one flush."""

    topic: str
    partition: int
    records: int
    l0_key: str
    base_offset: int | None = None  # set when accepted (None for a duplicate too old to know)
    error: CtpError | None = None  # set when not accepted
    duplicate: bool = False  # R8: the log already held this batch; nothing was added
    #: The incarnation of the topic the verdict is about (None: a topic created before ids,
    #: or a write that failed before it reached a partition's log).
    topic_id: str | None = None

    @property
    def accepted(self) -> bool:
        """The records are in the log exactly once (written now, or before)."""
        return self.error is None

    @property
    def outcome(self) -> str:
        """``accepted``; ``duplicate`` (the log already held this batch); ``rejected``
        (not in the log); ``partial`` (the first :attr:`already_written` records were
        already in the log, the rest were not written); ``unknown`` (may be in the log:
        re-send with the same producer id)."""
        if isinstance(self.error, (OutcomeUnknown, UnverifiableDuplicate)):
            return "unknown"
        if self.error is not None:
            return "partial" if self.already_written else "rejected"
        return "duplicate" if self.duplicate else "accepted"

    @property
    def already_written(self) -> int:
        """Records of this chunk that the log already held (a re-send that overlaps a
        batch written earlier); the rest of a ``partial`` chunk was not written."""
        if self.duplicate:
            return self.records
        e = self.error
        if isinstance(e, OutOfOrderSequence) and e.expected > e.sequence:
            return min(self.records, e.expected - e.sequence)
        return 0

    @property
    def reason(self) -> str | None:
        if self.error is None:
            return None
        return getattr(self.error, "code", "error")


class Producer:
    """Buffers records and flushes them as one L0 object. Thread-safe flushes."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        epoch_ttl_s: float = 5.0,
        spread_width: int = DEFAULT_SPREAD_WIDTH,
        append_threads: int = 16,
        rng: random.Random | None = None,
        epochs: EpochCache | None = None,
        producer_id: str | None = None,
        topics: Iterable[Topic] = (),
    ):
        """``topics``: incarnations this producer is bound to. It writes to each of them
        and to nothing else under their names: it never looks those names up again, and
        once one is refused as deleted every later write to it is refused too, without a
        request (a ``ctp produce`` run, whose report and progress record name the
        incarnations it started with). Other names are looked up on first use, and
        looked up again after their incarnation was deleted (a long-lived producer
        follows a re-created topic)."""
        if not 1 <= spread_width <= 1000:
            raise ValueError(f"spread width must be in [1, 1000], got {spread_width}")
        if producer_id is not None:
            layout.check_producer_id(producer_id)
        self.store = store
        #: R8: a fresh id per producer unless one is given (see the module docstring).
        self.producer_id = producer_id or uuid.uuid4().hex
        self.epochs = epochs or EpochCache(ClusterEpoch(store), ttl_s=epoch_ttl_s)
        self.spread_width = spread_width
        self._rng = rng or random.Random()
        self._bound: dict[str, Topic] = {t.name: t for t in topics}
        self._topics: dict[str, Topic] = dict(self._bound)
        self._deleted: set[str] = set()  # bound names whose incarnation was deleted
        self._writers: dict[tuple[str, int], PartitionWriter] = {}
        self._lock = threading.Lock()
        self._buffer: dict[tuple[str, int], list[Record]] = defaultdict(list)
        self._pool = ThreadPoolExecutor(max_workers=append_threads, thread_name_prefix="ctp-append")

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def topic(self, name: str) -> Topic:
        with self._lock:
            t = self._topics.get(name)
        if t is None:
            t = get_topic(self.store, name)
            with self._lock:
                self._topics[name] = t
        return t

    def writer(self, topic: str, partition: int) -> PartitionWriter:
        t = self.topic(topic)  # before the lock: it takes it too
        with self._lock:
            w = self._writers.get((topic, partition))
            if w is None:
                w = self._writers[(topic, partition)] = PartitionWriter(
                    PartitionLog(self.store, t, partition), producer_id=self.producer_id
                )
            return w

    def send(self, topic: str, partition: int, record: Record) -> None:
        """Buffer ``record`` for ``topic``/``partition`` (validated now, not at flush)."""
        self.topic(topic).check_partition(partition)
        with self._lock:
            self._buffer[(topic, partition)].append(record)

    def flush(self) -> list[Verdict]:
        with self._lock:
            batch, self._buffer = self._buffer, defaultdict(list)
        if not batch:
            return []
        return self.write(sorted(batch.items()))

    def write(self, chunks: Iterable[tuple[tuple[str, int], list[Record]]], epoch: int | None = None) -> list[Verdict]:
        """Write one L0 object holding ``chunks`` and append its placeholders."""
        chunks = [((t, p), recs) for (t, p), recs in chunks if recs]
        for (t, p), _ in chunks:
            self.topic(t).check_partition(p)
        with self._lock:
            gone = {(t, p): len(recs) for (t, p), recs in chunks if t in self._deleted}
        if gone:  # refused here: nothing of theirs goes into the L0 object or a log
            live = self.write([c for c in chunks if c[0] not in gone], epoch) if len(gone) < len(chunks) else []
            it = iter(live)
            return [next(it) if tp not in gone else self._refused_deleted(tp, len(r)) for tp, r in chunks]
        try:
            e = validate.epoch(epoch if epoch is not None else self.epochs.get())
        except CtpError as err:  # the cluster epoch did not read: nothing was written
            return [Verdict(t, p, len(recs), "", error=err) for (t, p), recs in chunks]
        data, refs = build_object(e, ((t, p, recs) for (t, p), recs in chunks))
        key = layout.l0_key(self._rng.randrange(self.spread_width), e, uuid.uuid4().hex)
        try:
            self.store.put(key, data)
        except (CtpError, OSError) as err:
            # No placeholder was appended, so none of these records is in the log: rejected.
            failure = err if isinstance(err, CtpError) else CtpError(f"writing L0 object {key}: {err}")
            return [Verdict(r.topic, r.partition, r.record_count, key, error=failure) for r in refs]
        futures = [self._pool.submit(self._append, key, e, ref) for ref in refs]
        verdicts = [f.result() for f in futures]
        if any(v.reason == "stale_epoch" for v in verdicts):
            self.epochs.invalidate()
        deleted = {v.topic for v in verdicts if v.reason == PartitionSealed.code}
        if deleted:
            self._forget(deleted)
        return verdicts

    def _forget(self, topics: set[str]) -> None:
        """Drop what this producer knows of ``topics`` (their incarnation was deleted):
        the next write looks each up again, and finds a re-created one, or none -- unless
        the producer is bound to that incarnation: then it stays refused."""
        with self._lock:
            self._deleted.update(t for t in topics if t in self._bound)
            for t in topics - self._bound.keys():
                self._topics.pop(t, None)
            for k in [k for k in self._writers if k[0] in topics and k[0] not in self._bound]:
                del self._writers[k]

    def _refused_deleted(self, tp: tuple[str, int], records: int) -> Verdict:
        t = self._bound[tp[0]]
        return Verdict(tp[0], tp[1], records, "", error=IncarnationDeleted(tp[0], tp[1], t.incarnation), topic_id=t.id)

    def _append(self, key: str, epoch: int, ref: ChunkRef) -> Verdict:
        tid = self.topic(ref.topic).id  # the incarnation this producer writes to (its writer's)
        return replace(self._append_to_log(key, epoch, ref), topic_id=tid)

    def _append_to_log(self, key: str, epoch: int, ref: ChunkRef) -> Verdict:
        w = self.writer(ref.topic, ref.partition)
        ph = Placeholder(
            epoch,
            key,
            ref.byte_offset,
            ref.byte_length,
            ref.record_count,
            ref.crc32c,
            w.writer_epoch,
            fingerprint=ref.fingerprint if w.producer_id is not None else None,
        )
        try:
            _, outcome = w.append_placeholder(ph)
        except Rejected as e:  # the in-process fence refused it, or the log has no init: nothing written
            return Verdict(ref.topic, ref.partition, ref.record_count, key, error=e)
        except OutcomeUnknown as e:  # sent, but whether it landed could not be learned
            return Verdict(ref.topic, ref.partition, ref.record_count, key, error=e)
        except (CtpError, OSError) as e:
            # Failed before anything was sent (reading the partition's state), or a
            # contention timeout: every create that was sent lost its race. Not written.
            err = e if isinstance(e, CtpError) else CtpError(f"{ref.topic}/{ref.partition}: {e}")
            return Verdict(ref.topic, ref.partition, ref.record_count, key, error=err)
        if outcome.rejected is not None:
            return Verdict(ref.topic, ref.partition, ref.record_count, key, error=outcome.rejected)
        return Verdict(
            ref.topic,
            ref.partition,
            ref.record_count,
            key,
            base_offset=outcome.base_offset,
            duplicate=outcome.duplicate,
        )


def write_with_retry(
    producer: Producer, chunks: list[tuple[tuple[str, int], list[Record]]], *, attempts: int = 3
) -> tuple[list[Verdict], list[Verdict]]:
    """Write ``chunks``; re-send chunks rejected for a stale epoch with a fresh epoch,
    up to ``attempts`` flushes in all. Returns ``(accepted, not_accepted)``: the second
    list holds rejected and unknown verdicts (see :attr:`Verdict.outcome`); nothing is
    dropped without being in one of the two lists."""
    accepted: list[Verdict] = []
    pending = [c for c in chunks if c[1]]
    rejected: list[Verdict] = []  # over every attempt: a verdict is never dropped
    for attempt in range(attempts):
        if not pending:
            break
        verdicts = producer.write(pending)
        retry = []
        for verdict, chunk in zip(verdicts, pending):
            if verdict.accepted:
                accepted.append(verdict)
            elif verdict.reason == "stale_epoch" and attempt + 1 < attempts:
                retry.append(chunk)
            else:
                rejected.append(verdict)
        pending = retry
    return accepted, rejected
