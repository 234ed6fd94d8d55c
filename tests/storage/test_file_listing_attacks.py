"""Found by adversarial review, now guarded: the file store's LIST is not a consistent view of a directory that grows.

``LocalStore.list`` (ctp_state/store.py ``_walk``) reads a directory with ``scandir``
and sorts; ``readdir`` on a directory being appended to may return an entry created
later (offset n+1) while missing one created earlier (offset n) -- POSIX leaves entries
added during a readdir unspecified, and hashed directories (ext4 htree) do exactly
that. ``PartitionLog.entries`` then declares the HEALTHY log corrupt ("state log is not
dense", LogGap/CorruptData): the GC records a failed run (StateUnreadable), a reconcile
run aborts in ``read_states``, a producer's lost-race catch-up reports its write as
rejected (correctly not written, but for a made-up reason), and ``ctp verify`` raises a
false corruption alarm. Found by tests/sim/test_stress_attacks.py.

Fix: on a gap, list again (from the last offset seen) before calling it a LogGap, or
HEAD the missing key: a create-if-absent log cannot really have a hole.
"""

from __future__ import annotations

import threading
import time

from ctp_state.entries import AccessMode
from ctp_state.errors import CtpError
from ctp_state.storage import open_store
from ctp_state.topics import create_topic
from tests.support import plog, space


def test_reading_a_healthy_growing_log_never_reports_it_corrupt(tmp_path):
    store = open_store(f"file://{tmp_path}/store", {"CTP_FSYNC": "0"})
    create_topic(store, "t", 1)
    stop = threading.Event()
    errors: list[str] = []

    def writer() -> None:
        log = plog(store, "t", 0, write_snapshots=False)
        st = log.read_state()
        i = 0
        while not stop.is_set():
            st = log.claim(st, f"o{i}", AccessMode.SHARED, lease_ms=1).outcome.state
            i += 1

    def reader() -> None:
        while not stop.is_set():
            try:
                plog(store, "t", 0, write_snapshots=False).read_state()
            except CtpError as e:
                errors.append(str(e))
                stop.set()

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 8  # the hole showed within about 5 s
    while not stop.is_set() and time.monotonic() < deadline:
        time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join()
    n = sum(1 for _ in store.list(f"logs/{space(store)}/000000/"))
    assert plog(store, "t", 0, write_snapshots=False).read_state().applied_offset == n - 1  # it is healthy
    assert not errors, f"a healthy log of {n} entries was reported corrupt: {errors[0]}"


def test_a_listing_resumed_inside_a_directory_keeps_the_shorter_named_directories_that_sort_after_it(tmp_path):
    """'-' sorts before '/': resumed after 'p/ab-c/y', the keys still to come are
    'p/ab-c/z' and then 'p/ab/x', whose directory 'ab' sorts before 'ab-c' by name.
    A walk that drops every child named at or before the resume point, except the one
    it lies in, loses 'p/ab/x'."""
    store = open_store(f"file://{tmp_path}/store", {"CTP_FSYNC": "0"})
    for key in ("p/a/w", "p/ab/x", "p/ab-c/y", "p/ab-c/z", "p/ab.d", "p/aa/v"):
        store.put(key, b"1")
    listed = [o.key for o in store.list("p/", start_after="p/ab-c/y")]
    assert listed == ["p/ab-c/z", "p/ab.d", "p/ab/x"]
