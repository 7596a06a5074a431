"""AsyncResult: a job followed by its id alone, as Celery's ``AsyncResult`` (issue 27).

Built on :class:`~emqtasks.producer.task.JobHandle`: ``get()`` is the handle's (the same
blocking wait on the job's own notification key), ``state`` reads the row once and maps our
job states onto Celery's (producer/states.py says how). Nothing here is cached: each property
reads the row afresh, as Celery's do.
"""

from __future__ import annotations

from typing import Any

from .. import serialization
from ..errors import InvalidArgument, TaskFailed
from ..verdicts import AbortVerdict, CancelVerdict
from . import remote_error, states
from .app import App, default_app
from .task import JobHandle

__all__ = ["AsyncResult", "state_of"]

#: Our job states as Celery's (a row that is gone, or never was, reads PENDING as in Celery).
_STATES = {"pending": states.PENDING, "delayed": states.PENDING, "waiting": states.PENDING,
           "active": states.STARTED, "done": states.SUCCESS, "dead": states.FAILURE,
           "cancelled": states.REVOKED, "expired": states.REVOKED, "skipped": states.REVOKED,
           "aborted": states.REVOKED}


def state_of(row: dict[str, Any] | None) -> str:
    """Celery's state of a job row (``App.job()``'s view); RETRY for a job waiting again
    after a spent attempt (a failure retried, a lease that expired under it)."""
    if row is None:
        return states.PENDING
    state = row.get("state") or ""
    if state in ("pending", "delayed") and (row.get("attempts") or 0) > 0:
        return states.RETRY
    return _STATES.get(state, states.PENDING)


