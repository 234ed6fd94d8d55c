"""The cluster epoch C, kept in the object store.

Each epoch value has a create-if-absent marker object, so an advance is one atomic
create: two concurrent advancers can never produce the same value, and every value
an advancer returns is larger than any it read. A small hint object names the newest
epoch an advancer created; readers read the hint and probe the next marker, so reading
C costs O(1) requests (a GET and a HEAD) however many epochs have passed. A hint that
a racing advancer overwrote with an older value only costs extra probes. Epoch 1 is
implicit: a new store starts at C = 1.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

from ctp_state import layout, validate
from ctp_state.errors import ContentionTimeout, CorruptData, KeyExists, ObjectNotFound
from ctp_state.store import ObjectStore

MAX_ADVANCE_ATTEMPTS = 1000


class ClusterEpoch:
    def __init__(self, store: ObjectStore):
        self.store = store

    def _hint(self) -> int:
        try:
            data = self.store.get(layout.EPOCH_HINT)
        except ObjectNotFound:
            return 1
        try:
            return validate.epoch(json.loads(data)["epoch"], what="epoch hint")
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptData(layout.EPOCH_HINT, f"epoch hint is malformed: {e}") from None

    def current(self) -> int:
        """Read C: the hint, then probe forward to the newest marker."""
        epoch = self._hint()
        while self.store.head(layout.epoch_marker(epoch + 1)) is not None:
            epoch += 1
        return epoch

    def advance(self) -> int:
        """Atomically move C to the next value and return it."""
        epoch = self.current()
        for _ in range(MAX_ADVANCE_ATTEMPTS):
            nxt = validate.epoch(epoch + 1)
            try:
                self.store.put_if_absent(layout.epoch_marker(nxt), json.dumps({"epoch": nxt}).encode())
            except KeyExists:
                epoch = nxt  # another advancer took it; try the one after
                continue
            self.store.put(layout.EPOCH_HINT, json.dumps({"epoch": nxt}).encode())
            return nxt
        raise ContentionTimeout("cluster epoch advance", MAX_ADVANCE_ATTEMPTS)


class EpochCache:
    """What producers use: the cluster epoch, re-read at most every ``ttl_s`` seconds.

    A stale epoch is safe (R1/R2 reject it if the partition moved past it, and the
    producer is told); the TTL only bounds how often producers pay for a read.
    """

    def __init__(self, source: ClusterEpoch, ttl_s: float = 5.0, clock: Callable[[], float] = time.monotonic):
        self.source, self.ttl_s, self.clock = source, ttl_s, clock
        self._value: int | None = None
        self._read_at = 0.0
        self._lock = threading.Lock()

    def get(self) -> int:
        with self._lock:
            now = self.clock()
            if self._value is None or now - self._read_at >= self.ttl_s:
                self._value = self.source.current()
                self._read_at = now
            return self._value

    def invalidate(self) -> None:
        with self._lock:
            self._value = None
