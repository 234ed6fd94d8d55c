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


def test_a_commit_from_an_overtaken_table_fails_and_changes_nothing(store, catalogs, tmp_path):
    create_topic(store, "t", 3)
    load(store, rounds=1)
    do_publish(store, catalogs, tmp_path)
    catalog = open_catalog(store, catalogs, home=str(tmp_path))
    first, overtaken = catalog.load_table(IDENT), catalog.load_table(IDENT)

    first.transaction().set_properties(first="1").commit_transaction()
    with pytest.raises(CommitFailedException):
        overtaken.transaction().set_properties(second="2").commit_transaction()

    now = open_catalog(store, catalogs, home=str(tmp_path)).load_table(IDENT)
    assert now.properties.get("first") == "1" and "second" not in now.properties
    assert now.metadata_location == first.metadata_location  # (the table a commit returns is the new head)
    assert now.current_snapshot().snapshot_id == overtaken.current_snapshot().snapshot_id


def test_a_current_tables_commit_does_not_load_it_again(store, catalogs, tmp_path, monkeypatch):
    create_topic(store, "t", 3)
    load(store, rounds=1)
    do_publish(store, catalogs, tmp_path)
    catalog = open_catalog(store, catalogs, home=str(tmp_path))
    table = catalog.load_table(IDENT)
    monkeypatch.setattr(catalog, "load_table", lambda *_: pytest.fail("the commit loaded the table again"))

    table = table.transaction().set_properties(a="1").commit_transaction()
    table = table.transaction().set_properties(b="2").commit_transaction()  # from the table the last one returned

    monkeypatch.undo()
    now = catalog.load_table(IDENT)
    assert (now.properties.get("a"), now.properties.get("b")) == ("1", "2")
    assert now.metadata_location == table.metadata_location
