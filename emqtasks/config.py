"""Settings and their defaults, in frozen dataclasses; the environment is read only in from_env."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from .keys import check_queue_name
from .validate import integer

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_QUEUE = "default"


def redacted(url: str) -> str:
    """A Redis URL without its secrets, for logs and error messages.

    ``user:password@`` becomes ``user:***@``; a lone ``word@`` becomes ``***@`` (the cluster
    URL, like redis-cli, reads a lone word as the password); a ``password=`` query option
    becomes ``password=***``.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<a malformed URL, not shown>" if ("@" in url or "password" in url) else url
    changed = parts
    if "@" in parts.netloc:
        userinfo, host = parts.netloc.rsplit("@", 1)
        hidden = f"{userinfo.split(':', 1)[0]}:***" if ":" in userinfo else "***"
        changed = changed._replace(netloc=f"{hidden}@{host}")
    if "password" in parts.query.lower():
        query = "&".join(f"{kv.split('=', 1)[0]}=***"
                         if kv.split("=", 1)[0].lower() in ("password", "ssl_password")
                         else kv for kv in parts.query.split("&"))
        changed = changed._replace(query=query)
    return url if changed == parts else urlunsplit(changed)


@dataclass(frozen=True)
class Settings:
    """Where a queue lives and the limits a producer enforces."""

    redis_url: str = DEFAULT_REDIS_URL
    queue: str = DEFAULT_QUEUE
    max_payload_bytes: int = 1_000_000

    def __post_init__(self) -> None:
        check_queue_name(self.queue)
        integer(self.max_payload_bytes, "max_payload_bytes")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Defaults, then ``EMQ_REDIS_URL`` / ``EMQ_QUEUE``, then non-None overrides."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {
            "redis_url": env.get("EMQ_REDIS_URL") or DEFAULT_REDIS_URL,
            "queue": env.get("EMQ_QUEUE") or DEFAULT_QUEUE,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def with_(self, **changes: Any) -> Settings:
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


@dataclass(frozen=True)
class WorkerSettings:
    """How a worker pool runs. Intervals are seconds."""

    concurrency: int = os.cpu_count() or 1
    tick: float = 10.0                # reap + promote at least this often; the longest park
    max_tasks_per_child: int = 0      # 0: children live for ever
    time_limit: float = 0.0           # 0: no limit unless the task sets one
    grace: float = 30.0               # how long a warm shutdown lets running jobs finish
    renew_every: float = 0.0          # 0: a third of each job's lease
