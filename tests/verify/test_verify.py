"""``ctp verify``: every entry's and snapshot's checksum, snapshot/log agreement, offset 0,
and every referenced L0/L1 object, reported per partition, with nothing changed."""

from __future__ import annotations

import json

from click.testing import CliRunner

from ctp_state import codec, layout
from ctp_state.cli import main
from ctp_state.entries import Placeholder, encode
from ctp_state.epoch import ClusterEpoch
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.reconcile import run_reconcile
from ctp_state.topics import create_topic
from ctp_state.verify import verify
from tests.support import key_id, plog
from tests.support.topics import crashed_create


def populated(store) -> None:
    """t (2 partitions): reconciled data in L1, then more pending in L0, snapshots."""
    create_topic(store, "t", 2)
    ce = ClusterEpoch(store)
    with Producer(store, epoch_ttl_s=0) as prod:
        for r in range(3):
            ce.advance()
            for v in prod.write([(("t", p), [Record(f"{r}-{p}-{i}".encode()) for i in range(3)]) for p in range(2)]):
                assert v.accepted
        run_reconcile(store)
        ce.advance()
        for v in prod.write([(("t", p), [Record(b"pending")]) for p in range(2)]):
            assert v.accepted
    for p in range(2):
        log = plog(store, "t", p)
        log.write_snapshot(log.read_state())


def snapshot_of_store(store) -> dict[str, bytes]:
    return {o.key: store.get(o.key) for o in store.list("")}


def errors(report) -> list[tuple[str, str | None]]:
    return [(f.where, f.key) for f in report.errors]


def test_a_healthy_store_verifies_clean(store):
    populated(store)
    report = verify(store)
    assert report.ok and not report.findings, report.findings
    assert [p.entries > 0 and p.l0_checked == 1 and p.l1_checked == 1 for p in report.partitions] == [True, True]


def test_every_kind_of_damage_is_reported_and_nothing_is_changed(store):
    populated(store)
    s0, s1 = plog(store, "t", 0).read_state(), plog(store, "t", 1).read_state()
    # t/0: an entry the snapshot covers goes bad, and a pending chunk's L0 object is lost.
    covered = layout.log_entry("t", 0, 2, key_id(store, "t"))
    store.put(covered, store.get(covered).replace(b'"epoch":', b'"epoch":1', 1))
    store.delete_many([s0.pending[0].l0_key])
    # t/1: the snapshot's lower bound flipped; a committed L1 file is lost.
    snap1 = layout.snapshot("t", 1, key_id(store, "t"))
    store.put(snap1, store.get(snap1).replace(b'"min_epoch_lower_bound":', b'"min_epoch_lower_bound":9', 1))
    (l1,) = s1.committed_l1_keys()
    store.delete_many([l1])
    # The epoch hint says 77, with no marker.
    store.put(layout.EPOCH_HINT, json.dumps({"epoch": 77}).encode())
    before = snapshot_of_store(store)

    report = verify(store)
    assert snapshot_of_store(store) == before  # verify changed nothing
    found = {(f.where, f.key): f.what for f in report.findings}
    assert "the snapshot at offset" in found[("t/0", covered)] and "fails its CRC32C" in found[("t/0", covered)]
    assert "missing" in found[("t/0", s0.pending[0].l0_key)]
    assert "missing" in found[("t/1", s0.pending[0].l0_key)]  # one flush: both partitions' chunks
    assert "snapshot does not check out" in found[("t/1", snap1)]
    assert "committed L1 file is missing" in found[("t/1", l1)]
    assert "not vouched" in found[("cluster", layout.EPOCH_HINT)]
    assert not report.ok and len(report.errors) == 5


def test_a_snapshot_that_disagrees_with_its_log_is_reported(store):
    populated(store)
    key = layout.snapshot("t", 0, key_id(store, "t"))
    body = codec.unseal(store.get(key), key)
    body["writer_epoch"] += 5  # checksum and self-consistency still hold
    store.put(key, codec.seal(body))
    report = verify(store)
    assert errors(report) == [("t/0", key)]
    assert "disagrees with a replay" in report.errors[0].what


def test_offset_0_damage_is_a_warning_once_repaired_and_an_error_before(store):
    crashed_create(store, "t", 2, with_init=(0,))
    key = layout.l0_key(0, 1, "old")
    store.put(key, b"x" * 20)
    store.put_if_absent(layout.log_entry("t", 1, 0, key_id(store, "t")), encode(Placeholder(1, key, 8, 10, 1, 0)))
    report = verify(store)
    assert ("t/1", None) in errors(report) and "no init entry" in report.errors[0].what
    create_topic(store, "t", 2, exist_ok=True)
    report = verify(store)
    assert report.ok
    assert any("offset 0 is not the init entry" in f.what for f in report.findings)


def test_version_1_entries_are_counted_as_unchecked(store):
    create_topic(store, "t", 1)
    store.put_if_absent(
        layout.log_entry("t", 0, 1, key_id(store, "t")),
        json.dumps({"v": 1, "kind": "advance", "epoch": 1, "writer_epoch": 1}).encode(),
    )
    report = verify(store)
    assert report.partitions[0].unchecksummed == 1
    assert any("before checksums" in f.what for f in report.findings)


def test_ctp_verify_prints_findings_and_exits_1_on_errors(store, store_url, monkeypatch):
    url, env = store_url
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    populated(store)
    ok = CliRunner().invoke(main, ["verify", "--store", url])
    assert ok.exit_code == 0, ok.output
    assert "checked 2 partitions" in ok.output and "0 errors" in ok.output
    store.delete_many([plog(store, "t", 1).read_state().committed_l1_keys()[0]])
    bad = CliRunner().invoke(main, ["verify", "--store", url, "--json"])
    assert bad.exit_code == 1
    out = json.loads(bad.output[: bad.output.rindex("}") + 1])
    assert out["ok"] is False and out["errors"] == 1
    assert [p["ok"] for p in out["partitions"]] == [True, False]


def test_ctp_gc_verify_stops_before_any_delete(store, store_url, monkeypatch, tmp_path):
    url, env = store_url
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    populated(store)
    for _ in range(3):
        ClusterEpoch(store).advance()
    run_reconcile(store)
    store.delete_many([plog(store, "t", 0).read_state().committed_l1_keys()[0]])
    before = {o.key for o in store.list(layout.L0_ROOT)}
    out = CliRunner().invoke(main, ["gc", "--verify", "--store", url, "--report-dir", str(tmp_path / "r")])
    assert out.exit_code == 1 and "verify found 1 problem(s), nothing deleted" in out.output
    assert {o.key for o in store.list(layout.L0_ROOT)} == before
