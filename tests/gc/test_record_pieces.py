"""The GC run's record is built from typed pieces; they must stay in step with the record."""

from __future__ import annotations

import msgspec

from ctp_state.gc.delete import GcCounters
from ctp_state.gc.run import _counts, _Outcome, _RunFacts
from ctp_state.records import GcRecord


def test_every_piece_of_a_run_is_a_field_of_its_record():
    record = {f.name for f in msgspec.structs.fields(GcRecord)}
    assert set(_RunFacts.__annotations__) <= record
    assert set(_Outcome.__annotations__) <= record
    assert not set(_RunFacts.__annotations__) & set(_Outcome.__annotations__)


def test_the_counters_a_run_records_are_the_ones_its_outcome_declares():
    """``_counts`` names the L0 counters from GcCounters' own fields: a counter added
    there must be declared in _Outcome (and so be a GcRecord field), or this fails."""
    counted = _counts(GcCounters())
    assert set(counted) <= set(_Outcome.__annotations__)
    assert {"listed", "deleted", "delete_errors", "lowest_delete_limit", "failed_keys"} <= set(counted)
