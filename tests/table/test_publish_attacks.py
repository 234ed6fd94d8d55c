"""Adversarial scenarios against ``ctp table publish`` and the GC's table maintenance.

Invariant at stake in every test: a topic's Iceberg table holds exactly the records the
live incarnation's reconcile entries committed, each once; every reader agrees; a
publish that reported success is never undone; the GC never deletes a file a table
still needs; and a publish that lost a race recovers by itself.

Scenarios:

* a publisher that resolved the topic before ``ctp topic delete`` + ``create`` reaches
  it after the new incarnation's table was published (directly, and as ``ctp table
  publish a t`` that spends its time on ``a`` first);
* the same publisher mid-publish (its states read) while the name is re-created and the
  new table published: its retry must not land in the new table;
* two publishers of the new incarnation meeting the old incarnation's table: one drops
  it and publishes, the other drops what the first created;
* one topic published to two namespaces (``--namespace``): the GC, configured with one,
  sweeps the table directory both share;
* a publisher holding a stale head while another publishes and the GC expires and
  sweeps the stale head's snapshot;
* commit outcomes unknown: the catalog's answer lost after the commit landed (alone,
  and with a second publisher landing before the lookup), and lost before it landed;
* a reconcile committing between a publish's state read and its commit.
"""

from __future__ import annotations

import pytest

from ctp_state import crashpoints
from ctp_state.deletion import delete_topic, store_now
from ctp_state.errors import CtpError
from ctp_state.status import read_states
from ctp_state.table.catalog import TOPIC_ID, CatalogConfig, open_catalog
from ctp_state.table.files import data_files
from ctp_state.table.maintenance import CatalogTables
from ctp_state.table.publish import publish
from ctp_state.topics import create_topic, get_topic
from tests.support.table import (
    READERS,
    committed,
    do_publish,
    load,
    read_pyiceberg,
    sortable,
    table_of,
)


class Killed(BaseException):
    """Stands for SIGKILL at a crash point (in-process, so the test can go on)."""


def killed_at(point: str, nth: int = 1):
    """A crash-point handler that "kills" the ``nth`` arrival at ``point`` (in this
    process: other publishers run inside the test's hooks and reach it too)."""
    seen = []

    def handler(p: str, index: int) -> None:
        if p == point:
            seen.append(p)
            if len(seen) == nth:
                raise Killed(p)

    return handler


def assert_exact(store, cfg, tmp_path, partitions: int = 3, readers=("pyiceberg",)) -> None:
    """The table holds exactly the live incarnation's committed records, each once, in
    every reader named, and belongs to the live incarnation."""
    table = table_of(store, cfg, tmp_path)
    assert table.properties.get(TOPIC_ID) == get_topic(store, "t").incarnation, table.properties
    files = [f.path for f in data_files(table)]
    assert len(files) == len(set(files)), files
    want = committed(store, partitions)
    for name in readers:
        got = sortable(READERS[name](table, store))
        assert got.num_rows == want.num_rows and got.equals(want), (
            name,
            sorted(set(got.column("value").to_pylist()) - set(want.column("value").to_pylist()))[:5],
            sorted(set(want.column("value").to_pylist()) - set(got.column("value").to_pylist()))[:5],
        )


# --- incarnations --------------------------------------------------------------------


def test_a_stale_publisher_of_a_deleted_incarnation_does_not_replace_the_new_table(store, config, tmp_path):
    """Attack: a publisher resolved ``t`` (incarnation 1) before ``ctp topic delete t`` +
    ``ctp topic create t``; the new incarnation is reconciled and published (success).
    The stale publisher then publishes its Topic. It must not drop the live
    incarnation's table and put the deleted incarnation's records in its place."""
    create_topic(store, "t", 3)
    load(store, rounds=1, tag="old-")
    old = get_topic(store, "t")
    do_publish(store, config, tmp_path)
    delete_topic(store, "t")
    create_topic(store, "t", 3)
    load(store, rounds=1, tag="new-")
    out = do_publish(store, config, tmp_path)
    assert out.files_added == 3
    assert_exact(store, config, tmp_path)
    catalog = open_catalog(store, config, home=str(tmp_path))
    try:
        publish(store, catalog, old, config, read_states=lambda t: read_states(store, [t]))
    except CtpError:
        pass  # refusing is fine
    assert_exact(store, config, tmp_path)


