"""Topic incarnations: each ``topic create`` mints an id sealed into the topic's
metadata, and what ctp records about a topic says which incarnation it was about.

Until ``ctp topic delete`` exists, operators delete a topic by removing its keys by
hand (:func:`remove_by_hand`, as docs/failure-model.md describes); the scenarios below
are what that cost before ids (issue: topic identity, scenarios 2 and 5).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from ctp_state import codec, layout
from ctp_state.errors import CorruptData
from ctp_state.topics import Topic, create_topic, encode_meta, get_topic, list_topics
from tests.support import key_id, values
from tests.support.topics import remove_by_hand


def test_create_mints_an_incarnation_id_that_a_rerun_keeps_and_list_shows(store, subprocess_env):
    t = create_topic(store, "t", 2)
    assert t.id is not None and len(t.id) == 32 and int(t.id, 16) >= 0
    assert create_topic(store, "t", 2, exist_ok=True).id == t.id == get_topic(store, "t").id
    assert create_topic(store, "u", 1).id != t.id
    r = subprocess.run(["ctp", "topic", "list", "--json"], env=subprocess_env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert {x["topic"]: x["id"] for x in json.loads(r.stdout)} == {"t": t.id, "u": get_topic(store, "u").id}
    remove_by_hand(store, "t")
    assert create_topic(store, "t", 2).id != t.id  # a new incarnation


def test_a_topic_written_before_ids_reads_as_its_legacy_incarnation(store):
    """Metadata version 2 (today's stores): no id, still a topic; rerunning the create
    neither fails nor changes it."""
    store.put(layout.topic_meta("old"), encode_meta(Topic("old", 1, 1_700_000_000_000)))
    assert get_topic(store, "old").id is None and get_topic(store, "old").incarnation == "legacy"
    assert create_topic(store, "old", 1, exist_ok=True).id is None
    assert [t.name for t in list_topics(store)] == ["old"]


def test_an_id_that_is_not_32_hex_digits_is_refused_naming_the_key(store):
    body = {"v": 3, "name": "t", "partitions": 1, "created_ms": 1, "id": "not-an-id"}
    store.put(layout.topic_meta("t"), codec.seal(body))
    with pytest.raises(CorruptData, match=r"meta/topics/t\.json.*incarnation id"):
        get_topic(store, "t")


def produce(env, path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ctp", "produce", str(path), "--json"], env=env, capture_output=True, text=True, timeout=120)


def test_rerunning_produce_into_a_recreated_topic_writes_the_records_again(store, subprocess_env, tmp_path):
    """Scenario 2: the completion marker of the first run was believed for the new
    incarnation: "every record already written", exit 0, and the topic held none."""
    create_topic(store, "t", 2)
    rows = [{"topic": "t", "partition": i % 2, "value": f"v{i}"} for i in range(10)]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    first = produce(subprocess_env, path)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["accepted"] == 10
    remove_by_hand(store, "t")
    create_topic(store, "t", 2)
    again = produce(subprocess_env, path)
    assert again.returncode == 0, again.stderr
    out = json.loads(again.stdout)
    assert out["accepted"] == 10 and out["duplicates"] == 0, out
    assert "deleted and created again" in again.stderr
    assert sorted(values(store, "t", 0) + values(store, "t", 1)) == sorted(f"v{i}".encode() for i in range(10))
    # and the marker now vouches for this incarnation: a third run writes nothing
    third = json.loads(produce(subprocess_env, path).stdout)
    assert third["accepted"] == 0 and third["duplicates"] == 10, third


def test_a_recreated_topic_does_not_inherit_the_old_ones_l1_watermark(store, gate):
    """Scenario 5: the GC's view of t/0 said every L1 file up to offset 19 was checked;
    the re-created t's first file (offsets 0-19 again) was never read, so the gate passed
    with it damaged and the GC deleted its L0 source."""
    from ctp_state.epoch import ClusterEpoch
    from ctp_state.errors import GateFailed
    from ctp_state.gc import run_gc
    from ctp_state.l0 import Record
    from ctp_state.producer import Producer
    from ctp_state.reconcile import run_reconcile

    def load(tag: str) -> None:
        with Producer(store, epoch_ttl_s=0) as prod:
            v = prod.write([(("t", 0), [Record(f"{tag}{i}".encode(), None, 1000 + i) for i in range(20)])])[0]
            assert v.accepted

    def settle() -> None:
        for _ in range(3):
            ce.advance()
        run_reconcile(store)

    create_topic(store, "t", 1)
    ce = ClusterEpoch(store)
    ce.advance()
    load("old-")
    run_reconcile(store)
    settle()
    assert run_gc(store, gate=gate).status == "ok"  # its view: t/0 swept through offset 19
    remove_by_hand(store, "t")
    create_topic(store, "t", 1)
    load("new-")
    run_reconcile(store)
    l1 = layout.l1_key("t", 0, 0, 19, key_id(store, "t"))
    data = bytearray(store.get(l1))
    data[len(data) // 2] ^= 0x10  # bit rot in the new incarnation's first file
    store.put(l1, bytes(data))
    l0_before = [o.key for o in store.list(layout.L0_ROOT)]
    settle()
    with pytest.raises(GateFailed, match="checksums_ok"):
        run_gc(store, gate=gate)  # the new file is read whole before its L0 source goes
    assert [o.key for o in store.list(layout.L0_ROOT)] == l0_before


@pytest.mark.parametrize("legacy_topic", [True, False])
def test_a_marker_written_before_ids_vouches_only_for_a_topic_created_before_them(
    store, subprocess_env, tmp_path, legacy_topic
):
    """A store written by the previous version: version 1 markers (no incarnations). One
    is believed for a legacy topic (nothing is written twice) and ignored for a topic
    with an id (which cannot be the topic it was written into)."""
    if legacy_topic:
        store.put(layout.topic_meta("t"), encode_meta(Topic("t", 1, 1_700_000_000_000)))
        from ctp_state.entries import Init, encode
        from ctp_state.epoch import ClusterEpoch

        store.put_if_absent(
            layout.log_entry("t", 0, 0, key_id(store, "t")), encode(Init(ClusterEpoch(store).current()))
        )
    else:
        create_topic(store, "t", 1)
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"topic": "t", "partition": 0, "value": f"v{i}"}) + "\n" for i in range(4)))
    first = json.loads(produce(subprocess_env, path).stdout)
    assert first["accepted"] == 4
    marker = layout.produce_marker(first["producer_id"])
    body = codec.unseal(store.get(marker), marker, "produce marker")
    old = {k: v for k, v in body.items() if k != "topics"} | {"v": 1}
    store.put(marker, codec.seal(old))
    again = produce(subprocess_env, path)
    out = json.loads(again.stdout)
    assert out["accepted"] == 0 and out["duplicates"] == 4  # never written twice either way
    assert (out["completed_before"] is not None) == legacy_topic, out  # the shortcut only for legacy
    assert values(store, "t", 0) == [f"v{i}".encode() for i in range(4)]
