"""The tasks ``emqtasks bench --peers`` runs on Huey and Dramatiq.

The same bodies as :mod:`emqtasks._dev.bench.tasks`: ``noop`` counts itself with one INCR,
``stamp`` pushes its start time, ``seq`` takes a start number (the quiet-tenant drill).

Neither library is a dependency of emqtasks, and importing this module imports neither:
:func:`huey_app` and :func:`dramatiq_app` import them when called. The peers' worker
commands find their app here, built from the environment the bench sets
(:data:`URL_ENV`, :data:`NAME_ENV`)::

    huey_consumer emqtasks._dev.bench.peer_tasks.huey -w 8 -k process
    dramatiq emqtasks._dev.bench.peer_tasks:dramatiq_worker --processes 2 --threads 4

(``huey`` is a lazy module attribute; ``dramatiq_worker`` a setup function that Dramatiq's
CLI calls.) Task bodies talk to Redis over a connection of their own process, on
:data:`URL_ENV`.
"""

from __future__ import annotations

import os
import time
from typing import Any

URL_ENV = "EMQ_PEER_REDIS_URL"   # the server the worker and its task bodies use
NAME_ENV = "EMQ_PEER_NAME"       # the Huey instance name / the Dramatiq key namespace

_client: tuple[int, Any] | None = None


def _redis() -> Any:
    """This process's connection for task bodies (a forked child never reuses its parent's)."""
    global _client
    if _client is None or _client[0] != os.getpid():
        import redis

        _client = (os.getpid(), redis.Redis.from_url(os.environ[URL_ENV]))
    return _client[1]


def noop(counter: str) -> None:
    """Count itself: one INCR of the counter key."""
    _redis().incr(counter)


def stamp(key: str) -> None:
    """Record when it started (UNIX time, this host's clock) by pushing it onto ``key``."""
    _redis().rpush(key, repr(time.time()))


def seq(key: str, role: str = "flood") -> None:
    """Take the next start number of ``key``; the quiet job pushes its number onto
    ``<key>:quiet``, so the bench learns how many jobs started before it."""
    n = _redis().incr(key)
    if role == "quiet":
        _redis().rpush(f"{key}:quiet", n)


FUNCTIONS = (noop, stamp, seq)


def huey_app(url: str, name: str) -> tuple[Any, dict[str, Any]]:
    """A ``RedisHuey`` (library defaults) with the bench tasks; returns it and the tasks."""
    from huey import RedisHuey

    app = RedisHuey(name, url=url)
    return app, {fn.__name__: app.task(name=fn.__name__)(fn) for fn in FUNCTIONS}


def dramatiq_app(url: str, namespace: str) -> tuple[Any, dict[str, Any]]:
    """A ``RedisBroker`` (default middleware) with the bench actors on queue ``default``."""
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(url=url, namespace=namespace)
    return broker, {fn.__name__: dramatiq.actor(actor_name=fn.__name__, broker=broker)(fn)
                    for fn in FUNCTIONS}


def dramatiq_worker() -> None:
    """Dramatiq's CLI calls this in each worker process to set the global broker."""
    import dramatiq

    broker, _ = dramatiq_app(os.environ[URL_ENV], os.environ[NAME_ENV])
    dramatiq.set_broker(broker)


_huey: Any = None


def __getattr__(name: str) -> Any:
    """``huey``: the consumer's instance, built on first access from the environment."""
    global _huey
    if name == "huey":
        if _huey is None:
            _huey = huey_app(os.environ[URL_ENV], os.environ[NAME_ENV])[0]
        return _huey
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
