"""``app.conf`` of a Celery app: Celery's setting names, each checked when it is set.

Three kinds. Settings with a meaning here (``MEANINGFUL``) are checked and read by the app
(celery/app.py). Settings that change nothing here but are harmless (``HARMLESS``: the JSON
serializer, prefetch, connection retries...) are accepted and kept, some only with the
value that is true here (``accept_content`` must take JSON). Settings with no meaning here
(``REFUSED``), a harmless one with a value that is not true here, and a name Celery does not
have are ConfigError naming the setting and what to use instead: never a silent ignore.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from datetime import timedelta
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

from .. import validate
from ..errors import ConfigError
from ..schedules.cron import zone
from ..store.keys import check_queue_name

#: Celery's name -> its default here (None: the App's own, e.g. the queue "default").
MEANINGFUL: dict[str, Any] = {
    "broker_url": None,
    "result_backend": None,
    "task_default_queue": None,
    "task_routes": None,
    "task_time_limit": None,
    "task_soft_time_limit": None,
    "task_default_retry_delay": 180.0,   # Celery's 3 minutes
    "task_ignore_result": False,
    "result_expires": timedelta(days=1),
    "beat_schedule": {},
    "timezone": "UTC",
    "imports": (),
    "include": (),
}

#: Accepted and kept; a value that is not true here is refused (the predicate says which).
JSON = ("json", "application/json")
HARMLESS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "accept_content": (lambda v: any(c in JSON for c in v),
                       "arguments and results are always JSON: accept_content must take "
                       "'json'"),
    "result_accept_content": (lambda v: v is None or any(c in JSON for c in v),
                              "results are always JSON: result_accept_content must take "
                              "'json'"),
    "task_serializer": (lambda v: v in JSON,
                        "arguments are always JSON: task_serializer='json' or drop it"),
    "result_serializer": (lambda v: v in JSON,
                          "results are always JSON: result_serializer='json' or drop it"),
    "enable_utc": (lambda v: v is True,
                   "slots are computed in UTC and crontab reads the timezone setting: "
                   "drop enable_utc=False"),
    "task_acks_late": (lambda v: v is True,
                       "a job is always acknowledged after its run: only task_acks_late=True"),
    "task_always_eager": (lambda v: v is False,
                          "jobs always go through Redis: in tests, run them with the pytest "
                          "plugin (the emq_app / emq_worker fixtures) or "
                          "emqtasks.testing.run_pending, not task_always_eager"),
    "task_eager_propagates": (lambda v: True, ""),
    "task_track_started": (lambda v: True, ""),
    "task_create_missing_queues": (lambda v: v is not False,
                                   "queues exist as soon as a job is sent to them"),
    "task_reject_on_worker_lost": (lambda v: True, ""),
    "result_extended": (lambda v: True, ""),
    "result_persistent": (lambda v: True, ""),
    "worker_prefetch_multiplier": (lambda v: True, ""),
    "worker_send_task_events": (lambda v: True, ""),
    "task_send_sent_event": (lambda v: True, ""),
    "worker_hijack_root_logger": (lambda v: True, ""),
    "worker_redirect_stdouts": (lambda v: True, ""),
    "worker_cancel_long_running_tasks_on_connection_loss": (lambda v: True, ""),
    "broker_connection_retry": (lambda v: True, ""),
    "broker_connection_retry_on_startup": (lambda v: True, ""),
    "broker_connection_max_retries": (lambda v: True, ""),
    "broker_pool_limit": (lambda v: True, ""),
    "broker_transport_options": (lambda v: True, ""),
    "result_backend_transport_options": (lambda v: True, ""),
    "redis_max_connections": (lambda v: True, ""),
    "redis_socket_timeout": (lambda v: True, ""),
    "redis_socket_connect_timeout": (lambda v: True, ""),
    "redis_retry_on_timeout": (lambda v: True, ""),
    "redis_backend_health_check_interval": (lambda v: True, ""),
    "beat_max_loop_interval": (lambda v: True, ""),
}

#: Settings with no meaning here, and what to use instead.
REFUSED: dict[str, str] = {
    "task_compression": "payloads are not compressed (max_payload_bytes caps their size)",
    "result_compression": "results are not compressed (max_result_bytes caps their size)",
    "task_store_eager_result": "there is no eager mode: use the pytest plugin's fixtures",
    "task_queues": "a queue exists as soon as a job is sent to it: route with task_routes "
                   "and serve queues with 'emqtasks worker -Q a,b'",
    "task_default_exchange": "there are no exchanges: name queues with task_default_queue",
    "task_default_routing_key": "there are no routing keys: route with task_routes",
    "task_default_rate_limit": "give rate_limit= on each task (a rate of its group)",
    "task_annotations": "give the options on the task's decorator",
    "worker_concurrency": "give the worker its concurrency: 'emqtasks worker -c N'",
    "worker_max_tasks_per_child": "'emqtasks worker --max-tasks-per-child N'",
    "beat_scheduler": "beat_schedule is stored by every worker at start (no beat process, "
                      "no scheduler class): drop beat_scheduler",
    "cache_backend": "results are kept on the broker's Redis",
    "database_url": "results are kept on the broker's Redis",
}

#: Settings the environment overrides, as Celery's do: a Redis URL in CELERY_BROKER_URL
#: wins over the broker a project's code names (``broker='amqp://'``), which is never used.
ENVIRONMENT = {"broker_url": "CELERY_BROKER_URL", "result_backend": "CELERY_RESULT_BACKEND"}

_REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster", "embedded")


class Conf(MutableMapping[str, Any]):
    """Celery's settings of one app: ``conf.update(...)``, ``conf.x = v``, ``conf["x"]``.

    ``check(key, value)`` (the app's) is called for every key of an update before any is
    kept, so a refused update changes nothing; ``changed(keys)`` then tells the app.
    """

    def __init__(self, check: Callable[[str, Any], Any],
                 changed: Callable[[set[str]], None]) -> None:
        object.__setattr__(self, "_values", {})
        object.__setattr__(self, "_check", check)
        object.__setattr__(self, "_changed", changed)

    def __getitem__(self, key: str) -> Any:
        given = from_environment(key)
        if given is not None:
            try:
                return _MEANINGFUL_CHECKS[key](given)
            except ConfigError as exc:
                raise ConfigError(f"{ENVIRONMENT[key]} in the environment: {exc}") from None
        if key in self._values:
            return self._values[key]
        if key in MEANINGFUL:
            return MEANINGFUL[key]
        raise KeyError(key)

    def __setitem__(self, key: str, value: Any) -> None:
        self.update({key: value})

    def __delitem__(self, key: str) -> None:
        del self._values[key]
        self._changed({key})

    def __contains__(self, key: object) -> bool:
        return key in self._values   # set here (a default is not)

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"no Celery setting {name!r} is set") from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def update(self, other: Any = (), /, **kwargs: Any) -> None:
        """Set several settings; one refused sets none of them."""
        items = dict(other, **kwargs)
        checked = {key: self._check(key, value) for key, value in items.items()}
        self._values.update(checked)
        self._changed(set(checked))

    def __repr__(self) -> str:
        return f"<Celery conf {self._values!r}>"


def from_environment(key: str) -> str | None:
    """The value the environment gives a setting (CELERY_BROKER_URL...), or None."""
    return (os.environ.get(ENVIRONMENT[key]) or None) if key in ENVIRONMENT else None


def check_setting(key: str, value: Any) -> Any:
    """The value kept for a setting (checked, normalised), or ConfigError naming it. A
    setting the environment overrides is kept as given: only the environment's is used
    (and checked when read)."""
    if not isinstance(key, str):
        raise ConfigError(f"a Celery setting's name is a string, not {key!r}")
    if key in REFUSED:
        raise ConfigError(f"Celery setting {key} has no meaning in emqtasks: {REFUSED[key]}")
    if key in HARMLESS:
        fits, why = HARMLESS[key]
        if not fits(value):
            raise ConfigError(f"Celery setting {key}={value!r} has no meaning in emqtasks: "
                              f"{why}")
        return value
    if key not in MEANINGFUL:
        raise ConfigError(f"unknown Celery setting {key!r}: emqtasks.celery takes "
                          f"{', '.join(sorted(MEANINGFUL))} and the harmless ones listed in "
                          f"the README ('Coming from Celery')")
    if from_environment(key) is not None:
        return value
    return _MEANINGFUL_CHECKS.get(key, lambda v: v)(value)


def _broker(value: Any) -> Any:
    if value is None:
        return None
    scheme = urlsplit(value).scheme.lower() if isinstance(value, str) else ""
    if scheme not in _REDIS_SCHEMES:
        raise ConfigError(f"broker_url {value!r}: emqtasks runs on Redis (or Valkey) only: "
                          f"a redis://, rediss:// or unix:// URL")
    return value


def _backend(value: Any) -> Any:
    """Results are kept on the broker's Redis whatever the backend says: a Redis backend (or
    rpc://, results read by the caller) keeps its meaning; a database or cache one does not."""
    if value is None:
        return None
    scheme = urlsplit(value).scheme.lower() if isinstance(value, str) else ""
    if scheme not in (*_REDIS_SCHEMES, "rpc"):
        raise ConfigError(f"result_backend {value!r}: results are kept on the broker's Redis "
                          f"(result_expires says how long): drop result_backend, or give a "
                          f"redis:// one")
    return value


def _queue(value: Any) -> Any:
    return None if value is None else check_queue_name(value)


def _seconds(what: str, allow_none: bool = True) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value is None and allow_none:
            return None
        if isinstance(value, timedelta):
            value = value.total_seconds()
        try:
            return validate.seconds(value, what, above_low=True)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    return check


def _expires(value: Any) -> Any:
    if value is None:   # Celery: never expire; here the longest a row may be kept
        return validate.MAX_TTL
    if isinstance(value, timedelta):
        value = value.total_seconds()
    try:
        return validate.integer(int(validate.seconds(value, "result_expires",
                                                     high=validate.MAX_TTL)),
                                "result_expires", 0, validate.MAX_TTL)
    except (ValueError, TypeError) as exc:
        raise ConfigError(str(exc)) from None


def _bool(what: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if not isinstance(value, bool):
            raise ConfigError(f"{what} is True or False, not {value!r}")
        return value
    return check


def _timezone(value: Any) -> Any:
    zone(value)   # UnknownTimezone quoting it
    return value


def _modules(what: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        names = (value,) if isinstance(value, str) else tuple(value or ())
        if not all(isinstance(n, str) and n for n in names):
            raise ConfigError(f"{what} is a list of module names, not {value!r}")
        return names
    return check


_MEANINGFUL_CHECKS: dict[str, Callable[[Any], Any]] = {
    "broker_url": _broker,
    "result_backend": _backend,
    "task_default_queue": _queue,
    "task_time_limit": _seconds("task_time_limit"),
    "task_soft_time_limit": _seconds("task_soft_time_limit"),
    "task_default_retry_delay": _seconds("task_default_retry_delay", allow_none=False),
    "task_ignore_result": _bool("task_ignore_result"),
    "result_expires": _expires,
    "timezone": _timezone,
    "imports": _modules("imports"),
    "include": _modules("include"),
}


def settings_of(obj: Any, namespace: str | None) -> dict[str, Any]:
    """The Celery settings an object holds, as ``config_from_object`` reads them: with a
    namespace (``"CELERY"``), its ``CELERY_*`` names, the prefix cut and lowercased
    (``CELERY_BROKER_URL`` is broker_url); without, its public lowercase names (a
    ``celeryconfig`` module). ``obj``: a module, an object, a mapping, or the dotted path of
    one (``"django.conf:settings"``, ``"proj.celeryconfig"``)."""
    if isinstance(obj, str):
        obj = _import(obj)
    prefix = f"{namespace}_" if namespace else ""
    # only the names read are looked up (Django's settings check each one on access)
    names = [n for n in (obj if isinstance(obj, Mapping) else dir(obj))
             if isinstance(n, str) and not n.startswith("_") and n.startswith(prefix)]
    items = {n: obj[n] if isinstance(obj, Mapping) else getattr(obj, n) for n in names}
    if namespace:
        return {k[len(prefix):].lower(): v for k, v in items.items() if len(k) > len(prefix)}
    return {k: v for k, v in items.items()
            if k == k.lower() and not k.startswith("_")
            and not isinstance(v, ModuleType) and not inspect.isclass(v)
            and not inspect.isroutine(v)}


def _import(path: str) -> Any:
    module, _, attr = path.partition(":")
    try:
        if attr:
            return getattr(importlib.import_module(module), attr)
        try:
            return importlib.import_module(path)
        except ModuleNotFoundError:
            module, _, attr = path.rpartition(".")
            if not module:
                raise
            return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"config_from_object({path!r}): {type(exc).__name__}: {exc}") \
            from None
