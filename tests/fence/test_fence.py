"""R1 under real thread concurrency: the shared/exclusive fence and its probes."""

from __future__ import annotations

import threading
import time

import pytest

from ctp_state import state as sm, window as epochs
from ctp_state.errors import StaleClusterEpoch
from ctp_state.fence import EpochFence
from tests.support import plog


def make_fence(window: tuple[int, int] | None) -> tuple[EpochFence, list[sm.PartitionState]]:
    s = sm.PartitionState("t", 0)
    if window:
        s = (
            epochs.slide(epochs.slide(s, window[0]), window[1])
            if window[0] != window[1]
            else epochs.slide(s, window[0])
        )
    box = [s]
    lock = threading.Lock()
    return EpochFence(lambda: box[0], lambda v: box.__setitem__(0, v), lock), box


def run_threads(n: int, target) -> list[BaseException | None]:
    errors: list[BaseException | None] = [None] * n

    def wrap(i: int) -> None:
        try:
            target(i)
        except BaseException as e:
            errors[i] = e

    threads = [threading.Thread(target=wrap, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a fence deadlocked"
    return errors


def test_fences_inside_the_window_hold_the_lock_together():
    fence, _ = make_fence((5, 6))
    n = 8
    barrier = threading.Barrier(n, timeout=5)

    def body(i: int) -> None:
        with fence.fence(5 + i % 2):
            barrier.wait()  # only passes if all 8 are inside at once

    assert run_threads(n, body) == [None] * n
    assert fence.probes.same_epoch_fences == n and fence.probes.window_slides == 0


def test_ten_concurrent_fences_of_one_new_epoch_slide_exactly_once():
    fence, box = make_fence((5, 6))
    start = threading.Barrier(10, timeout=5)
    inside = []

    def body(i: int) -> None:
        start.wait()
        with fence.fence(7) as w:
            inside.append(w)

    assert run_threads(10, body) == [None] * 10
    assert fence.probes.window_slides == 1
    assert fence.probes.new_epoch_fences == 1 and fence.probes.same_epoch_fences == 9
    assert box[0].window == (6, 7) and inside == [(6, 7)] * 10


def test_a_new_epoch_waits_for_in_flight_appends_under_the_old_window():
    fence, _ = make_fence((5, 5))
    events: list[str] = []
    holding = threading.Event()
    release = threading.Event()

    def old_writer() -> None:
        with fence.fence(5):
            holding.set()
            release.wait(5)
            events.append("old done")

    def new_writer() -> None:
        holding.wait(5)
        with fence.fence(6):
            events.append("new fenced")

    t1 = threading.Thread(target=old_writer)
    t2 = threading.Thread(target=new_writer)
    t1.start(), t2.start()
    holding.wait(5)
    time.sleep(0.2)
    assert events == []  # the slide is blocked behind the in-flight shared holder
    release.set()
    t1.join(5), t2.join(5)
    assert events == ["old done", "new fenced"]


def test_in_window_fences_do_not_starve_a_waiting_slide():
    fence, box = make_fence((5, 5))
    release = threading.Event()
    first_in = threading.Event()
    order: list[str] = []

    def holder() -> None:
        with fence.fence(5):
            first_in.set()
            release.wait(5)

    def slider() -> None:
        first_in.wait(5)
        with fence.fence(6):
            order.append("slide")

    def late_reader() -> None:
        first_in.wait(5)
        time.sleep(0.1)  # arrives after the slider started waiting
        with fence.fence(5):
            order.append("late")

    threads = [threading.Thread(target=f) for f in (holder, slider, late_reader)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    release.set()
    for t in threads:
        t.join(5)
    # After the slide the window is [5, 6], so the late in-window fence still succeeds,
    # but only after the slide went first.
    assert order == ["slide", "late"]
    assert box[0].window == (5, 6)


def test_stale_fence_is_refused_with_the_window_and_counted():
    fence, _ = make_fence((8, 9))
    with pytest.raises(StaleClusterEpoch) as e, fence.fence(5):
        pass
    assert e.value.window == (8, 9) and e.value.epoch == 5
    assert fence.probes.stale_rejections == 1 and fence.probes.last_rejected_gap == 3
    with fence.fence(9):
        assert fence.probes.window_size == 2  # [8, 9]: the design's "typical window of 2"
    fence1, _ = make_fence((9, 9))
    with fence1.fence(9):
        assert fence1.probes.window_size == 1


def test_a_restart_collapses_the_window_even_when_entries_follow_the_snapshot(store):
    # Epochs 5 then 6 leave the window [5, 6]. A process that starts afterwards reads
    # the state as a recovery: the window is [max_applied] = [6, 6], whether a snapshot
    # covers the newest entry or entries are replayed after it.
    from ctp_state.epoch import ClusterEpoch
    from ctp_state.l0 import Record
    from ctp_state.producer import Producer
    from ctp_state.topics import create_topic

    create_topic(store, "t", 1)
    ce = ClusterEpoch(store)
    log = plog(store, "t", 0, snapshot_every=10_000)
    with Producer(store) as prod:
        e5 = ce.advance()
        assert prod.write([(("t", 0), [Record(b"a")])], epoch=e5)[0].accepted
        log.write_snapshot(log.read_state())  # a snapshot covering the entries so far
        e6 = ce.advance()
        assert prod.write([(("t", 0), [Record(b"b")])], epoch=e6)[0].accepted
        assert prod.writer("t", 0).state.window == (e5, e6)  # the live process keeps its window
    restarted = plog(store, "t", 0, snapshot_every=10_000).read_state()
    assert restarted.applied_offset == 2 and restarted.max_applied_epoch == e6
    assert restarted.window == (e6, e6)
