"""What every command shares: the one-line error, --redis-url / -Q, opening a queue."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import click
import redis

from .. import validate
from ..config import Settings, redacted
from ..errors import CorruptKey, EmqError, InvalidArgument
from ..store.audit import cli_user
from ..store.connection import connect
from ..store.queue import Queue

EXIT_USAGE = 2
_POSITIVE = re.compile(r"[0-9]+")


class CliError(click.ClickException):
    """One line on stderr and exit code 2."""

    exit_code = EXIT_USAGE

    def show(self, file: Any = None) -> None:
        click.echo(f"emqtasks: error: {self.format_message()}", err=True)


class Refused(CliError):
    """The verb ran, but the thing asked for is not so (not dead, not cancellable, no job)."""

    exit_code = 1


class AdminCommand(click.Command):
    """A command whose usage errors (missing argument, unknown option, bad option value) are
    one line too, exit 2: every command but the groups and the dev commands."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise CliError(f"{ctx.info_name}: {exc.format_message()} "
                           f"(see '{ctx.command_path} --help')") from None


class Seconds(click.types.FloatParamType):
    """A number of seconds on the command line, checked by emqtasks.validate: finite (click's
    FloatRange lets nan and inf through) and within [low, high]."""

    name = "seconds"

    def __init__(self, low: float = 0.0, high: float = validate.MAX_DURATION) -> None:
        self.low, self.high = low, high

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        try:
            number = super().convert(value, param, ctx)
        except click.BadParameter:
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        try:
            return validate.seconds(number, "it", low=self.low, high=self.high)
        except InvalidArgument as exc:
            self.fail(str(exc).removeprefix("it "), param, ctx)


def queue_options(fn: Callable[..., Any], queue_help: str = "queue name") -> Callable[..., Any]:
    """--redis-url and -Q, for every command (defaults: EMQ_REDIS_URL, EMQ_QUEUE)."""
    fn = click.option("--redis-url", envvar="EMQ_REDIS_URL", default=None,
                      help="Redis URL [env EMQ_REDIS_URL; default redis://127.0.0.1:6379/0]")(fn)
    fn = click.option("-Q", "--queue", envvar="EMQ_QUEUE", default=None,
                      help=f"{queue_help} [env EMQ_QUEUE; default 'default']")(fn)
    return fn


def settings_for(redis_url: str | None, queue: str | None,
                 base: dict[str, Any] | None = None) -> Settings:
    base = base or {}
    try:
        return Settings.from_env({}, redis_url=redis_url or base.get("redis_url"),
                                 queue=queue if queue is not None else base.get("queue"))
    except EmqError as exc:
        raise CliError(str(exc)) from None


def open_queue(settings: Settings) -> Queue:
    """A queue on a server known to answer; a clear error naming the URL if it does not."""
    try:
        client = connect(settings.redis_url)
        client.ping()
    except (redis.exceptions.RedisError, ValueError, OSError) as exc:
        raise CliError(f"cannot reach Redis at {redacted(settings.redis_url)}: {exc}") from None
    except EmqError as exc:
        raise CliError(str(exc)) from None
    return Queue(client, settings.queue)


#: What the audit log records of a change (store/audit.py): (action, target, jobs), or a
#: function of the verb's result giving it (None: nothing changed, nothing recorded).
Audit = tuple[str, str, "int | None"] | Callable[[Any], "tuple[str, str, int | None] | None"]


def run_admin(redis_url: str | None, queue: str | None, verb: Callable[[Queue], Any],
              audit: Audit | None = None) -> Any:
    """Run ``verb`` on the queue; with ``audit``, record the change it made in the queue's
    audit log as this OS user at this host."""
    q = open_queue(settings_for(redis_url, queue))
    try:
        result = verb(q)
        entry = audit(result) if callable(audit) else audit
        if entry is not None:
            try:
                q.audit(cli_user(), "cli", *entry)
            except CorruptKey as exc:
                raise Refused(f"{entry[0]} done, but not recorded in the audit log: "
                              f"{exc}") from None
        return result
    except CorruptKey as exc:   # the verb ran, but a key it read is spoilt: exit 1
        raise Refused(str(exc)) from None
    except EmqError as exc:
        raise CliError(str(exc)) from None
    except redis.exceptions.RedisError as exc:
        raise CliError(f"Redis error: {exc}") from None
    finally:
        q.client.close()


def positive_int(text: str, what: str) -> int:
    """A decimal integer >= 1 from a command-line word, or a one-line error (exit 2)."""
    if not _POSITIVE.fullmatch(text.strip()) or int(text) < 1:
        raise CliError(f"{what} must be an integer >= 1, not {text!r}")
    return int(text)


def last_line(error: str | None) -> str:
    lines = (error or "").strip().splitlines()
    return lines[-1].strip() if lines else ""


#: --tenant on limit, weight, rate and maxsize: the tenant's control instead of a group's.
TENANT_OPTION = click.option("--tenant", "-t", default=None, metavar="TENANT",
                             help="the tenant's, over all its groups, instead of a group's")


def group_or_tenant(words: tuple[str, ...], tenant: str | None, value: str) -> tuple[str, str]:
    """(group or tenant, the value's text) of ``GROUP VALUE`` or ``--tenant T VALUE``."""
    if len(words) != (1 if tenant is not None else 2):
        ctx = click.get_current_context()
        what = "Missing argument" if len(words) < (1 if tenant is not None else 2) else \
            "Got unexpected extra argument"
        raise CliError(f"{ctx.info_name}: {what}: give "
                       f"{'--tenant TENANT ' if tenant is not None else 'GROUP '}{value} "
                       f"(see '{ctx.command_path} --help')")
    return (tenant, words[0]) if tenant is not None else (words[0], words[1])
