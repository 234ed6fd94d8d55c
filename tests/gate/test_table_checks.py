"""The GC's gate checks each topic's Iceberg table against its state log before any
delete: published <= reconciled (the table holds nothing its log does not commit), and
a partition's files in the table tile its offsets from 0 (no gap, no overlap), each
holding exactly the range its name gives. A table that breaks them stops the GC with
nothing deleted; the plain-Python backstop says the same when the gate is bypassed.
On the local store and on S3."""

from __future__ import annotations

import pytest

from ctp_state import layout
from ctp_state.errors import GateFailed
from ctp_state.gc import GateResult, run_gc
from ctp_state.gc.prepare import check, prepare
from ctp_state.settings import GcSettings
from ctp_state.table.catalog import uri_of
from ctp_state.table.files import data_files
from ctp_state.table.maintenance import CatalogTables
from ctp_state.table.vector import PUBLISHED, write_vector
from ctp_state.topics import get_topic
from expectations.gate import GxGate
from tests.support.table import do_publish, load, table_of


def tables_of(store, config, tmp_path) -> CatalogTables:
    return CatalogTables(store, config, home=str(tmp_path), keep=100, max_age_s=1e9)


def l0_count(store) -> int:
    return sum(1 for _ in store.list(layout.L0_ROOT))


@pytest.fixture
def published(store, config, tmp_path):
    """Topic t (3 partitions): two reconciled rounds, both published; a third round
    reconciled and not published yet; the epoch advanced so M can pass the L0 objects."""
    return publish_two_rounds(store, config, tmp_path)


def publish_two_rounds(store, config, tmp_path):
    from ctp_state.topics import create_topic

    create_topic(store, "t", 3)
    for r in range(2):
        load(store, rounds=1, tag=f"a{r}-")
        do_publish(store, config, tmp_path)
    load(store, rounds=1, tag="b-")
    return store


def test_a_table_that_follows_its_log_passes_and_is_what_the_gate_judged(store, catalogs, tmp_path):
    config = catalogs  # (on every kind of catalog: SQLite, PostgreSQL, REST)
    store = publish_two_rounds(store, config, tmp_path)
    p = prepare(store, GcSettings(dry_run=True), tables=tables_of(store, config, tmp_path))
    files = p.frames["table_files"].to_pylist()
    parts = p.frames["table_partitions"].to_pylist()
    assert len(files) == 6 and {f["partition"] for f in files} == {0, 1, 2}
    assert [(r["published_through"], r["files_through"], r["reconciled_through"]) for r in parts] == [(7, 7, 11)] * 3
    rec = run_gc(
        store, gate=GxGate(str(tmp_path / "report")), config=GcSettings(), tables=tables_of(store, config, tmp_path)
    )
    assert rec.status == "ok" and rec.gate.success and rec.table_errors == ()


def rogue_append(store, config, tmp_path, keys, vector) -> None:
    """Another writer (a bug, a tool) commits ``keys`` to t's table under ``vector``,
    bypassing ctp's publish."""
    table = table_of(store, config, tmp_path)
    vkey = write_vector(store, table, get_topic(store, "t"), vector)
    tx = table.transaction()
    tx.add_files([uri_of(store, k) for k in keys], snapshot_properties={PUBLISHED: vkey}, check_duplicate_files=False)
    tx.commit_transaction()


def assert_stopped(store, config, tmp_path, why: str) -> None:
    before = l0_count(store)
    assert before > 0
    with pytest.raises(GateFailed) as e:
        run_gc(
            store, gate=GxGate(str(tmp_path / "report")), config=GcSettings(), tables=tables_of(store, config, tmp_path)
        )
    assert why in str(e.value.failures), e.value.failures
    assert l0_count(store) == before  # nothing deleted


