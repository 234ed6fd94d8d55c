"""Producing a whole input (what ``ctp produce`` does), so that running it again is safe.

An input of records is produced under one producer id; each record's sequence number is
its position among the input's records for its partition. Before sending, each
partition is asked how many of the id's records it already holds (``resume``), and
those are skipped; the rest is sent in batches, and a partition whose batch was not
accepted gets nothing more this run (its later records are reported *not sent*, so its
records stay in order). When every record is in, a completion marker
(``runs/produce/<producer id>.json``, sealed, create-if-absent) records the run, so
running the same input again writes nothing twice.

A partition that has forgotten the producer (:data:`ctp_state.producer_memory.MAX_PRODUCERS`)
cannot say how many of its records it holds. So a run also keeps a progress record
(``runs/produce-progress/<producer id>.json``, rewritten after every flush): per
partition, a :class:`~ctp_state.produce_trace.Trace` of its fold. A re-run the partition
cannot answer follows that trace over the log entries appended since, and resumes after
the last record the log holds. One of the id's entries whose fate the trace cannot
decide (rare: it needs an epoch the trace cannot bound) is settled by folding the
partition's log from its first entry, up to a limit (``replay_limit``); beyond it, the
entry's records are reported *unknown* with its log offset and nothing after them is sent.

For a file, ``ctp produce`` derives the producer id from the file's bytes: same bytes,
same id, same sequence numbers.

Why one module of about 430 lines: resume, send and the progress record are one
protocol (what a re-run may skip depends on what the progress record wrote before each
send); the pure part of it, following a trace, is :mod:`ctp_state.produce_trace`.
"""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field

from ctp_state import codec, crashpoints, layout, records as records_codec, state as sm
from ctp_state.codec import JsonObject
from ctp_state.entries import Placeholder
from ctp_state.errors import ConfigError, CorruptData, CtpError, ObjectNotFound, PartitionSealed, StoreError
from ctp_state.l0 import Record
from ctp_state.produce_marker import completed_before, mark_complete
from ctp_state.produce_trace import InDoubt, Trace, follow, of_state
from ctp_state.producer import PartitionWriter, Producer, Verdict, write_with_retry
from ctp_state.records import ProduceMarker
from ctp_state.storage import ObjectStore
from ctp_state.topics import get_topic

Chunks = list[tuple[tuple[str, int], list[Record]]]
log = logging.getLogger(__name__)

#: By default a re-run settles an entry of its producer id that the progress trace cannot
#: decide by folding the partition's log from its first entry, when the entry's offset is
#: at most this; beyond, the entry's records are reported unknown (with the offset).
REPLAY_LIMIT = 200_000


@dataclass
class ProduceReport:
    """Every record of the input, counted by outcome (I4: nothing unaccounted for)."""

    producer_id: str
    accepted: int = 0  # written now
    duplicates: int = 0  # already in the log (an earlier run, or a re-send)
    rejected: int = 0  # not written
    unknown: int = 0  # may be in the log (or written by a concurrent run of the input): run again
    not_sent: int = 0  # held back after an earlier batch of the partition was not accepted
    rejected_by_reason: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    first_error: str | None = None
    completed_before: ProduceMarker | None = None  # the marker of an earlier complete run
    topics: dict[str, str | None] = field(default_factory=dict)  # the incarnation of each topic written to
    #: entries of this producer id whose fate the log cannot tell (see the module docstring)
    in_doubt: list[PartitionInDoubt] = field(default_factory=list)
    #: topics whose incarnation was deleted while the run wrote to them: it wrote no more
    deleted: set[str] = field(default_factory=set)

    @property
    def complete(self) -> bool:
        return not (self.rejected or self.unknown or self.not_sent)

    def count(self, verdicts: Iterable[Verdict], stopped: set[tuple[str, int]]) -> None:
        for v in verdicts:
            if v.accepted:
                if v.duplicate:
                    self.duplicates += v.records
                else:
                    self.accepted += v.records
                continue
            self.duplicates += v.already_written
            rest = v.records - v.already_written
            # The rest of a partial batch was not refused: another writer of this producer
            # id (for a file, a concurrent run of the same input: a run sends a partition
            # nothing after a batch that was not accepted) holds the id's records up to a
            # point inside the batch, cut differently. It may write the rest, and a re-run
            # will: unknown, never "rejected" (a rejected record never appears, I4).
            if v.outcome in ("unknown", "partial"):
                self.unknown += rest
            else:
                self.rejected += rest
            self.rejected_by_reason[v.reason or "error"] += rest
            self.first_error = self.first_error or str(v.error)
            stopped.add((v.topic, v.partition))
            if v.reason == PartitionSealed.code:
                self.deleted.add(v.topic)

    def as_dict(self) -> JsonObject:  # what `ctp produce --json` prints
        return {
            "producer_id": self.producer_id,
            "accepted": self.accepted,
            "duplicates": self.duplicates,
            "rejected": self.rejected,
            "unknown": self.unknown,
            "not_sent": self.not_sent,
            "rejected_by_reason": dict(self.rejected_by_reason),
            "completed_before": None if self.completed_before is None else records_codec.encode(self.completed_before),
            "topics": self.topics,
            "in_doubt": [asdict(d) for d in self.in_doubt],
        }


