"""Periodic schedules: the declaration (``Schedule``), its stored form, and the store on a queue.

A schedule's slot ``s`` (whole UNIX seconds, see cron.py) is enqueued with the job id
``sched:<name>:<s>``, so every master may enqueue it and the server keeps one. The marker
``<name>:last`` of ``emq:{q}:schedstate`` (the latest slot handled) refuses a slot a second
time even after its row is gone (``result_ttl=0``): lua/schedule.lua checks it and enqueues
in one step. Schedules live in ``emq:{q}:schedules`` (name -> JSON spec), with a version
counter ``emq:{q}:schedver`` that running masters read once per tick.

No I/O happens here but through a ``ScheduleStore``; declaring a schedule in code
(``@task(schedule=...)``, or ``App.schedule`` while a worker imports its modules) stores
nothing until the worker starts.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple

from .. import serialization
from ..errors import EmqError, InvalidSchedule, InvalidScheduleName, UnknownTask
from ..producer.jobs import build_job
from ..producer.registry import TaskSpec
from ..store.cluster import node_kwargs
from ..store.durable import Durable
from ..store.keys import check_group, check_job_id, new_job_id
from ..store.queue import NewJob, Queue
from ..verdicts import EnqueueVerdict, FireVerdict
from .cron import Cron, Every, Timing, timing_of

#: Schedule names: they are part of job ids (``sched:<name>:<slot>``), so no ``:``.
SCHEDULE_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
CATCHUP_POLICIES = ("latest", "all", "none")
#: The most missed slots ``catchup="all"`` enqueues; past that, only the latest one.
CATCHUP_MAX = 100
#: The longest jitter: a slot's job may wait at most a day for its random delay.
JITTER_MAX = 86_400.0
ENDED = ("done", "dead", "cancelled", "skipped", "expired", "aborted")

_deferring = False


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """While a worker imports its modules: ``App.schedule`` only declares, and the worker
    stores the declarations at start (its settings are not final during the import)."""
    global _deferring
    before, _deferring = _deferring, True
    try:
        yield
    finally:
        _deferring = before


def deferring() -> bool:
    return _deferring


def check_schedule_name(name: object) -> str:
    if not isinstance(name, str) or not SCHEDULE_NAME.fullmatch(name):
        raise InvalidScheduleName(
            f"invalid schedule name {name!r}: it becomes part of job ids, so use 1-64 "
            f"letters, digits, '_', '.' or '-'")
    return name


def slot_id(name: str, slot: int) -> str:
    """The job id of one slot: the schedule's name and the slot's UNIX seconds."""
    return f"sched:{name}:{slot}"


def run_id(name: str) -> str:
    """The job id of an extra run asked for by hand (``schedule run``): never a slot's."""
    return f"sched:{name}:run-{new_job_id()}"


