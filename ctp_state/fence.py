"""R1: the in-process epoch fence of one partition.

A producer fences its cluster epoch before it appends a placeholder:

- inside the window ``[oldest_accepted, latest_seen]`` it takes the shared side of a
  lock, so fences of in-window epochs proceed together;
- newer than the window it takes the exclusive side, which waits for in-flight
  appends under the old window to finish (so they are applied before the new epoch
  moves the applied window past them), slides the window so the old latest becomes
  the oldest, and downgrades to shared;
- older than the window it is refused with :class:`StaleClusterEpoch` carrying the
  window.

The window is the volatile part of :class:`~ctp_state.state.PartitionState`; the
decisions are the pure functions ``classify``/``slide`` there. This class adds only
the lock and the probe counters. The fence is an optimisation and a courtesy: the
apply-time check (R2) decides every verdict, whatever a fence said.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ctp_state import state as sm, window
from ctp_state.errors import StaleClusterEpoch


@dataclass
class FenceProbes:
    """Counters an operator can read (and tests assert on)."""

    window_slides: int = 0
    new_epoch_fences: int = 0
    same_epoch_fences: int = 0
    stale_rejections: int = 0
    last_rejected_gap: int = 0  # how far below the window the last stale epoch was
    window_size: int = 0  # epochs in [oldest_accepted, latest_seen] after the last fence (typically 2)


class EpochFence:
    """Shared/exclusive fence over the window held in a :class:`PartitionState`.

    ``get_state``/``set_state`` give access to the owner's current state; the owner
    must serialise its own state updates with ``state_lock`` (held briefly here too).
    """

    def __init__(
        self,
        get_state: Callable[[], sm.PartitionState],
        set_state: Callable[[sm.PartitionState], None],
        state_lock: threading.Lock,
    ):
        self._get, self._set, self._state_lock = get_state, set_state, state_lock
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0
        self.probes = FenceProbes()

    @property
    def window(self) -> tuple[int, int] | None:
        return self._get().window

    @contextmanager
    def fence(self, epoch: int) -> Iterator[tuple[int, int]]:
        """Hold a shared fence for ``epoch`` for the duration of the block.

        Raises :class:`StaleClusterEpoch` (with the window) if ``epoch`` is too old.
        """
        self._acquire(epoch)
        try:
            yield self._get().window  # type: ignore[misc]
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    def _acquire(self, epoch: int) -> None:
        with self._cond:
            waiting_as_writer = False
            try:
                while True:
                    st = self._get()
                    verdict = window.classify(st, epoch)
                    if verdict == window.IN_WINDOW:
                        # Writers waiting to slide get priority so a stream of
                        # in-window fences cannot starve a new epoch.
                        if self._writer or (self._writers_waiting and not waiting_as_writer):
                            self._cond.wait()
                            continue
                        self._readers += 1
                        self.probes.same_epoch_fences += 1
                        self._record_size(st.window)
                        return
                    if verdict == window.STALE:
                        w = st.window
                        self.probes.stale_rejections += 1
                        self.probes.last_rejected_gap = w[0] - epoch  # type: ignore[index]
                        raise StaleClusterEpoch(st.topic, st.partition, epoch, w)
                    # NEWER: exclusive side. Wait for in-flight shared holders to drain.
                    if self._writer or self._readers:
                        if not waiting_as_writer:
                            waiting_as_writer = True
                            self._writers_waiting += 1
                        self._cond.wait()
                        continue
                    self._writer = True
                    break
            finally:
                if waiting_as_writer:
                    self._writers_waiting -= 1
        # Exclusive: slide the window, then downgrade to shared.
        try:
            with self._state_lock:
                st = window.slide(self._get(), epoch)
                self._set(st)
        finally:
            with self._cond:
                self._writer = False
                self._readers += 1
                self.probes.window_slides += 1
                self.probes.new_epoch_fences += 1
                self._record_size(st.window)
                self._cond.notify_all()

    def _record_size(self, w: tuple[int, int] | None) -> None:
        self.probes.window_size = 0 if w is None else w[1] - w[0] + 1
