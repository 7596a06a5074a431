"""What a job's and a workflow's handle share: the id, what the send answered, and the
blocking or awaited queue each call follows it on."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import InvalidArgument
from ..store.queue import Queue

if TYPE_CHECKING:
    from ..store.aqueue import AsyncQueue
    from .app import App


class Handle:
    """An id on a queue; ``verdict`` is what its send answered."""

    __slots__ = ("id", "verdict", "_queue", "_app")
    #: What the id names, for the error of a handle with no async client.
    kind = "job"

    def __init__(self, queue: Queue | AsyncQueue, id_: str, verdict: str = "enqueued",
                 app: App | None = None) -> None:
        self._queue = queue
        self._app = app
        self.id = id_
        self.verdict = verdict

    @property
    def duplicate(self) -> bool:
        return self.verdict == "duplicate"

    def _sync(self) -> Queue:
        """The blocking queue (a handle from an async call takes it from its App)."""
        if isinstance(self._queue, Queue):
            return self._queue
        assert self._app is not None, "an async queue's handle is made with its App"
        return self._app.queue(self._queue.name)

    def _aio(self) -> AsyncQueue:
        """The queue on the running event loop's client of the App."""
        if self._app is not None:
            return self._app.aqueue(self._queue.name)
        if not isinstance(self._queue, Queue):
            return self._queue
        raise InvalidArgument(f"{self.kind} {self.id}: this handle was made without its App, "
                              f"so it has no async client: "
                              f"{type(self).__name__}(queue, id, app=app)")
