"""Attacks (round-four review of the fixes; each HELD) on ``ctp_state.process_exit`` (``run``/``leave``: os._exit after the
Python-level shutdown). Each scenario runs in a child process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.support import HOOKS, REPO


def child(code: str, tmp_path, *, abort=True, timeout=60) -> subprocess.CompletedProcess[bytes]:
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(code))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, HOOKS]), "OUT": str(tmp_path)}
    if abort:
        env["CTP_TEST_ABORT_AT_EXIT"] = "1"
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True, timeout=timeout)


def test_threads_still_writing_at_exit_finish_their_writes(tmp_path):
    """ATTACK: work still in flight when main returns -- a non-daemon thread writing a
    file after a delay, a ThreadPoolExecutor never shut down with queued tasks, a
    ``print`` of 2 MB to a pipe, an ``atexit`` handler that writes -- must all land, and
    the status (3) must survive a native abort at teardown. HELD."""
    r = child(
        """
        import atexit, os, threading, time
        from concurrent.futures import ThreadPoolExecutor
        from ctp_state.process_exit import run
        out = os.environ["OUT"]

        def late(name, delay):
            time.sleep(delay)
            with open(os.path.join(out, name), "w") as f:
                f.write("done")

        def main():
            threading.Thread(target=late, args=("thread", 1.0)).start()
            pool = ThreadPoolExecutor(2)
            for i in range(6):
                pool.submit(late, f"pool{i}", 0.3)
            atexit.register(late, "atexit", 0)
            print("x" * (2 << 20), end="")
            print("END")
            return 3

        run(main)
        """,
        tmp_path,
    )
    assert r.returncode == 3, (r.returncode, r.stderr[-2000:])
    assert r.stdout.endswith(b"END\n") and len(r.stdout) == (2 << 20) + 4
    for name in ["thread", "atexit", *(f"pool{i}" for i in range(6))]:
        assert (tmp_path / name).read_text() == "done", name


def test_system_exit_codes_map_as_the_interpreter_maps_them(tmp_path):
    """ATTACK: ``sys.exit("error: ...")`` (the CLI's one-line error) must print the
    message and exit 1; ``sys.exit(256)`` exits 0 under the interpreter (status & 0xFF),
    ``sys.exit(True)`` 1, an uncaught exception 1 with its traceback. HELD: run() maps
    each as plain Python does."""
    cases = {
        'sys.exit("error: boom")': None,
        "sys.exit(256)": None,
        "sys.exit(True)": None,
        "sys.exit(-1)": None,
        "raise ValueError('x')": None,
        "return None": None,
    }
    for stmt in cases:
        body = f"import sys\ndef main():\n    {stmt}\n"
        plain = child(body + "main()\n", tmp_path, abort=False)
        ours = child(body + "from ctp_state.process_exit import run\nrun(main)\n", tmp_path)
        assert ours.returncode == plain.returncode, (stmt, ours.returncode, plain.returncode, ours.stderr)
        assert plain.stderr.splitlines()[-1:] == ours.stderr.splitlines()[-1:], stmt


def test_the_ctp_command_keeps_its_status_and_output_under_an_abort_at_exit(tmp_path):
    """ATTACK: the real ``ctp`` entry point with the injected native abort: ``topic
    create`` then ``topic list --json`` through a pipe; both output and status 0 must
    arrive, and an error (a topic that does not exist) exits 1 with one ``error:``
    line. HELD."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([REPO, HOOKS]),
        "CTP_TEST_ABORT_AT_EXIT": "1",
        "CTP_STORE": f"file://{tmp_path}/store",
    }
    ctp = [sys.executable, "-c", "from ctp_state.cli import run; run()"]
    r = subprocess.run([*ctp, "topic", "create", "t", "--partitions", "2"], env=env, capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([*ctp, "--json", "topic", "list"], env=env, capture_output=True, timeout=120)
    if r.returncode == 2:  # --json after the subcommand
        r = subprocess.run([*ctp, "topic", "list", "--json"], env=env, capture_output=True, timeout=120)
    assert r.returncode == 0 and b'"t"' in r.stdout, (r.returncode, r.stdout, r.stderr[-2000:])
    r = subprocess.run([*ctp, "topic", "delete", "nope"], env=env, capture_output=True, timeout=120)
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1].startswith(b"error:"), (r.returncode, r.stderr)


def test_a_crash_in_native_code_names_where_it_happened(tmp_path):
    """A segmentation fault during the work of a process that leaves through ``run`` (a
    Spark driver under load once exited 139 with nothing on its streams) prints the
    Python stack of the crash: the status stays the signal's, the stack names the
    frame."""
    r = child(
        """
        import ctypes
        from ctp_state.process_exit import run

        def crash_here():
            ctypes.string_at(0)

        run(crash_here)
        """,
        tmp_path,
        abort=False,
    )
    err = r.stderr.decode()
    assert r.returncode == -11, (r.returncode, err[-2000:])
    assert "Segmentation fault" in err and "crash_here" in err, err[-2000:]


def test_a_standard_error_without_a_file_descriptor_does_not_stop_the_work(tmp_path):
    """The crash report needs a file descriptor behind ``sys.stderr``; a process whose
    stderr is replaced by one without (a host that captures it in memory) still runs
    and keeps its status."""
    r = child(
        """
        import io, os, sys
        from ctp_state.process_exit import run

        sys.stderr = io.StringIO()

        def main():
            with open(os.path.join(os.environ["OUT"], "ran"), "w") as f:
                f.write("yes")
            return 3

        run(main)
        """,
        tmp_path,
        abort=False,
    )
    assert r.returncode == 3, (r.returncode, r.stderr[-2000:])
    assert (tmp_path / "ran").read_text() == "yes"
