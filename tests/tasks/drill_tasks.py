"""The failover drill's task (tests/test_sentinel.py): nothing to do, a short lease so a job
whose holder's lease died with the primary is taken again soon."""

from __future__ import annotations

from emqtasks import task


@task(name="drill.noop", lease=1.0, retry_delay=0.05)
def noop(i: int, pad: str = "") -> int:
    return i
