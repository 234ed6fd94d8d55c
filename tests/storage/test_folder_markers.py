"""Folder markers on S3: the empty objects whose keys end in '/' that S3 consoles make
and that SeaweedFS answers a listing of a folder it is removing with (seen in a GC of
an active topic, whose run then stopped on "key under the L0 root does not parse").
ctp never writes such a key: the store's listings leave them out, and a GC over a
store that has them runs."""

from __future__ import annotations

from ctp_state import layout
from ctp_state.epoch import ClusterEpoch
from ctp_state.gc import run_gc
from ctp_state.reconcile import run_reconcile
from ctp_state.settings import GcSettings
from ctp_state.storage import open_store
from tests.support import produce_rounds


def test_folder_markers_are_not_objects_and_the_gc_runs_past_them(s3_server, gate):
    store = open_store(s3_server.url("ctp-markers"), s3_server.env)
    produce_rounds(store, "t", partitions=2, rounds=3, per=5)
    for _ in range(2):  # M passes the rounds' L0 objects
        ClusterEpoch(store).advance()
        run_reconcile(store)
    spread = sorted(store.list_level(layout.L0_ROOT)[0])[0]
    client = s3_server.client()
    for marker in (spread, f"{spread}000000000000000099/", layout.L0_ROOT, "logs/"):
        client.put_object(Bucket=store.bucket, Key=store.prefix + marker, Body=b"")
    dirs, files = store.list_level(spread)
    assert files == [] and dirs, (dirs, files)
    assert not [o.key for o in store.list(layout.L0_ROOT) if o.key.endswith("/")]
    assert not [o.key for o in store.list_all("logs/") if o.key.endswith("/")]
    rec = run_gc(store, gate=gate, config=GcSettings())
    assert rec.status == "ok" and rec.deleted > 0, rec
