"""Redis Sentinel: the ``redis+sentinel://`` URL, a client that finds the primary through the
sentinels and follows a failover.

URL: ``redis+sentinel://[user:password@]host:port[,host:port...]/service_name[/db]
[?option=value&...]`` (``rediss+sentinel://`` for TLS to the sentinels and the servers).
Every host:port is a sentinel (port 26379 unless given); ``user:password`` are the data
servers'. Options: ``sentinel_password`` / ``sentinel_username`` (the sentinels' own, when
they differ), ``client_name``, ``socket_timeout``, ``socket_connect_timeout``,
``max_connections``, ``ssl_ca_certs``, ``ssl_cert_reqs``, ``ssl_check_hostname``.

A connection asks the sentinels for the primary's address when it (re)connects, so every
client of emqtasks (producer, worker master, park threads and children, CLI, dashboard,
metrics) reaches whichever server is the primary now. A connection to a primary that was
demoted answers READONLY (or UNBLOCKED to a blocking pop); redis-py's
SentinelManagedConnection turns both into a ConnectionError and the next connect asks the
sentinels again. So a failover reaches emqtasks as connection errors for its duration: an
outage the worker rides out (worker/resilience.py) and a producer's call raises (its job id
makes sending it again safe).

redis-py answers MasterNotFoundError both during a failover and for a service name no
sentinel knows; they are told apart here: a name that no sentinel which answered lists, for
UNKNOWN_AFTER seconds of asking, is UnknownService (a ConfigError: a misspelt name does not
heal), while a known service without a healthy primary, or sentinels that do not answer,
stay a MasterNotFoundError (a ConnectionError: an outage).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import parse_qsl, unquote

import redis
import redis.asyncio.sentinel as asentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import EqualJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry
from redis.sentinel import (
    MasterNotFoundError,
    Sentinel,
    SentinelConnectionPool,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)

from ..config import host_port, redacted
from ..errors import SentinelUrlError, UnknownService

SCHEMES = ("redis+sentinel", "rediss+sentinel")
DEFAULT_PORT = 26379
#: How long a service name no answering sentinel lists is asked for again before it is
#: UnknownService. A failover never makes the sentinels forget a name (they keep listing it,
#: flagged down, while they promote a replica), so this need only outlast a sentinel that
#: was just (re)started and has not yet read its configuration.
UNKNOWN_AFTER = 5.0
#: A sentinel that does not answer within this long is passed over for the next one.
SENTINEL_TIMEOUT = 2.0
#: How often a connection retries its connect itself (asking the sentinels each time) before
#: the error reaches emqtasks: 3 times within about 0.7 s, as the cluster client
#: (cluster.py, CLUSTER_RETRIES); redis-py's own default backs off for seconds. A failover
#: longer than that reaches the worker's own retry, which logs it once and backs off.
SENTINEL_RETRIES = 3

_FLOAT_OPTIONS = ("socket_timeout", "socket_connect_timeout")
_TEXT_OPTIONS = ("client_name", "ssl_ca_certs", "ssl_cert_reqs")
_BOOL_OPTIONS = ("ssl_check_hostname",)
_SENTINEL_OPTIONS = ("sentinel_password", "sentinel_username")


def is_sentinel_url(url: str) -> bool:
    return url.split("://", 1)[0].lower() in SCHEMES if "://" in url else False


class SentinelUrl:
    """A parsed sentinel URL: the sentinels, the service, and the keyword arguments of the
    data servers' connections (``server``) and of the sentinels' (``sentinel``)."""

    def __init__(self, url: str) -> None:
        scheme, _, rest = url.partition("://")
        if scheme.lower() not in SCHEMES:
            raise SentinelUrlError(f"not a sentinel URL (want {' or '.join(SCHEMES)}://): "
                                   f"{redacted(url)!r}")
        self.tls = scheme.lower() == "rediss+sentinel"
        rest, _, query = rest.partition("?")
        netloc, _, path = rest.partition("/")
        self.server: dict[str, Any] = {}
        self.sentinel: dict[str, Any] = {}
        self.max_connections: int | None = None
        if "@" in netloc:
            auth, netloc = netloc.rsplit("@", 1)
            user, colon, password = auth.partition(":")
            if colon:
                self.server["password"] = unquote(password)
                if user:
                    self.server["username"] = unquote(user)
            elif user:
                self.server["password"] = unquote(user)
        self.sentinels = [host_port(p, url, DEFAULT_PORT, SentinelUrlError)
                          for p in netloc.split(",") if p.strip()]
        if not self.sentinels:
            raise SentinelUrlError(f"a sentinel URL names at least one sentinel host:port: "
                                   f"{redacted(url)!r}")
        parts = [unquote(p) for p in path.split("/")] if path else []
        if not parts or not parts[0]:
            raise SentinelUrlError(f"a sentinel URL names the service after the sentinels "
                                   f"(redis+sentinel://host:26379/mymaster): {redacted(url)!r}")
        if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
            raise SentinelUrlError(f"after the service name only a database number may "
                                   f"follow, not {'/'.join(parts[1:])!r}")
        self.service = parts[0]
        self.server["db"] = int(parts[1]) if len(parts) == 2 else 0
        for name, value in parse_qsl(query, keep_blank_values=True):
            self._option(name, value)

    def _option(self, name: str, value: str) -> None:
        if name in _FLOAT_OPTIONS:
            try:
                self.server[name] = float(value)
            except ValueError:
                raise SentinelUrlError(f"{name} must be a number of seconds, not {value!r}") \
                    from None
        elif name == "max_connections":
            if not value.isdigit() or int(value) < 1:
                raise SentinelUrlError(f"max_connections must be a whole number >= 1, "
                                       f"not {value!r}")
            self.max_connections = int(value)
        elif name in _TEXT_OPTIONS:
            self.server[name] = value
        elif name in _BOOL_OPTIONS:
            self.server[name] = value.lower() not in ("0", "false", "no", "off", "")
        elif name in _SENTINEL_OPTIONS:
            self.sentinel[name.removeprefix("sentinel_")] = value
        else:
            known = ", ".join(_SENTINEL_OPTIONS + _FLOAT_OPTIONS + ("max_connections",)
                              + _TEXT_OPTIONS + _BOOL_OPTIONS)
            raise SentinelUrlError(f"unknown option {name!r} in the sentinel URL "
                                   f"(known: {known})")

    def sentinel_kwargs(self, tls: dict[str, Any]) -> dict[str, Any]:
        """The sentinels' connections: their own credentials, short timeouts, the same TLS
        as the servers'."""
        kwargs: dict[str, Any] = dict(socket_timeout=SENTINEL_TIMEOUT,
                                      socket_connect_timeout=SENTINEL_TIMEOUT, **self.sentinel)
        if self.tls:
            kwargs.update(ssl=True, **tls)
            kwargs.update({k: v for k, v in self.server.items() if k.startswith("ssl_")})
        return kwargs


