"""emqtasks: a Celery-style background task runner on Redis, fair per group, without polling."""

from .app import App, default_app, task
from .errors import (
    ClusterUrlError,
    ConfigError,
    DuplicateTaskName,
    EmqError,
    InvalidArgument,
    InvalidGroup,
    InvalidJobId,
    InvalidQueueName,
    LaneFull,
    PayloadTooLarge,
    RateLimited,
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
    "task", "App", "Task", "JobHandle", "Retry", "RateLimited", "default_app",
    # the consumer-side verbs the worker is built on, and their replies
    "Queue", "Lease", "Acked", "EnqueueVerdict", "AckVerdict", "RetryVerdict",
    "ReleaseVerdict", "ExtendVerdict", "CancelVerdict",
    # the error tree
    "EmqError", "ConfigError", "ClusterUrlError", "InvalidQueueName", "InvalidJobId",
    "InvalidGroup", "InvalidArgument", "SerializationError", "PayloadTooLarge",
    "UnknownTask", "DuplicateTaskName", "ScriptError", "TaskFailed", "ResultTimeout",
    "LaneFull",
    "TimeLimitExceeded", "WorkerLost",
    "__version__",
]
