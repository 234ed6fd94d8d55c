"""A topic's Iceberg table holds exactly its committed records, each once: whatever
engine reads it (pyiceberg, DuckDB, polars, Spark through the file list), whatever is
lying in the L1 prefix (an orphan, a fenced zombie's file), however publishers race or
die. On the local store and on S3."""

from __future__ import annotations

import json
import subprocess
import threading
import time

import pyarrow as pa
import pytest

from ctp_state import l1, layout
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.table.files import data_files, published_vector
from ctp_state.table.maintenance import CLOCK_SLACK_S
from ctp_state.topics import create_topic, get_topic
from tests.support import format1_encoder, plog
from tests.support.table import READERS, committed, do_publish, load, read_pyiceberg, sortable, table_of


def plant_strays(store) -> None:
    """An orphan (a committed file's bytes at a key no commit names) and a fenced
    zombie's file (other records, past the committed range) in t/0's L1 prefix."""
    t = get_topic(store, "t")
    (first, *_) = plog(store, "t", 0).read_state().committed_l1_keys()
    store.put(layout.l1_key("t", 0, 900, 903, t.key_id), store.get(first))
    zombie = l1.to_l1_table([], 0)
    zombie = pa.table(
        {
            "offset": pa.array([1000], pa.int64()),
            "timestamp": pa.array([1], pa.timestamp("us", tz="UTC")),
            "key": pa.array([None], pa.binary()),
            "value": pa.array([b"zombie"]),
            "headers": pa.array([[]], l1.SCHEMA.field("headers").type),
            "partition": pa.array([0], pa.int32()),
        },
        schema=zombie.schema,
    )
    store.put(layout.l1_key("t", 0, 1000, 1000, t.key_id), l1.encode_parquet(zombie, "t", 0, topic_id=t.key_id))


# --- readers ---------------------------------------------------------------------------


@pytest.mark.parametrize("reader", sorted(READERS))
def test_each_reader_returns_exactly_the_committed_records(store, catalogs, tmp_path, reader):
    config = catalogs
    create_topic(store, "t", 3)
    load(store)
    plant_strays(store)
    first = do_publish(store, config, tmp_path)
    assert first.files_added == 6 and first.records_added == 24, first.as_dict()
    load(store, rounds=1, tag="later")
    # records produced after the last reconcile are not committed: not in the table
    with Producer(store, epoch_ttl_s=0) as prod:
        assert prod.write([(("t", 1), [Record(b"pending")])])[0].accepted
    assert do_publish(store, config, tmp_path).files_added == 3
    got = sortable(READERS[reader](table_of(store, config, tmp_path), store))
    want = committed(store)
    assert got.num_rows == want.num_rows == 36
    assert got.equals(want), (got.slice(0, 3).to_pylist(), want.slice(0, 3).to_pylist())


def test_spark_reads_the_table_through_its_file_list(spark, store, catalogs, tmp_path):
    config = catalogs
    from spark_apps.table import read_files

    create_topic(store, "t", 3)
    load(store)
    plant_strays(store)
    do_publish(store, config, tmp_path)
    paths = [f.path for f in data_files(table_of(store, config, tmp_path))]
    got = sortable(read_files(spark, store.url, paths).toArrow())
    assert got.equals(committed(store))


def test_publishing_again_appends_nothing_and_the_vector_follows_the_logs(store, catalogs, tmp_path):
    config = catalogs
    create_topic(store, "t", 3)
    load(store)
    assert do_publish(store, config, tmp_path).files_added == 6
    again = do_publish(store, config, tmp_path)
    assert (again.files_added, again.attempts) == (0, 0)
    table = table_of(store, config, tmp_path)
    assert published_vector(store, table) == {
        p: plog(store, "t", p).read_state().last_reconciled_offset for p in range(3)
    }
    assert len(table.snapshots()) == 1


