"""An App's async side: one ``redis.asyncio`` client (one connection pool) per event loop.

A pool's connections and its wait for a free one belong to the loop that made them, so an
App used from several loops (a server's loop, a test runner's loop per test, threads each
running their own) opens a pool in each, on its first async call there; ``await
app.aclose()`` closes the running loop's. A loop that was closed without it leaves its
pool behind: it is dropped (its sockets with it) when a later call finds it closed.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from typing import Any

from ..store.aconnection import aconnect
from ..store.aqueue import AsyncQueue


class _Opened:
    """One loop's client and the queue objects made on it."""

    __slots__ = ("client", "queues")

    def __init__(self, client: Any) -> None:
        self.client = client
        self.queues: dict[str, AsyncQueue] = {}


class LoopClients:
    """An App's async clients by event loop (the App's settings give the URL)."""

    def __init__(self) -> None:
        self._opened: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Opened] = \
            weakref.WeakKeyDictionary()
        self._lock = threading.Lock()    # loops of several threads may open at once

    def queue(self, url: str, name: str, autopipeline: bool | None = None) -> AsyncQueue:
        """The queue ``name`` on the running loop's client (made on first use: no I/O)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            opened = self._opened.get(loop)
            if opened is None:
                for old in [lp for lp in self._opened if lp.is_closed()]:
                    del self._opened[old]
                opened = self._opened[loop] = _Opened(aconnect(url))
            q = opened.queues.get(name)
            if q is None:
                q = opened.queues[name] = AsyncQueue(opened.client, name,
                                                             autopipeline=autopipeline)
        return q

    async def aclose(self) -> None:
        """Close the running loop's pool (the next async call opens a new one)."""
        with self._lock:
            opened = self._opened.pop(asyncio.get_running_loop(), None)
        if opened is not None:
            await opened.client.aclose()

    def forget(self) -> None:
        """Drop every loop's client unclosed (App.close, App.configure: a loop's pool can
        only be closed on it, by aclose)."""
        with self._lock:
            self._opened = weakref.WeakKeyDictionary()
