"""The GC's expectation suites, as code.

Each suite validates one table the GC builds before it deletes anything
(``ctp_state.gc.run``):

``gc_history``       the passing runs of the GC history, oldest first, plus the
                     candidate row for this run (I3: M non-null, non-decreasing, M < C,
                     and never below the highest M any passing run recorded)
``partition_state``  every partition's state now, beside the lower bound the previous
                     GC recorded (I3 per partition; the R3 ordering of the epochs), and
                     the smallest epoch of its pending placeholders beside this run's M
                     (I1: nothing pending at or below M)
``l1_files``         every L1 file committed since the last sweep (I2: offsets unique
                     and contiguous within a file and across files of a partition)
``table_files``      every data file of each topic's Iceberg table head (I2 in the
                     table: a partition's files tile its offsets from 0, no gap, no
                     overlap, each file holds exactly the range its name gives)
``l1_dropped``       every L1 file a trim dropped that the run looked at, beside what
                     allows it now (R11: DeleteRecords past it, retention.bytes kept
                     in the files after it, or its newest record older than
                     retention.ms); the run deletes only files something allows
``table_partitions`` per partition of each table: published <= reconciled (the table
                     holds nothing the state log does not commit), and the table's
                     published vector agrees with the files it holds

Pair expectations skip rows where either side is missing: a partition the previous run
did not know has no previous lower bound; a run that did not read L1 rows has no row
counts; a partition with nothing pending (or read from a reconcile summary, which does
not carry it) has no pending epoch.
"""

from __future__ import annotations

from typing import Any

from expectations.gx_import import gx, gxe

MISSING = "either_value_is_missing"


def _suite(name: str, *expectations: Any) -> gx.ExpectationSuite:
    s = gx.ExpectationSuite(name=name)
    for e in expectations:
        s.add_expectation(e)
    return s


def _equal(a: str, b: str, why: str, *, skip_missing: bool = False) -> Any:
    """Column ``a`` equals column ``b`` on every row (with ``skip_missing``: on every row
    where both are there)."""
    extra = {"ignore_row_if": MISSING} if skip_missing else {}
    return gxe.ExpectColumnPairValuesToBeEqual(column_A=a, column_B=b, meta={"why": why}, **extra)


def _above(a: str, b: str, why: str, *, or_equal: bool) -> Any:
    """Column ``a`` is greater than (``or_equal``: at least) column ``b`` wherever both
    are there."""
    return gxe.ExpectColumnPairValuesAToBeGreaterThanB(
        column_A=a, column_B=b, or_equal=or_equal, ignore_row_if=MISSING, meta={"why": why}
    )


def _not_null(column: str, why: str) -> Any:
    return gxe.ExpectColumnValuesToNotBeNull(column=column, meta={"why": why})


def gc_history() -> gx.ExpectationSuite:
    return _suite(
        "gc_history",
        _not_null("m", "M must be computable: every partition has its init entry"),
        gxe.ExpectColumnValuesToBeIncreasing(
            column="m", strictly=False, meta={"why": "I3: M over the GC history never decreases"}
        ),
        _above("m", "m_high_water_before", "I3: M is never below the highest M a passing run recorded", or_equal=True),
        _above("cluster_epoch", "m", "R4: M <= C - 1", or_equal=False),
        gxe.ExpectColumnValuesToBeUnique(column="seq"),
    )


def partition_state() -> gx.ExpectationSuite:
    return _suite(
        "partition_state",
        _not_null("min_epoch_lower_bound", "every partition has its init entry"),
        _above(
            "min_epoch_lower_bound",
            "previous_min_epoch_lower_bound",
            "I3: a partition's lower bound never decreases",
            or_equal=True,
        ),
        _above("max_applied_epoch", "previous_applied_epoch", "previous_applied <= max_applied", or_equal=True),
        _above(
            "previous_applied_epoch",
            "min_epoch_lower_bound",
            "R3: the lower bound never passes previous_applied",
            or_equal=True,
        ),
        _above(
            "min_pending_epoch",
            "candidate_m",
            "I1: no pending placeholder may point at an L0 object at or below M",
            or_equal=False,
        ),
        _above("start_offset", "previous_start_offset", "R11: a partition's start offset only grows", or_equal=True),
        gxe.ExpectCompoundColumnsToBeUnique(column_list=["topic", "partition"]),
    )


def l1_files() -> gx.ExpectationSuite:
    return _suite(
        "l1_files",
        _equal(
            "first_offset",
            "expected_first_offset",
            "I2: a partition's L1 files are contiguous (each starts after the previous)",
        ),
        _equal("rows", "distinct_offsets", "I2: offsets within a file are unique", skip_missing=True),
        _equal("rows", "span", "I2: a file holds every offset of its range", skip_missing=True),
        _equal("min_offset", "first_offset", "a file's offsets start where its key says", skip_missing=True),
        _equal("max_offset", "last_offset", "a file's offsets end where its key says", skip_missing=True),
        gxe.ExpectColumnValuesToBeInSet(
            column="checksums_ok",
            value_set=[True],
            meta={
                "why": "I2: a new L1 file is there and reads intact (CRC32C as committed, page checksums, "
                "schema) before its L0 sources go"
            },
        ),
        gxe.ExpectCompoundColumnsToBeUnique(column_list=["topic", "partition", "first_offset"]),
    )


def table_files() -> gx.ExpectationSuite:
    return _suite(
        "table_files",
        _equal(
            "first_offset",
            "expected_first_offset",
            "I2: a partition's files in the table start at offset 0 and follow each other (no gap, no overlap)",
        ),
        _equal("records", "span", "I2: a table file holds one record per offset of its range"),
        _equal("min_offset", "first_offset", "a table file's offsets start where its name says", skip_missing=True),
        _equal("max_offset", "last_offset", "a table file's offsets end where its name says", skip_missing=True),
        gxe.ExpectColumnValuesToBeUnique(column="path", meta={"why": "I2: a file is in a table once"}),
        # (null: the table's incarnation was deleted or re-created after the table was read)
        gxe.ExpectColumnValuesToBeInSet(
            column="committed",
            value_set=[True],
            meta={
                "why": "a table file is a committed L1 file of the live incarnation (its path, not only its name): "
                "no partition, file or copy the state log does not commit"
            },
        ),
    )


def table_partitions() -> gx.ExpectationSuite:
    return _suite(
        "table_partitions",
        # (no state beside a row: the topic was deleted, or re-created, after its table was read)
        _above(
            "reconciled_through",
            "published_through",
            "published <= reconciled: the table holds nothing its state log does not commit",
            or_equal=True,
        ),
        _equal(
            "published_through",
            "files_through",
            "the table's published vector names exactly the offsets its files hold",
        ),
        gxe.ExpectCompoundColumnsToBeUnique(column_list=["topic", "partition"]),
    )


def l1_dropped() -> gx.ExpectationSuite:
    return _suite(
        "l1_dropped",
        _above(
            "authorized",
            "deleting",
            "R11: an L1 file a trim dropped goes only if DeleteRecords passed it, retention.bytes kept its "
            "bound in the files after it, or its newest record is older than retention.ms",
            or_equal=True,
        ),
        gxe.ExpectColumnValuesToBeUnique(column="key"),
    )


#: table name -> suite builder; the GC passes tables under these names.
SUITES = {
    "gc_history": gc_history,
    "partition_state": partition_state,
    "l1_files": l1_files,
    "table_files": table_files,
    "table_partitions": table_partitions,
    "l1_dropped": l1_dropped,
}
