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
``table_partitions`` per partition of each table: published <= reconciled (the table
                     holds nothing the state log does not commit), and the table's
                     published vector agrees with the files it holds

Pair expectations skip rows where either side is missing: a partition the previous run
did not know has no previous lower bound; a run that did not read L1 rows has no row
counts; a partition with nothing pending (or read from a reconcile summary, which does
not carry it) has no pending epoch.
"""

from __future__ import annotations

import great_expectations as gx
import great_expectations.expectations as gxe

MISSING = "either_value_is_missing"


def gc_history() -> gx.ExpectationSuite:
    s = gx.ExpectationSuite(name="gc_history")
    s.add_expectation(
        gxe.ExpectColumnValuesToNotBeNull(
            column="m", meta={"why": "M must be computable: every partition has its init entry"}
        )
    )
    s.add_expectation(
        gxe.ExpectColumnValuesToBeIncreasing(
            column="m", strictly=False, meta={"why": "I3: M over the GC history never decreases"}
        )
    )
    s.add_expectation(
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="m",
            column_B="m_high_water_before",
            or_equal=True,
            ignore_row_if=MISSING,
            meta={"why": "I3: M is never below the highest M a passing run recorded"},
        )
    )
    s.add_expectation(
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="cluster_epoch",
            column_B="m",
            or_equal=False,
            ignore_row_if=MISSING,
            meta={"why": "R4: M <= C - 1"},
        )
    )
    s.add_expectation(gxe.ExpectColumnValuesToBeUnique(column="seq"))
    return s


def partition_state() -> gx.ExpectationSuite:
    s = gx.ExpectationSuite(name="partition_state")
    s.add_expectation(
        gxe.ExpectColumnValuesToNotBeNull(
            column="min_epoch_lower_bound", meta={"why": "every partition has its init entry"}
        )
    )
    s.add_expectation(
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="min_epoch_lower_bound",
            column_B="previous_min_epoch_lower_bound",
            or_equal=True,
            ignore_row_if=MISSING,
            meta={"why": "I3: a partition's lower bound never decreases"},
        )
    )
    s.add_expectation(
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="max_applied_epoch",
            column_B="previous_applied_epoch",
            or_equal=True,
            ignore_row_if=MISSING,
            meta={"why": "previous_applied <= max_applied"},
        )
    )
    s.add_expectation(
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="previous_applied_epoch",
            column_B="min_epoch_lower_bound",
            or_equal=True,
            ignore_row_if=MISSING,
            meta={"why": "R3: the lower bound never passes previous_applied"},
        )
    )
    s.add_expectation(
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="min_pending_epoch",
            column_B="candidate_m",
            or_equal=False,
            ignore_row_if=MISSING,
            meta={"why": "I1: no pending placeholder may point at an L0 object at or below M"},
        )
    )
    s.add_expectation(gxe.ExpectCompoundColumnsToBeUnique(column_list=["topic", "partition"]))
    return s


def l1_files() -> gx.ExpectationSuite:
    s = gx.ExpectationSuite(name="l1_files")
    s.add_expectation(
        gxe.ExpectColumnPairValuesToBeEqual(
            column_A="first_offset",
            column_B="expected_first_offset",
            meta={"why": "I2: a partition's L1 files are contiguous (each starts after the previous)"},
        )
    )
    s.add_expectation(
        gxe.ExpectColumnPairValuesToBeEqual(
            column_A="rows",
            column_B="distinct_offsets",
            ignore_row_if=MISSING,
            meta={"why": "I2: offsets within a file are unique"},
        )
    )
    s.add_expectation(
        gxe.ExpectColumnPairValuesToBeEqual(
            column_A="rows",
            column_B="span",
            ignore_row_if=MISSING,
            meta={"why": "I2: a file holds every offset of its range"},
        )
    )
    s.add_expectation(
        gxe.ExpectColumnPairValuesToBeEqual(
            column_A="min_offset",
            column_B="first_offset",
            ignore_row_if=MISSING,
            meta={"why": "a file's offsets start where its key says"},
        )
    )
    s.add_expectation(
        gxe.ExpectColumnPairValuesToBeEqual(
            column_A="max_offset",
            column_B="last_offset",
            ignore_row_if=MISSING,
            meta={"why": "a file's offsets end where its key says"},
        )
    )
    s.add_expectation(
        gxe.ExpectColumnValuesToBeInSet(
            column="checksums_ok",
            value_set=[True],
            meta={
                "why": "I2: a new L1 file is there and reads intact (CRC32C as committed, page checksums, "
                "schema) before its L0 sources go"
            },
        )
    )
    s.add_expectation(gxe.ExpectCompoundColumnsToBeUnique(column_list=["topic", "partition", "first_offset"]))
    return s


def table_files() -> gx.ExpectationSuite:
    s = gx.ExpectationSuite(name="table_files")
    s.add_expectation(
        gxe.ExpectColumnPairValuesToBeEqual(
            column_A="first_offset",
            column_B="expected_first_offset",
            meta={
                "why": "I2: a partition's files in the table start at offset 0 and follow each other (no gap, no overlap)"
            },
        )
    )
    s.add_expectation(
        gxe.ExpectColumnPairValuesToBeEqual(
            column_A="records",
            column_B="span",
            meta={"why": "I2: a table file holds one record per offset of its range"},
        )
    )
    s.add_expectation(
        gxe.ExpectColumnPairValuesToBeEqual(
            column_A="min_offset",
            column_B="first_offset",
            ignore_row_if=MISSING,
            meta={"why": "a table file's offsets start where its name says"},
        )
    )
    s.add_expectation(
        gxe.ExpectColumnPairValuesToBeEqual(
            column_A="max_offset",
            column_B="last_offset",
            ignore_row_if=MISSING,
            meta={"why": "a table file's offsets end where its name says"},
        )
    )
    s.add_expectation(gxe.ExpectColumnValuesToBeUnique(column="path", meta={"why": "I2: a file is in a table once"}))
    return s


def table_partitions() -> gx.ExpectationSuite:
    s = gx.ExpectationSuite(name="table_partitions")
    s.add_expectation(
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="reconciled_through",
            column_B="published_through",
            or_equal=True,
            ignore_row_if=MISSING,
            # (no state beside it: the topic was deleted, or re-created, after its table was read)
            meta={"why": "published <= reconciled: the table holds nothing its state log does not commit"},
        )
    )
    s.add_expectation(
        gxe.ExpectColumnPairValuesToBeEqual(
            column_A="published_through",
            column_B="files_through",
            meta={"why": "the table's published vector names exactly the offsets its files hold"},
        )
    )
    s.add_expectation(gxe.ExpectCompoundColumnsToBeUnique(column_list=["topic", "partition"]))
    return s


#: table name -> suite builder; the GC passes tables under these names.
SUITES = {
    "gc_history": gc_history,
    "partition_state": partition_state,
    "l1_files": l1_files,
    "table_files": table_files,
    "table_partitions": table_partitions,
}
