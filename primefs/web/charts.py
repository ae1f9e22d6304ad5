"""Charts drawn on the server as SVG: no chart library, nothing to download, readable without JavaScript.

Colors come from CSS classes (`s0`..`s7`, static/app.css), so the page's stylesheet decides them and the
SVG carries no inline styles (the page's Content-Security-Policy forbids them).
"""
from __future__ import annotations

import math
import time
from html import escape

from markupsafe import Markup

W, H = 760, 280
PAD_L, PAD_R, PAD_T, PAD_B = 64, 16, 14, 34
COLORS = 8


def nice_ticks(hi: float, n: int = 4) -> list[float]:
    """Round tick values from 0 to at least `hi`."""
    if hi <= 0:
        return [0.0, 1.0]
    raw = hi / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [i * step for i in range(int(math.ceil(hi / step - 1e-9)) + 1)]


def fmt_number(v: float, unit: str = "") -> str:
    if unit == "$":
        return f"${v:.6g}" if v < 1 else f"${v:,.2f}"
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= size:
            return f"{v / size:.3g}{suffix}"
    return f"{v:.3g}" if v != int(v) else str(int(v))


def _time_label(ts: float, span: float) -> str:
    label = time.strftime("%H:%M:%S" if span < 600 else "%H:%M" if span < 86400 else "%m-%d %H:%M", time.localtime(ts))
    return label + f".{int(ts * 10) % 10}" if span < 20 else label  # short runs: tenths, or ticks repeat


def _frame(title: str, y_ticks: list[float], y_unit: str, sy, width: int = W, height: int = H,
           right: float = W - PAD_R) -> list[str]:
    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
           f"<title>{escape(title)}</title>"]
    for v in y_ticks:
        y = sy(v)
        out.append(f'<line class="grid" x1="{PAD_L}" x2="{right:.1f}" y1="{y:.1f}" y2="{y:.1f}"/>')
        out.append(f'<text class="tick" x="{PAD_L - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(fmt_number(v, y_unit))}</text>')
    return out


def line_chart(series: list[tuple[str, list[tuple[float, float]]]], title: str, y_unit: str = "") -> Markup:
    """Lines over time: `series` is [(label, [(unix time, value), ...]), ...]."""
    pts = [p for _, ps in series for p in ps]
    if not pts:
        return Markup(f'<p class="empty">{escape(title)}: no model calls yet</p>')
    if not any(p[1] for p in pts):
        return Markup(f'<p class="empty">{escape(title)}: zero throughout</p>')
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    if x1 - x0 < 1:
        x0, x1 = x0 - 1, x1 + 1
    ticks = nice_ticks(max(p[1] for p in pts))
    y_hi = ticks[-1] or 1

    def sx(x):
        return PAD_L + (x - x0) / (x1 - x0) * (W - PAD_L - PAD_R)

    def sy(y):
        return H - PAD_B - y / y_hi * (H - PAD_T - PAD_B)

    out = _frame(title, ticks, y_unit, sy)
    for i in range(5):
        x = x0 + (x1 - x0) * i / 4
        anchor = "start" if i == 0 else "end" if i == 4 else "middle"
        out.append(f'<text class="tick" x="{sx(x):.1f}" y="{H - PAD_B + 16}" text-anchor="{anchor}">'
                   f"{escape(_time_label(x, x1 - x0))}</text>")
    for i, (label, ps) in enumerate(series):
        if not ps:
            continue
        # cumulative values step: flat until the next call, then up
        coords, prev = [], None
        for x, y in ps:
            if prev is not None:
                coords.append(f"{sx(x):.1f},{sy(prev):.1f}")
            coords.append(f"{sx(x):.1f},{sy(y):.1f}")
            prev = y
        coords.append(f"{sx(x1):.1f},{sy(prev):.1f}")
        out.append(f'<polyline class="line s{i % COLORS}" points="{" ".join(coords)}"><title>{escape(label)}: '
                   f"{escape(fmt_number(prev, y_unit))}</title></polyline>")
    out.append("</svg>")
    legend = "".join(f'<li><span class="key s{i % COLORS}"></span>{escape(label)}</li>'
                     for i, (label, ps) in enumerate(series) if ps)
    return Markup("".join(out) + f'<ul class="legend">{legend}</ul>')


