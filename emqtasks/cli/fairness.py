"""The fairness controls on the command line: fairness, rate, maxsize, defaults, lane."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import click

from ..observe import lanes
from ..store.queue import FAIRNESS_MODES, Queue
from .common import (
    TENANT_OPTION,
    AdminCommand,
    CliError,
    group_or_tenant,
    positive_int,
    queue_options,
    run_admin,
)

_RATE = re.compile(r"\s*([0-9]+)\s*/\s*([0-9]*\.?[0-9]+)\s*")
_COUNT = re.compile(r"[0-9]+")


def parse_rate(text: str) -> tuple[int, float] | None:
    """'MAX/SECONDS' -> (max_jobs, per); 'none' -> None; else a one-line error (exit 2)."""
    if text.strip().lower() == "none":
        return None
    m = _RATE.fullmatch(text)
    if not m or int(m.group(1)) < 1 or float(m.group(2)) <= 0:
        raise CliError(f"a rate is MAX/SECONDS with MAX >= 1 and SECONDS > 0 (e.g. 5/1), "
                       f"or none, not {text!r}")
    return int(m.group(1)), float(m.group(2))


def parse_count(text: str, what: str) -> int | None:
    """'N' (>= 0) or 'none'."""
    if text.strip().lower() == "none":
        return None
    if not _COUNT.fullmatch(text.strip()):
        raise CliError(f"{what} must be an integer >= 0 or none, not {text!r}")
    return int(text)


def describe_rate(rate: Any) -> str:
    return "-" if not rate else f"{rate[0]}/{rate[1]:g}s"


@click.command(cls=AdminCommand)
@click.argument("words", nargs=-1, metavar="[GROUP] MAX/SECONDS|none")
@TENANT_OPTION
@queue_options
def rate(redis_url: str | None, queue: str | None, words: tuple[str, ...],
         tenant: str | None) -> None:
    """At most MAX of GROUP's jobs (or with --tenant, of all a tenant's groups) start in any
    window of SECONDS; 'none' clears it. A tenant past its rate sits out of the ring of
    tenants until its next start is due."""
    name, text = group_or_tenant(words, tenant, "MAX/SECONDS|none")
    kind = "tenant" if tenant is not None else "group"
    value = parse_rate(text)
    args = value if value else (None, 1.0)
    run_admin(redis_url, queue, lambda q: (q.set_tenant_rate if tenant is not None
                                           else q.set_group_rate)(name, *args),
              ("rate", f"{kind} {name}: {describe_rate(value) if value else None}", None))
    click.echo(f"rate of {kind} {name} cleared" if value is None else
               f"rate of {kind} {name} set to {value[0]} per {value[1]:g}s")


@click.command(cls=AdminCommand)
@click.argument("words", nargs=-1, metavar="[GROUP] N|none")
@TENANT_OPTION
@queue_options
def maxsize(redis_url: str | None, queue: str | None, words: tuple[str, ...],
            tenant: str | None) -> None:
    """Cap GROUP's waiting jobs at N (enqueues into a full lane are refused); with --tenant,
    the jobs waiting over all a tenant's groups (N >= 1); 'none' clears."""
    name, text = group_or_tenant(words, tenant, "N|none")
    kind = "tenant" if tenant is not None else "group"
    if tenant is not None:
        value = None if text.strip().lower() == "none" else \
            positive_int(text, "a tenant lane cap")
    else:
        value = parse_count(text, "a lane cap")
    run_admin(redis_url, queue, lambda q: (q.set_tenant_max_size if tenant is not None
                                           else q.set_group_max_size)(name, value),
              ("maxsize", f"{kind} {name}: {value}", None))
    click.echo(f"lane cap of {kind} {name} cleared" if value is None else
               f"lane cap of {kind} {name} set to {value}")


@click.command(cls=AdminCommand)
@queue_options
@click.option("--limit", default=None, metavar="N|none", help="default concurrency limit")
@click.option("--rate", "rate_text", default=None, metavar="M/S|none", help="default rate")
@click.option("--max-size", default=None, metavar="N|none", help="default lane cap")
@click.option("--weight", default=None, metavar="W|none", help="default weight")
@click.option("--tenant-limit", default=None, metavar="N|none",
              help="default concurrency limit of every tenant")
@click.option("--tenant-weight", default=None, metavar="W|none",
              help="default weight of every tenant")
@click.option("--tenant-rate", default=None, metavar="M/S|none",
              help="default rate of every tenant, over all its groups")
@click.option("--tenant-max-size", default=None, metavar="N|none",
              help="default lane cap of every tenant, over all its groups")