def test_ctp_table_publish_of_several_topics_meets_a_recreated_name_late(store, config, tmp_path, monkeypatch):
    """Attack: ``ctp table publish a t`` resolves both topics first, then publishes ``a``;
    meanwhile ``t`` is deleted, re-created, reconciled, and the new incarnation's table
    published (by the reconcile DAG's publish task). When the long run reaches ``t`` it
    holds the deleted incarnation: the live table must survive it."""
    from ctp_state.table import jobs

    create_topic(store, "a", 1)
    create_topic(store, "t", 3)
    load(store, rounds=1, tag="old-")
    do_publish(store, config, tmp_path)
    real = jobs.read_states
    fired = []

    def read_states_racing(st, topics):
        if topics[0].name == "a" and not fired:
            fired.append(1)
            delete_topic(store, "t")
            create_topic(store, "t", 3)
            load(store, rounds=1, tag="new-")
            assert do_publish(store, config, tmp_path).files_added == 3
        return real(st, topics)

    monkeypatch.setattr(jobs, "read_states", read_states_racing)
    try:
        jobs.publish_topics(store, config, home=str(tmp_path), topics=["a", "t"])
    except CtpError:
        pass
    assert fired
    assert_exact(store, config, tmp_path)


def test_a_publisher_mid_publish_across_a_recreate_does_not_land_in_the_new_table(store, config, tmp_path):
    """Attack: a publish of incarnation 1 has read its head and its states when the name
    is deleted, re-created, and the new incarnation's table published. Its commit then
    loses (another table under the name); its retry reloads the table by name -- the new
    incarnation's -- and must not append incarnation 1's files to it (with equal
    partition counts and offsets the files would 'follow' the new vector)."""
    create_topic(store, "t", 3)
    load(store, rounds=1, tag="old-")
    old = get_topic(store, "t")
    do_publish(store, config, tmp_path)
    load(store, rounds=1, tag="old2-")  # incarnation 1's offsets 4..7, not yet published
    fired = []

    def states(t):
        got = read_states(store, [t])
        if not fired:
            fired.append(1)
            delete_topic(store, "t")
            create_topic(store, "t", 3)
            load(store, rounds=1, tag="new-")
            assert do_publish(store, config, tmp_path).files_added == 3
        return got

    catalog = open_catalog(store, config, home=str(tmp_path))
    try:
        publish(store, catalog, old, config, read_states=states)
    except (CtpError, ValueError):
        pass  # failing is fine; landing in the new table is not
    assert fired
    assert_exact(store, config, tmp_path)
    load(store, rounds=1, tag="new2-")
    assert do_publish(store, config, tmp_path).files_added == 3
    assert_exact(store, config, tmp_path)


def test_two_publishers_replacing_an_old_incarnations_table_keep_what_one_published(store, config, tmp_path):
    """Attack: after delete + create, two publishers of the new incarnation both load the
    old incarnation's table. P1 drops it, creates the new table and publishes (success).
    P2, holding the old table it loaded, drops by name -- now P1's table -- creates
    another and is killed before its commit. The records P1 reported published must
    still be in the table."""
    create_topic(store, "t", 3)
    load(store, rounds=1, tag="old-")
    do_publish(store, config, tmp_path)
    delete_topic(store, "t")
    create_topic(store, "t", 3)
    load(store, rounds=1, tag="new-")
    catalog2 = open_catalog(store, config, home=str(tmp_path))
    real_load = catalog2.load_table
    first = []

    def load_then_p1_publishes(*args, **kwargs):
        got = real_load(*args, **kwargs)
        if not first:
            first.append(1)
            assert got.properties.get(TOPIC_ID) != get_topic(store, "t").incarnation  # the old one
            out = do_publish(store, config, tmp_path)  # P1
            assert out.files_added == 3
            assert_exact(store, config, tmp_path)
        return got

    catalog2.load_table = load_then_p1_publishes
    saved = crashpoints._handler
    crashpoints.install(killed_at("publish_before_commit", nth=2))  # P1 reaches it first
    try:
        # P2 must not drop P1's table: it finds it (its conditional drop of the old one
        # fails), sees everything published, and appends nothing -- or, had there been
        # more to publish, would have been killed before its commit.
        out = publish(store, catalog2, get_topic(store, "t"), config, read_states=lambda t: read_states(store, [t]))
        assert out.files_added == 0, out.as_dict()
    except Killed:
        pass
    finally:
        crashpoints.install(saved)
    assert first
    # P1's publish reported success: its records must still be there
    assert_exact(store, config, tmp_path)


