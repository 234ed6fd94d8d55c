"""The GC deletes the L1 files a compaction replaced (R11) only behind its gate: the
entry that replaced them committed, the replacement read whole and checked, the change
older than the reader grace by the store's clock, and no retained snapshot of the
topic's table naming them -- with publishes fenced through the catalog first. On both
stores, and with the table on every catalog."""

from __future__ import annotations

import pytest

from ctp_state import crashpoints, layout
from ctp_state.compact import run_compaction
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import GateFailed
from ctp_state.gc import run_gc
from ctp_state.gc.history import GcHistory
from ctp_state.reconcile import run_reconcile
from ctp_state.settings import CompactSettings, GcSettings
from ctp_state.table.catalog import CatalogConfig
from ctp_state.table.maintenance import CatalogTables
from ctp_state.topics import create_topic
from tests.compact.test_compaction import many_small_files
from tests.support import assert_exactly_once, plog
from tests.support.table import READERS, committed, do_publish, load, sortable, table_of

SMALL = CompactSettings(max_small_files=2, target_file_bytes=1 << 20)
NOW = GcSettings(l1_grace_s=0, l1_reader_grace_s=0)


def l1_keys(store) -> set[str]:
    return {o.key for o in store.list(layout.L1_ROOT)}


def committed_keys(store, topic="t", partitions=2) -> set[str]:
    return {f.key for p in range(partitions) for f in plog(store, topic, p).read_state().committed_l1_files()}


def deleted_of(store, rec) -> dict[str, str]:
    t = GcHistory(store).read_deletes(rec.deletes_key).to_pylist()
    return {r["key"]: r["kind"] for r in t}


def test_the_replaced_files_go_once_the_reader_grace_is_over_and_reads_stay_exactly_once(store, gate):
    sent = many_small_files(store)
    run_compaction(store, config=SMALL)
    retired = l1_keys(store) - committed_keys(store)
    assert len(retired) == 12
    # within the reader grace: kept, and said so
    rec = run_gc(store, gate=gate, config=GcSettings(l1_grace_s=0, l1_reader_grace_s=3600))
    assert rec.status == "ok" and rec.l1_retired == 0 and rec.l1_retired_kept == 12
    assert l1_keys(store) >= retired
    # past it: deleted, on the audit trail under their own kind; every record reads once
    rec = run_gc(store, gate=gate, config=NOW)
    assert rec.status == "ok", rec.gate.failures
    assert (rec.l1_retired, rec.l1_retired_deleted, rec.l1_retired_kept) == (12, 12, 0)
    assert rec.l1_new_files_checked >= 2  # the compacted files were read whole first
    assert {k for k, kind in deleted_of(store, rec).items() if kind == "l1_retired"} == retired
    assert l1_keys(store) == committed_keys(store)
    assert_exactly_once(store, "t", sent)
    # nothing left: the next run lists nothing more to retire
    rec = run_gc(store, gate=gate, config=NOW)
    assert (rec.l1_retired, rec.l1_retired_kept) == (0, 0)


