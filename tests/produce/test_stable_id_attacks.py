"""Found by adversarial review, now guarded: a producer that restarts with the same configured id (the Kafka habit of a
stable ``transactional.id``) and sends NEW records.

A new ``PartitionWriter`` starts at sequence 0 (ctp_state/producer.py). Once the
partition keeps only the newest PRODUCER_BATCHES batches of that id, a new batch whose
sequence range is older than them is taken for a re-send "applied long ago"
(ctp_state/producer_memory.py ``duplicate_of`` returns ``(None,)`` without any fingerprint to
compare) and reported as a duplicate: ``Verdict.accepted`` is True ("the records are in
the log exactly once") for records that were never stored. I4: an accepted record must
appear. The contract says two producers must never share an id, but a restarted process
is indistinguishable from a re-send, and the verdict claims a certainty it does not have.
"""

from __future__ import annotations

from ctp_state import producer_memory
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.topics import create_topic
from tests.support import values


def test_new_records_under_a_reused_producer_id_are_never_reported_accepted_if_dropped(fstore):
    store = fstore
    create_topic(store, "t", 1)
    with Producer(store, epoch_ttl_s=0, producer_id="billing-service") as prod:
        for i in range(producer_memory.PRODUCER_BATCHES + 1):
            assert prod.write([(("t", 0), [Record(f"day1-{i}".encode())])])[0].accepted

    with Producer(store, epoch_ttl_s=0, producer_id="billing-service") as prod:  # restarted next day
        v = prod.write([(("t", 0), [Record(b"day2-0")])])[0]
    stored = values(store)
    assert not (v.accepted and b"day2-0" not in stored), (
        f"verdict {v.outcome!r} (accepted={v.accepted}) but the record is not in the log"
    )
