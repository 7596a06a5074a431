"""``emqtasks audit``: the queue's audit log, the changes operators made (store/audit.py)."""

from __future__ import annotations

import json
import time

import click

from ..store.audit import AUDIT_DAYS, AUDIT_MAX
from .common import AdminCommand, queue_options, run_admin


@click.command(cls=AdminCommand)
@queue_options
@click.option("--limit", "-n", "count", type=click.IntRange(1, AUDIT_MAX), default=50,
              show_default=True, help="show at most this many, newest first")
@click.option("--json", "as_json", is_flag=True, help="the entries as a JSON array")
def audit(redis_url: str | None, queue: str | None, count: int, as_json: bool) -> None:
    """Who changed what (CLI and dashboard), newest first: when, who, via, action, target,
    jobs."""
    rows = run_admin(redis_url, queue, lambda q: q.audit_log(count))
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in rows], indent=2))
        return
    if not rows:
        click.echo(f"no changes recorded (kept {AUDIT_DAYS} days, at most {AUDIT_MAX:,})")
        return
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r.when / 1000))
        jobs = "" if r.jobs is None else f"  ({r.jobs} job{'' if r.jobs == 1 else 's'})"
        click.echo(f"{when}Z  {r.who:<24} {r.via:<9} {r.action:<16} {r.target}{jobs}")


COMMANDS = (audit,)
