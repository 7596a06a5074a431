"""The abort listener of a master: the aborts asked of it (lua/abort.lua), taken as they come.

An abort is pushed on the abort list of every master of the queue (``aborts:<worker id>``).
The listener blocks on its master's lists only while some child claims or runs a job (from
the go that sends it to claim, so an abort of a job just started is taken at once, not a
turn of the master's loop later): an idle pool sends nothing for aborts (a job that is not
running is cancelled, never aborted). Each token (job id, nonce of the attempt) is handed to
the master's main loop, which finds the attempt in its slots, asks its child to stop it
(SIGUSR1) and kills the child after the grace; a token for an attempt this master does not
run is dropped there. On a Redis Cluster there is one listener per queue, as there is one
park thread (one BLPOP cannot span slots).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ..store.queue import Queue
from .resilience import TRANSIENT, Outage
from .threads import ServerThread

log = logging.getLogger("emqtasks.worker")


class AbortListener(ServerThread):
    """Takes the aborts of the queues ``indexes`` of a master's -Q list."""

    def __init__(self, make_queues: Callable[[], list[Queue]], indexes: list[int],
                 worker_id: str, busy: threading.Event, stop: threading.Event,
                 deliver: Callable[[int, str, str], None], block: float) -> None:
        super().__init__(make_queues, indexes, stop)
        self.worker_id = worker_id
        self.busy = busy
        self.deliver = deliver
        self.block = block

    def run(self) -> None:
        outage = Outage(log, "aborts", stop=self.stop.is_set)
        queues = self.connect(outage)
        if queues is None:
            return
        while not self.stop.is_set():
            if not self.busy.wait(self.block) or self.stop.is_set():
                continue   # no job runs here: nothing to abort, nothing sent
            try:
                got = outage.call(self.pop, Queue.take_aborts, queues, self.worker_id,
                                  self.block)
            except TRANSIENT:
                continue   # only when stopping
            except Exception:
                if self.stop.is_set():
                    return
                log.exception("abort listener error; carrying on")
                self.stop.wait(1.0)
                continue
            if got is not None:
                j, job_id, nonce = got
                self.deliver(self.indexes[j], job_id, nonce)
