"""Leaving a process with its status, whatever native libraries do at teardown.

pyarrow (apache/arrow#34314) can abort a process *after* its work is done: a native
thread pool torn down by a C++ static destructor while a worker is still alive ends in
``std::terminate`` ("terminate called without an active exception", exit -6 / 134) --
in a few percent of short runs that read Parquet. ``ctp produce`` exit codes carry
meaning (0/1/3), and Airflow marks a task whose process exits non-zero as failed, so a
finished command must not lose its status there.

Every process entry point ctp owns (the ``ctp`` command, the Spark applications'
drivers, the demo driver) leaves through :func:`run`: the Python-level shutdown runs as
the interpreter would run it (non-daemon threads joined, thread pools shut down,
``atexit`` handlers, logging flushed, standard streams flushed), and then the process
ends with ``os._exit``, skipping only the native teardown where the abort happens. This
is how Airflow's own task processes end. Files are closed by the ``with`` blocks that
write them before this point; nothing buffered is left for the interpreter to flush.
"""

from __future__ import annotations

import atexit
import faulthandler
import logging
import os
import sys
import threading
import traceback
from collections.abc import Callable
from typing import NoReturn


def leave(code: int) -> NoReturn:
    """End the process with ``code`` after the Python-level shutdown (see the module
    docstring), without the native teardown."""
    try:
        shutdown = getattr(threading, "_shutdown", None)  # joins non-daemon threads, as at exit
        if shutdown is not None:
            shutdown()
        atexit._run_exitfuncs()
        logging.shutdown()
    except BaseException:  # a failing shutdown hook must not keep the status from the caller
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        os._exit(code)


def status_of(exit: SystemExit) -> int:
    """The exit status ``SystemExit(code)`` stands for, as the interpreter maps it."""
    code = exit.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def run(main: Callable[[], int | None]) -> NoReturn:
    """Run ``main`` (it may return a status or raise ``SystemExit``) and :func:`leave`
    with its status; an uncaught exception prints its traceback and leaves with 1 (130
    for an interrupt), as the interpreter would. A fatal signal in native code (a
    segmentation fault) prints every thread's Python stack on standard error first, so
    a crash names where it happened."""
    if not faulthandler.is_enabled():
        try:
            faulthandler.enable()
        except (AttributeError, ValueError, OSError, RuntimeError):  # no file descriptor behind stderr
            pass  # a diagnostic never stops the work
    try:
        rv = main()
        code = 0 if rv is None else int(rv)
    except SystemExit as e:
        code = status_of(e)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    leave(code)
