"""`emqtasks doctor`: the server and queue checks to run before going live (emqtasks.ops.doctor)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import Any

import click
import redis

from ..config import redacted
from ..errors import EmqError
from ..store.durable import parse_durable
from .common import AdminCommand, CliError, open_queue, queue_options, settings_for

ROLE_CHOICE = click.Choice(["any", "producer", "worker"])


@click.command(cls=AdminCommand)
@queue_options
@click.option("--role", type=ROLE_CHOICE, default="any", show_default=True,
              help="the role this URL's user must be fit for (any: at least one)")
@click.option("--skip", multiple=True, metavar="CHECK",
              help="leave a check out (repeatable), e.g. --skip invariants on a huge queue")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--durable", "durable_text", envvar="EMQ_DURABLE", metavar="SETTING",
              help="the durable setting to judge: 1, 0 or replicas=N,timeout=S,aof=0|1 "
                   "[env EMQ_DURABLE]")
def doctor(redis_url: str | None, queue: str | None, role: str, skip: tuple[str, ...],
           as_json: bool, durable_text: str | None) -> None:
    """Check the server and the queue before going live: exit 1 if something would lose jobs
    or stop the worker."""
    from ..ops.doctor import CHECKS, run, worst

    unknown = sorted(set(skip) - {name for name, _ in CHECKS})
    if unknown:
        raise CliError(f"--skip: no check named {', '.join(unknown)} (checks: "
                       f"{', '.join(repr(name) for name, _ in CHECKS)})")
    settings = settings_for(redis_url, queue)
    try:
        durable = parse_durable(durable_text or "")
    except EmqError as exc:
        raise CliError(str(exc)) from None
    q = open_queue(settings)
    try:
        findings = run(q, role=role, skip=skip, durable=durable)
    except redis.exceptions.RedisError as exc:   # the server went away mid-way
        raise CliError(f"Redis error: {exc}") from None
    finally:
        q.client.close()
    verdict = worst(findings)
    if as_json:
        click.echo(json.dumps({"url": redacted(settings.redis_url), "queue": settings.queue,
                               "role": role, "ok": verdict != "error",
                               "findings": [asdict(f) for f in findings]}, indent=2))
    else:
        _print_report(redacted(settings.redis_url), settings.queue, findings)
    sys.exit(1 if verdict == "error" else 0)


def _print_report(url: str, queue: str, findings: list[Any]) -> None:
    click.echo(f"emqtasks doctor: {url}, queue {queue}\n")
    width = max([len("check"), *(len(f.name) for f in findings)])
    click.echo(f"{'check':<{width}}  {'status':<6}  finding")
    for f in findings:
        click.echo(f"{f.name:<{width}}  {f.status.upper() if f.status == 'error' else f.status:<6}"
                   f"  {f.message}")
    fixes: dict[tuple[str, str], list[str]] = {}   # one line per change, naming its checks
    for f in findings:
        if f.fix and f.status in ("warn", "error"):
            fixes.setdefault((f.status, f.fix), []).append(f.name)
    if fixes:
        click.echo("\nWhat to change:")
        for (status, fix), names in sorted(fixes.items(), key=lambda kv: kv[0][0] != "error"):
            click.echo(f"  {status} {', '.join(names)}: {fix}")
    errors = sum(f.status == "error" for f in findings)
    warnings = sum(f.status == "warn" for f in findings)
    click.echo(f"\n{errors} error(s), {warnings} warning(s): " + (
        "fix the errors before going live." if errors else "nothing here would lose jobs "
        "or stop the worker."))
