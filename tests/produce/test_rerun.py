"""Running ``ctp produce FILE`` again after its partitions forgot the producer resends
nothing the log already holds (issue: topic identity, scenario 3).

A partition remembers a producer for a day of epochs, and beyond that only while fewer
than MAX_PRODUCERS others wrote to it (``ctp_state.producer_memory``). Before, a re-run of an
incomplete input into a partition that had forgotten its producer id was told "0 records
held" and sent every record again: all the acknowledged ones became duplicates, not only
the one batch whose outcome the first run could not learn. Now every run leaves a
progress record, and a re-run the partition cannot answer resumes from it, reading only
the log entries appended since to learn the fate of the batches that were in flight.

The partitions' memory is made small here (4 producers, 2 epochs; the same fold in every
process, through ``CTP_TEST_PRODUCER_MEMORY``) so that forgetting takes a few appends.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from ctp_state import layout, producer_memory
from ctp_state.entries import Placeholder
from ctp_state.epoch import ClusterEpoch
from ctp_state.ingest import input_digest, input_producer_id
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.topics import create_topic
from tests.support import plog, values
from tests.support.produce import LoseAfter, NeverLands, produce

MEMORY = (4, 2)  # MAX_PRODUCERS, PRODUCER_RETENTION_EPOCHS in every process of these tests


@pytest.fixture(autouse=True)
def small_memory(monkeypatch):
    monkeypatch.setattr(producer_memory, "MAX_PRODUCERS", MEMORY[0])
    monkeypatch.setattr(producer_memory, "PRODUCER_RETENTION_EPOCHS", MEMORY[1])


def the_input(n: int = 12) -> tuple[bytes, list[tuple[str, int, Record]]]:
    lines = [{"topic": "t", "partition": i % 2, "value": f"v{i}"} for i in range(n)]
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    return data, [(x["topic"], x["partition"], Record(x["value"].encode())) for x in lines]


def forget(store, producer_id: str, partitions=(0, 1)) -> None:
    """Move the cluster epoch past the retention and have more than MAX_PRODUCERS other
    producers write to each partition: each then forgets ``producer_id``."""
    ce = ClusterEpoch(store)
    for _ in range(MEMORY[1] + 1):
        ce.advance()
    for i in range(MEMORY[0] + 1):
        with Producer(store, epoch_ttl_s=0, append_threads=1, producer_id=f"other-{i}") as other:
            verdicts = other.write([(("t", p), [Record(f"noise-{i}".encode())]) for p in partitions])
            assert all(v.accepted for v in verdicts)
    for p in partitions:
        st = plog(store, "t", p).read_state()
        assert producer_id not in {x.producer_id for x in st.producers}, f"t/{p} still remembers it"


def mine(store, p: int) -> list[bytes]:
    return [v for v in values(store, "t", p) if v.startswith(b"v")]


def expected(p: int, n: int = 12) -> list[bytes]:
    return [f"v{i}".encode() for i in range(n) if i % 2 == p]


def test_a_rerun_after_the_partition_forgot_the_producer_resends_nothing_it_holds(store):
    """First run: t/0's third batch lands but its response is lost (unknown), so the run
    is incomplete. The partitions forget the producer. The re-run must write only what
    the log does not hold -- here nothing."""
    create_topic(store, "t", 2)
    data, records = the_input()
    lossy = LoseAfter(store, r"^logs/t/(?:[0-9a-f]{32}/)?000000/", ok=2)
    first = produce(lossy, data, records)
    assert (first.accepted, first.unknown, first.complete) == (10, 2, False), first.as_dict()

    forget(store, first.producer_id)

    second = produce(store, data, records)
    assert mine(store, 0) == expected(0) and mine(store, 1) == expected(1), second.as_dict()
    assert second.complete and (second.duplicates, second.accepted) == (12, 0), second.as_dict()


def test_a_rerun_after_the_partition_forgot_the_producer_writes_what_never_landed(store):
    """The same, but the batch whose response was lost never landed (the request did
    not reach the store): the re-run writes exactly that batch and the records after it."""
    create_topic(store, "t", 2)
    data, records = the_input()

    first = produce(NeverLands(store, r"^logs/t/(?:[0-9a-f]{32}/)?000000/", ok=2), data, records)
    assert not first.complete and first.accepted == 10, first.as_dict()
    forget(store, first.producer_id)

    second = produce(store, data, records)
    assert mine(store, 0) == expected(0) and mine(store, 1) == expected(1), second.as_dict()
    assert second.complete and (second.duplicates, second.accepted) == (10, 2), second.as_dict()


def test_a_rerun_of_a_killed_ctp_produce_after_the_partition_forgot_it(store, subprocess_env, tmp_path):
    """``ctp produce`` killed (SIGKILL) right after its second flush was acknowledged and
    before it recorded its progress; the partitions forget it; the re-run, a new process,
    resends nothing the log holds and completes."""
    create_topic(store, "t", 2)
    data, _ = the_input()
    path = tmp_path / "in.jsonl"
    path.write_bytes(data)
    env = {**subprocess_env, "CTP_TEST_PRODUCER_MEMORY": ",".join(map(str, MEMORY))}
    cmd = ["setsid", "ctp", "produce", str(path), "--batch-records", "4", "--json"]
    r = subprocess.run(cmd, env={**env, "CTP_FAULT": "produce_after_flush:1"}, capture_output=True, text=True)
    assert r.returncode in (-9, 137), (r.returncode, r.stderr[-2000:])
    assert len(mine(store, 0)) == 4  # two flushes landed

    forget(store, input_producer_id(input_digest(data)))

    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert (out["duplicates"], out["accepted"]) == (8, 4), out
    assert mine(store, 0) == expected(0) and mine(store, 1) == expected(1)


def test_progress_of_a_deleted_incarnation_is_not_believed(store):
    """A progress record names the incarnation it was written into: after the topic is
    deleted and created again, a re-run writes every record into the new one."""
    from ctp_state.deletion import delete_topic

    create_topic(store, "t", 2)
    data, records = the_input()
    first = produce(LoseAfter(store, r"^logs/t/(?:[0-9a-f]{32}/)?000000/", ok=2), data, records)
    assert not first.complete
    delete_topic(store, "t")
    create_topic(store, "t", 2)
    second = produce(store, data, records)
    assert second.complete and second.accepted == 12, second.as_dict()
    assert mine(store, 0) == expected(0) and mine(store, 1) == expected(1)
    assert store.head(layout.produce_progress(first.producer_id)) is not None


def a_stale_entry_after_the_progress(store) -> tuple[bytes, list, str]:
    """t/0 holds 2 of the input's 6 records (then its store went away); after the run,
    other producers applied epochs E+1 and E+2, and an entry of the input's producer id
    under epoch E landed (a request that was stuck on the wire): stale for the fold, but
    the progress trace cannot prove it."""
    create_topic(store, "t", 2)
    data, records = the_input()
    e = ClusterEpoch(store).current()
    first = produce(NeverLands(store, r"^logs/t/(?:[0-9a-f]{32}/)?000000/", ok=1), data, records)
    assert (first.accepted, first.complete) == (8, False), first.as_dict()
    ce = ClusterEpoch(store)
    for i in range(2):
        ce.advance()
        with Producer(store, epoch_ttl_s=0, producer_id=f"later-{i}") as other:
            assert other.write([(("t", 0), [Record(b"noise")])])[0].accepted
    lg = plog(store, "t", 0)
    late = Placeholder(e, f"l0/000/{e:018d}/{'f' * 32}.l0", 0, 1, 2, 0, None, first.producer_id, 2, 0)
    assert not lg.append(lg.read_state(), lambda s: late).outcome.accepted  # the fold: stale
    forget(store, first.producer_id)
    return data, records, first.producer_id


def test_an_entry_the_progress_cannot_decide_is_settled_by_replaying_the_log(store):
    data, records, _ = a_stale_entry_after_the_progress(store)
    second = produce(store, data, records)
    assert second.complete and (second.duplicates, second.accepted) == (8, 4), second.as_dict()
    assert mine(store, 0) == expected(0) and mine(store, 1) == expected(1)


def test_beyond_the_replay_limit_the_batch_in_doubt_is_reported_with_its_offset(store):
    """The bound docs/failure-model.md states: what a re-run cannot settle is one entry
    per partition, reported unknown with its log offset; nothing after it is sent and
    nothing is written twice. A re-run allowed to replay then finishes the input."""
    data, records, pid = a_stale_entry_after_the_progress(store)
    second = produce(store, data, records, replay_limit=0)
    (doubt,) = second.in_doubt
    assert (doubt.topic, doubt.partition, doubt.first_seq, doubt.last_seq) == ("t", 0, 2, 3)
    assert second.as_dict()["in_doubt"] == [vars(doubt)]  # as `ctp produce --json` prints it
    late = plog(store, "t", 0).key(doubt.log_offset)
    assert pid in store.get(late).decode()  # the offset names the entry in doubt
    assert (second.duplicates, second.unknown, second.not_sent, second.accepted) == (8, 2, 2, 0), second.as_dict()
    assert "may be in the log" in second.first_error and not second.complete
    assert mine(store, 0) == [b"v0", b"v2"] and mine(store, 1) == expected(1)

    third = produce(store, data, records)  # the default limit
    assert third.complete and mine(store, 0) == expected(0), third.as_dict()