def input_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def input_producer_id(digest: str, name: str | None = None) -> str:
    """The producer id of an input: the same bytes always produce under the same id. A
    ``name`` (``--producer-id``) is prefixed, never substituted: the same name with
    other bytes is another producer, so it can never skip records it did not write."""
    if name is None:
        return "file-" + digest[:32]
    if len(name) > 111:
        raise ConfigError(
            f"--producer-id {name[:20]!r}... is {len(name)} characters, at most 111 allowed "
            "(ctp adds 17 for the input's digest)"
        )
    try:
        return layout.check_producer_id(f"{name}.{digest[:16]}")
    except ValueError:
        raise ConfigError(f"--producer-id {name!r} may only hold letters, digits, '.', '_' and '-'") from None


def send_batches(
    producer: Producer,
    batches: Iterable[Chunks],
    report: ProduceReport,
    total: int,
    on_progress: Callable[[int], None] = lambda n: None,
    after_flush: Callable[[], None] = lambda: None,
) -> None:
    """Send ``batches`` (``total`` records in all) in order; after a batch of a
    partition is not accepted, hold back the rest of that partition (not sent). If a
    flush fails before writing anything, its records are rejected and every record
    after it is not sent: each record still gets an outcome (I4). Once a write is
    refused because its topic was deleted, the run's part for that topic ends: its
    later records are rejected (``topic_deleted``), as the producer would refuse them."""
    stopped: set[tuple[str, int]] = set()
    seen = 0
    for flush, chunks in enumerate(batches):
        size = sum(len(r) for _, r in chunks)
        held = [c for c in chunks if c[0] in stopped]
        for (t, _), recs in held:
            if t in report.deleted:
                report.rejected += len(recs)
                report.rejected_by_reason[PartitionSealed.code] += len(recs)
            else:
                report.not_sent += len(recs)
        try:
            ok, bad = write_with_retry(producer, [c for c in chunks if c[0] not in stopped])
        except CtpError as e:  # raised before this flush wrote anything
            report.rejected += size - sum(len(r) for _, r in held)
            report.rejected_by_reason[getattr(e, "code", "error")] += size
            report.first_error = report.first_error or str(e)
            report.not_sent += total - seen - size
            return
        report.count(ok + bad, stopped)
        if report.deleted:  # every partition of a deleted topic, not only the refused ones
            stopped.update(c[0] for c in chunks if c[0][0] in report.deleted)
        crashpoints.reached("produce_after_flush", flush)
        seen += size
        after_flush()
        on_progress(size)


