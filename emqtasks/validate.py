"""The one gate for numbers (and task names) a caller hands emqtasks.

Every timing value, count and limit is checked where it enters - task options, enqueue
(``apply_async``, ``map``, ``send_task``), the consumer and admin verbs, the command line -
by a function of this module, before anything is written. A refusal is
:class:`~emqtasks.errors.InvalidArgument` quoting the value. The rules: a number is an
``int`` or ``float`` (or another real number type), never a ``bool`` and never a string; it
is finite; it lies in its documented range. An integer option refuses a float, even 2.0.
"""

from __future__ import annotations

import math
import numbers
from datetime import datetime, timezone
from typing import Any

from . import _seconds
from ._seconds import MAX_DURATION, YEAR
from ._seconds import shown as _shown
from .errors import InvalidArgument

__all__ = ["MAX_ATTEMPTS", "MAX_COUNT", "MAX_COUNTDOWN", "MAX_DURATION", "MAX_RESULT_BYTES",
           "MAX_TTL", "MIN_LEASE", "UNIX_FROM", "YEAR", "countdown_ms", "expires_ms", "integer",
           "lease",
           "optional_seconds", "result_bytes", "seconds", "task_name", "time_limit"]

#: How far ahead a countdown or an eta may schedule a job.
MAX_COUNTDOWN = 10 * YEAR
#: The shortest lease: one millisecond, the unit the server counts in.
MIN_LEASE = 0.001
MAX_ATTEMPTS = 1_000_000
#: The longest result_ttl (seconds) and the biggest count an admin verb takes.
MAX_TTL = int(MAX_COUNTDOWN)
MAX_COUNT = 2**31 - 1
#: The largest result limit: 512 MiB, the server's default proto-max-bulk-len (the largest
#: argument it takes; a bigger one is refused by closing the connection).
MAX_RESULT_BYTES = 512 * 1024 * 1024


def seconds(value: Any, what: str, *, low: float = 0.0, high: float = MAX_DURATION,
            above_low: bool = False) -> float:
    """A finite number of seconds in [low, high] (in (low, high] with ``above_low``)."""
    return _seconds.seconds(value, what, InvalidArgument, low=low, high=high,
                            above_low=above_low)


def optional_seconds(value: Any, what: str, **bounds: Any) -> float | None:
    return None if value is None else seconds(value, what, **bounds)


#: How long a unique key is held at most when the call or task names no ``unique_for``.
UNIQUE_FOR = 3600.0


def unique_for(value: Any) -> float:
    """A unique key's longest hold: finite positive seconds, at least a ms (InvalidArgument)."""
    return seconds(value, "unique_for", low=0.001, high=MAX_DURATION)


def integer(value: Any, what: str, low: int = 1, high: int = MAX_COUNT) -> int:
    """An integer (not a bool, not a float) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        kind = " (a bool is not one)" if isinstance(value, bool) else ""
        raise InvalidArgument(f"{what} must be an integer{kind}, not {_shown(value)}")
    n = int(value)
    if not low <= n <= high:
        raise InvalidArgument(f"{what} must be an integer from {low} to {high}, "
                              f"not {_shown(value)}")
    return n


def task_name(value: Any) -> str:
    """A task name: a non-empty string that is not only blanks."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument(f"a task name is a non-empty string, not {_shown(value)}")
    return value


def result_bytes(value: Any) -> int:
    """``max_result_bytes``: an integer number of bytes, 1 to 512 MiB."""
    return integer(value, "max_result_bytes", 1, MAX_RESULT_BYTES)


def lease(value: Any) -> float:
    return seconds(value, "lease", low=MIN_LEASE)


def time_limit(value: Any) -> float | None:
    return optional_seconds(value, "time_limit", above_low=True)


def countdown_ms(countdown: Any, eta: Any) -> int:
    """Milliseconds from now until a job is due (0: now) from ``countdown`` (seconds; a
    negative one means now) and ``eta`` (a datetime or a UNIX timestamp; the past means
    now). With both, the later wins."""
    due_in = 0.0
    if countdown is not None:
        due_in = seconds(countdown, "countdown", low=-math.inf, high=MAX_COUNTDOWN)
    if eta is not None:
        now = datetime.now(timezone.utc).timestamp()
        due_in = max(due_in, _eta_stamp(eta) - now)
        if due_in > MAX_COUNTDOWN:
            raise InvalidArgument(f"eta must be at most {MAX_COUNTDOWN:g} seconds ahead, "
                                  f"not {_shown(eta)}")
    return 0 if due_in <= 0 else max(1, int(due_in * 1000))


#: ``expires`` as a number: up to 10 years is seconds from now (as Celery reads it); from
#: this value on (2001-09-09) a UNIX timestamp; in between it is refused as ambiguous.
UNIX_FROM = 1e9


def expires_ms(expires: Any) -> int | None:
    """Milliseconds from now until a job not yet started is never run (None: no expiry)
    from ``expires``: seconds from now (at most 10 years), a UNIX timestamp, or a datetime.
    The past (or 0) means already expired: the first claim that meets the job ends it."""
    if expires is None:
        return None
    if isinstance(expires, datetime) or (
            isinstance(expires, numbers.Real) and not isinstance(expires, bool)
            and not isinstance(expires, datetime) and float(expires) >= UNIX_FROM):
        left = _eta_stamp(expires) - datetime.now(timezone.utc).timestamp()
    elif isinstance(expires, bool) or not isinstance(expires, numbers.Real):
        raise InvalidArgument("expires must be seconds from now, a UNIX timestamp or a "
                              f"datetime, not {_shown(expires)}")
    else:
        left = seconds(expires, "expires (seconds from now; a UNIX timestamp from 1e9)",
                       low=-math.inf, high=MAX_COUNTDOWN)
    if left > MAX_COUNTDOWN:
        raise InvalidArgument(f"expires must be at most {MAX_COUNTDOWN:g} seconds ahead, "
                              f"not {_shown(expires)}")
    return max(0, int(left * 1000))


def _eta_stamp(eta: Any) -> float:
    if isinstance(eta, datetime):
        try:
            return eta.timestamp()
        except (OverflowError, ValueError, OSError) as exc:
            raise InvalidArgument(f"eta {_shown(eta)} has no UNIX time: {exc}") from None
    if isinstance(eta, bool) or not isinstance(eta, numbers.Real):
        raise InvalidArgument(f"eta must be a datetime or a UNIX timestamp, not {_shown(eta)}")
    return seconds(eta, "eta", low=-math.inf, high=math.inf)