def test_racing_publishers_append_each_committed_file_once(store, catalogs, tmp_path):
    config = catalogs
    create_topic(store, "t", 3)
    errors: list[BaseException] = []

    def publisher() -> None:
        try:
            for _ in range(4):
                do_publish(store, config, tmp_path)
        except BaseException as e:
            errors.append(e)

    for r in range(3):
        load(store, rounds=1, tag=f"x{r}-")
        threads = [threading.Thread(target=publisher) for _ in range(3)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert not errors, errors
    files = [f.path for f in data_files(table_of(store, config, tmp_path))]
    assert len(files) == len(set(files)) == 9
    got = sortable(read_pyiceberg(table_of(store, config, tmp_path), store))
    assert got.equals(committed(store))


@pytest.mark.parametrize("point", ["publish_before_commit", "table_commit_before_update", "publish_after_commit"])
def test_a_publish_killed_at_either_side_of_its_commit_is_finished_by_the_next(
    store, catalogs, tmp_path, subprocess_env, point
):
    config = catalogs
    create_topic(store, "t", 3)
    load(store)
    env = {**subprocess_env, "CTP_FAULT": point, **config.as_env(), "HOME": str(tmp_path)}
    r = subprocess.run(["setsid", "ctp", "table", "publish"], env=env, capture_output=True, text=True, timeout=300)
    # A REST catalog writes the new metadata and moves the table in one request: it has
    # no moment between the two, and that publish just completes.
    missed = config.is_rest and point == "table_commit_before_update"
    assert r.returncode == (0 if missed else r.returncode) and (missed or r.returncode in (-9, 137)), (
        r.returncode,
        r.stderr[-2000:],
    )
    env.pop("CTP_FAULT")
    r = subprocess.run(["ctp", "table", "publish", "--json"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    (out,) = json.loads(r.stdout)
    assert out["files_added"] == (0 if point == "publish_after_commit" or missed else 6), out
    files = [f.path for f in data_files(table_of(store, config, tmp_path))]
    assert len(files) == len(set(files)) == 6
    assert sortable(read_pyiceberg(table_of(store, config, tmp_path), store)).equals(committed(store))


def test_a_publish_killed_anywhere_leaves_each_file_in_the_table_once(store, catalogs, tmp_path, subprocess_env):
    """SIGKILL at a spread of moments (during the catalog commit among them), between
    rounds of produce and reconcile; then one publish that finishes."""
    import os
    import signal
    import time

    config = catalogs
    create_topic(store, "t", 3)
    env = {**subprocess_env, **config.as_env(), "HOME": str(tmp_path)}
    for r, delay in enumerate((0.3, 0.8, 1.2, 1.6, 2.0, 2.6)):
        load(store, rounds=1, tag=f"k{r}-")
        proc = subprocess.Popen(
            ["ctp", "table", "publish"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        time.sleep(delay)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    r = subprocess.run(["ctp", "table", "publish"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    files = [f.path for f in data_files(table_of(store, config, tmp_path))]
    assert len(files) == len(set(files)) == 18
    assert sortable(read_pyiceberg(table_of(store, config, tmp_path), store)).equals(committed(store))


def test_a_format1_file_goes_into_the_table_as_a_format2_copy(store, config, tmp_path, monkeypatch):
    create_topic(store, "t", 3)
    with monkeypatch.context() as m:  # reconciled by a ctp of format 1
        m.setattr(l1, "encode_parquet", format1_encoder(l1.encode_parquet))
        load(store, rounds=1)
    load(store, rounds=1, tag="v2-")
    out = do_publish(store, config, tmp_path)
    assert (out.files_added, out.format1_copied) == (6, 3), out.as_dict()
    assert sortable(read_pyiceberg(table_of(store, config, tmp_path), store)).equals(committed(store))
    again = do_publish(store, config, tmp_path)
    assert again.files_added == 0


def test_a_deleted_topics_table_goes_with_it_and_the_name_gets_a_new_table(store, catalogs, tmp_path):
    """``ctp topic delete``, then the GC's removal: the incarnation's table goes first
    (dropped from the catalog, then its files in the store); the new incarnation's table
    holds only its own records."""
    from pyiceberg.exceptions import NoSuchTableError

    from ctp_state.deletion import delete_topic
    from ctp_state.gc import run_gc
    from ctp_state.settings import GcSettings
    from ctp_state.table.maintenance import CatalogTables
    from expectations.gate import GxGate

    config = catalogs

    create_topic(store, "t", 3)
    load(store, rounds=1, tag="old-")
    old = get_topic(store, "t")
    do_publish(store, config, tmp_path)
    space = f"{layout.TABLES_ROOT}{layout.space('t', old.key_id)}/"
    assert any(True for _ in store.list(space))
    delete_topic(store, "t")
    tables = CatalogTables(store, config, home=str(tmp_path))
    rec = run_gc(
        store, gate=GxGate(str(tmp_path / "report")), config=GcSettings(topic_removal_grace_s=0), tables=tables
    )
    assert rec.topic_incarnations_removed == 1 and rec.topic_removal_errors == (), rec
    assert list(store.list(space)) == []
    with pytest.raises(NoSuchTableError):
        table_of(store, config, tmp_path)  # a REST catalog's table would have named the files that went
    create_topic(store, "t", 2)
    load(store, rounds=1, partitions=2, tag="new-")
    out = do_publish(store, config, tmp_path)
    assert out.files_added == 2 and out.topic_id == get_topic(store, "t").id
    values = sorted(read_pyiceberg(table_of(store, config, tmp_path), store).column("value").to_pylist())
    assert values and all(v.startswith(b"new-") for v in values)
    assert sortable(read_pyiceberg(table_of(store, config, tmp_path), store)).equals(committed(store, partitions=2))


def test_expiry_and_the_sweep_leave_a_table_that_still_reads(store, catalogs, tmp_path):
    """Five publishes, five snapshots; expire all but the newest two, then delete what
    nothing reaches: the old snapshots' manifest lists and vectors go (on a REST catalog
    only the vectors: its metadata is in the catalog's warehouse, not ctp's), the table
    still reads the same in every engine, and publishing goes on."""
    from ctp_state.table.maintenance import expire, reachable, unreachable

    config = catalogs

    create_topic(store, "t", 3)
    for r in range(5):
        if r == 3:  # the sweep deletes only what is older than the head (S3 mtimes: whole seconds)
            time.sleep(1 + CLOCK_SLACK_S)
        load(store, rounds=1, tag=f"e{r}-")
        do_publish(store, config, tmp_path)
    table = table_of(store, config, tmp_path)
    assert len(table.snapshots()) == 5
    before = sortable(read_pyiceberg(table, store))
    t = get_topic(store, "t")
    assert unreachable(store, table, t, now_s=2e9, grace_s=0) == []  # nothing to sweep yet
    out = expire(table, keep=2, max_age_ms=0, now_ms=int(4e12))
    assert (out.snapshots, out.kept) == (3, 2)
    table = table_of(store, config, tmp_path)
    young = unreachable(store, table, t, now_s=0, grace_s=60)  # all written just now: within the grace
    assert young == []
    gone = unreachable(store, table, t, now_s=2e9, grace_s=60)
    owned = ["published"] if config.is_rest else ["metadata", "published"]
    assert sorted({o.key.split("/")[-2] for o in gone}) == owned
    assert len([o for o in gone if "/published/" in o.key]) == 3
    keep = reachable(table)
    assert not any(o.key in keep or f"{store.url.rstrip('/')}/{o.key}" in keep for o in gone)
    store.delete_many([o.key for o in gone])
    table = table_of(store, config, tmp_path)
    for reader in READERS.values():
        assert sortable(reader(table, store)).equals(before)
    load(store, rounds=1, tag="after-")
    assert do_publish(store, config, tmp_path).files_added == 3
    assert sortable(read_pyiceberg(table_of(store, config, tmp_path), store)).equals(committed(store))


def test_the_gc_expires_snapshots_and_deletes_what_nothing_reaches_on_its_audit_trail(store, catalogs, tmp_path):
    config = catalogs
    from ctp_state.gc import run_gc
    from ctp_state.gc.history import GcHistory
    from ctp_state.settings import GcSettings
    from ctp_state.table.maintenance import CatalogTables
    from expectations.gate import GxGate

    create_topic(store, "t", 2)
    for r in range(4):
        if r == 3:  # the sweep deletes only what is older than the head, by the store's
            time.sleep(1 + CLOCK_SLACK_S)  # clock: S3 mtimes are whole seconds
        load(store, rounds=1, partitions=2, tag=f"g{r}-")
        do_publish(store, config, tmp_path)
    before = sortable(read_pyiceberg(table_of(store, config, tmp_path), store))
    settings = GcSettings(l1_grace_s=0, table_keep_snapshots=1, table_snapshot_max_age_s=0)
    tables = CatalogTables(store, config, home=str(tmp_path), keep=1, max_age_s=0)
    rec = run_gc(store, gate=GxGate(str(tmp_path / "report")), config=settings, tables=tables)
    assert rec.status == "ok" and rec.table_errors == ()
    assert (rec.table_snapshots_expired, rec.table_files_deleted) == (3, rec.table_files_deleted)
    # 3 manifest lists and 3 vectors at least; a REST table's manifest lists are its catalog's
    assert rec.table_files_deleted >= (3 if config.is_rest else 6)
    trail = GcHistory(store).read_deletes(rec.deletes_key).to_pylist()
    swept = [r for r in trail if r["kind"] == "table_metadata"]
    assert len(swept) == rec.table_files_deleted and all(r["outcome"] == "deleted" for r in swept)
    assert all(store.head(r["key"]) is None for r in swept)
    table = table_of(store, config, tmp_path)
    assert len(table.snapshots()) == 1
    for reader in READERS.values():
        assert sortable(reader(table, store)).equals(before)


def test_a_legacy_topics_table_goes_with_it_and_spares_its_successors(store, config, tmp_path):
    """A topic created before incarnation ids keeps its keys under ``<root>/t/`` -- its
    table under ``tables/t/<namespace>-<uuid>/`` -- beside a keyed successor's
    ``tables/t/<id>/``. Deleting the legacy topic removes its table's files and none of
    the successor's; both tables read exactly their own committed records throughout."""
    from ctp_state.deletion import delete_topic
    from ctp_state.gc import run_gc
    from ctp_state.settings import GcSettings
    from ctp_state.topic_meta import Topic, encode_meta
    from expectations.gate import GxGate

    store.put(layout.topic_meta("t"), encode_meta(Topic("t", 2, 1_700_000_000_000)))
    assert create_topic(store, "t", 2, exist_ok=True).id is None  # finishes the legacy creation
    load(store, rounds=1, partitions=2, tag="legacy-")
    assert do_publish(store, config, tmp_path).files_added == 2
    legacy = table_of(store, config, tmp_path)
    legacy_dir = legacy.location().rstrip("/") + "/"
    assert legacy_dir.startswith(f"{store.url.rstrip('/')}/{layout.TABLES_ROOT}t/ctp-")
    delete_topic(store, "t")
    create_topic(store, "t", 2)
    load(store, rounds=1, partitions=2, tag="keyed-")
    assert do_publish(store, config, tmp_path).files_added == 2
    keyed_dir = table_of(store, config, tmp_path).location().rstrip("/") + "/"
    root = store.url.rstrip("/") + "/"
    keyed_before = sorted(o.key for o in store.list(keyed_dir[len(root) :]))
    assert keyed_before and any(True for _ in store.list(legacy_dir[len(root) :]))
    rec = run_gc(store, gate=GxGate(str(tmp_path / "report")), config=GcSettings(topic_removal_grace_s=0))
    assert rec.topic_incarnations_removed == 1
    assert list(store.list(legacy_dir[len(root) :])) == []
    assert sorted(o.key for o in store.list(keyed_dir[len(root) :])) == keyed_before
    table = table_of(store, config, tmp_path)
    values = sorted(read_pyiceberg(table, store).column("value").to_pylist())
    assert len(values) == 8 and all(v.startswith(b"keyed-") for v in values)
    assert sortable(read_pyiceberg(table, store)).equals(committed(store, partitions=2))


@pytest.mark.parametrize("bad", ["../x", "a/b", "1st", "x" * 65])
def test_a_namespace_that_could_not_name_a_directory_is_refused_in_one_line(store, tmp_path, subprocess_env, bad):
    """The namespace names a directory in the store: ``--namespace ../x`` must not write
    outside the topic's space. Refused before anything is read or written."""
    create_topic(store, "t", 1)
    r = subprocess.run(
        ["ctp", "table", "publish", "--namespace", bad],
        env={**subprocess_env, "CTP_CATALOG_URI": f"sqlite:///{tmp_path}/c.db"},
        capture_output=True,
        text=True,
    )
    err = r.stderr.strip()
    assert r.returncode != 0 and len(err.splitlines()) == 1 and "table namespace" in err, err
    assert not (tmp_path / "c.db").exists()
    assert not any(True for _ in store.list(layout.TABLES_ROOT))
