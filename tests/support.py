"""Helpers shared by test folders: producing known records and checking I2."""

from __future__ import annotations

import io

import pyarrow.parquet as pq

from ctp_state.epoch import ClusterEpoch
from ctp_state.l0 import Record
from ctp_state.log import PartitionLog
from ctp_state.producer import Producer
from ctp_state.read import committed_l1_keys, read_partition
from ctp_state.storage import ObjectStore
from ctp_state.topics import create_topic


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


def corrupt_chunk(store, topic: str, partition: int) -> str:
    """Flip a byte inside the first pending chunk of ``topic/partition``; its L0 key."""
    st = plog(store, topic, partition).read_state()
    p = st.pending[0]
    data = bytearray(store.get(p.l0_key))
    data[p.byte_offset + p.byte_length // 2] ^= 0xFF
    store.put(p.l0_key, bytes(data))  # test-only tampering with an immutable object
    return p.l0_key


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
