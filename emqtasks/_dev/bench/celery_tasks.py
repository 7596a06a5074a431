"""The Celery side of ``emqtasks bench --workflows``: the same two task bodies as
:mod:`emqtasks._dev.bench.tasks` (``noop`` and ``relay``, one INCR each), on a Celery app
whose broker and result backend are the bench's Redis (``EMQ_BENCH_CELERY_URL``), queue
``EMQ_BENCH_CELERY_QUEUE``.

Celery is not a dependency: importing this module imports nothing of it; ``app`` (what
``celery -A emqtasks._dev.bench.celery_tasks worker`` looks up) is built on first use.
"""

from __future__ import annotations

import os
from typing import Any

_client: tuple[int, Any] | None = None
_app: dict[str, Any] = {}


def _redis() -> Any:
    global _client
    if _client is None or _client[0] != os.getpid():
        import redis

        _client = (os.getpid(), redis.Redis.from_url(os.environ["EMQ_BENCH_CELERY_URL"]))
    return _client[1]


def noop(counter: str) -> None:
    _redis().incr(counter)


def relay(value: Any, counter: str) -> Any:
    _redis().incr(counter)
    return value


def celery_app() -> dict[str, Any]:
    """{"app": the Celery app, "noop": task, "relay": task}, built once from the env."""
    if not _app:
        from celery import Celery

        url = os.environ["EMQ_BENCH_CELERY_URL"]
        app = Celery("emq_bench", broker=url, backend=url)
        app.conf.update(task_serializer="json", result_serializer="json",
                        accept_content=["json"], broker_connection_retry_on_startup=True,
                        task_default_queue=os.environ.get("EMQ_BENCH_CELERY_QUEUE", "celery"))
        _app.update(app=app, noop=app.task(name="bench.noop")(noop),
                    relay=app.task(name="bench.relay")(relay))
    return _app


def __getattr__(name: str) -> Any:
    if name == "app":
        return celery_app()["app"]
    raise AttributeError(name)
