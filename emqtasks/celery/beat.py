"""Celery beat onto emqtasks' schedules: ``crontab(...)`` and ``app.conf.beat_schedule``.

There is no beat process: every worker stores the app's beat_schedule at start (the schedule
store keeps one copy of each, and each slot is enqueued once whatever the number of
workers). An entry is ``{"task": name, "schedule": crontab(...) | timedelta | seconds,
"args": [...], "kwargs": {...}, "options": {"queue": name}}``; its jobs go to the queue its
options name, else the one task_routes gives its task, else its task's own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..errors import InvalidCron, InvalidSchedule
from ..schedules.cron import Cron, Timing, every
from ..schedules.schedule import Schedule, make_schedule
from ..store.keys import check_queue_name
from .routes import Routes, route

#: Celery's crontab fields, in the order of a cron expression.
_FIELDS = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
_ENTRY_KEYS = frozenset({"task", "schedule", "args", "kwargs", "options", "relative"})
_NOT_A_NAME = re.compile(r"[^A-Za-z0-9_.\-]+")


class crontab:   # Celery's spelling
    """Celery's ``crontab(minute=, hour=, day_of_week=, day_of_month=, month_of_year=)``:
    each field a cron field (``"*/15"``, ``"mon-fri"``, ``"8-17"``), a number, or numbers;
    read in the app's ``timezone``. A field out of range is InvalidCron naming it, here."""

    def __init__(self, minute: Any = "*", hour: Any = "*", day_of_week: Any = "*",
                 day_of_month: Any = "*", month_of_year: Any = "*") -> None:
        given = {"minute": minute, "hour": hour, "day_of_month": day_of_month,
                 "month_of_year": month_of_year, "day_of_week": day_of_week}
        parts = {name: _field(name, value) for name, value in given.items()}
        for name in _FIELDS:   # each alone, so the error names the field
            alone = " ".join(parts[n] if n == name else "*" for n in _FIELDS)
            try:
                Cron(alone)
            except InvalidCron as exc:
                raise InvalidCron(f"crontab {name}={given[name]!r} is out of range or "
                                  f"malformed: {exc}") from None
        self.expr = " ".join(parts[n] for n in _FIELDS)
        Cron(self.expr)   # the fields together (a day that never comes)

    def timing(self, tz: str) -> Cron:
        return Cron(self.expr, tz)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, crontab) and other.expr == self.expr

    def __hash__(self) -> int:
        return hash(self.expr)

    def __repr__(self) -> str:
        return f"<crontab: {self.expr}>"


def _field(name: str, value: Any) -> str:
    if isinstance(value, bool):
        raise InvalidCron(f"crontab {name} is a cron field, a number or numbers, not {value!r}")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and value.strip() and len(value.split()) == 1:
        return value.strip()
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes, Mapping)):
        items = list(value)
        if items and all(isinstance(v, int) and not isinstance(v, bool) for v in items):
            return ",".join(str(v) for v in sorted(set(items)))
    raise InvalidCron(f"crontab {name} is a cron field ('*/15', 'mon-fri'), a number or "
                      f"numbers, not {value!r}")


@dataclass(frozen=True)
class BeatEntry:
    """One beat_schedule entry as stored: the schedule, and its queue (None: its task's)."""

    label: str            # the entry's name as written in beat_schedule
    schedule: Schedule
    queue: str | None


def check_beat_schedule(value: Any) -> Any:
    """beat_schedule's shape (each entry read with UTC; the app's timezone at worker start)."""
    beat_entries(value, "UTC", ())
    return value


def beat_entries(value: Any, tz: str, routes: Routes) -> list[BeatEntry]:
    """The schedules of a beat_schedule, checked: InvalidSchedule (or the cron module's
    error) naming the entry; nothing is stored here."""
    if value is None:
        return []
    if not isinstance(value, Mapping):
        raise InvalidSchedule(f"beat_schedule is a dict of name -> {{'task': ..., "
                              f"'schedule': ...}}, not {value!r}")
    out: list[BeatEntry] = []
    names: dict[str, str] = {}
    for label, entry in value.items():
        name = schedule_name(label)
        if name in names:
            raise InvalidSchedule(f"beat_schedule entries {names[name]!r} and {label!r} "
                                  f"both become schedule {name!r}: rename one")
        names[name] = label
        out.append(_entry(label, name, entry, tz, routes))
    return out


def schedule_name(label: Any) -> str:
    """A schedule name of a beat entry's name: what is not a letter, digit, '_', '.' or '-'
    becomes '-' (schedule names are part of job ids)."""
    if not isinstance(label, str) or not label.strip():
        raise InvalidSchedule(f"a beat_schedule entry's name is a string, not {label!r}")
    return _NOT_A_NAME.sub("-", label.strip()).strip("-")[:64] or "beat"


def _entry(label: str, name: str, entry: Any, tz: str, routes: Routes) -> BeatEntry:
    where = f"beat_schedule[{label!r}]"
    if not isinstance(entry, Mapping):
        raise InvalidSchedule(f"{where} is a dict with 'task' and 'schedule', not {entry!r}")
    unknown = set(entry) - _ENTRY_KEYS
    if unknown:
        raise InvalidSchedule(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}"
                              f" (task, schedule, args, kwargs, options)")
    if entry.get("relative"):
        raise InvalidSchedule(f"{where}: relative=True has no meaning here: interval slots "
                              f"are multiples of the interval since the UNIX epoch")
    task = entry.get("task")
    if not isinstance(task, str) or not task:
        raise InvalidSchedule(f"{where} needs 'task': the task's name, not {task!r}")
    options = dict(entry.get("options") or {})
    queue = options.pop("queue", None)
    if options:
        raise InvalidSchedule(f"{where}: option(s) {', '.join(sorted(options))} have no "
                              f"meaning for a schedule here (only 'queue'; catch-up "
                              f"enqueues the latest missed slot only, in place of expires)")
    if queue is not None:
        check_queue_name(queue)
    args = entry.get("args") or ()
    kwargs = entry.get("kwargs") or {}
    if not isinstance(args, (list, tuple)) or not isinstance(kwargs, Mapping):
        raise InvalidSchedule(f"{where}: args is a list and kwargs a dict, not "
                              f"{args!r} / {kwargs!r}")
    s = make_schedule(name, task, timing=_timing(where, entry.get("schedule"), tz),
                      args=tuple(args), kwargs=dict(kwargs))
    return BeatEntry(label, s, queue if queue is not None else route(routes, task))


def _timing(where: str, value: Any, tz: str) -> Timing:
    if isinstance(value, crontab):
        return value.timing(tz)
    if isinstance(value, (int, float, timedelta)) and not isinstance(value, bool):
        return every(value)   # InvalidInterval for a fraction of a second
    raise InvalidSchedule(f"{where}: schedule is crontab(...), a timedelta or seconds, not "
                          f"{value!r} (solar schedules have no meaning here)")
