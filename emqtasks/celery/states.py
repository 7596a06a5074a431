"""Celery's task state names (``celery.states``), as constants.

emqtasks' own statuses map onto them (``AsyncResult.state``): pending and delayed are
PENDING, active STARTED, a job waiting for its next attempt RETRY, done SUCCESS, dead
FAILURE, cancelled and expired REVOKED.
"""

from __future__ import annotations

PENDING = "PENDING"
RECEIVED = "RECEIVED"
STARTED = "STARTED"
SUCCESS = "SUCCESS"
FAILURE = "FAILURE"
REVOKED = "REVOKED"
REJECTED = "REJECTED"
RETRY = "RETRY"
IGNORED = "IGNORED"

READY_STATES = frozenset({SUCCESS, FAILURE, REVOKED})
UNREADY_STATES = frozenset({PENDING, RECEIVED, STARTED, REJECTED, RETRY})
EXCEPTION_STATES = frozenset({RETRY, FAILURE, REVOKED})
PROPAGATE_STATES = frozenset({FAILURE, REVOKED})
ALL_STATES = frozenset({PENDING, RECEIVED, STARTED, SUCCESS, FAILURE, RETRY, REVOKED})

__all__ = ["PENDING", "RECEIVED", "STARTED", "SUCCESS", "FAILURE", "REVOKED", "REJECTED",
           "RETRY", "IGNORED", "READY_STATES", "UNREADY_STATES", "EXCEPTION_STATES",
           "PROPAGATE_STATES", "ALL_STATES"]
