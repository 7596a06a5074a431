"""Connecting to a server: one place for URLs, TLS defaults, timeouts and reply decoding."""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.connection import Connection, SSLConnection, UnixDomainSocketConnection

from .cluster import connect_cluster, is_cluster_url
from .sentinel import connect_sentinel, is_sentinel_url

#: Longer than any blocking call emqtasks makes (parks and result waits are capped at
#: MAX_BLOCK), so a BLPOP never trips the socket timeout, yet a dead peer is noticed.
SOCKET_TIMEOUT = 30.0
MAX_BLOCK = 20.0
#: A server that accepts a connection but never answers the handshake (TLS to a plain port,
#: a stuck proxy) is reported after this long, not after SOCKET_TIMEOUT: the TCP connect,
#: the TLS handshake and redis-py's connect-time commands all run under it.
CONNECT_TIMEOUT = 5.0
ENCODING_ERRORS = "surrogateescape"
#: The most connections a client of many threads (an App's) opens, unless its URL says
#: ``?max_connections=N``: a thread that finds them all busy waits for one, up to
#: POOL_WAIT (longer than any blocking call emqtasks makes), or less where the caller has
#: a timeout of its own (JobHandle.get). redis-py's own default cap, kept as a bound.
POOL_SIZE = 100
POOL_WAIT = SOCKET_TIMEOUT
#: What a ``rediss://`` client checks unless its URL says otherwise (redis-py's own defaults
#: today, stated here so a change of library default cannot turn them off).
TLS_DEFAULTS = {"ssl_cert_reqs": "required", "ssl_check_hostname": True}
#: Resolvers of URLs no redis-py client opens (``embedded``): each returns a connectable
#: URL, or the one it was given when that is not its own. The embedded server registers
#: its own (emqtasks.embedded, imported by the package), so the store imports no optional
#: part of emqtasks to know of it.
_RESOLVERS: list[Callable[[str], str]] = []


def register_url_resolver(resolve: Callable[[str], str]) -> None:
    """Have connect() pass every URL through ``resolve`` first (once per function)."""
    if resolve not in _RESOLVERS:
        _RESOLVERS.append(resolve)


def connect(url: str, single_thread: bool = False) -> Any:
    """A redis-py client for a URL, with replies decoded as text.

    ``embedded`` / ``embedded:PATH`` start (or reuse) the embedded development server
    (through the resolver emqtasks.embedded registers);
    ``redis+cluster://host:port[,host:port...]`` gives a Redis Cluster client (cluster.py);
    ``redis+sentinel://host:26379[,...]/service`` a client of the service's primary, found
    through the sentinels (sentinel.py).
    ``single_thread`` keeps one connection instead of a pool checkout per command (about a
    sixth of a worker child's time per job); only for a client one thread uses. Otherwise
    the client has a bounded pool (POOL_SIZE, or the URL's ``max_connections``) that a
    thread finding it busy waits on (see pool_wait).

    Replies decode with ``surrogateescape``: a row holding bytes that are not UTF-8 (written
    by something other than emqtasks) reads back with them as lone surrogates instead of
    failing the whole reply, so a worker can dead-letter that job (serialization.loads_args
    refuses such a payload) rather than crash on every claim of it.
    ``rediss://`` verifies the server's certificate and host name unless the URL's
    ``ssl_cert_reqs`` / ``ssl_check_hostname`` say otherwise.
    """
    tls = TLS_DEFAULTS if url.lower().startswith(("rediss://", "rediss+cluster://")) else {}
    if is_sentinel_url(url):
        return connect_sentinel(
            url, single_thread, tls=TLS_DEFAULTS, mixin=_ShortHandshake,
            queue_class=_FreeConnections, pool_size=POOL_SIZE, pool_wait=POOL_WAIT,
            options=dict(decode_responses=True, encoding_errors=ENCODING_ERRORS,
                         socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=CONNECT_TIMEOUT,
                         redis_connect_func=_handshake))
    if is_cluster_url(url):
        return connect_cluster(url, decode_responses=True, socket_timeout=SOCKET_TIMEOUT,
                               socket_connect_timeout=CONNECT_TIMEOUT,
                               encoding_errors=ENCODING_ERRORS, **tls)
    for resolve in _RESOLVERS:
        url = resolve(url)
    options: dict[str, Any] = dict(
        decode_responses=True, encoding_errors=ENCODING_ERRORS, socket_timeout=SOCKET_TIMEOUT,
        socket_connect_timeout=CONNECT_TIMEOUT, connection_class=_connection_class(url),
        redis_connect_func=_handshake, **tls)
    if single_thread:
        return redis.Redis.from_url(url, single_connection_client=True, **options)
    # Many threads: a bounded pool they wait on (redis-py's BlockingConnectionPool), so a
    # thread per request never opens a connection per thread nor fails for want of one.
    pool = redis.BlockingConnectionPool.from_url(
        url, max_connections=POOL_SIZE, timeout=POOL_WAIT, queue_class=_FreeConnections,
        **options)
    client = redis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True
    return client


