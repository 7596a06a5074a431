"""The admin verbs of the ``emqtasks`` command: pause, resume, limit, weight, dead, requeue,
cancel, abort, purge, enqueue, job.

Each command registers itself on the ``main`` group of :mod:`emqtasks.cli` (imported there at
the bottom), takes ``--redis-url`` / ``-Q`` like every other command, and reports an error as
one line ``emqtasks: error: ...`` on stderr: exit 2 for bad input (usage, JSON, a limit that
is not a number), exit 1 when the verb ran but did not do what was asked (a job not dead, a
cancel refused, a job that does not exist, a key it read holding the wrong type).
"""

from __future__ import annotations

import functools
import json
import shutil
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import click

from .. import validate
from ..config import parse_queues
from ..errors import EmqError, UnknownJob
from ..observe import history, lanes
from ..producer.abort import abort as abort_job
from ..store.queue import Queue
from .common import (
    TENANT_OPTION,
    AdminCommand,
    CliError,
    Refused,
    Seconds,
    group_or_tenant,
    last_line,
    open_queue,
    positive_int,
    queue_options,
    run_admin,
    settings_for,
)
from .fairness import describe_rate

# -- pause / resume ----------------------------------------------------------------------

@click.command(cls=AdminCommand)
@queue_options
@click.option("--group", "-g", default=None, metavar="GROUP",
              help="pause only this group's lane (default: the whole queue)")
@click.option("--tenant", "-t", default=None, metavar="TENANT",
              help="pause every group of this tenant")
def pause(redis_url: str | None, queue: str | None, group: str | None,
          tenant: str | None) -> None:
    """Stop claims on the whole queue, one group's lane or one tenant's groups (backlog and
    running jobs stay)."""

    def verb(q: Queue) -> str:
        if tenant is not None:
            changed = q.pause_tenant(tenant)
            return f"paused tenant {tenant}" if changed else f"tenant {tenant} was already paused"
        if group is None:
            q.pause()
            return f"paused queue {q.name}"
        changed = q.pause_group(group)
        return f"paused group {group}" if changed else f"group {group} was already paused"

    click.echo(run_admin(redis_url, queue, verb, ("pause", _where(group, tenant), None)))


@click.command(cls=AdminCommand)
@queue_options
@click.option("--group", "-g", default=None, metavar="GROUP",
              help="resume only this group's lane (default: the whole queue)")
@click.option("--tenant", "-t", default=None, metavar="TENANT",
              help="resume this paused tenant's groups")
def resume(redis_url: str | None, queue: str | None, group: str | None,
           tenant: str | None) -> None:
    """Let claims run again on the whole queue, one paused group's lane or one tenant's."""

    def verb(q: Queue) -> str:
        if tenant is not None:
            changed = q.resume_tenant(tenant)
            return f"resumed tenant {tenant}" if changed else f"tenant {tenant} was not paused"
        if group is None:
            q.resume()
            return f"resumed queue {q.name}"
        changed = q.resume_group(group)
        return f"resumed group {group}" if changed else f"group {group} was not paused"

    click.echo(run_admin(redis_url, queue, verb, ("resume", _where(group, tenant), None)))


def _where(group: str | None, tenant: str | None = None) -> str:
    """What a pause or resume is aimed at, as the audit log says it."""
    if tenant is not None:
        return f"tenant {tenant}"
    return "queue" if group is None else f"group {group}"


# -- limit / weight ----------------------------------------------------------------------



@click.command(cls=AdminCommand)
@click.argument("words", nargs=-1, metavar="[GROUP] N|none")
@TENANT_OPTION
@queue_options
def limit(redis_url: str | None, queue: str | None, words: tuple[str, ...],
          tenant: str | None) -> None:
    """Set a group's (or with --tenant a tenant's) concurrency limit to N (>= 1), or clear
    it with 'none'."""
    name, text = group_or_tenant(words, tenant, "N|none")
    kind = "tenant" if tenant is not None else "group"
    value = None if text.strip().lower() == "none" else positive_int(text, f"a {kind} limit")
    run_admin(redis_url, queue, lambda q: (q.set_tenant_limit if tenant is not None
                                           else q.set_group_limit)(name, value),
              ("limit", f"{kind} {name}: {value}", None))
    click.echo(f"limit of {kind} {name} cleared" if value is None
               else f"limit of {kind} {name} set to {value}")


