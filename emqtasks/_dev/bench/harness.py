"""What the benches share: a server to run on (given, or a private one), the report as a
table or JSON, SIGTERM unwinding like Ctrl-C.

Below command.py and the benches it dispatches to, which all import it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
import redis

from ...config import redacted
from ...errors import EmqError
from ...store.connection import connect
from ..localserver import LocalRedis
from .core import Bench, BenchError, Sizes, say
from .scenarios import Row, render


@contextmanager
def bench_on(redis_url: str | None, concurrency: int, runs: int | None, quick: bool,
             title: str, detail: str = "") -> Iterator[tuple[Bench, str]]:
    """(a Bench, the Redis version) on the given server or a private one, announced under
    the title; the client and the private server are closed after."""
    server, url, version = open_server(redis_url)
    try:
        b = Bench(url, Sizes.of(concurrency, None, runs, quick), shared=server is None)
        say(f"{title}: redis {version}{detail}, {b.sizes.runs} run(s)")
        try:
            yield b, version
        finally:
            b.client.close()
    finally:
        if server is not None:
            server.close()


def report(b: Bench, rows: list[Row], version: str, title: str, as_json: bool,
           detail: str = "", extra: dict[str, Any] | None = None,
           before: list[str] | None = None) -> None:
    """The rows as JSON (with ``extra``), or as the table, after the ``before`` lines."""
    if as_json:
        click.echo(json.dumps({"redis_version": version, "notes": b.notes, **(extra or {}),
                               "figures": {r.key: r.figure for r in rows}}, indent=2))
        return
    if before:
        click.echo("\n".join(before))
        click.echo()
    click.echo(render(rows, f"{title}: redis {version}{detail}, "
                            f"median of {b.sizes.runs} run(s)"))
    for note in b.notes:
        click.echo(f"note: {note}")


def open_server(redis_url: str | None) -> tuple[LocalRedis | None, str, str]:
    """(the private server started here or None, its URL, the Redis version)."""
    try:
        server = None if redis_url else LocalRedis().start()
    except EmqError as exc:
        raise BenchError(f"cannot start a private redis-server: {exc}") from None
    url = server.url if server is not None else str(redis_url)
    try:
        probe = connect(url)
        version = str(probe.info("server").get("redis_version", "?"))
        probe.close()
    except (redis.exceptions.RedisError, ValueError, OSError) as exc:
        if server is not None:
            server.close()
        raise BenchError(f"cannot reach Redis at {redacted(url)}: {exc}") from None
    return server, url, version


def exit_on_signal(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)
