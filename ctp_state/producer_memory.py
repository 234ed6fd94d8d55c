"""R8 in the fold: what a partition remembers of its idempotent producers.

Per producer id, the last sequence number applied, the epoch it last wrote in and its
newest batches (first sequence, record count, base offset, fingerprint), so a re-sent
batch is recognised and answered with its offset instead of being applied twice, and a
batch that cannot be told apart from new records is refused. The table is bounded: a
producer quiet for longer than the retention may be forgotten once more than
:data:`MAX_PRODUCERS` wrote, and then its next batch is taken as new (Kafka's producer
reset). Pure, like the rest of the fold (:func:`ctp_state.state.apply`, which calls
these for each placeholder).
"""

from __future__ import annotations

from ctp_state.entries import Placeholder
from ctp_state.errors import OutOfOrderSequence, SequenceConflict, UnverifiableDuplicate
from ctp_state.partition_state import PartitionState, ProducerBatch, ProducerSeq

#: R8: a partition remembers every producer that wrote within the last
#: PRODUCER_RETENTION_EPOCHS cluster epochs (a day at the default 5-minute epochs), and
#: older ones while it remembers fewer than MAX_PRODUCERS (least recently written
#: forgotten first); never more than MAX_PRODUCERS_HARD. A re-send is recognised only
#: from a producer the partition still remembers; a forgotten producer's next batch is
#: taken as new (Kafka's producer reset).
MAX_PRODUCERS = 1024
PRODUCER_RETENTION_EPOCHS = 288
MAX_PRODUCERS_HARD = 16384
#: R8: how many of a producer's newest batches are kept to answer a re-send with the
#: batch's offset and to check it holds the same records (Kafka keeps five as well).
PRODUCER_BATCHES = 5


def known(s: PartitionState, producer_id: str | None) -> ProducerSeq | None:
    if producer_id is None:
        return None
    return next((p for p in s.producers if p.producer_id == producer_id), None)


def duplicate_of(s: PartitionState, known: ProducerSeq, e: Placeholder) -> tuple[int | None] | None:
    """R8: ``(base offset,)`` if ``e`` re-sends a batch already applied, None if it is
    new. Raises if it cannot be told apart from new records: part of it is applied
    (:class:`OutOfOrderSequence`, whose ``expected`` says how much), or its numbers were
    applied but the batch is not one the partition can compare (other records under the
    same numbers: :class:`SequenceConflict`; too old or cut differently:
    :class:`UnverifiableDuplicate`)."""
    assert e.sequence is not None  # only placeholders with a producer id reach here
    first, last = e.sequence, e.sequence + e.record_count - 1
    if first > known.last_seq:
        return None
    if last > known.last_seq:
        raise OutOfOrderSequence(s.topic, s.partition, known.producer_id, first, known.last_seq + 1)
    for b in known.batches:
        if (b.first_seq, b.record_count) == (first, e.record_count):
            if b.fingerprint != e.fingerprint:
                raise SequenceConflict(s.topic, s.partition, known.producer_id, first, b.base_offset)
            return (b.base_offset,)
    raise UnverifiableDuplicate(s.topic, s.partition, known.producer_id, first, last)


def remember(
    producers: tuple[ProducerSeq, ...], max_applied_epoch: int, known: ProducerSeq | None, e: Placeholder, base: int
) -> tuple[ProducerSeq, ...]:
    """The producer table after ``e`` (at record offset ``base``) is applied, with
    ``max_applied_epoch`` the partition's applied epoch after it."""
    batch = ProducerBatch(e.sequence, e.record_count, base, e.fingerprint)  # type: ignore[arg-type]
    batches = ((known.batches if known else ()) + (batch,))[-PRODUCER_BATCHES:]
    entry = ProducerSeq(e.producer_id, batch.last_seq, e.epoch, batches)  # type: ignore[arg-type]
    table = tuple(p for p in producers if p.producer_id != e.producer_id) + (entry,)
    if len(table) > MAX_PRODUCERS:
        # Forget the least recently written first, but only producers quiet for longer
        # than the retention (so a re-run or re-send within it is always recognised)...
        horizon = max_applied_epoch - PRODUCER_RETENTION_EPOCHS
        excess = len(table) - MAX_PRODUCERS
        old = {p.producer_id for p in table[:-1] if p.last_epoch < horizon}
        drop = set([p.producer_id for p in table if p.producer_id in old][:excess])
        table = tuple(p for p in table if p.producer_id not in drop)
        table = table[-MAX_PRODUCERS_HARD:]  # ...and a hard bound on memory
    return table
