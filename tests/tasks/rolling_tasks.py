"""The tasks of the rolling-deploy test (tests/test_rolling_deploy.py).

Written against the API the previous release and this one share, so both register the same
names with the same bodies. Each run notes itself in the queue's server: how many times its
job id ran, and which release ran it. ``register`` binds them to an App (the in-process
sides); ``rolling_worker`` binds them to the default app, for ``emqtasks worker``.
"""

from __future__ import annotations

from typing import Any

from emqtasks import App, Retry, current_job


def runs_key(queue: str) -> str:
    """job id -> how many times its body ran."""
    return f"rd:{queue}:runs"


def side_key(queue: str) -> str:
    """job id -> the release ("old" / "new") whose code ran it last."""
    return f"rd:{queue}:side"


def held_key(queue: str) -> str:
    """The list a ``rd.hold`` job pushes its release's name on when it starts."""
    return f"rd:{queue}:held"


def go_key(queue: str) -> str:
    """The list ``rd.hold`` jobs block on until the test lets them finish."""
    return f"rd:{queue}:go"


def register(app: App, side: str) -> dict[str, Any]:
    """The test's tasks on ``app``, noting ``side`` as the release that runs them."""

    def note() -> int:
        job = current_job()
        queue = app.settings.queue
        pipe = app.client.pipeline()
        pipe.hincrby(runs_key(queue), job.id, 1)
        pipe.hset(side_key(queue), job.id, side)
        runs: int = pipe.execute()[0]
        return runs

    def add(a: int, b: int) -> int:
        note()
        return a + b

    def total(values: list[int]) -> int:
        note()
        return sum(values)

    def flaky(n: int) -> int:
        # the first run asks for a retry (a retry verb, then a promote); the second succeeds
        if note() == 1:
            raise Retry(delay=0.05, reason="first run")
        return n

    def boom() -> None:
        note()
        raise ValueError("boom")

    def hold() -> str:
        # blocks its worker's only child until the test pushes a token (bounded)
        note()
        queue = app.settings.queue
        app.client.rpush(held_key(queue), side)
        app.client.blpop([go_key(queue)], 10)
        return side

    return {
        "add": app.task(add, name="rd.add"),
        "total": app.task(total, name="rd.total"),
        "flaky": app.task(flaky, name="rd.flaky", retry_delay=0.05),
        # dead at its first run (the retry verb's final path), whatever a reap spent before
        "boom": app.task(boom, name="rd.boom", dont_retry_for=(ValueError,)),
        "hold": app.task(hold, name="rd.hold", group="hold"),
    }
