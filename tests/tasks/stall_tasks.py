"""Tasks for the stall tests (test_faults_stalls.py): a master frozen or vanished, a lease
lost while the task runs. Like fault_tasks.py, each records what it did under ``t:<queue>:*``
keyed by a tag the test chooses."""

from __future__ import annotations

import time

from fault_tasks import _k, _r, _started

from emqtasks import current_job, default_app, task


@task(name="st.hold", group="hold", lease=1.0, retry_delay=0.05, max_attempts=1)
def hold(tag: str, seconds: float) -> str:
    """Runs for `seconds`, one attempt only: a lease that expires after its start kills it."""
    _started(tag)
    time.sleep(seconds)
    _r().hincrby(_k("runs"), tag, 1)
    return tag


@task(name="st.frozen", group=lambda tag, *a, **k: tag, lease=0.5, retry_delay=0.05,
      max_attempts=50)
def frozen(tag: str, seconds: float) -> str:
    """Runs for `seconds` on a short lease that only its master's renewal keeps alive."""
    _started(tag)
    time.sleep(seconds)
    _r().hincrby(_k("runs"), tag, 1)
    return tag


@task(name="st.lose_lease", group="lose", lease=30.0, retry_delay=0.05, max_attempts=5)
def lose_lease(tag: str) -> str:
    """On its first start, its own lease expires and is reaped under it (as a partition or a
    long pause would do), so the ack that follows is stale; later starts just finish."""
    _started(tag)
    if int(_r().hget(_k("starts"), tag) or 0) == 1:
        q = default_app.queue()
        q.client.zadd(q.keys.active, {current_job().id: 0}, xx=True)
        q.reap()
    _r().hincrby(_k("runs"), tag, 1)
    return tag