def sentinel_retry() -> Retry:
    return Retry(EqualJitterBackoff(cap=0.4, base=0.025), SENTINEL_RETRIES)


class _Asking:
    """One round of asking the sentinels: whether any that answered lists the service."""

    def __init__(self) -> None:
        self.known = False
        self.answered = False
        self.errors: list[str] = []

    def read(self, masters: Any, service: str) -> dict[str, Any] | None:
        self.answered = True
        state: dict[str, Any] | None = masters.get(service)
        self.known = self.known or state is not None
        return state

    def failed(self, sentinel: Any, exc: Exception) -> None:
        self.errors.append(f"{sentinel}: {exc!r}")

    def verdict(self, service: str, since: float, sentinels: int) -> float:
        """After a round without a healthy primary: raise MasterNotFoundError (an outage)
        or UnknownService, or return how long to wait before asking again."""
        detail = f": {', '.join(self.errors)}" if self.errors else ""
        if self.known or not self.answered:
            raise MasterNotFoundError(f"No master found for {service!r}{detail}")
        if time.monotonic() - since >= UNKNOWN_AFTER:
            raise UnknownService(
                f"no sentinel of the {sentinels} in the URL knows a service {service!r} "
                f"(asked for {UNKNOWN_AFTER:g}s): check the service name in the URL")
        return 0.2


class _Sentinels(Sentinel):
    """redis-py's Sentinel, whose discovery tells an unknown service from a failover."""

    def discover_master(self, service_name: str) -> tuple[str, int]:
        since = time.monotonic()
        while True:
            asking = _Asking()
            for i, sentinel in enumerate(self.sentinels):
                try:
                    state = asking.read(sentinel.sentinel_masters(), service_name)
                except (RedisConnectionError, ResponseError, RedisTimeoutError) as exc:
                    asking.failed(sentinel, exc)
                    continue
                if state and self.check_master_state(  # type: ignore[no-untyped-call]
                        state, service_name):
                    self.sentinels[0], self.sentinels[i] = sentinel, self.sentinels[0]
                    return state["ip"], state["port"]
            time.sleep(asking.verdict(service_name, since, len(self.sentinels)))


