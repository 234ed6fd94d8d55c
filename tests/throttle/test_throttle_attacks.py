"""What an adversarial review of the GC's AIMD throttling found (each test failed before
its fix): budgets that ran out on long listings, a deleter that trusted the store's
answer over its plan, hangs on errors while settling a batch, quadratic job picking."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from ctp_state import layout
from ctp_state.errors import StoreError
from ctp_state.gc import delete as G, delete_objects, scan_prefix
from ctp_state.storage import DeleteResult, LocalStore, ObjectInfo
from ctp_state.throttle import Aimd

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# F1 -- the listing's retry budgets are totals per prefix, not per request -------------


def test_a_long_listing_that_keeps_making_progress_is_not_abandoned(tmp_path):
    """Every page (20 keys) is throttled once and then served. Each retry makes
    progress, yet the scan gives up after 60 throttles in total (1,200 keys in): a
    prefix of ~140k keys under a steady 30% SlowDown rate fails the whole GC run, and
    the garbage that makes the prefix big is never deleted. Before b3a9101 every page
    had its own budget (botocore's 10 attempts)."""
    store = LocalStore(str(tmp_path / "s"), fsync=False)
    for i in range(2000):
        store.put(layout.l0_key(3, 1, f"k{i:05d}"), b"x")

    class PageThrottle:
        def list(self, prefix, start_after=None, end_before=None):
            for i, info in enumerate(store.list(prefix, start_after, end_before)):
                if i == 20:
                    raise StoreError("SlowDown", "SlowDown")
                yield info

    scan = scan_prefix(
        store, "l0/003/", 5, lister=PageThrottle(), limiter=Aimd(1, base_delay_s=0.0001, max_delay_s=0.001)
    )
    assert len(scan.candidates) == 2000


# F2 -- an exception in settle() (outside the worker's try) hangs the pool --------------


def _run(code: str, timeout: float = 30) -> subprocess.CompletedProcess | None:
    env = {**os.environ, "PYTHONPATH": REPO}
    try:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)], env=env, timeout=timeout, capture_output=True, text=True
        )
    except subprocess.TimeoutExpired:
        return None  # subprocess.run kills the child on timeout


PRELUDE = """
    import sys
    from ctp_state import layout
    from ctp_state.gc import delete_objects
    from ctp_state.storage import DeleteResult, LocalStore, ObjectInfo
    store = LocalStore(sys.argv[1] if len(sys.argv) > 1 else {root!r}, fsync=False)
    keys = [layout.l0_key(s, 1, f"k{{i}}") for s in range(3) for i in range(5)]
    for k in keys:
        store.put(k, b"x")
    todo = [ObjectInfo(k, 1, 0.0) for k in keys]
"""


def test_an_unexpected_key_in_a_delete_response_fails_the_run_instead_of_hanging_it(tmp_path):
    """settle() runs outside the worker's try: when it raises before ``active[0] -= 1``
    (here a KeyError on ``sizes[key]`` for a key the store reports but was not asked
    for), the other workers wait for ``active`` to reach 0 forever and
    ``delete_objects`` never returns. Before b3a9101 the same error propagated."""
    res = _run(
        PRELUDE.format(root=str(tmp_path / "s"))
        + """
    class Odd:
        def delete_many(self, ks):
            ks = list(ks)
            return DeleteResult(tuple(ks) + ("l0/009/000000000000000001/x.l0",), {})
    try:
        c = delete_objects(Odd(), todo, in_flight=4)
        print("returned", c.deleted + c.delete_errors)
    except Exception as e:
        print("raised", type(e).__name__)
    """
    )
    assert res is not None, "delete_objects hung (killed after 30 s)"
    assert "raised" in res.stdout or "returned 15" in res.stdout, (res.stdout, res.stderr)


def test_the_deleter_never_deletes_a_key_it_was_not_given(tmp_path):
    """A key in a delete response's errors is requeued and deleted whether or not it
    was in the request. Here the store answers the first request with SlowDown for a
    live key (epoch 9, above M) it was never asked about: the deleter deletes it (and
    then hangs, F2). The plan, not the store's response, must bound what is deleted."""
    root = str(tmp_path / "s")
    live = layout.l0_key(0, 9, "live")
    LocalStore(root, fsync=False).put(live, b"live data")
    _run(
        PRELUDE.format(root=root)
        + f"""
    class Echo:
        first = True
        def delete_many(self, ks):
            ks = list(ks)
            if Echo.first:
                Echo.first = False
                return DeleteResult((), {{k: "SlowDown" for k in ks + [{live!r}]}})
            return store.delete_many(ks)
    delete_objects(Echo(), todo, in_flight=2)
    """,
        timeout=15,
    )
    assert LocalStore(root, fsync=False).head(live) is not None, "a live key above M was deleted"


