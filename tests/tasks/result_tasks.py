"""Tasks the AsyncResult tests run in real workers (tests/test_async_result.py)."""

from __future__ import annotations

from emqtasks import default_app, task


def _k(name: str) -> str:
    return f"ar:{default_app.settings.queue}:{name}"


@task(name="ar.hold", lease=5.0)
def hold(tag: str) -> str:
    """Says it started, then waits (bounded) for the test's go."""
    r = default_app.client
    r.rpush(_k("started"), tag)
    r.blpop([_k("go")], timeout=20)
    return tag


@task(name="ar.fails", max_attempts=1)
def fails(why: str) -> None:
    raise ValueError(why)


@task(name="ar.add")
def add(x: int, y: int = 0) -> int:
    return x + y


class PaymentDeclined(Exception):
    """A task's own exception, importable where the result is read."""


class NeedsTwo(Exception):
    """An exception whose constructor takes two arguments: not rebuilt from its message."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(f"{code} {why}")


@task(name="ar.declined", max_attempts=1)
def declined(amount: int) -> None:
    try:
        {}["card"]
    except KeyError:
        raise PaymentDeclined(f"card refused for {amount}") from None


@task(name="ar.needs_two", max_attempts=1)
def needs_two() -> None:
    raise NeedsTwo(402, "no funds")


@task(name="ar.local_class", max_attempts=1)
def local_class() -> None:
    class Hidden(Exception):
        pass

    raise Hidden("defined in the task")