class _ASentinels(asentinel.Sentinel):
    """The asyncio twin of _Sentinels."""

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        since = time.monotonic()
        while True:
            asking = _Asking()
            for i, sentinel in enumerate(self.sentinels):
                try:
                    state = asking.read(await sentinel.sentinel_masters(), service_name)
                except (RedisConnectionError, ResponseError, RedisTimeoutError) as exc:
                    asking.failed(sentinel, exc)
                    continue
                if state and self.check_master_state(state, service_name):
                    self.sentinels[0], self.sentinels[i] = sentinel, self.sentinels[0]
                    return state["ip"], state["port"]
            await asyncio.sleep(asking.verdict(service_name, since, len(self.sentinels)))


def connect_sentinel(url: str, single_thread: bool, *, options: dict[str, Any],
                     tls: dict[str, Any], mixin: type, queue_class: type,
                     pool_size: int, pool_wait: float) -> Any:
    """A client of the service's primary (connection.connect's, for a sentinel URL):
    ``options`` its defaults (decoding, timeouts, the handshake), ``mixin`` the class that
    bounds a connection's handshake by its connect timeout, the pool as connect()'s."""
    parsed = SentinelUrl(url)
    sentinels = _Sentinels(parsed.sentinels, sentinel_kwargs=parsed.sentinel_kwargs(tls))
    base = SentinelManagedSSLConnection if parsed.tls else SentinelManagedConnection
    kwargs = {**options, **(tls if parsed.tls else {}), **parsed.server,
              "connection_class": type(f"_Short{base.__name__}", (mixin, _AsksSentinels, base), {}),
              "retry": sentinel_retry()}
    if single_thread:
        pool = SentinelConnectionPool(  # type: ignore[no-untyped-call]
            parsed.service, sentinels, **kwargs)
        return redis.Redis(connection_pool=pool, single_connection_client=True)
    pool = _BlockingSentinelPool(  # type: ignore[no-untyped-call]
        parsed.service, sentinels,
                                 max_connections=parsed.max_connections or pool_size,
                                 timeout=pool_wait, queue_class=queue_class, **kwargs)
    client = redis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True
    return client


class _AsksSentinels:
    """A sentinel-managed connection that asks the sentinels whenever it reconnects.

    redis-py's SentinelManagedConnection asks them in connect(), but a command sent on a
    closed connection reconnects through connect_check_health() (redis-py 8), to the
    address it had: a single-connection client (a worker child's) or a command retried on
    its connection went on knocking at the dead primary. Here that path asks too.
    """

    _sock: Any
    _asking = False

    def connect_check_health(self, check_health: bool = True,
                             retry_socket_connect: bool = True) -> Any:
        if self._sock or self._asking:     # connected, or connect() reaching the address
            return super().connect_check_health(  # type: ignore[misc]
                check_health, retry_socket_connect)
        self._asking = True
        try:
            return self.connect()  # type: ignore[attr-defined]
        finally:
            self._asking = False


class _BlockingSentinelPool(SentinelConnectionPool, redis.BlockingConnectionPool):
    """A sentinel pool that is bounded and waited on, as connect()'s plain pool is."""


def aconnect_sentinel(url: str, *, options: dict[str, Any], tls: dict[str, Any],
                      pool_size: int) -> Any:
    """A ``redis.asyncio`` client of the service's primary (aconnection.aconnect's): a pool
    of at most ``pool_size`` connections (the URL's ``max_connections``), without a wait."""
    parsed = SentinelUrl(url)
    sentinels = _ASentinels(parsed.sentinels, sentinel_kwargs=parsed.sentinel_kwargs(tls))
    base = (asentinel.SentinelManagedSSLConnection if parsed.tls
            else asentinel.SentinelManagedConnection)
    kwargs = {**options, **(tls if parsed.tls else {}), **parsed.server,
              "connection_class": base,
              "retry": AsyncRetry(EqualJitterBackoff(cap=0.4, base=0.025), SENTINEL_RETRIES),
              "max_connections": parsed.max_connections or pool_size}
    return sentinels.master_for(parsed.service, **kwargs)
