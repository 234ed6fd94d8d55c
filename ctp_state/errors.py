"""Every error ctp raises, in one flat module.

Each error carries the fields an operator or a caller needs (topic, partition, epoch,
window, key) and its message reads as one sentence that says what is wrong and where.
Messages never contain credentials: stores are named by their redacted URL.
"""

from __future__ import annotations


class CtpError(Exception):
    """Base of all ctp errors. ``str(err)`` is a one-line, operator-readable cause."""


# --- configuration and input -------------------------------------------------------


class ConfigError(CtpError):
    """A setting (environment variable, URL, CLI flag) is missing or malformed."""


class StoreNotFound(ConfigError):
    """The store a reading command names does not exist (a ``file://`` directory)."""

    def __init__(self, url: str, reason: str):
        self.url, self.reason = url, reason
        super().__init__(f"store {url} does not exist ({reason})")


class InvalidTopicName(CtpError):
    def __init__(self, name: str, reason: str):
        self.name = name
        super().__init__(f"invalid topic name {name!r}: {reason}")


class InvalidEpoch(CtpError):
    def __init__(self, value: object, reason: str):
        self.value = value
        super().__init__(f"invalid epoch {value!r}: {reason}")


class InvalidRecord(CtpError):
    """A producer input record is malformed; ``where`` says which line or field."""

    def __init__(self, where: str, reason: str):
        self.where = where
        super().__init__(f"{where}: {reason}")


class TopicNotFound(CtpError):
    def __init__(self, topic: str):
        self.topic = topic
        super().__init__(f"topic {topic!r} does not exist (create it with `ctp topic create`)")


class TopicDeleted(TopicNotFound):
    """The name's incarnation was deleted (its state may still be being removed)."""

    def __init__(self, topic: str, incarnation: str):
        self.topic, self.incarnation = topic, incarnation
        CtpError.__init__(
            self,
            f"topic {topic!r} was deleted (incarnation {incarnation}; the GC removes its state); "
            "`ctp topic create` makes a new one",
        )


class TopicExists(CtpError):
    def __init__(self, topic: str, partitions: int):
        self.topic = topic
        self.partitions = partitions
        super().__init__(f"topic {topic!r} already exists with {partitions} partitions")


class PartitionNotFound(CtpError):
    def __init__(self, topic: str, partition: int, partitions: int):
        self.topic, self.partition = topic, partition
        super().__init__(
            f"partition {partition} of topic {topic!r} does not exist (the topic has partitions 0..{partitions - 1})"
        )


# --- object store ------------------------------------------------------------------


class OffsetBeforeStart(CtpError):
    """A read from an offset its partition no longer holds (Kafka's OffsetOutOfRange):
    retention or DeleteRecords moved the partition's start offset past it."""

    def __init__(self, topic: str, partition: int, offset: int, start_offset: int):
        self.topic, self.partition, self.offset, self.start_offset = topic, partition, offset, start_offset
        super().__init__(
            f"{topic}/{partition}: offset {offset} is before the partition's start offset {start_offset} "
            "(records before it were removed by retention or delete-records); read from "
            f"{start_offset}, or pass --from-start"
        )


class StoreError(CtpError):
    """An object-store request failed in a way a retry did not fix. ``code`` is the
    store's error code (``SlowDown``, ``500``, ...) when it gave one."""

    def __init__(self, message: str, code: str = ""):
        super().__init__(message)
        self.code = code


class ObjectNotFound(StoreError):
    def __init__(self, key: str):
        self.key = key
        super().__init__(f"object {key!r} not found")


class KeyExists(StoreError):
    """A create-if-absent lost: the key already exists (S3 412/409, EEXIST locally)."""

    def __init__(self, key: str):
        self.key = key
        super().__init__(f"object {key!r} already exists")


class InvalidKey(StoreError):
    def __init__(self, key: str, reason: str):
        self.key = key
        super().__init__(f"invalid object key {key!r}: {reason}")


# --- formats -----------------------------------------------------------------------


