"""The request budget of an idle partition, counted where the bill counts it: at the
boto3 client, by S3 operation, against SeaweedFS (``RequestCounter`` of
``benchmarks/bench_requests.py``). Counts, unlike times, are deterministic: a change
that adds a request per idle partition per epoch fails here. Per partition: the
difference between a topic of 10 and one of 14 (both at least ``quiet_min``), so the
runs' fixed requests drop out."""

from __future__ import annotations

import os
import sys
import uuid
from collections import Counter

import pytest

from ctp_state.epoch import ClusterEpoch
from ctp_state.gc import run_gc
from ctp_state.reconcile import run_reconcile
from ctp_state.settings import GcSettings, ReconcileSettings
from ctp_state.storage import open_store
from ctp_state.topics import create_topic

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
from bench_requests import RequestCounter

#: One whole cycle of the default idle lag (6): one tick a partition. Warm-up and window
#: together are 12 runs: the GC's full read (every ``full_read_every`` runs, 12) is the
#: first run's, not in the window.
EPOCHS = ReconcileSettings().idle_lag


def idle_cycle(s3_server, gate, partitions: int) -> dict[str, Counter[str]]:
    """Requests by phase and operation over ``EPOCHS`` epochs of an idle topic, after a
    warm-up of as many (every partition ticked, snapshotted, swept once)."""
    store = open_store(s3_server.url(f"budget-{uuid.uuid4().hex[:8]}"), s3_server.env)
    create_topic(store, "t", partitions)
    assert EPOCHS == 6 and GcSettings().full_read_every == 2 * EPOCHS

    def epoch(counter=None):
        ClusterEpoch(store).advance()
        with counter.phase("reconcile") if counter else _nothing():
            s = run_reconcile(store)
        with counter.phase("gc") if counter else _nothing():
            g = run_gc(store, gate=gate, config=GcSettings())
        assert s.ok and g.status == "ok", (s, g)

    for _ in range(EPOCHS):
        epoch()
    with RequestCounter(store) as counter:
        for _ in range(EPOCHS):
            epoch(counter)
    store.close()
    return {p: Counter(c) for p, c in counter.calls.items()}


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def per_partition_epoch(few, many, d: int) -> dict[str, dict[str, float]]:
    out = {}
    for phase in ("reconcile", "gc"):
        a, b = few.get(phase, Counter()), many.get(phase, Counter())
        out[phase] = {op: (b[op] - a[op]) / (d * EPOCHS) for op in sorted(set(a) | set(b)) if b[op] != a[op]}
    return out


@pytest.mark.slow
def test_an_idle_partitions_requests_per_epoch_by_operation(s3_server, gate):
    few, many = idle_cycle(s3_server, gate, 10), idle_cycle(s3_server, gate, 14)
    per = per_partition_epoch(few, many, 4)
    # The reconcile: an idle partition is quiet in the GC's state pack (the GC ran after
    # the last reconcile, so the pack's state is the log's end) and no L0 object names
    # it, so it is not read at all (one listing of the L0 root a run, whatever the
    # partitions) -- except once every ``idle_lag`` epochs, when its advance is due: a GET of the
    # pack's last entry (still there, the very bytes the pack folded), the tick's create
    # (the probe: whatever landed after the state wins the race) and one page of a
    # listing after it (what is past the tick is read: a hole it filled is found). No
    # snapshot read or written, no 404 after the state.
    tick = pytest.approx(1 / EPOCHS)
    assert per["reconcile"] == {"GetObject": tick, "ListObjectsV2": tick, "PutObject": tick}, per
    # The GC: from the previous run's state pack, a GET of the pack's last entry (still
    # there, those bytes: the log did not lose its tail) and a GET of each tick the
    # reconcile's summary reports; nothing else -- no HEAD of the key after (what was
    # appended since the reconcile carries an epoch at or above the state's bound), no
    # listing of the log nor of the L1 files after a tick. (Every ``full_read_every``
    # runs, 12, it reads every log: not in this window.)
    assert per["gc"] == {"GetObject": pytest.approx(1 + 1 / EPOCHS)}, per
