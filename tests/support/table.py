"""Helpers the table tests share (tests/table): a topic with committed records, a
publish, the table and what it must hold, and the engines that read it back."""

from __future__ import annotations

import os

import pyarrow as pa

from ctp_state import l1
from ctp_state.epoch import ClusterEpoch
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.read import read_partition
from ctp_state.status import read_states
from ctp_state.storage import S3Settings
from ctp_state.table.catalog import open_catalog
from ctp_state.table.publish import publish
from ctp_state.topics import get_topic
from tests.support import plog, reconcile

COLUMNS = ["partition", "offset", "timestamp", "key", "value", "headers"]


def load(store, rounds: int = 2, partitions: int = 3, per: int = 4, tag: str = "r") -> None:
    ce = ClusterEpoch(store)
    for r in range(rounds):
        ce.advance()
        with Producer(store, epoch_ttl_s=0) as prod:
            verdicts = prod.write(
                [
                    (
                        ("t", p),
                        [
                            Record(f"{tag}{r}-{p}-{i}".encode(), b"k%d" % i, 1_700_000_000_000 + i, (("h", b"x"),))
                            for i in range(per)
                        ],
                    )
                    for p in range(partitions)
                ]
            )
        assert all(v.accepted for v in verdicts)
        reconcile(store)


def do_publish(store, config, tmp_path):
    t = get_topic(store, "t")
    catalog = open_catalog(store, config, home=str(tmp_path))
    return publish(store, catalog, t, config, read_states=lambda t: read_states(store, [t]))


def table_of(store, config, tmp_path):
    return open_catalog(store, config, home=str(tmp_path)).load_table((config.namespace, "t"))


def committed(store, partitions: int = 3) -> pa.Table:
    """What ``ctp read`` returns of committed (reconciled) data, every partition."""
    parts = []
    for p in range(partitions):
        st = plog(store, "t", p).read_state()
        rows = read_partition(store, "t", p)
        parts.append(rows.filter(pa.compute.less_equal(rows.column("offset"), st.last_reconciled_offset)))
    return sortable(pa.concat_tables(parts))


def sortable(t: pa.Table) -> pa.Table:
    t = t.select(COLUMNS)
    t = t.cast(pa.schema([(n, l1.SCHEMA.field(n).type) for n in COLUMNS]))
    return t.sort_by([("partition", "ascending"), ("offset", "ascending")])


# --- readers ---------------------------------------------------------------------------


def read_pyiceberg(table, store) -> pa.Table:
    return table.scan().to_arrow()


def read_duckdb(table, store) -> pa.Table:
    import duckdb
    from duckdb_extensions import import_extension

    con = duckdb.connect()
    on_s3 = store.url.startswith("s3://") or table.metadata_location.startswith("s3://")
    for ext in ("avro", "iceberg") + (("httpfs",) if on_s3 else ()):
        import_extension(ext, con=con)
        con.execute(f"LOAD {ext}")
    # the store's S3 settings, or (a REST catalog's warehouse beside a file store) the S3
    # server's, which the suite exports
    settings = getattr(store, "_settings", None) or (S3Settings.from_env(os.environ) if on_s3 else None)
    if settings is not None:
        endpoint = settings.endpoint_url.split("://", 1)[1]
        con.execute(
            f"CREATE SECRET (TYPE S3, KEY_ID '{settings.access_key_id}', SECRET '{settings.secret_access_key}', "
            f"ENDPOINT '{endpoint}', URL_STYLE 'path', USE_SSL false, REGION '{settings.region}')"
        )
    return con.execute(f"SELECT * FROM iceberg_scan('{table.metadata_location}')").to_arrow_table()


def read_polars(table, store) -> pa.Table:
    import polars as pl

    return pl.scan_iceberg(table).collect().to_arrow()


READERS = {"pyiceberg": read_pyiceberg, "duckdb": read_duckdb, "polars": read_polars}