# --- namespaces ------------------------------------------------------------------------


def test_the_gc_of_one_namespace_leaves_another_namespaces_table_of_the_topic_readable(store, tmp_path):
    """Attack: topic ``t`` published to namespace ``ctp`` (the GC's, from
    $CTP_TABLE_NAMESPACE) and to ``mirror`` (``ctp table publish --namespace mirror``,
    e.g. while moving to a new namespace). Both tables live at ``tables/t/<id>/``. The
    GC, two hours later (grace 3600 s), expires and sweeps the ``ctp`` table: it must
    not delete the ``mirror`` table's metadata, manifests and vectors."""
    uri = f"sqlite:///{tmp_path}/catalog.db"
    main, mirror = CatalogConfig(uri=uri, namespace="ctp"), CatalogConfig(uri=uri, namespace="mirror")
    create_topic(store, "t", 3)
    for r in range(2):
        load(store, rounds=1, tag=f"n{r}-")
        do_publish(store, main, tmp_path)
        do_publish(store, mirror, tmp_path)
    m = CatalogTables(store, main, home=str(tmp_path), keep=1, max_age_s=0)
    sweep = m.maintain(store_now(store) + 7200, 3600)
    assert not sweep.errors, sweep.errors
    store.delete_many([o.key for o in sweep.unreachable])
    assert_exact(store, main, tmp_path)
    mirror_table = open_catalog(store, mirror, home=str(tmp_path)).load_table(("mirror", "t"))
    want = committed(store)
    for name, reader in READERS.items():
        assert sortable(reader(mirror_table, store)).equals(want), name
    load(store, rounds=1, tag="n2-")
    assert do_publish(store, mirror, tmp_path).files_added == 3


def test_a_partly_swept_other_namespace_table_is_not_left_unreadable_for_good(store, tmp_path):
    """Attack: as above, but the GC (namespace ``ctp``) runs when the ``mirror`` table's
    newest publish is within the grace and its first is not. The sweep takes the first
    publish's manifest (still listed by the head) but leaves the head's metadata: the
    table loads, no engine can scan it, and the next publish -- which only drops a
    table whose metadata does not load -- appends on top of the hole. The mirror table
    must read again after a publish (or never have been damaged)."""
    import time

    uri = f"sqlite:///{tmp_path}/catalog.db"
    main, mirror = CatalogConfig(uri=uri, namespace="ctp"), CatalogConfig(uri=uri, namespace="mirror")
    create_topic(store, "t", 3)
    load(store, rounds=1, tag="p0-")
    do_publish(store, main, tmp_path)
    do_publish(store, mirror, tmp_path)
    time.sleep(3.5)
    load(store, rounds=1, tag="p1-")
    do_publish(store, main, tmp_path)
    do_publish(store, mirror, tmp_path)
    sweep = CatalogTables(store, main, home=str(tmp_path), keep=10, max_age_s=1e9).maintain(store_now(store), 2.5)
    assert not sweep.errors, sweep.errors
    store.delete_many([o.key for o in sweep.unreachable])
    assert_exact(store, main, tmp_path)
    load(store, rounds=1, tag="p2-")
    try:
        outcome = do_publish(store, mirror, tmp_path).as_dict()
    except Exception as e:
        outcome = f"{type(e).__name__}: {e}"
    mirror_table = open_catalog(store, mirror, home=str(tmp_path)).load_table(("mirror", "t"))
    try:
        got = sortable(read_pyiceberg(mirror_table, store))
    except OSError as e:
        raise AssertionError(f"mirror.t unreadable after the next publish ({outcome}): {e}") from None
    assert got.equals(committed(store)), outcome


# --- stale head vs the GC's expiry and sweep ------------------------------------------


