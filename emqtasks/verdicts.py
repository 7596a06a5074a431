"""The replies of the verbs, named: one enum per verb, in one place.

Every fenced verb (ack, retry, release, extend) answers ``STALE`` (value 0, falsy) when the
caller no longer holds the lease: the job was reaped and claimed again, finished, or its
row is gone. Nothing of the caller's was written then. The values are the integers the Lua
scripts (and the native module) reply with.
"""

from __future__ import annotations

from enum import Enum, IntEnum


class EnqueueVerdict(IntEnum):
    """enqueue, per job."""

    BAD_ID = -1       # refused: a malformed id (the client gate runs first)
    DUPLICATE = 0     # the id exists: nothing was written
    ENQUEUED = 1
    FULL = 2          # the lane holds its cap of waiting jobs: nothing was written
    UNREADABLE = 3    # its lane, or a book of its group, cannot be read: nothing was written
    TENANT = 4        # its group belongs to another tenant and is busy: nothing was written

    @property
    def word(self) -> str:
        """What ``JobHandle.verdict`` says: enqueued, duplicate, full or unreadable."""
        return self.name.lower()


class AckVerdict(IntEnum):
    """ack."""

    STALE = 0
    DONE = 1


class RetryVerdict(IntEnum):
    """retry (a failed job)."""

    STALE = 0
    RETRIED = 1       # into `delayed`, due after its delay
    DEAD = 2          # out of attempts, or a final failure: into `dead`

    @property
    def outcome(self) -> str:
        """The word logs and ``Outcome`` use: retry, dead or stale."""
        return ("stale", "retry", "dead")[self.value]


class ReleaseVerdict(IntEnum):
    """release (a job handed back unrun; RELEASED too when an attempt whose abort was asked
    ends ``aborted`` instead)."""

    STALE = 0
    RELEASED = 1


class ExtendVerdict(IntEnum):
    """extend, per lease."""

    STALE = 0
    EXTENDED = 1


class FireVerdict(IntEnum):
    """schedule 'fire' (one slot of a periodic schedule)."""

    GONE = -2         # the schedule was removed meanwhile: nothing written
    EARLY = -1        # the slot is after the server's now: nothing written
    DUPLICATE = 0     # the slot was handled already (by this or another master)
    ENQUEUED = 1
    SKIPPED = 2       # overlap control: the previous slot's job is still pending or running


class CancelVerdict(str, Enum):
    """cancel: equal to its plain string ('cancelled', 'missing', 'active', 'finished')."""

    CANCELLED = "cancelled"
    MISSING = "missing"         # no such row (never was, or it expired)
    ACTIVE = "active"           # running: a leased job is not interrupted
    FINISHED = "finished"       # done, cancelled, expired or aborted already

    @classmethod
    def from_reply(cls, code: int) -> CancelVerdict:
        return _CANCEL_CODES[code]

    def __str__(self) -> str:
        return self.value


_CANCEL_CODES = {1: CancelVerdict.CANCELLED, 0: CancelVerdict.MISSING,
                 -1: CancelVerdict.ACTIVE, -2: CancelVerdict.FINISHED}


class AbortVerdict(str, Enum):
    """abort (App.abort, JobHandle.abort): equal to its plain string."""

    ABORTING = "aborting"       # running: its master was asked to stop it (within ~1 s)
    CANCELLED = "cancelled"     # not started yet (pending, delayed, waiting): cancelled
    FINISHED = "finished"       # done, dead, cancelled, expired or aborted already

    def __str__(self) -> str:
        return self.value


class AbortAsk(IntEnum):
    """abort 'ask' (lua/abort.lua)."""

    NOT_RUNNING = -1    # pending, delayed or waiting: cancel it instead
    FINISHED = -2
    MISSING = 0
    ASKED = 1


class AbortedVerdict(IntEnum):
    """abort 'end' (the attempt that was stopped ends `aborted`)."""

    STALE = 0
    ABORTED = 1
