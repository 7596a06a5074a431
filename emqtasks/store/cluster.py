"""Redis Cluster: the ``redis+cluster://`` URL, and the few calls that differ on a cluster.

A queue needs nothing special on a cluster: every key of it carries the hash tag ``{q}``,
so the whole queue lives in one slot, every script runs on the one node that serves it,
and redis-py's cluster client routes each command by its key (following MOVED and ASK
itself, and refreshing its slot map). Different queues hash to different slots and so
spread over the shards.

What does differ is the handful of calls that are not about one key: SCAN (a cluster has
one keyspace per node; a queue's keys are all on the node that serves its slot) and
server-level commands such as PING and CONFIG GET (asked of that same node). Those go
through :func:`scan_keys` and :func:`node_kwargs` (used by ``Queue.scan``, ``Queue.ping``
and the worker's eviction check), which change nothing for a plain client.

URL: ``redis+cluster://[user:password@]host:port[,host:port...][/0][?option=value&...]``
(``rediss+cluster://`` for TLS). Every host:port is a startup node; one reachable node is
enough, the client discovers the rest. Options: ``client_name``, ``socket_timeout``,
``socket_connect_timeout``, ``require_full_coverage`` (default true). Only database 0
exists on a cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl, unquote

from redis.backoff import EqualJitterBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from ..config import host_port, redacted
from ..errors import ClusterUrlError

SCHEMES = ("redis+cluster", "rediss+cluster")
DEFAULT_PORT = 6379

_FLOAT_OPTIONS = ("socket_timeout", "socket_connect_timeout")
_BOOL_OPTIONS = ("require_full_coverage",)
_TEXT_OPTIONS = ("client_name",)


def is_cluster_url(url: str) -> bool:
    return url.split("://", 1)[0].lower() in SCHEMES if "://" in url else False


def parse_url(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """(startup nodes as (host, port), client keyword arguments) of a cluster URL."""
    scheme, _, rest = url.partition("://")
    if scheme.lower() not in SCHEMES:
        raise ClusterUrlError(f"not a cluster URL (want {' or '.join(SCHEMES)}://): "
                              f"{redacted(url)!r}")
    netloc, _, tail = rest.partition("/")
    netloc, _, query = netloc.partition("?")
    path, _, query2 = tail.partition("?")
    query = query or query2
    kwargs: dict[str, Any] = {}
    if "@" in netloc:
        auth, netloc = netloc.rsplit("@", 1)
        user, colon, password = auth.partition(":")
        if colon:
            kwargs["password"] = unquote(password)
            if user:
                kwargs["username"] = unquote(user)
        elif user:
            kwargs["password"] = unquote(user)   # redis://secret@host, as redis-py reads it
    if path not in ("", "0"):
        raise ClusterUrlError(f"a Redis Cluster has only database 0, not {path!r}")
    nodes = [host_port(part, url, DEFAULT_PORT, ClusterUrlError)
             for part in netloc.split(",") if part.strip()]
    if not nodes:
        raise ClusterUrlError(f"a cluster URL names at least one host:port: {redacted(url)!r}")
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name in _FLOAT_OPTIONS:
            try:
                kwargs[name] = float(value)
            except ValueError:
                raise ClusterUrlError(f"{name} must be a number of seconds, not {value!r}") \
                    from None
        elif name in _BOOL_OPTIONS:
            kwargs[name] = value.lower() not in ("0", "false", "no", "off", "")
        elif name in _TEXT_OPTIONS:
            kwargs[name] = value
        else:
            known = ", ".join(_FLOAT_OPTIONS + _BOOL_OPTIONS + _TEXT_OPTIONS)
            raise ClusterUrlError(f"unknown option {name!r} in the cluster URL "
                                  f"(known: {known})")
    if scheme.lower() == "rediss+cluster":
        kwargs["ssl"] = True
    return nodes, kwargs


#: How often a cluster client retries a command itself (after a connection error, with a
#: refresh of the slot map) before the error reaches emqtasks: 3 times within about 0.7 s.
#: redis-py's default went from 3 tries over seconds (7.x) to 10 (8.x); pinned here, an
#: outage longer than a second reaches the worker's own retry, which logs it once and
#: backs off, whichever redis-py is installed.
CLUSTER_RETRIES = 3


def cluster_backoff() -> EqualJitterBackoff:
    """The wait before each of a cluster client's own retries: 50, 100, 200 ms (halves
    jittered)."""
    return EqualJitterBackoff(cap=0.4, base=0.025)


def connect_cluster(url: str, **defaults: Any) -> RedisCluster:
    """A cluster client for a ``redis+cluster://`` URL; ``defaults`` (timeouts, decoding)
    apply unless the URL sets them.

    Unlike a plain client it connects at once: it reads the slot map from the first
    startup node that answers. When none does, the error is redis-py's ConnectionError
    (what a plain client raises on its first command), not its RedisClusterException.
    """
    nodes, kwargs = parse_url(url)
    options = {**defaults, **kwargs}
    try:
        startup = [ClusterNode(h, p) for h, p in nodes]  # type: ignore[no-untyped-call]
        return RedisCluster(startup_nodes=startup,
                            retry=Retry(cluster_backoff(), CLUSTER_RETRIES), **options)
    except RedisClusterException as exc:
        raise RedisConnectionError(f"no Redis Cluster node answered: {exc}") from exc


def is_cluster(client: Any) -> bool:
    return isinstance(client, RedisCluster)


def scan_keys(client: Any, match: str, near: str, count: int = 1000) -> Iterator[str]:
    """Keys matching ``match`` on the server that holds ``near``: the whole server for a
    plain client; on a cluster only the node serving ``near``'s slot, where a hash-tagged
    pattern's keys all live (the other nodes are not asked)."""
    if not is_cluster(client):
        return client.scan_iter(match=match, count=count)  # type: ignore[no-any-return]
    return client.scan_iter(match=match, count=count,  # type: ignore[no-any-return]
                            target_nodes=client.get_node_from_key(near))


def node_kwargs(client: Any, near: str) -> dict[str, Any]:
    """Keyword arguments that send a server-level command (CONFIG GET, INFO) to the node
    holding ``near``: none for a plain client."""
    if not is_cluster(client):
        return {}
    return {"target_nodes": client.get_node_from_key(near)}


def node_client(client: Any, near: str | None) -> Any:
    """The client whose pipelines go to the node holding ``near`` on one connection (the
    node's own client; redis-py's cluster pipeline would route each command on its own,
    and a keyless one such as WAIT to a random node): ``client`` itself when it is not a
    cluster client or ``near`` is None."""
    if near is None or not is_cluster(client):
        return client
    node = client.get_node_from_key(near)
    if node.redis_connection is None:   # a node not yet connected to
        client.get_redis_connection(node)
    return node.redis_connection
