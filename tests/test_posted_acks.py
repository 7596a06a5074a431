"""Acks posted on a worker child's single connection (Queue.post_ack: written now, the reply
read before the reply of the connection's next call): every other use of the connection
reads the owed replies first, in order; a reply lost with its connection, or refused for a
missing function, gives no verdict (the child sends that ack again alone: fenced). And
the pipelined calls of a batch (call_many) are FCALLs where the library runs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis.exceptions import ResponseError

from emqtasks import App
from emqtasks.store.connection import connect
from emqtasks.store.queue import NewJob, Queue
from emqtasks.store.wire import UNREAD, WireBroken
from emqtasks.verdicts import AckVerdict

pytestmark = pytest.mark.timeout(60)


def _enqueue(queue: Queue, n: int) -> None:
    queue.enqueue_many([NewJob(f"j-{i}", "t", '{"v":1,"a":[],"k":{}}', "g", 3, 30_000, 50,
                               3600) for i in range(n)])


@pytest.fixture
def child_queue(app: App) -> Iterator[Queue]:
    """The queue as a worker child has it: one connection, one thread."""
    q = Queue(connect(app.settings.redis_url, single_thread=True), app.settings.queue)
    yield q
    q.client.close()


def test_posted_acks_are_read_in_order_before_any_other_command(queue, child_queue):
    # Given claimed jobs, the ack's path known (one ack made)
    _enqueue(queue, 5)
    leases = child_queue.claim(5)
    assert child_queue.ack(leases[0]).verdict is AckVerdict.DONE
    # When two acks are posted: written, nothing read
    owed = [child_queue.post_ack(lease, '"r"') for lease in leases[1:3]]
    assert all(o is not None and o.reply is UNREAD for o in owed)
    assert [queue.status(lease.id) for lease in leases[1:3]] == ["done", "done"]
    # Then redis-py's own command on the connection gets its own reply, the acks' read first
    assert child_queue.client.ping() is True
    assert [child_queue.posted_verdict(o) for o in owed] == [AckVerdict.DONE] * 2
    # And a verb called behind a posted ack gets its own reply too (the claim of a batch)
    last = child_queue.post_ack(leases[3])
    assert last is not None
    assert child_queue.release(leases[4])
    assert child_queue.posted_verdict(last) is AckVerdict.DONE
    assert [x.id for x in child_queue.claim(2)] == [leases[4].id]


def test_a_posted_ack_lost_with_its_connection_gives_no_verdict(app, queue, child_queue):
    # Given a claimed job, the ack's path known, and the child's connection cut by the server
    _enqueue(queue, 2)
    leases = child_queue.claim(2)
    child_queue.ack(leases[0])
    app.client.client_kill_filter(_id=child_queue.client.client_id())
    # When its ack is posted and the replies collected
    owed = child_queue.post_ack(leases[1])
    assert owed is not None
    child_queue.collect_posted()
    # Then it has no verdict (lost): sent again alone it is made, and the connection serves
    assert isinstance(owed.reply, WireBroken) and child_queue.posted_verdict(owed) is None
    assert child_queue.ack(leases[1]).verdict is AckVerdict.DONE
    assert queue.status(leases[1].id) == "done"


def test_a_posted_ack_refused_for_a_missing_function_gives_no_verdict(private_redis):
    # Given the scripts' path (FCALL of the library, or EVALSHA where the server has none)
    # and the ack's path known
    client = connect(private_redis.url, single_thread=True)
    q = Queue(client, "posted", native="off")
    _enqueue(q, 2)
    leases = q.claim(2)
    q.ack(leases[0])
    # When the server forgets the library and the scripts, and an ack is posted
    for flush in (("FUNCTION", "FLUSH"), ("SCRIPT", "FLUSH")):
        try:
            private_redis.client().execute_command(*flush)
        except ResponseError:
            pass   # a server without Functions
    owed = q.post_ack(leases[1])
    assert owed is not None
    q.collect_posted()
    # Then it has no verdict (refused, nothing written); sent again alone, it is made
    assert isinstance(owed.reply, ResponseError) and q.posted_verdict(owed) is None
    assert q.status(leases[1].id) == "active"
    assert q.ack(leases[1]).verdict is AckVerdict.DONE
    client.close()


def test_a_batch_on_the_scripts_path_is_sent_as_fcall_where_the_library_runs(private_redis):
    # Given the scripts' path on a server that runs the library (one claim made: it tells)
    admin = private_redis.client()
    try:
        admin.execute_command("FUNCTION", "LIST")
    except ResponseError:
        pytest.skip("the server has no Functions")
    q = Queue(connect(private_redis.url, single_thread=True), "fcall", native="off")
    _enqueue(q, 4)
    leases = q.claim(2)
    # When two acks and a claim go in one round trip
    admin.config_resetstat()
    verdicts, more = q.ack_claim([(lease, "null", None) for lease in leases], 2)
    # Then they were three FCALLs, not EVALSHAs
    assert verdicts == [AckVerdict.DONE] * 2 and len(more) == 2
    stats = admin.info("commandstats")
    assert stats.get("cmdstat_fcall", {}).get("calls") == 3, stats
    assert "cmdstat_evalsha" not in stats
    q.client.close()


class _Interrupt(Exception):
    """What a signal handler raises into the task running when it comes (a task's Aborted,
    its time limit): at any bytecode, here the one after a posted ack's reply was read."""


def test_a_read_of_owed_replies_interrupted_leaves_no_reply_to_the_wrong_call(queue,
                                                                               child_queue):
    import inspect
    import sys
    from types import FrameType
    from typing import Any

    from emqtasks.store import wire

    # Given two acks posted on the child's connection (a task then running uses it: its
    # ctx.holds() is one HMGET) and replies that do not stall the test
    _enqueue(queue, 4)
    leases = child_queue.claim(4)
    child_queue.ack(leases[0])
    child_queue.client.connection._sock.settimeout(3)
    owed = [child_queue.post_ack(lease) for lease in leases[1:3]]
    body, first = inspect.getsourcelines(wire.Wire._read_owed)
    line = first + next(i for i, text in enumerate(body) if "self._owed.popleft()" in text)

    def tracer(frame: FrameType, event: str, _: Any) -> Any:
        if frame.f_code.co_name != "_read_owed":
            return None

        def local(f: FrameType, ev: str, __: Any) -> Any:
            if ev == "line" and f.f_lineno == line:
                sys.settrace(None)
                f.f_trace = None
                raise _Interrupt("raised by a signal handler after a reply was read")
            return local
        return local

    # When the task's command reads the first owed reply and a signal's exception lands
    # before that reply is handed over
    sys.settrace(tracer)
    try:
        with pytest.raises(_Interrupt):
            child_queue.client.ping()
    finally:
        sys.settrace(None)
    # Then each later call still gets its own reply (a claim, a verdict of an ack), or the
    # connection was closed (the acks' replies then lost: sent again alone, fenced)
    claimed = child_queue.claim(1)
    assert [x.id for x in claimed] == [leases[3].id] or claimed == []
    for o in owed:
        assert o is not None and (isinstance(o.reply, WireBroken)
                                  or child_queue.posted_verdict(o) is AckVerdict.DONE)
    assert child_queue.client.ping() is True
