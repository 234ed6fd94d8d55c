"""``ctp gc`` and ``ctp validate`` as real processes on both backends, including a
``kill -9`` in the middle of the deletes."""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor

from ctp_state import layout, records
from ctp_state.epoch import ClusterEpoch
from ctp_state.gc.history import GcHistory
from ctp_state.records import GcRecord
from tests.support import CTP, assert_exactly_once, ctp, ok, produce_rounds, reconcile


def test_dry_run_gc_and_validate_from_the_command_line(subprocess_env, store, tmp_path):
    env = {**subprocess_env, "CTP_REPORT_DIR": str(tmp_path / "report")}
    sent = produce_rounds(store, partitions=2, rounds=3, per=10)
    ok(env, "epoch", "advance")
    reconcile(store)
    ok(env, "epoch", "advance")
    ok(env, "epoch", "advance")
    reconcile(store)
    n = sum(1 for _ in store.list(layout.L0_ROOT))

    out = ok(env, "gc", "--dry-run")
    assert f"dry run: would delete {n} L0 objects" in out and "nothing deleted" in out
    assert "report: " + str(tmp_path / "report" / "index.html") in out
    assert sum(1 for _ in store.list(layout.L0_ROOT)) == n

    assert "passed: 30/30 expectations" in ok(env, "validate")
    rec = json.loads(ok(env, "gc", "--json"))
    assert rec["status"] == "ok" and rec["deleted"] == n and rec["m"] >= 4
    assert sum(1 for _ in store.list(layout.L0_ROOT)) == 0
    assert_exactly_once(store, "t", sent)

    # An audit record claiming a higher M: the gate must stop the next run.
    GcHistory(store).append(
        lambda seq: records.decode(GcRecord, {**rec, "m": rec["m"] + 3, "m_high_water": rec["m"] + 3}, "test")
    )
    r = ctp(env, "validate")
    assert r.returncode == 1 and "FAILED" in r.stdout
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1
    r = ctp(env, "gc")
    assert r.returncode == 1 and r.stderr.startswith("error: GC gate failed, nothing deleted: gc_history:")
    assert r.stderr.count("\n") == 1 and f"report: {tmp_path / 'report' / 'index.html'}" in r.stderr  # one line
    secret = env.get("AWS_SECRET_ACCESS_KEY")
    assert not secret or secret not in r.stderr + r.stdout  # the S3 secret never shows


def test_kill_9_mid_delete_then_a_rerun_converges(subprocess_env, store, tmp_path):
    env = {**subprocess_env, "CTP_REPORT_DIR": str(tmp_path / "report")}
    ce = ClusterEpoch(store)
    for _ in range(3):
        ce.advance()  # C = 4, no partitions: M = 3
    garbage = [layout.l0_key(i % 7, 1 + i % 3, f"g{i}") for i in range(2100)]
    live = [layout.l0_key(i, 4, f"live{i}") for i in range(5)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: store.put(k, b"x" * 100), garbage + live))

    killed = subprocess.run(
        [CTP, "gc", "--in-flight", "1"],
        env={**env, "CTP_FAULT": "gc_after_delete_batch:0"},
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,
    )
    assert killed.returncode == -9, killed.stderr
    left = {o.key for o in store.list(layout.L0_ROOT)}
    assert len(left) == 2100 - 1000 + 5  # one batch went, then the process died
    assert GcHistory(store).last_seq() == -1  # a killed run leaves no record

    rec = json.loads(ok(env, "gc", "--json"))
    assert rec["status"] == "ok" and rec["deleted"] == 1100 and rec["m"] == 3
    assert {o.key for o in store.list(layout.L0_ROOT)} == set(live)
    assert GcHistory(store).last_seq() == 0


def test_two_stores_get_two_report_directories_by_default(tmp_path):
    """With no --report-dir and no $CTP_REPORT_DIR, each store's report lives in its own
    directory under ~/.ctp/reports/: two stores never overwrite (or refuse) each other."""
    import os

    from expectations.job import default_report_dir
    from tests.support import with_this_checkout

    home = tmp_path / "home"
    env = with_this_checkout({k: v for k, v in os.environ.items() if k != "CTP_REPORT_DIR"} | {"HOME": str(home)})
    pages = []
    for name in ("a", "b"):
        url = f"file://{tmp_path / name / 'store'}"
        ok({**env, "CTP_STORE": url}, "topic", "create", "t", "-p", "1")
        out = ok({**env, "CTP_STORE": url}, "gc", "--dry-run")
        page = os.path.join(default_report_dir(url, str(home)), "index.html")
        assert f"report: {page}" in out, out
        pages.append(page)
    assert pages[0] != pages[1] and all(os.path.exists(p) for p in pages)
    assert not (tmp_path / "ctp-report").exists()
