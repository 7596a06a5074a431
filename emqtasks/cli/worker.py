"""`emqtasks worker`: import the task modules, settle the settings, run a Master."""

from __future__ import annotations

import importlib
import logging
import os
import sys

import click
import redis

from .. import __version__
from ..app import all_apps, default_app
from ..cluster import node_kwargs
from ..config import WorkerSettings, redacted
from ..connection import connect
from ..errors import EmqError
from ..queue import Queue
from ..worker.child import every_task
from .common import AdminCommand, CliError, Seconds, open_queue, queue_options, settings_for


@click.command(cls=AdminCommand)
@click.option("-A", "--app", "modules", multiple=True, required=True,
              help="module that registers tasks (repeatable), e.g. app.tasks")
@click.option("-c", "--concurrency", type=click.IntRange(1, 512), default=None,
              help="child processes [default: number of CPUs]")
@queue_options
@click.option("--loglevel", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@click.option("--max-tasks-per-child", type=click.IntRange(0), default=0, show_default=True,
              help="replace a child after this many jobs (0: never)")
@click.option("--time-limit", type=Seconds(), default=0.0, show_default=True,
              help="stop a job after this many seconds and retry it: TimeLimitExceeded "
                   "in the task, SIGKILL of its child 1 s later (0: none; a task's own "
                   "time_limit wins)")
@click.option("--grace", type=Seconds(), default=30.0, show_default=True,
              help="seconds running jobs get to finish after SIGTERM / Ctrl-C")
@click.option("--tick", type=Seconds(0.05, 20.0), default=WorkerSettings.tick,
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
    try:
        registry = every_task()
    except EmqError as exc:
        raise CliError(str(exc)) from None
    logging.getLogger("emqtasks.worker").info(
        "emqtasks %s: queue %r, concurrency %d, %d tasks registered (%s), redis %s",
        __version__, settings.queue, wsettings.concurrency, len(registry),
        ", ".join(registry.names()), redacted(settings.redis_url))
    probe.client.close()
    from ..worker.master import Master

    url, name = settings.redis_url, settings.queue
    # Each Queue the master makes serves one thread (its main loop, its park thread, one
    # child), so each holds a single connection.
    code = Master(lambda: Queue(connect(url, single_thread=True), name), wsettings,
                  registry).run()
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


