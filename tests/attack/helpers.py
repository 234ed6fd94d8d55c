from __future__ import annotations

from ctp_state import layout
from ctp_state.read import read_partition


def l0_keys(store) -> set[str]:
    return {o.key for o in store.list(layout.L0_ROOT)}


def values(store, topic="t", partition=0) -> list[bytes]:
    return [r["value"] for r in read_partition(store, topic, partition).to_pylist()]
