"""(From the round-five adversarial review: a scenario that held.) Format 1 files (copied into the table) compacted with format 2 files; publish; GC with
expiry: the table and ctp read hold each record once; every snapshot's files exist."""

from __future__ import annotations

from ctp_state import l1
from ctp_state.compact import run_compaction
from ctp_state.gc import run_gc
from ctp_state.settings import CompactSettings, GcSettings
from ctp_state.table.catalog import CatalogConfig
from ctp_state.table.maintenance import CatalogTables
from ctp_state.topics import create_topic
from tests.compact.test_table_walk_attacks import snapshot_files
from tests.support import format1_encoder
from tests.support.table import committed, do_publish, load, read_pyiceberg, sortable, table_of

SMALL = CompactSettings(max_small_files=1, target_file_bytes=1 << 20)
NOW = GcSettings(l1_grace_s=0, l1_reader_grace_s=0)


def test_format1_files_compacted_with_format2_publish_and_read_the_same_records(
    fstore, plain_gate, tmp_path, monkeypatch
):
    store = fstore
    config = CatalogConfig(uri=f"sqlite:///{tmp_path}/catalog.db", namespace="ctp")
    create_topic(store, "t", 2)
    with monkeypatch.context() as m:
        m.setattr(l1, "encode_parquet", format1_encoder(l1.encode_parquet))
        load(store, rounds=2, partitions=2)
    load(store, rounds=1, partitions=2, tag="v2-")
    out = do_publish(store, config, tmp_path)
    assert out.format1_copied == 4
    s = run_compaction(store, config=SMALL)
    assert s.count("compacted") == 2, s.as_dict()
    pub = do_publish(store, config, tmp_path)
    print(pub.as_dict())
    hook = CatalogTables(store, config, home=str(tmp_path), keep=1, max_age_s=0)
    for _ in range(2):
        assert run_gc(store, gate=plain_gate, config=NOW, tables=hook).status == "ok"
    table = table_of(store, config, tmp_path)
    assert sortable(read_pyiceberg(table, store)).equals(committed(store, 2))
    for files in snapshot_files(table, store).values():
        assert all(store.head(k) is not None for k in files)
    left = [o.key for o in store.list("tables/") if "/copies/" in o.key]
    print("format-1 copies left behind:", len(left))
