"""Tasks of tests/test_sentry.py's real worker: with EMQ_SENTRY_FILE set, Sentry's client
in the master and every child writes each event it would send as one JSON line to that file
(a transport of its own: never the network). As Sentry's HTTP transport queues events for a
thread to send, this one keeps them until the client flushes: an event reaches the file only
if the process that made it flushed before it ended (the master at exit, by Sentry's atexit
integration; a child by the finalizer emqtasks.contrib.sentry sets)."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import sentry_sdk
from sentry_sdk.envelope import Envelope
from sentry_sdk.integrations.atexit import AtexitIntegration
from sentry_sdk.transport import Transport

import emqtasks.contrib.sentry
from emqtasks import task


class FileTransport(Transport):
    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self.queued: list[str] = []

    def capture_envelope(self, envelope: Envelope) -> None:
        event = envelope.get_event()
        if event is not None:
            self.queued.append(json.dumps({"pid": os.getpid(), "event": event}, default=str))

    def flush(self, timeout: float, callback: Any = None) -> None:
        # A child forked while the master held events holds copies: its own only (Sentry
        # drops a second event of one event_id; the test counts them)
        lines, self.queued = self.queued, []
        for line in lines:
            if json.loads(line)["pid"] != os.getpid():
                continue
            with open(self.path, "a") as f:   # one append per event: lines never interleave
                f.write(line + "\n")


if os.environ.get("EMQ_SENTRY_FILE"):
    emqtasks.contrib.sentry.init(dsn="https://key@sentry.invalid/1",
                                 transport=FileTransport(os.environ["EMQ_SENTRY_FILE"]),
                                 integrations=[AtexitIntegration(callback=lambda *_: None)],
                                 default_integrations=False, auto_enabling_integrations=False)


@task(name="sentry_w.fails", group="shop-1", max_attempts=1)
def fails(order: int) -> None:
    sentry_sdk.capture_message(f"charging order {order}")
    raise LookupError(f"no order {order}")


@task(name="sentry_w.dies", group="shop-2", max_attempts=1)
def dies() -> None:
    """Kills its own child (as the OOM killer would): the master settles the job."""
    os.kill(os.getpid(), signal.SIGKILL)
