"""Producing a whole input (what ``ctp produce`` does), so that running it again is safe.

An input of records is produced under one producer id; each record's sequence number is
its position among the input's records for its partition. Before sending, each
partition is asked how many of the id's records it already holds (``resume``), and
those are skipped; the rest is sent in batches, and a partition whose batch was not
accepted gets nothing more this run (its later records are reported *not sent*, so its
records stay in order). When every record is in, a completion marker
(``runs/produce/<producer id>.json``, sealed, create-if-absent) records the run, so
running the same input again, even long after its partitions forgot the producer
(:data:`ctp_state.state.MAX_PRODUCERS`), writes nothing twice.

For a file, ``ctp produce`` derives the producer id from the file's bytes: same bytes,
same id, same sequence numbers.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctp_state import codec, layout
from ctp_state.errors import ConfigError, CorruptData, CtpError, KeyExists, ObjectNotFound
from ctp_state.l0 import Record
from ctp_state.producer import Producer, Verdict, write_with_retry
from ctp_state.storage import ObjectStore
from ctp_state.topics import get_topic

Chunks = list[tuple[tuple[str, int], list[Record]]]
log = logging.getLogger(__name__)


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
    completed_before: dict[str, Any] | None = None  # the marker of an earlier complete run
    topics: dict[str, str | None] = field(default_factory=dict)  # the incarnation of each topic written to

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

    def as_dict(self) -> dict[str, Any]:
        return {
            "producer_id": self.producer_id,
            "accepted": self.accepted,
            "duplicates": self.duplicates,
            "rejected": self.rejected,
            "unknown": self.unknown,
            "not_sent": self.not_sent,
            "rejected_by_reason": dict(self.rejected_by_reason),
            "completed_before": self.completed_before,
            "topics": self.topics,
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
) -> None:
    """Send ``batches`` (``total`` records in all) in order; after a batch of a
    partition is not accepted, hold back the rest of that partition (not sent). If a
    flush fails before writing anything, its records are rejected and every record
    after it is not sent: each record still gets an outcome (I4)."""
    stopped: set[tuple[str, int]] = set()
    seen = 0
    for chunks in batches:
        size = sum(len(r) for _, r in chunks)
        held = [c for c in chunks if c[0] in stopped]
        report.not_sent += sum(len(r) for _, r in held)
        try:
            ok, bad = write_with_retry(producer, [c for c in chunks if c[0] not in stopped])
        except CtpError as e:  # raised before this flush wrote anything
            report.rejected += size - sum(len(r) for _, r in held)
            report.rejected_by_reason[getattr(e, "code", "error")] += size
            report.first_error = report.first_error or str(e)
            report.not_sent += total - seen - size
            return
        report.count(ok + bad, stopped)
        seen += size
        on_progress(size)


def produce_input(
    store: ObjectStore,
    records: Sequence[tuple[str, int, Record]],
    *,
    producer_id: str,
    digest: str,
    batch_records: int = 5000,
    on_progress: Callable[[int], None] = lambda n: None,
) -> ProduceReport:
    """Produce ``records`` (in input order; ``digest`` the input's SHA-256) so that
    doing it again never duplicates."""
    report = ProduceReport(producer_id)
    marker = layout.produce_marker(producer_id)
    # The marker says which incarnation of each topic it was written into: a topic
    # deleted and created again since holds none of those records.
    incarnations = {t: get_topic(store, t).id for t in sorted({t for t, _, _ in records})}
    report.topics = incarnations
    try:
        done = codec.unseal(store.get(marker), marker, "produce marker")
        if done.get("digest") != digest or done.get("records") != len(records):
            log.warning("ignoring %s: it records another input", marker)
        elif (why := _other_incarnation(done, incarnations)) is not None:
            log.warning("ignoring %s: %s", marker, why)
        else:
            report.completed_before = done
    except ObjectNotFound:
        pass
    except CorruptData as e:  # only a shortcut: the partitions still know what they hold
        log.warning("ignoring %s", e)
    if report.completed_before is not None:
        report.duplicates = len(records)
        on_progress(len(records))
        return report

    per_partition: dict[tuple[str, int], int] = defaultdict(int)
    with Producer(store, producer_id=producer_id) as producer:
        # Each partition says how many of this id's records it holds: skip those.
        resumed: dict[tuple[str, int], int] = {
            tp: producer.writer(*tp).resume() for tp in sorted({(t, p) for t, p, _ in records})
        }
        todo: list[tuple[str, int, Record]] = []
        for t, p, rec in records:
            if per_partition[(t, p)] < resumed[(t, p)]:
                report.duplicates += 1
            else:
                todo.append((t, p, rec))
            per_partition[(t, p)] += 1
        on_progress(report.duplicates)

        def batches() -> Iterable[Chunks]:
            for start in range(0, len(todo), batch_records):
                chunks: dict[tuple[str, int], list[Record]] = defaultdict(list)
                for t, p, rec in todo[start : start + batch_records]:
                    chunks[(t, p)].append(rec)
                yield sorted(chunks.items())

        send_batches(producer, batches(), report, len(todo), on_progress)
    accounted = report.accepted + report.duplicates + report.rejected + report.unknown + report.not_sent
    if accounted != len(records):  # I4: every record has an outcome; a gap is a bug, say so loudly
        raise CtpError(
            f"produce accounted for {accounted} of {len(records)} records (a bug: please report it); "
            "no completion marker written, run the same command again"
        )
    if report.complete:
        body = {
            "v": 2,
            "producer_id": producer_id,
            "digest": digest,
            "records": len(records),
            "completed_ms": int(time.time() * 1000),
            "partitions": {f"{t}/{p}": n for (t, p), n in sorted(per_partition.items())},
            "topics": incarnations,
        }
        try:
            try:
                store.put_if_absent(marker, codec.seal(body))
            except KeyExists:
                # A concurrent run of the same input finished first, or the marker is of
                # topics since deleted: then this one replaces it (it is only a shortcut).
                there = codec.unseal(store.get(marker), marker, "produce marker")
                if there.get("digest") != digest or _other_incarnation(there, incarnations) is not None:
                    store.put(marker, codec.seal(body))
        except CtpError:
            pass  # only a shortcut for later runs: every record is in either way
    return report


def _other_incarnation(marker: dict[str, Any], incarnations: dict[str, str | None]) -> str | None:
    """Why a completion marker is about other incarnations of the topics than
    ``incarnations`` (name -> id), or None when it is about these. A marker written
    before incarnation ids (version 1) can only be about topics created before them."""
    recorded = marker.get("topics") if marker.get("v", 1) >= 2 else dict.fromkeys(incarnations)
    if not isinstance(recorded, dict):
        return "it does not say which topics it was written into"
    for t, tid in incarnations.items():
        if t not in recorded:
            return f"it does not name topic {t}"
        if recorded[t] != tid:
            return (
                f"topic {t} was deleted and created again since it was written "
                f"(incarnation {recorded[t] or 'legacy'} then, {tid or 'legacy'} now)"
            )
    return None
