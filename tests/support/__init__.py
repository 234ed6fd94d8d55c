"""Helpers shared by the test folders: the one home of every helper more than one test
module uses (fixtures live in ``tests/conftest.py``). This module holds what any concept
needs: producing known records and checking I2, reading a store back, wrapped stores
that inject faults, and running ``ctp`` in a child process. Helpers of one concept that
several of its test modules share are in ``tests.support.<concept>`` (gc, produce,
snapshot, table, topics, spark, airflow); the fault-injecting S3 proxy is
``tests.support.s3_fault_proxy``."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import threading
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from ctp_state import l0, l1, layout
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import StoreError
from ctp_state.l0 import Record
from ctp_state.partition_log import PartitionLog
from ctp_state.producer import Producer
from ctp_state.read import committed_l1_keys, read_partition
from ctp_state.reconcile import run_reconcile
from ctp_state.records import ReconcileSummary
from ctp_state.settings import ReconcileSettings
from ctp_state.storage import ObjectStore
from ctp_state.topics import create_topic

if TYPE_CHECKING:
    from ctp_state.local_s3 import LocalS3
    from tests.conftest import MotoServer
    from tests.support.s3_fault_proxy import S3FaultProxy

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOOKS = os.path.join(REPO, "tests", "hooks")


# --- the reconciler as the scenarios are written ----------------------------------------

#: The reconciler's settings the scenarios are written around: an idle partition is
#: advanced (R6) once C is two epochs past its lower bound. The default is 6 (the request
#: budget, docs/design.md 14); a test of the default passes ``ReconcileSettings()``.
LAG2 = ReconcileSettings(idle_lag=2, tick_together=True)
#: What ``reconcile`` runs with unless told: ``both_read_paths`` (tests/conftest.py)
#: sets it to the quiet read path for a test's run.
SCENARIO = {"config": LAG2}


def reconcile(store: ObjectStore, **kw) -> ReconcileSummary:
    """``run_reconcile`` with the scenarios' settings (``LAG2``) unless ``config`` is given."""
    kw.setdefault("config", SCENARIO["config"])
    return run_reconcile(store, **kw)


# --- records: produce known ones, read them back, check I2 --------------------------------


def produce_rounds(store, topic="t", partitions=3, rounds=3, per=50, advance=True) -> dict[int, list[Record]]:
    """Produce `rounds` flushes (advancing C before each); return what was accepted."""
    create_topic(store, topic, partitions, exist_ok=True)
    sent: dict[int, list[Record]] = {p: [] for p in range(partitions)}
    ce = ClusterEpoch(store)
    with Producer(store, epoch_ttl_s=0) as prod:
        for r in range(rounds):
            if advance:
                ce.advance()
            chunks = []
            for p in range(partitions):
                recs = [
                    Record(
                        f"{topic}-{r}-{p}-{i}".encode() + bytes([i % 256]),
                        f"k{i}".encode(),
                        1000 + i,
                        (("round", str(r).encode()),),
                    )
                    for i in range(per)
                ]
                chunks.append(((topic, p), recs))
            for v, (_, recs) in zip(prod.write(chunks), chunks):
                assert v.accepted, v.error
                sent[v.partition].extend(recs)
    return sent


def assert_exactly_once(store, topic: str, sent: dict[int, list[Record]], *, all_in_l1: bool = True) -> None:
    """I2: every accepted record is readable exactly once, at its offset, byte-identical."""
    for p, records in sent.items():
        table = read_partition(store, topic, p)
        rows = table.to_pylist()
        assert [r["offset"] for r in rows] == list(range(len(records)))  # contiguous, no duplicates
        for row, rec in zip(rows, records):
            assert (row["value"], row["key"]) == (rec.value, rec.key)
            assert round(row["timestamp"].timestamp() * 1000) == rec.timestamp_ms
            assert [(h["key"], h["value"]) for h in row["headers"]] == list(rec.headers)
        if all_in_l1:
            keys, state = committed_l1_keys(plog(store, topic, p))
            assert not state.pending
            in_l1 = sum(pq.read_metadata(io.BytesIO(store.get(k))).num_rows for k in keys)
            assert in_l1 == len(records)


def values(store, topic="t", partition=0) -> list[bytes]:
    return [r["value"] for r in read_partition(store, topic, partition).to_pylist()]


def l0_keys(store) -> set[str]:
    return {o.key for o in store.list(layout.L0_ROOT)}


def one_reconciled_record(store, value: bytes):
    """t/0 holds one record with ``value``, reconciled into one L1 file at epoch 2.
    Returns (cluster epoch, the record's verdict, the L1 key)."""
    create_topic(store, "t", 1)
    ce = ClusterEpoch(store)
    ce.advance()
    with Producer(store, epoch_ttl_s=0) as prod:
        v = prod.write([(("t", 0), [Record(value, b"k", 1234)])])[0]
    assert v.accepted
    run_reconcile(store)
    (l1,), _ = committed_l1_keys(plog(store, "t", 0))
    return ce, v, l1


