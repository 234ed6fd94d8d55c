"""Garbage collection: M, the gate's tables, deletes, L1 orphans and the history.

- :mod:`.safe_epoch` -- the safe epoch M = min(C - 1, min M(p)) and who holds it back (R4, R7);
- :mod:`.inputs` -- C, then every partition's state from its log, as the GC sees it;
- :mod:`.tables` -- the Arrow tables the Great Expectations gate checks;
- :mod:`.delete` -- listing L0 up to M per spread prefix and deleting it, paced (AIMD);
- :mod:`.l1_sweep` -- new committed L1 files checked, L1 orphans collected;
- :mod:`.history` -- the append-only GC history and each run's partition view;
- :mod:`.table_hook` -- what the GC asks of the topics' Iceberg tables (it knows no catalog);
- :mod:`.prepare` -- a run up to and including the gate: inputs, M, the gate's tables, the check;
- :mod:`.run` -- one run: prepare, then deletes and the history record.
"""

from ctp_state.gc.delete import GcCounters, backoff_delay, delete_objects, plan_l0_deletes, scan_prefix, spread_of
from ctp_state.gc.history import PASSED, GcHistory, high_water
from ctp_state.gc.inputs import PartitionView, gather
from ctp_state.gc.prepare import Gate, GateResult, prepare, run_gate
from ctp_state.gc.run import run_gc
from ctp_state.gc.safe_epoch import Holdback, MDecision, compute_m
from ctp_state.gc.tables import HISTORY_SCHEMA, STATE_SCHEMA, history_table, state_table
from ctp_state.settings import GcSettings

__all__ = [
    "HISTORY_SCHEMA",
    "PASSED",
    "STATE_SCHEMA",
    "Gate",
    "GateResult",
    "GcCounters",
    "GcHistory",
    "GcSettings",
    "Holdback",
    "MDecision",
    "PartitionView",
    "backoff_delay",
    "compute_m",
    "delete_objects",
    "gather",
    "high_water",
    "history_table",
    "plan_l0_deletes",
    "prepare",
    "run_gate",
    "run_gc",
    "scan_prefix",
    "spread_of",
    "state_table",
]
