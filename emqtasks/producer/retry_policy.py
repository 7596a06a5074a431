"""Retry policies: which exceptions are retried, and after how long.

The default is the mission's: every exception is retried after the task's fixed
``retry_delay``, fenced by its attempts. ``retry_backoff=True`` (base 1 s) or a number (the
base in seconds) makes the delay of the retry after attempt n ``min(retry_backoff_max,
base * 2 ** (n - 1))``, drawn uniformly from [0, that] with ``retry_jitter`` (full jitter).
An exception outside ``retry_for``, or inside ``dont_retry_for``, goes to ``dead`` at once.
A ``Retry(delay=...)`` the task raises always retries, after its own delay. The base and the
cap are numbers of seconds checked as every number is (validate.py: finite, at most a year),
so a computed delay is always one the verbs take.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from .. import validate
from ..errors import InvalidArgument, Retry, TimeLimitExceeded, WorkerLost

ExceptionTypes = tuple[type[BaseException], ...]
#: Failures of the job's run rather than of its code: retried whatever retry_for says
#: (unless named in dont_retry_for), like a lost lease.
ALWAYS_RETRIED: ExceptionTypes = (TimeLimitExceeded, WorkerLost)


@dataclass(frozen=True)
class RetryPolicy:
    backoff: float = 0.0                  # 0: the fixed retry_delay
    backoff_max: float = 600.0
    jitter: bool = True
    retry_for: ExceptionTypes = (Exception,)
    dont_retry_for: ExceptionTypes = ()

    def __post_init__(self) -> None:
        validate.seconds(self.backoff, "retry_backoff")
        validate.seconds(self.backoff_max, "retry_backoff_max")

    @classmethod
    def of(cls, retry_backoff: bool | float = False, retry_backoff_max: float = 600.0,
           retry_jitter: bool = True, retry_for: Any = (Exception,),
           dont_retry_for: Any = ()) -> RetryPolicy:
        """A policy from @task options, checked: InvalidArgument names what is wrong."""
        if isinstance(retry_backoff, bool):
            base = 1.0 if retry_backoff else 0.0
        else:   # True, False or the base: a number of seconds above 0, at most a year
            base = validate.seconds(retry_backoff, "retry_backoff", above_low=True)
        cap = validate.seconds(retry_backoff_max, "retry_backoff_max")
        if not isinstance(retry_jitter, bool):
            raise InvalidArgument(f"retry_jitter is True or False, not {retry_jitter!r}")
        return cls(base, cap, retry_jitter,
                   _exception_types("retry_for", retry_for),
                   _exception_types("dont_retry_for", dont_retry_for))

    def retries(self, exc: BaseException) -> bool:
        """Whether a failure by exc is retried (while attempts last)."""
        if isinstance(exc, Retry):
            return True
        if self.dont_retry_for and isinstance(exc, self.dont_retry_for):
            return False
        return isinstance(exc, self.retry_for + ALWAYS_RETRIED)

    def why_not(self, exc: BaseException) -> str:
        """The reason a failure goes to dead at once, for the row's error text."""
        name = type(exc).__name__
        if self.dont_retry_for and isinstance(exc, self.dont_retry_for):
            return f"not retried: {name} is in dont_retry_for"
        return f"not retried: {name} is outside retry_for"

    def delay(self, attempt: int) -> float | None:
        """Seconds before the retry that follows failed attempt ``attempt`` (1 for the
        first); None: the task's fixed retry_delay (kept on the job's row)."""
        if not self.backoff:
            return None
        ceiling = min(self.backoff_max, self.backoff * 2.0 ** min(max(attempt, 1) - 1, 60))
        return random.uniform(0.0, ceiling) if self.jitter else ceiling


def bounded(delay: float | None) -> float | None:
    """A retry delay the verbs take: within 0 .. a year; None (the row's fixed delay) for
    one that is not a number at all (NaN)."""
    if delay is None or math.isnan(delay):
        return None
    return min(max(delay, 0.0), validate.MAX_DURATION)


def _exception_types(what: str, value: Any) -> ExceptionTypes:
    if not isinstance(value, tuple) or not all(
            isinstance(t, type) and issubclass(t, BaseException) for t in value):
        raise InvalidArgument(f"{what} is a tuple of exception classes, not {value!r}")
    return value


DEFAULT_POLICY = RetryPolicy()
