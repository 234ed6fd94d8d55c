"""The ``ctp`` command line, at the edge of the library.

- :mod:`.framework` -- the click group, ``--store``/``--json``, one-line errors, output;
- :mod:`.cmd_topic` -- ``ctp topic`` and ``ctp epoch``;
- :mod:`.cmd_produce` -- ``ctp produce``;
- :mod:`.cmd_data` -- ``ctp status``, ``reconcile``, ``read`` and ``demo``;
- :mod:`.cmd_gc` -- ``ctp gc``, ``validate`` and ``verify``;
- :mod:`.cmd_table` -- ``ctp table``: a topic's Iceberg table;
- :mod:`.cmd_l1` -- ``ctp compact``: the L1 files' lifecycle;
- :mod:`.spark` -- starting a local SparkSession for ``ctp reconcile`` and ``ctp demo``;
- :mod:`.demo` -- the end-to-end flow ``ctp demo`` runs (and its synthetic data).

The ``cmd_*`` modules only parse, call the library and print.
"""

# Each cmd_ module registers its commands on ``main`` when imported.
from ctp_state.cli import (
    cmd_data as _cmd_data,  # noqa: F401
    cmd_gc as _cmd_gc,  # noqa: F401
    cmd_l1 as _cmd_l1,  # noqa: F401
    cmd_produce as _cmd_produce,  # noqa: F401
    cmd_table as _cmd_table,  # noqa: F401
    cmd_topic as _cmd_topic,  # noqa: F401
)
from ctp_state.cli.framework import main


def run() -> None:
    """The ``ctp`` command: :data:`main`, leaving the process with its status
    (:mod:`ctp_state.process_exit`: no native teardown can turn a finished command's
    status into an abort)."""
    from ctp_state.process_exit import run as run_and_leave

    run_and_leave(main)


__all__ = ["main", "run"]
