"""Retry policies: exponential backoff (with and without jitter), retry_for and
dont_retry_for, Retry(delay=...) winning, and bad options refused at decoration."""

from __future__ import annotations

import day2_tasks as d2
import pytest
from day2 import cleanup, key, start

from emqtasks import App, InvalidArgument, TaskFailed
from emqtasks.producer.retry_policy import RetryPolicy

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _clean(app: App):  # type: ignore[no-untyped-def]
    yield
    cleanup(app)


def _starts(app: App, tag: str) -> list[int]:
    return [int(x) for x in app.client.lrange(key(app, f"at:{tag}"), 0, -1)]


def test_backoff_delays_grow_as_specified(app: App) -> None:
    # Given base 0.4 s, cap 1.6 s, no jitter, 5 attempts (and a fixed retry_delay of 5 s
    # that must not be used): retries after 0.4, 0.8, 1.6, 1.6 s
    with start(app) as w:
        h = app.send_task(d2.backoff, ("b",))
        with pytest.raises(TaskFailed, match="failure of b"):
            h.get(timeout=40)
        starts = _starts(app, "b")
        assert len(starts) == 5, (starts, w.output()[-2000:])
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    for gap, want in zip(gaps, [400, 800, 1600, 1600]):
        # at least the delay (server clock); at most the delay and some slack for a busy
        # machine: less than the fixed delay (5 s) or the uncapped backoff (3.2 s)
        assert want <= gap < want + 1200, gaps


def test_jittered_delays_stay_under_the_backoff_ceiling(app: App) -> None:
    with start(app) as w:
        h = app.send_task(d2.jittered, ("j",))
        with pytest.raises(TaskFailed):
            h.get(timeout=30)
        starts = _starts(app, "j")
        assert len(starts) == 4, w.output()[-2000:]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    for gap, ceiling in zip(gaps, [400, 800, 1600]):
        assert gap < ceiling + 1200, gaps


def test_dont_retry_for_goes_to_dead_at_once_with_its_reason(app: App) -> None:
    with start(app):
        dead = app.send_task(d2.picky, ("k", "key"))
        with pytest.raises(TaskFailed, match="KeyError"):
            dead.get(timeout=20)
        retried = app.send_task(d2.picky, ("v", "value"))
        with pytest.raises(TaskFailed, match="ValueError"):
            retried.get(timeout=20)
    assert int(app.client.hget(key(app, "starts"), "k")) == 1
    assert int(app.client.hget(key(app, "starts"), "v")) == 5
    row = app.job(dead.id)
    assert row is not None and row["state"] == "dead"
    assert "not retried: KeyError is in dont_retry_for" in row["error"]


def test_retry_for_sends_other_exceptions_to_dead_at_once(app: App) -> None:
    with start(app):
        other = app.send_task(d2.narrow, ("v", "value"))
        with pytest.raises(TaskFailed, match="ValueError"):
            other.get(timeout=20)
        listed = app.send_task(d2.narrow, ("c", "conn"))
        with pytest.raises(TaskFailed, match="ConnectionError"):
            listed.get(timeout=20)
        # Retry(delay=...) still retries, whatever retry_for says
        assert app.send_task(d2.retry_wins, ("r",)).get(timeout=20) == 2
    assert int(app.client.hget(key(app, "starts"), "v")) == 1
    assert int(app.client.hget(key(app, "starts"), "c")) == 5
    row = app.job(other.id)
    assert row is not None and "not retried: ValueError is outside retry_for" in row["error"]


def test_the_delay_formula() -> None:
    p = RetryPolicy.of(retry_backoff=True, retry_jitter=False, retry_backoff_max=10)
    assert [p.delay(n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    j = RetryPolicy.of(retry_backoff=3, retry_jitter=True)
    assert all(0 <= j.delay(4) <= 24 for _ in range(200))
    assert RetryPolicy.of().delay(3) is None   # the fixed retry_delay


@pytest.mark.parametrize("options", [
    {"retry_for": Exception},
    {"retry_for": [ValueError]},
    {"retry_for": (ValueError, "x")},
    {"dont_retry_for": (int,)},
    {"retry_backoff": -1},
    {"retry_backoff": "yes"},
    {"retry_backoff_max": -5},
    {"retry_jitter": 1},
])
def test_bad_policy_options_are_refused_at_decoration(app: App, options: dict) -> None:
    with pytest.raises(InvalidArgument):
        app.task(name="bad.policy", **options)(lambda: None)
