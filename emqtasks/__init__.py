"""emqtasks: a Celery-style background task runner on Redis, fair per group, without polling."""

from .app import App, default_app, on, task
from .context import JobContext, JobLogFilter, current_job
from .errors import (
    ClusterUrlError,
    ConfigError,
    DuplicateTaskName,
    EmqError,
    InvalidArgument,
    InvalidGroup,
    InvalidJobId,
    InvalidQueueName,
    NoCurrentJob,
    PayloadTooLarge,
    ResultTimeout,
    Retry,
    ScriptError,
    SerializationError,
    TaskFailed,
    TimeLimitExceeded,
    UnknownTask,
    WorkerLost,
)
from .queue import Acked, Lease, Queue
from .task import JobHandle, Task
from .verdicts import (
    AckVerdict,
    CancelVerdict,
    EnqueueVerdict,
    ExtendVerdict,
    ReleaseVerdict,
    RetryVerdict,
)

__version__ = "0.1.0"

__all__ = [
    # defining and enqueueing tasks
    "task", "App", "Task", "JobHandle", "Retry", "default_app",
    # inside a task, and hooks
    "current_job", "JobContext", "JobLogFilter", "on",
    # the consumer-side verbs the worker is built on, and their replies
    "Queue", "Lease", "Acked", "EnqueueVerdict", "AckVerdict", "RetryVerdict",
    "ReleaseVerdict", "ExtendVerdict", "CancelVerdict",
    # the error tree
    "EmqError", "ConfigError", "ClusterUrlError", "InvalidQueueName", "InvalidJobId",
    "InvalidGroup", "InvalidArgument", "SerializationError", "PayloadTooLarge",
    "UnknownTask", "DuplicateTaskName", "ScriptError", "TaskFailed", "ResultTimeout",
    "TimeLimitExceeded", "WorkerLost", "NoCurrentJob",
    "__version__",
]
