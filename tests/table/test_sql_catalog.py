"""The SQL catalog commits against the metadata its table was loaded with: a commit
from a table that another commit has overtaken fails and changes nothing, on SQLite
and on PostgreSQL; a current one lands without loading the table again."""

from __future__ import annotations

import pytest
from pyiceberg.exceptions import CommitFailedException

from ctp_state.table.catalog import open_catalog
from ctp_state.topics import create_topic
from tests.support.table import do_publish, load

IDENT = ("ctp", "t")


def test_a_commit_from_an_overtaken_table_fails_and_changes_nothing(store, sql_catalogs, tmp_path):
    create_topic(store, "t", 3)
    load(store, rounds=1)
    do_publish(store, sql_catalogs, tmp_path)
    catalog = open_catalog(store, sql_catalogs, home=str(tmp_path))
    first, overtaken = catalog.load_table(IDENT), catalog.load_table(IDENT)

    first.transaction().set_properties(first="1").commit_transaction()
    with pytest.raises(CommitFailedException):
        overtaken.transaction().set_properties(second="2").commit_transaction()

    now = open_catalog(store, sql_catalogs, home=str(tmp_path)).load_table(IDENT)
    assert now.properties.get("first") == "1" and "second" not in now.properties
    assert now.metadata_location == first.metadata_location  # (the table a commit returns is the new head)
    assert now.current_snapshot().snapshot_id == overtaken.current_snapshot().snapshot_id


def test_a_current_tables_commit_does_not_load_it_again(store, sql_catalogs, tmp_path, monkeypatch):
    create_topic(store, "t", 3)
    load(store, rounds=1)
    do_publish(store, sql_catalogs, tmp_path)
    catalog = open_catalog(store, sql_catalogs, home=str(tmp_path))
    table = catalog.load_table(IDENT)
    monkeypatch.setattr(catalog, "load_table", lambda *_: pytest.fail("the commit loaded the table again"))

    table = table.transaction().set_properties(a="1").commit_transaction()
    table = table.transaction().set_properties(b="2").commit_transaction()  # from the table the last one returned

    monkeypatch.undo()
    now = catalog.load_table(IDENT)
    assert (now.properties.get("a"), now.properties.get("b")) == ("1", "2")
    assert now.metadata_location == table.metadata_location


def test_two_commits_through_one_shared_table_never_land_one_on_the_others_head(sql_catalogs, tmp_path):
    """Found by review: B makes its commit from the shared table's metadata; while B
    writes its metadata file, A's commit through the same table object lands and moves
    the object on. B must fail (its base is gone), not land on A's head and drop A's
    append."""
    import threading

    import pyarrow as pa

    from ctp_state.table.sql_catalog import sql_catalog_class

    catalog = sql_catalog_class()("c", uri=sql_catalogs.uri, warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace_if_not_exists("ns")
    schema = pa.schema([pa.field("x", pa.int64())])
    catalog.create_table(("ns", "t"), schema=schema, properties={"commit.retry.num-retries": "0"})
    shared = catalog.load_table(("ns", "t"))
    shared.append(pa.table({"x": [0]}, schema=schema))
    b_writing, a_done = threading.Event(), threading.Event()
    write_metadata = catalog._write_metadata

    def b_waits_for_a(*args, **kwargs):
        if threading.current_thread().name == "B":
            b_writing.set()
            assert a_done.wait(20)
        return write_metadata(*args, **kwargs)

    catalog._write_metadata = b_waits_for_a
    outcome: dict[str, str] = {}

    def append(name: str, value: int) -> None:
        try:
            if name == "A":
                assert b_writing.wait(20)
            shared.append(pa.table({"x": [value]}, schema=schema))
            outcome[name] = "committed"
        except CommitFailedException:
            outcome[name] = "refused"
        finally:
            if name == "A":
                a_done.set()

    threads = [threading.Thread(target=append, args=(n, v), name=n) for n, v in (("B", 2), ("A", 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert outcome == {"A": "committed", "B": "refused"}
    rows = sql_catalog_class()("c", uri=sql_catalogs.uri).load_table(("ns", "t")).scan().to_arrow().column("x")
    assert sorted(rows.to_pylist()) == [0, 1]
