"""The emqtasks error tree: one base class, one line of docstring per error."""

from __future__ import annotations

from redis.exceptions import OutOfMemoryError

from . import _seconds


class EmqError(Exception):
    """Base class of every error emqtasks raises on purpose."""


class ConfigError(EmqError):
    """A setting is malformed (Redis URL, queue name, a tunable out of range)."""


class ClusterUrlError(ConfigError, ValueError):
    """A malformed ``redis+cluster://`` URL (a ValueError, as redis-py's URL errors are)."""


class SentinelUrlError(ConfigError, ValueError):
    """A malformed ``redis+sentinel://`` URL (no sentinel, no service name, a bad option)."""


class UnknownService(ConfigError):
    """No sentinel that answered lists the URL's service name, for as long as a failover
    may take (store/sentinel.py, UNKNOWN_AFTER): a misspelt name, not an outage."""


class NativeUnavailable(ConfigError):
    """EMQ_NATIVE=require, and the server has no emq module (or this user may not run it)."""


class WrongEventLoop(EmqError, RuntimeError):
    """An async call (``adelay``, ``aget``...) on connections opened by another event loop:
    nothing was sent (an App opens a pool per loop; a queue object is its loop's)."""


class InvalidQueueName(ConfigError):
    """A queue name outside letters, digits and ``_ . -`` (1 to 64 characters)."""


class InvalidJobId(EmqError):
    """A caller-chosen job id that does not match the documented id pattern."""


class InvalidGroup(EmqError):
    """A group name that is empty, not a string, not UTF-8, or longer than 256 bytes."""


class InvalidArgument(EmqError, ValueError):
    """A number, count or name that is of the wrong type, not finite or out of range (see
    emqtasks.validate): a task option, a countdown or eta, a limit; nothing was written."""


class SerializationError(EmqError):
    """Task arguments or a result that JSON cannot encode, or a payload that cannot be decoded."""


class PayloadTooLarge(SerializationError):
    """An encoded payload over the configured size limit (default 1 MB)."""


class ResultTooLarge(SerializationError):
    """A task's result whose JSON is over its size limit (max_result_bytes, default 1 MB):
    the attempt fails, retried or dead by the task's retry policy."""


class AckRefused(EmqError):
    """The server refused to store a job's result for good (an error reply, or the connection
    cut on that call alone, as for a result over its proto-max-bulk-len): the attempt fails."""


class NotDurable(EmqError):
    """A durable write (``durable=``) that fewer replicas confirmed than asked within its
    timeout: it IS written on the primary, but may be lost with it; sending the same job
    id again is safe (it answers duplicate if the write survived)."""

    def __init__(self, job_ids: list[str], confirmed: int, wanted: int,
                 what: str = "the write", aof: bool = False) -> None:
        self.job_ids = job_ids
        self.confirmed = confirmed
        self.wanted = wanted
        #: What the write answered (the verdicts of an enqueue, the Acked of an ack).
        self.reply: object = None
        copies = "fsynced on" if aof else "received by"
        shown = ", ".join(job_ids[:3]) + (f" and {len(job_ids) - 3} more"
                                          if len(job_ids) > 3 else "")
        super().__init__(f"{what} ({shown or 'no job'}) was {copies} {confirmed} of the "
                         f"{wanted} replica(s) asked in time: it is written on the primary "
                         f"but would not survive its loss; send it again with the same "
                         f"id(s) (a duplicate if it survived)")


class LaneFull(EmqError):
    """``delay()`` / ``apply_async()`` into a lane that holds its cap of waiting jobs."""

    def __init__(self, group: str, job_id: str) -> None:
        self.group = group
        self.job_id = job_id
        super().__init__(f"lane {group!r} is full (its max_size of waiting jobs): job "
                         f"{job_id} was not enqueued")


class ServerFull(EmqError, OutOfMemoryError):
    """The server is full (maxmemory, policy noeviction) and refused to take new work: nothing
    was written (also a redis OutOfMemoryError); what runs or settles work goes on."""

    #: The server's own refusal, as it answered.
    reply: str = ""

    @classmethod
    def of(cls, exc: Exception) -> ServerFull:
        made = cls(f"the server is full (used memory over its maxmemory, policy noeviction) "
                   f"and refused the write: nothing was written ({exc})")
        made.reply = str(exc)
        return made


class CorruptKey(EmqError):
    """A key of the queue holds the wrong type, or a value its verbs cannot read (written by
    hand, or by another program): the verb wrote nothing; ``emqtasks check`` names every such
    key, ``emqtasks check --repair`` mends what it can."""

    def __init__(self, message: str, keys: tuple[str, ...] = ()) -> None:
        self.keys = keys
        super().__init__(message)


class UnknownTask(EmqError):
    """A task name that is not in the registry of this process."""


class DuplicateTaskName(EmqError):
    """Two different functions registered under one task name."""


class ScriptError(EmqError):
    """A Lua verb answered with an error code the client did not expect."""