def defaults(redis_url: str | None, queue: str | None, limit: str | None,
             rate_text: str | None, max_size: str | None, weight: str | None,
             tenant_limit: str | None, tenant_weight: str | None, tenant_rate: str | None,
             tenant_max_size: str | None) -> None:
    """Set the settings every group (or with --tenant-*, every tenant) has unless it has its
    own; alone, print them."""
    tenant_changes: dict[str, Any] = {}
    for name, text in (("limit", tenant_limit), ("weight", tenant_weight),
                       ("max_size", tenant_max_size)):
        if text is not None:
            tenant_changes[name] = None if text.strip().lower() == "none" else \
                positive_int(text, f"a default tenant {name}")
    if tenant_rate is not None:
        tenant_changes["rate"] = parse_rate(tenant_rate)
    changes: dict[str, Any] = {}
    for name, text in (("limit", limit), ("weight", weight)):
        if text is not None:
            changes[name] = None if text.strip().lower() == "none" else \
                positive_int(text, f"a default {name}")
    if max_size is not None:
        changes["max_size"] = parse_count(max_size, "a default lane cap")
    if rate_text is not None:
        changes["rate"] = parse_rate(rate_text)

    def verb(q: Queue) -> tuple[dict[str, Any], dict[str, Any]]:
        if changes:
            q.set_group_defaults(**changes)
        for name, value in tenant_changes.items():
            q.set_tenant_default(name, value)
        return q.group_defaults(), q.tenant_defaults()

    said = [f"{k}: {describe_rate(v) if k == 'rate' and v else v}" for k, v in changes.items()]
    said += [f"tenant {k}: {describe_rate(v) if k == 'rate' and v else v}"
             for k, v in tenant_changes.items()]
    current, tenants = run_admin(redis_url, queue, verb,
                                 ("defaults", ", ".join(said), None) if said else None)
    if not current:
        click.echo("no defaults set: every group is unlimited, weight 1, no rate, no cap")
    for name in ("limit", "rate", "max_size", "weight"):
        if name in current:
            shown = describe_rate(current[name]) if name == "rate" else current[name]
            click.echo(f"{name + ':':<10} {shown}")
    for name, value in tenants.items():
        shown = describe_rate(value) if name == "rate" else value
        click.echo(f"{'tenant ' + name + ':':<17} {shown}")


@click.command(cls=AdminCommand)
@click.argument("group")
@queue_options
@click.option("--json", "as_json", is_flag=True, help="the lane as a JSON object")
def lane(redis_url: str | None, queue: str | None, group: str, as_json: bool) -> None:
    """Why is GROUP's lane waiting: its state, books and effective settings."""
    view = run_admin(redis_url, queue, lambda q: lanes.lane(q, group))
    if as_json:
        click.echo(json.dumps(view, indent=2))
        return
    click.echo(f"group {group}: {view['state']}"
               f"{': ' + view['corrupt'] if view.get('corrupt') else ''}")
    if view["ready_at"] is not None:
        click.echo(f"  ready in {max(0.0, view['ready_at'] - time.time()):.1f}s")
    if view["oldest_age"] is not None:
        click.echo(f"  oldest waiting job: {view['oldest_age']:.1f}s")
    click.echo(f"  pending {view['pending']}, active {view['active']}, "
               f"paused {'yes' if view['paused'] else 'no'}")
    if view.get("tenant") is not None:
        click.echo(f"  tenant:    {view['tenant']} (emqtasks tenant {view['tenant']})")
    if view["busy_share"] is not None or view["target_share"] is not None:
        def pct(x: float | None) -> str:
            return "-" if x is None else f"{100 * x:.0f}%"
        click.echo(f"  busy time, last minute: {view['busy_s']:.1f}s, "
                   f"{pct(view['busy_share'])} of the queue's (target {pct(view['target_share'])})")
    for name in ("limit", "rate", "max_size", "weight"):
        value = describe_rate(view[name]) if name == "rate" else view[name]
        source = view[f"{name}_source"]
        click.echo(f"  {name + ':':<10} {'-' if value is None else value}"
                   f"{f'  ({source})' if source else ''}")


@click.command(cls=AdminCommand)
@click.argument("mode", required=False, metavar="[time|turns]")
@queue_options
def fairness(redis_url: str | None, queue: str | None, mode: str | None) -> None:
    """Share the workers by turns (one claim per group per turn, the default) or by time
    (each group its weight's share of the worker time); alone, print the mode."""
    if mode is not None and mode not in FAIRNESS_MODES:
        raise CliError(f"a fairness mode is 'time' or 'turns', not {mode!r}")

    def verb(q: Queue) -> str:
        if mode is not None:
            q.set_fairness(mode)
        return q.fairness()

    current = run_admin(redis_url, queue, verb,
                        ("fairness", mode, None) if mode is not None else None)
    click.echo(f"fairness: {current}" if mode is None else f"fairness set to {current}")


@click.command(cls=AdminCommand)
@click.argument("name")
@queue_options
@click.option("--json", "as_json", is_flag=True, help="the tenant as a JSON object")
def tenant(redis_url: str | None, queue: str | None, name: str, as_json: bool) -> None:
    """Why is tenant NAME waiting: its groups, backlog, jobs in flight and controls."""
    from ..observe.tenants import tenant_view

    view = run_admin(redis_url, queue, lambda q: tenant_view(q, name))
    if as_json:
        click.echo(json.dumps(view, indent=2))
        return
    state = ("empty" if not view["waiting"] else f"waits: {view['waits']}" if view["waits"]
             else "ready")
    click.echo(f"tenant {name}: {state}")
    click.echo(f"  {len(view['groups'])} groups, {view['waiting']} jobs waiting, "
               f"{view['active']} in flight, {view['groups_ready']} groups ready")
    click.echo(f"  limit:     {'-' if view['limit'] is None else view['limit']}")
    click.echo(f"  weight:    {view['weight']}")
    click.echo(f"  rate:      {describe_rate(view['rate'])}")
    click.echo(f"  max size:  {'-' if view['max_size'] is None else view['max_size']}")
    click.echo(f"  paused:    {'yes' if view['paused'] else 'no'}")
    age = view["oldest_age"]
    click.echo(f"  oldest:    {'-' if age is None else f'{age:.1f} s waiting'}")

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f}"

    for window, w in view["wait"].items():
        click.echo(f"  wait {window:>3}:  p50 {ms(w['p50_ms'])} ms, p95 {ms(w['p95_ms'])} ms, "
                   f"p99 {ms(w['p99_ms'])} ms ({w['starts']} starts)")


COMMANDS = (fairness, rate, maxsize, defaults, lane, tenant)
