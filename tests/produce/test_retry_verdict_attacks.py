"""``write_with_retry`` (ctp_state/producer.py) forgets the verdicts of every attempt
but the last: ``retry, rejected = [], []`` is reset inside the loop, so a chunk that
was *not* accepted on attempt 1 (unknown, rejected) while another chunk of the same
flush was refused for a stale epoch (and re-sent on attempt 2) is in neither returned
list.

``ctp produce`` (ctp_state/ingest.py ``send_batches``) counts only what comes back, so
the partition of the lost verdict is not stopped, ``report.complete`` is True, the CLI
exits 0, and the completion marker is written: running the same command again reports
every record "already written". The record whose outcome was unknown -- here it never
reached the log -- is never written, and no output ever said so (I4: every write's
outcome is reported; the input is "complete" while one record is missing).

A stale epoch on one partition of a flush is ordinary: another producer wrote that
partition at two newer epochs while this one's cached epoch (5 s TTL) was older.
"""

from __future__ import annotations

import json

from click.testing import CliRunner

from ctp_state.cli import framework as cli
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import StoreError
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.storage import ObjectStore
from ctp_state.topics import create_topic
from tests.support import Wrapped, values


class _Interfere(Wrapped):
    """While ctp produce uploads its first L0 object: the cluster epoch advances twice
    and another producer writes t/1 at each new epoch (so t/1's previous applied epoch
    passes the one ctp produce cached). From then on t/0's log does not answer creates
    (a connection problem to that key range): the create never lands."""

    def __init__(self, inner: ObjectStore):
        self.inner, self.url = inner, inner.url
        self.fired = False

    def put(self, key, data):
        if key.startswith("l0/") and not self.fired:
            self.fired = True
            ce = ClusterEpoch(self.inner)
            for i in range(2):
                ce.advance()
                with Producer(self.inner, epoch_ttl_s=0, append_threads=1) as other:
                    assert other.write([(("t", 1), [Record(f"other-{i}".encode())])])[0].accepted
        return self.inner.put(key, data)

    def put_if_absent(self, key, data):
        if self.fired and key.startswith("logs/t/") and "/000000/" in key:
            raise StoreError(f"connection refused for {key!r}")  # never reached the store
        return self.inner.put_if_absent(key, data)


def test_a_chunk_not_accepted_beside_a_stale_epoch_retry_is_still_reported(fstore, tmp_path, monkeypatch):
    store = fstore
    create_topic(store, "t", 2)
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"topic": "t", "partition": p, "value": f"mine-{p}"}) + "\n" for p in (0, 1)))
    real = cli.open_store
    monkeypatch.setattr(cli, "open_store", lambda u, env, **kw: _Interfere(real(u, env, **kw)))
    first = CliRunner().invoke(cli.main, ["produce", str(path), "--store", store.url, "--json"])
    monkeypatch.undo()
    again = CliRunner().invoke(cli.main, ["produce", str(path), "--store", store.url, "--json"])

    in_log = {p: [v for v in values(store, "t", p) if v.startswith(b"mine-")] for p in (0, 1)}
    s = json.loads(first.output[first.output.index("{") :])
    counted = s["accepted"] + s["duplicates"] + s["rejected"] + s["unknown"] + s["not_sent"]
    # Once the store is healthy again, running the command again gets every record in...
    assert in_log == {0: [b"mine-0"], 1: [b"mine-1"]}, (first.exit_code, s, again.output, in_log)
    # ...and (I4) the first run gave every record of the input an outcome.
    assert counted == 2, (first.exit_code, s)
