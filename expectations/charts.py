"""The report's two charts (M and C over time; deletes per run) as geometry.

Each chart is computed here as typed parts -- ticks, series of dots, bars, a legend --
in pixels, and drawn as inline SVG by the report template (``report.html.j2``'s
``svg_chart``), so the page needs no script. Pure: records in, geometry out.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ctp_state.records import GcRecord


@dataclass(frozen=True)
class Tick:
    pos: float  # pixels along its axis
    label: str


@dataclass(frozen=True)
class Dot:
    x: float
    y: float
    title: str  # the tooltip


@dataclass(frozen=True)
class Series:
    color: str
    dash: bool
    dots: list[Dot]
    points: str  # the polyline through the dots ("" for dots alone)


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    w: float
    h: float
    color: str
    title: str


@dataclass(frozen=True)
class LegendItem:
    color: str
    mark: str
    label: str


def when(ms: int | None) -> str:
    """A time in ms as UTC text (``-`` for none)."""
    if not ms:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def human_bytes(n: int | None) -> str:
    """A byte count in B, KiB, MiB, GiB or TiB."""
    x: float = n or 0
    for unit in ("B", "KiB", "MiB", "GiB"):
        if x < 1024:
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return f"{x:.1f} TiB"


def nice_ticks(lo: float, hi: float, count: int = 6, *, integer: bool = True) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten apart) covering ``[lo, hi]``."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / max(1, count - 1)
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    if integer:
        step = max(1, round(step))
    first = math.floor(lo / step) * step
    ticks: list[float] = []
    v: float = first
    while v <= hi + step * 1e-9:
        if v >= lo - step * 1e-9:
            ticks.append(v)
        v += step
    return ticks


def _time_ticks(t0: int, t1: int, count: int = 6) -> list[tuple[int, str]]:
    """Evenly spaced times over ``[t0, t1]`` (ms), labelled to the precision the span needs."""
    span = max(1, t1 - t0)
    fmt = "%H:%M:%S" if span < 3_600_000 else ("%m-%d %H:%M" if span < 7 * 86_400_000 else "%Y-%m-%d")
    n = count if span > 1 else 1
    return [
        (t, dt.datetime.fromtimestamp(t / 1000, dt.UTC).strftime(fmt))
        for t in sorted({t0 + round(i * span / max(1, n - 1)) for i in range(n)})
    ]


@dataclass(frozen=True)
class Chart:
    """An SVG chart's geometry, computed here and drawn by the template."""

    width: int
    height: int
    left: int
    right: int
    top: int
    bottom: int
    x_ticks: list[Tick]
    y_ticks: list[Tick]
    y_title: str
    series: list[Series] = field(default_factory=list)
    bars: list[Bar] = field(default_factory=list)
    legend: list[LegendItem] = field(default_factory=list)
    y2_ticks: list[Tick] = field(default_factory=list)
    y2_title: str = ""


class _Frame:
    """Maps times (ms) and values to pixels inside a chart's plot area."""

    def __init__(self, t0: int, t1: int, y0: float, y1: float, w: int, h: int, pad: tuple[int, int, int, int]):
        self.t0, self.t1 = t0, t1 if t1 > t0 else t0 + 1
        self.y0, self.y1 = y0, y1 if y1 > y0 else y0 + 1
        self.left, self.right, self.top, self.bottom = pad
        self.w, self.h = w, h

    def x(self, t: float) -> float:
        return round(self.left + (t - self.t0) / (self.t1 - self.t0) * (self.w - self.left - self.right), 1)

    def y(self, v: float, lo: float | None = None, hi: float | None = None) -> float:
        lo = self.y0 if lo is None else lo
        hi = self.y1 if hi is None else hi
        hi = hi if hi > lo else lo + 1
        return round(self.h - self.bottom - (v - lo) / (hi - lo) * (self.h - self.top - self.bottom), 1)


PAD = (60, 70, 28, 30)  # left, right, top, bottom


def _axes(f: _Frame, t0: int, t1: int, ticks: list[float]) -> tuple[list[Tick], list[Tick]]:
    """The time ticks along x and the value ticks along y of a chart in frame ``f``."""
    return (
        [Tick(f.x(t), label) for t, label in _time_ticks(t0, t1)],
        [Tick(f.y(v), f"{v:g}") for v in ticks],
    )


