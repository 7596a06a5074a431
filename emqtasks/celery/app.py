"""``Celery``: an emqtasks App built and configured as a Celery app, and ``shared_task``.

``Celery("proj", broker=url)`` is an App on that Redis; ``app.conf`` takes Celery's setting
names (celery/conf.py); ``@app.task`` takes Celery's options and Celery's defaults: no
automatic retry unless ``autoretry_for``, ``max_retries=3``, ``default_retry_delay`` 3
minutes (``task_default_retry_delay``). Settings that shape tasks (task_routes, the time
limits, result_expires...) apply to the app's tasks whenever they are set, as Celery reads
them lazily.

``shared_task`` registers on the current Celery app (the last one made); made before any,
its task waits on a stand-in app and moves to the first Celery app made after it.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from ..errors import ConfigError, InvalidArgument
from ..producer.app import App, _module_name
from ..producer.result import AsyncResult as _AsyncResult
from ..producer.task import JobHandle
from ..store.durable import Durable
from ..workflows.canvas import Signature
from . import beat, conf, routes
from .canvas import signature
from .task import Task, on_dead, on_retried, on_succeeded

log = logging.getLogger("emqtasks.worker")

#: Constructor arguments of Celery's that have no meaning here, and what to do instead.
_REFUSED_ARGS = {
    "loader": "there is no loader: the worker imports -A and what autodiscover_tasks names",
    "amqp": "there is no AMQP: emqtasks runs on Redis",
    "events": "there are no events: 'emqtasks dashboard' and the hooks",
    "log": "the worker configures logging (--loglevel, --log-format)",
    "control": "'emqtasks workers' / 'emqtasks cancel' replace remote control",
    "fixups": "--django (or app.autodiscover_tasks()) sets Django up",
    "task_cls": "give base= on each @app.task",
    "strict_typing": "a call's arguments are always checked against the function",
}
_current: list[Celery] = []
_stand_in: list[Celery] = []


class Celery(App):
    """An App made as a Celery app: ``Celery("proj", broker="redis://...")``."""

    #: Celery's ``app.Task``, the base class of the app's tasks (``class T(app.Task)``).
    Task = Task

    def __init__(self, main: str | None = None, *, broker: str | None = None,
                 backend: str | None = None, include: Iterable[str] | None = None,
                 config_source: Any = None, set_as_current: bool = True,
                 changes: dict[str, Any] | None = None, **settings: Any) -> None:
        for key in settings:
            why = _REFUSED_ARGS.get(key)
            if why:
                raise InvalidArgument(f"Celery({key}=...) has no meaning in emqtasks: {why}")
        super().__init__()
        self.main = main
        self._routes: routes.Routes = ()
        self._discover: list[tuple[list[str] | None, str]] = []
        #: task name -> (its Task, the options its decorator and base class gave)
        self._celery_tasks: dict[str, tuple[Task, dict[str, Any]]] = {}
        self.conf = conf.Conf(self._check_setting, self._settings_changed)
        #: Celery's signals of a configured app, sent by the worker before it reads the
        #: beat schedule (``@app.on_after_configure.connect`` adding periodic tasks)
        self.on_after_configure = Signal()
        self.on_after_finalize = Signal()
        # As Celery's: other keyword arguments (and changes=) are settings, checked as such
        # (Celery(..., task_acks_late=True)); the environment's CELERY_BROKER_URL wins
        self.conf.update({**(changes or {}), **settings,
                          **{k: v for k, v in (("broker_url", broker), ("result_backend", backend),
                                               ("include", include)) if v is not None}})
        if conf.from_environment("broker_url") is not None:
            self._settings_changed({"broker_url"})
        if config_source is not None:
            self.config_from_object(config_source)
        for event, handler in (("task_succeeded", on_succeeded), ("task_retried", on_retried),
                               ("task_dead", on_dead)):
            self.hooks.add(event, handler)   # one function for every app: merged once
        if set_as_current:
            self.set_current()

    def __repr__(self) -> str:
        return f"<Celery {self.main or '__main__'}>"

    # -- configuration ------------------------------------------------------------------
    def config_from_object(self, obj: Any, namespace: str | None = None,
                           silent: bool = False, force: bool = False) -> None:
        """Celery's settings from a module, object, mapping or dotted path
        (``"django.conf:settings"`` with ``namespace="CELERY"`` reads ``CELERY_BROKER_URL``
        ...). All are checked before any is set."""
        try:
            found = conf.settings_of(obj, namespace)
        except ConfigError:
            if silent:
                return
            raise
        self.conf.update(found)

    def _check_setting(self, key: str, value: Any) -> Any:
        if key == "task_routes":
            routes.parse_routes(value)
        elif key == "beat_schedule":
            beat.check_beat_schedule(value)
        return conf.check_setting(key, value)

    def _settings_changed(self, keys: set[str]) -> None:
        if keys & {"broker_url", "task_default_queue"}:
            # the App's own settings: what the worker serves, and where sends go
            self._explicit["redis_url"] = self.conf.broker_url
            self._explicit["queue"] = self.conf.task_default_queue
            self._settings = None
            self.close()
        if "task_routes" in keys:
            self._routes = routes.parse_routes(self.conf.task_routes)
        for name, (t, given) in self._celery_tasks.items():
            t.spec = dataclasses.replace(t.spec, **self._from_settings(name, given))

    def set_current(self) -> None:
        """Make this the app ``shared_task`` registers on; a stand-in's tasks move here."""
        _current.append(self)
        for stand_in in _stand_in:
            for name, (t, given) in list(stand_in._celery_tasks.items()):
                del stand_in._celery_tasks[name]
                stand_in.registry.remove(name)
                t.app = self
                self.registry.add(t)
                self._celery_tasks[name] = (t, given)
        self._settings_changed(set())

    # -- tasks --------------------------------------------------------------------------
    def task(self, *args: Any, **options: Any) -> Any:
        """``@app.task``, ``@app.task(bind=True, base=MyTask, ...)``: Celery's options (and
        ours), with Celery's defaults (see the module)."""
        options.pop("shared", None)   # Celery's: every task here is found by its name
        base = options.pop("base", None) or self.Task
        if not (isinstance(base, type) and issubclass(base, Task)):
            raise InvalidArgument(f"base= is a subclass of emqtasks.celery.Task, not {base!r}")
        given = {**base.class_options(), **options}
        if given.get("serializer") in conf.JSON:   # what is so here: harmless
            del given["serializer"]
        retry_kwargs = given.pop("retry_kwargs", None) or {}
        for key, value in dict(retry_kwargs).items():
            ours = {"max_retries": "max_retries", "countdown": "default_retry_delay"}.get(key)
            if ours is None:
                raise InvalidArgument(f"retry_kwargs {key!r} has no meaning here (max_retries "
                                      f"and countdown have)")
            given.setdefault(ours, value)

        def register(fn: Callable[..., Any]) -> Task:
            name = given.get("name") or f"{_module_name(fn)}.{fn.__qualname__}"
            made: Task = self._task(fn, {**_celery_defaults(given), **given,
                                         **self._from_settings(name, given)}, base)
            self._celery_tasks[made.name] = (made, given)
            return made

        if len(args) == 1 and callable(args[0]):   # @app.task, app.task(fn, name=...)
            return register(args[0])
        if args:
            raise TypeError("app.task takes the function, or keyword options only")
        return register

    def _from_settings(self, name: str, given: dict[str, Any]) -> dict[str, Any]:
        """The TaskSpec fields the app's settings give a task (those its options do not)."""
        c = self.conf
        out: dict[str, Any] = {}
        if "queue" not in given:
            out["queue"] = routes.route(self._routes, name)
        if "time_limit" not in given:
            out["time_limit"] = c.task_time_limit
        if "soft_time_limit" not in given:
            out["soft_time_limit"] = c.task_soft_time_limit
        if not {"default_retry_delay", "retry_delay"} & set(given):
            out["retry_delay"] = c.task_default_retry_delay
        if not {"result_ttl", "ignore_result"} & set(given):
            out["result_ttl"] = 0 if c.task_ignore_result else conf.check_setting(
                "result_expires", c.result_expires)
        return out

    def send_task(self, name: Any, args: Iterable[Any] | None = (),
                  kwargs: dict[str, Any] | None = None, *, task_id: str | None = None,
                  job_id: str | None = None, queue: str | None = None,
                  countdown: float | None = None, eta: datetime | float | None = None,
                  group: str | None = None, priority: int = 0,
                  expires: datetime | float | None = None,
                  durable: bool | Durable | None = None,
                  tenant: str | None = None, unique_key: str | None = None,
                  unique_for: float | None = None, debounce: float | None = None,
                  debounce_max: float | None = None) -> JobHandle[Any]:
        """Celery's send_task: by name, routed by task_routes when no queue is given."""
        if queue is None and isinstance(name, str):
            queue = routes.route(self._routes, name)
        return super().send_task(name, args or (), kwargs, job_id=job_id or task_id,
                                 group=group, countdown=countdown, eta=eta, queue=queue,
                                 priority=priority, expires=expires, durable=durable,
                                 tenant=tenant, unique_key=unique_key,
                                 unique_for=unique_for, debounce=debounce,
                                 debounce_max=debounce_max)

    def signature(self, name: str, args: Iterable[Any] = (),
                  kwargs: dict[str, Any] | None = None, **options: Any) -> Signature:
        return signature(name, args, kwargs, app=self, **options)

    def start(self, argv: Iterable[str] | None = None) -> None:
        """Celery's ``app.start()`` in a script (``python myapp.py worker -l INFO``): this
        process becomes the emqtasks command line (exec), ``worker`` given ``-A`` the script
        (its folder on PYTHONPATH), so the worker imports it as the module it is."""
        args = list(sys.argv[1:] if argv is None else argv)
        env = dict(os.environ)
        if args[:1] == ["worker"] and not {"-A", "--app"} & set(args):
            module, folder = _main_module()
            args[1:1] = ["-A", module]
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [folder,
                                                              env.get("PYTHONPATH")]))
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, "-m", "emqtasks", *args], env)

    def AsyncResult(self, id: str, *, queue: str | None = None) -> AsyncResult:
        """Celery's ``app.AsyncResult(task_id)``: the job on this app."""
        return AsyncResult(id, self, queue=queue)

    # -- the worker's side ----------------------------------------------------------------
    def autodiscover_tasks(self, packages: Iterable[str] | Callable[[], Iterable[str]] |
                           None = None, related_name: str = "tasks",
                           force: bool = False) -> None:
        """Import ``<package>.<related_name>`` of each package (that has one) when a worker
        starts (at once with ``force=True``); no packages: Django's installed apps."""
        listed = None if packages is None else list(packages() if callable(packages)
                                                    else packages)
        self._discover.append((listed, related_name))
        if force:
            self.import_tasks_modules()

    def import_tasks_modules(self) -> list[str]:
        """The modules ``include`` / ``imports`` and autodiscover_tasks name, imported."""
        found = [*self.conf.include, *self.conf.imports]
        for name in found:
            importlib.import_module(name)
        pending, self._discover = self._discover, []
        for packages, related in pending:
            for package in (_django_apps() if packages is None else packages):
                module = f"{package}.{related}"
                if _exists(module):
                    importlib.import_module(module)
                    found.append(module)
        return found

    def add_periodic_task(self, schedule: Any, sig: Signature, args: Iterable[Any] = (),
                          kwargs: dict[str, Any] | None = None, name: str | None = None,
                          **options: Any) -> str:
        """Celery's: ``sig`` on ``schedule`` (a crontab, timedelta or seconds) as an entry of
        beat_schedule, checked now; ``name`` defaults to the call's text. Options as a beat
        entry's (``queue``). Returns the entry's name."""
        label = name or f"{sig.name}{(*sig.args, *args)!r}"
        entry = {"task": sig.name, "schedule": schedule, "args": [*sig.args, *args],
                 "kwargs": {**sig.kwargs, **(kwargs or {})}, "options": options}
        self.conf.beat_schedule = {**(self.conf.beat_schedule or {}), label: entry}
        return label

    def beat_entries(self) -> list[beat.BeatEntry]:
        """beat_schedule as schedules, read in the app's timezone and routes."""
        return beat.beat_entries(self.conf.beat_schedule, self.conf.timezone, self._routes)


