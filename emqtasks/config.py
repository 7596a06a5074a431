"""Settings and their defaults, in frozen dataclasses; the environment is read only in from_env."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, NamedTuple
from urllib.parse import unquote, urlsplit, urlunsplit

from .errors import ConfigError
from .store.autopipe import autopipeline_mode
from .store.durable import Durable, durable_of, parse_durable
from .store.keys import check_queue_name
from .validate import integer, result_bytes

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
                         if kv.split("=", 1)[0].lower() in ("password", "ssl_password",
                                                      "sentinel_password")
                         else kv for kv in parts.query.split("&"))
        changed = changed._replace(query=query)
    return url if changed == parts else urlunsplit(changed)


def host_port(part: str, url: str, default_port: int,
              error: type[ConfigError]) -> tuple[str, int]:
    """One ``host[:port]`` (or ``[v6]:port``) of a many-host URL (a cluster's nodes, the
    sentinels); ``error`` (the URL kind's) names the part and the redacted URL."""
    part = part.strip()
    if part.startswith("["):                       # [::1]:7000
        host, _, port = part[1:].partition("]")
        port = port.lstrip(":")
    else:
        host, _, port = part.rpartition(":") if ":" in part else (part, "", "")
    if not host:
        raise error(f"no host in {part!r} of {redacted(url)!r}")
    try:
        return unquote(host), int(port) if port else default_port
    except ValueError:
        raise error(f"bad port in {part!r} of {redacted(url)!r}") from None


@dataclass(frozen=True)
class Settings:
    """Where a queue lives and the limits a producer enforces."""

    redis_url: str = DEFAULT_REDIS_URL
    queue: str = DEFAULT_QUEUE
    max_payload_bytes: int = 1_000_000
    max_result_bytes: int = 1_000_000   # a task's result, its JSON; @task may set its own
    #: Durable writes (store/durable.py): a Durable, or None (off); True / False are read
    #: as Durable() / None.
    durable: Durable | None = None
    #: Auto-pipelining of enqueues (store/autopipe.py): calls of several threads or
    #: coroutines made while one is in flight go out together. Off by default in this
    #: release (new: the default after a long soak); EMQ_AUTOPIPELINE=1 turns it on.
    autopipeline: bool = False

    def __post_init__(self) -> None:
        check_queue_name(self.queue)
        if self.durable is not None:
            object.__setattr__(self, "durable", durable_of(self.durable))
        integer(self.max_payload_bytes, "max_payload_bytes")
        result_bytes(self.max_result_bytes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Defaults, then ``EMQ_REDIS_URL`` / ``EMQ_QUEUE`` / ``EMQ_DURABLE`` /
        ``EMQ_AUTOPIPELINE``, then non-None
        overrides."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {
            "redis_url": env.get("EMQ_REDIS_URL") or DEFAULT_REDIS_URL,
            "queue": env.get("EMQ_QUEUE") or DEFAULT_QUEUE,
            "durable": parse_durable(env.get("EMQ_DURABLE") or ""),
            "autopipeline": autopipeline_mode(env),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def with_(self, **changes: Any) -> Settings:
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def durable_for(self, *choices: Any) -> Durable | None:
        """The durable setting of a write: the first of ``choices`` (a call's, a task's)
        that is not None, else this App's. False is off."""
        for choice in choices:
            if choice is not None:
                return durable_of(choice)
        return self.durable


@dataclass(frozen=True)
class WorkerSettings:
    """How a worker pool runs. Intervals are seconds."""

    concurrency: int = os.cpu_count() or 1
    tick: float = 10.0                # reap + promote at least this often; the longest park
    max_tasks_per_child: int = 0      # 0: children live for ever
    time_limit: float = 0.0           # 0: no limit unless the task sets one
    grace: float = 30.0               # how long a warm shutdown lets running jobs finish
    renew_every: float = 0.0          # 0: a third of each job's lease
    async_concurrency: int = 1        # async jobs one child runs at once
    abort_grace: float = 5.0          # s an aborted job gets to return before its child dies


class QueueSpec(NamedTuple):
    name: str
    weight: int | None = None   # None: strict order


def parse_queues(text: str) -> list[QueueSpec]:
    """``a,b,c`` (strict) or ``a:3,b:1`` (weighted); ConfigError names what is wrong."""
    specs: list[QueueSpec] = []
    parts = text.split(",")
    for part in parts:
        name, sep, weight = part.strip().partition(":")
        name = name.strip()
        if not name and len(parts) > 1:
            raise ConfigError(f"invalid queue list {text!r}: an empty queue name")
        check_queue_name(name)   # InvalidQueueName: "invalid queue name ..."
        if any(s.name == name for s in specs):
            raise ConfigError(f"invalid queue list {text!r}: {name!r} is listed twice")
        w: int | None = None
        if sep:
            if not weight.strip().isdigit() or int(weight) < 1:
                raise ConfigError(f"invalid queue list {text!r}: the weight of {name!r} "
                                  f"must be an integer >= 1, not {weight!r}")
            w = int(weight)
        specs.append(QueueSpec(name, w))
    weighted = [s.weight is not None for s in specs]
    if any(weighted) and not all(weighted):
        raise ConfigError(f"invalid queue list {text!r}: give every queue a weight "
                          f"(a:3,b:1) or none (a,b: strict order)")
    return specs
