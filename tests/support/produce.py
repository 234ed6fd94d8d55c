"""Helpers the produce tests share (tests/produce): ``ctp produce``'s whole-input path
run in-process, stores that lose a create's response or never let it land, a crowd of
short-lived producers that makes a partition forget older ones, and the check of a
produce trace against the fold."""

from __future__ import annotations

import re

from ctp_state import producer_memory, state as sm
from ctp_state.errors import StoreError
from ctp_state.ingest import input_digest, input_producer_id, produce_input
from ctp_state.l0 import Record
from ctp_state.produce_trace import Trace
from ctp_state.producer import Producer
from tests.support import Wrapped


def produce(store, data, records, batch_records=4, **kw):
    digest = input_digest(data)
    return produce_input(
        store, records, producer_id=input_producer_id(digest), digest=digest, batch_records=batch_records, **kw
    )


class LoseAfter(Wrapped):
    """Lets ``ok`` creates of keys matching ``pattern`` through; the next one is carried
    out and its response lost, and from then on the store is unreachable for those keys:
    the run cannot learn that outcome."""

    def __init__(self, inner, pattern: str, ok: int):
        super().__init__(inner)
        self.pattern, self.ok, self.lost = re.compile(pattern), ok, False

    def _cut(self, key: str) -> None:
        if self.lost and self.pattern.search(key):
            raise StoreError(f"connection refused for {key!r}")

    def put_if_absent(self, key, data):
        self._cut(key)
        self.inner.put_if_absent(key, data)
        if self.pattern.search(key):
            if self.ok == 0:
                self.lost = True
                raise StoreError(f"connection reset after the request for {key!r} was sent")
            self.ok -= 1

    def get(self, key):
        self._cut(key)
        return self.inner.get(key)

    def head(self, key):
        self._cut(key)
        return self.inner.head(key)


class NeverLands(LoseAfter):
    """Lets ``ok`` creates of matching keys through; then the store is unreachable for
    them before the next one lands."""

    def put_if_absent(self, key, data):
        if self.pattern.search(key) and self.ok == 0:
            self.lost = True
        self._cut(key)
        self.inner.put_if_absent(key, data)
        if self.pattern.search(key):
            self.ok -= 1


def crowd_out(store, n: int = producer_memory.MAX_PRODUCERS) -> None:
    """``n`` short-lived producers (fresh ids, like `ctp produce --generate`) each
    write one record to t/0."""
    for i in range(n):
        with Producer(store, epoch_ttl_s=60, append_threads=1) as other:
            assert other.write([(("t", 0), [Record(f"noise-{i}".encode())])])[0].accepted


P = "p"


def assert_true_of(st: sm.PartitionState, cur: Trace, seed: int) -> None:
    """What trace ``cur`` says of the fold at its offset (the producer's memory, the
    bounds on the applied epochs) is true of the fold's state ``st`` there."""
    remembered = next((p for p in st.producers if p.producer_id == P), None)
    if cur.known == "yes":
        assert remembered is not None and remembered.last_seq == cur.held - 1, (seed, cur, remembered)
    elif cur.known == "no":
        assert remembered is None, (seed, cur, remembered)
    if st.initialized:
        assert st.max_applied_epoch <= cur.max_ub, (seed, cur, st.max_applied_epoch)
        assert cur.prev_lb <= st.previous_applied_epoch <= cur.prev_ub, (seed, cur, st.previous_applied_epoch)
