"""The store's verbs where Python once did the protocol's work itself."""

from __future__ import annotations

import pytest

from emqtasks import App
from emqtasks.errors import InvalidArgument
from emqtasks.store import scripts
from emqtasks.store.keys import WAKE_CAP, WAKE_DUE, WAKE_TTL, WAKE_WORK

#: Ten work tokens, a due token (over half the cap: the scripts drop it), ten more (the cap
#: drops the last four), one more due token.
TOKENS = [WAKE_WORK] * 10 + [WAKE_DUE] + [WAKE_WORK] * 10 + [WAKE_DUE]


def _scripts_wake(client, fixed: tuple[str, ...], token: str) -> None:
    """The wake push every verb makes: lua/lib/wake.lua's wake(), composed as the loader
    composes a verb (pause's prelude and the shared helpers), without a verb around it."""
    body = scripts.source("pause")
    helpers = body[: body.index("-- pause:")]
    client.eval(helpers + "\nwake(ARGV[1])\nreturn 1", len(fixed), *fixed, token)


def test_the_python_wake_push_leaves_the_list_the_scripts_leave(
        redis_url: str, queue_name: str) -> None:
    # Given two empty queues on one server
    a = App(redis_url=redis_url, queue=queue_name + "-py")
    b = App(redis_url=redis_url, queue=queue_name + "-lua")
    try:
        by_python, by_scripts = a.queue(), b.queue()
        # When the same tokens are pushed on one by Queue.push_wake, on the other by the
        # scripts' own wake push
        for token in TOKENS:
            by_python.push_wake(token)
            _scripts_wake(by_scripts.client, by_scripts.keys.fixed, token)
        # Then both lists hold the same tokens: the cap, and no due token past its half
        client = by_python.client
        pushed = client.lrange(by_python.keys.wake, 0, -1)
        assert pushed == client.lrange(by_scripts.keys.wake, 0, -1)
        assert pushed == [WAKE_WORK] * WAKE_CAP
        assert 0 < client.ttl(by_python.keys.wake) <= WAKE_TTL
        assert 0 < client.ttl(by_scripts.keys.wake) <= WAKE_TTL
    finally:
        a.close()
        b.close()


def test_a_due_token_is_pushed_below_half_the_cap(queue) -> None:
    queue.push_wake(WAKE_DUE)
    assert queue.client.lrange(queue.keys.wake, 0, -1) == [WAKE_DUE]


def test_a_wake_token_of_another_kind_is_refused(queue) -> None:
    with pytest.raises(InvalidArgument):
        queue.push_wake("x")
    assert queue.client.exists(queue.keys.wake) == 0
