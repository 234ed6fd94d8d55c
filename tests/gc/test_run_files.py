"""A GC run's own files (``gc/partitions/<seq>-<run id>.parquet``, ``gc/deleted/...``)
never outlive a run that did not get its record (issue: topic identity, scenario 8).

A run writes them before it tries to own history record ``seq``, so a run that loses
the seq to a concurrent GC, or is killed before its record, used to leave them for good:
nothing names them and nothing collected them.
"""

from __future__ import annotations

import json
import subprocess

from ctp_state import layout
from ctp_state.epoch import ClusterEpoch
from ctp_state.gc import run_gc
from ctp_state.gc.history import GcHistory
from ctp_state.settings import GcSettings
from ctp_state.topics import create_topic
from tests.support import CTP, Wrapped, ok
from tests.support.gc import named, run_files


def test_a_gc_killed_before_its_record_leaves_files_the_next_runs_collect(subprocess_env, store, tmp_path):
    env = {**subprocess_env, "CTP_REPORT_DIR": str(tmp_path / "report")}
    create_topic(store, "t", 2)
    ClusterEpoch(store).advance()
    ok(env, "gc")  # seq 0
    killed = subprocess.run(
        [CTP, "gc"],
        env={**env, "CTP_FAULT": "gc_before_record"},
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,
    )
    assert killed.returncode == -9, killed.stderr
    assert GcHistory(store).last_seq() == 0  # no record ...
    dead = run_files(store) - named(store)
    assert len(dead) == 2 and all("-" in k for k in dead)  # ... but its view and deleted keys, for seq 1
    first = json.loads(ok(env, "gc", "--json"))  # takes seq 1: the dead run's files now share its seq
    assert first["gc_orphans_deleted"] == 0 and run_files(store) - named(store) == dead
    second = json.loads(ok(env, "gc", "--json"))  # seq 1 is in its tail: collected
    assert second["gc_orphans_deleted"] == 2, second
    assert run_files(store) == named(store)
    # on the audit trail like every delete
    deleted = GcHistory(store).read_deletes(second["deletes_key"]).to_pylist()
    assert sorted(r["key"] for r in deleted if r["kind"] == "gc_orphan") == sorted(dead)


def test_a_dry_run_collects_nothing(subprocess_env, store, tmp_path):
    env = {**subprocess_env, "CTP_REPORT_DIR": str(tmp_path / "report")}
    create_topic(store, "t", 1)
    ok(env, "gc")
    subprocess.run(
        [CTP, "gc"],
        env={**env, "CTP_FAULT": "gc_before_record"},
        capture_output=True,
        timeout=300,
        start_new_session=True,
    )
    ok(env, "gc")
    dead = run_files(store) - named(store)
    assert len(dead) == 2
    rec = json.loads(ok(env, "gc", "--dry-run", "--json"))
    assert rec["gc_orphans_deleted"] == 0 and dead <= run_files(store)


class LosesItsFirstSeq(Wrapped):
    """A GC run that loses the seq it first tries: another whole GC run records that seq
    between this one's files and its record."""

    def __init__(self, inner, gate):
        super().__init__(inner)
        self.gate, self.raced = gate, False

    def put_if_absent(self, k, d):
        if k.startswith(layout.GC_HISTORY) and not self.raced:
            self.raced = True
            assert run_gc(self.inner, gate=self.gate).status == "ok"
        return self.inner.put_if_absent(k, d)


def test_a_gc_that_loses_its_seq_removes_the_files_it_wrote_for_it(store, gate):
    create_topic(store, "t", 1)
    ClusterEpoch(store).advance()
    racer = LosesItsFirstSeq(store, gate)
    for dry_run in (False, True):
        racer.raced = False
        rec = run_gc(racer, gate=gate, config=GcSettings(dry_run=dry_run))
        assert racer.raced and rec.seq == GcHistory(store).last_seq()
        assert run_files(store) == named(store), run_files(store) - named(store)
