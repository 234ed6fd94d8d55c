"""When the reconciler advances an idle partition (R6), as pure functions: no later
than ``idle_lag`` epochs after its lower bound, and -- unless ticks go together -- first
at an epoch of its own, so that partitions created together do not all tick in the
same run (docs/design.md section 14, "Spreading the ticks").

A partition's *phase* is ``crc32("<topic>/<partition>") mod idle_lag`` (not Python's
``hash``, which every process salts: every reconciler and GC must agree). An idle
partition is due from the first epoch past its lower bound whose remainder mod
``idle_lag`` is its phase -- at most ``idle_lag`` epochs past it, so R6's bound holds --
and stays due until it is advanced. Once it ticks at its phase its bound is that epoch,
so the next tick falls ``idle_lag`` epochs later, at its phase again: the same number
of ticks as ticking together, spread over the runs. A tick off its phase (C jumped past
it, or the partition was claimed then) is followed by one at the next phase epoch,
which spreads partitions that ticked together again. Ticking earlier than R6 requires
is always allowed (the fold refuses only a tick that does not move the partition on).
"""

from __future__ import annotations

import zlib


def tick_phase(topic: str, partition: int, idle_lag: int) -> int:
    """The epoch remainder mod ``idle_lag`` at which ``(topic, partition)`` ticks."""
    return zlib.crc32(f"{topic}/{partition}".encode()) % idle_lag


def due_epoch(topic: str, partition: int, bound: int, idle_lag: int, *, spread: bool) -> int:
    """The epoch from which an idle partition with lower bound ``bound`` is due: its
    first phase epoch past ``bound`` (never later than ``bound + idle_lag``), or
    ``bound + idle_lag`` when ticks are not spread. Once due it stays due until it is
    advanced (a run that skipped the epoch, or claimed the partition then, leaves it
    due for the next)."""
    if not spread:
        return bound + idle_lag
    return bound + 1 + (tick_phase(topic, partition, idle_lag) - bound - 1) % idle_lag


def idle_due(topic: str, partition: int, bound: int, cluster_epoch: int, idle_lag: int, *, spread: bool) -> bool:
    """R6: an idle partition with lower bound ``bound`` is due at ``cluster_epoch``."""
    return cluster_epoch >= due_epoch(topic, partition, bound, idle_lag, spread=spread)
