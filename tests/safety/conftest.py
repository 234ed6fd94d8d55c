"""Fixtures for the safety regressions: a real GX gate per test, and a store that
loses the responses of chosen writes after they persisted."""

from __future__ import annotations

import re
import threading

import pytest

from ctp_state.errors import StoreError
from ctp_state.storage import ObjectStore
from tests.support import Wrapped


@pytest.fixture
def gate(tmp_path):
    from expectations.gate import GxGate

    return GxGate(str(tmp_path / "report"))


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
