"""Scenarios that HELD under attack (kept as regression guards).

* Two ``ctp produce`` processes on the same file (so the same derived producer id)
  racing for the same partitions: every record stored exactly once.
* kill -9 of a reconciler between its L1 writes and its commit (CTP_FAULT=before_commit)
  and right after its commit (after_commit), with the whole process really killed:
  a later run converges, the GC collects the orphans, every record reads exactly once.
* A partition whose log an older ctp damaged (offset 0 a placeholder), repaired at
  offset > 0 by ``ctp topic create``: produce, reconcile, advance and GC all work, and
  nothing acknowledged is lost.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from ctp_state import layout
from ctp_state.entries import Placeholder, encode
from ctp_state.epoch import ClusterEpoch
from ctp_state.gc import run_gc
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.settings import GcSettings, ReconcileSettings
from ctp_state.topics import create_topic
from tests.support import key_id, reconcile, values

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env(**extra):
    return {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests", "hooks")]), **extra}


def test_two_ctp_produce_processes_on_the_same_file_store_each_record_once(fstore, tmp_path):
    store = fstore
    create_topic(store, "t", 2)
    n = 60
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"topic": "t", "partition": i % 2, "value": f"v{i}"}) + "\n" for i in range(n)))
    cmd = [
        sys.executable,
        "-m",
        "ctp_state.cli",
        "produce",
        str(path),
        "--batch-records",
        "3",
        "--store",
        store.url,
        "--json",
    ]
    procs = [
        subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    codes = [p.returncode for p in procs]
    summaries = [json.loads(o) for o, _ in outs if o.strip()]
    # Every run ends well (exit 0) or says what to do (3); none rejects anything.
    assert all(c in (0, 3) for c in codes), (codes, [e[-400:] for _, e in outs])
    assert sum(s["accepted"] for s in summaries) == n, summaries
    for p in (0, 1):
        assert values(store, "t", p) == [f"v{i}".encode() for i in range(p, n, 2)]


RECONCILE = """
import os
import sys
from ctp_state.storage import open_store
from ctp_state.reconcile import run_reconcile
from ctp_state.settings import ReconcileSettings
run_reconcile(open_store(sys.argv[1], os.environ), config=ReconcileSettings(idle_lag=2, lease_ms=1500, target_file_bytes=200))
"""


def _crashed_reconcile(store, fault):
    p = subprocess.run(
        [sys.executable, "-c", RECONCILE, store.url],
        env=_env(CTP_FAULT=fault),
        start_new_session=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == -9, (p.returncode, p.stderr[-800:])


def test_kill_9_of_a_reconciler_before_and_after_its_commit_converges(fstore, gate):
    store = fstore
    create_topic(store, "t", 2)
    ce = ClusterEpoch(store)
    sent = {0: [], 1: []}
    with Producer(store, epoch_ttl_s=0) as prod:
        for r in range(3):
            ce.advance()
            chunks = [(("t", p), [Record(f"{r}-{p}-{i}".encode()) for i in range(20)]) for p in (0, 1)]
            for v, (_, recs) in zip(prod.write(chunks), chunks):
                assert v.accepted
                sent[v.partition].extend(r.value for r in recs)
    _crashed_reconcile(store, "before_commit")  # L1 files written, nothing committed
    assert any(True for _ in store.list(layout.L1_ROOT))
    time.sleep(2)  # the dead run's leases run out
    _crashed_reconcile(store, "after_commit:0")  # one partition committed, claim never released
    time.sleep(2)
    with Producer(store, epoch_ttl_s=0) as prod:  # more data while things are half done
        ce.advance()
        for p in (0, 1):
            assert prod.write([(("t", p), [Record(f"late-{p}".encode())])])[0].accepted
            sent[p].append(f"late-{p}".encode())
    for _ in range(2):
        ce.advance()
    reconcile(store, config=ReconcileSettings(idle_lag=2, target_file_bytes=200))
    reconcile(store, config=ReconcileSettings(idle_lag=2, target_file_bytes=200))
    rec = run_gc(store, gate=gate, config=GcSettings(l1_grace_s=0))
    assert rec.status == "ok" and rec.m >= 4
    for p in (0, 1):
        assert values(store, "t", p) == sent[p]


def test_a_partition_repaired_at_offset_above_0_reconciles_and_collects_safely(store, gate):
    ce = ClusterEpoch(store)
    ce.advance()
    # What an older ctp left: topic metadata, partition 0 initialized, partition 1's
    # offset 0 a placeholder (written before its init), no init.
    create_topic(store, "t", 2)
    store.delete_many([layout.log_entry("t", 1, 0, key_id(store, "t"))])
    bogus = Placeholder(2, layout.l0_key(0, 2, "bogus"), 8, 10, 1, 0)
    store.put_if_absent(layout.log_entry("t", 1, 0, key_id(store, "t")), encode(bogus))
    store.put_if_absent(layout.log_entry("t", 1, 1, key_id(store, "t")), encode(bogus))
    create_topic(store, "t", 2, exist_ok=True)  # repair: init at offset 2
    sent = []
    with Producer(store, epoch_ttl_s=0) as prod:
        for r in range(3):
            ce.advance()
            v = prod.write([(("t", 1), [Record(f"r{r}".encode())])])[0]
            assert v.accepted and v.base_offset == r
            sent.append(f"r{r}".encode())
    for _ in range(2):
        ce.advance()
    reconcile(store)
    ce.advance()
    ce.advance()
    reconcile(store)
    rec = run_gc(store, gate=gate)
    assert rec.status == "ok" and rec.m >= 5
    assert values(store, "t", 1) == sent