def _main_module() -> tuple[str, str]:
    """The module name and folder of the script being run (``python myapp.py``: myapp)."""
    path: str | None = getattr(sys.modules.get("__main__"), "__file__", None)
    if not path:
        raise InvalidArgument("app.start() runs in a script (python myapp.py worker): "
                              "elsewhere, run 'emqtasks worker -A <module>'")
    path = os.path.abspath(path)
    return os.path.splitext(os.path.basename(path))[0], os.path.dirname(path)


def _celery_defaults(given: dict[str, Any]) -> dict[str, Any]:
    """Celery's defaults a task's options leave: no automatic retry, max_retries=3."""
    out: dict[str, Any] = {}
    if not {"autoretry_for", "retry_for"} & set(given):
        out["retry_for"] = ()
    if not {"max_retries", "max_attempts"} & set(given):
        out["max_retries"] = 3
    return out


def _exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _django_apps() -> list[str]:
    """The installed apps of the Django project (DJANGO_SETTINGS_MODULE), set up first."""
    try:
        import django
        from django.apps import apps
    except ImportError:
        raise ConfigError("autodiscover_tasks() without packages reads Django's "
                          "INSTALLED_APPS: install Django, or name the packages") from None
    if not apps.ready:
        django.setup()
    return [c.name for c in apps.get_app_configs()]


