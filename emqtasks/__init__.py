"""emqtasks: a Celery-style background task runner on Redis, fair per group, without polling."""

from ._version import __version__
from .errors import (
    Aborted,
    AbortUnavailable,
    AckRefused,
    ClusterUrlError,
    ConfigError,
    CorruptKey,
    DuplicateTaskName,
    EmptyGroup,
    EmqError,
    InvalidArgument,
    InvalidCron,
    InvalidGroup,
    InvalidInterval,
    InvalidJobId,
    InvalidQueueName,
    InvalidSchedule,
    InvalidScheduleName,
    LaneFull,
    MaxRetriesExceededError,
    NativeUnavailable,
    NestingTooDeep,
    NoCurrentJob,
    NotDurable,
    PayloadTooLarge,
    RateLimited,
    Reject,
    ResultTimeout,
    ResultTooLarge,
    Retry,
    ScheduleError,
    ScriptError,
    SentinelUrlError,
    SerializationError,
    ServerFull,
    SoftTimeLimitExceeded,
    TaskFailed,
    TimeLimitExceeded,
    UnknownJob,
    UnknownSchedule,
    UnknownService,
    UnknownTask,
    UnknownTimezone,
    WorkerLost,
    WorkflowError,
    WorkflowTooLarge,
)
from .ops import embedded as _embedded  # noqa: F401  (registers ``embedded`` URLs with connect)
from .producer import states
from .producer.app import App, default_app, on, task
from .producer.context import JobContext, JobLogFilter, current_job
from .producer.result import AsyncResult
from .producer.task import JobHandle, Task
from .schedules.cron import Cron, Every, cron, every
from .schedules.schedule import Schedule, ScheduleInfo
from .store.durable import Durable
from .store.queue import Acked, Lease, Queue
from .verdicts import (
    AbortVerdict,
    AckVerdict,
    CancelVerdict,
    EnqueueVerdict,
    ExtendVerdict,
    FireVerdict,
    ReleaseVerdict,
    RetryVerdict,
)
from .workflows.canvas import Chain, Chord, Group, Signature, WorkflowHandle, chain, chord, group

__all__ = [
    # defining and enqueueing tasks
    "task", "App", "Task", "JobHandle", "Retry", "Reject", "RateLimited", "default_app",
    # durable writes (WAIT / WAITAOF)
    "Durable",
    # following a job by its id, as Celery does
    "AsyncResult", "states",
    # workflows
    "chain", "group", "chord", "Signature", "Chain", "Group", "Chord", "WorkflowHandle",
    # periodic schedules
    "cron", "every", "Cron", "Every", "Schedule", "ScheduleInfo",
    # inside a task, and hooks
    "current_job", "JobContext", "JobLogFilter", "on",
    # the consumer-side verbs the worker is built on, and their replies
    "Queue", "Lease", "Acked", "EnqueueVerdict", "AckVerdict", "RetryVerdict",
    "ReleaseVerdict", "ExtendVerdict", "CancelVerdict", "FireVerdict",
    # the error tree
    "EmqError", "ConfigError", "ClusterUrlError", "SentinelUrlError", "UnknownService",
    "InvalidQueueName", "NativeUnavailable",
    "InvalidJobId",
    "InvalidGroup", "InvalidArgument", "SerializationError", "PayloadTooLarge",
    "ResultTooLarge", "AckRefused", "ServerFull", "NotDurable",
    "UnknownTask", "DuplicateTaskName", "ScriptError", "TaskFailed", "ResultTimeout",
    "LaneFull", "CorruptKey", "WorkflowError", "EmptyGroup", "NestingTooDeep", "WorkflowTooLarge",
    "TimeLimitExceeded", "SoftTimeLimitExceeded", "MaxRetriesExceededError",
    "WorkerLost", "NoCurrentJob", "ScheduleError", "InvalidCron",
    "UnknownTimezone", "InvalidInterval", "InvalidScheduleName", "InvalidSchedule",
    "UnknownSchedule", "AbortUnavailable", "Aborted", "UnknownJob", "AbortVerdict",
    "__version__",
]
