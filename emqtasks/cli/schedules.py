"""Periodic schedules from the command line: ``emqtasks schedules`` and
``emqtasks schedule add / remove / run``.

Like the admin verbs: ``--redis-url`` / ``-Q``, and one line ``emqtasks: error: ...`` on
stderr, exit 2 for bad input (nothing is stored), exit 1 when the schedule asked for does
not exist. A schedule added here is stored on the queue; running workers pick it up within
one tick. Whether the task exists is checked against the tasks the queue's workers serve
(noted on a queue that has schedules: at worker start, or by a running master when the
first schedule appears), or against the modules given with ``-A``.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import click

from ..errors import EmqError, UnknownSchedule, UnknownTask
from ..producer.app import App, all_apps
from ..producer.registry import TaskSpec
from ..schedules.cron import interval_seconds, zone
from ..schedules.schedule import (
    CATCHUP_POLICIES,
    ScheduleInfo,
    ScheduleStore,
    deferred,
    make_schedule,
)
from ..store.queue import Queue
from .admin import _json_option
from .common import AdminCommand, CliError, Refused, queue_options, run_admin, settings_for

_APP_OPTION = click.option(
    "-A", "--app", "modules", multiple=True, metavar="MODULE",
    help="import this module (repeatable) to know the task here: its signature is checked "
         "and its own options are used")


@click.command("schedules", cls=AdminCommand)
@queue_options
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def schedules(redis_url: str | None, queue: str | None, as_json: bool) -> None:
    """List the periodic schedules of the queue: spec, next run, last job and its state."""
    rows: list[ScheduleInfo] = run_admin(redis_url, queue,
                                         lambda q: ScheduleStore(q).infos())
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in rows], indent=2))
        return
    if not rows:
        click.echo("no schedules")
        return
    head = ("name", "task", "spec", "tz", "next run", "last job", "state")
    table = [(r.name, r.task, r.spec, r.tz, _when(r.next_run, r.tz), r.last_id or "-",
              r.last_state or "-") for r in rows]
    widths = [max(len(head[i]), *(len(t[i]) for t in table)) for i in range(len(head))]
    for line in (head, *table):
        click.echo("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip())


def _when(moment: datetime | None, tz: str) -> str:
    if moment is None:
        return "-"
    return moment.astimezone(zone(tz)).strftime("%Y-%m-%d %H:%M:%S %z")


@click.group("schedule")
def schedule() -> None:
    """Add, remove or run one periodic schedule (see also: emqtasks schedules)."""


@schedule.command("add", cls=AdminCommand)
@click.argument("name")
@click.argument("task_name", metavar="TASK")
@queue_options
@click.option("--cron", "cron_expr", default=None, metavar="EXPR",
              help="a 5-field cron expression, e.g. '*/5 * * * *'")
@click.option("--every", "every_text", default=None, metavar="S",
              help="an interval of whole seconds (>= 1)")
@click.option("--args", "args_json", default="[]", show_default=True, metavar="JSON",
              help="positional arguments, a JSON array")
@click.option("--kwargs", "kwargs_json", default="{}", show_default=True, metavar="JSON",
              help="keyword arguments, a JSON object")
@click.option("--tz", default="UTC", show_default=True, help="IANA time zone of --cron")
@click.option("--group", "-g", default=None, help="the lane of its jobs [default: the task's]")
@click.option("--catchup", type=click.Choice(CATCHUP_POLICIES), default="latest",
              show_default=True, help="slots missed while no worker ran: the latest, all "
                                      "(at most 100), or none")
@click.option("--jitter", type=click.FloatRange(0), default=0.0, show_default=True,
              metavar="S", help="delay each slot's job by a random 0..S seconds")
@click.option("--no-overlap", is_flag=True,
              help="skip a slot while the previous slot's job is pending or running")
@_APP_OPTION
def add(name: str, task_name: str, redis_url: str | None, queue: str | None,
        cron_expr: str | None, every_text: str | None, args_json: str, kwargs_json: str,
        tz: str, group: str | None, catchup: str, jitter: float, no_overlap: bool,
        modules: tuple[str, ...]) -> None:
    """Store a schedule NAME that calls TASK (--cron EXPR or --every S)."""
    args = _json_option(args_json, "--args", list, "array")
    kwargs = _json_option(kwargs_json, "--kwargs", dict, "object")
    _import(modules)
    spec = _local_spec(task_name) if modules else None
    try:
        every_s = None if every_text is None else interval_seconds(_number(every_text))
        s = make_schedule(name, task_name, cron=cron_expr, every=every_s, tz=tz,
                          args=tuple(args), kwargs=kwargs, group=group, catchup=catchup,
                          jitter=jitter, overlap=not no_overlap,
                          fn=spec.fn if spec else None)
    except EmqError as exc:
        raise CliError(str(exc)) from None

    def verb(q: Queue) -> ScheduleInfo:
        store = ScheduleStore(q)
        if spec is None and store.task_known(task_name) is None:
            raise UnknownTask(f"unknown task {task_name!r}: no worker of queue {q.name!r} "
                              f"noted it (name its module with -A; workers note their "
                              f"tasks once the queue has a schedule)")
        store.put(s, origin="runtime")
        return next(i for i in store.infos() if i.name == s.name)

    info = run_admin(redis_url, queue, verb,
                     ("schedule add", f"{s.name}: {s.task} {s.spec} ({s.tz})", None))
    click.echo(f"schedule {s.name} stored: {s.task} {s.spec} ({s.tz}), next run "
               f"{_when(info.next_run, s.tz)}")


@schedule.command("remove", cls=AdminCommand)
@click.argument("name")
@queue_options
def remove(name: str, redis_url: str | None, queue: str | None) -> None:
    """Remove the schedule NAME (jobs it enqueued already stay)."""
    if not run_admin(redis_url, queue, lambda q: ScheduleStore(q).drop(name),
                     lambda dropped: ("schedule remove", name, None) if dropped else None):
        raise Refused(f"no schedule {name!r} on queue {settings_for(redis_url, queue).queue}")
    click.echo(f"schedule {name} removed")


@schedule.command("run", cls=AdminCommand)
@click.argument("name")
@queue_options
@_APP_OPTION
def run(name: str, redis_url: str | None, queue: str | None,
        modules: tuple[str, ...]) -> None:
    """Enqueue one run of the schedule NAME now, with a job id of its own."""
    _import(modules)   # App.run_schedule then finds the task, its options and group function

    def verb(q: Queue) -> Any:
        app = App(redis_url=settings_for(redis_url, queue).redis_url, queue=q.name)
        try:
            return app.run_schedule(name)
        except UnknownSchedule as exc:
            return exc
        finally:
            app.close()

    result = run_admin(redis_url, queue, verb, lambda r: None if isinstance(
        r, UnknownSchedule) else ("schedule run", f"{name} as {r.id}", 0 if r.duplicate else 1))
    if isinstance(result, UnknownSchedule):
        raise Refused(str(result))
    click.echo(f"{result.id} duplicate" if result.duplicate else result.id)


def _import(modules: tuple[str, ...]) -> None:
    """Import the -A modules as a worker does: their own App.schedule calls only declare."""
    if modules:
        from .worker import import_modules

        with deferred():
            import_modules(modules)


def _local_spec(task_name: str) -> TaskSpec | None:
    """The spec of task_name if a module of this process registers it."""
    for app in all_apps():
        if task_name in app.registry:
            found: TaskSpec = app.registry.get(task_name).spec
            return found
    return None


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise CliError(f"--every takes a number of seconds, not {text!r}") from None


COMMANDS = (schedules, schedule)