class TaskFailed(EmqError):
    """A job ended in ``dead``: carries the remote exception type, message and traceback."""

    def __init__(self, job_id: str, error: str | None) -> None:
        self.job_id = job_id
        self.error = error or ""
        first = self.error.strip().splitlines()[-1] if self.error.strip() else "unknown error"
        super().__init__(f"job {job_id} failed: {first}")


class WorkflowError(EmqError, ValueError):
    """A workflow (chain, group, chord) refused at enqueue: nothing of it was written."""


class EmptyGroup(WorkflowError):
    """A group (or a chord's header) without a single signature."""


class NestingTooDeep(WorkflowError):
    """No longer raised (workflows nest freely, as Celery's canvas): kept for the code that
    imports or catches it."""


class WorkflowTooLarge(WorkflowError, PayloadTooLarge):
    """A step's arguments plus the results it collects could exceed max_payload_bytes."""


class ResultTimeout(EmqError, TimeoutError):
    """``JobHandle.get(timeout=...)``: the job had not finished in time (still a TimeoutError)."""


class TimeLimitExceeded(EmqError):
    """A job ran past its time limit: raised in the task (SIGTERM), else its child is killed."""


class WorkerLost(EmqError):
    """The child running a job died (killed, crashed, out of memory) before it finished."""


class RateLimited(EmqError):
    """Raise inside a task that hit an outside limit (an HTTP 429): its job goes back to the
    head of its lane without spending an attempt, and its whole group sits out ``delay``
    seconds (other groups are not affected)."""

    def __init__(self, delay: float, reason: str = "") -> None:
        self.delay = _seconds.seconds(delay, "RateLimited delay", InvalidArgument)
        self.reason = reason
        super().__init__(reason or f"rate limited: the group sits out {self.delay:g}s")


class Retry(EmqError):
    """Raise inside a task to ask for a retry after ``delay`` seconds (None: the task's own delay).

    It counts as an attempt: out of attempts, the job lands in ``dead``. ``exc`` is the
    failure that asked for it (``Task.retry(exc=...)``, Celery's spelling), kept in the
    job's error text.
    """

    def __init__(self, delay: float | None = None, reason: str = "",
                 exc: BaseException | None = None) -> None:
        self.delay = None if delay is None else _seconds.seconds(delay, "a Retry delay",
                                                                 InvalidArgument)
        self.reason = reason
        self.exc = exc
        when = "" if delay is None else f" in {self.delay:g}s"
        super().__init__(reason or (f"retry{when}: {exc!r}" if exc is not None
                                    else f"retry requested (delay={delay})"))


class Reject(EmqError):
    """Raise inside a task to refuse the job (Celery's ``Reject``): ``requeue=False`` sends
    it to ``dead`` at once, whatever its retry policy; ``requeue=True`` puts it back on the
    queue at once, as a retry without delay (it spends an attempt, so a job rejected every
    time ends in ``dead`` rather than loop for ever)."""

    def __init__(self, reason: object = None, requeue: bool = False) -> None:
        self.reason = reason
        self.requeue = bool(requeue)
        super().__init__(f"rejected{' (requeued)' if requeue else ''}"
                         f"{'' if reason is None else f': {reason}'}")


class MaxRetriesExceededError(EmqError):
    """``Task.retry()`` past the task's ``max_retries`` (without an ``exc`` to re-raise): the
    job goes to ``dead`` at once."""


class SoftTimeLimitExceeded(EmqError):
    """Raised inside a task at its ``soft_time_limit`` (before the hard ``time_limit``): the
    task may catch it, clean up and return; uncaught, it fails the attempt."""


class ScheduleError(EmqError):
    """A schedule refused where it is declared (decorator, App.schedule, CLI): nothing stored."""


class InvalidCron(ScheduleError):
    """A malformed cron expression (5 fields needed), or one that never fires."""


class UnknownTimezone(ScheduleError):
    """A time zone that is not an IANA name zoneinfo knows (``UTC``, ``Europe/Paris``...)."""


class InvalidInterval(ScheduleError):
    """An ``every`` that is not a whole number of seconds >= 1."""


class InvalidScheduleName(ScheduleError):
    """A schedule name that cannot be part of a job id: 1-64 letters, digits, ``_ . -``."""


class InvalidSchedule(ScheduleError):
    """Schedule options that do not fit: both or neither of cron/every, a catch-up policy,
    jitter, or arguments the task does not take."""


class UnknownSchedule(ScheduleError):
    """No schedule of that name is stored on the queue."""
class NoCurrentJob(EmqError, RuntimeError):
    """``current_job()`` was called outside a task run by a worker."""


class AbortUnavailable(EmqError, NotImplementedError):
    """Kept for code that caught it: ``AsyncResult.revoke(terminate=True)`` raised it before
    aborting a running job existed; it now aborts (``App.abort``), and nothing raises this."""


class UnknownJob(EmqError):
    """An abort of a job id the queue has no row for (never enqueued, or its row expired)."""


class Aborted(EmqError):
    """Raised inside a task whose job was aborted (``App.abort``, ``JobHandle.abort``): at
    the next bytecode of a sync task (a signal from its master), as the cancellation of an
    async one. The job ends ``aborted`` whatever the task does then; one that does not
    return within its ``abort_grace`` has its child killed."""
