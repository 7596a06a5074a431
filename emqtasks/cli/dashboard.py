"""``emqtasks dashboard`` (the web app) and ``emqtasks metrics`` (only /metrics): loaded only
when run, so a worker never imports the web code."""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

import click

from ..config import parse_queues
from ..errors import EmqError
from ..store.queue import Queue
from .common import AdminCommand, CliError, open_queue, settings_for

DEFAULT_PORT = 8765


def _options(fn: Any) -> Any:
    for option in reversed([
        click.option("--host", default="127.0.0.1", show_default=True,
                     help="address to bind; anything but loopback needs --token"),
        click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT,
                     show_default=True),
        click.option("-Q", "--queue", envvar="EMQ_QUEUE", default=None,
                     help="queue name, or several: a,b [env EMQ_QUEUE; default 'default']"),
        click.option("--redis-url", envvar="EMQ_REDIS_URL", default=None,
                     help="Redis URL [env EMQ_REDIS_URL]"),
        click.option("--token", envvar="EMQ_DASHBOARD_TOKEN", default=None,
                     help="require this token on every request (an operator) "
                          "[env EMQ_DASHBOARD_TOKEN]"),
        click.option("--tokens", envvar="EMQ_DASHBOARD_TOKENS", default=None,
                     metavar="NAME:ROLE:TOKEN,...|@FILE",
                     help="named tokens, role operator or viewer, or @file of them one a "
                          "line [env EMQ_DASHBOARD_TOKENS]"),
        click.option("--metrics-groups", type=click.IntRange(0, 10_000), default=50,
                     show_default=True,
                     help="emqtasks_group_pending for this many groups (most waiting)"),
    ]):
        fn = option(fn)
    return fn


def _queues(redis_url: str | None, queue: str | None) -> list[Queue]:
    try:
        names = [s.name for s in parse_queues(queue)] if queue else [None]
    except EmqError as exc:
        raise CliError(str(exc)) from None
    first = open_queue(settings_for(redis_url, names[0]))
    return [first, *(Queue(first.client, n) for n in names[1:] if n is not None)]


def _run(host: str, port: int, token: str | None, tokens: str | None, queues: list[Queue],
         read_only: bool, metrics_only: bool, top: int) -> None:
    from ..dashboard import roles
    from ..dashboard.guard import LOOPBACK_NAMES
    from ..dashboard.server import Dashboard, serve

    try:
        accounts = roles.merge(roles.parse(tokens) if tokens else [], token or None)
    except EmqError as exc:
        raise CliError(str(exc)) from None
    if host not in LOOPBACK_NAMES and not accounts:
        raise CliError(f"binding to {host} needs a token (--token or EMQ_DASHBOARD_TOKEN, "
                       f"--tokens or EMQ_DASHBOARD_TOKENS)")
    if not metrics_only:
        try:
            import jinja2  # noqa: F401
        except ImportError:
            raise CliError("the dashboard needs Jinja2: pip install 'emqtasks[dashboard]'") \
                from None
    dash = Dashboard(queues, None, read_only, metrics_only, top, accounts)
    try:
        server = serve(dash, host, port)
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc}") from None
    # The exporter's first read sums the whole retention (24 h of minutes at the 1,000-group
    # cap: about 15 s): done now, in the background, so the first scrape is not the one
    # that pays it (and times out).
    threading.Thread(target=_warm, args=(dash,), name="metrics-warm", daemon=True).start()
    what = "metrics" if metrics_only else "dashboard"
    click.echo(f"emqtasks {what} on http://{host}:{server.server_address[1]}/"
               f"{'metrics' if metrics_only else ''} (queues {', '.join(dash.queues)}"
               f"{', read-only' if read_only else ''}{', token required' if accounts else ''})")
    sys.stdout.flush()
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        dash.stopping.set()
        server.server_close()


def _warm(dash: Any) -> None:
    try:
        dash.exporter.render()
    except Exception:   # a scrape will say what is wrong; the warm-up is only a head start
        logging.getLogger("emqtasks.dashboard").debug("metrics warm-up failed", exc_info=True)


@click.command(cls=AdminCommand)
@_options
@click.option("--read-only", is_flag=True, help="show everything, change nothing")
def dashboard(host: str, port: int, queue: str | None, redis_url: str | None,
              token: str | None, tokens: str | None, metrics_groups: int,
              read_only: bool) -> None:
    """A web dashboard: lanes and fairness, jobs, dead letters, workers, enqueue, the audit
    log; /metrics too."""
    _run(host, port, token, tokens, _queues(redis_url, queue), read_only, False,
         metrics_groups)


@click.command(cls=AdminCommand)
@_options
def metrics(host: str, port: int, queue: str | None, redis_url: str | None,
            token: str | None, tokens: str | None, metrics_groups: int) -> None:
    """Serve only Prometheus /metrics (from the server's history: any number of workers)."""
    _run(host, port, token, tokens, _queues(redis_url, queue), True, True, metrics_groups)


__all__ = ["dashboard", "metrics"]