def test_a_table_that_publishes_past_its_log_stops_the_gc(store, catalogs, tmp_path):
    """A file the log does not commit (an orphan at offsets past the reconciled end)
    appended under a vector that claims it: published > reconciled."""
    config = catalogs  # (on every kind of catalog: SQLite, PostgreSQL, REST)
    store = publish_two_rounds(store, config, tmp_path)
    t = get_topic(store, "t")
    last = table_of(store, config, tmp_path)
    first = data_files(last)[0]
    # Offsets 8-11 are reconciled; 12-15 are not: put an orphan there (a committed file's bytes).
    orphan = layout.l1_key("t", 0, 12, 15, t.key_id)
    store.put(orphan, store.get(first.path[len(store.url.rstrip("/")) + 1 :]))
    mid = layout.l1_key("t", 0, 8, 11, t.key_id)
    rogue_append(store, config, tmp_path, [mid, orphan], {0: 15, 1: 7, 2: 7})
    assert_stopped(store, config, tmp_path, "published <= reconciled")


def test_a_file_appended_twice_stops_the_gc(published, config, tmp_path):
    store = published
    files = data_files(table_of(store, config, tmp_path))
    key = files[0].path[len(store.url.rstrip("/")) + 1 :]
    rogue_append(store, config, tmp_path, [key], {0: 7, 1: 7, 2: 7})
    assert_stopped(store, config, tmp_path, "no gap, no overlap")


def test_a_file_dropped_from_the_table_stops_the_gc(published, config, tmp_path):
    """A file removed from the table (an operator's delete, a rewrite gone wrong) leaves
    a gap where the vector says the records are."""
    from pyiceberg.expressions import And, EqualTo, LessThanOrEqual

    store = published
    table = table_of(store, config, tmp_path)
    table.delete(And(EqualTo("partition", 1), LessThanOrEqual("offset", 3)))
    assert len(data_files(table_of(store, config, tmp_path))) == 5
    assert_stopped(store, config, tmp_path, "no gap, no overlap")


def test_the_backstop_stops_what_a_gate_that_passes_everything_lets_through(published, config, tmp_path):
    """Without the GX gate (a gate that passes all), the plain-Python backstop still
    reports a table that leads its log and one with a hole."""
    store = published
    t = get_topic(store, "t")
    table = table_of(store, config, tmp_path)
    mid = layout.l1_key("t", 0, 8, 11, t.key_id)
    beyond = layout.l1_key("t", 0, 12, 15, t.key_id)
    store.put(beyond, store.get(mid))
    rogue_append(store, config, tmp_path, [beyond], {0: 15, 1: 7, 2: 7})
    p = prepare(store, GcSettings(dry_run=True), tables=tables_of(store, config, tmp_path))
    _, failures = check(p, lambda frames: GateResult(True, []))
    assert any("publishes partition 0 through offset 15" in f and "only through 11" in f for f in failures), failures
    assert any("starts at offset 12, expected 8" in f for f in failures), failures
    del table


def test_a_catalog_that_does_not_open_is_reported_not_a_stop(published, tmp_path):
    """The table is a projection: a catalog in trouble is on the run's record, and L0
    collection goes on."""
    from ctp_state.table.catalog import CatalogConfig

    store = published
    broken = CatalogConfig(uri=f"sqlite:///{tmp_path}/no/such/dir/catalog.db")
    rec = run_gc(
        store, gate=GxGate(str(tmp_path / "report")), config=GcSettings(), tables=tables_of(store, broken, tmp_path)
    )
    assert rec.status == "ok" and rec.deleted > 0
    assert any("catalog" in e for e in rec.table_errors), rec.table_errors