class AsyncResult:
    """One job by its id, on ``app`` (None: the default App) and its queue (None: the
    App's; a job sent to another queue needs ``queue=``)."""

    def __init__(self, id: str, app: App | None = None, *, queue: str | None = None) -> None:
        self.app = app if app is not None else default_app
        self.id = id
        self.handle: JobHandle[Any] = JobHandle(self.app.queue(queue), id, "enqueued", self.app)

    @classmethod
    def of(cls, handle: JobHandle[Any]) -> AsyncResult:
        """The AsyncResult of a handle ``delay()`` / ``apply_async()`` returned."""
        app = handle._app if handle._app is not None else default_app
        result = cls(handle.id, app, queue=handle._queue.name)
        result.handle = handle     # its verdict (duplicate, on_commit) and workflow kept
        return result

    def _row(self) -> dict[str, Any] | None:
        return self.handle.info()

    # -- the state ----------------------------------------------------------------------
    @property
    def state(self) -> str:
        """PENDING, STARTED, RETRY, SUCCESS, FAILURE or REVOKED (``emqtasks.states``)."""
        return state_of(self._row())

    @property
    def status(self) -> str:
        return self.state

    def ready(self) -> bool:
        """True once the job ended: SUCCESS, FAILURE or REVOKED."""
        return self.state in states.READY_STATES

    def successful(self) -> bool:
        return self.state == states.SUCCESS

    def failed(self) -> bool:
        return self.state == states.FAILURE

    @property
    def result(self) -> Any:
        """The return value once SUCCESS; once FAILURE the task's own exception rebuilt
        (``str()`` is its message; a TaskFailed when its class does not import here); once
        REVOKED a TaskFailed; None before (Celery's ``result``; a RETRY's last error is
        ``traceback``)."""
        row = self._row()
        state = state_of(row)
        if row is None or state not in states.READY_STATES:
            return None
        if state == states.SUCCESS:
            return serialization.loads_result(row.get("result"))
        return self._failure(row)

    @property
    def info(self) -> Any:
        """Celery's alias of ``result``."""
        return self.result

    @property
    def traceback(self) -> str | None:
        """The failed attempt's traceback (FAILURE or RETRY; the whole error text when it
        holds none), or None."""
        row = self._row()
        if row is None or state_of(row) not in (states.FAILURE, states.RETRY):
            return None
        error: str | None = row.get("error")
        parts = remote_error.parse(error)
        return parts.traceback if parts is not None else error

    def _failure(self, row: dict[str, Any]) -> Exception:
        state = row.get("state")
        if state == "aborted":
            return TaskFailed(self.id, f"aborted: {row.get('error') or ''}".rstrip(": "))
        failed = TaskFailed(self.id, "cancelled" if state == "cancelled" else row.get("error"))
        return _own(failed) if state == "dead" else failed

    # -- waiting ------------------------------------------------------------------------
    def get(self, timeout: float | None = None, propagate: bool = True,
            interval: float | None = None) -> Any:
        """The return value, waiting up to ``timeout`` seconds (ResultTimeout, a
        TimeoutError, past it). A job that failed raises the task's own exception, rebuilt
        as ``cls(message)`` when its class imports here (its ``__cause__`` the TaskFailed
        with the traceback), else TaskFailed; one revoked or expired raises TaskFailed.
        With ``propagate=False`` that error is returned instead. ``interval``: the longest
        single block on the server (JobHandle.get's ``poll``)."""
        try:
            return self.handle.get(timeout=timeout, poll=interval)
        except TaskFailed as failed:
            # (a cancelled, expired or skipped job's text names no exception: TaskFailed)
            error = _own(failed)
            if not propagate:
                return error
            if error is failed:
                raise
            raise error from failed

    def wait(self, timeout: float | None = None, propagate: bool = True,
             interval: float | None = None) -> Any:
        """Celery's alias of ``get``."""
        return self.get(timeout=timeout, propagate=propagate, interval=interval)

    # -- acting on the job --------------------------------------------------------------
    def forget(self) -> None:
        """Delete the finished job's row and result (a dead one leaves ``dead`` too); its
        state reads PENDING after, as an unknown id's. A job not finished is refused
        (InvalidArgument): ``revoke()`` it first. An unknown id is a no-op."""
        if self.handle._sync().forget(self.id) == -1:
            raise InvalidArgument(f"job {self.id} has not finished ({self.handle.status()}): "
                                  "forget() deletes a finished job; revoke() it first")

    def revoke(self, terminate: bool = False,
               signal: Any = None) -> CancelVerdict | AbortVerdict:
        """Cancel the job if it has not started (``App.cancel``): it ends REVOKED, never
        runs. Returns the verdict: CANCELLED, MISSING (no such job), ACTIVE (running: left
        to run, as Celery's revoke without terminate) or FINISHED. ``terminate=True`` (or a
        ``signal``: the abort's own signal is used whatever it names) aborts it instead
        (``abort()``): a running job is stopped, ending REVOKED (``aborted``)."""
        if terminate or signal is not None:
            return self.abort()
        return self.handle._sync().cancel(self.id)

    def abort(self) -> AbortVerdict:
        """``JobHandle.abort()``: ABORTING, CANCELLED or FINISHED; UnknownJob."""
        return self.handle.abort()

    # -- a workflow step's neighbours ----------------------------------------------------
    @property
    def children(self) -> list[AsyncResult]:
        """The workflow steps this one releases when it succeeds, as its row lists them."""
        return [self._other(i) for i in self.handle._sync().links(self.id)[1]]

    @property
    def parents(self) -> list[AsyncResult]:
        """The workflow steps this one waits for (a chord's callback: every member)."""
        return [self._other(i) for i in self.handle._sync().links(self.id)[2]]

    @property
    def parent(self) -> AsyncResult | None:
        """The step before this one in a chain (None: a plain job, a first step, or a
        chord's callback, whose members are ``parents``)."""
        ids = self.handle._sync().links(self.id)[2]
        return self._other(ids[0]) if len(ids) == 1 else None

    def _other(self, job_id: str) -> AsyncResult:
        return AsyncResult(job_id, self.app, queue=self.handle._queue.name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AsyncResult) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"<AsyncResult: {self.id}>"

    def __str__(self) -> str:
        return self.id


def _own(failed: TaskFailed) -> Exception:
    """The task's own exception from a TaskFailed's text, the TaskFailed if it cannot be."""
    own = remote_error.rebuild(failed.error)
    if own is None:
        return failed
    own.__cause__ = failed
    return own
