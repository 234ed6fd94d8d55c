"""Issue 9.3 (R8, I4): an append whose outcome cannot be learned is reported as
unknown, never as rejected, and a re-send never duplicates.

The producer resolves a lost response by writing the same bytes to the same offset
again (an identical entry at that offset is its own); when the store stays
unreachable the verdict is ``unknown``. Placeholders carry a producer id and a
per-partition sequence, so the state machine drops a re-sent batch it already
applied, as Kafka's idempotent producer does. ``ctp produce`` derives its producer id
from the input, so running the same command again is safe.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ctp_state.cli import framework as cli
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.read import read_partition
from ctp_state.storage import open_store
from ctp_state.topics import create_topic
from tests.support import LostResponses, space


def values(store, partition: int) -> list[bytes]:
    return [r["value"] for r in read_partition(store, "t", partition).to_pylist()]


def test_a_lost_response_is_resolved_by_rewriting_the_same_entry(store):
    create_topic(store, "t", 2)
    lossy = LostResponses(store, r"^logs/t/(?:[0-9a-f]{32}/)?000001/", times=1)  # one response lost
    with Producer(lossy, epoch_ttl_s=0) as prod:
        a, b = prod.write([(("t", 0), [Record(b"a")]), (("t", 1), [Record(b"b")])])
    assert lossy.lost and a.accepted and b.accepted and b.base_offset == 0
    assert values(store, 1) == [b"b"]


def test_an_unresolvable_outcome_is_unknown_and_a_resend_never_duplicates(store):
    create_topic(store, "t", 2)
    lossy = LostResponses(store, r"^logs/t/(?:[0-9a-f]{32}/)?000001/", then_unreachable=True)  # t/1's log unreachable
    records = [Record(f"b{i}".encode()) for i in range(5)]
    with Producer(lossy, epoch_ttl_s=0, producer_id="p-1") as prod:
        a, b = prod.write([(("t", 0), [Record(b"a")]), (("t", 1), records)])
    assert a.accepted
    assert not b.accepted
    assert getattr(b, "outcome", "rejected") == "unknown", b.error  # not "rejected": it may be in
    assert values(store, 1) == [r.value for r in records]  # (it is: the write persisted)

    with Producer(store, epoch_ttl_s=0, producer_id="p-1") as prod:  # the re-send
        again = prod.write([(("t", 1), records)])[0]
    assert again.accepted and again.outcome == "duplicate" and again.base_offset == 0
    assert values(store, 1) == [r.value for r in records]  # exactly once


def test_a_duplicate_with_other_records_under_the_same_sequence_is_refused(store):
    create_topic(store, "t", 1)
    with Producer(store, epoch_ttl_s=0, producer_id="p-2") as prod:
        assert prod.write([(("t", 0), [Record(b"x")])])[0].accepted
    with Producer(store, epoch_ttl_s=0, producer_id="p-2") as prod:  # same id, other records
        v = prod.write([(("t", 0), [Record(b"not x")])])[0]
    assert v.outcome == "rejected" and v.reason == "sequence_conflict"
    assert values(store, 0) == [b"x"]


def run_produce(args: list[str], store_url: str, env: dict, monkeypatch, wrap=None):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if wrap is not None:
        real = cli.open_store
        monkeypatch.setattr(cli, "open_store", lambda url, env, **kw: wrap(real(url, env, **kw)))
    out = CliRunner().invoke(cli.main, ["produce", *args, "--store", store_url, "--json"])
    monkeypatch.undo()
    return out


@pytest.mark.parametrize("batch", [1, 4])
def test_ctp_produce_reports_unknown_and_running_it_again_stores_each_record_once(
    store, store_url, tmp_path, monkeypatch, batch
):
    url, env = store_url
    create_topic(store, "t", 2)
    lines = [{"topic": "t", "partition": i % 2, "value": f"v{i}"} for i in range(10)]
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))

    first = run_produce(
        [str(path), "--batch-records", str(batch)],
        url,
        env,
        monkeypatch,
        wrap=lambda s: LostResponses(s, r"^logs/t/(?:[0-9a-f]{32}/)?000001/", then_unreachable=True),
    )
    second = run_produce([str(path), "--batch-records", str(batch)], url, env, monkeypatch)
    for p in (0, 1):  # each record exactly once, in order
        assert values(store, p) == [f"v{i}".encode() for i in range(p, 10, 2)]

    assert first.exit_code == 3, first.output
    summary = json.loads(first.output[first.output.index("{") :])
    assert summary["rejected"] == 0 and summary["unknown"] >= 1
    assert summary["accepted"] + summary["unknown"] + summary["not_sent"] == 10
    assert second.exit_code == 0, second.output
    summary2 = json.loads(second.output[second.output.index("{") :])
    assert summary2["accepted"] + summary2["duplicates"] == 10 and summary2["duplicates"] >= 5


def test_ctp_produce_text_output_says_what_to_do_after_an_unknown_outcome(store, store_url, tmp_path, monkeypatch):
    url, env = store_url
    create_topic(store, "t", 1)
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps({"topic": "t", "partition": 0, "value": "v"}) + "\n")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    real = cli.open_store
    monkeypatch.setattr(
        cli, "open_store", lambda u, env, **kw: LostResponses(real(u, env, **kw), r"^logs/", then_unreachable=True)
    )
    out = CliRunner().invoke(cli.main, ["produce", str(path), "--store", url])
    assert out.exit_code == 3
    assert "unknown" in out.output and "run the same command again" in out.output
    assert open_store(url, env)  # the store itself is fine


# --- the same over the wire: S3 through the fault-injecting proxy -----------------------


def test_over_the_wire_a_lost_response_resolves_to_accepted(s3_server, fault_proxy, fault_env):
    url = s3_server.url()
    store = open_store(url, s3_server.env)
    create_topic(store, "t", 2)
    fault_proxy.add_rule("reset_after", method="PUT", key_regex=f"logs/{space(store)}/000001/", times=1)
    lossy = open_store(url, {**fault_env, "CTP_S3_MAX_ATTEMPTS": "1"})
    with Producer(lossy, epoch_ttl_s=0) as prod:
        a, b = prod.write([(("t", 0), [Record(b"a")]), (("t", 1), [Record(b"b")])])
    assert fault_proxy.injected["reset_after"] == 1
    assert a.accepted and b.accepted and b.base_offset == 0 and not b.duplicate
    assert values(store, 1) == [b"b"]


def test_ctp_produce_over_a_connection_that_drops_after_each_write(s3_server, fault_proxy, fault_env, tmp_path):
    import os
    import subprocess

    url = s3_server.url()
    store = open_store(url, s3_server.env)
    create_topic(store, "t", 2)
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps({"topic": "t", "partition": i % 2, "value": f"v{i}"}) + "\n" for i in range(12)))
    # Every state-log PUT of t/1 reaches the server, then the connection drops.
    fault_proxy.add_rule("reset_after", method="PUT", key_regex=f"logs/{space(store)}/000001/")
    cmd = ["ctp", "produce", str(path), "--batch-records", "4", "--store", url, "--json"]
    first = subprocess.run(
        cmd, env={**os.environ, **fault_env, "CTP_S3_MAX_ATTEMPTS": "2"}, capture_output=True, text=True, timeout=300
    )
    assert first.returncode == 3, first.stderr
    out = json.loads(first.stdout)
    assert out["unknown"] >= 1 and out["rejected"] == 0 and fault_proxy.injected["reset_after"] >= 2

    second = subprocess.run(cmd, env={**os.environ, **s3_server.env}, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    out2 = json.loads(second.stdout)
    assert out2["producer_id"] == out["producer_id"] and out2["duplicates"] >= 1
    for p in (0, 1):
        assert values(store, p) == [f"v{i}".encode() for i in range(p, 12, 2)]


def test_after_an_unknown_outcome_that_landed_the_producer_moves_on(store):
    """Library use: the unknown batch did land; the producer, not knowing, sends other
    records under the same numbers: they are refused (not written), and the producer
    continues after what the log holds, so its next batch is written."""
    create_topic(store, "t", 1)
    lossy = LostResponses(store, r"^logs/t/(?:[0-9a-f]{32}/)?000000/", times=None, then_unreachable=True)
    with Producer(lossy, epoch_ttl_s=0, producer_id="p-3") as prod:
        assert prod.write([(("t", 0), [Record(b"landed")])])[0].outcome == "unknown"
        prod.store = store  # the network comes back (same writers, same sequence numbers)
        for w in prod._writers.values():
            w.log.store = store
        other = prod.write([(("t", 0), [Record(b"other")])])[0]
        assert other.outcome == "rejected" and other.reason == "sequence_conflict"
        again = prod.write([(("t", 0), [Record(b"other")])])[0]
        assert again.outcome == "accepted" and again.base_offset == 1
    assert values(store, 0) == [b"landed", b"other"]
