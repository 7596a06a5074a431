"""A module whose import makes every forked child exit at once (code 3): a broken setup, for
the test that a child failing at its start is not forked again in a tight loop."""

from __future__ import annotations

import os

from emqtasks import task

os.register_at_fork(after_in_child=lambda: os._exit(3))


@task(name="crash.never_runs")
def never_runs() -> None:
    return None
