"""Found by adversarial review, now guarded: re-sending after an unknown outcome with a different batching.

The producer API hands back a verdict per chunk; re-sending is up to the caller, and
``Producer.send``/``flush`` merges everything buffered for a partition into one chunk.
A caller that re-sends the records of an unknown batch together with new records (or
only some of them) gets ``rejected`` (out_of_order_sequence / sequence_conflict,
ctp_state/producer_memory.py ``duplicate_of``) -- while the records of the unknown batch are in
the log. I4: "a rejected record never appears". The verdict is wrong for them, and the
producer stays stuck: every later flush with those records is rejected the same way.
"""

from __future__ import annotations

from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.topics import create_topic
from tests.support import LostResponses, values


def _unknown_but_landed(store, records):
    lossy = LostResponses(store, r"^logs/t/(?:[0-9a-f]{32}/)?000000/", then_unreachable=True)
    with Producer(lossy, epoch_ttl_s=0, producer_id="p") as prod:
        v = prod.write([(("t", 0), records)])[0]
    assert v.outcome == "unknown"
    assert values(store) == [r.value for r in records]  # it landed


def test_a_resend_merged_with_new_records_is_not_reported_rejected_for_records_that_are_in(fstore):
    store = fstore
    create_topic(store, "t", 1)
    old = [Record(b"a"), Record(b"b")]
    _unknown_but_landed(store, old)

    with Producer(store, epoch_ttl_s=0, producer_id="p") as prod:  # restart, same id
        for r in old + [Record(b"c")]:  # re-send, plus what was buffered meanwhile
            prod.send("t", 0, r)
        v = prod.flush()[0]
    stored = values(store)
    # I4: a rejected record never appears.
    assert not (v.outcome == "rejected" and set(stored) & {b"a", b"b"}), (v.outcome, v.reason, stored)


def test_resending_part_of_a_landed_batch_is_not_reported_rejected(fstore):
    store = fstore
    create_topic(store, "t", 1)
    old = [Record(b"a"), Record(b"b"), Record(b"c")]
    _unknown_but_landed(store, old)

    with Producer(store, epoch_ttl_s=0, producer_id="p") as prod:
        v = prod.write([(("t", 0), old[:2])])[0]  # a smaller batch size on the retry
    stored = values(store)
    assert not (v.outcome == "rejected" and set(stored) & {b"a", b"b"}), (v.outcome, v.reason, stored)