# --- L1 files as an older ctp wrote them -------------------------------------------------


def format1_encoder(encode):
    """What ctp wrote before format 2: milliseconds, no partition column, version 1."""

    def encode_v1(table, topic, partition, **kw):
        v1 = pa.Table.from_arrays(
            [
                table.column("offset"),
                table.column("timestamp").cast(pa.timestamp("ms", tz="UTC")),
                table.column("key"),
                table.column("value"),
                table.column("headers"),
            ],
            schema=l1.SCHEMA_V1,
        )
        data = encode(v1, topic, partition, **kw)
        pf = pq.read_table(io.BytesIO(data))
        meta = {**pf.schema.metadata, b"ctp.format_version": b"1"}
        buf = io.BytesIO()
        pq.write_table(pf.replace_schema_metadata(meta), buf, compression="zstd", write_page_checksum=True)
        return buf.getvalue()

    return encode_v1


# --- stores that count or break requests ----------------------------------------------------


class Wrapped(ObjectStore):
    """An :class:`ObjectStore` that passes every request to ``inner``: fault-injecting
    test stores override what they break."""

    def __init__(self, inner: ObjectStore):
        self.inner, self.url = inner, inner.url

    def get(self, k):
        return self.inner.get(k)

    def get_range(self, k, s, n):
        return self.inner.get_range(k, s, n)

    def put(self, k, d):
        return self.inner.put(k, d)

    def put_if_absent(self, k, d):
        return self.inner.put_if_absent(k, d)

    def head(self, k):
        return self.inner.head(k)

    def list(self, prefix="", start_after=None, end_before=None):
        return self.inner.list(prefix, start_after, end_before)

    def list_level(self, prefix):
        return self.inner.list_level(prefix)

    def _delete_batch(self, keys):
        return self.inner._delete_batch(keys)


class LostResponses(Wrapped):
    """Wraps a real store. A create-if-absent (or put) of a key matching ``pattern``
    is carried out, then reported as a failure, ``times`` times in all (None: always):
    the write persisted but its response was lost, as when a connection drops after
    the server applied the request. With ``then_unreachable`` every later request for
    a matching key fails without reaching the store, so the outcome cannot be learned.
    On S3 the fault proxy does the same on the wire."""

    def __init__(self, inner: ObjectStore, pattern: str, times: int | None = None, then_unreachable: bool = False):
        self.inner, self.url = inner, inner.url
        self.pattern, self.times = re.compile(pattern), times
        self.then_unreachable = then_unreachable
        self.lost: list[str] = []
        self._lock = threading.Lock()

    def _cut(self, key: str) -> None:
        if self.then_unreachable and self.lost and self.pattern.search(key):
            raise StoreError(f"connection refused for {key!r}")

    def _fire(self, key: str) -> bool:
        with self._lock:
            if not self.pattern.search(key) or (self.times is not None and len(self.lost) >= self.times):
                return False
            self.lost.append(key)
            return True

    def put_if_absent(self, key, data):
        self._cut(key)
        self.inner.put_if_absent(key, data)
        if self._fire(key):
            raise StoreError(f"connection reset after the request for {key!r} was sent")

    def put(self, key, data):
        self._cut(key)
        self.inner.put(key, data)
        if self._fire(key):
            raise StoreError(f"connection reset after the request for {key!r} was sent")

    def get(self, k):
        self._cut(k)
        return self.inner.get(k)


class CountingStore(ObjectStore):
    """Wraps a store and counts requests by verb."""

    def __init__(self, inner: ObjectStore):
        self.inner, self.url, self.counts = inner, inner.url, {}

    def _n(self, verb: str) -> None:
        self.counts[verb] = self.counts.get(verb, 0) + 1

    def get(self, key):
        self._n("get")
        return self.inner.get(key)

    def get_range(self, key, start, length):
        self._n("get")
        return self.inner.get_range(key, start, length)

    def put(self, key, data):
        self._n("put")
        return self.inner.put(key, data)

    def put_if_absent(self, key, data):
        self._n("put")
        return self.inner.put_if_absent(key, data)

    def head(self, key):
        self._n("head")
        return self.inner.head(key)

    def list(self, prefix="", start_after=None, end_before=None):
        self._n("list")
        return self.inner.list(prefix, start_after, end_before)

    def list_level(self, prefix):
        self._n("list")
        return self.inner.list_level(prefix)

    def _delete_batch(self, keys):
        self._n("delete")
        return self.inner._delete_batch(keys)


# --- logs and keys ------------------------------------------------------------------------


