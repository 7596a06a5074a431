"""When a schedule fires: a cron expression in a time zone, or a fixed interval.

A schedule's occurrences ("slots") are whole UNIX seconds, computed the same way by every
process, so two masters that compute a slot agree on it and on the job id made from it.

- ``Cron``: a 5-field expression (minute hour day-of-month month day-of-week, names such as
  ``mon-fri`` and ``jan`` allowed, ``@hourly`` / ``@daily`` / ``@weekly`` / ``@monthly`` /
  ``@yearly`` too), read in an IANA time zone. Parsing and stepping are cronsim's, which
  follows Debian cron, DST included: a job at a fixed time (its minute and hour fields not
  ``*``-based) that falls in a spring-forward gap runs once, at the first valid time after
  it (02:30 on a 02:00->03:00 day runs at 03:00); on a fall-back day it runs once, at the
  first of the two 01:30s. Jobs whose minute or hour field is ``*``-based follow real time
  (``*/30 * * * *`` fires every real half hour, twice in a repeated hour). This module only
  adds what a slot needs on top: each next slot is strictly later in real time than the
  one before (cronsim steps a fixed-time job in local wall time, where a fall-back hour
  could hand back a time already passed), and the latest slot at or before a time.
- ``Every``: a whole number of seconds >= 1; slots are the multiples of it since the UNIX
  epoch (so ``every(60)`` fires on the minute, in UTC), the same on every host.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo, available_timezones

from cronsim import CronSim, CronSimError

from ..errors import InvalidCron, InvalidInterval, InvalidSchedule, UnknownTimezone

MACROS = {
    "@hourly": "0 * * * *", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0", "@monthly": "0 0 1 * *", "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
#: Names zoneinfo can load that mean different things on different hosts, so masters on
#: two machines could disagree on a slot.
_HOST_DEPENDENT = {"localtime", "posixrules", "Factory"}
#: How far back latest_at_or_before looks before it gives up (cronsim's own horizon).
_HORIZON = 50 * 366 * 86_400


@functools.cache
def _zones() -> frozenset[str]:
    return frozenset(available_timezones()) - _HOST_DEPENDENT


@functools.lru_cache(maxsize=256)
def zone(tz: str) -> ZoneInfo:
    """The ZoneInfo of an IANA name, or UnknownTimezone quoting it."""
    if not isinstance(tz, str) or (tz != "UTC" and tz not in _zones()):
        raise UnknownTimezone(f"unknown time zone {tz!r}: use an IANA name such as "
                              f"'UTC' or 'Europe/Paris'")
    return ZoneInfo(tz)


class Timing:
    """What Cron and Every share: the slots, as whole UNIX seconds."""

    def next_after(self, t: int) -> int:
        """The first slot strictly after t."""
        raise NotImplementedError

    def latest_at_or_before(self, t: int) -> int | None:
        """The last slot at or before t (None if there was none within cronsim's horizon)."""
        raise NotImplementedError

    def slots_between(self, lo: int, hi: int, limit: int) -> list[int]:
        """Slots s with lo < s <= hi, oldest first, at most ``limit`` of them."""
        out: list[int] = []
        s = self.next_after(lo)
        while s <= hi and len(out) < limit:
            out.append(s)
            s = self.next_after(s)
        return out

    @property
    def key(self) -> str:
        """What decides the slots: two timings with one key fire at the same times."""
        raise NotImplementedError

    def fields(self) -> dict[str, Any]:
        """The stored form: {"cron": ..., "every": ...}."""
        raise NotImplementedError


@dataclass(frozen=True)
class Cron(Timing):
    """A 5-field cron expression read in an IANA time zone (default UTC)."""

    expr: str
    tz: str = "UTC"
    _fields: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_fields", _parse(self.expr))
        zone(self.tz)
        try:
            self.next_after(int(time.time()))
        except StopIteration:
            raise InvalidCron(f"cron expression {self.expr!r} never fires") from None

    def next_after(self, t: int) -> int:
        start = datetime.fromtimestamp(t, zone(self.tz))
        it = CronSim(self._fields, start)
        while True:
            # In local wall time a fall-back hour repeats: skip what is not later for real.
            s = int(next(it).timestamp())
            if s > t:
                return s

    def latest_at_or_before(self, t: int) -> int | None:
        # Forward from ever earlier starts, so the answer is always a slot next_after
        # yields: no reverse stepping with DST rules of its own.
        span = 120
        while span <= _HORIZON:
            s = self.next_after(t - span)
            if s <= t:
                while (after := self.next_after(s)) <= t:
                    s = after
                return s
            span *= 8
        return None

    @property
    def key(self) -> str:
        return f"cron {self._fields} {self.tz}"

    def fields(self) -> dict[str, Any]:
        return {"cron": self.expr, "every": None}

    def __str__(self) -> str:
        return f"cron {self.expr}"


@dataclass(frozen=True)
class Every(Timing):
    """A fixed interval of whole seconds (>= 1), slots aligned on the UNIX epoch."""

    seconds: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "seconds", interval_seconds(self.seconds))

    def next_after(self, t: int) -> int:
        return (t // self.seconds + 1) * self.seconds

    def latest_at_or_before(self, t: int) -> int | None:
        return t - t % self.seconds

    @property
    def key(self) -> str:
        return f"every {self.seconds}"

    def fields(self) -> dict[str, Any]:
        return {"cron": None, "every": self.seconds}

    def __str__(self) -> str:
        return f"every {self.seconds}s"


def _parse(expr: object) -> str:
    """The 5 fields of a cron expression (a macro expanded), checked by cronsim."""
    if not isinstance(expr, str):
        raise InvalidCron(f"a cron expression is a string, not {expr!r}")
    text = MACROS.get(expr.strip().lower(), expr.strip())
    parts = text.split()
    if len(parts) != 5:
        raise InvalidCron(f"invalid cron expression {expr!r}: 5 fields (minute hour "
                          f"day-of-month month day-of-week) are needed, not {len(parts)}")
    normal = " ".join(parts)
    try:
        CronSim(normal, datetime.now(timezone.utc))
    except (CronSimError, ValueError, TypeError, IndexError) as exc:
        raise InvalidCron(f"invalid cron expression {expr!r}: {exc}") from None
    return normal


def interval_seconds(value: object) -> int:
    """A whole number of seconds >= 1 from an int, float or timedelta; else InvalidInterval."""
    if isinstance(value, timedelta):
        seconds: float = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise InvalidInterval(f"every takes seconds (a number or a timedelta), not {value!r}")
    if not math.isfinite(seconds) or seconds < 1 or seconds != int(seconds):
        raise InvalidInterval(f"every must be a whole number of seconds >= 1, not {value!r}")
    return int(seconds)


def cron(expr: str, tz: str = "UTC") -> Cron:
    """A cron timing for ``@task(schedule=...)``: ``cron("0 9 * * mon-fri", tz="Europe/Paris")``."""
    return Cron(expr, tz)


def every(seconds: float | timedelta) -> Every:
    """An interval timing for ``@task(schedule=...)``: ``every(30)``, ``every(timedelta(hours=2))``.
    """
    return Every(interval_seconds(seconds))


def timing_of(cron_expr: str | None = None, every_s: float | timedelta | None = None,
              tz: str = "UTC") -> Timing:
    """The timing of ``App.schedule(cron=..., every=..., tz=...)``: exactly one of the two."""
    if (cron_expr is None) == (every_s is None):
        raise InvalidSchedule("a schedule takes exactly one of cron= and every=, "
                              f"not cron={cron_expr!r}, every={every_s!r}")
    if cron_expr is not None:
        return Cron(cron_expr, tz)
    zone(tz)   # checked even where it changes nothing, so a typo is still an error
    assert every_s is not None
    return every(every_s)
