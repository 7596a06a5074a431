"""Celery's task states, by Celery's names (``celery.states``), for ``AsyncResult.state``.

What each of our job states reads as (producer/result.py ``state_of``):

=========================================  ==========
ours                                        Celery's
=========================================  ==========
no row (unknown id, or its ttl passed)      PENDING
pending, delayed, waiting (a workflow step)  PENDING
pending or delayed after a spent attempt    RETRY
active                                      STARTED
done                                        SUCCESS
dead                                        FAILURE
cancelled, expired, skipped                 REVOKED
=========================================  ==========

RECEIVED, REJECTED and IGNORED are here for code that names them; no job reads as them.
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

#: The states a job does not leave (``AsyncResult.ready()``).
READY_STATES = frozenset({SUCCESS, FAILURE, REVOKED})
UNREADY_STATES = frozenset({PENDING, RECEIVED, STARTED, REJECTED, RETRY})
#: The states whose result is an exception.
EXCEPTION_STATES = frozenset({RETRY, FAILURE, REVOKED})
#: The states ``get(propagate=True)`` raises in.
PROPAGATE_STATES = frozenset({FAILURE, REVOKED})
ALL_STATES = frozenset({PENDING, RECEIVED, STARTED, SUCCESS, FAILURE, RETRY, REVOKED})

__all__ = ["ALL_STATES", "EXCEPTION_STATES", "FAILURE", "IGNORED", "PENDING",
           "PROPAGATE_STATES", "READY_STATES", "RECEIVED", "REJECTED", "RETRY", "REVOKED",
           "STARTED", "SUCCESS", "UNREADY_STATES"]
