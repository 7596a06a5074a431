"""`emqtasks worker`: import the task modules, settle the settings, run a Master."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import os
import sys
import time
from typing import Any

import click
import redis

from .. import __version__
from ..config import DEFAULT_QUEUE, Settings, WorkerSettings, redacted
from ..errors import EmqError
from ..producer.app import App, all_apps, default_app
from ..producer.context import install_log_fields
from ..producer.registry import Registry
from ..schedules.schedule import Schedule, ScheduleStore, deferred, register_declared
from ..store.cluster import node_kwargs
from ..store.connection import connect
from ..store.durable import Durable, parse_durable
from ..store.queue import Queue
from ..worker import logs
from ..worker.queues import QueueSpec, parse_queues
from ..worker.resilience import Outage
from ..worker.runner import every_hook, every_task
from .common import AdminCommand, CliError, Seconds, open_queue, queue_options, settings_for


@click.command(cls=AdminCommand)
@click.option("-A", "--app", "modules", multiple=True,
              help="module that registers tasks (repeatable), e.g. app.tasks")
@click.option("--django", is_flag=True,
              help="set Django up first (DJANGO_SETTINGS_MODULE) and import the tasks "
                   "module of every installed app; settings.EMQTASKS configures the worker")
@click.option("-c", "--concurrency", type=click.IntRange(1, 512), default=None,
              help="child processes [default: number of CPUs]")
@functools.partial(queue_options, queue_help="queue(s) to serve: a name; a,b,c in strict "
                                           "order; a:3,b:1 by weight")
@click.option("--async-concurrency", type=click.IntRange(1, 1000), default=1,
              show_default=True,
              help="async jobs one child runs at once (sync jobs: one at a time)")
@click.option("-l", "--loglevel", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@click.option("--log-format", envvar="EMQ_LOG_FORMAT", default="text", show_default=True,
              type=click.Choice(["text", "json"], case_sensitive=False),
              help="text lines, or one JSON object per line with the job's fields "
                   "[env EMQ_LOG_FORMAT]")
@click.option("--max-tasks-per-child", type=click.IntRange(0), default=0, show_default=True,
              help="replace a child after this many jobs (0: never)")
@click.option("--time-limit", type=Seconds(), default=0.0, show_default=True,
              help="stop a job after this many seconds and retry it: TimeLimitExceeded "
                   "in the task, SIGKILL of its child 1 s later (0: none; a task's own "
                   "time_limit wins)")
@click.option("--grace", type=Seconds(), default=30.0, show_default=True,
              help="seconds running jobs get to finish after SIGTERM / Ctrl-C")
@click.option("--abort-grace", type=Seconds(), default=WorkerSettings.abort_grace,
              show_default=True,
              help="seconds an aborted job gets to return before its child is killed and "
                   "replaced (a task's own abort_grace wins)")
@click.option("--tick", type=Seconds(0.05, 20.0), default=WorkerSettings.tick,
              show_default=True,
              help="reap expired leases and promote due jobs at least this often (s)")
def worker(modules: tuple[str, ...], django: bool, concurrency: int | None,
           redis_url: str | None, queue: str | None, async_concurrency: int, loglevel: str,
           log_format: str, max_tasks_per_child: int, time_limit: float, grace: float,
           abort_grace: float, tick: float) -> None:
    """Run a master and N forked children on one queue, or several (-Q high,low)."""
    if not modules and not django:
        raise CliError("worker: give the task modules (-A app.tasks) or --django "
                       "(see 'emqtasks worker --help')")
    try:
        parse_durable(os.environ.get("EMQ_DURABLE") or "")   # one line, not a traceback
    except EmqError as exc:
        raise CliError(str(exc)) from None
    install_log_fields()   # %(emq_job_id)s / %(emq_task)s in any log format
    logs.configure(log_format.lower(), loglevel)
    with deferred():   # App.schedule in a module declares; stored below, on the final queue
        base = setup_django() if django else None
        import_modules(modules)
        prepare_celery()
    apps = [a for a in all_apps() if a.tasks and a is not default_app]
    if base is None:
        base = apps[0].explicit if len(apps) == 1 else {}
    specs = queue_specs(queue if queue is not None else base.get("queue"))
    settings = settings_for(redis_url, specs[0].name, base)
    for app in {default_app, *apps}:
        # Tasks that enqueue more work reach this worker's server, and its queue unless
        # their app names one of its own.
        app.configure(redis_url=settings.redis_url,
                      queue=None if app.explicit["queue"] else settings.queue)
    probe = open_queue(settings)
    warn_about_eviction(probe)
    hot_path = which_hot_path(probe)
    wsettings = WorkerSettings(concurrency=concurrency or os.cpu_count() or 1, tick=tick,
                               max_tasks_per_child=max_tasks_per_child,
                               time_limit=time_limit, grace=grace,
                               async_concurrency=async_concurrency,
                               abort_grace=abort_grace)
    try:
        registry = every_task()
        # Idempotent, so a dropped connection is simply tried again (for up to 30 s).
        give_up = time.monotonic() + 30
        Outage(logging.getLogger("emqtasks.worker"), "start",
               stop=lambda: time.monotonic() > give_up).call(register_schedules, probe, registry)
    except EmqError as exc:
        raise CliError(str(exc)) from None
    except redis.exceptions.RedisError as exc:
        raise CliError(f"cannot store the schedules: {exc}") from None
    logging.getLogger("emqtasks.worker").info(
        "emqtasks %s: %s %s, concurrency %d%s, %d tasks registered (%s), redis %s, %s",
        __version__, "queue" if len(specs) == 1 else "queues", describe_queues(specs),
        wsettings.concurrency,
        f" (async {async_concurrency} per child)" if async_concurrency > 1 else "",
        len(registry), ", ".join(registry.names()), redacted(settings.redis_url), hot_path)
    probe.client.close()
    sys.exit(run_master(settings.redis_url, specs, wsettings, registry))


def queue_specs(text: str | None) -> list[QueueSpec]:
    try:
        return parse_queues(DEFAULT_QUEUE if text is None else text)
    except EmqError as exc:
        raise CliError(str(exc)) from None


def describe_queues(specs: list[QueueSpec]) -> str:
    if len(specs) == 1:
        return repr(specs[0].name)
    if specs[0].weight is None:
        return ", ".join(s.name for s in specs) + " (strict order)"
    return ", ".join(f"{s.name}:{s.weight}" for s in specs) + " (by weight)"


def worker_durable() -> Durable | None:
    """The durable setting of a worker's writes: the first App served that has one (an
    App's falls back to EMQ_DURABLE), else EMQ_DURABLE."""
    for app in all_apps():
        if app.settings.durable is not None:
            return app.settings.durable
    return Settings.from_env().durable


