"""Connecting on ``redis.asyncio``: the twin of connection.py for the async producer calls.

The same URLs (``embedded``, ``redis+cluster://``, ``redis+sentinel://``, ``rediss://``
with the same TLS defaults), timeouts and reply decoding as connect(); a client belongs to
the event loop it was made on (its pool's connections and the pool's wait are that loop's),
so the App keeps one per loop (producer/aio.py). Nothing here connects: the first command does.

What differs from connect(): redis-py's asyncio connections run their connect-time
handshake under ``socket_timeout`` (connect() bounds it by CONNECT_TIMEOUT), and a
cluster's pool per node is capped at POOL_SIZE without a wait (a call past it fails with
redis-py's MaxConnectionsError).
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry

from .cluster import CLUSTER_RETRIES, cluster_backoff, is_cluster_url, parse_url
from .connection import (
    _RESOLVERS,
    CONNECT_TIMEOUT,
    ENCODING_ERRORS,
    POOL_SIZE,
    POOL_WAIT,
    SOCKET_TIMEOUT,
    TLS_DEFAULTS,
    PoolBusy,
    pool_wait_limit,
)
from .sentinel import aconnect_sentinel, is_sentinel_url


def aconnect(url: str) -> Any:
    """A ``redis.asyncio`` client for a URL, for the running event loop only: a bounded
    pool (POOL_SIZE, or the URL's ``max_connections``) that a task finding it busy waits
    on, as connect()'s does (pool_wait bounds the wait of a task)."""
    tls = TLS_DEFAULTS if url.lower().startswith(("rediss://", "rediss+cluster://")) else {}
    options: dict[str, Any] = dict(decode_responses=True, encoding_errors=ENCODING_ERRORS,
                                   socket_timeout=SOCKET_TIMEOUT,
                                   socket_connect_timeout=CONNECT_TIMEOUT, **tls)
    if is_sentinel_url(url):
        return aconnect_sentinel(url, options=options, tls=TLS_DEFAULTS, pool_size=POOL_SIZE)
    if is_cluster_url(url):
        nodes, kwargs = parse_url(url)
        return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in nodes],
                            max_connections=POOL_SIZE,
                            retry=Retry(cluster_backoff(), CLUSTER_RETRIES),
                            **{**options, **kwargs})
    for resolve in _RESOLVERS:
        url = resolve(url)
    pool = _WaitingPool.from_url(url, max_connections=POOL_SIZE, timeout=POOL_WAIT, **options)
    return aioredis.Redis.from_pool(pool)    # the client owns it: aclose() closes it


class _WaitingPool(aioredis.BlockingConnectionPool):
    """redis-py's blocking pool, whose wait for a free connection is PoolBusy when it runs
    out, and no longer than the task's pool_wait allows."""

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        limit = pool_wait_limit()
        try:
            if limit is None or self.can_get_connection():
                return await super().get_connection()  # type: ignore[no-untyped-call]
            return await asyncio.wait_for(super().get_connection(),  # type: ignore[no-untyped-call]
                                          limit)
        except asyncio.TimeoutError:
            raise PoolBusy(f"every connection of the pool ({self.max_connections}) stayed "
                           f"busy for {limit:g}s") from None
        except aioredis.ConnectionError as exc:
            if str(exc) != "No connection available.":
                raise
            raise PoolBusy(f"every connection of the pool ({self.max_connections}) stayed "
                           f"busy for {self.timeout:g}s") from None
