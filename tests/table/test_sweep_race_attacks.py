"""Attacks (round-four review of the fixes; each HELD) on the GC's table sweep ("older than the head") and the publish
repair paths."""

from __future__ import annotations

import time

from ctp_state import crashpoints
from ctp_state.gc import run_gc
from ctp_state.settings import GcSettings
from ctp_state.table.files import data_files, table_head
from ctp_state.table.maintenance import CatalogTables
from ctp_state.topics import create_topic, get_topic
from tests.support.table import READERS, committed, do_publish, load, sortable, table_of

NO_GRACE = GcSettings(l1_grace_s=0, grace_s=0, topic_removal_grace_s=0)


def expiring_gc(store, gate, config, tmp_path):
    """A GC that expires every snapshot but the head and sweeps with no grace."""
    tables = CatalogTables(store, config, home=str(tmp_path), keep=1, max_age_s=0)
    return run_gc(store, gate=gate, config=NO_GRACE, tables=tables)


def test_a_paused_publish_overtaken_by_another_publish_and_an_expiring_gc(store, config, gate, tmp_path):
    """ATTACK: publish P loads head S1, writes its vector and manifests, and pauses
    before its commit. Meanwhile (2 s later, past the 1 s slack) more records are
    reconciled, publish Q commits S2 over S1, and a GC with no grace that expires every
    snapshot but the head sweeps: S1's files and P's files are now older than the
    head's. P resumes: its commit must fail and retry from S2 -- never land naming swept
    files -- and the table must hold each committed file once, readable by every
    reader; the next GC and publish must pass. HELD."""
    create_topic(store, "t", 3)
    load(store, rounds=1, tag="a-")
    do_publish(store, config, tmp_path)
    load(store, rounds=1, tag="b-")
    events = []

    def at(p: str, index: int) -> None:
        if p == "publish_before_commit" and not events:
            events.append("paused")
            time.sleep(2.2)
            load(store, rounds=1, tag="c-")
            events.append(do_publish(store, config, tmp_path))  # Q: hits this point again, ignored
            events.append(expiring_gc(store, gate, config, tmp_path))

    crashpoints.install(at)
    try:
        done = do_publish(store, config, tmp_path)
    finally:
        crashpoints.install(None)
    assert len(events) == 3 and events[2].status == "ok", events
    assert events[1].files_added == 6, events[1]
    assert done.files_added == 0, done  # Q published everything P would have
    table = table_of(store, config, tmp_path)
    head = table_head(store, table, get_topic(store, "t"))
    assert head.published == {0: 11, 1: 11, 2: 11}, head.published
    paths = [f.path for f in data_files(table)]
    assert len(paths) == len(set(paths)) == 9
    want = committed(store)
    for name, reader in READERS.items():
        assert sortable(reader(table, store)).equals(want), name
    assert expiring_gc(store, gate, config, tmp_path).status == "ok"
    load(store, rounds=1, tag="d-")
    assert do_publish(store, config, tmp_path).files_added == 3
    table = table_of(store, config, tmp_path)
    assert sortable(READERS[next(iter(READERS))](table, store)).equals(committed(store))
