"""HELD: ``ctp produce`` edges that behaved.

* Timestamps exactly at the bounds (0 and 9999-12-31T23:59:59.999Z) are accepted, survive
  reconcile into L1 and read back exactly; one past the upper bound is refused before
  anything is written.
* Explicit producer ids made of the unusual characters the format allows (``...``,
  ``-x``, ``_``, 128 characters) are accepted, their marker keys work, and a re-run
  writes nothing twice.
* Two ``ctp produce`` runs of the same file, one seeing an unknown outcome on a
  partition while the other writes: each record at most once (all of them once a run
  exits 0, or after a third run), and neither run exits 1: a record one run did not
  write is never "rejected", the other run or the re-run may write it
  (``test_twin_run_attacks.py`` pins the interleavings).
"""

from __future__ import annotations

import itertools
import json
import threading

import pytest
from click.testing import CliRunner

from ctp_state.cli import framework as cli
from ctp_state.epoch import ClusterEpoch
from ctp_state.read import read_partition
from ctp_state.reconcile import run_reconcile
from ctp_state.topics import create_topic
from ctp_state.validate import MAX_TIMESTAMP_MS
from tests.support import LostResponses, values


def _produce(args, url):
    return CliRunner().invoke(cli.main, ["produce", *args, "--store", url, "--json"])


def test_timestamps_at_the_bounds_round_trip_through_l1(fstore, tmp_path):
    store = fstore
    create_topic(store, "t", 1)
    path = tmp_path / "in.jsonl"
    path.write_text(
        "".join(
            json.dumps({"topic": "t", "partition": 0, "value": f"v{ts}", "timestamp": ts}) + "\n"
            for ts in (0, MAX_TIMESTAMP_MS)
        )
    )
    out = _produce([str(path)], store.url)
    assert out.exit_code == 0, out.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"topic": "t", "partition": 0, "value": "x", "timestamp": MAX_TIMESTAMP_MS + 1}) + "\n")
    assert _produce([str(bad)], store.url).exit_code == 1
    ClusterEpoch(store).advance()
    run_reconcile(store)
    t = read_partition(store, "t", 0)
    ms = [us // 1000 for us in t.column("timestamp").cast("int64").to_pylist()]  # L1 holds microseconds
    assert ms == [0, MAX_TIMESTAMP_MS] and t.column("value").to_pylist() == [b"v0", f"v{MAX_TIMESTAMP_MS}".encode()]
    read = CliRunner().invoke(cli.main, ["read", "t", "0", "--store", store.url, "--json"])
    assert read.exit_code == 0, read.output


@pytest.mark.parametrize("pid", ["...", "-x", "_", "a" * 111, "A.b-C_9"])
def test_unusual_producer_ids_rerun_without_duplicates(fstore, tmp_path, pid):
    store = fstore
    create_topic(store, "t", 1)
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"topic": "t", "partition": 0, "value": f"v{i}"}) + "\n" for i in range(3)))
    first = _produce([str(path), f"--producer-id={pid}"], store.url)
    second = _produce([str(path), f"--producer-id={pid}"], store.url)
    assert first.exit_code == 0 and second.exit_code == 0, (first.output, second.output)
    assert values(store) == [b"v0", b"v1", b"v2"]


def test_two_runs_of_one_file_one_seeing_an_unknown_outcome(fstore, tmp_path, monkeypatch):
    store = fstore
    create_topic(store, "t", 2)
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"topic": "t", "partition": i % 2, "value": f"v{i}"}) + "\n" for i in range(40)))
    real = cli.open_store
    opened = itertools.count()  # next() is atomic: exactly one run is the lossy one

    def wrap(u, env, **kw):
        first = next(opened) == 0
        s = real(u, env, **kw)
        # the first run to open the store loses responses on t/1 and then cannot reach it
        return LostResponses(s, r"^logs/t/(?:[0-9a-f]{32}/)?000001/", then_unreachable=True) if first else s

    monkeypatch.setattr(cli, "open_store", wrap)
    outs: list = [None, None]

    def run(i):
        outs[i] = _produce([str(path), "--batch-records", "4"], store.url)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    monkeypatch.undo()
    codes = sorted(o.exit_code for o in outs)
    # (concurrent CliRunner invocations share sys.stdout: an output may hold the other's)
    assert codes in ([0, 0], [0, 3], [3, 3]), [o.output for o in outs]
    for p in (0, 1):
        # Both runs may stop a partition (one cannot reach it, the other's batch partly
        # overlapped the first one's): then it is unfinished and both exit 3.
        got, want = values(store, "t", p), [f"v{i}".encode() for i in range(p, 40, 2)]
        assert got == want[: len(got)] and (got == want or 0 not in codes), (p, codes, got)
    again = _produce([str(path), "--batch-records", "4"], store.url)
    assert again.exit_code == 0, again.output
    for p in (0, 1):
        assert values(store, "t", p) == [f"v{i}".encode() for i in range(p, 40, 2)]


@pytest.mark.parametrize("pid, why", [("a" * 112, "at most 111"), ("a/b", "letters, digits")])
def test_a_producer_id_that_cannot_name_a_producer_is_a_one_line_error(fstore, tmp_path, pid, why):
    create_topic(fstore, "t", 1)
    path = tmp_path / "in.jsonl"
    path.write_text('{"topic": "t", "partition": 0, "value": "v"}\n')
    out = CliRunner().invoke(cli.main, ["produce", str(path), "--producer-id", pid, "--store", fstore.url])
    assert out.exit_code == 1 and why in out.output and out.output.startswith("error: --producer-id")
    assert not list(fstore.list("l0/"))