@click.command(cls=AdminCommand)
@click.argument("words", nargs=-1, metavar="[GROUP] W")
@TENANT_OPTION
@queue_options
def weight(redis_url: str | None, queue: str | None, words: tuple[str, ...],
           tenant: str | None) -> None:
    """Give a group W (>= 1) consecutive turns per rotation of its ring (default 1); with
    --tenant, a tenant W turns of the ring of tenants."""
    name, text = group_or_tenant(words, tenant, "W")
    kind = "tenant" if tenant is not None else "group"
    value = positive_int(text, f"a {kind} weight")
    run_admin(redis_url, queue, lambda q: (q.set_tenant_weight if tenant is not None
                                           else q.set_group_weight)(name, value),
              ("weight", f"{kind} {name}: {value}", None))
    click.echo(f"weight of {kind} {name} set to {value}")


# -- dead / requeue ----------------------------------------------------------------------

@click.command(cls=AdminCommand)
@queue_options
@click.option("--limit", "-n", "count", type=click.IntRange(1), default=100, show_default=True,
              help="show at most this many, newest first")
@click.option("--json", "as_json", is_flag=True, help="full job rows as a JSON array")
def dead(redis_url: str | None, queue: str | None, count: int, as_json: bool) -> None:
    """List dead jobs (out of attempts), newest first: id, task, group, attempts, error."""

    def verb(q: Queue) -> tuple[int, list[dict[str, Any]]]:
        return int(q.client.zcard(q.keys.dead)), q.dead_jobs(count)

    total, rows = run_admin(redis_url, queue, verb)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no dead jobs")
        return
    shown = f" (showing the newest {len(rows)})" if len(rows) < total else ""
    click.echo(f"{total} dead job{'' if total == 1 else 's'}{shown}")
    table = [(r["id"], r["task"] or "", r["group"] or "",
              f"{r['attempts']}/{r['max_attempts']}",
              f"corrupt: {r['corrupt']}" if r["corrupt"] else last_line(r["error"]))
             for r in rows]
    head = ("id", "task", "group", "attempts", "error")
    widths = [max(len(head[i]), *(len(t[i]) for t in table)) for i in range(4)]
    for line in (head, *table):
        click.echo("  ".join(c.ljust(w) for c, w in zip(line, widths)) + "  " + line[4])


@click.command(cls=AdminCommand)
@click.argument("job_id", required=False)
@queue_options
@click.option("--all", "everything", is_flag=True, help="requeue every dead job")
def requeue(redis_url: str | None, queue: str | None, job_id: str | None,
            everything: bool) -> None:
    """Bring one dead job (JOB_ID) or all of them (--all) back with fresh attempts."""
    if (job_id is None) == (not everything):
        raise CliError("requeue takes a JOB_ID or --all (exactly one of them)")

    def verb(q: Queue) -> int | str:
        n = q.requeue_dead(job_id)
        if everything or n:
            return n
        view = q.job(job_id)  # type: ignore[arg-type]
        return "missing" if view is None else view["state"]

    result = run_admin(redis_url, queue, verb, lambda n: None if isinstance(n, str) else
                       ("requeue", job_id or "all dead jobs", n))
    if isinstance(result, str):
        raise Refused(f"no job {job_id} in queue {settings_for(redis_url, queue).queue}"
                      if result == "missing" else
                      f"job {job_id} is not dead (it is {result}); nothing requeued")
    click.echo(f"requeued {result} job{'' if result == 1 else 's'}")


# -- cancel / purge ----------------------------------------------------------------------

_REFUSALS = {
    "missing": "no such job (never was, or its row expired)",
    "active": "it is running; a leased job is not interrupted",
    "finished": "it already finished (done, cancelled, expired or aborted)",
}


