"""``Queue``: the verbs of one queue, one method per Lua verb, for producers, workers and admins.

One class, its methods by role in a module each: the hot verbs (hot.py), the admin verbs
(admin.py), workflows and schedules (flows.py), the reads of rows and books (reads.py), on
what they share (core.py: the client, the keys, the scripts, the queue's groups); the rows
and replies they decode are replies.py's. This module names them all, so
``emqtasks.store.queue`` (and its old path ``emqtasks.queue``) stays where callers import
them from.
"""

from __future__ import annotations

from .admin import FAIRNESS_MODES, Admin, default_arg, rate_args
from .flows import Flows
from .hot import ENQUEUE_CHUNK, HotPath
from .reads import LANES_CHUNK, Reads
from .replies import (
    ENDED,
    Acked,
    FoundPage,
    LaneHead,
    Lease,
    NewJob,
    Outcome,
    Reaped,
    WorkflowSent,
    job_view,
)

__all__ = ["ENDED", "ENQUEUE_CHUNK", "FAIRNESS_MODES", "LANES_CHUNK", "Acked", "FoundPage",
           "LaneHead", "Lease", "NewJob", "Outcome", "Queue", "Reaped", "WorkflowSent",
           "default_arg", "job_view", "rate_args"]


class Queue(HotPath, Admin, Flows, Reads):
    """One queue on one Redis client. Thread-compatible like the client it wraps."""
