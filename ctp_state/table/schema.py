"""The Iceberg schema of a topic's table: L1 format 2's columns, with field ids, and the
``identity(partition)`` spec. The files carry no field ids; the table's name mapping
(written at creation) maps their columns by name."""

from __future__ import annotations

from typing import Any


def iceberg_schema() -> Any:
    from pyiceberg.schema import Schema
    from pyiceberg.types import (
        BinaryType,
        IntegerType,
        ListType,
        LongType,
        NestedField,
        StringType,
        StructType,
        TimestamptzType,
    )

    return Schema(
        NestedField(1, "offset", LongType(), required=True),
        NestedField(2, "timestamp", TimestamptzType(), required=False),
        NestedField(3, "key", BinaryType(), required=False),
        NestedField(4, "value", BinaryType(), required=False),
        NestedField(
            5,
            "headers",
            ListType(
                7,
                StructType(
                    NestedField(8, "key", StringType(), required=False),
                    NestedField(9, "value", BinaryType(), required=False),
                ),
                element_required=False,
            ),
            required=False,
        ),
        NestedField(6, "partition", IntegerType(), required=True),
    )


def partition_spec() -> Any:
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    return PartitionSpec(PartitionField(source_id=6, field_id=1000, transform=IdentityTransform(), name="partition"))
