"""Connecting to a server: one place for URLs, TLS defaults, timeouts and reply decoding."""

from __future__ import annotations

from typing import Any

import redis

from . import embedded
from .cluster import connect_cluster, is_cluster_url

#: Longer than any blocking call emqtasks makes (parks and result waits are capped at
#: MAX_BLOCK), so a BLPOP never trips the socket timeout, yet a dead peer is noticed.
SOCKET_TIMEOUT = 30.0
MAX_BLOCK = 20.0
#: A server that accepts a connection but never answers the handshake (TLS to a plain port,
#: a stuck proxy) is reported after this long, not after SOCKET_TIMEOUT.
CONNECT_TIMEOUT = 5.0
ENCODING_ERRORS = "surrogateescape"
#: What a ``rediss://`` client checks unless its URL says otherwise (redis-py's own defaults
#: today, stated here so a change of library default cannot turn them off).
TLS_DEFAULTS = {"ssl_cert_reqs": "required", "ssl_check_hostname": True}


def connect(url: str, single_thread: bool = False) -> Any:
    """A redis-py client for a URL, with replies decoded as text.

    ``embedded`` / ``embedded:PATH`` start (or reuse) the embedded development server;
    ``redis+cluster://host:port[,host:port...]`` gives a Redis Cluster client (cluster.py).
    ``single_thread`` keeps one connection instead of a pool checkout per command (about a
    sixth of a worker child's time per job); only for a client one thread uses.

    Replies decode with ``surrogateescape``: a row holding bytes that are not UTF-8 (written
    by something other than emqtasks) reads back with them as lone surrogates instead of
    failing the whole reply, so a worker can dead-letter that job (serialization.loads_args
    refuses such a payload) rather than crash on every claim of it.
    ``rediss://`` verifies the server's certificate and host name unless the URL's
    ``ssl_cert_reqs`` / ``ssl_check_hostname`` say otherwise.
    """
    tls = TLS_DEFAULTS if url.lower().startswith(("rediss://", "rediss+cluster://")) else {}
    if is_cluster_url(url):
        return connect_cluster(url, decode_responses=True, socket_timeout=SOCKET_TIMEOUT,
                               socket_connect_timeout=CONNECT_TIMEOUT,
                               encoding_errors=ENCODING_ERRORS, **tls)
    return redis.Redis.from_url(embedded.resolve(url), decode_responses=True,
                                encoding_errors=ENCODING_ERRORS,
                                socket_timeout=SOCKET_TIMEOUT,
                                socket_connect_timeout=CONNECT_TIMEOUT,
                                single_connection_client=single_thread, **tls)
