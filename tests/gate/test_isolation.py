"""GCs that share a report directory must not judge each other's tables.

The review's failure: two ``ctp gc`` runs on two stores with the same ``--report-dir``
validated whatever tables the other had written last (fixed ``inputs/<table>.parquet``
paths, one shared GX project). The store whose L1 held a duplicated offset passed its
gate and deleted its only good L0 copy, the healthy one failed, and GX crashed on suites
rewritten under it. Here the same race runs with real processes, on both backends, and
once more at the gate alone (two processes calling ``GxGate`` in one report directory).
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import ConfigError
from ctp_state.gc.history import GcHistory
from ctp_state.read import committed_l1_keys
from ctp_state.settings import GcSettings
from ctp_state.storage import ObjectStore, open_store
from expectations.gate import MARKER, claim
from expectations.job import gc_job, validate_job, write_report
from tests.support import CTP, ctp, plog, with_this_checkout
from tests.support.gc import gate_frames, l0_epochs, reconciled

ROUNDS = 3
GX_CRASH = "has changed since it has last been saved"


def duplicate_an_offset(store: ObjectStore, topic: str = "t", partition: int = 1) -> str:
    """Rewrite a committed L1 file so its last row repeats the previous offset: the
    file keeps its row count, one offset is lost and another is there twice."""
    key = committed_l1_keys(plog(store, topic, partition))[0][0]
    table = pq.read_table(io.BytesIO(store.get(key)))
    n = table.num_rows
    damaged = pa.concat_tables([table.slice(0, n - 1), table.slice(n - 2, 1)])
    buf = io.BytesIO()
    pq.write_table(damaged, buf)
    store.put(key, buf.getvalue())
    return key


@pytest.fixture
def second_store_url(store_url, request, tmp_path) -> tuple[str, dict[str, str]]:
    """A second, empty store on the same backend as ``store_url``."""
    url, _ = store_url
    if url.startswith("file://"):
        return f"file://{tmp_path}/store-b", {}
    server = request.getfixturevalue("s3_server")
    return server.url("ctp-test"), server.env


def _race(
    cmds: dict[str, tuple[list[str], dict[str, str]]], timeout: float = 240
) -> dict[str, subprocess.CompletedProcess]:
    """Start every command at once; wait for all."""
    procs = {
        name: subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name, (cmd, env) in cmds.items()
    }

    def wait(name: str) -> subprocess.CompletedProcess:
        p = procs[name]
        out, err = p.communicate(timeout=timeout)
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)

    with ThreadPoolExecutor(len(procs)) as pool:
        return dict(zip(procs, pool.map(wait, procs)))


def test_two_gcs_on_two_stores_racing_in_one_report_dir_never_delete_the_damaged_stores_data(
    store_url, second_store_url, subprocess_env, store, tmp_path
):
    """A is healthy and owns the report directory (its operator validated there first);
    B's L1 has a duplicated offset, so L0 holds B's only good copy. Both GCs start at
    the same moment with the same ``--report-dir``, a few times over. Every time: A
    passes on its own tables and exits 0; B deletes nothing and exits non-zero (its own
    gate fails, or it is refused the directory); GX never crashes."""
    url_b, s3_env_b = second_store_url
    store_b = open_store(url_b, s3_env_b)
    report = tmp_path / "shared-report"
    reconciled(store)
    reconciled(store_b)
    damaged = duplicate_an_offset(store_b)
    b_before = l0_epochs(store_b)
    assert b_before

    v = validate_job(store, GcSettings(dry_run=True), str(report))  # the directory is A's
    assert v.success, v.failures

    env_a = with_this_checkout(subprocess_env)
    env_b = {**env_a, **s3_env_b, "CTP_STORE": url_b}
    cmd = [CTP, "gc", "--json", "--report-dir", str(report)]
    problems: list[str] = []
    seconds = []
    b_left = set(b_before)
    for i in range(ROUNDS):
        t0 = time.monotonic()
        res = _race({"A": (cmd, env_a), "B": (cmd, env_b)})
        seconds.append(round(time.monotonic() - t0, 1))
        a, b = res["A"], res["B"]
        for name, r in res.items():
            if GX_CRASH in r.stderr or "unexpected " in r.stderr:
                problems.append(f"round {i}: {name} crashed: {r.stderr.strip()[-300:]}")
        if a.returncode != 0:
            problems.append(f"round {i}: A (healthy) exited {a.returncode}: {a.stderr.strip()[-300:]}")
        if b.returncode == 0:
            problems.append(
                f"round {i}: B (duplicated offset in {damaged}) passed its gate: "
                f"{json.loads(b.stdout).get('status')}, deleted {json.loads(b.stdout).get('deleted')}"
            )
        elif not (("GC gate failed" in b.stderr and "l1_files" in b.stderr) or "belongs to store" in b.stderr):
            problems.append(f"round {i}: B failed for another reason: {b.stderr.strip()[-300:]}")
        lost, b_left = b_left - set(l0_epochs(store_b)), set(l0_epochs(store_b))
        if lost:
            problems.append(f"round {i}: B lost {len(lost)} of its {len(b_before)} L0 objects")
    print(f"rounds took {seconds} s")
    assert not problems, "\n".join(problems)
    # The Data Docs: A's validate and A's GC of every round passed; a failed run (B's, if
    # B got as far as its gate) failed on B's own damage only.
    runs = report / "gx" / "uncommitted" / "data_docs" / "local_site" / "runs"
    entries = [json.loads(p.read_text()) for p in runs.glob("*.json")]
    assert sum(e["success"] for e in entries) == ROUNDS + 1, entries
    assert all(f.startswith("l1_files:") for e in entries if not e["success"] for f in e["failures"]), entries


WORKER = r"""
import json, os, sys, time
import pyarrow.parquet as pq
from expectations.gate import GxGate
root, frames_dir, ready, go, n = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
frames = {f[:-len(".parquet")]: pq.read_table(os.path.join(frames_dir, f)) for f in os.listdir(frames_dir)}
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.005)
for _ in range(n):
    try:
        r = GxGate(root)(frames)
        print(json.dumps({"success": r.success, "failures": r.failures, "docs": r.docs}), flush=True)
    except Exception as e:
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
"""


def test_gate_calls_racing_in_one_report_dir_judge_only_their_own_tables(tmp_path):
    """Two processes call the gate over and over in one report directory, one with
    healthy tables, one with a duplicated L1 offset: each call judges its own tables."""
    calls = 4
    root = tmp_path / "report"
    go = tmp_path / "go"
    cmds = {}
    for name, dup in (("healthy", False), ("damaged", True)):
        d = tmp_path / name
        d.mkdir()
        for table, t in gate_frames(duplicated_offset=dup).items():
            pq.write_table(t, d / f"{table}.parquet")
        cmds[name] = (
            [sys.executable, "-c", WORKER, str(root), str(d), str(tmp_path / f"ready-{name}"), str(go), str(calls)],
            with_this_checkout(dict(os.environ)),
        )

    with ThreadPoolExecutor(1) as pool:
        racing = pool.submit(_race, cmds)
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"ready-{n}").exists() for n in cmds) and time.monotonic() < deadline:
            time.sleep(0.01)
        go.touch()  # both have imported GX: start together
        res = racing.result()

    problems: list[str] = []
    for name, r in res.items():
        assert r.returncode == 0, r.stderr
        lines = [json.loads(x) for x in r.stdout.splitlines()]
        assert len(lines) == calls, r.stdout + r.stderr
        for i, out in enumerate(lines):
            if "error" in out:
                problems.append(f"{name} call {i} crashed: {out['error'][:300]}")
            elif name == "healthy" and not out["success"]:
                problems.append(f"healthy call {i} failed: {out['failures'][:2]}")
            elif name == "damaged" and (out["success"] or not all(f.startswith("l1_files:") for f in out["failures"])):
                problems.append(f"damaged call {i}: success={out['success']}, failures={out['failures'][:2]}")
    assert not problems, "\n".join(problems)


def test_a_report_dir_belongs_to_the_store_that_used_it_first(
    store_url, second_store_url, subprocess_env, store, tmp_path
):
    """Another store's gc, validate or report in that directory stops at once with one
    line naming both stores and what to do; nothing is deleted or recorded."""
    url_b, s3_env_b = second_store_url
    store_b = open_store(url_b, s3_env_b)
    report = tmp_path / "report"
    for _ in range(3):
        ClusterEpoch(store).advance()
    assert gc_job(store, GcSettings(), str(report)).error is None  # first use: the directory is A's
    with open(report / MARKER, encoding="utf-8") as f:
        assert json.load(f)["store"] == store.url

    reconciled(store_b)  # B has L0 garbage a GC would delete
    before = l0_epochs(store_b)
    env_b = {**subprocess_env, **s3_env_b, "CTP_STORE": url_b}
    r = ctp(env_b, "gc", "--report-dir", str(report))
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"error: report directory {report} belongs to store {store.url}, not {store_b.url} ")
    assert "use a different --report-dir" in r.stderr and "secret" not in r.stderr
    assert l0_epochs(store_b) == before and GcHistory(store_b).last_seq() == -1  # nothing deleted or recorded

    for attempt in (
        lambda: validate_job(store_b, GcSettings(dry_run=True), str(report)),
        lambda: write_report(store_b, str(report)),
        lambda: gc_job(store_b, GcSettings(), str(report)),
    ):
        with pytest.raises(ConfigError, match=f"belongs to store {store.url}, not {store_b.url}"):
            attempt()
    assert l0_epochs(store_b) == before and GcHistory(store_b).last_seq() == -1
    with open(report / MARKER, encoding="utf-8") as f:
        assert json.load(f)["store"] == store.url

    assert gc_job(store, GcSettings(dry_run=True), str(report)).error is None  # A's runs go on
    out = gc_job(store_b, GcSettings(dry_run=True), str(tmp_path / "report-b"))  # B with its own directory
    assert out.error is None and out.record.would_delete == len(before)


def test_two_stores_claiming_one_new_report_dir_at_once_one_wins(tmp_path):
    for i in range(20):
        d = str(tmp_path / f"r{i}")
        with ThreadPoolExecutor(2) as pool:
            outcomes = list(pool.map(lambda url, d=d: _try_claim(d, url), ["file:///a", "file:///b"]))
        assert sorted(outcomes) == ["claimed", "refused"], outcomes
    with open(os.path.join(d, MARKER), "w") as f:
        f.write("{not json")
    with pytest.raises(ConfigError, match="unreadable store marker"):
        claim(d, "file:///a")


def _try_claim(d: str, url: str) -> str:
    try:
        claim(d, url)
        return "claimed"
    except ConfigError:
        return "refused"


def test_gate_runs_are_named_by_the_gc_run_and_keep_their_own_pages(store, tmp_path):
    """Each gate run's validation pages sit under ``gc-<seq>-m<M>-<GC run id>`` (not
    ``__none__``), the history record points at the run's page, every page reads
    offline, and the site keeps the newest ``keep_runs`` runs."""
    from ctp_state.gc import run_gc
    from expectations.gate import GxGate

    gate = GxGate(str(tmp_path / "report"), keep_runs=2)
    recs = [run_gc(store, gate=gate, config=GcSettings(dry_run=True)) for _ in range(3)]
    site, runs = gate.docs_dir, os.path.join(gate.docs_dir, "runs")
    for rec in recs[1:]:
        name = f"gc-{rec.seq}-m{rec.m}-{rec.run_id}"
        assert rec.gate.docs == os.path.join(runs, f"{name}.html")
        with open(os.path.join(runs, f"{name}.json"), encoding="utf-8") as f:
            entry = json.load(f)
        assert (entry["gc_run_id"], entry["seq"], entry["m"]) == (rec.run_id, rec.seq, rec.m)
        pages = entry["pages"]
        assert set(pages) == {
            "gc_history",
            "partition_state",
            "l1_files",
            "table_files",
            "table_partitions",
            "l1_dropped",
        }
        for suite, rel in pages.items():
            assert rel.startswith(f"validations/{suite}/{name}/")
            assert os.path.isfile(os.path.join(site, rel))
    files = [os.path.join(d, n) for d, _, ns in os.walk(tmp_path / "report") for n in ns]
    assert not any(recs[0].run_id in f or "__none__" in f for f in files)  # the oldest run was pruned
    index = open(os.path.join(site, "index.html"), encoding="utf-8").read()
    assert recs[1].run_id in index and recs[2].run_id in index and recs[0].run_id not in index
    remote = re.compile(r"<(?:link|script|img)\b[^>]*(?:src|href)=\"(?:https?:)?//", re.I)
    for f in files:
        if f.endswith(".html"):
            assert not remote.search(open(f, encoding="utf-8").read()), f
    assert os.listdir(tmp_path / "report" / "gx" / "building") == []  # private render dirs are removed