class CorruptData(CtpError):
    """Bytes read from the store do not decode: checksum mismatch, truncation, bad JSON."""

    def __init__(self, key: str, reason: str):
        self.key = key
        self.reason = reason
        super().__init__(f"corrupt data in {key!r}: {reason}")


class UnsupportedVersion(CorruptData):
    """An entry, snapshot or L0 object has a format version this build does not know.

    Unknown versions are refused, never guessed: an older ctp must not misread the
    output of a newer one.
    """

    def __init__(self, key: str, what: str, version: object, supported: tuple[int, ...]):
        self.version = version
        super().__init__(key, f"{what} version {version!r} is not supported (this ctp reads {list(supported)})")


class LogGap(CorruptData):
    def __init__(self, key: str, expected: int, found: int):
        super().__init__(key, f"state log is not dense: expected offset {expected}, found {found}")


class LogForked(CtpError):
    """A placeholder written after an entry the log does not hold before it: its
    ``prev`` names another entry. The store lost or replaced the entry before it after
    it was written, and another entry took that slot. The placeholder was judged against
    the lost entry (its producer sequence, its epoch against the window) and
    acknowledged, and the lost entry's own data is still in L0: the partition does not
    read (R9: the GC deletes nothing) until the log is restored (docs/failure-model.md)."""

    def __init__(self, topic: str, partition: int, offset: int):
        self.topic, self.partition, self.offset = topic, partition, offset
        super().__init__(
            f"{topic}/{partition}: the placeholder at log offset {offset} was written after another entry than "
            f"the one the log holds at {offset - 1} (the store lost that entry and another took its place); "
            "nothing is deleted: restore the log from a backup"
        )


class EntryOutOfOrder(CtpError):
    """The fold was handed an entry that does not follow the state it applies to: a
    reader skipped or repeated an offset (a bug, or a log read around a gap)."""

    def __init__(self, topic: str, partition: int, offset: int, applied: int):
        self.topic, self.partition, self.offset, self.applied = topic, partition, offset, applied
        super().__init__(
            f"{topic}/{partition}: entry at offset {offset} applied after offset {applied} (expected {applied + 1})"
        )


# --- the state machine's verdicts ----------------------------------------------------


class Rejected(CtpError):
    """Base of the verdicts ``apply`` gives to an entry it does not accept.

    These are deterministic: every reader of the log reaches the same verdict.
    """

    code = "rejected"


class PartitionSealed(Rejected):
    """R10: the partition's topic incarnation was deleted; its log takes nothing more."""

    code = "topic_deleted"

    def __init__(self, topic: str, partition: int):
        self.topic, self.partition = topic, partition
        super().__init__(f"{topic}/{partition}: the topic was deleted; the partition's log is sealed")


class IncarnationDeleted(Rejected):
    """R10: a producer bound to one incarnation of a topic (a ``ctp produce`` run) learnt
    that it was deleted; it writes nothing more to it, and never to a newer one."""

    code = "topic_deleted"

    def __init__(self, topic: str, partition: int, incarnation: str):
        self.topic, self.partition, self.incarnation = topic, partition, incarnation
        super().__init__(
            f"{topic}/{partition}: incarnation {incarnation} of the topic was deleted while this run wrote to it; "
            "nothing more is written to it (run the same command again to write into the topic as it is now)"
        )


class LogRewound(Rejected):
    """A writer's log no longer holds the entry its state ends at: the topic incarnation
    was deleted and its state removed (or the log was damaged). Nothing was written;
    look the topic up again."""

    code = "topic_deleted"

    def __init__(self, topic: str, partition: int, offset: int):
        self.topic, self.partition, self.offset = topic, partition, offset
        super().__init__(
            f"{topic}/{partition}: the log no longer holds offset {offset} that this writer read "
            "(the topic was deleted and its state removed, or the log was damaged); nothing was written"
        )


