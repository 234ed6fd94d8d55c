"""One settings object per job, holding each default once.

:class:`ReconcileSettings` and :class:`GcSettings` are frozen dataclasses; each field
an operator may set carries a :class:`Knob` (its option name, unit, help). The edges
are generated from them, never written out again:

- the CLI's click options (``ctp reconcile``, ``ctp gc``, ``ctp validate``);
- the Spark app's argparse options (``spark_apps/reconcile.py``), and the arguments the
  reconcile DAG passes to spark-submit (:func:`to_args`);
- the DAG Params of the trigger form (``dags/ctp_common.py``).

An option's value is in the option's unit (``--target-file-mb 64``); :func:`from_options`
converts to the field's unit (bytes) and validates, raising :class:`ConfigError` that
names the option. ``tests/settings/test_settings.py`` fails if any edge drifts from here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, TypeVar

from ctp_state.errors import ConfigError

MiB = 1024 * 1024
COMPRESSIONS = ("zstd", "snappy", "gzip", "none")


@dataclass(frozen=True)
class Knob:
    """How a settings field is set from outside."""

    option: str  # "target-file-mb": --target-file-mb, argparse dest / DAG Param target_file_mb
    help: str
    unit: float = 1  # field value = option value x unit
    kind: type = float  # the option's type: int, float, str or bool
    minimum: float | None = None  # inclusive, in the option's unit
    above: float | None = None  # exclusive lower limit, in the option's unit
    choices: tuple[str, ...] | None = None


def knob(default: Any, option: str, help: str, **kw: Any) -> Any:
    return field(default=default, metadata={"knob": Knob(option, help, **kw)})


@dataclass(frozen=True)
class Option:
    """A knob as the edges see it: flag, name and default in the option's unit."""

    field: str
    flag: str  # --target-file-mb
    name: str  # target_file_mb
    default: Any
    knob: Knob
    integral: bool  # the field holds an int (bytes, milliseconds, a count)


S = TypeVar("S")


def options(cls: type[Any], only: Sequence[str] | None = None) -> list[Option]:
    """The options of a settings class (``only``: these field names, in that order)."""
    out = {}
    for f in fields(cls):
        k = f.metadata.get("knob")
        if k is None:
            continue
        default = (
            None if f.default is None or f.default is MISSING else f.default / k.unit if k.unit != 1 else f.default
        )
        if k.kind is int and default is not None:
            default = int(default)
        integral = str(f.type).split(" ")[0] == "int"
        out[f.name] = Option(f.name, "--" + k.option, k.option.replace("-", "_"), default, k, integral)
    if only is None:
        return list(out.values())
    missing = [n for n in only if n not in out]
    if missing:
        raise KeyError(f"{cls.__name__} has no option for {missing}")
    return [out[n] for n in only]


def from_options(cls: type[S], values: Mapping[str, Any], base: S | None = None) -> S:
    """Settings from option values keyed by option name (``target_file_mb``), in the
    options' units; names absent (or None for an option whose default is not None) keep
    ``base``'s value or the default."""
    changes: dict[str, object] = {}
    for o in options(cls):
        if o.name not in values:
            continue
        v = values[o.name]
        if v is None and o.default is not None:
            continue
        changes[o.field] = _convert(o, v)
    return replace(base, **changes) if base is not None else cls(**changes)  # type: ignore[type-var]


def _convert(o: Option, v: Any) -> Any:
    k = o.knob
    if v is None:
        return None
    try:
        if k.kind is bool:
            if not isinstance(v, bool):
                raise ValueError
            return v
        if k.kind is str:
            v = str(v)
            if k.choices and v not in k.choices:
                raise ConfigError(f"{o.flag} must be one of {', '.join(k.choices)}, got {v!r}")
            return v
        x = float(v)
        if k.kind is int and x != int(x):
            raise ValueError
    except (TypeError, ValueError):
        raise ConfigError(f"{o.flag} must be {'an integer' if k.kind is int else k.kind.__name__}, got {v!r}") from None
    if not math.isfinite(x) or (k.minimum is not None and x < k.minimum) or (k.above is not None and x <= k.above):
        bound = f">= {k.minimum:g}" if k.minimum is not None else f"> {k.above:g}"
        raise ConfigError(f"{o.flag} must be a number {bound}, got {v!r}")
    scaled = x * k.unit
    return int(scaled) if o.integral else scaled


def to_args(settings: Any, only: Sequence[str] | None = None) -> list[str]:
    """``settings`` as command-line arguments (for spark-submit), in the options' units;
    options at their default are left out."""
    args: list[str] = []
    for o in options(type(settings), only):
        v = getattr(settings, o.field)
        if v is None:
            continue
        shown = v / o.knob.unit if o.knob.unit != 1 else v
        if shown == o.default:
            continue
        if o.knob.kind is bool:
            args.append(o.flag)
        else:
            args += [o.flag, repr(shown) if isinstance(shown, float) else str(shown)]
    return args


