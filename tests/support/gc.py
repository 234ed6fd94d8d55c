"""Helpers the GC's tests share (tests/gc, tests/gate, tests/dags, tests/topics): a store
with L0 garbage to collect, its L0 objects by epoch, a store whose deletes fail, a GC
run's own files, and the gate's tables built by hand."""

from __future__ import annotations

import threading

import pyarrow as pa

from ctp_state import layout
from ctp_state.epoch import ClusterEpoch
from ctp_state.gc import STATE_SCHEMA, history_table
from ctp_state.gc.history import GcHistory
from ctp_state.gc.l1_sweep import L1_CHECK_SCHEMA
from ctp_state.gc.tables import L1_DROPPED_SCHEMA, TABLE_FILES_SCHEMA, TABLE_PARTITIONS_SCHEMA, HistoryCandidate
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.records import GcRecord
from ctp_state.storage import DeleteResult, ObjectStore
from tests.support import Wrapped, produce_rounds, reconcile


def reconciled(store: ObjectStore, rounds: int = 3, topic: str = "t", partitions: int = 3):
    """Produce ``rounds`` flushes, reconcile, advance C twice and reconcile again, so
    every partition's lower bound moves up (R6) and L0 garbage exists."""
    sent = produce_rounds(store, topic=topic, partitions=partitions, rounds=rounds, per=20)
    reconcile(store)
    ce = ClusterEpoch(store)
    ce.advance()
    ce.advance()
    reconcile(store)
    return sent


def l0_epochs(store: ObjectStore) -> dict[str, int]:
    return {o.key: layout.parse_l0_key(o.key)[1] for o in store.list(layout.L0_ROOT)}


def produce(store, partitions=(0, 1, 2), n=5) -> None:
    with Producer(store) as prod:
        for v in prod.write([(("t", p), [Record(b"v%d" % i) for i in range(n)]) for p in partitions]):
            assert v.accepted, v.error


class FlakyStore(Wrapped):
    """Fault injection: the first ``throttle`` delete requests are refused with SlowDown
    for every key; keys in ``broken`` always fail."""

    def __init__(self, inner: ObjectStore, throttle: int = 0, broken: frozenset[str] = frozenset()):
        super().__init__(inner)
        self.throttle, self.broken, self.requests = throttle, broken, 0
        self._lock = threading.Lock()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _delete_batch(self, keys):
        with self._lock:
            self.requests += 1
            throttled = self.requests <= self.throttle
        if throttled:
            return DeleteResult((), dict.fromkeys(keys, "SlowDown"))
        ok = [k for k in keys if k not in self.broken]
        res = self.inner._delete_batch(ok) if ok else DeleteResult()
        return DeleteResult(res.deleted, {**res.errors, **{k: "AccessDenied" for k in keys if k in self.broken}})


def run_files(store) -> set[str]:
    return {o.key for p in (layout.GC_PARTITIONS, layout.GC_DELETES) for o in store.list(p)}


def named(store) -> set[str]:
    keys: set[str] = set()
    for r in GcHistory(store).records():
        keys |= {k for k in (r.partitions_key, r.deletes_key) if k}
    return keys


def gate_frames(*, duplicated_offset: bool = False) -> dict[str, pa.Table]:
    """The three tables as the GC builds them; with ``duplicated_offset`` one L1 file
    holds an offset twice."""
    history = history_table(
        [
            GcRecord(
                seq=s,
                run_id=f"r{s}",
                status="ok",
                m=2 + s,
                cluster_epoch=4 + s,
                m_high_water_before=1 + s if s else None,
                started_ms=1000 * s,
                finished_ms=1000 * s,
                seconds=0.0,
            )
            for s in range(3)
        ],
        HistoryCandidate(seq=3, m=5, cluster_epoch=7, m_high_water_before=4, started_ms=3000, run_id="r3"),
    )
    state = pa.Table.from_pylist(
        [
            {
                "topic": "t",
                "partition": p,
                "source": "log",
                "min_epoch_lower_bound": 6,
                "previous_min_epoch_lower_bound": 5,
                "previous_applied_epoch": 6,
                "max_applied_epoch": 7,
            }
            for p in range(3)
        ],
        schema=STATE_SCHEMA,
    )
    files = []
    for p in range(3):
        for f in range(2):
            first, last = 20 * f, 20 * f + 19
            files.append(
                {
                    "topic": "t",
                    "partition": p,
                    "key": f"l1/t/{p}/{first}-{last}",
                    "first_offset": first,
                    "last_offset": last,
                    "expected_first_offset": first,
                    "span": 20,
                    "rows": 20,
                    "distinct_offsets": 20,
                    "min_offset": first,
                    "max_offset": last,
                }
            )
    if duplicated_offset:
        files[3] = {**files[3], "distinct_offsets": 19, "max_offset": files[3]["last_offset"] - 1}
    return {
        "gc_history": history,
        "partition_state": state,
        "l1_files": pa.Table.from_pylist(files, schema=L1_CHECK_SCHEMA),
        "table_files": TABLE_FILES_SCHEMA.empty_table(),
        "table_partitions": TABLE_PARTITIONS_SCHEMA.empty_table(),
        "l1_dropped": L1_DROPPED_SCHEMA.empty_table(),
    }