class WriterStateLost(Rejected):
    """A writer lost a race to an entry written after another entry than the one the
    writer's state ends at: the store lost the writer's newest entry and another took
    its slot, so the writer's state is not the log's. Nothing was written; its next
    write reads the log afresh (docs/design.md section 14)."""

    code = "writer_state_lost"

    def __init__(self, topic: str, partition: int, offset: int):
        self.topic, self.partition, self.offset = topic, partition, offset
        super().__init__(
            f"{topic}/{partition}: the log no longer holds the entry at offset {offset} this writer's state ends "
            "at (the store lost it and another entry took its place); nothing was written: write again"
        )


class StaleClusterEpoch(Rejected):
    """R1/R2: the epoch is older than the partition accepts; refresh it and retry."""

    code = "stale_epoch"

    def __init__(self, topic: str, partition: int, epoch: int, window: tuple[int, int] | None):
        self.topic, self.partition, self.epoch, self.window = topic, partition, epoch, window
        shown = f"[{window[0]}, {window[1]}]" if window else "[]"
        super().__init__(
            f"{topic}/{partition}: cluster epoch {epoch} is stale, the partition accepts "
            f"epochs in {shown}; refresh the cluster epoch and retry"
        )


class WriterFenced(Rejected):
    """R5: a newer claim superseded this writer; it stays fenced."""

    code = "writer_fenced"

    def __init__(self, topic: str, partition: int, writer_epoch: int, current: int):
        self.topic, self.partition = topic, partition
        self.writer_epoch, self.current = writer_epoch, current
        super().__init__(
            f"{topic}/{partition}: writer epoch {writer_epoch} is fenced by writer epoch "
            f"{current}; another writer claimed the partition"
        )


class EntryForked(Rejected):
    """A claim holder's entry (reconcile, advance, compact, trim) written after an entry
    the log does not hold before it: its ``prev`` names another entry. The store lost
    entries its writer had read, and the writer epoch it wrote under may be another
    claimer's now; it has no effect (docs/design.md section 14)."""

    code = "forked"

    def __init__(self, topic: str, partition: int, offset: int):
        self.topic, self.partition, self.offset = topic, partition, offset
        super().__init__(
            f"{topic}/{partition}: the entry at log offset {offset} was written after an entry the log no "
            f"longer holds at {offset - 1} (the store lost entries); it has no effect"
        )


class UnknownWriterEpoch(Rejected):
    """R5: the writer epoch is ahead of the log; refresh the state and retry."""

    code = "unknown_writer_epoch"

    def __init__(self, topic: str, partition: int, writer_epoch: int, current: int):
        self.topic, self.partition = topic, partition
        self.writer_epoch, self.current = writer_epoch, current
        super().__init__(
            f"{topic}/{partition}: writer epoch {writer_epoch} is ahead of the log's "
            f"{current}; refresh the partition state and retry"
        )


class OutOfOrderSequence(Rejected):
    """R8: an idempotent producer's batch does not follow the last one applied; the
    batch was not written. A gap means an earlier batch never reached the log."""

    code = "out_of_order_sequence"

    def __init__(self, topic: str, partition: int, producer_id: str, sequence: int, expected: int):
        self.topic, self.partition, self.producer_id = topic, partition, producer_id
        self.sequence, self.expected = sequence, expected
        super().__init__(
            f"{topic}/{partition}: producer {producer_id!r} sent sequence {sequence}, the partition expects "
            f"{expected}; the batch was not written (send the earlier records first)"
        )


class SequenceConflict(Rejected):
    """R8: a batch re-uses sequence numbers an applied batch of the same producer holds,
    with other records. The new batch was not written."""

    code = "sequence_conflict"

    def __init__(self, topic: str, partition: int, producer_id: str, sequence: int, base_offset: int):
        self.topic, self.partition, self.producer_id = topic, partition, producer_id
        self.sequence, self.base_offset = sequence, base_offset
        super().__init__(
            f"{topic}/{partition}: producer {producer_id!r} already wrote other records under sequence "
            f"{sequence} (at offset {base_offset}); this batch was not written (a producer id names one "
            "sequence of records: use a new producer id for new records)"
        )


