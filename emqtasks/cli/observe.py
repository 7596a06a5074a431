"""Seeing it run: ``emqtasks workers`` (the live masters, from their heartbeats)."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from ..store.queue import Queue
from .common import AdminCommand, queue_options, run_admin


@click.command(cls=AdminCommand)
@queue_options
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def workers(redis_url: str | None, queue: str | None, as_json: bool) -> None:
    """The live workers of the queue: host, pid, queues, busy / concurrency, version, uptime."""

    def verb(q: Queue) -> list[dict[str, Any]]:
        return q.workers()

    rows = run_admin(redis_url, queue, verb)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no live workers")
        return
    click.echo(f"{'host':<20} {'pid':>7} {'busy':>9} {'version':<8} {'up':>8}  queues")
    now = time.time()
    for w in rows:
        busy = f"{w.get('busy', 0)}/{w.get('concurrency', 0)}"
        up = _duration(now - float(w.get("started", now)))
        click.echo(f"{str(w.get('host', ''))[:20]:<20} {w.get('pid', ''):>7} {busy:>9} "
                   f"{str(w.get('version', ''))[:8]:<8} {up:>8}  "
                   f"{','.join(w.get('queues', []))}")


def _duration(s: float) -> str:
    s = max(0, int(s))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


COMMANDS = (workers,)
