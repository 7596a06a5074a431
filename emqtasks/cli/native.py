"""``emqtasks native path|status``: where the built module is, and who runs the hot verbs."""

from __future__ import annotations

import click
import redis

from ..config import redacted
from ..errors import EmqError
from ..native import build, module_path
from ..store.connection import connect
from ..store.selection import loaded_version, missing_hint, native_mode
from .common import AdminCommand, CliError, queue_options, settings_for


@click.group("native")
def native() -> None:
    """The native module (EMQ.* commands): its file, and whether the server has it."""


@native.command("path", cls=AdminCommand)
def path() -> None:
    """Print the built module's file (for a server's loadmodule line); exit 1 if not built."""
    built = module_path()
    if built is None:
        click.echo(f"emqtasks: the native module is not built: {why_not_built()}", err=True)
        raise SystemExit(1)
    click.echo(str(built))


def why_not_built() -> str:
    cc = build.compiler()
    if cc is None:
        return ("no C compiler was found (set CC or install gcc, then reinstall or run "
                "`python -m emqtasks.native.build`)")
    return (f"a compiler is here ({cc[0]}) but no module was built: run "
            "`python -m emqtasks.native.build` to build it and see any error")


def _built_line() -> str:
    built = module_path()
    if built is None:
        return f"built: no ({why_not_built()})"
    stale = "" if build.is_fresh(built) else " (older than its sources: rebuild it)"
    return f"built: {built}{stale}"


@native.command("status", cls=AdminCommand)
@queue_options
def status(redis_url: str | None, queue: str | None) -> None:
    """Whether the module was built, whether the server has it, and which path runs the
    verbs (EMQ_NATIVE). Exit 2 when EMQ_NATIVE=require and the server lacks it."""
    try:
        mode = native_mode()
    except EmqError as exc:
        raise CliError(str(exc)) from None
    settings = settings_for(redis_url, queue)
    click.echo(_built_line())
    click.echo(f"EMQ_NATIVE: {mode}")
    try:
        client = connect(settings.redis_url)
        version = loaded_version(client)
        client.close()
    except redis.exceptions.NoPermissionError:
        click.echo(f"server {redacted(settings.redis_url)}: this user may not run MODULE LIST")
        return
    except (redis.exceptions.RedisError, EmqError, OSError, ValueError) as exc:
        raise CliError(f"cannot reach Redis at {redacted(settings.redis_url)}: {exc}") from None
    where = f"server {redacted(settings.redis_url)}"
    if version is None:
        click.echo(f"{where}: the emq module is not loaded")
    else:
        click.echo(f"{where}: emq module loaded (version {version})")
    if mode == "require" and version is None:
        raise CliError(missing_hint())
    uses = "the Lua scripts" if mode == "off" or version is None else "the EMQ.* commands"
    click.echo(f"hot verbs: {uses}")


COMMANDS = (native,)
