"""Extend: a held lease's deadline pushed out on the server clock, with an answer per lease."""

from __future__ import annotations

from helpers import make_task, server_ms


def test_extend_pushes_the_deadline_out(app, queue):
    # Given a claimed job whose deadline is near
    make_task(app, lease=30.0).delay(1)
    (lease,) = queue.claim()
    queue.client.zadd(queue.keys.active, {lease.id: server_ms(queue) + 1_000}, xx=True)
    # When it is extended by its own lease, and then by a longer one
    assert queue.extend([lease]) == [True]
    now = server_ms(queue)
    assert abs(queue.client.zscore(queue.keys.active, lease.id) - (now + 30_000)) < 1_000
    assert queue.extend([lease], lease_ms=120_000) == [True]
    now = server_ms(queue)
    assert abs(queue.client.zscore(queue.keys.active, lease.id) - (now + 120_000)) < 1_000
    # Then a reap finds nothing to take back
    assert queue.reap() == (0, 0)


def test_extend_answers_per_lease(app, queue):
    make_task(app).map([(1,), (2,)])
    live, gone = queue.claim(2)
    assert queue.ack(gone)[0]
    assert queue.extend([live, gone]) == [True, False]
