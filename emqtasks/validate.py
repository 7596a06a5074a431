"""Gates on the numbers users hand in: finite, in range, of the right type (bool is not an
int here). Each raises InvalidArgument quoting the bad value, before anything is written."""

from __future__ import annotations

import math
from typing import Any

from .errors import InvalidArgument


def integer(value: Any, what: str, minimum: int | None = None,
            maximum: int | None = None) -> int:
    """An int (not a bool) within [minimum, maximum]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{what} must be an integer, not {value!r}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise InvalidArgument(f"{what} must be an integer from {minimum} to {maximum}, "
                              f"not {value!r}" if maximum is not None else
                              f"{what} must be an integer >= {minimum}, not {value!r}")
    return value


def seconds(value: Any, what: str, minimum: float = 0.0, strict: bool = False) -> float:
    """A finite number of seconds (int or float, not a bool) >= minimum (> with strict)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value):
        raise InvalidArgument(f"{what} must be a finite number of seconds, not {value!r}")
    if value < minimum or (strict and value == minimum):
        raise InvalidArgument(f"{what} must be {'>' if strict else '>='} {minimum:g} seconds, "
                              f"not {value!r}")
    return float(value)
