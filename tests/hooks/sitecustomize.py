"""Test hooks installed into every process a test starts: this directory is on the
``PYTHONPATH`` of child processes (``tests.support.with_this_checkout`` and the fault
simulation put it there), so Python imports this module at start-up — in ``ctp`` runs,
spark-submit drivers and their Python workers alike.

* **Crash points.** ``CTP_FAULT=point[:n][,point[:n]...]`` kills the process's whole
  session with SIGKILL when :func:`ctp_state.crashpoints.reached` marks ``point`` for
  item ``n`` (default 0). The tests start the process under test in a session of its
  own (``setsid``), so the whole application (Spark driver, JVM, Python workers) dies
  at once, as on a machine failure. ``CTP_FAULT`` is read at each point, so a
  long-lived process can be armed later.
* **Pauses.** ``CTP_PAUSE=point[:n]=seconds[,...]`` makes the process wait that long at
  the point (the simulation overlaps a delete and re-create, or a GC sweep, with it).
* **Small producer memory.** ``CTP_TEST_PRODUCER_MEMORY=max,epochs`` sets
  ``ctp_state.producer_memory.MAX_PRODUCERS`` and ``PRODUCER_RETENTION_EPOCHS`` (tests of what
  happens after a partition forgot a producer).
* **An abort at exit.** ``CTP_TEST_ABORT_AT_EXIT=1`` registers a native exit handler that
  aborts the process, as pyarrow's thread pools sometimes do at teardown.
* **Planted bugs** for the self-tests of the simulation and the race tests:
  ``CTP_SIM_PLANT`` names one, and it is then in every process, as a bug in the code
  would be. Unset, nothing changes.
"""

import os
import signal


def _target(point: str) -> int | None:
    for item in os.environ.get("CTP_FAULT", "").split(","):
        name, _, n = item.strip().partition(":")
        if name == point:
            return int(n) if n else 0
    return None


def _session_pids(sid: int) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # field 6 of stat: the session id
            pids.append(int(name))
    return pids


def _pause(point: str, index: int) -> None:
    """``CTP_PAUSE=point[:n]=seconds[,...]``: wait there (a process stalled at that
    moment, while others go on)."""
    for item in os.environ.get("CTP_PAUSE", "").split(","):
        where, _, seconds = item.strip().partition("=")
        name, _, n = where.partition(":")
        if name == point and (int(n) if n else 0) == index and seconds:
            import time

            time.sleep(float(seconds))


def _crash(point: str, index: int) -> None:
    """Kill every process of this session (PySpark workers sit in process groups of
    their own, so a group kill from a task would spare the driver and the JVM)."""
    _pause(point, index)
    if _target(point) != index:
        return
    me = os.getpid()
    try:
        for pid in _session_pids(os.getsid(0)):
            if pid != me:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
    finally:
        os.kill(me, signal.SIGKILL)


def _install() -> None:
    try:
        from ctp_state import crashpoints
    except ImportError:  # a process that does not run ctp (e.g. the JVM's helpers)
        return
    crashpoints.install(_crash)


_install()

_MEMORY = os.environ.get("CTP_TEST_PRODUCER_MEMORY")
if _MEMORY:
    # A partition's memory of producers made small (``MAX_PRODUCERS,RETENTION_EPOCHS``),
    # the same in every process of a test, so that forgetting takes a few appends.
    from ctp_state import producer_memory as _sm_memory

    _sm_memory.MAX_PRODUCERS, _sm_memory.PRODUCER_RETENTION_EPOCHS = (int(x) for x in _MEMORY.split(","))

if os.environ.get("CTP_TEST_ABORT_AT_EXIT"):
    # What pyarrow sometimes does to a finished process (apache/arrow#34314): a native
    # teardown handler that ends it with SIGABRT. Registered as C++ static destructors
    # are (__cxa_atexit), so it runs exactly where theirs do: in exit(), after the
    # interpreter finalized. A process that leaves through ctp_state.process_exit never
    # gets there, and keeps its status.
    import ctypes as _ctypes

    _libc = _ctypes.CDLL(None)
    _libc.__cxa_atexit.argtypes = [_ctypes.c_void_p, _ctypes.c_void_p, _ctypes.c_void_p]
    _libc.__cxa_atexit(_ctypes.cast(_libc.abort, _ctypes.c_void_p), None, None)

_PLANT = os.environ.get("CTP_SIM_PLANT")

if _PLANT == "lower_bound_plus_one":
    # R3 computed one epoch too high: a reconcile may commit a lower bound past the
    # previous applied epoch, so M can reach an epoch a placeholder may still use.
    from ctp_state import state as _sm

    _allowed = _sm.allowed_lower_bound

    def allowed_lower_bound(s, through_log_offset):  # type: ignore[no-untyped-def]
        return _allowed(s, through_log_offset) + 1

    _sm.allowed_lower_bound = allowed_lower_bound
elif _PLANT == "create_is_plain_put":
    # Create-if-absent that is not: a plain overwrite on every backend. The race tests
    # must catch it (tests/storage/test_races.py runs them with it planted).
    from ctp_state.storage.local import LocalStore as _Local
    from ctp_state.storage.s3 import S3Store as _S3

    def put_if_absent(self, key, data):  # type: ignore[no-untyped-def]
        self.put(key, data)

    _Local.put_if_absent = _Local.put_if_absent_once = put_if_absent
    _S3.put_if_absent = _S3.put_if_absent_once = put_if_absent
elif _PLANT:
    raise SystemExit(f"unknown CTP_SIM_PLANT {_PLANT!r}")
