"""Helpers the snapshot attacks share (tests/snapshot, tests/reconcile): where a log ends
and its snapshot sits, a deep verify and a GC that must pass, and the convergence check
every attacked run ends with (snapshots agree with the logs, I1, every record exactly
once in L1)."""

from __future__ import annotations

from ctp_state import layout
from ctp_state.epoch import ClusterEpoch
from ctp_state.gc import run_gc
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.settings import GcSettings
from ctp_state.verify import verify
from tests.support import assert_exactly_once, plog, reconcile


def log_end(store, topic: str, p: int) -> int:
    log = plog(store, topic, p, write_snapshots=False)
    return max(layout.log_offset_of(o.key, log.prefix) for o in store.list(log.prefix))


def snap_offset(store, topic: str, p: int) -> int:
    return plog(store, topic, p, write_snapshots=False).read_snapshot(strict=True).applied_offset


def deep_ok(store) -> None:
    rep = verify(store, deep=True)
    assert rep.ok, [(f.where, f.what) for f in rep.errors]


def advance(store, n: int) -> int:
    ce = ClusterEpoch(store)
    for _ in range(n):
        ce.advance()
    return ce.current()


def gc_ok(store, gate):
    rec = run_gc(store, gate=gate, config=GcSettings(l1_grace_s=0))
    assert rec.status == "ok", rec
    return rec


def no_pending_l0_below_m(store, topic, partitions, m):
    """I1 checked on its own: every pending chunk's L0 object is still there."""
    for p in range(partitions):
        st = plog(store, topic, p, write_snapshots=False).read_state()
        for ph in st.pending:
            assert store.head(ph.l0_key) is not None, (p, ph.l0_key, m)


def append_singles(store, n: int, tag: str, sent: dict[int, list[Record]] | None = None) -> None:
    """A producer appends ``n`` one-record batches to t/0 (``n`` >= 64: a log longer
    than ``snapshot_every``); each accepted record joins ``sent[0]`` when given."""
    with Producer(store, epoch_ttl_s=0) as prod:
        for i in range(n):
            rec = Record(f"{tag}-{i}".encode())
            assert prod.write([(("t", 0), [rec])])[0].accepted
            if sent is not None:
                sent[0].append(rec)


def converges(store, gate, sent: dict[int, list[Record]], partitions: int) -> None:
    """After an attacked run: the snapshots agree with the logs, a GC keeps every L0
    object a pending record needs (I1) and loses nothing, and a clean reconcile and GC
    after it leave every record exactly once in L1."""
    deep_ok(store)
    advance(store, 2)
    rec = gc_ok(store, gate)
    no_pending_l0_below_m(store, "t", partitions, rec.m)
    assert_exactly_once(store, "t", sent, all_in_l1=False)
    reconcile(store)
    gc_ok(store, gate)
    assert_exactly_once(store, "t", sent)
    deep_ok(store)
