"""The partition state log against real stores: the cost of reading a state, exclusive
claims and waiting for them, and a lost response's retry. (Epoch reads: tests/epoch;
topic creation: tests/topics; what a reconcile writes to a log: tests/reconcile.)"""

from __future__ import annotations

import threading
import time

import pytest

from ctp_state.entries import AccessMode, Placeholder, encode
from ctp_state.errors import ClaimHeld
from ctp_state.partition_log import PartitionLog
from ctp_state.topics import create_topic, get_topic
from tests.support import CountingStore, plog


def ph(epoch: int, i: int) -> Placeholder:
    return Placeholder(epoch, f"l0/000/{epoch:018d}/{i}.l0", 8, 10, 1, 0)


def test_reading_state_costs_a_snapshot_get_one_list_and_the_tail(store):
    create_topic(store, "t", 1)
    log = plog(store, "t", 0, snapshot_every=16)
    s = log.read_state()
    for i in range(200):
        s = log.append(s, lambda _s, i=i: ph(1, i)).outcome.state
    # Appenders never snapshot (their states hold entries they never read back): the
    # first reader folds all 201 entries from the store and leaves a snapshot.
    assert plog(store, "t", 0).read_snapshot().applied_offset == -1
    first = CountingStore(store)
    assert PartitionLog(first, get_topic(store, "t"), 0, snapshot_every=16).read_state() == s
    assert first.counts == {"get": 1 + 201, "list": 1, "put": 1}
    for i in range(10):  # a tail shorter than snapshot_every
        s = log.append(s, lambda _s, i=i: ph(1, 200 + i)).outcome.state
    counting = CountingStore(store)
    fresh = PartitionLog(counting, get_topic(store, "t"), 0, snapshot_every=16).read_state()
    assert fresh == s and fresh.applied_offset == 210
    tail = 210 - plog(store, "t", 0).read_snapshot().applied_offset
    assert tail == 10
    # the snapshot, the entry it ends at (its bytes must still be there), the tail entries
    assert counting.counts == {"get": 2 + tail, "list": 1}


def test_exclusive_claim_fails_at_once_and_wait_for_exclusive_waits_for_release(store):
    create_topic(store, "t", 1)
    a = plog(store, "t", 0)
    held = a.claim(a.read_state(), "reconciler-a", AccessMode.EXCLUSIVE, lease_ms=60_000)
    assert held.outcome.accepted and held.outcome.state.writer_epoch == 1
    b = plog(store, "t", 0)
    t0 = time.monotonic()
    with pytest.raises(ClaimHeld) as e:
        b.claim(b.read_state(), "reconciler-b", AccessMode.EXCLUSIVE)
    assert time.monotonic() - t0 < 5 and e.value.owner == "reconciler-a"

    def release_soon() -> None:
        time.sleep(0.5)
        a.release(a.read_state(), "reconciler-a", 1)

    threading.Thread(target=release_soon).start()
    got = b.claim(b.read_state(), "reconciler-b", AccessMode.WAIT_FOR_EXCLUSIVE, wait_timeout_s=20)
    assert got.outcome.accepted and got.outcome.state.writer_epoch == 2
    assert [h.owner for h in got.outcome.state.holders] == ["reconciler-b"]


def test_wait_for_exclusive_gives_up_after_its_timeout(store):
    create_topic(store, "t", 1)
    a = plog(store, "t", 0)
    a.claim(a.read_state(), "a", AccessMode.EXCLUSIVE, lease_ms=600_000)
    with pytest.raises(ClaimHeld):
        a.claim(a.read_state(), "b", AccessMode.WAIT_FOR_EXCLUSIVE, wait_timeout_s=0.3)


def test_lost_response_retry_does_not_duplicate_the_entry(store):
    create_topic(store, "t", 1)
    log = plog(store, "t", 0)
    s = log.read_state()
    entry = ph(1, 0)
    store.put_if_absent(log.key(1), encode(entry, prev=s.last_crc))  # our PUT landed, its response was lost
    appended = log.append(s, lambda _s: entry)  # the retry finds its own bytes there
    assert appended.offset == 1 and appended.outcome.accepted
    assert [o for o, _ in log.entries()] == [0, 1]
