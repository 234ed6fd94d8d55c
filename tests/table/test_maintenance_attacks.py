"""The GC's table sweep against a publish in flight (round-four review, defect 2).

Before the fix, a publish paused after writing its published vector (or its manifests,
or its new metadata file) for longer than ``--l1-grace-seconds`` had those files swept
as unreachable; the sweep left the head where it was, so the paused commit still landed
and named a missing file. From then on every ``ctp table publish`` and ``ctp table
show`` of the topic failed, with no way out.

Wanted, and checked here on both stores and both SQL catalogs: no pause of any length
lets a publish commit a head that names a deleted file; and a table already in that
state recovers by the next publish.
"""

from __future__ import annotations

import pytest

from ctp_state import crashpoints
from ctp_state.gc import run_gc
from ctp_state.settings import GcSettings
from ctp_state.table.files import published_vector, table_head
from ctp_state.table.maintenance import CLOCK_SLACK_S, CatalogTables
from ctp_state.table.vector import PUBLISHED
from ctp_state.topics import create_topic, get_topic
from tests.support.table import READERS, committed, do_publish, load, sortable, table_of

#: A GC with no grace at all: anything unreachable is deleted at once.
NO_GRACE = GcSettings(l1_grace_s=0, grace_s=0, topic_removal_grace_s=0)


def sweeping_gc(store, gate, config, tmp_path):
    """A whole GC run whose table sweep deletes what nothing reaches, with no grace, and
    expires nothing (the head stays where it is)."""
    tables = CatalogTables(store, config, home=str(tmp_path), keep=100, max_age_s=1e9)
    return run_gc(store, gate=gate, config=NO_GRACE, tables=tables)


def assert_table_whole(store, config, tmp_path):
    table = table_of(store, config, tmp_path)
    head = table_head(store, table, get_topic(store, "t"))  # vector and manifests read
    want = committed(store)
    for name, reader in READERS.items():
        assert sortable(reader(table, store)).equals(want), name
    return head


@pytest.mark.parametrize("point", ["publish_before_commit", "table_commit_before_update"])
def test_a_publish_paused_across_a_gc_sweep_commits_nothing_that_was_deleted(store, catalogs, gate, tmp_path, point):
    """A publish pauses with its vector and manifests written (``publish_before_commit``)
    or with its new metadata file written too (``table_commit_before_update``) while a
    GC with no grace sweeps the table; then it commits."""
    create_topic(store, "t", 3)
    load(store, rounds=1, tag="a-")
    do_publish(store, catalogs, tmp_path)
    load(store, rounds=1, tag="b-")
    swept = []

    def at(p: str, index: int) -> None:
        if p == point and not swept:
            swept.append(sweeping_gc(store, gate, catalogs, tmp_path))

    crashpoints.install(at)
    try:
        done = do_publish(store, catalogs, tmp_path)
    finally:
        crashpoints.install(None)
    if catalogs.is_rest and point == "table_commit_before_update":
        # A REST catalog writes the new metadata and moves the table in one request:
        # there is no such moment to pause at (the metadata is the catalog's anyway).
        assert not swept
        swept.append(sweeping_gc(store, gate, catalogs, tmp_path))
    assert swept and swept[0].status == "ok", swept
    assert done.files_added == 3
    head = assert_table_whole(store, catalogs, tmp_path)
    assert head.published == {0: 7, 1: 7, 2: 7}
    # and it goes on: another round, another sweep, another publish
    sweeping_gc(store, gate, catalogs, tmp_path)
    load(store, rounds=1, tag="c-")
    assert do_publish(store, catalogs, tmp_path).files_added == 3
    assert_table_whole(store, catalogs, tmp_path)


