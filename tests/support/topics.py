"""Helpers the topic tests share (tests/topics, tests/verify): records under a tag, an
epoch advance and reconcile that settles them, an incarnation's keys, a topic removed
by hand (as before ``ctp topic delete``), and what a creator killed mid-way leaves."""

from __future__ import annotations

import json

from ctp_state import layout
from ctp_state.entries import Init, encode
from ctp_state.epoch import ClusterEpoch
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.settings import GcSettings
from tests.support import key_id, reconcile

NOW = GcSettings(topic_removal_grace_s=0)  # remove a deleted incarnation's state in the same run


def load(store, tag: str, n: int = 10, partition: int = 0) -> None:
    with Producer(store, epoch_ttl_s=0) as prod:
        v = prod.write([(("t", partition), [Record(f"{tag}{i}".encode(), None, 1000 + i) for i in range(n)])])[0]
        assert v.accepted, v.error


def settle(store) -> None:
    for _ in range(3):
        ClusterEpoch(store).advance()
    reconcile(store)


def space_keys(store, t) -> list[str]:
    prefixes = [f"{root}{layout.space(t.name, t.key_id)}/" for root in ("logs/", "snapshots/", "l1/")]
    return [o.key for p in prefixes for o in store.list(p)]


def remove_by_hand(store, topic: str) -> None:
    """What an operator does today to delete a topic: its metadata, logs, snapshots and
    L1 files go; L0 objects (shared by every topic), GC history and produce markers stay."""
    keys = [layout.topic_meta(topic)]
    for prefix in (f"{layout.LOGS_ROOT}{topic}/", f"snapshots/{topic}/", f"{layout.L1_ROOT}{topic}/"):
        keys += [o.key for o in store.list(prefix)]
    store.delete_many(keys)
    assert not list(store.list(f"{layout.LOGS_ROOT}{topic}/"))


def crashed_create(store, name: str, partitions: int, with_init=()) -> None:
    """What a creator killed mid-way leaves: the metadata, and inits for some partitions."""
    meta = {"v": 1, "name": name, "partitions": partitions, "created_ms": 0}
    store.put_if_absent(layout.topic_meta(name), json.dumps(meta).encode())
    for p in with_init:
        store.put_if_absent(
            layout.log_entry(name, p, 0, key_id(store, name)), encode(Init(ClusterEpoch(store).current()))
        )
