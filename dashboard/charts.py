"""Charts as inline SVG, drawn on the server: no script, no library, nothing fetched.

    bar_chart([("planner: a -> b", 4.2), ...], fmt=lambda v: f"{v:.1f}x", reference=1.0)
    line_chart([Series("v1", [(t0, 0.3), (t1, 0.4)])], fmt=..., x_fmt=clock, threshold=0.5)

Both return ``Markup`` for a Jinja template. Every label is escaped. An empty chart says so in
words instead of drawing axes over nothing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

CHAR_W = 6.5  # about the width of one 11 px character, to size label columns
MAX_DOTS = 40  # a series with more points is drawn as a line only
PALETTE = ("#2563eb", "#d97706", "#059669", "#dc2626", "#7c3aed", "#0891b2", "#65a30d", "#db2777")
Fmt = Callable[[float], str]


@dataclass(frozen=True)
class Series:
    label: str
    points: Sequence[tuple[float, float]]  # (x, y), x ascending


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (steps of 1, 2 or 5 times a power of ten)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError("tick bounds must be finite")
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(lo / step) * step
    ticks = []
    value = first
    while value < hi + step * 0.999:
        ticks.append(round(value, 12))
        value += step
    return ticks


def clock(ts: float) -> str:
    """A unix time as local HH:MM:SS."""
    return time.strftime("%H:%M:%S", time.localtime(ts))


def _svg(width: int, height: int, title: str, body: list[str]) -> Markup:
    t = escape(title)
    head = (f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
            f'width="{width}" height="{height}" role="img" aria-label="{t}"><title>{t}</title>')  # fmt: skip
    return Markup(head + "".join(body) + "</svg>")


def _empty(title: str, message: str, width: int) -> Markup:
    body = [f'<text x="{width / 2}" y="30" text-anchor="middle" class="empty">{escape(message)}</text>']
    return _svg(width, 50, title, body)


def bar_chart(
    bars: Sequence[tuple[str, float]], *, title: str, fmt: Fmt = lambda v: f"{v:g}", reference: float | None = None,
    width: int = 760, empty: str = "no data yet",
) -> Markup:  # fmt: skip
    """Horizontal bars from zero, one row per ``(label, value)``; ``reference`` draws a dashed
    line (1.0 for a speedup: left of it is slower than native)."""
    if not bars:
        return _empty(title, empty, width)
    row, pad = 26, 70
    label_w = min(max(len(label) for label, _ in bars) * CHAR_W + 16, width // 2)
    height = row * len(bars) + 30
    top = max([v for _, v in bars] + [reference or 0.0])
    scale = (width - label_w - pad) / top if top > 0 else 0.0
    body = []
    for i, (label, value) in enumerate(bars):
        y = 10 + i * row
        w = max(value, 0.0) * scale
        color = PALETTE[i % len(PALETTE)]
        body.append(f'<text x="{label_w - 8}" y="{y + 15}" text-anchor="end" class="label">{escape(label)}</text>')
        body.append(f'<rect class="bar" x="{label_w}" y="{y + 2}" width="{w:.1f}" height="{row - 8}" fill="{color}"/>')
        body.append(f'<text x="{label_w + w + 6:.1f}" y="{y + 15}" class="value">{escape(fmt(value))}</text>')
    if reference is not None:
        x = label_w + reference * scale
        body.append(f'<line class="reference" x1="{x:.1f}" y1="4" x2="{x:.1f}" y2="{height - 18}"/>')
        body.append(f'<text x="{x:.1f}" y="{height - 4}" text-anchor="middle" class="axis">'
                    f"{escape(fmt(reference))}</text>")  # fmt: skip
    return _svg(width, height, title, body)


def line_chart(
    series: Sequence[Series], *, title: str, fmt: Fmt = lambda v: f"{v:g}", x_fmt: Fmt = clock,
    threshold: float | None = None, threshold_label: str = "threshold", width: int = 640, height: int = 220,
    empty: str = "no data yet",
) -> Markup:  # fmt: skip
    """One polyline (and dots) per series on shared axes from zero; ``threshold`` draws a dashed
    horizontal line. A series of one point is a dot."""
    drawn = [s for s in series if s.points]
    if not drawn:
        return _empty(title, empty, width)
    left, right, top, bottom = 64, 16, 12, 44
    legend_h = 18 * ((len(drawn) + 2) // 3)
    plot_w, plot_h = width - left - right, height - top - bottom
    xs = [x for s in drawn for x, _ in s.points]
    ys = [y for s in drawn for _, y in s.points] + ([threshold] if threshold is not None else [])
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    ticks = nice_ticks(0.0, max(max(ys), 1e-12))
    y1 = ticks[-1]

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * plot_w

    def py(y: float) -> float:
        return top + plot_h - y / y1 * plot_h

    body = []
    for t in ticks:
        body.append(f'<line class="grid" x1="{left}" y1="{py(t):.1f}" x2="{width - right}" y2="{py(t):.1f}"/>')
        body.append(f'<text x="{left - 6}" y="{py(t) + 4:.1f}" text-anchor="end" class="axis">{escape(fmt(t))}</text>')
    for x, anchor in ((x0, "start"), ((x0 + x1) / 2, "middle"), (x1, "end")):
        body.append(f'<text x="{px(x):.1f}" y="{top + plot_h + 16}" text-anchor="{anchor}" class="axis">'
                    f"{escape(x_fmt(x))}</text>")  # fmt: skip
    if threshold is not None:
        y = py(threshold)
        body.append(f'<line class="threshold" x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}"/>')
        body.append(f'<text x="{width - right}" y="{y - 4:.1f}" text-anchor="end" class="axis">'
                    f"{escape(threshold_label)} {escape(fmt(threshold))}</text>")  # fmt: skip
    for i, s in enumerate(drawn):
        color = PALETTE[i % len(PALETTE)]
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s.points)
        if len(s.points) > 1:
            body.append(f'<polyline class="line" fill="none" stroke="{color}" points="{pts}"/>')
        for x, y in s.points if len(s.points) <= MAX_DOTS else ():
            body.append(f'<circle class="dot" cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}"/>')
        lx, ly = left + (i % 3) * (plot_w / 3), height - 8 + 18 * (i // 3)
        body.append(f'<rect x="{lx:.1f}" y="{ly - 8:.1f}" width="10" height="10" fill="{color}"/>')
        body.append(f'<text x="{lx + 14:.1f}" y="{ly + 1:.1f}" class="legend">{escape(s.label)}</text>')
    return _svg(width, height + legend_h, title, body)
