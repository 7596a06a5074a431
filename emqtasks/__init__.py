"""emqtasks: a Celery-style background task runner on Redis, fair per group, without polling."""

from .app import App, JobHandle, Task, default_app, task
from .errors import Retry
from .queue import Lease, Queue

__version__ = "0.1.0"

__all__ = [
    # defining and enqueueing tasks
    "task", "App", "Task", "JobHandle", "Retry", "default_app",
    # the consumer-side verbs the worker is built on
    "Queue", "Lease",
    "__version__",
]
