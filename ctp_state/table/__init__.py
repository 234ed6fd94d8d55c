"""A topic as an Apache Iceberg table: the committed output users query.

- :mod:`ctp_state.table.catalog` -- which catalog, where a table lives, its FileIO;
- :mod:`ctp_state.table.schema` -- the table's schema and partition spec;
- :mod:`ctp_state.table.publish` -- appending committed L1 files, exactly once;
- :mod:`ctp_state.table.files` -- reading the table back: its file list (what a Spark
  job reads) and what is published per partition.
"""
