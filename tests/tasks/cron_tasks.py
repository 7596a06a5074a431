"""A task with a schedule declared in code (``@task(schedule=cron(...))``): only the cron test
imports this module, so no other test worker keeps its minutely schedule."""

from __future__ import annotations

import time

from emqtasks import cron, default_app, task


@task(name="c.minutely", schedule=cron("* * * * *", tz="Europe/Paris"))
def minutely() -> None:
    default_app.client.rpush(f"t:{default_app.settings.queue}:minutely", f"{time.time():.3f}")
