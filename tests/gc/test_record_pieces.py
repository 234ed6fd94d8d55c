"""The GC run's record is built from typed pieces; they must stay in step with the record."""

from __future__ import annotations

import msgspec

from ctp_state.gc.delete import GcCounters
from ctp_state.gc.outcome import Outcome, RunFacts, counts
from ctp_state.records import GcRecord


def test_every_piece_of_a_run_is_a_field_of_its_record():
    record = {f.name for f in msgspec.structs.fields(GcRecord)}
    assert set(RunFacts.__annotations__) <= record
    assert set(Outcome.__annotations__) <= record
    assert not set(RunFacts.__annotations__) & set(Outcome.__annotations__)


def test_the_counters_a_run_records_are_the_ones_its_outcome_declares():
    """``counts`` names the L0 counters from GcCounters' own fields: a counter added
    there must be declared in Outcome (and so be a GcRecord field), or this fails."""
    counted = counts(GcCounters())
    assert set(counted) <= set(Outcome.__annotations__)
    assert {"listed", "deleted", "delete_errors", "lowest_delete_limit", "failed_keys"} <= set(counted)