def produce_input(
    store: ObjectStore,
    records: Sequence[tuple[str, int, Record]],
    *,
    producer_id: str,
    digest: str,
    batch_records: int = 5000,
    on_progress: Callable[[int], None] = lambda n: None,
    replay_limit: int = REPLAY_LIMIT,
) -> ProduceReport:
    """Produce ``records`` (in input order; ``digest`` the input's SHA-256) so that
    doing it again never duplicates."""
    report = ProduceReport(producer_id)
    # The run is bound to the incarnations looked up here, once: it writes to them and
    # to nothing else (a topic deleted and created again mid-run gets none of its
    # records), and the marker and progress record name them.
    bound = [get_topic(store, t) for t in sorted({t for t, _, _ in records})]
    incarnations = {t.name: t.id for t in bound}
    report.topics = incarnations
    report.completed_before = completed_before(store, producer_id, digest, len(records), incarnations)
    if report.completed_before is not None:
        report.duplicates = len(records)
        on_progress(len(records))
        return report

    per_partition: dict[tuple[str, int], int] = defaultdict(int)
    progress = Progress(store, producer_id, digest, len(records), incarnations)
    with Producer(store, producer_id=producer_id, topics=bound) as producer:
        # Each partition says how many of this id's records it holds (or, once it has
        # forgotten the id, the log since the last progress recorded does): skip those.
        resumed: dict[tuple[str, int], int] = {}
        doubts: dict[tuple[str, int], InDoubt] = {}
        writers: dict[tuple[str, int], PartitionWriter] = {}
        sizes: dict[tuple[str, int], int] = defaultdict(int)
        for t, p, _ in records:
            sizes[(t, p)] += 1
        for tp in sorted(sizes):
            writers[tp] = producer.writer(*tp)
            resumed[tp], trace, doubt = resume(
                writers[tp], progress.traces.get(tp), replay_limit, damaged=progress.damaged, records=sizes[tp]
            )
            progress.traces[tp] = trace
            if doubt is not None:
                doubts[tp] = doubt
                report.in_doubt.append(
                    PartitionInDoubt(tp[0], tp[1], doubt.log_offset, doubt.first_seq, doubt.last_seq)
                )
        # Recorded before anything is sent: a re-run after the partitions forgot this id
        # depends on it. Later saves may fail (a re-run then reads more of the log).
        progress.save(required=True)
        todo: list[tuple[str, int, Record]] = []
        for t, p, rec in records:
            seq, doubt = per_partition[(t, p)], doubts.get((t, p))
            if seq < resumed[(t, p)]:
                report.duplicates += 1
            elif doubt is not None and seq <= doubt.last_seq:
                report.unknown += 1  # may be in the log (report.in_doubt says where): not sent again
            elif doubt is not None:
                report.not_sent += 1  # held back behind the records in doubt
            else:
                todo.append((t, p, rec))
            per_partition[(t, p)] += 1
        if doubts:
            first = next(iter(doubts.items()))
            report.first_error = report.first_error or (
                f"{first[0][0]}/{first[0][1]}: records {first[1].first_seq}-{first[1].last_seq} of this input "
                f"may be in the log (entry {first[1].log_offset}); it no longer remembers producer {producer_id}"
            )
        on_progress(report.duplicates + report.unknown + report.not_sent)

        def after_flush() -> None:
            for tp, w in writers.items():
                if tp not in doubts:
                    progress.follow_writer(tp, w)
            progress.save()

        def batches() -> Iterable[Chunks]:
            for start in range(0, len(todo), batch_records):
                chunks: dict[tuple[str, int], list[Record]] = defaultdict(list)
                for t, p, rec in todo[start : start + batch_records]:
                    chunks[(t, p)].append(rec)
                yield sorted(chunks.items())

        send_batches(producer, batches(), report, len(todo), on_progress, after_flush)
    accounted = report.accepted + report.duplicates + report.rejected + report.unknown + report.not_sent
    if accounted != len(records):  # I4: every record has an outcome; a gap is a bug, say so loudly
        raise CtpError(
            f"produce accounted for {accounted} of {len(records)} records (a bug: please report it); "
            "no completion marker written, run the same command again"
        )
    if report.complete:
        partitions = {f"{t}/{p}": n for (t, p), n in sorted(per_partition.items())}
        mark_complete(store, producer_id, digest, len(records), partitions, incarnations)
    return report


@dataclass(frozen=True)
class PartitionInDoubt:
    """Records of this producer id a partition may or may not hold (an :class:`InDoubt`
    entry of its log, at ``log_offset``): a re-run with a larger replay limit settles it."""

    topic: str
    partition: int
    log_offset: int
    first_seq: int
    last_seq: int


def resume(
    writer: PartitionWriter, prior: Trace | None, replay_limit: int = 0, *, damaged: bool = False, records: int = 0
) -> tuple[int, Trace, InDoubt | None]:
    """How many of the writer's producer id's records its partition holds, the trace of
    the partition now, and the first of the id's entries whose fate cannot be told.

    The partition's memory answers while it remembers the id. Once it has forgotten it,
    the ``prior`` trace (from the progress record) is followed over the log entries
    appended since it was taken; an entry that trace cannot decide is settled by a fold of
    the whole log if it is at most ``replay_limit`` entries in. With no ``prior`` the id
    never wrote here -- unless the progress record is ``damaged``: then only the whole
    log can tell, and beyond ``replay_limit`` all ``records`` of the input for this
    partition are in doubt."""
    pid = writer.producer_id
    assert pid is not None
    held = writer.resume()
    st = writer.state
    if any(p.producer_id == pid for p in st.producers) or (prior is None and not damaged):
        return held, of_state(st, pid), None
    where = f"{st.topic}/{st.partition}"
    if prior is not None and prior.offset <= st.applied_offset:
        trace, doubt = follow(prior, pid, writer.log.entries(prior.offset))
    else:  # no trace to follow: the record is damaged, or not of this log
        log.warning("%s no longer remembers producer %s and its progress record cannot say more", where, pid)
        trace, doubt = of_state(st, pid), InDoubt(st.applied_offset, 0, records - 1)
    if doubt is not None and doubt.log_offset <= replay_limit:
        # The trace cannot tell; the fold from the log's first entry can.
        log.info("%s: replaying its log from the first entry to learn the fate of entry %d", where, doubt.log_offset)
        trace, doubt = _replay(writer, pid), None
    if trace.held:
        log.info("%s no longer remembers producer %s: its log holds %d of its records", where, pid, trace.held)
    writer.next_seq = trace.held
    return trace.held, trace, doubt


