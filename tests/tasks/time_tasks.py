"""Tasks for the time-fair tests: each holds its worker for a given number of ms."""

from __future__ import annotations

import time

from emqtasks import default_app, task


@task(name="ft.work", group=lambda group, ms, tag="": group, result_ttl=600)
def work(group: str, ms: float, tag: str = "") -> None:
    """Holds the child for ``ms`` milliseconds; with a tag, notes its start order."""
    if tag:
        r = default_app.client
        seq = r.incr(f"t:{default_app.settings.queue}:seq")
        r.hset(f"t:{default_app.settings.queue}:seqof", tag, seq)
    time.sleep(ms / 1000)