def run_master(url: str, specs: list[QueueSpec], wsettings: WorkerSettings,
               registry: Any) -> int:
    from ..worker.master import Master

    names = [s.name for s in specs]
    weights = [s.weight for s in specs if s.weight is not None] or None
    durable = worker_durable()

    def make_queues() -> list[Queue]:
        # Each call serves one thread (the master's main loop, a park thread, one child):
        # one connection, shared by the Queue of every -Q name.
        client = connect(url, single_thread=True)
        queues = [Queue(client, name) for name in names]
        for q in queues:
            q.durable = durable   # the ack that stores a result, a schedule's firing
        return queues

    try:
        hooks = every_hook()
    except EmqError as exc:
        raise CliError(str(exc)) from None
    return Master(make_queues, wsettings, registry, hooks, weights).run()


def setup_django() -> dict[str, Any]:
    """--django: the settings settings.EMQTASKS gave the default App (contrib.django)."""
    add_project_path()   # DJANGO_SETTINGS_MODULE=mysite.settings from the project folder
    from ..contrib.django import worker as django_worker

    try:
        return django_worker.setup()
    except EmqError as exc:
        raise CliError(str(exc)) from None
    except Exception as exc:   # a tasks module that fails to import
        raise CliError(f"--django: {type(exc).__name__}: {exc}") from None


def add_project_path() -> None:
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())   # `-A app.tasks` from the project folder, as Celery


def import_modules(modules: tuple[str, ...]) -> None:
    """Import each -A module. As Celery's -A: ``module:attribute`` names an App in a
    module, and a package that holds no App of its own has its ``celery`` submodule
    imported too (``-A proj`` for proj/celery.py)."""
    add_project_path()
    for name in modules:
        module, _, attribute = name.partition(":")
        try:
            imported = importlib.import_module(module)
            if attribute and not isinstance(getattr(imported, attribute, None), App):
                raise CliError(f"-A {name}: {module} has no App named {attribute!r}")
            if not attribute and hasattr(imported, "__path__") and not any(
                    isinstance(v, App) for v in vars(imported).values()) \
                    and importlib.util.find_spec(f"{module}.celery") is not None:
                importlib.import_module(f"{module}.celery")
        except CliError:
            raise
        except Exception as exc:
            raise CliError(f"cannot import module {name!r}: {type(exc).__name__}: {exc}") \
                from None


def prepare_celery() -> None:
    """For the Celery apps (emqtasks.celery) of the modules imported, if any: their tasks
    modules (include, autodiscover_tasks) and their beat_schedule."""
    if "emqtasks.celery" not in sys.modules:
        return
    from ..celery import worker as celery_worker

    try:
        celery_worker.prepare()
    except EmqError as exc:
        raise CliError(str(exc)) from None
    except Exception as exc:   # a tasks module that fails to import
        raise CliError(f"cannot import a tasks module: {type(exc).__name__}: {exc}") from None


def register_schedules(queue: Queue, registry: Registry) -> None:
    """Store the schedules the modules declare for this queue (the queue of their task,
    else the worker's), and note the worker's tasks on the queue for the CLI."""
    specs = {name: t.spec for name, t in registry.tasks().items()}
    declared = [s for app in all_apps() for s in app.declared_schedules.values()
                if _queue_of(app, s, specs) in (None, queue.name)]
    changed, dropped = register_declared(ScheduleStore(queue), declared, specs)
    if declared or dropped:
        logging.getLogger("emqtasks.worker").info(
            "schedules declared in code: %d (%s)%s%s", len(declared),
            ", ".join(sorted(s.name for s in declared)) or "none",
            f"; stored or changed: {', '.join(changed)}" if changed else "",
            f"; no longer declared, removed: {', '.join(dropped)}" if dropped else "")


def _queue_of(app: App, s: Schedule, specs: dict[str, Any]) -> str | None:
    """The queue a declared schedule's jobs go to: its own (Celery's beat options), else
    its task's (None: the worker's; an unknown task is None, refused by the store)."""
    own = app.declared_queues.get(s.name)
    if own is not None:
        return own
    return specs[s.task].queue if s.task in specs else None


def which_hot_path(queue: Queue) -> str:
    """Which path will run the hot verbs, learnt by the first promote (which every start
    runs anyway); EMQ_NATIVE=require without the module stops the worker here (exit 2)."""
    try:
        queue.promote_and_look()
    except EmqError as exc:
        raise CliError(str(exc)) from None
    except redis.exceptions.RedisError as exc:
        raise CliError(f"Redis error: {exc}") from None
    return "native module (EMQ.* commands)" if queue.hot.native else "Lua scripts"


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