@click.command(cls=AdminCommand)
@click.argument("job_id")
@queue_options
def cancel(redis_url: str | None, queue: str | None, job_id: str) -> None:
    """Withdraw a job that is not running (pending, delayed or dead)."""
    verdict = run_admin(redis_url, queue, lambda q: q.cancel(job_id),
                        lambda v: ("cancel", job_id, 1) if v == "cancelled" else None)
    if verdict != "cancelled":
        raise Refused(f"job {job_id} not cancelled: {verdict}: {_REFUSALS.get(verdict, '')}"
                      .rstrip(": "))
    click.echo(f"cancelled job {job_id}")


@click.command(cls=AdminCommand)
@click.argument("job_id")
@queue_options
def abort(redis_url: str | None, queue: str | None, job_id: str) -> None:
    """Stop a job: a running one within about a second (it ends aborted), one not started
    is cancelled."""
    def verb(q: Queue) -> str:
        try:
            return str(abort_job(q, job_id))
        except UnknownJob as exc:
            raise Refused(str(exc)) from None

    verdict = run_admin(redis_url, queue, verb, lambda v: None if v == "finished" else
                        ("abort" if v == "aborting" else "cancel", job_id, 1))
    if verdict == "finished":
        raise Refused(f"job {job_id} not aborted: it already finished (done, dead, "
                      "cancelled, expired or aborted)")
    click.echo(f"{'aborting' if verdict == 'aborting' else 'cancelled'} job {job_id}")


@click.command(cls=AdminCommand)
@queue_options
@click.option("--yes", is_flag=True, help="really delete every key of the queue")
def purge(redis_url: str | None, queue: str | None, yes: bool) -> None:
    """Delete every key of the queue: jobs, lanes, results, limits, pauses, dead jobs (its
    audit log stays, and records the purge)."""
    name = settings_for(redis_url, queue).queue
    if not yes:
        raise CliError(f"purge deletes every job and setting of queue {name}: "
                       "pass --yes to do it")
    removed = run_admin(redis_url, queue, lambda q: q.purge(),
                        lambda n: ("purge", f"{n} keys", None))
    click.echo(f"purged queue {name}: {removed} key{'' if removed == 1 else 's'} removed")


# -- enqueue / job -----------------------------------------------------------------------

def _json_option(text: str, option: str, kind: type, kind_name: str) -> Any:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise CliError(f"{option} is not valid JSON: {exc}") from None
    if not isinstance(value, kind):
        raise CliError(f"{option} must be a JSON {kind_name}, not {type(value).__name__}")
    return value


@click.command(cls=AdminCommand)
@click.argument("task_name")
@queue_options
@click.option("--args", "args_json", default="[]", show_default=True, metavar="JSON",
              help="positional arguments, a JSON array")
@click.option("--kwargs", "kwargs_json", default="{}", show_default=True, metavar="JSON",
              help="keyword arguments, a JSON object")
@click.option("--group", "-g", default=None, metavar="GROUP",
              help="the lane to enqueue into [default: 'default'; a task's group function "
                   "is not known here]")
@click.option("--job-id", default=None, metavar="ID",
              help="the job's id (an id that exists already is reported as duplicate)")
@click.option("--countdown", type=Seconds(0, validate.MAX_COUNTDOWN), default=None, metavar="S",
              help="run no earlier than S seconds from now")
def enqueue(redis_url: str | None, queue: str | None, task_name: str, args_json: str,
            kwargs_json: str, group: str | None, job_id: str | None,
            countdown: float | None) -> None:
    """Enqueue a call of a task by name; prints the job id (and 'duplicate' if it existed)."""
    if not task_name.strip():
        raise CliError("the task name is empty")
    args = _json_option(args_json, "--args", list, "array")
    kwargs = _json_option(kwargs_json, "--kwargs", dict, "object")
    from ..producer.app import App

    def verb(q: Queue) -> Any:
        app = App(redis_url=settings_for(redis_url, queue).redis_url, queue=q.name)
        try:
            return app.send_task(task_name, args, kwargs, job_id=job_id, group=group,
                                 countdown=countdown)
        finally:
            app.close()

    handle = run_admin(redis_url, queue, verb, lambda h: (
        "enqueue", f"{task_name} in group {group or 'default'} as {h.id}",
        0 if h.duplicate else 1))
    click.echo(f"{handle.id} duplicate" if handle.duplicate else handle.id)


