"""Every command exits with its documented status, whatever native libraries do at
teardown (round-four review, defect 4).

pyarrow sometimes aborts a finished process ("terminate called without an active
exception", exit -6): a C++ thread pool destroyed at exit with a worker alive. It cannot
be made to happen on demand, so the suite makes its equivalent certain:
``CTP_TEST_ABORT_AT_EXIT=1`` (tests/hooks/sitecustomize.py) registers a native exit
handler that aborts, where C++ static destructors run. A process that leaves through
:mod:`ctp_state.process_exit` keeps its status; the control run shows the handler does
abort a process that exits the usual way. ``tests/cli/soak_exits.py`` runs the real
commands many times with no injection and counts aborts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ctp_state.epoch import ClusterEpoch
from ctp_state.reconcile import run_reconcile
from ctp_state.topics import create_topic
from tests.support import ctp, produce_rounds, with_this_checkout
from tests.support.spark import spark_submit

ABORT = {"CTP_TEST_ABORT_AT_EXIT": "1"}


@pytest.fixture
def reconciled_store(fstore, tmp_path):
    """(One store: how a process ends does not depend on it.)"""
    store = fstore
    subprocess_env = with_this_checkout({**os.environ, "CTP_STORE": store.url})
    produce_rounds(store, topic="t", partitions=2, rounds=2, per=20)
    run_reconcile(store)
    ClusterEpoch(store).advance()
    run_reconcile(store)
    return {**subprocess_env, "HOME": str(tmp_path), **ABORT}


def test_the_injected_abort_does_abort_a_process_that_exits_the_usual_way(reconciled_store):
    r = subprocess.run(
        [sys.executable, "-c", "from ctp_state.cli import main; main()", "read", "t", "0", "--limit", "1"],
        env=with_this_checkout(reconciled_store),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode in (-6, 134), (r.returncode, r.stderr[-500:])
    assert r.stdout  # the work was done first


@pytest.mark.parametrize(
    ("args", "status"),
    [
        (("read", "t", "0", "--limit", "3"), 0),
        (("verify", "--deep"), 0),
        (("table", "publish"), 0),
        (("gc", "--json"), 0),
        (("status", "--json"), 0),
        (("read", "nope", "0"), 1),  # a one-line error
        (("read",), 2),  # a usage error
    ],
)
def test_commands_that_read_parquet_keep_their_status_through_an_abort_at_exit(reconciled_store, args, status):
    r = ctp(reconciled_store, *args)
    assert r.returncode == status, (r.returncode, r.stderr[-800:])
    if status == 0 and "--json" in args:
        json.loads(r.stdout)  # the whole output was flushed before leaving


def test_produce_keeps_its_exit_codes_through_an_abort_at_exit(fstore, tmp_path):
    store = fstore
    subprocess_env = with_this_checkout({**os.environ, "CTP_STORE": store.url})
    create_topic(store, "t", 1)
    env = {**subprocess_env, **ABORT}
    good = tmp_path / "good.jsonl"
    good.write_text('{"topic": "t", "partition": 0, "value": "v"}\n')
    r = ctp(env, "produce", str(good), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["accepted"] == 1, (r.returncode, r.stderr[-800:])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"topic": "t", "partition": 7, "value": "v"}\n')
    r = ctp(env, "produce", str(bad))
    assert r.returncode == 1 and "partition" in r.stderr, (r.returncode, r.stderr[-800:])
    assert ctp(env, "produce").returncode == 2  # neither FILE nor --generate


@pytest.mark.slow
def test_the_spark_reconciler_keeps_its_status_through_an_abort_at_exit(fstore):
    store = fstore
    subprocess_env = with_this_checkout({**os.environ, "CTP_STORE": store.url})
    produce_rounds(store, topic="t", partitions=2, rounds=1, per=20)
    r = spark_submit({**subprocess_env, **ABORT})
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])


@pytest.mark.slow
def test_the_parquet_reading_commands_in_fresh_processes_exit_0_every_time():
    """The soak, small (the full 300 runs each is ``python -m tests.cli.soak_exits``)."""
    from tests.cli.soak_exits import soak

    result = soak(runs=2, jobs=2)
    assert all(r["failures"] == 0 for r in result.values()), result
