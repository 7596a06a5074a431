"""What every part of ``Queue`` shares: the client, the keys, the scripts, the hot path's
selection, and the reads the verbs' own errors and arguments need (the queue's groups, why a
verb refused)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from redis import ConnectionPool
from redis.exceptions import ReadOnlyError, ResponseError

from ..errors import CorruptKey
from .cluster import node_kwargs, scan_keys
from .diagnose import diagnose
from .groups import GROUP_BOOKS, group_names, queue_group_books
from .keys import QueueKeys
from .scripts import Scripts
from .selection import HotVerbs


class QueueCore:
    """One queue on one Redis client. Thread-compatible like the client it wraps."""

    def __init__(self, client: Any, name: str, native: str | None = None) -> None:
        self.client = client
        self.keys = QueueKeys(name)
        self.name = name
        self.scripts = Scripts(client)
        #: The hot verbs: the module's commands when the server has them (EMQ_NATIVE, or
        #: ``native`` = auto / off / require), else the scripts.
        self.hot = HotVerbs(client, self.scripts, native)
        self._k = self.keys.fixed

    def ping(self) -> bool:
        """One round trip to the server holding the queue (on a cluster, the node serving
        its slot), so the connection a first claim would need is open."""
        return bool(self.client.ping(**node_kwargs(self.client, self.keys.ring)))

    def server_ms(self) -> int:
        """The server's clock, in ms (on a cluster, the clock of the queue's node)."""
        return server_ms(self.client, self.keys)

    def scan(self, match: str) -> Iterator[str]:
        """Keys of this queue matching a pattern, by SCAN of the server that holds the queue
        (on a cluster, only the node serving its slot: see cluster.scan_keys)."""
        return scan_keys(self.client, match, self.keys.ring)

    def groups(self) -> set[str]:
        """Every group the queue knows of (store/groups.py): with a lane, or named by a book
        (on the ring, in flight, configured, backing off, held back, paused); a book of the
        wrong type names none (stats() names the key)."""
        k = self.keys
        lanes = [k.group_of_lane(key) for key in self.scan(k.lane_pattern)]
        pipe = self.client.pipeline(transaction=False)
        queue_group_books(pipe, k)
        replies = pipe.execute(raise_on_error=False)
        return group_names(lanes, {name: r for (name, _), r in zip(GROUP_BOOKS, replies)})

    def corrupt(self, groups: Iterable[str], outcome: str) -> CorruptKey:
        """The error for a verb refused by a key of the wrong type (or a book it cannot
        read), naming what the checker finds (store/diagnose.py)."""
        found = diagnose(self.client, self.keys, groups)
        what = "; ".join(found) if found else "a key of the queue holds the wrong type"
        return CorruptKey(f"queue {self.name}: {outcome}: {what} (emqtasks check names every "
                          "such key, emqtasks check --repair mends what it can)", tuple(found))


def server_ms(client: Any, keys: QueueKeys) -> int:
    """The server's clock (ready_at and oldest_age are server times); on a cluster, the
    clock of the node that holds the queue (a cluster pipeline refuses TIME)."""
    secs, micros = client.time(**node_kwargs(client, keys.ring))
    return int(secs) * 1000 + int(micros) // 1000


def block_seconds(timeout: float) -> float:
    """A BLPOP timeout that never means "for ever": Redis 6.2 truncates seconds x 1000 to
    whole ms, so 0.001 can become 0, which blocks indefinitely."""
    return max(timeout, 0.01)


def blpop(client: Any, keys: Sequence[str], timeout: float, bound: float | None = None) -> Any:
    """BLPOP; a pop that the server broke off because it stopped being a primary (REPLICAOF,
    a failover: "UNBLOCKED ... master -> replica") raises ReadOnlyError, what the next write
    to that server gets: an outage the worker rides out, not an error of its own.

    With ``bound`` (seconds, on this host's clock) a pop not answered by then raises
    TimeoutError and its connection is closed: a server times a BLPOP by its wall clock,
    so one whose clock was stepped back holds every pop that much longer. Not on a cluster
    client (its connections are the nodes'): there the pop is not bounded."""
    block = block_seconds(timeout)
    single = getattr(client, "connection", None)
    pool = getattr(client, "connection_pool", None)
    try:
        if bound is None or (single is None and not isinstance(pool, ConnectionPool)):
            return client.blpop(keys, timeout=block)
        conn: Any = single or pool.get_connection()   # type: ignore[union-attr]
        try:
            conn.send_command("BLPOP", *keys, block)
            return conn.read_response(timeout=bound)   # a timeout closes the connection
        finally:
            if single is None:
                pool.release(conn)   # type: ignore[union-attr]
    except ResponseError as exc:
        if str(exc).startswith("UNBLOCKED"):
            raise ReadOnlyError(str(exc)) from exc
        raise
