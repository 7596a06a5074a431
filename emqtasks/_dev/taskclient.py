"""The connection the development tasks (bench, chaos soak) use inside their bodies."""

from __future__ import annotations

import os
from typing import Any

from ..producer.app import default_app
from ..store.connection import connect

_client: tuple[int, Any] | None = None


def task_redis() -> Any:
    """This process's connection (a forked child never reuses its parent's)."""
    global _client
    if _client is None or _client[0] != os.getpid():
        _client = (os.getpid(), connect(default_app.settings.redis_url))
    return _client[1]
