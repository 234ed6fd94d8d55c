"""One settings object per job: the CLI, the Spark app and (tests/dags) the DAG Params
are generated from it; these tests fail if an edge drifts from the defaults."""

from __future__ import annotations

from dataclasses import fields

import pytest
from hypothesis import given, settings, strategies as st

from ctp_state.cli import main
from ctp_state.errors import ConfigError
from ctp_state.settings import GcSettings, MiB, ReconcileSettings, from_options, options, to_args
from spark_apps.reconcile import config_from_args, parse_args


@pytest.mark.parametrize(
    ("command", "cls"), [("reconcile", ReconcileSettings), ("gc", GcSettings), ("validate", GcSettings)]
)
def test_every_cli_option_default_is_the_settings_default(command, cls):
    known = {o.name: o for o in options(cls)}
    params = {p.name: p for p in main.commands[command].params if p.name in known}
    assert params, f"ctp {command} offers no settings option"
    for name, p in params.items():
        assert p.default == known[name].default, (command, name)
        assert p.opts == [known[name].flag]


def test_the_cli_offers_every_gc_knob():
    offered = {p.name for c in ("gc", "validate") for p in main.commands[c].params}
    assert {o.name for o in options(GcSettings)} <= offered


def test_the_spark_apps_defaults_are_the_settings_defaults():
    ns = parse_args(["--store", "file:///x"])
    for o in options(ReconcileSettings):
        assert getattr(ns, o.name) == o.default, o.name
    assert config_from_args(ns) == ReconcileSettings()


def test_the_defaults_are_the_documented_ones():
    """The numbers the README and the DAG docs quote."""
    r, g = ReconcileSettings(), GcSettings()
    assert (r.target_file_bytes, r.idle_lag, r.lease_ms, r.claim_wait_s) == (128 * MiB, 6, 900_000, 0.0)
    assert (g.dry_run, g.grace_s, g.l1_grace_s, g.max_deletes, g.in_flight) == (False, 0.0, 3600.0, None, 4)
    assert (g.l1_full_sweep_s, g.tmp_grace_s) == (86400.0, 3600.0)


@settings(max_examples=60, deadline=None)
@given(
    st.builds(
        ReconcileSettings,
        target_file_bytes=st.integers(1, 4096).map(lambda n: n * MiB // 4),
        max_bytes_per_partition=st.none() | st.integers(1, 64).map(lambda n: n * MiB),
        idle_lag=st.integers(1, 50),
        tick_together=st.booleans(),
        lease_ms=st.integers(1, 10_000).map(lambda n: n * 1000),
        claim_wait_s=st.floats(0, 1e4, allow_nan=False),
        compression=st.sampled_from(["zstd", "snappy"]),
    )
)
def test_settings_survive_the_trip_through_spark_submit_arguments(s):
    """What the reconcile DAG passes to spark-submit is what the app runs with."""
    ns = parse_args(["--store", "file:///x", *to_args(s)])
    assert config_from_args(ns) == s


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"idle_lag": 0}, "--idle-lag must be a number >= 1, got 0"),
        ({"target_file_mb": 0}, "--target-file-mb must be a number > 0, got 0"),
        ({"lease_seconds": float("nan")}, "--lease-seconds must be a number > 0, got nan"),
        ({"compression": "lz77"}, "--compression must be one of zstd, snappy, gzip, none, got 'lz77'"),
        ({"idle_lag": "two"}, "--idle-lag must be an integer, got 'two'"),
    ],
)
def test_a_bad_value_names_the_option(values, message):
    with pytest.raises(ConfigError) as e:
        from_options(ReconcileSettings, values)
    assert str(e.value) == message


def test_settings_built_in_code_are_checked_too():
    with pytest.raises(ConfigError, match="--grace-seconds must be a number >= 0, got -1"):
        GcSettings(grace_s=-1)
    with pytest.raises(ConfigError, match="--in-flight"):
        GcSettings(in_flight=0)


def test_every_field_is_either_a_knob_or_internal():
    for cls in (ReconcileSettings, GcSettings):
        knobs = {o.field for o in options(cls)}
        internal = {f.name for f in fields(cls)} - knobs
        assert internal <= {"threads", "list_threads", "read_threads", "history_tail", "sweep_topics"}


def test_nothing_below_the_entry_points_reads_the_environment():
    """Configuration is built once at the edge (CLI, Spark main, DAG tasks) and passed in."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    readers = []
    for path in [*root.joinpath("ctp_state").rglob("*.py"), *root.joinpath("expectations").rglob("*.py")]:
        if "cli" in path.relative_to(root).parts:
            continue  # the command line is an entry point
        if path.relative_to(root).as_posix() == "ctp_state/local_s3.py":
            continue  # a tool run as its own entry point: it hands its child server an environment
        if path.relative_to(root).as_posix() == "ctp_state/spark/tasks.py":
            continue  # a Spark task is its own entry point: it opens the store from its worker's environment
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in ("environ", "getenv", "putenv")
                and isinstance(node.value, ast.Name)
                and node.value.id == "os"
            ):
                readers.append(f"{path.relative_to(root)}:{node.lineno}")
    assert readers == []