LABEL_CHARS, CHAR_W, LINE_H = 60, 6.8, 14  # label text: at most, width of a character (11 px, generous), line


def scatter_chart(points: list[tuple[float, float, str]], title: str, x_label: str, x_unit: str = "") -> Markup:
    """Labelled points: [(x, y, label), ...], y from 0 to at least 1 (scores; the caption names y).

    Labels go in a column right of the plot, each at its point's height but never on another (spread
    apart, drawn to their points by a line), and as long as they are (up to LABEL_CHARS): points of
    nearly the same score and cost still have labels one can read."""
    if not points:
        return Markup(f'<p class="empty">{escape(title)}: no runs yet</p>')
    labels = [label if len(label) <= LABEL_CHARS else label[:LABEL_CHARS - 1] + "…" for _, _, label in points]
    right = W - PAD_R  # the plot's right edge; the labels' column follows
    width = int(right + 24 + CHAR_W * max(len(label) for label in labels) + PAD_R)
    height = max(H, PAD_T + PAD_B + LINE_H * (len(points) + 1))
    x_ticks = nice_ticks(max(p[0] for p in points))
    y_ticks = nice_ticks(max(1.0, max(p[1] for p in points)))
    x_hi, y_hi = x_ticks[-1] or 1, y_ticks[-1] or 1

    def sx(x):
        return PAD_L + x / x_hi * (right - PAD_L)

    def sy(y):
        return height - PAD_B - y / y_hi * (height - PAD_T - PAD_B)

    out = _frame(title, y_ticks, "", sy, width, height, right)
    for j, v in enumerate(x_ticks):
        anchor = "end" if j == len(x_ticks) - 1 else "middle"
        out.append(f'<text class="tick" x="{sx(v):.1f}" y="{height - PAD_B + 16}" text-anchor="{anchor}">'
                   f"{escape(fmt_number(v, x_unit))}</text>")
    out.append(f'<text class="axis" x="{right}" y="{height - 2}" text-anchor="end">{escape(x_label)}</text>')
    ys = _spread([sy(y) + 4 for _, y, _ in points], PAD_T + 9, height - PAD_B)
    for i, ((x, y, label), shown, ly) in enumerate(zip(points, labels, ys)):
        out.append(f'<circle class="dot s{i % COLORS}" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="5">'
                   f"<title>{escape(label)}: {y:.3f} at {escape(fmt_number(x, x_unit))}</title></circle>")
        out.append(f'<line class="lead s{i % COLORS}" x1="{sx(x) + 5:.1f}" y1="{sy(y):.1f}" x2="{right + 18}" '
                   f'y2="{ly - 4:.1f}"/>')
        whole = f"<title>{escape(label)}</title>" if shown != label else ""
        out.append(f'<text class="label" x="{right + 22}" y="{ly:.1f}">{whole}{escape(shown)}</text>')
    out.append("</svg>")
    return Markup("".join(out))


def _spread(wanted: list[float], top: float, bottom: float) -> list[float]:
    """Baselines as near `wanted` as can be, LINE_H apart at least, within [top, bottom] (which fits them)."""
    order = sorted(range(len(wanted)), key=lambda i: wanted[i])
    placed = [0.0] * len(wanted)
    low = top
    for i in order:  # top down: each below the one above
        placed[i] = low = max(wanted[i], low)
        low += LINE_H
    high = bottom
    for i in reversed(order):  # bottom up: none below the bottom, so the ones above move up
        placed[i] = high = min(placed[i], high)
        high -= LINE_H
    return placed


def bars(rows: list[tuple[str, float]], unit: str = "") -> Markup:
    """A horizontal bar per row, as plain HTML/SVG rows (for per-session shares of a tree)."""
    hi = max((v for _, v in rows), default=0) or 1
    out = ['<table class="bars">']
    for i, (label, v) in enumerate(rows):
        width = max(0.5, v / hi * 100)
        out.append(f'<tr><td class="bl">{escape(label)}</td><td class="bv"><svg viewBox="0 0 100 6" '
                   f'preserveAspectRatio="none"><rect class="bar s{i % COLORS}" width="{width:.2f}" height="6"/></svg>'
                   f'</td><td class="num">{escape(fmt_number(v, unit))}</td></tr>')
    out.append("</table>")
    return Markup("".join(out))