_JOB_FIELDS = ("id", "state", "task", "group", "attempts", "max_attempts", "created",
               "started", "finished", "result", "error")


@click.command(cls=AdminCommand)
@click.argument("job_id")
@queue_options
@click.option("--json", "as_json", is_flag=True, help="the job's row as a JSON object")
def job(redis_url: str | None, queue: str | None, job_id: str, as_json: bool) -> None:
    """Show one job: state, task, group, attempts, timestamps, result or error."""
    view = run_admin(redis_url, queue, lambda q: q.job(job_id))
    if view is None:
        raise Refused(f"no job {job_id} (never was, or its row expired)")
    if as_json:
        click.echo(json.dumps(view, indent=2))
        return
    for field in _JOB_FIELDS:
        value = view.get(field)
        if value is None:
            continue
        if field in ("created", "started", "finished"):
            stamp = datetime.fromtimestamp(value / 1000, timezone.utc)
            value = stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        if field == "error" and "\n" in str(value).strip():
            click.echo("error:")
            click.echo("  " + str(value).strip().replace("\n", "\n  "))
        else:
            click.echo(f"{field + ':':<13} {value}")


@click.command(cls=AdminCommand)
@functools.partial(queue_options, queue_help="queue name, or several: a,b (a:3,b:1)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--watch", is_flag=True,
              help="redraw the lane table every second (the busiest lanes; Ctrl-C stops)")
@click.option("--watch-count", type=click.IntRange(1), default=None, hidden=True)
def stats(redis_url: str | None, queue: str | None, as_json: bool, watch: bool,
          watch_count: int | None) -> None:
    """Lanes, in-flight jobs, limits, weights, pauses, delayed and dead counts (of each
    queue of a worker's -Q list)."""
    try:
        names = [s.name for s in parse_queues(queue)] if queue and "," in queue else [queue]
    except EmqError as exc:
        raise CliError(str(exc)) from None
    if watch:
        _watch(redis_url, names, watch_count)
        return
    every = [run_admin(redis_url, name, lanes.stats) for name in names]
    if as_json:
        click.echo(json.dumps(every[0] if len(every) == 1 else {"queues": every}, indent=2))
        return
    for data in every:
        _print_stats(data)


