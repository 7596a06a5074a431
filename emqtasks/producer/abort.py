"""Aborting a job: a running one is stopped by its master, one not started is cancelled.

The server verb (lua/abort.lua 'ask') records the abort on the row against the running
attempt and tells the masters; a job not running is cancelled by the cancel verb, as
``App.cancel`` does. Between the two calls the job may change state (claimed, or finished):
the ask is made again then, a few times at most.
"""

from __future__ import annotations

from ..errors import UnknownJob
from ..store.queue import Queue
from ..verdicts import AbortAsk, AbortVerdict, CancelVerdict

#: Asks before giving up on a job that keeps changing between the ask and the cancel.
_TRIES = 5


def abort(queue: Queue, job_id: str) -> AbortVerdict:
    """ABORTING (running: its master stops it), CANCELLED (not started) or FINISHED;
    UnknownJob when the queue has no row of that id."""
    for _ in range(_TRIES):
        asked = queue.abort_ask(job_id)
        if asked == AbortAsk.ASKED:
            return AbortVerdict.ABORTING
        if asked == AbortAsk.FINISHED:
            return AbortVerdict.FINISHED
        if asked == AbortAsk.MISSING:
            break
        cancelled = queue.cancel(job_id)
        if cancelled == CancelVerdict.CANCELLED:
            return AbortVerdict.CANCELLED
        if cancelled == CancelVerdict.FINISHED:
            return AbortVerdict.FINISHED
        if cancelled == CancelVerdict.MISSING:
            break
        # ACTIVE: claimed between the two calls; ask again
    else:
        return AbortVerdict.FINISHED if queue.status(job_id) not in (None, "active") \
            else AbortVerdict.ABORTING
    raise UnknownJob(f"no job {job_id} in queue {queue.name} (never enqueued, or its row "
                     "expired)")
