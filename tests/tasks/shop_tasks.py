"""A user's tasks module and the code that enqueues them, as tests/test_pytest_plugin.py tests
them through the pytest plugin's fixtures alone (module-level ``@task``: the default App)."""

from __future__ import annotations

from emqtasks import JobHandle, current_job, task


@task(group=lambda customer, **_: customer)
def send_receipt(customer: str, total: float) -> str:
    return f"receipt for {customer}: {total:.2f}"


@task(group=lambda customer, **_: customer)
def ship(customer: str, items: list[str]) -> list[str]:
    """Ships each item on its own: work that makes more work."""
    return [pack.delay(customer, item).id for item in items]


@task(group=lambda customer, **_: customer)
def pack(customer: str, item: str) -> str:
    return f"{item} packed for {customer}"


@task
async def notify(customer: str) -> str:
    return f"{customer} notified"


@task(max_attempts=3, retry_delay=0)
def charge(customer: str) -> str:
    """The payment gateway answers on the third try."""
    if current_job().attempts < 3:
        raise ConnectionError("gateway busy")
    return f"charged {customer}"


@task(max_attempts=2, retry_delay=0)
def refund(customer: str) -> None:
    raise ValueError(f"no payment of {customer} to refund")


@task(max_attempts=5, retry_delay=60)
def sync_stock() -> None:
    raise ConnectionError("the warehouse is down")


@task
def reorder() -> None:
    """A task that enqueues itself for ever (a bug run_pending must not hang on)."""
    reorder.delay()


def checkout(customer: str, items: list[str], total: float) -> JobHandle[str]:
    """The code under test: a view would call this. It enqueues; it runs nothing."""
    ship.delay(customer, items)
    return send_receipt.delay(customer, total)