def _watch(redis_url: str | None, names: Sequence[str | None], count: int | None) -> None:
    """The live lane table: the busiest lanes of each queue, and the last minute's work,
    redrawn in place once a second."""
    from ..observe.lanetable import LaneTable  # no SCAN of the keyspace a second

    queues = [open_queue(settings_for(redis_url, name)) for name in names]
    tables = {q.name: LaneTable(q) for q in queues}
    rows = shutil.get_terminal_size((100, 30)).lines - 4
    n = 0
    try:
        while count is None or n < count:
            n += 1
            out = [time.strftime("%H:%M:%S") + "  (Ctrl-C to stop)"]
            for q in queues:
                data = tables[q.name].stats()
                last = history.report(q, 2)["minutes"]
                minute = last[-1] if last else {}
                data["groups"] = dict(sorted(data["groups"].items(),
                                             key=lambda kv: -kv[1]["pending"])
                                      [: max(3, rows // len(queues) - 4)])
                out += _stats_lines(data)
                out.append(f"this minute: {minute.get('started', 0)} started, "
                           f"{minute.get('succeeded', 0)} succeeded, "
                           f"{minute.get('retried', 0)} retried, {minute.get('dead', 0)} dead")
            click.echo("\x1b[H\x1b[J" + "\n".join(out), nl=True)
            if count is None or n < count:
                time.sleep(1.0)   # a redraw cadence, not a wait for a condition
    except KeyboardInterrupt:
        pass
    finally:
        for q in queues:
            q.client.close()


def _print_stats(data: dict[str, Any]) -> None:
    for line in _stats_lines(data):
        click.echo(line)


def _stats_lines(data: dict[str, Any]) -> list[str]:
    timed = data.get("fairness") == "time"
    out = [f"queue {data['queue']}{' (PAUSED)' if data['paused'] else ''}: "
           f"{data['pending']} pending, {data['active']} active, "
           f"{data['delayed']} delayed, {data['dead']} dead, {data['ring']} on the ring"
           f"{', fair by time' if timed else ''}"
           f"{f', {stale} stale acks' if (stale := data.get('stale_acks')) else ''}"]
    warning = (data.get("clock") or {}).get("warning")
    if warning:
        out.append(f"server clock: {warning}")
    out += [f"corrupt: {line} (emqtasks check)" for line in data.get("corrupt") or ()]
    if data["groups"]:
        out.append(f"{'group':<24} {'state':<13} {'pending':>8} {'active':>7} {'limit':>6} "
                   f"{'weight':>6} {'rate':>9}  paused"
                   f"{'    busy/1m target' if timed else ''}")
        for g, row in data["groups"].items():
            if row.get("corrupt"):   # its books cannot be read: one line saying why
                out.append(f"{g[:24]:<24} {'corrupt':<13} {row['pending']:>8}  "
                           f"{row['corrupt']}")
                continue
            limit = "-" if row["limit"] is None else row["limit"]
            line = (f"{g[:24]:<24} {row['state']:<13} {row['pending']:>8} "
                    f"{row['active']:>7} {limit!s:>6} {row['weight']:>6} "
                    f"{describe_rate(row['rate']):>9}  {'yes' if row['paused'] else ''}")
            if timed:
                line = f"{line:<87}{_pct(row.get('busy_share')):>11} " \
                       f"{_pct(row.get('target_share')):>6}"
            out.append(line)
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


@click.command("check", cls=AdminCommand)
@queue_options
@click.option("--repair", is_flag=True, help="rebuild ring, gactive and derived keys of the "
              "wrong type, bury unreadable rows in dead, restore lost jobs")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def check_command(redis_url: str | None, queue: str | None, repair: bool, as_json: bool) -> None:
    """Check the queue's invariants (exit 1 on a violation); --repair mends what it can."""
    from ..ops.check import check
    from ..ops.check import repair as do_repair

    def verb(q: Queue) -> tuple[Any, Any]:
        mended = do_repair(q) if repair else None
        return check(q), mended

    report, mended = run_admin(redis_url, queue, verb, lambda r: None if r[1] is None else (
        "repair", f"{r[1].restored} restored, {r[1].buried} buried, "
                  f"{len(r[1].rebuilt)} keys rebuilt", r[1].restored + r[1].buried))
    if as_json:
        click.echo(json.dumps({"ok": report.ok, "violations": report.violations,
                               "jobs": report.jobs, "groups": report.groups,
                               "repaired": mended._asdict() if mended else None}, indent=2))
    else:
        if mended is not None:
            click.echo(f"repaired: {mended.ringed} groups on the ring, {mended.restored} jobs "
                       f"restored, {mended.buried} unreadable jobs moved to dead, "
                       f"{len(mended.rebuilt)} keys of the wrong type rebuilt, "
                       f"{mended.workflows_failed} workflows failed at a lost step, "
                       f"{mended.uniques_freed} unique keys of ended jobs freed, "
                       f"{mended.aborts_dropped} stale abort tokens deleted")
            for line in mended.not_repaired:
                click.echo(f"not repaired: {line}")
        for line in report.violations:
            click.echo(f"violation: {line}")
        if report.stale_uniques and mended is None:
            click.echo(f"note: {len(report.stale_uniques)} unique keys name a job gone or "
                       f"ended (free for the next enqueue; --repair deletes them)")
        stale = sum(len(tokens) for tokens in report.stale_aborts.values())
        if stale and mended is None:
            click.echo(f"note: {stale} abort tokens no master will act on "
                       f"({len(report.dead_abort_lists)} lists of masters not alive; "
                       f"--repair deletes them)")
        click.echo(f"{'ok' if report.ok else 'BROKEN'}: {report.jobs} job rows, "
                   f"{report.groups} groups, {len(report.violations)} violations")
    if not report.ok:
        sys.exit(1)


COMMANDS = (pause, resume, limit, weight, dead, requeue, cancel, abort, purge, enqueue, job, stats,
            check_command)