def test_a_table_whose_head_names_a_missing_vector_is_repaired_by_the_next_publish(store, config, tmp_path):
    """A table left in the state the defect produced (the head names a published vector
    that is not in the store): the next publish rebuilds the vector from the head's own
    data files, checks it, and commits a head that names a vector that exists -- with
    new files and without."""
    create_topic(store, "t", 3)
    load(store, rounds=2, tag="a-")
    do_publish(store, config, tmp_path)
    table = table_of(store, config, tmp_path)
    vector = table.current_snapshot().summary.additional_properties[PUBLISHED]
    store.delete_many([vector])
    with pytest.raises(Exception, match="not in the store"):
        published_vector(store, table)
    repaired = do_publish(store, config, tmp_path)  # nothing new to publish
    assert repaired.files_added == 0
    assert published_vector(store, table_of(store, config, tmp_path)) == {0: 7, 1: 7, 2: 7}
    assert_table_whole(store, config, tmp_path)
    # again, with new files waiting
    store.delete_many([table_of(store, config, tmp_path).current_snapshot().summary.additional_properties[PUBLISHED]])
    load(store, rounds=1, tag="b-")
    assert do_publish(store, config, tmp_path).files_added == 3
    assert_table_whole(store, config, tmp_path)


def test_a_table_whose_head_lost_its_manifest_list_is_rebuilt_by_the_next_publish(store, config, tmp_path):
    """The head's manifest list gone from the store (the other file a robbed publish could
    commit without): the table cannot say what it holds; the next publish drops it, at
    the metadata it judged, and publishes it again from the state log."""
    from ctp_state.table.vector import key_of

    create_topic(store, "t", 3)
    load(store, rounds=2, tag="a-")
    do_publish(store, config, tmp_path)
    table = table_of(store, config, tmp_path)
    store.delete_many([key_of(store, table.current_snapshot().manifest_list)])
    load(store, rounds=1, tag="b-")
    done = do_publish(store, config, tmp_path)
    assert done.files_added == 9, done
    assert_table_whole(store, config, tmp_path)


def test_publish_rebuild_makes_a_table_whose_manifests_are_lost_whole_again(store, config, tmp_path, subprocess_env):
    """A lost manifest the head still lists (a publish reads only the manifest list, so it
    cannot see it): ``ctp table publish --rebuild`` is the documented way out."""
    from ctp_state.table.vector import key_of
    from tests.support import ctp_on_path

    create_topic(store, "t", 3)
    load(store, rounds=2, tag="a-")
    do_publish(store, config, tmp_path)
    table = table_of(store, config, tmp_path)
    store.delete_many([key_of(store, table.current_snapshot().manifests(table.io)[0].manifest_path)])
    with pytest.raises(OSError):
        committed_table = table_of(store, config, tmp_path)
        READERS["pyiceberg"](committed_table, store)
    env = {**subprocess_env, **config.as_env()}
    out = ctp_on_path(env, "table", "publish", "t", "--rebuild", "--json")
    assert out.returncode == 0, out.stderr
    assert_table_whole(store, config, tmp_path)


def test_a_table_written_through_another_spelling_of_the_store_is_neither_refused_nor_swept(tmp_path, config, gate):
    """A file store reached through a symlink (``/data/ctp`` -> ``/mnt/disk/ctp``; a DAG
    and an operator's shell spelling it differently): the table's paths carry one root,
    the GC runs under the other. Found BROKEN by review: the gate's committed check
    compared whole paths and failed every run (nothing collected); reading the sweep
    after it, its reachable set was compared by URI too, so the head's own manifests
    would have gone as unreachable. Both now compare store keys (ObjectStore.key_of)."""
    import os
    import time

    from ctp_state.storage import open_store

    real = tmp_path / "disk" / "store"
    real.mkdir(parents=True)
    os.symlink(tmp_path / "disk", tmp_path / "link")
    via_link = open_store(f"file://{tmp_path}/link/store", {})
    via_real = open_store(f"file://{real}", {})
    create_topic(via_link, "t", 3)
    load(via_link, rounds=1, tag="a-")
    do_publish(via_link, config, tmp_path)
    time.sleep(1 + CLOCK_SLACK_S)  # the first publish's files are older than the next head
    load(via_link, rounds=1, tag="b-")
    do_publish(via_link, config, tmp_path)
    rec = sweeping_gc(via_real, gate, config, tmp_path)
    assert rec.status == "ok" and rec.gate.success, rec
    table = table_of(via_real, config, tmp_path)
    assert table_head(via_real, table, get_topic(via_real, "t")).published == {0: 7, 1: 7, 2: 7}
    for name, reader in READERS.items():
        assert sortable(reader(table, via_real)).equals(committed(via_real)), name