def test_a_compacted_file_that_fails_its_checks_stops_the_gate_and_nothing_retired_goes(store, gate):
    many_small_files(store)
    run_compaction(store, config=SMALL)
    before = l1_keys(store)
    c = plog(store, "t", 0).read_state().committed_l1_files()[0]
    data = bytearray(store.get(c.key))
    data[len(data) // 3] ^= 0x55
    store.delete_many([c.key])
    store.put_if_absent(c.key, bytes(data))
    with pytest.raises(GateFailed, match=c.key.split("/")[-1][:20]):
        run_gc(store, gate=gate, config=NOW)
    assert l1_keys(store) == before  # the replaced files are the only good copy: kept


def test_a_compactor_holding_its_claim_keeps_the_gc_off_its_partition(store, gate):
    """(collect only where no claim is live, as for orphans)"""
    many_small_files(store)
    run_compaction(store, config=SMALL)
    from ctp_state.entries import AccessMode

    log = plog(store, "t", 0)
    log.claim(log.read_state(), "someone", AccessMode.EXCLUSIVE, lease_ms=600_000)
    rec = run_gc(store, gate=gate, config=NOW)
    assert rec.l1_retired == 6 and rec.l1_retired_kept == 6  # partition 1's went, partition 0's wait


# --- with a table ------------------------------------------------------------------------


def hook(store, config, tmp_path, keep=100):
    return CatalogTables(store, config, home=str(tmp_path), keep=keep, max_age_s=0 if keep == 1 else 1e9)


def test_retired_files_a_table_snapshot_names_stay_until_it_is_expired(fstore, catalogs, gate, tmp_path):
    config, store = catalogs, fstore  # (every catalog; the store's side is the walks' and the kills')
    create_topic(store, "t", 2)
    for r in range(4):
        load(store, rounds=1, partitions=2, tag=f"r{r}-")
        do_publish(store, config, tmp_path)
    run_compaction(store, config=SMALL)
    retired = l1_keys(store) - committed_keys(store)
    assert len(retired) == 8
    # the head still names them (not published since): the gate accepts the lagging
    # table (each record once, in the files they were in); nothing retired goes
    rec = run_gc(store, gate=gate, config=NOW, tables=hook(store, config, tmp_path))
    assert rec.status == "ok", rec.gate.failures
    assert rec.l1_retired_kept == 8 and l1_keys(store) >= retired
    # publish: one snapshot takes the replaced files out and the compacted ones in
    pub = do_publish(store, config, tmp_path)
    assert (pub.files_added, pub.files_removed) == (2, 8)
    table = table_of(store, config, tmp_path)
    for name, read in READERS.items():
        assert sortable(read(table, store)).equals(committed(store, 2)), name
    # older snapshots still name them: kept, however old the compaction -- and a run that
    # deletes nothing fences nothing (no snapshot of the GC's own per run)
    snapshots = len(table_of(store, config, tmp_path).snapshots())
    for _ in range(2):
        rec = run_gc(store, gate=gate, config=NOW, tables=hook(store, config, tmp_path))
        assert rec.status == "ok" and rec.l1_retired_kept == 8
    assert len(table_of(store, config, tmp_path).snapshots()) == snapshots
    # once the snapshots naming them expire (this run), the next run deletes them
    run_gc(store, gate=gate, config=NOW, tables=hook(store, config, tmp_path, keep=1))
    rec = run_gc(store, gate=gate, config=NOW, tables=hook(store, config, tmp_path, keep=1))
    assert rec.status == "ok" and rec.l1_retired_deleted == 8, rec
    assert l1_keys(store) == committed_keys(store)
    table = table_of(store, config, tmp_path)
    for name, read in READERS.items():  # the table still reads after expiry
        assert sortable(read(table, store)).equals(committed(store, 2)), name


def test_without_the_table_hook_a_topic_with_a_table_keeps_its_retired_files(fstore, sql_catalogs, gate, tmp_path):
    config, store = sql_catalogs, fstore
    create_topic(store, "t", 2)
    for r in range(3):
        load(store, rounds=1, partitions=2, tag=f"r{r}-")
    do_publish(store, config, tmp_path)
    run_compaction(store, config=SMALL)
    rec = run_gc(store, gate=gate, config=NOW)  # no hook: what do the snapshots name?
    assert rec.l1_retired_deleted == 0 and rec.l1_retired_kept == 6


def test_a_publish_that_read_the_states_before_a_compaction_cannot_commit_after_the_gc(
    fstore, catalogs, gate, tmp_path
):
    """The race the fence is for: a publish reads the head and the states (the small
    files committed), pauses before its commit; a compaction and a GC run (past every
    grace). Without the fence its commit would land naming files the GC deleted."""
    config, store = catalogs, fstore
    create_topic(store, "t", 2)
    for r in range(3):
        load(store, rounds=1, partitions=2, tag=f"r{r}-")
    ran = []

    def meanwhile(point, index):
        if point == "publish_before_commit" and not ran:
            ran.append(1)
            run_compaction(store, config=SMALL)
            ran.append(run_gc(store, gate=gate, config=NOW, tables=hook(store, config, tmp_path)))

    crashpoints.install(meanwhile)
    try:
        pub = do_publish(store, config, tmp_path)
    finally:
        crashpoints.install(None)
    rec = ran[1]
    assert rec.status == "ok", rec.gate.failures
    assert pub.attempts >= 2  # its first commit was refused by the fence
    table = table_of(store, config, tmp_path)
    named = set()
    for snap in table.snapshots():
        for m in snap.manifests(table.io):
            for e in m.fetch_manifest_entry(table.io, discard_deleted=True):
                named.add(store.key_of(e.data_file.file_path))
    assert named <= l1_keys(store), named - l1_keys(store)  # no snapshot names a deleted file
    for name, read in READERS.items():
        assert sortable(read(table, store)).equals(committed(store, 2)), name


def test_new_records_after_a_compaction_and_its_gc_publish_and_read_once(fstore, catalogs, gate, tmp_path):
    config, store = catalogs, fstore
    create_topic(store, "t", 2)
    for r in range(3):
        load(store, rounds=1, partitions=2, tag=f"r{r}-")
        do_publish(store, config, tmp_path)
    run_compaction(store, config=SMALL)
    do_publish(store, config, tmp_path)
    load(store, rounds=1, partitions=2, tag="late-")
    ClusterEpoch(store).advance()
    run_reconcile(store)
    pub = do_publish(store, config, tmp_path)
    assert (pub.files_added, pub.files_removed) == (2, 0)
    table = table_of(store, config, tmp_path)
    for name, read in READERS.items():
        assert sortable(read(table, store)).equals(committed(store, 2)), name
    rec = run_gc(store, gate=gate, config=NOW, tables=hook(store, config, tmp_path))
    assert rec.status == "ok", rec.gate.failures


# --- a slow compactor (round-five review, finding 1) -------------------------------------


@pytest.mark.parametrize("full_sweep", [True, False])
def test_a_compactor_past_its_lease_never_loses_its_file_to_the_sweep(fstore, full_sweep, monkeypatch):
    """A compactor builds for longer than its lease and the L1 grace, with nobody
    claiming meanwhile, and its clock runs slow (so it still commits). A GC in between
    lists the partition whole (the day's full sweep, or retired files of an earlier
    compaction it keeps): the compactor's file lies at or below LR and is no committed
    file's, but its writer still holds the claim in the log, so it is not an orphan."""
    import time

    from ctp_state import compact
    from ctp_state.compact import build_locally
    from ctp_state.gc.prepare import GateResult
    from ctp_state.read import read_partition
    from tests.support import produce_rounds

    store = fstore
    plain = lambda frames: GateResult(True, [])  # noqa: E731 - the backstop still runs
    many_small_files(store, rounds=3, partitions=1)
    if not full_sweep:  # an earlier compaction whose retired files the GC keeps (reader grace)
        run_compaction(store, config=SMALL)
        for _ in range(3):
            produce_rounds(store, topic="t", partitions=1, rounds=1, per=5)
            run_reconcile(store, topics=["t"])
    run_gc(store, gate=plain, config=GcSettings(l1_grace_s=0, l1_reader_grace_s=3600))
    cfg = GcSettings(l1_grace_s=1.0, l1_reader_grace_s=3600, l1_full_sweep_s=0 if full_sweep else 86400)
    seen = {}

    def slow_build(jobs):
        builds = build_locally(store, jobs, compression="zstd")
        time.sleep(1.5)  # past the lease (0.5 s) and the L1 grace (1 s)
        seen["gc"] = run_gc(store, gate=plain, config=cfg)
        return builds

    monkeypatch.setattr(compact, "_now_ms", lambda: int(time.time() * 1000) - 60_000)  # its clock: a minute slow
    summary = run_compaction(
        store, config=CompactSettings(max_small_files=2, target_file_bytes=1 << 20, lease_ms=500), map_runs=slow_build
    )
    assert summary.count("compacted") == 1, summary.as_dict()
    assert seen["gc"].l1_orphans_deleted == 0
    st = plog(store, "t", 0).read_state()
    assert all(store.head(f.key) is not None for f in st.committed_l1_files())
    assert read_partition(store, "t", 0).num_rows == st.last_reconciled_offset + 1
    rec = run_gc(store, gate=plain, config=NOW)
    assert rec.status == "ok", rec.gate.failures


# --- tables the GC's catalog does not see (round-five review, finding 2) ------------------


def _plain():
    from ctp_state.gc.prepare import GateResult

    return lambda frames: GateResult(True, [])


def test_a_gc_whose_catalog_does_not_see_the_topics_table_keeps_what_it_names(fstore, tmp_path):
    """(round-five review, finding 2) The GC's hook on another catalog than the
    publisher's answered "no table" and the retired files the table's head names went."""
    plain_gate = _plain()
    store = fstore
    pub_config = CatalogConfig(uri=f"sqlite:///{tmp_path}/catalog.db", namespace="ctp")
    create_topic(store, "t", 1)
    for r in range(3):
        load(store, rounds=1, partitions=1, tag=f"r{r}-")
    do_publish(store, pub_config, tmp_path)
    run_compaction(store, config=SMALL)
    # without any hook: kept (something is under the topic's tables/ space)
    rec = run_gc(store, gate=plain_gate, config=NOW)
    assert rec.l1_retired_deleted == 0 and rec.l1_retired_kept == 3
    # with the hook of the GC's own environment (no CTP_CATALOG_URI: the default catalog)
    other = tmp_path / "gc-home"
    other.mkdir()
    hook = CatalogTables(store, CatalogConfig.from_env({}), home=str(other))
    rec = run_gc(store, gate=plain_gate, config=NOW, tables=hook)
    table = table_of(store, pub_config, tmp_path)
    named = {store.key_of(t.file.file_path) for t in table.scan().plan_files()}
    missing = {k for k in named if store.head(k) is None}
    assert not missing, f"the table's head names deleted files ({rec.l1_retired_deleted} retired deleted): {missing}"


def test_a_second_table_of_the_topic_in_another_namespace_keeps_what_it_names(fstore, tmp_path):
    """(round-five review, finding 2) Two tables of one topic (two namespaces of one catalog: the maintenance module
    allows "another table of the topic (another namespace, another catalog)"); the GC's
    hook fences and lists only its own namespace's table: the other's directory in the
    store keeps the retired files."""
    plain_gate = _plain()
    store = fstore
    uri = f"sqlite:///{tmp_path}/catalog.db"
    mine, theirs = CatalogConfig(uri=uri, namespace="ctp"), CatalogConfig(uri=uri, namespace="analytics")
    create_topic(store, "t", 1)
    for r in range(3):
        load(store, rounds=1, partitions=1, tag=f"r{r}-")
    do_publish(store, mine, tmp_path)
    do_publish(store, theirs, tmp_path)
    run_compaction(store, config=SMALL)
    do_publish(store, mine, tmp_path)  # the GC's own table follows the compaction
    hook = CatalogTables(store, mine, home=str(tmp_path), keep=1, max_age_s=0)
    for _ in range(2):  # (the first expires mine's old snapshots)
        rec = run_gc(store, gate=plain_gate, config=NOW, tables=hook)
    assert rec.l1_retired_deleted == 0 and rec.l1_retired_kept == 3
    table = table_of(store, theirs, tmp_path)
    named = {store.key_of(t.file.file_path) for t in table.scan().plan_files()}
    missing = {k for k in named if store.head(k) is None}
    assert not missing, f"table {theirs.namespace}.t names deleted files: {sorted(k[-60:] for k in missing)}"


def test_a_table_rebuilt_once_does_not_keep_retired_files_forever(fstore, tmp_path):
    """`ctp table publish --rebuild` drops the table and makes a new one: the old one's
    directory stays in the store, marked dropped, and no longer holds retired files."""
    from ctp_state.status import read_states
    from ctp_state.table.catalog import open_catalog
    from ctp_state.table.publish import publish
    from ctp_state.topics import get_topic

    store, config = fstore, CatalogConfig(uri=f"sqlite:///{tmp_path}/catalog.db", namespace="ctp")
    create_topic(store, "t", 1)
    for r in range(3):
        load(store, rounds=1, partitions=1, tag=f"r{r}-")
    do_publish(store, config, tmp_path)
    t = get_topic(store, "t")
    catalog = open_catalog(store, config, home=str(tmp_path))
    publish(store, catalog, t, config, read_states=lambda t: read_states(store, [t]), rebuild=True)
    run_compaction(store, config=SMALL)
    do_publish(store, config, tmp_path)
    hook = CatalogTables(store, config, home=str(tmp_path), keep=1, max_age_s=0)
    run_gc(store, gate=_plain(), config=NOW, tables=hook)
    rec = run_gc(store, gate=_plain(), config=NOW, tables=hook)
    assert rec.l1_retired_deleted == 3 and rec.l1_retired_kept == 0, rec


# --- kill -9 at each point of a compaction's publish -----------------------------------


@pytest.mark.parametrize("point", ["publish_before_commit", "publish_after_commit"])
def test_a_compactions_publish_killed_at_each_point_then_a_rerun_holds_each_record_once(
    fstore, catalogs, tmp_path, point
):
    import os
    import subprocess

    from tests.support import CTP, with_this_checkout

    config, store = catalogs, fstore
    create_topic(store, "t", 2)
    for r in range(3):
        load(store, rounds=1, partitions=2, tag=f"r{r}-")
        do_publish(store, config, tmp_path)
    run_compaction(store, config=SMALL)
    env = with_this_checkout({**os.environ, **config.as_env(), "CTP_STORE": store.url, "HOME": str(tmp_path)})
    r = subprocess.run(
        [CTP, "table", "publish"],
        env={**env, "CTP_FAULT": point},
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,
    )
    assert r.returncode == -9, (r.returncode, r.stderr[-1500:])
    table = table_of(store, config, tmp_path)  # killed: the old files or the new, never both
    assert sortable(READERS["pyiceberg"](table, store)).equals(committed(store, 2))
    r = subprocess.run([CTP, "table", "publish", "--json"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-1500:]
    table = table_of(store, config, tmp_path)
    for name, read in READERS.items():
        assert sortable(read(table, store)).equals(committed(store, 2)), name
    from ctp_state.table.files import data_files

    assert sorted(store.key_of(f.path) for f in data_files(table)) == sorted(committed_keys(store))