def interrupt(client: Any) -> None:
    """Shut a client's connections down, those another thread is blocked on too: its
    blocking call (a park's BLPOP) returns at once with a ConnectionError. A reply on its
    way back is lost with the connection, as with any dropped one."""
    single = getattr(client, "connection", None)
    pool = getattr(client, "connection_pool", None)
    if single is not None:
        single.disconnect()   # shutdown(2) before close: a recv in another thread returns
    elif pool is not None:
        pool.disconnect(inuse_connections=True)
    else:   # a cluster client: the nodes' pools
        client.disconnect_connection_pools()


class PoolBusy(redis.exceptions.ConnectionError):
    """Every connection of a client's pool stayed in use for as long as the caller could
    wait for one (a ConnectionError: nothing was sent)."""


#: The wait pool_wait sets: per thread, and per asyncio task (the async pool reads it too).
_wait: ContextVar[float | None] = ContextVar("emqtasks_pool_wait", default=None)


@contextmanager
def pool_wait(seconds: float | None) -> Iterator[None]:
    """Within the block, a call of this thread (or asyncio task) that finds its client's
    pool busy waits at most ``seconds`` for a connection (None: the pool's own POOL_WAIT),
    then raises PoolBusy."""
    token = _wait.set(seconds)
    try:
        yield
    finally:
        _wait.reset(token)


def pool_wait_limit() -> float | None:
    """What the innermost pool_wait of this thread or task allows (None: no limit of its
    own)."""
    return _wait.get()


class _FreeConnections(queue.LifoQueue):  # type: ignore[type-arg]
    """The free connections of a BlockingConnectionPool (its ``queue_class``): a wait that
    runs out is PoolBusy, and a thread inside ``pool_wait`` waits no longer than it says."""

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        limit = _wait.get()
        if limit is not None:
            timeout = limit if timeout is None else min(timeout, limit)
        try:
            return super().get(block, timeout)
        except queue.Empty:
            waited = "" if timeout is None else f" for {timeout:g}s"
            raise PoolBusy(f"every connection of the pool ({self.maxsize}) stayed "
                           f"busy{waited}") from None


class _ShortHandshake:
    """A connection whose handshake runs under its connect timeout.

    redis-py connects the socket under ``socket_connect_timeout`` but then wraps TLS and
    sends its connect-time commands (AUTH, HELLO, CLIENT SETINFO) under ``socket_timeout``,
    which must outlast a 20 s BLPOP: a TLS client at a plain port, or a server that accepts
    and never answers, took 30 s to fail. Here the socket keeps the connect timeout until
    :func:`_handshake` has run those commands, then gets its steady timeout.
    """

    socket_timeout: float | None
    socket_connect_timeout: float | None

    def _connect(self) -> Any:
        steady = self.socket_timeout
        self.socket_timeout = self.socket_connect_timeout   # read by the TCP and TLS setup
        try:
            return super()._connect()   # type: ignore[misc]
        finally:
            self.socket_timeout = steady


class _TcpConnection(_ShortHandshake, Connection):
    pass


class _TlsConnection(_ShortHandshake, SSLConnection):
    pass


class _UnixConnection(_ShortHandshake, UnixDomainSocketConnection):
    pass


def _connection_class(url: str) -> type[Connection | UnixDomainSocketConnection]:
    scheme = urlsplit(url).scheme.lower()
    if scheme == "rediss":
        return _TlsConnection
    return _UnixConnection if scheme == "unix" else _TcpConnection


def _handshake(connection: Any) -> None:
    """redis-py's own connect-time commands, still under the connect timeout; then the
    socket's steady timeout for everything after."""
    connection.on_connect()
    connection._sock.settimeout(connection.socket_timeout)
