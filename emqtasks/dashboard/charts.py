"""A small line chart drawn on the server as SVG (no script, no CDN): the overview's wait
times per minute, a tenant's received vs entitled share. Only numbers and escaped labels go
into the markup."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

from markupsafe import Markup

COLORS = {"p50": "#1565c0", "p95": "#6a1b9a", "received": "#2e7d32", "entitled": "#9e9e9e"}
W, H, PAD = 720, 150, 24


def lines(points: Sequence[dict[str, Any]], series: Sequence[str], unit: str) -> Markup:
    """One polyline per series over the points (a point without a value is a gap)."""
    n = max(2, len(points))
    values = [float(v) for p in points for s in series if (v := p.get(s)) is not None]
    top = max([*values, 1.0])
    parts = [f'<text x="{PAD}" y="14" class="t">max {top:g} {escape(unit)}</text>',
             f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="#999"/>']
    for k, s in enumerate(series):
        runs: list[list[str]] = [[]]
        for i, p in enumerate(points):
            v = p.get(s)
            if v is None:
                runs.append([])
                continue
            x = PAD + (W - 2 * PAD) * i / (n - 1)
            y = H - PAD - (H - 2 * PAD) * float(v) / top
            runs[-1].append(f"{x:.1f},{y:.1f}")
        color = COLORS.get(s, "#555")
        for run in runs:
            if len(run) == 1:
                cx, cy = run[0].split(",")
                parts.append(f'<circle cx="{cx}" cy="{cy}" r="2" fill="{color}"/>')
            elif run:
                parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" '
                             f'points="{" ".join(run)}"/>')
        parts.append(f'<rect x="{PAD + k * 80}" y="{H - 12}" width="10" height="10" '
                     f'fill="{color}"/><text x="{PAD + k * 80 + 14}" y="{H - 3}" '
                     f'class="t">{escape(s)}</text>')
    return Markup(f'<svg class="lines" viewBox="0 0 {W} {H}" role="img" '
                  f'aria-label="{escape(", ".join(series))} per minute">{"".join(parts)}</svg>')
