"""``ctp produce`` run again: what the completion marker and ``resume`` promise.

1. The completion marker ``runs/produce/<id>.json`` (ctp_state/ingest.py
   ``produce_input``) is keyed by the producer id alone, and any marker makes the run
   report every record of the input as "already written" and exit 0 -- without
   comparing the input with what the marker recorded (record count, partitions). With
   ``--producer-id`` (the CLI offers it; a stable name per job is the Kafka habit),
   the second day's file is reported written and nothing is written: I4, records
   reported accepted (a duplicate is ``accepted``) that never appear. The failure model
   promises, for an explicit shared id, "conflict or unknown, never accepted for records
   that were not written".

2. ``resume`` learns what a partition holds from its producer table alone
   (ctp_state/producer.py ``PartitionWriter.resume``), and the marker is written only
   after a complete run. A run that ended with an unknown outcome (exit 3: "run the
   same command again ... writes what is missing and nothing twice") and is re-run
   after MAX_PRODUCERS other producers wrote the partition (an ordinary day, see
   tests/produce/test_eviction_attacks.py) resumes at 0 and writes every record again,
   the accepted ones included (I2).

3. An error between batches that is not a verdict -- the cluster-epoch read failing
   once when its TTL runs out (``Producer.write`` calls ``self.epochs.get()`` outside
   any try) -- escapes ``send_batches``/``produce_input``: the CLI prints one error
   line and exits 1 ("rejected", per ``ctp produce --help``) with no outcomes, while the
   earlier batches are in the log (I4: accepted records reported as a failure).
"""

from __future__ import annotations

import json
import threading
import time

from click.testing import CliRunner

from ctp_state.cli import framework as cli
from ctp_state.errors import StoreError
from ctp_state.storage import ObjectStore
from ctp_state.topics import create_topic
from tests.support import LostResponses, Wrapped, values
from tests.support.produce import crowd_out


def _write(path, lines) -> str:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def _produce(args, url, monkeypatch=None, wrap=None):
    if wrap is not None:
        real = cli.open_store
        monkeypatch.setattr(cli, "open_store", lambda u, env, **kw: wrap(real(u, env, **kw)))
    try:
        return CliRunner().invoke(cli.main, ["produce", *args, "--store", url, "--json"])
    finally:
        if monkeypatch is not None:
            monkeypatch.undo()


def _summary(out) -> dict:
    return json.loads(out.output[out.output.index("{") :])


def test_a_completion_marker_never_vouches_for_another_input_under_the_same_id(fstore, tmp_path):
    store = fstore
    create_topic(store, "t", 1)
    day1 = _write(tmp_path / "day1.jsonl", [{"topic": "t", "partition": 0, "value": f"mon-{i}"} for i in range(3)])
    day2 = _write(tmp_path / "day2.jsonl", [{"topic": "t", "partition": 0, "value": f"tue-{i}"} for i in range(5)])
    first = _produce([day1, "--producer-id", "nightly-load"], store.url)
    assert first.exit_code == 0, first.output
    second = _produce([day2, "--producer-id", "nightly-load"], store.url)
    written = [v for v in values(store) if v.startswith(b"tue-")]
    s = _summary(second)
    claimed_in = s["accepted"] + s["duplicates"]
    # I4: records reported written (accepted or already written) must be in the log.
    assert claimed_in <= len(written), (second.exit_code, s, written)


def test_a_rerun_after_an_unknown_outcome_writes_nothing_twice_even_after_eviction(fstore, tmp_path, monkeypatch):
    store = fstore
    create_topic(store, "t", 1)
    path = _write(tmp_path / "in.jsonl", [{"topic": "t", "partition": 0, "value": f"v{i}"} for i in range(6)])
    args = [path, "--batch-records", "2"]

    # The second batch's placeholder lands but its response is lost, and the store
    # stays unreachable for that log: v0, v1 accepted; v2, v3 unknown; v4, v5 not sent.
    def wrap(s):
        return _CutLogAfterLoss(
            LostResponses(s, r"^logs/t/(?:[0-9a-f]{32}/)?000000/00000000000000000002\.json$", times=1)
        )

    first = _produce(args, store.url, monkeypatch, wrap)
    assert first.exit_code == 3, first.output
    s1 = _summary(first)
    assert (s1["accepted"], s1["unknown"], s1["not_sent"]) == (2, 2, 2), s1

    crowd_out(store)  # 1024 short-lived producers write the partition meanwhile

    second = _produce(args, store.url)  # what the first run's output told the user to do
    mine = [v for v in values(store) if not v.startswith(b"noise-")]
    # I2: each record exactly once (v0, v1 were acknowledged by the first run).
    assert sorted(mine) == [f"v{i}".encode() for i in range(6)], (_summary(second), mine)


class _CutLogAfterLoss(Wrapped):
    """LostResponses for one log entry, then every request for that partition's log
    fails (the connection to the store is gone for the rest of the run)."""

    def __init__(self, lossy: LostResponses):
        self.lossy, self.inner, self.url = lossy, lossy.inner, lossy.inner.url

    def _cut(self, key):
        if self.lossy.lost and key.startswith("logs/t/") and "/000000/" in key:
            raise StoreError(f"connection refused for {key!r}")

    def put_if_absent(self, key, data):
        self._cut(key)
        return self.lossy.put_if_absent(key, data)

    def put(self, key, data):
        self._cut(key)
        return self.lossy.put(key, data)

    def get(self, k):
        self._cut(k)
        return self.inner.get(k)

    def list(self, prefix="", start_after=None, end_before=None):
        self._cut(prefix)
        return self.inner.list(prefix, start_after, end_before)


class _EpochBlip(Wrapped):
    """The first L0 upload is slow (the producer's 5 s epoch TTL runs out meanwhile);
    after it, one read of the cluster epoch fails (a network blip)."""

    def __init__(self, inner: ObjectStore):
        self.inner, self.url = inner, inner.url
        self.l0_puts = 0
        self.blipped = False
        self._lock = threading.Lock()

    def _epoch_read(self, key: str) -> None:
        with self._lock:
            if key.startswith("cluster/epoch/") and self.l0_puts >= 1 and not self.blipped:
                self.blipped = True
                raise StoreError(f"connection reset reading {key!r}")

    def put(self, key, data):
        if key.startswith("l0/"):
            with self._lock:
                self.l0_puts += 1
                first = self.l0_puts == 1
            if first:
                time.sleep(5.2)
        return self.inner.put(key, data)

    def get(self, k):
        self._epoch_read(k)
        return self.inner.get(k)

    def list(self, prefix="", start_after=None, end_before=None):
        self._epoch_read(prefix)
        return self.inner.list(prefix, start_after, end_before)


def test_an_epoch_read_failing_between_batches_still_reports_every_record(fstore, tmp_path, monkeypatch):
    store = fstore
    create_topic(store, "t", 1)
    path = _write(tmp_path / "in.jsonl", [{"topic": "t", "partition": 0, "value": f"v{i}"} for i in range(4)])
    out = _produce([path, "--batch-records", "2"], store.url, monkeypatch, _EpochBlip)
    stored = values(store)
    assert stored[:2] == [b"v0", b"v1"]  # the first batch is in the log
    # I4: the run reports an outcome for every record, and never exit 1 ("rejected")
    # with no outcomes while records it sent are in the log.
    assert "{" in out.output, (out.exit_code, out.output)
    s = _summary(out)
    assert s["accepted"] == 2 and s["accepted"] + s["rejected"] + s["unknown"] + s["not_sent"] == 4, s
