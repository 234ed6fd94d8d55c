"""Found by adversarial review, now guarded: claims are timed by the claimer's clock alone (ctp_state/entries.py ``Claim``:
``now_ms``, ``lease_until_ms``; ctp_state/state.py ``live_holders``). A reconciler whose
clock runs ahead by S that dies after its claim (kill -9, OOM, a pre-empted Spark
driver) blocks the partition for S + lease on everyone else's clock, not for the lease:
no other reconciler can claim it, its pending placeholders are not lifted, its lower
bound does not move, and M is pinned for the whole cluster (the GC is wedged).

Here the dead reconciler asked for a 1 s lease with a clock one day fast; a healthy
reconciler 3 s later (well after the lease it asked for) is still refused.
"""

from __future__ import annotations

import time

from ctp_state.entries import AccessMode
from ctp_state.epoch import ClusterEpoch
from ctp_state.gc import run_gc
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.reconcile import run_reconcile
from ctp_state.topics import create_topic
from tests.support import plog

DAY_MS = 24 * 3600 * 1000


def test_a_dead_reconciler_with_a_fast_clock_does_not_block_the_partition_past_its_lease(fstore, gate):
    store = fstore
    create_topic(store, "t", 1)
    ce = ClusterEpoch(store)
    ce.advance()
    with Producer(store, epoch_ttl_s=0) as prod:
        assert prod.write([(("t", 0), [Record(b"x")])])[0].accepted
    for _ in range(3):
        ce.advance()

    log = plog(store, "t", 0)
    fast = lambda: int(time.time() * 1000) + DAY_MS  # noqa: E731
    got = log.claim(log.read_state(), "reconciler:fast-clock", AccessMode.EXCLUSIVE, lease_ms=1000, clock_ms=fast)
    assert got.outcome.accepted  # ... and then the process dies: no release

    time.sleep(3)  # the 1 s lease it asked for is long over
    summary = run_reconcile(store)
    part = summary.partitions[0]
    rec = run_gc(store, gate=gate)
    assert part.status == "reconciled", (part.status, part.reason, "M stays", rec.m)