@dataclass(frozen=True)
class ReconcileSettings:
    """One reconcile run (``ctp reconcile``, ``spark_apps/reconcile.py``, the DAG)."""

    target_file_bytes: int = knob(128 * MiB, "target-file-mb", "Target L1 file size (MiB).", unit=MiB, above=0)
    max_bytes_per_partition: int | None = knob(
        None, "max-mb-per-partition", "Cap per partition per run (MiB); empty: everything pending.", unit=MiB, above=0
    )
    idle_lag: int = knob(
        6,
        "idle-lag",
        "Advance idle partitions whose lower bound is this many epochs behind C (R6).",
        kind=int,
        minimum=1,
    )
    tick_together: bool = knob(
        False,
        "tick-together",
        "Advance every idle partition only when it trails C by idle-lag, so partitions created together all "
        "tick in one run (default: each first ticks at an epoch of its own, spreading the ticks over the runs; "
        "docs/design.md 14).",
        kind=bool,
    )
    quiet_min: int = knob(
        8,
        "quiet-min",
        "With this many partitions or more quiet in the GC's state pack, read only those an L0 object names "
        "or whose advance is due (fewer: read every partition; docs/design.md 14).",
        kind=int,
        minimum=1,
    )
    lease_ms: int = knob(15 * 60 * 1000, "lease-seconds", "Claim lease (seconds).", unit=1000, above=0)
    claim_wait_s: float = knob(
        0.0,
        "claim-wait-seconds",
        "Wait this long for claims other reconcilers hold (0: skip those partitions).",
        minimum=0,
    )
    compression: str = knob("zstd", "compression", "L1 Parquet compression.", kind=str, choices=COMPRESSIONS)
    threads: int = 16  # driver-side claim/commit concurrency

    def __post_init__(self) -> None:
        _check(self)


@dataclass(frozen=True)
class CompactSettings:
    """One compaction run (``ctp compact``)."""

    target_file_bytes: int = knob(
        128 * MiB, "target-file-mb", "Merge small L1 files into files of at most this size (MiB).", unit=MiB, above=0
    )
    max_small_files: int = knob(
        8,
        "max-small-files",
        "Compact a partition once it commits more than this many L1 files smaller than the target.",
        kind=int,
        minimum=1,
    )
    lease_ms: int = knob(15 * 60 * 1000, "lease-seconds", "Claim lease (seconds).", unit=1000, above=0)
    compression: str = knob("zstd", "compression", "L1 Parquet compression.", kind=str, choices=COMPRESSIONS)
    threads: int = 8  # partitions planned, claimed and committed at once

    def __post_init__(self) -> None:
        _check(self)


@dataclass(frozen=True)
class GcSettings:
    """One GC run (``ctp gc``/``ctp validate``, the GC DAG)."""

    dry_run: bool = knob(False, "dry-run", "Compute M and what would be deleted; delete nothing.", kind=bool)
    grace_s: float = knob(0.0, "grace-seconds", "Leave L0 objects younger than this for the next run.", minimum=0)
    l1_grace_s: float = knob(
        3600.0,
        "l1-grace-seconds",
        "Leave uncommitted L1 files younger than this (a reconciler may be writing them).",
        minimum=0,
    )
    l1_reader_grace_s: float = knob(
        3600.0,
        "l1-reader-grace-seconds",
        "Delete an L1 file a compaction or trim replaced only once the change is this old by the store's "
        "clock (a reader holding the old file list finishes first).",
        minimum=0,
    )
    max_deletes: int | None = knob(
        None, "max-deletes", "Delete at most this many L0 objects (lowest epochs first).", kind=int, minimum=0
    )
    in_flight: int = knob(4, "in-flight", "DeleteObjects batches in flight.", kind=int, minimum=1)
    full_read_every: int = knob(
        12,
        "full-read-every",
        "Read every partition's state log at least once in this many runs; the runs between start from "
        "the previous run's state pack and read only the partitions that changed (1: every run).",
        kind=int,
        minimum=1,
    )
    l1_full_sweep_s: float = knob(
        86400.0,
        "l1-full-sweep-hours",
        "List every L1 file (not only new ones) once this long after the last full sweep.",
        unit=3600,
        minimum=0,
    )
    topic_removal_grace_s: float = knob(
        3600.0,
        "topic-removal-grace-seconds",
        "Remove a deleted topic incarnation's logs, snapshots and L1 files once its tombstone is this old.",
        minimum=0,
    )
    table_keep_snapshots: int = knob(
        10,
        "table-keep-snapshots",
        "Keep at least this many snapshots of each topic's Iceberg table (the newest).",
        kind=int,
        minimum=1,
    )
    table_snapshot_max_age_s: float = knob(
        7 * 86400.0,
        "table-snapshot-max-age-hours",
        "Expire older table snapshots beyond --table-keep-snapshots once they are this old; their "
        "metadata files nothing reaches are deleted after --l1-grace-seconds.",
        unit=3600,
        minimum=0,
    )
    tmp_grace_s: float = knob(
        3600.0,
        "tmp-grace-seconds",
        "File store: delete temporary files of killed writes once older than this.",
        minimum=0,
    )
    alert_stall_runs: int = knob(
        4,
        "alert-stall-runs",
        "Alert when M is unchanged over this many passing GC runs (this one included) while C "
        "advanced by --alert-stall-epochs or more (0: never; a quarantined partition always alerts).",
        kind=int,
        minimum=0,
    )
    alert_stall_epochs: int = knob(
        3,
        "alert-stall-epochs",
        "How far C must have advanced over those runs for an unchanged M to be a stall (at least the "
        "reconciler's idle lag, which an idle partition's M(p) waits out between its ticks).",
        kind=int,
        minimum=1,
    )
    list_threads: int = 8
    read_threads: int = 32  # partitions whose state is read at once
    history_tail: int = 50
    sweep_topics: tuple[str, ...] | None = None  # collect L1 orphans only in these topics (checks: everywhere)

    def __post_init__(self) -> None:
        _check(self)
        if self.list_threads < 1 or self.read_threads < 1 or self.history_tail < 1:
            raise ConfigError("list threads, read threads and the history tail must be >= 1")


def _check(s: Any) -> None:
    """Every knob's value within its limits, whoever built the settings."""
    for o in options(type(s)):
        v = getattr(s, o.field)
        if v is None:
            continue
        _convert(o, v / o.knob.unit if o.knob.unit != 1 else v)