def test_a_key_missing_from_a_delete_response_is_counted_not_dropped(tmp_path):
    """A key that is neither in ``deleted`` nor in ``errors`` is silently dropped: the
    run ends ``ok`` with one key neither deleted nor failed (``done`` never reaches
    the total)."""
    store = LocalStore(str(tmp_path / "s"), fsync=False)
    keys = [layout.l0_key(1, 1, f"k{i}") for i in range(10)]
    for k in keys:
        store.put(k, b"x")

    class Forgetful:
        def delete_many(self, ks):
            ks = list(ks)
            res = store.delete_many(ks[1:])  # the first key is neither deleted nor reported
            return DeleteResult(res.deleted, res.errors)

    progress: list[tuple[int, int]] = []
    c = delete_objects(
        Forgetful(), [ObjectInfo(k, 1, 0.0) for k in keys], on_progress=lambda d, t: progress.append((d, t))
    )
    assert c.deleted + c.delete_errors == 10, (c.deleted, c.delete_errors)
    assert progress[-1] == (10, 10)


# F3 -- take() recomputes every queued job's prefixes on every poll, under the lock -----


def test_picking_a_job_is_not_quadratic_in_the_queue(monkeypatch):
    """One hot prefix held at one request in flight, 8 workers: the 7 idle workers
    poll every 20 ms and each poll walks the whole queue computing ``spread_of`` for
    every key of every job, holding ``cond``. 50k keys -> ~850k calls; 300k keys took
    6 s CPU (vs 0.6 s at in_flight=1) and it grows with the square of the backlog."""
    calls = [0]
    orig = G.spread_of

    def counting(k: str) -> str:
        calls[0] += 1
        return orig(k)

    monkeypatch.setattr(G, "spread_of", counting)
    n = 50_000
    todo = [ObjectInfo(layout.l0_key(7, 1, f"k{i:07d}"), 1, 0.0) for i in range(n)]

    class Slow:
        def delete_many(self, ks):
            import time

            time.sleep(0.005)
            return DeleteResult(tuple(ks), {})

    lim = Aimd(1)  # the hot prefix, down at one request in flight
    c = delete_objects(Slow(), todo, in_flight=8, limiter=lim)
    assert c.deleted == n
    assert calls[0] <= 4 * n, f"{calls[0]:,} spread_of calls for {n:,} keys"


# F4 -- "every ticket is given back exactly once" is not enforced ------------------------


def test_a_ticket_given_back_twice_is_refused_even_with_others_in_flight():
    a = Aimd(2)
    t1, _t2 = a.acquire("p"), a.acquire("p")
    a.release(t1)
    with pytest.raises(RuntimeError, match="given back twice"):
        a.release(t1)  # accepted today: it returns t2's slot, in_flight undercounts


# Minor -- lowest_limit says "0: no deletes" but reports the ceiling -------------------


def test_lowest_limit_is_zero_when_nothing_was_deleted():
    assert delete_objects(LocalStore.__new__(LocalStore), []).lowest_limit == 0.0


def test_an_exception_while_settling_a_batch_fails_the_run_instead_of_hanging_it(tmp_path):
    """Same hang, other trigger: anything raising in settle() before ``active[0] -= 1``
    (here the limiter's bookkeeping)."""
    res = _run(
        PRELUDE.format(root=str(tmp_path / "s"))
        + """
    from ctp_state.throttle import Aimd
    class Broken(Aimd):
        def success(self, t):
            super().success(t)
            raise RuntimeError("boom")
    try:
        delete_objects(store, todo, in_flight=4, limiter=Broken(4))
    except RuntimeError as e:
        print("raised", e)
    """
    )
    assert res is not None, "delete_objects hung (killed after 30 s)"
    assert "raised boom" in res.stdout, (res.stdout, res.stderr)