def test_a_publisher_with_a_stale_head_survives_expiry_and_sweep_of_that_snapshot(store, config, tmp_path):
    """Attack: publisher A reads head S2 (and its vector), then reads the states; before
    its commit, B publishes S3 and the GC (hours later: S2's manifest list and vector are
    old, beyond any grace) expires S2 and sweeps what S3 does not reach. A has lost a
    race: the design says it starts again from the new head. It must not fail, and the
    table must hold each committed record once."""
    create_topic(store, "t", 3)
    for r in range(2):
        load(store, rounds=1, tag=f"s{r}-")
        do_publish(store, config, tmp_path)
    load(store, rounds=1, tag="s2-")
    fired = []

    def states(t):
        got = read_states(store, [t])
        if not fired:
            fired.append(1)
            assert do_publish(store, config, tmp_path).files_added == 3  # B: S3
            m = CatalogTables(store, config, home=str(tmp_path), keep=1, max_age_s=0)
            sweep = m.maintain(store_now(store) + 7200, 3600)
            assert not sweep.errors and sweep.expired == 2, sweep
            store.delete_many([o.key for o in sweep.unreachable])
        return got

    catalog = open_catalog(store, config, home=str(tmp_path))
    error = None
    try:
        publish(store, catalog, get_topic(store, "t"), config, read_states=states)
    except Exception as e:
        error = e
    assert fired
    assert_exact(store, config, tmp_path, readers=tuple(sorted(READERS)))
    assert do_publish(store, config, tmp_path).files_added == 0  # a rerun is fine either way
    assert error is None, f"a publish that lost a race to B + the GC failed: {type(error).__name__}: {error}"


# --- unknown commit outcomes -----------------------------------------------------------


def _lossy(catalog, *, after: bool, before_raise=None):
    """Make ``catalog.commit_table`` lose its answer once: after the commit landed
    (``after``), or without committing; ``before_raise`` runs just before the raise."""
    real = catalog.commit_table
    done = []

    def commit_table(table, requirements, updates):
        if done:
            return real(table, requirements, updates)
        done.append(1)
        if after:
            real(table, requirements, updates)
        if before_raise is not None:
            before_raise()
        raise ConnectionError("catalog connection reset: response lost")

    catalog.commit_table = commit_table
    return done


@pytest.mark.parametrize("landed", [True, False])
def test_a_commit_whose_answer_is_lost_lands_once(store, catalogs, tmp_path, landed):
    """Attack: the catalog's answer to the commit is lost, after (landed) or before the
    commit. Either way: each file once, none missing, and the publish reports it."""
    cfg = catalogs
    create_topic(store, "t", 3)
    load(store, rounds=2)
    catalog = open_catalog(store, cfg, home=str(tmp_path))
    lost = _lossy(catalog, after=landed)
    out = publish(store, catalog, get_topic(store, "t"), cfg, read_states=lambda t: read_states(store, [t]))
    assert lost
    assert out.files_added == 6, out.as_dict()
    assert_exact(store, cfg, tmp_path, readers=tuple(sorted(READERS)))
    assert do_publish(store, cfg, tmp_path).files_added == 0


def test_a_lost_answer_with_another_publish_landing_before_the_lookup(store, catalogs, tmp_path):
    """Attack: A's commit lands, its answer is lost, and before A looks at the head a
    reconcile commits more and B publishes on top of A. A's lookup sees B's vector, not
    its own: it must start again from B's head and append nothing twice."""
    cfg = catalogs
    create_topic(store, "t", 3)
    load(store, rounds=1)

    def b_publishes():
        load(store, rounds=1, tag="b-")
        assert do_publish(store, cfg, tmp_path).files_added == 3

    catalog = open_catalog(store, cfg, home=str(tmp_path))
    lost = _lossy(catalog, after=True, before_raise=b_publishes)
    publish(store, catalog, get_topic(store, "t"), cfg, read_states=lambda t: read_states(store, [t]))
    assert lost
    assert_exact(store, cfg, tmp_path, readers=tuple(sorted(READERS)))
    table = table_of(store, cfg, tmp_path)
    assert len(data_files(table)) == 6
    assert do_publish(store, cfg, tmp_path).files_added == 0


def test_a_reconcile_committing_between_the_state_read_and_the_commit(store, catalogs, tmp_path):
    """Attack: a reconcile commits new L1 files after the publish read the states and
    before its commit. The publish appends what it read; the next publish appends the
    rest; nothing twice, nothing missing."""
    cfg = catalogs
    create_topic(store, "t", 3)
    load(store, rounds=1)
    fired = []

    def states(t):
        got = read_states(store, [t])
        if not fired:
            fired.append(1)
            load(store, rounds=1, tag="late-")
        return got

    catalog = open_catalog(store, cfg, home=str(tmp_path))
    out = publish(store, catalog, get_topic(store, "t"), cfg, read_states=states)
    assert out.files_added == 3
    assert do_publish(store, cfg, tmp_path).files_added == 3
    assert_exact(store, cfg, tmp_path)