def m_chart(records: Sequence[GcRecord], width: int = 960, height: int = 260) -> Chart | None:
    """M and C against run start time, with labelled epoch ticks."""
    pts = [r for r in records if r.m is not None and r.started_ms]
    if not pts:
        return None
    # M as the history counts it (runs that passed the gate); a refused candidate M is
    # a red dot, and does not stretch the axis past what C allows.
    passed = [r for r in pts if r.passed]
    refused = [r for r in pts if not r.passed]
    ys = [v for r in pts for v in (r.m if r.passed else None, r.cluster_epoch) if v is not None]
    ys += [min(r.m, r.cluster_epoch or r.m) for r in refused if r.m is not None]
    ticks = nice_ticks(min(ys), max(ys))
    t0, t1 = min(r.started_ms for r in pts), max(r.started_ms for r in pts)
    f = _Frame(t0, t1, ticks[0], ticks[-1], width, height, PAD)

    def series(
        name: str,
        color: str,
        dash: bool,
        value: Callable[[GcRecord], int | None],
        runs: list[GcRecord],
        line: bool = True,
    ) -> Series:
        dots = [
            Dot(f.x(r.started_ms), f.y(v), f"run {r.seq} {when(r.started_ms)} ({r.status}): {name}={v}")
            for r in runs
            if (v := value(r)) is not None
        ]
        return Series(color, dash, dots, _polyline(dots) if line else "")

    return Chart(
        width,
        height,
        *PAD,
        *_axes(f, t0, t1, ticks),
        y_title="epoch",
        series=[
            series("C", "#868e96", True, lambda r: r.cluster_epoch, pts),
            series("M", "#1971c2", False, lambda r: r.m, passed),
            series("refused M", "#c92a2a", False, _refused_m, refused, line=False),
        ],
        legend=[
            LegendItem("#1971c2", "\u2501", "M (safe epoch)"),
            LegendItem("#868e96", "\u2504", "C (cluster epoch)"),
            LegendItem("#c92a2a", "\u25cf", "run not passed"),
        ],
    )


def delete_chart(records: Sequence[GcRecord], width: int = 960, height: int = 220) -> Chart | None:
    """L0 objects deleted per run (bars; a dry run's would-delete in grey) and bytes
    (line, right axis), on the same time axis as :func:`m_chart`."""
    pts = [r for r in records if r.started_ms]
    if not pts:
        return None

    def n(r: GcRecord) -> int:
        return r.would_delete if r.dry_run else r.deleted

    def b(r: GcRecord) -> int:
        return r.would_delete_bytes if r.dry_run else r.deleted_bytes

    ticks = nice_ticks(0, max([n(r) for r in pts] + [1]))
    bticks = nice_ticks(0, max([b(r) for r in pts] + [1]), integer=False)
    t0, t1 = min(r.started_ms for r in pts), max(r.started_ms for r in pts)
    f = _Frame(t0, t1, 0, ticks[-1], width, height, PAD)
    bar_w = max(2.0, min(18.0, (width - PAD[0] - PAD[1]) / max(1, len(pts)) * 0.6))
    bars = [
        Bar(
            round(f.x(r.started_ms) - bar_w / 2, 1),
            f.y(n(r)),
            round(bar_w, 1),
            round(f.y(0) - f.y(n(r)), 1),
            "#adb5bd" if r.dry_run else "#2b8a3e",
            f"run {r.seq}: {'would delete' if r.dry_run else 'deleted'} {n(r)} objects, {human_bytes(b(r))}",
        )
        for r in pts
    ]
    dots = [Dot(f.x(r.started_ms), f.y(b(r), bticks[0], bticks[-1]), f"run {r.seq}: {human_bytes(b(r))}") for r in pts]
    return Chart(
        width,
        height,
        *PAD,
        *_axes(f, t0, t1, ticks),
        y_title="objects",
        y2_ticks=[Tick(f.y(v, bticks[0], bticks[-1]), human_bytes(int(v))) for v in bticks],
        y2_title="bytes",
        bars=bars,
        series=[Series("#e67700", False, dots, _polyline(dots))],
        legend=[
            LegendItem("#2b8a3e", "\u2588", "objects deleted"),
            LegendItem("#adb5bd", "\u2588", "would delete (dry run)"),
            LegendItem("#e67700", "\u2501", "bytes"),
        ],
    )


def _polyline(dots: list[Dot]) -> str:
    return " ".join(f"{d.x},{d.y}" for d in dots)


def _refused_m(r: GcRecord) -> int | None:
    """Where a refused M is drawn: no higher than C, so it does not stretch the axis."""
    return None if r.m is None else min(r.m, r.cluster_epoch or r.m)
