"""R1, the fence window, as pure functions of a partition's state (the lock that
serialises producers around them lives in :mod:`ctp_state.fence`).

The window ``[oldest_accepted_epoch, max_seen_epoch]`` is volatile: never snapshotted,
collapsed to ``[max_applied_epoch]`` on recovery. An epoch in the window is accepted
concurrently; a newer one slides it (the old latest becomes the oldest); an older one is
stale.
"""

from __future__ import annotations

from dataclasses import replace

from ctp_state.state import PartitionState

IN_WINDOW, NEWER, STALE = "in_window", "newer", "stale"


def classify(s: PartitionState, epoch: int) -> str:
    w = s.window
    if w is None or epoch > w[1]:
        return NEWER
    if epoch >= w[0]:
        return IN_WINDOW
    return STALE


def slide(s: PartitionState, epoch: int) -> PartitionState:
    """Move the window for a newer epoch: the old latest becomes the oldest accepted."""
    w = s.window
    oldest = epoch if w is None else w[1]
    return replace(s, max_seen_epoch=epoch, oldest_accepted_epoch=oldest)


def recover(s: PartitionState) -> PartitionState:
    """After recovery the window collapses to ``[max_applied_epoch]``."""
    if s.max_seen_epoch == s.max_applied_epoch and s.oldest_accepted_epoch == s.max_applied_epoch:
        return s  # already collapsed (a state read from a snapshot with no tail): no copy
    return replace(s, max_seen_epoch=s.max_applied_epoch, oldest_accepted_epoch=s.max_applied_epoch)
