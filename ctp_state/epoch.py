"""The cluster epoch C, kept in the object store.

Each epoch value has a create-if-absent marker object, so an advance is one atomic
create: two concurrent advancers can never produce the same value, and every value
an advancer returns is larger than any it read. Markers are dense: an advancer creates
marker ``n + 1`` only after it saw marker ``n``. Epoch 1 is implicit: a new store starts
at C = 1.

A small hint object names the newest epoch an advancer created, so reading C costs a
GET of the hint and one LIST of the markers from the hinted one on. The hint is only a
cache and is believed only as far as a marker vouches for it: the LIST must start with
the hinted marker. A hint no marker vouches for (a hand edit, a flipped digit, a bug)
is ignored, C is found from the markers alone, and the hint is rewritten. A hint that
a racing advancer overwrote with an older value only makes the LIST a little longer.
Epochs stay within :data:`~ctp_state.validate.MAX_EPOCH` (the 18 digits of an L0 key);
``advance`` refuses to pass it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable

from ctp_state import layout, validate
from ctp_state.errors import CorruptData, InvalidEpoch, ObjectNotFound, StoreError
from ctp_state.sequence import create_next
from ctp_state.storage import ObjectStore

MAX_ADVANCE_ATTEMPTS = 1000
log = logging.getLogger(__name__)


class ClusterEpoch:
    def __init__(self, store: ObjectStore):
        self.store = store
        #: Times a hint was found that no marker vouches for (operators: see the log).
        self.unvouched_hints = 0

    def _hint(self) -> int | None:
        """The hinted epoch, or None when there is no usable hint."""
        try:
            data = self.store.get(layout.EPOCH_HINT)
        except ObjectNotFound:
            return None
        try:
            return validate.epoch(json.loads(data)["epoch"], what="epoch hint")
        except (ValueError, KeyError, TypeError, CorruptData) as e:
            log.warning("ignoring the cluster epoch hint %s: it does not parse (%s)", layout.EPOCH_HINT, e)
            return None
        except Exception as e:  # InvalidEpoch and friends: out of range
            log.warning("ignoring the cluster epoch hint %s: %s", layout.EPOCH_HINT, e)
            return None

    def _run_from(self, start: int) -> int | None:
        """The last epoch of the dense run of markers starting at ``start`` (>= 2), or
        None if marker ``start`` does not exist."""
        after = layout.epoch_marker(start - 1) if start > 2 else None
        expected, last = start, None
        for info in self.store.list(layout.EPOCH_MARKERS, start_after=after):
            epoch = layout.parse_epoch_marker(info.key)
            if epoch != expected:
                break  # markers are dense; anything past a gap was not made by an advance
            last, expected = epoch, epoch + 1
        return last

    def current(self, *, repair: bool = True) -> int:
        """Read C: the newest marker of the dense run, starting from a vouched hint.
        An unvouched hint is rewritten unless ``repair`` is False."""
        hint = self._hint()
        if hint is not None and hint >= 2:
            last = self._run_from(hint)
            if last is not None:
                return last
            self.unvouched_hints += 1
            log.warning("the cluster epoch hint says %d but no marker vouches for it; reading the markers", hint)
        last = self._run_from(2)
        epoch = 1 if last is None else last
        if repair and hint is not None and hint != epoch and hint >= 2:
            self._write_hint(epoch)  # repair the cache so the next reader pays one LIST
        return epoch

    def _write_hint(self, epoch: int) -> None:
        self.store.put(layout.EPOCH_HINT, json.dumps({"epoch": epoch}).encode())

    def advance(self) -> int:
        """Atomically move C to the next value and return it."""
        # The marker names this advance, so a create whose response was lost and that is
        # sent again is recognised as ours, and two advancers never both own an epoch.
        token = uuid.uuid4().hex

        def marker(nxt: int) -> tuple[str, bytes]:
            if nxt > validate.MAX_EPOCH:
                raise InvalidEpoch(
                    nxt,
                    f"the cluster epoch is at its maximum {validate.MAX_EPOCH} "
                    "(L0 keys hold 18 digits); it cannot advance",
                )
            return layout.epoch_marker(nxt), json.dumps({"epoch": nxt, "advance": token}).encode()

        # another advancer took nxt: try the one after (markers are dense, C only grows)
        nxt = create_next(
            self.store,
            self.current() + 1,
            marker,
            after_loss=lambda n: n + 1,
            what="cluster epoch advance",
            attempts=MAX_ADVANCE_ATTEMPTS,
        )
        try:
            self._write_hint(nxt)
        except (StoreError, OSError) as e:  # C moved: failing now would make a retry advance twice
            log.warning("advanced the cluster epoch to %d but could not update its hint: %s", nxt, e)
        return nxt


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
