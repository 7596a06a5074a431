"""Tasks of tests/test_sentry.py's real worker: with EMQ_SENTRY_FILE set, Sentry's client
in the master and every child writes each event it would send as one JSON line to that file
(a transport of its own: never the network)."""

from __future__ import annotations

import json
import os
import signal

import sentry_sdk
from sentry_sdk.envelope import Envelope
from sentry_sdk.transport import Transport

import emqtasks.contrib.sentry
from emqtasks import task


class FileTransport(Transport):
    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def capture_envelope(self, envelope: Envelope) -> None:
        event = envelope.get_event()
        if event is not None:
            line = json.dumps({"pid": os.getpid(), "event": event}, default=str) + "\n"
            with open(self.path, "a") as f:   # one append per event: lines never interleave
                f.write(line)


if os.environ.get("EMQ_SENTRY_FILE"):
    emqtasks.contrib.sentry.init(dsn="https://key@sentry.invalid/1",
                                 transport=FileTransport(os.environ["EMQ_SENTRY_FILE"]),
                                 default_integrations=False, auto_enabling_integrations=False)


@task(name="sentry_w.fails", group="shop-1", max_attempts=1)
def fails(order: int) -> None:
    sentry_sdk.capture_message(f"charging order {order}")
    raise LookupError(f"no order {order}")


@task(name="sentry_w.dies", group="shop-2", max_attempts=1)
def dies() -> None:
    """Kills its own child (as the OOM killer would): the master settles the job."""
    os.kill(os.getpid(), signal.SIGKILL)
