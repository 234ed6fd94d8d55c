"""The local SeaweedFS server that ``scripts/demo.sh --s3``, the suite and the benchmarks
start: it keeps its data across restarts, takes new credentials each start, and never
outlives whoever started it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest

from ctp_state.local_s3 import LocalS3
from tests.support import with_this_checkout


def servers_on(data_dir: Path) -> list[int]:
    """Pids of ``weed`` processes serving ``data_dir``."""
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"weed") and f"-dir={data_dir}".encode() in argv:
            pids.append(int(p.name))
    return pids


def wrapper(data_dir: Path, *command: str, **kw) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ctp_state.local_s3", "--dir", str(data_dir), "--prefix", "demo", "--", *command],
        env=with_this_checkout(dict(os.environ)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def test_the_wrapper_runs_a_command_against_the_server_then_stops_it_and_the_data_stays(tmp_path):
    d = tmp_path / "seaweedfs"
    p = wrapper(d, "sh", "-c", "ctp topic create t -p 3 && ctp produce --generate --topic t --records 3000")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert "created topic t with 3 partitions in s3://ctp/demo/" in out
    assert "loopback only" in err and "server stopped" in err
    assert servers_on(d) == []
    # Restarted on other free ports with new credentials: the records are there, L0 objects and all.
    p = wrapper(d, "sh", "-c", "for p in 0 1 2; do ctp read t $p; done")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert len(out.splitlines()) == 3000
    assert servers_on(d) == []
    assert [x.name for x in d.iterdir() if x.name.startswith("m") and x.name[1:].isdigit()] == []  # one master dir


def test_credentials_of_an_earlier_start_are_refused(tmp_path):
    with LocalS3(tmp_path / "s") as first:
        old = first.env
    with LocalS3(tmp_path / "s") as second:
        assert second.access_key_id != old["AWS_ACCESS_KEY_ID"]
        stale = boto3.client(
            "s3",
            endpoint_url=second.endpoint,
            aws_access_key_id=old["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=old["AWS_SECRET_ACCESS_KEY"],
            region_name="us-east-1",
        )
        with pytest.raises(Exception, match="InvalidAccessKeyId"):
            stale.list_objects_v2(Bucket=second.bucket)
        assert second.client().list_objects_v2(Bucket=second.bucket)["KeyCount"] == 0


def test_a_killed_wrapper_leaves_no_server_running(tmp_path):
    """``kill -9`` of the process that started the server (no chance to stop it): the
    server dies with it (PR_SET_PDEATHSIG)."""
    d = tmp_path / "seaweedfs"
    p = wrapper(d, "sleep", "600", start_new_session=True)
    deadline = time.monotonic() + 60
    while not servers_on(d):
        assert time.monotonic() < deadline and p.poll() is None, "the server did not start"
        time.sleep(0.2)
    time.sleep(2)  # serving by now (it starts in about 1.6 s)
    assert servers_on(d)
    p.send_signal(signal.SIGKILL)
    p.wait(10)
    deadline = time.monotonic() + 15
    while servers_on(d):
        assert time.monotonic() < deadline, f"weed outlived its starter: {servers_on(d)}"
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):  # the orphaned `sleep`, if it is still there
        os.killpg(p.pid, signal.SIGKILL)
