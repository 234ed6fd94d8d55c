"""Fixtures for the table tests: the session's SparkSession (for reading a table
through its file list)."""

from tests.spark.conftest import spark

__all__ = ["spark"]