@dataclass(frozen=True)
class Schedule:
    """One periodic call of a task. Build it with ``make_schedule`` (which checks it)."""

    name: str
    task: str
    timing: Timing
    tz: str = "UTC"
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    group: str | None = None
    catchup: str = "latest"
    jitter: float = 0.0
    overlap: bool = True

    @property
    def spec(self) -> str:
        return str(self.timing)

    def to_json(self) -> str:
        """The stored form; canonical, so an unchanged declaration compares equal."""
        return json.dumps({"name": self.name, "task": self.task, **self.timing.fields(),
                           "tz": self.tz, "args": list(self.args),
                           "kwargs": dict(self.kwargs), "group": self.group,
                           "catchup": self.catchup, "jitter": self.jitter,
                           "overlap": self.overlap}, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Schedule:
        """A stored schedule, checked again (a spec edited by hand is refused here)."""
        try:
            d = json.loads(text)
            return make_schedule(d["name"], d["task"], cron=d.get("cron"),
                                 every=d.get("every"), tz=d.get("tz", "UTC"),
                                 args=tuple(d.get("args", ())), kwargs=d.get("kwargs") or {},
                                 group=d.get("group"), catchup=d.get("catchup", "latest"),
                                 jitter=d.get("jitter", 0.0), overlap=d.get("overlap", True))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InvalidSchedule(f"unreadable stored schedule {text[:200]!r}: {exc}") from None


def make_schedule(name: str, task: str, *, cron: str | None = None,
                  every: float | timedelta | None = None, timing: Timing | None = None,
                  tz: str = "UTC", args: tuple[Any, ...] = (),
                  kwargs: Mapping[str, Any] | None = None, group: str | None = None,
                  catchup: str = "latest", jitter: float = 0.0, overlap: bool = True,
                  fn: Callable[..., Any] | None = None,
                  limit: int = 1_000_000) -> Schedule:
    """A checked Schedule: every bad value is a named error quoting it (nothing stored)."""
    check_schedule_name(name)
    if not isinstance(task, str) or not task.strip():
        raise UnknownTask(f"a schedule needs a task name, not {task!r}")
    if timing is None:
        timing = timing_of(cron, every, tz)
    elif isinstance(timing, Cron):
        tz = timing.tz
    if catchup not in CATCHUP_POLICIES:
        raise InvalidSchedule(f"catchup must be one of {', '.join(CATCHUP_POLICIES)}, "
                              f"not {catchup!r}")
    if isinstance(jitter, bool) or not isinstance(jitter, (int, float)) \
            or not 0 <= jitter <= JITTER_MAX:
        raise InvalidSchedule(f"jitter is a number of seconds from 0 to {JITTER_MAX:g}, "
                              f"not {jitter!r}")
    if not isinstance(overlap, bool):
        raise InvalidSchedule(f"overlap is True or False, not {overlap!r}")
    if group is not None:
        check_group(group)
    args, kwargs = tuple(args), dict(kwargs or {})
    serialization.dumps_args(args, kwargs, limit)   # JSON can carry them, under the cap
    if fn is not None:
        _check_call(name, task, fn, args, kwargs)
    return Schedule(name, task, timing, tz, args, kwargs, group, catchup, float(jitter),
                    overlap)


def _check_call(name: str, task: str, fn: Callable[..., Any], args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(*args, **kwargs)
    except TypeError as exc:
        raise InvalidSchedule(f"schedule {name!r}: task {task} cannot be called with "
                              f"args={list(args)!r} kwargs={kwargs!r}: {exc}") from None


# -- what workers tell the queue about their tasks ------------------------------------------

def task_options(spec: TaskSpec) -> str:
    """A task's options as the queue keeps them (``emq:{q}:tasks``), for the CLI."""
    return json.dumps({"group": spec.group if isinstance(spec.group, str) else None,
                       "group_fn": callable(spec.group), "max_attempts": spec.max_attempts,
                       "retry_delay": spec.retry_delay, "lease": spec.lease,
                       "result_ttl": spec.result_ttl}, sort_keys=True)


def spec_from_options(name: str, text: str) -> tuple[TaskSpec, bool]:
    """(TaskSpec, whether its group is a function only its module can run) from task_options."""
    d = json.loads(text)
    spec = TaskSpec(name=name, fn=_elsewhere, group=d.get("group"),
                    max_attempts=int(d["max_attempts"]), retry_delay=float(d["retry_delay"]),
                    lease=float(d["lease"]), result_ttl=int(d["result_ttl"]))
    return spec, bool(d.get("group_fn"))


def _elsewhere(*_args: Any, **_kwargs: Any) -> None:
    raise UnknownTask("this task runs on a worker")


# -- the store -----------------------------------------------------------------------------

class Fired(NamedTuple):
    """What firing one slot answered: the verdict, the server's time (ms), the marker."""

    verdict: FireVerdict
    now_ms: int
    last: int


@dataclass(frozen=True)
class ScheduleInfo:
    """One stored schedule as ``App.schedules()`` and ``emqtasks schedules`` show it."""

    name: str
    task: str
    spec: str
    tz: str
    next_run: datetime | None
    last_id: str | None
    last_state: str | None
    schedule: Schedule
    origin: str | None = None

    def to_dict(self) -> dict[str, Any]:
        s = self.schedule
        return {"name": self.name, "task": self.task, "spec": self.spec, "tz": self.tz,
                "next_run": self.next_run.isoformat() if self.next_run else None,
                "last_id": self.last_id, "last_state": self.last_state,
                "args": list(s.args), "kwargs": dict(s.kwargs), "group": s.group,
                "catchup": s.catchup, "jitter": s.jitter, "overlap": s.overlap,
                "origin": self.origin}


class ScheduleStore:
    """The schedules of one queue: the ``schedule`` verb and the reads around it."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.keys = queue.keys

    def put(self, schedule: Schedule, origin: str = "runtime") -> bool:
        """Store (or update) a schedule; True when something changed."""
        return self.queue.schedule_put(schedule.name, schedule.to_json(),
                                       schedule.timing.key, origin)

    def drop(self, name: str) -> bool:
        return self.queue.schedule_drop(check_schedule_name(name))

    def fire(self, schedule: Schedule, slot: int, job: NewJob) -> Fired:
        """Enqueue one slot (at most once per slot, whatever the number of callers)."""
        check_job_id(job.id)
        return Fired(*self.queue.schedule_fire(schedule.name, slot, schedule.overlap, job))

    def version(self) -> str | None:
        """The change counter of the schedules (one GET): what a master reads each tick."""
        value: str | None = self.queue.client.get(self.keys.schedver)
        return value

    def load(self) -> tuple[dict[str, Schedule], dict[str, str]]:
        """(the readable schedules, {name: why} for those that are not)."""
        good: dict[str, Schedule] = {}
        bad: dict[str, str] = {}
        for name, text in self.queue.client.hgetall(self.keys.schedules).items():
            try:
                good[name] = Schedule.from_json(text)
            except EmqError as exc:
                bad[name] = str(exc)
        return good, bad

    def state(self) -> dict[str, dict[str, str]]:
        """name -> {last, job, lastid, key, origin} (what is set of them)."""
        out: dict[str, dict[str, str]] = {}
        for fieldname, value in self.queue.client.hgetall(self.keys.schedstate).items():
            name, _, what = fieldname.rpartition(":")
            out.setdefault(name, {})[what] = value
        return out

    def server_seconds(self) -> float:
        """The clock of the server that holds the queue (on a cluster, its node)."""
        secs, micros = self.queue.client.time(**node_kwargs(self.queue.client, self.keys.ring))
        return int(secs) + int(micros) / 1e6

    def get(self, name: str) -> Schedule | None:
        text = self.queue.client.hget(self.keys.schedules, check_schedule_name(name))
        return None if text is None else Schedule.from_json(text)

    def infos(self) -> list[ScheduleInfo]:
        """Every stored schedule with its next run, last slot id and that job's state."""
        schedules, _ = self.load()
        state = self.state()
        now = int(self.server_seconds())
        names = sorted(schedules)
        pipe = self.queue.client.pipeline(transaction=False)
        for name in names:
            pipe.hget(self.keys.job(state.get(name, {}).get("lastid", "-")), "state")
        rows = pipe.execute() if names else []
        out = []
        for name, row_state in zip(names, rows):
            s, st = schedules[name], state.get(name, {})
            last = int(st.get("last", now))
            nxt = s.timing.next_after(max(last, now - 1))
            last_id = st.get("lastid")
            out.append(ScheduleInfo(
                name, s.task, s.spec, s.tz, datetime.fromtimestamp(nxt, timezone.utc),
                last_id, row_state or ("expired" if last_id else None), s, st.get("origin")))
        return out

    def note_tasks(self, specs: list[TaskSpec]) -> None:
        """Tell the queue which tasks a worker serves (for the CLI's checks and runs); done
        at worker start, and by a master when it first sees a schedule on its queue."""
        if specs:
            self.queue.client.hset(self.keys.tasks,
                                   mapping={s.name: task_options(s) for s in specs})

    def task_known(self, name: str) -> str | None:
        """The stored options of a task some worker of this queue serves, or None."""
        text: str | None = self.queue.client.hget(self.keys.tasks, name)
        return text


def build_slot_job(spec: TaskSpec, schedule: Schedule, job_id: str, limit: int,
                   countdown: float | None = None) -> NewJob:
    """The row of one run of a schedule (a slot's, or a run by hand)."""
    return build_job(spec, tuple(schedule.args), dict(schedule.kwargs), limit=limit,
                     job_id=job_id, group=schedule.group, countdown=countdown)


def declared_timing(value: object) -> Timing:
    """The ``schedule=`` of ``@task``: cron(...), every(...), a cron string or seconds."""
    if isinstance(value, (Cron, Every)):
        return value
    if isinstance(value, str):
        return Cron(value)
    if isinstance(value, (int, float, timedelta)) and not isinstance(value, bool):
        return timing_of(None, value)
    raise InvalidSchedule(f"schedule= takes emqtasks.cron(...), emqtasks.every(...), a cron "
                          f"string or seconds, not {value!r}")


def run_now(store: ScheduleStore, schedule: Schedule, spec: TaskSpec,
            limit: int = 1_000_000, durable: Durable | None = None) -> tuple[str, bool]:
    """Enqueue one extra run of a schedule now, with an id of its own (not a slot's): its
    slots, marker and overlap books are untouched. Returns (job id, duplicate)."""
    job = build_slot_job(spec, schedule, run_id(schedule.name), limit)
    verdict = store.queue.enqueue_many([job], None, durable=durable)[0]
    return job.id, verdict == EnqueueVerdict.DUPLICATE


def register_declared(store: ScheduleStore, declared: list[Schedule],
                      specs: Mapping[str, TaskSpec]) -> tuple[list[str], list[str]]:
    """At worker start: store the schedules its modules declare, drop the ones declared in
    code before, for a task this worker serves, that no module declares any more, and (on a
    queue that has schedules) note the worker's tasks. Returns (changed, dropped) names."""
    for s in declared:
        if s.task not in specs:
            raise UnknownTask(f"schedule {s.name!r} names task {s.task!r}, which no module "
                              f"of this worker registers")
        _check_call(s.name, s.task, specs[s.task].fn, tuple(s.args), dict(s.kwargs))
    stored, _ = store.load()
    if declared or stored:   # a queue that uses no schedules gets no key of them
        store.note_tasks(list(specs.values()))
    changed = [s.name for s in declared if store.put(s, origin="code")]
    names = {s.name for s in declared}
    state = store.state() if stored else {}
    dropped = [name for name, s in stored.items()
               if name not in names and s.task in specs
               and state.get(name, {}).get("origin") == "code" and store.drop(name)]
    return changed, dropped
