"""The ``ctp`` command line, at the edge of the library.

- :mod:`.commands` -- the click commands: parse, call the library, print;
- :mod:`.table` -- ``ctp table``: a topic's Iceberg table;
- :mod:`.spark` -- starting a local SparkSession for ``ctp reconcile`` and ``ctp demo``;
- :mod:`.demo` -- the end-to-end flow ``ctp demo`` runs (and its synthetic data).
"""

from ctp_state.cli import table as _table  # noqa: F401 -- registers ``ctp table``
from ctp_state.cli.commands import main

__all__ = ["main"]