class UnverifiableDuplicate(Rejected):
    """R8: the batch's sequence numbers were applied, but not as a batch the partition
    can still compare (older than the batches it keeps, or cut differently). If it is a
    re-send its records are in the log; if it holds new records they were not written.
    Its outcome is therefore unknown, not rejected."""

    code = "unverifiable_duplicate"

    def __init__(self, topic: str, partition: int, producer_id: str, first: int, last: int):
        self.topic, self.partition, self.producer_id = topic, partition, producer_id
        self.first, self.last = first, last
        super().__init__(
            f"{topic}/{partition}: producer {producer_id!r} already wrote sequences {first}..{last}, in a batch "
            "that cannot be compared with this one: if this is a re-send its records are in the log, if it "
            "holds new records they were not written (use a new producer id for new records)"
        )


class ClaimHeld(Rejected):
    """R5: an exclusive claim was asked for while another owner holds a live claim."""

    code = "claim_held"

    def __init__(self, topic: str, partition: int, owner: str, mode: str, lease_until_ms: int):
        self.topic, self.partition = topic, partition
        self.owner, self.mode, self.lease_until_ms = owner, mode, lease_until_ms
        super().__init__(
            f"{topic}/{partition}: a {mode} claim is held by {owner!r} until lease expiry at {lease_until_ms} ms"
        )


class InvalidTransition(Rejected):
    """An entry that no correct writer produces (wrong order, bound moved too far)."""

    code = "invalid"

    def __init__(self, topic: str, partition: int, reason: str):
        self.topic, self.partition = topic, partition
        super().__init__(f"{topic}/{partition}: {reason}")


class OutcomeUnknown(CtpError):
    """I4: an append was sent but whether it was applied could not be learned (the store
    stayed unreachable after the response was lost). The entry may be in the log.
    Re-sending the same records with the same producer id never duplicates them."""

    code = "unknown"

    def __init__(self, topic: str, partition: int, offset: int, cause: str):
        self.topic, self.partition, self.offset, self.cause = topic, partition, offset, cause
        super().__init__(
            f"{topic}/{partition}: the outcome of the append at log offset {offset} is unknown ({cause}); "
            "it may have been written: re-send with the same producer id, which never duplicates"
        )


class ContentionTimeout(CtpError):
    """An append lost the create-if-absent race more times than the retry budget allows."""

    def __init__(self, what: str, attempts: int):
        super().__init__(f"{what}: gave up after {attempts} attempts lost to concurrent writers")


# --- garbage collection ------------------------------------------------------------


class StateUnreadable(CtpError):
    """R9: the GC deletes nothing while any partition's state cannot be read.
    ``problems`` lists ``(topic, partition, why)``."""

    def __init__(self, problems: list[tuple[str, int, str]]):
        self.problems = list(problems)
        shown = "; ".join(f"{t}/{p}: {why}" for t, p, why in self.problems[:3])
        more = f"; and {len(self.problems) - 3} more" if len(self.problems) > 3 else ""
        super().__init__(
            f"GC deleted nothing: the state of {len(self.problems)} partition(s) cannot be read: "
            f"{shown}{more} (run `ctp verify` for the whole picture)"
        )


class GateFailed(CtpError):
    """The Great Expectations checkpoint failed before any delete: the GC deleted nothing.

    ``failures`` lists the failed expectations, one line each; ``statistics`` is the
    checkpoint's summary (evaluated, successful, unsuccessful).
    """

    def __init__(self, failures: list[str], statistics: dict[str, object] | None = None, docs: str | None = None):
        self.failures, self.statistics, self.docs = list(failures), dict(statistics or {}), docs
        shown = "; ".join(self.failures[:3]) + (
            f"; and {len(self.failures) - 3} more" if len(self.failures) > 3 else ""
        )
        super().__init__(f"GC gate failed, nothing deleted: {shown}")
