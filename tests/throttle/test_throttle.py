"""AIMD per spread prefix: the limiter alone, and the deleter against a store that
throttles like S3 does (too many requests in flight on one prefix -> 503 SlowDown)."""

from __future__ import annotations

import threading
import time

import pytest

from ctp_state import layout
from ctp_state.errors import StoreError
from ctp_state.gc import delete_objects, scan_prefix, spread_of
from ctp_state.storage import DeleteResult, LocalStore, ObjectInfo, ObjectStore
from ctp_state.throttle import Aimd, is_throttle
from tests.support import Wrapped


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_throttle_halves_the_limit_and_successes_grow_it_back_by_one_per_round_trip():
    a = Aimd(8, clock=Clock())
    t = a.acquire("p")
    a.throttled(t)
    assert a.limit("p") == 4.0 and a.limit("q") == 8.0  # per prefix
    for _ in range(4):  # one round trip at limit 4: ~4 successes -> +1
        a.success(a.acquire("p"))
    assert 4.9 < a.limit("p") < 5.0 + 1e-9
    for _ in range(200):
        a.success(a.acquire("p"))
    assert a.limit("p") == 8.0  # never above the ceiling


def test_throttles_of_requests_sent_before_the_last_decrease_do_not_decrease_again():
    a = Aimd(8, clock=Clock())
    burst = [a.acquire("p") for _ in range(8)]  # eight in flight, all throttled
    for t in burst:
        a.throttled(t)
    assert a.limit("p") == 4.0 and a.decreases("p") == 1 and a.throttles == 8
    a.throttled(a.acquire("p"))  # a request sent after the decrease does count
    assert a.limit("p") == 2.0


def test_at_the_floor_a_throttle_paces_the_prefix_and_successes_unwind_it():
    clock = Clock()
    a = Aimd(2, floor=1, base_delay_s=0.1, max_delay_s=0.5, clock=clock)
    a.throttled(a.acquire("p"))
    assert a.limit("p") == 1.0 and a.delay("p") == 0.0
    delays = []
    for _ in range(5):
        t = a.acquire("p", timeout_s=0) if a.room("p") == 0 else None
        if t is None:
            clock.t += a.room("p")
            t = a.acquire("p", timeout_s=0)
        a.throttled(t)
        delays.append(a.delay("p"))
    assert delays == [0.1, 0.2, 0.4, 0.5, 0.5]  # doubling, capped
    assert a.room("p") == pytest.approx(0.5)  # the next request waits
    assert a.try_acquire("p") is None
    clock.t += 0.5
    for expect in (0.25, 0.125, 0.0):
        a.success(a.acquire("p", timeout_s=0))
        assert a.delay("p") == expect
    a.success(a.acquire("p", timeout_s=0))
    assert a.limit("p") == 2.0  # then the limit grows again


def test_acquire_waits_for_room_and_all_or_nothing_takes_every_prefix_or_none():
    a = Aimd(1)
    held = a.acquire("p")
    assert a.try_acquire_all(["p", "q"]) is None and a.try_acquire("q") is not None
    got: list[float] = []

    def waiter() -> None:
        t0 = time.monotonic()
        a.release(a.acquire("p", timeout_s=5))
        got.append(time.monotonic() - t0)

    th = threading.Thread(target=waiter)
    th.start()
    time.sleep(0.2)
    assert not got  # still waiting: "p" is full
    a.release(held)
    th.join(5)
    assert got and got[0] >= 0.15
    with pytest.raises(RuntimeError, match="given back twice"):
        a.release(held)
    with pytest.raises(TimeoutError):
        b = Aimd(1)
        b.acquire("x")
        b.acquire("x", timeout_s=0.05)


def test_throttle_codes():
    assert all(is_throttle(c) for c in ("SlowDown", "503", "Throttling", "TooManyRequests", "429"))
    assert not any(is_throttle(c) for c in ("", None, "500", "InternalError", "AccessDenied", "NoSuchKey"))


