"""Tasks of tests/test_async_producer.py, on an App of their own (the worker points it at its
server and queue; the tests point it at theirs)."""

from __future__ import annotations

from emqtasks import App

app = App()


@app.task(name="ap.add", group=lambda tenant, *_a, **_k: tenant)
def add(tenant: str, a: int, b: int) -> int:
    return a + b


@app.task(name="ap.boom", max_attempts=1)
def boom(why: str) -> None:
    raise ValueError(why)


@app.task(name="ap.later")
def later() -> str:
    """Sent with a countdown far off: cancelled, or left waiting."""
    return "ran"