def _replay(writer: PartitionWriter, pid: str) -> Trace:
    """The trace at the end of the writer's log, from a fold of all of it: how many of
    ``pid``'s sequence the log holds is the end of the furthest batch the fold applied."""
    st, held = writer.log.empty_state(), 0
    for offset, e in writer.log.entries(-1):
        out = sm.apply(st, offset, e)
        if isinstance(e, Placeholder) and e.producer_id == pid and out.accepted and not out.duplicate:
            held = max(held, (e.sequence or 0) + e.record_count)
        st = out.state
    return of_state(st, pid, held_if_forgotten=held)


class Progress:
    """The progress record of one input: per partition, a trace of its fold that a
    re-run follows once the partition has forgotten the producer. Written before a run
    sends anything, then after every flush (a plain overwrite: every version is true, a
    newer one only saves reading). One that cannot be read is said, and the log is
    replayed instead."""

    VERSION = 1

    def __init__(
        self, store: ObjectStore, producer_id: str, digest: str, records: int, incarnations: dict[str, str | None]
    ):
        self.store, self.key = store, layout.produce_progress(producer_id)
        self.producer_id, self.digest, self.records, self.incarnations = producer_id, digest, records, incarnations
        #: The record is there but cannot be read: a partition that forgot the producer
        #: then has only its whole log to tell what it holds.
        self.damaged = False
        self.traces: dict[tuple[str, int], Trace] = self._read()

    def _read(self) -> dict[tuple[str, int], Trace]:
        try:
            body = codec.unseal(self.store.get(self.key), self.key, "produce progress")
            if body.get("digest") != self.digest:
                log.warning("ignoring %s: it records another input", self.key)
                return {}
            if body.get("v") != self.VERSION:
                raise CorruptData(self.key, f"produce progress version {body.get('v')!r} is not supported")
            topics, traces = body.get("topics"), {}
            for name, v in body.get("partitions", {}).items():
                t, _, p = name.rpartition("/")
                # Only for the incarnation it was written into: a topic deleted and
                # created again since holds none of those records.
                if t in self.incarnations and isinstance(topics, dict) and topics.get(t) == self.incarnations[t]:
                    traces[(t, int(p))] = Trace.decode(v, self.key)
            return traces
        except ObjectNotFound:
            return {}
        except (CorruptData, ValueError, AttributeError, TypeError) as e:
            log.warning("cannot use %s: %s", self.key, e)
            self.damaged = True
            return {}

    def follow_writer(self, tp: tuple[str, int], writer: PartitionWriter) -> None:
        """Take the trace of ``writer``'s state, if it remembers the producer and is
        newer than the one held."""
        st = writer.state
        if any(p.producer_id == self.producer_id for p in st.producers):
            old = self.traces.get(tp)
            if old is None or st.applied_offset > old.offset:
                self.traces[tp] = of_state(st, self.producer_id)

    def save(self, *, required: bool = False) -> None:
        body = {
            "v": self.VERSION,
            "producer_id": self.producer_id,
            "digest": self.digest,
            "records": self.records,
            "topics": self.incarnations,
            "partitions": {f"{t}/{p}": tr.encode() for (t, p), tr in sorted(self.traces.items())},
        }
        data = codec.seal(body)
        try:
            self.store.put(self.key, data)
        except CtpError as e:
            try:
                landed = self.store.get(self.key) == data  # it may have landed, its response lost
            except CtpError:
                landed = False
            if landed:
                return
            if required:
                raise StoreError(
                    f"could not record the progress of producer {self.producer_id} at {self.key} ({e}); "
                    "nothing was sent: run the same command again"
                ) from e
            # An older version stands: a re-run follows it over more of the log.
            log.warning("could not record the progress of producer %s: %s", self.producer_id, e)
