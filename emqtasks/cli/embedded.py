"""`emqtasks embedded start|stop|status`: the bundled development server."""

from __future__ import annotations

import sys
from typing import Any

import click

from ..errors import EmqError
from .common import CliError


@click.group()
def embedded() -> None:
    """The bundled development server (EMQ_REDIS_URL=embedded or embedded:PATH)."""


def _embedded_server(path: str | None) -> Any:
    from ..ops.embedded import DEFAULT_FOLDER, EmbeddedServer, folder_of

    try:
        return EmbeddedServer(folder_of(f"embedded:{path or DEFAULT_FOLDER}"))
    except EmqError as exc:
        raise CliError(str(exc)) from None


_folder_option = click.option("--path", default=None,
                              help="folder of the server [default ./.emqtasks]")


@embedded.command("start")
@_folder_option
def embedded_start(path: str | None) -> None:
    """Start it (or find it running) and print its URL."""
    server = _embedded_server(path)
    try:
        click.echo(server.ensure())
    except EmqError as exc:
        raise CliError(str(exc)) from None


@embedded.command("stop")
@_folder_option
def embedded_stop(path: str | None) -> None:
    """Shut it down; its append-only file keeps every job for the next start."""
    server = _embedded_server(path)
    click.echo("stopped" if server.stop() else "not running")


@embedded.command("status")
@_folder_option
def embedded_status(path: str | None) -> None:
    """Say whether it runs, where, and how many keys it holds."""
    info = _embedded_server(path).status()
    if info["running"]:
        click.echo(f"running: {info['url']} (pid {info['pid']}, {info['server']}, "
                   f"{info['keys']} keys)")
    else:
        click.echo(f"not running (folder {info['folder']})")
        sys.exit(1)


