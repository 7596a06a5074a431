"""What a master's threads on the server share (park.py's Parkers, aborts.py's listeners).

Each serves the queues of the -Q list that live on one server (on a Redis Cluster, one queue:
one blocking pop cannot span slots), on connections of its own (its blocking pop holds one),
made through the outage, and a stop cuts that pop short.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis.exceptions as rex

from ..store.connection import interrupt
from ..store.queue import Queue
from .resilience import TRANSIENT, Outage

T = TypeVar("T")


class ServerThread:
    """A master's thread on the queues ``indexes`` of its -Q list."""

    def __init__(self, make_queues: Callable[[], list[Queue]], indexes: list[int],
                 stop: threading.Event) -> None:
        self.make_queues = make_queues
        self.indexes = indexes
        self.stop = stop
        self._queues: list[Queue] = []   # its own connections, once connect() made them

    def run(self) -> None:
        raise NotImplementedError

    def connect(self, outage: Outage) -> list[Queue] | None:
        """Its own connections to its queues, through the outage: a server down just now
        must not end the thread (a cluster client connects as it is made). None when the
        master stopped before the server came back."""
        try:
            every = outage.call(self.make_queues)
        except TRANSIENT:
            return None
        self._queues = [every[i] for i in self.indexes]
        return self._queues

    def pop(self, fn: Callable[..., T | None], *args: Any) -> T | None:
        """fn(*args), its blocking pop; None when interrupt() cut it at a stop (a
        ConnectionError then is no outage to ride out: the thread is to end)."""
        try:
            return fn(*args)
        except rex.ConnectionError:
            if self.stop.is_set():
                return None
            raise
        except rex.ResponseError as exc:
            # a primary demoted to a replica answers its blocked clients UNBLOCKED (the park
            # sees the connection closed): nothing was popped; the next pop rides the outage
            if str(exc).startswith("UNBLOCKED"):
                return None
            raise

    def interrupt(self) -> None:
        """At a stop, after ``stop`` is set: cut the blocking pop short instead of letting
        the master wait out its timeout (up to the tick). A token popped in that instant is
        lost with the reply: a wake token is a hint (the other masters' promote finds the
        work), and an abort token is heard only while this pool ran jobs, gone by then."""
        for q in self._queues:
            interrupt(q.client)


def start(workers: Sequence[ServerThread], name: str) -> list[threading.Thread]:
    """One daemon thread each, named ``emq-<name>-<n>``, started."""
    threads = []
    for n, worker in enumerate(workers):
        t = threading.Thread(target=worker.run, name=f"emq-{name}-{n}", daemon=True)
        t.start()
        threads.append(t)
    return threads
