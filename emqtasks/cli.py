"""The ``emqtasks`` command: the worker and the admin verbs, with shared options in one place."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import click
import redis

from . import __version__
from .app import all_apps, connect, default_app
from .cluster import node_kwargs
from .config import Settings, WorkerSettings, redacted
from .errors import EmqError
from .queue import Queue

EXIT_USAGE = 2


class CliError(click.ClickException):
    """One line on stderr and exit code 2."""

    exit_code = EXIT_USAGE

    def show(self, file: Any = None) -> None:
        click.echo(f"emqtasks: error: {self.format_message()}", err=True)


def queue_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--redis-url and -Q, for every command (defaults: EMQ_REDIS_URL, EMQ_QUEUE)."""
    fn = click.option("--redis-url", envvar="EMQ_REDIS_URL", default=None,
                      help="Redis URL [env EMQ_REDIS_URL; default redis://127.0.0.1:6379/0]")(fn)
    fn = click.option("-Q", "--queue", envvar="EMQ_QUEUE", default=None,
                      help="queue name [env EMQ_QUEUE; default 'default']")(fn)
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
    return Queue(client, settings.queue)


@click.group()
@click.version_option(__version__, prog_name="emqtasks")
def main() -> None:
    """emqtasks: fair background tasks on Redis."""


@main.command()
@click.option("-A", "--app", "modules", multiple=True, required=True,
              help="module that registers tasks (repeatable), e.g. app.tasks")
@click.option("-c", "--concurrency", type=click.IntRange(1, 512), default=None,
              help="child processes [default: number of CPUs]")
@queue_options
@click.option("--loglevel", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@click.option("--max-tasks-per-child", type=click.IntRange(0), default=0, show_default=True,
              help="replace a child after this many jobs (0: never)")
@click.option("--time-limit", type=click.FloatRange(0), default=0.0, show_default=True,
              help="stop a job after this many seconds and retry it: TimeLimitExceeded "
                   "in the task, SIGKILL of its child 1 s later (0: none; a task's own "
                   "time_limit wins)")
@click.option("--grace", type=click.FloatRange(0), default=30.0, show_default=True,
              help="seconds running jobs get to finish after SIGTERM / Ctrl-C")
@click.option("--tick", type=click.FloatRange(0.05, 20.0), default=WorkerSettings.tick,
              show_default=True,
              help="reap expired leases and promote due jobs at least this often (s)")
def worker(modules: tuple[str, ...], concurrency: int | None, redis_url: str | None,
           queue: str | None, loglevel: str, max_tasks_per_child: int, time_limit: float,
           grace: float, tick: float) -> None:
    """Run a master and N forked children on one queue."""
    logging.basicConfig(level=loglevel.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s emqtasks[%(process)d] %(message)s")
    import_modules(modules)
    apps = [a for a in all_apps() if a.tasks and a is not default_app]
    settings = settings_for(redis_url, queue, apps[0].explicit if len(apps) == 1 else None)
    for app in {default_app, *apps}:
        # Tasks that enqueue more work reach this worker's server, and its queue unless
        # their app names one of its own.
        app.configure(redis_url=settings.redis_url,
                      queue=None if app.explicit["queue"] else settings.queue)
    probe = open_queue(settings)
    warn_about_eviction(probe)
    wsettings = WorkerSettings(concurrency=concurrency or os.cpu_count() or 1, tick=tick,
                               max_tasks_per_child=max_tasks_per_child,
                               time_limit=time_limit, grace=grace)
    from .registry import REGISTRY

    logging.getLogger("emqtasks.worker").info(
        "emqtasks %s: queue %r, concurrency %d, %d tasks registered (%s), redis %s",
        __version__, settings.queue, wsettings.concurrency, len(REGISTRY),
        ", ".join(REGISTRY.names()), redacted(settings.redis_url))
    probe.client.close()
    from .master import Master

    url, name = settings.redis_url, settings.queue
    # Each Queue the master makes serves one thread (its main loop, its park thread, one
    # child), so each holds a single connection.
    code = Master(lambda: Queue(connect(url, single_thread=True), name), wsettings).run()
    sys.exit(code)


def import_modules(modules: tuple[str, ...]) -> None:
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())   # `-A app.tasks` from the project folder, as Celery
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:
            raise CliError(f"cannot import module {name!r}: {type(exc).__name__}: {exc}") \
                from None


def warn_about_eviction(queue: Queue) -> None:
    # On a cluster: the node that serves the queue's slot (cluster.node_kwargs).
    near = node_kwargs(queue.client, queue.keys.ring)
    try:
        policy = queue.client.config_get("maxmemory-policy", **near).get("maxmemory-policy")
    except redis.exceptions.RedisError:
        # CONFIG is often disabled on managed servers, and not granted by the worker's
        # least-privilege ACL (emqtasks.acl): INFO memory tells the policy too.
        try:
            info = queue.client.info("memory", **near)
        except redis.exceptions.RedisError:
            logging.getLogger("emqtasks.worker").info(
                "cannot read maxmemory-policy (CONFIG GET and INFO refused): make sure it "
                "is 'noeviction'")
            return
        if "maxmemory_policy" not in info and len(info) == 1:   # {node: {...}}
            info = next(iter(info.values()))
        policy = info.get("maxmemory_policy") if isinstance(info, dict) else None
    if policy and policy != "noeviction":
        logging.getLogger("emqtasks.worker").warning(
            "maxmemory-policy is %r: Redis may evict queue keys and lose jobs; "
            "set it to 'noeviction'", policy)


def run_admin(redis_url: str | None, queue: str | None, verb: Callable[[Queue], Any]) -> Any:
    q = open_queue(settings_for(redis_url, queue))
    try:
        return verb(q)
    except EmqError as exc:
        raise CliError(str(exc)) from None
    except redis.exceptions.RedisError as exc:
        raise CliError(f"Redis error: {exc}") from None
    finally:
        q.client.close()


@main.group()
def embedded() -> None:
    """The bundled development server (EMQ_REDIS_URL=embedded or embedded:PATH)."""


def _embedded_server(path: str | None) -> Any:
    from .embedded import DEFAULT_FOLDER, EmbeddedServer, folder_of

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
        click.echo(f"running: {info['url']} (pid {info['pid']}, redis {info['version']}, "
                   f"{info['keys']} keys)")
    else:
        click.echo(f"not running (folder {info['folder']})")
        sys.exit(1)


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                "help_option_names": []})
@click.pass_context
def demo(ctx: click.Context) -> None:
    """Watch a flood from one tenant not starve the others (embedded server by default)."""
    # Imported only when run: its tasks must not be registered in every worker.
    from .demo import demo as command

    command.main(ctx.args, prog_name="emqtasks demo")

# The admin verbs and the benchmark live in their own modules and register on `main`.
from . import bench, cli_admin  # noqa: E402,F401

main.add_command(bench.bench)

if __name__ == "__main__":  # pragma: no cover
    # Run the package's copy of the group (`python -m emqtasks.cli` would otherwise run this
    # file as a second module, on which the other modules registered nothing).
    from emqtasks.cli import main as package_main

    package_main()
