"""A committed L1 file is never replaced, and ``ctp verify --deep`` checks each one
against the CRC32C its commit recorded (issue: topic identity, scenarios 6 and 7).

6. A reconciler whose lease lapsed (a zombie: GC pause, slow Spark) built an L1 file
   from L0 it read in time, but its PUT lands only after another reconciler committed
   the same key and the GC deleted the L0 source. A plain PUT replaced the committed
   bytes with its own (another compression here; another pyarrow on another worker
   would do the same): the commit's CRC32C no longer matched, ``ctp read`` refused the
   partition for good, with nothing left to rebuild it from.
7. ``verify --deep`` read every committed L1 file but never compared it with the
   committed CRC32C that ``ctp read`` checks: it said ok for a file read refuses.
"""

from __future__ import annotations

import io
import threading
import time

import pyarrow.parquet as pq

from ctp_state import layout
from ctp_state.epoch import ClusterEpoch
from ctp_state.gc import run_gc
from ctp_state.l0 import Record
from ctp_state.l1 import L1File, build_file, encode_parquet
from ctp_state.producer import Producer
from ctp_state.reconcile import build_files_locally
from ctp_state.settings import ReconcileSettings
from ctp_state.topics import create_topic
from ctp_state.verify import verify_partition
from tests.support import Wrapped, key_id, plog, reconcile, values


class HeldL1Puts(Wrapped):
    """The zombie's view of the store: its L1 writes wait (on the wire) until released."""

    def __init__(self, inner):
        super().__init__(inner)
        self.reached, self.release = threading.Event(), threading.Event()

    def _hold(self, k):
        if k.startswith(layout.L1_ROOT):
            self.reached.set()
            assert self.release.wait(120)

    def put(self, k, d):
        self._hold(k)
        return self.inner.put(k, d)

    def put_if_absent(self, k, d):
        self._hold(k)
        return self.inner.put_if_absent(k, d)


def produce(store, n=20):
    recs = [Record(f"r{i}".encode(), None, 1000 + i) for i in range(n)]
    with Producer(store, epoch_ttl_s=0) as prod:
        for i in range(0, n, 5):
            assert prod.write([(("t", 0), recs[i : i + 5])])[0].accepted
    return [r.value for r in recs]


def test_a_zombie_reconcilers_late_l1_write_never_replaces_the_committed_file(store, gate):
    create_topic(store, "t", 1)
    ce = ClusterEpoch(store)
    ce.advance()
    want = produce(store)
    zombie_view = HeldL1Puts(store)
    zombie: list = []
    cfg = ReconcileSettings(idle_lag=2, lease_ms=1500, compression="snappy")  # an older deployment's settings

    def run_zombie():
        zombie.append(
            reconcile(
                zombie_view, config=cfg, map_files=lambda fs: build_files_locally(zombie_view, fs, compression="snappy")
            )
        )

    t = threading.Thread(target=run_zombie)
    t.start()
    try:
        assert zombie_view.reached.wait(60)  # it read the L0 chunks; its PUT is on the wire
        time.sleep(3.2)  # past its lease by the store's clock (S3 mtimes have 1 s resolution)
        live = reconcile(store)
        assert live.partitions[0].status == "reconciled", live.partitions
        for _ in range(3):
            ce.advance()
        reconcile(store)
        assert run_gc(store, gate=gate).status == "ok"
        assert not list(store.list(layout.L0_ROOT))  # the L0 source is gone: nothing could rebuild the file
    finally:
        zombie_view.release.set()
        t.join(120)
    assert zombie and zombie[0].partitions[0].status == "fenced", zombie
    assert values(store) == want  # read checks each file against its committed CRC32C
    assert not verify_partition(store, "t", 0, deep=True).findings
    run_gc(store, gate=gate)  # and the next GC's gate agrees
    assert values(store) == want


def test_verify_deep_checks_each_committed_l1_file_against_its_crc32c(store):
    create_topic(store, "t", 1)
    ClusterEpoch(store).advance()
    produce(store)
    reconcile(store)
    state = plog(store, "t", 0).read_state()
    (last,) = state.l1_ends
    key = layout.l1_key("t", 0, 0, last, key_id(store, "t"))
    assert not verify_partition(store, "t", 0, deep=True).findings
    # The same records, encoded otherwise: every page checks out, the offsets are right,
    # but these are not the bytes the commit recorded (ctp read refuses them).
    table = pq.read_table(io.BytesIO(store.get(key)))
    store.put(key, encode_parquet(table.replace_schema_metadata(None), "t", 0, compression="snappy"))
    findings = verify_partition(store, "t", 0, deep=True).findings
    assert [(f.severity, f.key) for f in findings] == [("error", key)], findings
    assert "CRC32C" in findings[0].what


def test_an_l1_file_left_by_a_crashed_run_is_taken_over_when_it_holds_the_same_records(store):
    """A rerun after a crash between the L1 write and the commit meets its own earlier
    file: same records, so it is used (its bytes and CRC32C), never rewritten."""
    create_topic(store, "t", 1)
    ClusterEpoch(store).advance()
    produce(store)
    pending = tuple(plog(store, "t", 0).read_state().pending)
    f = L1File("t", 0, pending)
    first = build_file(store, f, compression="snappy")
    again = build_file(store, f, compression="zstd")
    assert again.l1_crc32c == first.l1_crc32c and again.key == first.key
