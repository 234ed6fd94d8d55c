"""pyiceberg's SQL catalog, committing against the metadata a table was loaded with.

pyiceberg's ``SqlCatalog.commit_table`` first loads the table again (a query, a read of
its metadata file, a parse) to check the commit's requirements against the head, then
writes the new metadata and moves the catalog row with an UPDATE conditional on the
row still naming the head it loaded. The condition alone is what makes the commit
atomic: whatever the reload saw, the UPDATE lands only if the row is unchanged.

A publish commits a table it has just loaded (or that its previous commit returned),
so this catalog checks the requirements against that table's own metadata and makes
the UPDATE conditional on that table's metadata location: if the row moved on since,
the UPDATE changes nothing and the commit fails (``CommitFailedException``), as it
would have after the reload. What is saved is the reload: a query, a read and a parse
on every commit. It is also stricter: pyiceberg re-applies a change that requires
nothing of the head (a property, a snapshot expiry) to whatever head it reloads, where
this catalog lands a change only on the metadata it was made from (ctp's appends
require their head anyway; an expiry that loses a race expires nothing, and the next
GC run tries again). A commit that fails this way leaves its new metadata file behind
(pyiceberg's leaves one too when the race falls between its reload and its UPDATE);
the GC's table sweep deletes such files once they are old.

Only tables loaded from the catalog take this path, on databases that report the rows
an UPDATE changed (SQLite, PostgreSQL); anything else is pyiceberg's own path.
"""

from __future__ import annotations

import functools
from typing import Any

from ctp_state import crashpoints


@functools.cache
def sql_catalog_class() -> type:
    """The class, built on first use (pyiceberg is imported only by what needs it), as
    :func:`ctp_state.table.register.transaction`'s class is."""
    from pyiceberg.catalog import Catalog
    from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.table import CommitTableResponse, StagedTable, Table
    from sqlalchemy import update
    from sqlalchemy.orm import Session

    class CtpSqlCatalog(SqlCatalog):
        def commit_table(self, table: Any, requirements: tuple[Any, ...], updates: tuple[Any, ...]) -> Any:
            loaded = isinstance(table, Table) and not isinstance(table, StagedTable) and table.metadata_location
            if not loaded or not self.engine.dialect.supports_sane_rowcount:
                return super().commit_table(table, requirements, updates)
            # The base, read as a pair: a Table shared by threads is moved on by each commit
            # through it (pyiceberg sets its metadata, then its location), and a torn read
            # would pair this commit's metadata with another's location: the UPDATE would
            # then land on a head the commit was not made from. Read until both hold still.
            while True:
                base_metadata, base_location = table.metadata, table.metadata_location
                if table.metadata is base_metadata and table.metadata_location == base_location:
                    break
            base = Table(table.name(), base_metadata, base_location, table.io, self)
            ident = table.name()
            namespace = Catalog.namespace_to_string(Catalog.namespace_from(ident))
            name = Catalog.table_name_from(ident)
            staged = self._update_and_stage_table(base, ident, requirements, updates)
            if staged.metadata == base_metadata:  # nothing to change
                return CommitTableResponse(metadata=base_metadata, metadata_location=base_location)  # type: ignore[call-arg]  # (as pyiceberg calls it: by field name)
            self._write_metadata(metadata=staged.metadata, io=staged.io, metadata_path=staged.metadata_location)
            crashpoints.reached("table_commit_before_update")
            with Session(self.engine) as session:
                result = session.execute(
                    update(IcebergTables)
                    .where(
                        IcebergTables.catalog_name == self.name,
                        IcebergTables.table_namespace == namespace,
                        IcebergTables.table_name == name,
                        IcebergTables.metadata_location == base_location,
                    )
                    .values(metadata_location=staged.metadata_location, previous_metadata_location=base_location)
                )
                if getattr(result, "rowcount", 0) < 1:  # (a CursorResult's: the rows the UPDATE changed)
                    raise CommitFailedException(f"Table has been updated by another process: {namespace}.{name}")
                session.commit()
            return CommitTableResponse(metadata=staged.metadata, metadata_location=staged.metadata_location)  # type: ignore[call-arg]

    return CtpSqlCatalog