def corrupt_chunk(store, topic: str, partition: int) -> str:
    """Flip a byte inside the first pending chunk of ``topic/partition``; its L0 key."""
    st = plog(store, topic, partition).read_state()
    p = st.pending[0]
    data = bytearray(store.get(p.l0_key))
    data[p.byte_offset + p.byte_length // 2] ^= 0xFF
    store.put(p.l0_key, bytes(data))  # test-only tampering with an immutable object
    return p.l0_key


def rewrite_footer(store: ObjectStore, key: str, partition_of) -> None:
    """Put the L0 object at ``key`` back with the same chunks and a footer whose chunks
    name ``partition_of(partition)`` instead: a forged index (its CRC32C valid) that
    sends the reconciler's L0 listing to other partitions (docs/design.md 14)."""
    data = store.get(key)
    footer_len = struct.unpack("<I", data[-l0.TRAILER.size : -l0.TRAILER.size + 4])[0]
    end = len(data) - l0.TRAILER.size
    footer = json.loads(data[end - footer_len : end])
    footer["chunks"] = [[t, partition_of(p), *rest] for t, p, *rest in footer["chunks"]]
    new = json.dumps(footer, separators=(",", ":")).encode()
    body = data[: end - footer_len] + new + l0.TRAILER.pack(len(new), l0.crc32c(new), 1, l0.TRAILER_MAGIC)
    store.delete_many([key])
    store.put(key, body)


def plog(store: ObjectStore, topic: str, partition: int, **kw) -> PartitionLog:
    """``topic``/``partition``'s log, found through the topic's metadata as ctp finds it
    (its keys carry the incarnation id); a bare name when the topic has none (a log a
    test writes by hand)."""
    from ctp_state.errors import TopicNotFound
    from ctp_state.topics import get_topic

    try:
        return PartitionLog(store, get_topic(store, topic), partition, **kw)
    except TopicNotFound:
        return PartitionLog(store, topic, partition, **kw)


def claim_given_up(store: ObjectStore, topic: str = "t", partition: int = 0, owner: str = "gone") -> None:
    """An exclusive claim taken and released with nothing written under it: the log
    grows by two entries that change no L1 file."""
    from ctp_state.entries import AccessMode

    log = plog(store, topic, partition)
    st = log.claim(log.read_state(), owner, AccessMode.EXCLUSIVE).outcome.state
    log.release(st, owner, st.writer_epoch)


def key_id(store: ObjectStore, topic: str = "t") -> str | None:
    """The id in ``topic``'s keys (what layout functions take as ``topic_id``; None for a
    topic that has no metadata: a log a test writes by hand)."""
    from ctp_state.errors import TopicNotFound
    from ctp_state.topics import get_topic

    try:
        return get_topic(store, topic).key_id
    except TopicNotFound:
        return None


def space(store: ObjectStore, topic: str = "t") -> str:
    """``topic``'s key space (``<topic>/<id>``), as literal keys in tests spell it."""
    from ctp_state import layout

    return layout.space(topic, key_id(store, topic))


# --- child processes: this checkout, the S3 fault proxy, the ``ctp`` command ---------------


def with_this_checkout(env: dict[str, str]) -> dict[str, str]:
    """``env`` with this checkout first on ``PYTHONPATH``: child processes (the ``ctp``
    script, helper scripts) import the code under test even when the venv's editable
    install points at another checkout (the editable finder only answers what
    ``sys.path`` does not). ``tests/hooks`` comes next: its ``sitecustomize`` installs
    the crash points ``CTP_FAULT`` arms (:mod:`ctp_state.crashpoints`)."""
    path = [REPO, HOOKS] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in (REPO, HOOKS)]
    return {**env, "PYTHONPATH": os.pathsep.join(path)}


def proxy_env(server: LocalS3 | MotoServer, proxy: S3FaultProxy, **extra: str) -> dict[str, str]:
    """A copy of ``server.env`` that reaches S3 through ``proxy``, plus ``extra``."""
    return {**server.env, "CTP_S3_ENDPOINT_URL": proxy.endpoint, **extra}


CTP = shutil.which("ctp") or os.path.join(os.path.dirname(sys.executable), "ctp")


def ctp(env: dict[str, str], *args: str, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([CTP, *args], env=env, input=input, capture_output=True, text=True, timeout=120)


def ok(env, *args, input=None):
    r = ctp(env, *args, input=input)
    assert r.returncode == 0, r.stderr
    return r.stdout


def ctp_on_path(env, *args, timeout=120) -> subprocess.CompletedProcess[str]:
    """``ctp`` as found on ``env``'s ``PATH`` (:func:`ctp` runs the one next to this
    interpreter)."""
    return subprocess.run(["ctp", *args], env=env, capture_output=True, text=True, timeout=timeout)
