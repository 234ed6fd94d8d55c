"""Reading a topic's Iceberg table with Spark, which has no Iceberg jars here: through
the file list of the table's head (``ctp table files``, or
:func:`ctp_state.table.files.data_files`). Each Spark task opens the store itself from
its URL and its environment, as the reconciler's tasks do, so it needs no S3 connector
on the cluster either."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any


def read_files(spark: Any, store_url: str, paths: Sequence[str]) -> Any:
    """A DataFrame of the L1 files at ``paths`` (URIs under ``store_url``), one Spark
    task per file, in the L1 schema."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from ctp_state.l1 import SCHEMA

    prefix = store_url.rstrip("/") + "/"
    keys = []
    for p in paths:
        if not p.startswith(prefix):
            raise ValueError(f"{p!r} is not in the store {store_url}")
        keys.append(p[len(prefix) :])
    schema = from_arrow_schema(SCHEMA)
    if not keys:
        return spark.createDataFrame([], schema)
    df = spark.createDataFrame([(k,) for k in keys], "key string").repartition(len(keys))
    return df.mapInArrow(_reader(store_url), schema)


def _reader(url: str) -> Any:
    def read(batches: Iterator[Any]) -> Iterator[Any]:
        from ctp_state.l1 import read_l1
        from ctp_state.storage import open_store

        store = open_store(url, os.environ, create=False)
        for batch in batches:
            for key in batch.column("key").to_pylist():
                yield from read_l1(store, key).replace_schema_metadata(None).to_batches()

    return read
