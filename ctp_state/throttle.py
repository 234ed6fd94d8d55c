"""Adaptive concurrency for bulk requests: additive increase, multiplicative decrease.

An object store limits the request rate per key prefix and says so with a throttle
(S3: ``503 SlowDown``). Retrying alone keeps the pressure on: every retry is one more
request against the same prefix. The deleter and the lister therefore keep, per spread
prefix, a limit on requests in flight, in the spirit of TCP congestion control:

* a throttle halves the prefix's limit (once per window: throttles of requests that
  were already in flight when the limit last fell say nothing new);
* a throttle at the floor of one request paces the prefix instead: the next request
  waits, the wait doubling up to ``max_delay_s``;
* a success first halves any pacing delay, then grows the limit by ``1 / limit``
  (about one more request in flight per round trip), up to ``ceiling``.

This module is pure bookkeeping plus a condition variable; the caller decides what is a
throttle (:func:`is_throttle`) and what a request is.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

#: Error codes object stores use to say "slow down" (S3, MinIO, GCS/Azure via S3 gateways).
THROTTLE_CODES = frozenset(
    {
        "SlowDown",
        "503",
        "ServiceUnavailable",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestLimitExceeded",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequests",
        "TooManyRequestsException",
        "429",
        "BandwidthLimitExceeded",
        "EC2ThrottledException",
    }
)


def is_throttle(code: str | None) -> bool:
    """Whether an error code (or HTTP status as a string) asks the client to slow down."""
    return bool(code) and code in THROTTLE_CODES


@dataclass
class _Prefix:
    limit: float
    in_flight: int = 0
    window: int = 0  # bumped on every decrease; a ticket from an older window is stale
    delay_s: float = 0.0
    not_before: float = 0.0
    decreases: int = 0


@dataclass(frozen=True)
class Ticket:
    key: str
    window: int
    serial: int = 0


class Aimd:
    """Per-key concurrency limits under additive increase / multiplicative decrease.

    ``acquire(key)`` blocks until ``key`` has room (and any pacing delay has passed) and
    returns a :class:`Ticket`; every ticket is given back exactly once with
    :meth:`success`, :meth:`throttled` or :meth:`release` (an error that says nothing
    about load)."""

    def __init__(
        self,
        ceiling: int,
        *,
        start: float | None = None,
        floor: int = 1,
        decrease: float = 0.5,
        base_delay_s: float = 0.05,
        max_delay_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if ceiling < 1 or floor < 1 or floor > ceiling:
            raise ValueError(f"need 1 <= floor <= ceiling, got floor={floor} ceiling={ceiling}")
        if not 0 < decrease < 1:
            raise ValueError(f"decrease must be in (0, 1), got {decrease}")
        self.ceiling = float(ceiling)
        self.floor = float(floor)
        self.start = float(ceiling if start is None else min(max(start, floor), ceiling))
        self.decrease = decrease
        self.base_delay_s = base_delay_s
        self.max_delay_s = max_delay_s
        self.clock = clock
        self._keys: dict[str, _Prefix] = {}
        self._out: set[int] = set()
        self._serial = itertools.count(1)
        self._cond = threading.Condition()
        self.throttles = 0  # throttle signals seen, stale ones included
        self.lowest = self.start  # the lowest limit any key reached

    def _state(self, key: str) -> _Prefix:
        st = self._keys.get(key)
        if st is None:
            st = self._keys[key] = _Prefix(self.start)
        return st

    def limit(self, key: str) -> float:
        with self._cond:
            return self._state(key).limit

    def delay(self, key: str) -> float:
        with self._cond:
            return self._state(key).delay_s

    def decreases(self, key: str) -> int:
        with self._cond:
            return self._state(key).decreases

    def room(self, key: str, now: float | None = None) -> float:
        """0 when ``key`` can take a request now, else seconds to wait (inf: full)."""
        with self._cond:
            return self._room(self._state(key), self.clock() if now is None else now)

    @staticmethod
    def _room(st: _Prefix, now: float) -> float:
        if st.in_flight >= int(st.limit):
            return float("inf")
        return max(0.0, st.not_before - now)

    def try_acquire(self, key: str) -> Ticket | None:
        """A ticket if ``key`` has room now, else None (never blocks)."""
        with self._cond:
            st = self._state(key)
            if self._room(st, self.clock()) > 0:
                return None
            return self._ticket(key, st)

    def _ticket(self, key: str, st: _Prefix) -> Ticket:
        st.in_flight += 1
        t = Ticket(key, st.window, next(self._serial))
        self._out.add(t.serial)
        return t

    def try_acquire_all(self, keys: list[str]) -> list[Ticket] | None:
        """One ticket per key if every key has room now, else None (all or nothing)."""
        with self._cond:
            now = self.clock()
            states = [self._state(k) for k in keys]
            if any(self._room(st, now) > 0 for st in states):
                return None
            return [self._ticket(k, st) for k, st in zip(keys, states)]

    def acquire(self, key: str, timeout_s: float | None = None) -> Ticket:
        deadline = None if timeout_s is None else self.clock() + timeout_s
        with self._cond:
            st = self._state(key)
            while True:
                now = self.clock()
                wait = self._room(st, now)
                if wait <= 0:
                    return self._ticket(key, st)
                if deadline is not None:
                    if now >= deadline:
                        raise TimeoutError(f"no room for {key!r} within {timeout_s}s")
                    wait = min(wait, deadline - now)
                self._cond.wait(None if wait == float("inf") else wait)

    def _give_back(self, t: Ticket) -> _Prefix:
        st = self._state(t.key)
        if t.serial not in self._out or st.in_flight <= 0:
            raise RuntimeError(f"ticket for {t.key!r} given back twice")
        self._out.discard(t.serial)
        st.in_flight -= 1
        self._cond.notify_all()
        return st

    def success(self, t: Ticket) -> None:
        with self._cond:
            st = self._give_back(t)
            if st.delay_s > 0:
                st.delay_s = st.delay_s / 2 if st.delay_s / 2 >= self.base_delay_s else 0.0
            else:
                st.limit = min(self.ceiling, st.limit + 1.0 / st.limit)

    def throttled(self, t: Ticket) -> None:
        with self._cond:
            st = self._give_back(t)
            self.throttles += 1
            if t.window != st.window:
                return  # sent before the last decrease: already answered
            st.window += 1
            st.decreases += 1
            if st.limit > self.floor:
                st.limit = max(self.floor, st.limit * self.decrease)
            else:
                st.delay_s = min(self.max_delay_s, max(self.base_delay_s, st.delay_s * 2))
            st.not_before = self.clock() + st.delay_s
            self.lowest = min(self.lowest, st.limit)

    def release(self, t: Ticket) -> None:
        with self._cond:
            self._give_back(t)