class PrefixRateStore(Wrapped):
    """S3's throttle, on a local store: more than ``capacity`` requests in flight on one
    spread prefix -> every key of the extra request gets ``SlowDown``; a request takes
    ``latency_s``. Records the largest concurrency each prefix saw."""

    def __init__(self, inner: ObjectStore, capacity: int, latency_s: float = 0.01):
        super().__init__(inner)
        self.capacity, self.latency_s = capacity, latency_s
        self.in_flight: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.requests = self.throttled = 0
        self._lock = threading.Lock()

    def _delete_batch(self, keys):
        prefixes = {spread_of(k) for k in keys}
        with self._lock:
            self.requests += 1
            over = any(self.in_flight.get(p, 0) >= self.capacity for p in prefixes)
            for p in prefixes:
                self.in_flight[p] = self.in_flight.get(p, 0) + 1
                self.peak[p] = max(self.peak.get(p, 0), self.in_flight[p])
            self.throttled += over
        try:
            time.sleep(self.latency_s)
            if over:
                return DeleteResult((), dict.fromkeys(keys, "SlowDown"))
            return self.inner._delete_batch(keys)
        finally:
            with self._lock:
                for p in prefixes:
                    self.in_flight[p] -= 1


class NoBackoff(Aimd):
    """The old behaviour: retry throttled keys, never send fewer requests."""

    def throttled(self, t):
        self.release(t)
        self.throttles += 1


def _hot_prefix(tmp_path, n: int) -> tuple[LocalStore, list]:
    """``n`` keys in one hot spread prefix; the first 100 exist (absent keys delete as
    S3's do, so the rest cost no files)."""
    store = LocalStore(str(tmp_path / "s"), fsync=False)
    keys = [layout.l0_key(7, 1 + i % 5, f"k{i:06d}") for i in range(n)]
    for k in keys[:100]:
        store.put(k, b"x")
    return store, [ObjectInfo(k, 1, 0.0) for k in keys]


def test_the_deleter_sends_fewer_requests_to_a_prefix_that_throttles(tmp_path):
    store, todo = _hot_prefix(tmp_path, 16_000)
    adaptive = PrefixRateStore(store, capacity=2, latency_s=0.02)
    c = delete_objects(adaptive, todo, in_flight=8, throttle_attempts=20)
    assert (c.deleted, c.delete_errors) == (16_000, 0) and not list(store.list(layout.L0_ROOT))
    assert c.throttled >= 1 and c.lowest_limit <= 2  # it backed off to the prefix's capacity

    # Retrying at full concurrency keeps hitting the limit until keys run out of attempts.
    store2, todo2 = _hot_prefix(tmp_path / "2", 16_000)
    stubborn = PrefixRateStore(store2, capacity=2, latency_s=0.02)
    c2 = delete_objects(stubborn, todo2, in_flight=8, throttle_attempts=20, limiter=NoBackoff(8))
    assert c2.delete_errors > 0 and set(c2.failed_keys.values()) == {"SlowDown"}
    assert adaptive.throttled * 3 <= stubborn.throttled, (adaptive.throttled, stubborn.throttled)


def test_a_listing_interrupted_by_throttles_and_errors_resumes_where_it_stopped(tmp_path):
    store = LocalStore(str(tmp_path / "s"), fsync=False)
    keys = [layout.l0_key(3, e, f"k{i}") for e in (1, 2, 3, 9) for i in range(5)]
    for k in keys:
        store.put(k, b"x")

    class Interrupting(PrefixRateStore):
        def __init__(self, inner, codes):
            super().__init__(inner, capacity=1)
            self.codes, self.calls, self.at = list(codes), [], 3

        def list(self, prefix="", start_after=None, end_before=None):
            self.calls.append(start_after)
            for i, info in enumerate(self.inner.list(prefix, start_after, end_before)):
                if i == self.at and self.codes:
                    raise StoreError("boom", self.codes.pop(0))
                yield info

    flaky = Interrupting(store, ["SlowDown", "500", "SlowDown"])
    sleeps: list[float] = []
    scan = scan_prefix(
        store, "l0/003/", 3, lister=flaky, limiter=Aimd(1, base_delay_s=0.001), sleep=sleeps.append, backoff_s=0.1
    )
    assert [i.key for i, _ in scan.candidates] == sorted(keys)[:15]  # every key once, in order
    assert scan.above == 9 and scan.retries == 3 and scan.throttled == 2 and sleeps == [0.1]
    assert flaky.calls[0] is None and all(flaky.calls[1:])  # resumed after the last key seen

    gone = Interrupting(store, ["500"] * 5)
    gone.at = 0  # no progress between failures: the budget runs out
    with pytest.raises(StoreError, match="boom"):
        scan_prefix(store, "l0/003/", 3, lister=gone, max_attempts=3, sleep=lambda s: None)