class AsyncResult(_AsyncResult):
    """Celery's ``AsyncResult(id, app=None)``: emqtasks' AsyncResult, on the current Celery
    app when no app is given, as Celery's reads the current app's backend (emqtasks'
    alone reads the default App's server, EMQ_REDIS_URL's, which need not be the
    project's CELERY_BROKER_URL or ``broker=``)."""

    def __init__(self, id: str, app: App | None = None, *, queue: str | None = None) -> None:
        super().__init__(id, app if app is not None else current_app(), queue=queue)


class Signal:
    """One of Celery's app signals: ``connect`` receivers (also as a decorator), ``send``
    (``dispatch``) calls each with ``sender=`` and keywords."""

    def __init__(self) -> None:
        self.receivers: list[Callable[..., Any]] = []

    def connect(self, receiver: Callable[..., Any], **_: Any) -> Callable[..., Any]:
        self.receivers.append(receiver)
        return receiver

    def dispatch(self, sender: Any, **kwargs: Any) -> None:
        for receiver in self.receivers:
            receiver(sender=sender, **kwargs)

    send = dispatch   # Celery's name


def current_app() -> Celery:
    """The current Celery app: the last one made (or a stand-in, until one is)."""
    if _current:
        return _current[-1]
    if not _stand_in:
        _stand_in.append(Celery("default", set_as_current=False))
    return _stand_in[0]


def celery_apps() -> list[Celery]:
    return [*_stand_in, *_current]


def shared_task(*args: Any, **options: Any) -> Any:
    """Celery's ``@shared_task``: a task of the current Celery app (see the module)."""
    return current_app().task(*args, **options)
