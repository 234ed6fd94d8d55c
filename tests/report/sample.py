"""A store with a GC history worth looking at: healthy runs, a dry run, a stuck claim,
a quarantined chunk, lag, and a gate that failed once. Used by the browser test and by
``scripts/report_screenshot.py`` (which keeps docs/report.png)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from ctp_state.entries import AccessMode
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import GateFailed
from ctp_state.gc import run_gc
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.settings import GcSettings
from ctp_state.storage import ObjectStore
from ctp_state.topics import create_topic
from expectations.gate import GxGate
from expectations.job import write_report
from tests.support import plog, reconcile

TOPIC = "orders"
PARTITIONS = 8


def _produce(store: ObjectStore, partitions: range | list[int], n: int = 40) -> None:
    with Producer(store) as prod:
        for v in prod.write([((TOPIC, p), [Record(b"v%05d" % i, b"k%d" % i) for i in range(n)]) for p in partitions]):
            assert v.accepted, v.error


def build(store: ObjectStore, report_dir: str, rounds: int = 6) -> GxGate:
    """Fill ``store`` and ``report_dir``; returns the gate (its Data Docs site)."""
    from tests.support import corrupt_chunk

    create_topic(store, TOPIC, PARTITIONS, exist_ok=True)
    gate = GxGate(report_dir, store_url=store.url)
    ce = ClusterEpoch(store)
    for i in range(rounds):
        _produce(store, range(PARTITIONS))
        ce.advance()
        reconcile(store)
        run_gc(store, gate=gate, config=GcSettings(dry_run=i == 1))

    # A gate that fails once: the partition states it is shown say a lower bound went
    # down (as a state restored from an old backup would).
    def tampered(frames: dict[str, pa.Table]) -> Any:
        t = frames["partition_state"]
        prev = pa.array([v + 3 if v is not None else v for v in t.column("min_epoch_lower_bound").to_pylist()])
        i = t.schema.get_field_index("previous_min_epoch_lower_bound")
        return gate({**frames, "partition_state": t.set_column(i, t.schema.field(i), prev.cast(pa.int64()))})

    try:
        run_gc(store, gate=tampered)
    except GateFailed:
        pass
    # Trouble an operator must see: a stuck claim on one partition, a quarantined
    # chunk on another, and lag on a third.
    log = plog(store, TOPIC, 1)
    log.claim(log.read_state(), "reconciler:dead", AccessMode.EXCLUSIVE, lease_ms=3_600_000)
    _produce(store, [1, 2, 3])
    corrupt_chunk(store, TOPIC, 2)
    ce.advance()
    reconcile(store)  # t/1: claim held, skipped; t/2: quarantined; the rest reconciled
    _produce(store, [3, 5], n=200)
    return gate


def finish(store: ObjectStore, gate: GxGate, report_dir: str) -> str:
    """One last (passing) GC run over the troubled store, then the report; its path."""
    try:
        # every log read: the lag of partitions written after the last reconcile shows
        # (a run from its pack keeps their states as of that reconcile)
        run_gc(store, gate=gate, config=GcSettings(dry_run=True, full_read_every=1))
    except GateFailed:
        pass
    page, _ = write_report(store, report_dir, gate)
    return page
