"""The check of a number of seconds, below errors.py and validate.py.

validate.py raises the error tree's InvalidArgument, and the error tree's Retry and
RateLimited check their delays: this check takes the error class to raise, so both import
it and neither imports the other's module back.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

YEAR = 365 * 86_400.0
#: The longest lease, retry delay and time limit: longer ones are typos (ms vs s).
MAX_DURATION = YEAR


def shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def seconds(value: Any, what: str, error: type[Exception], *, low: float = 0.0,
            high: float = MAX_DURATION, above_low: bool = False) -> float:
    """A finite number of seconds in [low, high] (in (low, high] with ``above_low``), else
    ``error`` quoting the value."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(f"{what} must be a number of seconds, not {shown(value)}")
    try:
        x = float(value)
    except (OverflowError, ValueError):
        x = math.inf
    if not math.isfinite(x):
        raise error(f"{what} must be a finite number of seconds, not {shown(value)}")
    if x < low or (above_low and x == low) or x > high:
        floor = f"above {low:g}" if above_low else f"at least {low:g}"
        ceiling = "" if high == math.inf else f"at most {_span(high)}"
        bounds = " and ".join(b for b in (floor if low > -math.inf else "", ceiling) if b)
        raise error(f"{what} must be {bounds}, not {shown(value)}")
    return x


def _span(high: float) -> str:
    years = high / YEAR
    if years >= 1 and years == int(years):
        return f"{int(years)} year{'s' if years > 1 else ''} ({high:.0f} s)"
    return f"{high:g} seconds"