def test_status_and_validate_show_the_table_beside_the_log(published, config, tmp_path, subprocess_env):
    """``ctp status`` shows per partition the offset reconciled beside the offset
    published; ``ctp validate`` checks the table (and fails on a table that leads)."""
    import json

    from tests.support import ctp

    store = published
    env = {**subprocess_env, **config.as_env(), "HOME": str(tmp_path)}
    r = ctp(env, "status", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["partitions"]
    assert [(x["last_reconciled_offset"], x["published_offset"]) for x in rows] == [(11, 7)] * 3
    r = ctp(env, "status")
    assert r.returncode == 0 and "published" in r.stdout and "reconciled" in r.stdout, r.stdout
    report = ["--report-dir", str(tmp_path / "report")]
    assert ctp(env, "validate", *report).returncode == 0
    t = get_topic(store, "t")
    beyond = layout.l1_key("t", 2, 12, 15, t.key_id)
    store.put(beyond, store.get(layout.l1_key("t", 2, 8, 11, t.key_id)))
    rogue_append(store, config, tmp_path, [layout.l1_key("t", 2, 8, 11, t.key_id), beyond], {0: 7, 1: 7, 2: 15})
    r = ctp(env, "validate", *report)
    assert r.returncode == 1 and "table_files: " in r.stderr, r.stderr  # the first of its failures
    # Without a catalog (none configured, none beside the store), status shows no table.
    r = ctp({**subprocess_env, "HOME": str(tmp_path / "elsewhere")}, "status", "--json")
    assert r.returncode == 0, r.stderr
    assert all(x["published_offset"] is None for x in json.loads(r.stdout)["partitions"])


def test_a_topic_deleted_and_created_again_between_the_two_reads_does_not_stop_the_gc(published, config, tmp_path):
    """The table is read first, then the states: a delete and re-create of the topic in
    between leaves table rows with no state of their incarnation beside them. That is a
    race, not a broken table: the run goes on."""
    from ctp_state.deletion import delete_topic
    from ctp_state.topics import create_topic

    store = published
    real = tables_of(store, config, tmp_path)

    class DeletedInBetween:
        def heads(self):
            got = real.heads()
            delete_topic(store, "t")
            create_topic(store, "t", 3)
            return got

        def maintain(self, now_s, grace_s):
            return real.maintain(now_s, grace_s)

        def drop(self, t):
            return real.drop(t)

    rec = run_gc(store, gate=GxGate(str(tmp_path / "report")), config=GcSettings(), tables=DeletedInBetween())
    assert rec.status == "ok" and rec.gate.success


# --- round-four review, suspect: the checks read only a file's <first>-<last> name -----------


def test_a_table_file_that_is_not_a_committed_l1_file_stops_the_gc(store, catalogs, tmp_path):
    """A rogue commit swaps in, for reconciled offsets 8-11, a file at another key with
    the same name tail and the same rows (a copy under another incarnation's space): it
    tiles, it holds the range its name gives, the vector agrees -- and it is not the file
    the live incarnation's log commits."""
    config = catalogs  # (on every kind of catalog: SQLite, PostgreSQL, REST)
    store = publish_two_rounds(store, config, tmp_path)
    t = get_topic(store, "t")
    mine = layout.l1_key("t", 0, 8, 11, t.key_id)
    elsewhere = layout.l1_key("t", 0, 8, 11, "0123456789abcdef0123456789abcdef")
    store.put(elsewhere, store.get(mine))
    rogue_append(store, config, tmp_path, [elsewhere], {0: 11, 1: 7, 2: 7})
    assert_stopped(store, config, tmp_path, "committed L1 file")
    p = prepare(store, GcSettings(dry_run=True), tables=tables_of(store, config, tmp_path))
    _, failures = check(p, lambda frames: GateResult(True, []))
    assert any("is not a committed L1 file" in f and elsewhere in f for f in failures), failures


def test_a_table_partition_the_live_incarnation_does_not_have_stops_the_gc(published, config, tmp_path):
    """A rogue commit adds partition 7 to a 3-partition topic's table (a file named like
    an L1 key of partition 7, and a vector that claims it)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    store = published
    t = get_topic(store, "t")
    rows = pq.read_table(io.BytesIO(store.get(layout.l1_key("t", 0, 0, 3, t.key_id))))
    at = rows.schema.get_field_index("partition")
    rows = rows.set_column(at, rows.schema.field(at), pa.array([7] * rows.num_rows, rows.schema.field(at).type))
    out = io.BytesIO()
    pq.write_table(rows, out)
    stray = layout.l1_key("t", 7, 0, 3, t.key_id)
    store.put(stray, out.getvalue())
    rogue_append(store, config, tmp_path, [stray], {0: 7, 1: 7, 2: 7, 7: 3})
    assert [f.partition for f in data_files(table_of(store, config, tmp_path))].count(7) == 1
    assert_stopped(store, config, tmp_path, "committed L1 file")
