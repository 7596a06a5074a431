"""Least-privilege Redis ACL users for a queue's producers and workers (Redis >= 6.2).

A producer enqueues and follows its jobs (``delay``, ``map``, ``get``, ``status``); a worker
claims, runs, settles, renews, reaps and promotes. Each gets only the commands it sends,
and the commands the Lua verbs it runs call (a script runs with its caller's permissions),
on the keys of its queue(s) only: ``~emq:{q}:*``. Nothing else: no ``KEYS``, ``FLUSH*``,
``CONFIG``, ``SCRIPT``, ``DEBUG``, pub/sub, or any other key.

    from emqtasks import acl
    print(acl.setuser("emq-worker", acl.worker_rules("reports")))

What stays out, and what that costs:

- ``CONFIG``: the worker's start-up eviction check falls back to ``INFO memory``
  (``+info`` is in the worker's rules for that; drop it and the check is skipped).
- ``CLIENT SETINFO``: on Redis >= 7.2 redis-py names its library on connect and ignores
  the refusal (it shows in ``ACL LOG``).
- ``SELECT``: add ``+select`` for a URL that names a database other than 0.
- The admin verbs (``emqtasks stats``, ``pause``, ``purge``, ``check``...) are for an
  operator's user: they SCAN and touch every structure of the queue.

A user that may run EVAL may run any Lua that calls its allowed commands on its allowed
keys: ACLs scope a user to its queue's keys, not to the verbs. A producer can damage its own
queue, never another queue or anything else on the server.
"""

from __future__ import annotations

from collections.abc import Iterable

from .keys import check_queue_name

#: How the verbs run: EVALSHA, and EVAL of the source when the server lost its script cache.
_SCRIPTING = ("evalsha", "eval")

#: enqueue.lua and wait.lua (with the helpers of _common.lua they reach), plus the direct
#: calls of a producer: BLPOP in JobHandle.get, HGET (status), HGETALL (info), PING (CLI);
#: and schedule.lua's put / drop (INCR of the version) for App.schedule and unschedule.
PRODUCER_COMMANDS = (
    *_SCRIPTING,
    "time", "exists", "hset", "hget", "hmget", "hincrby", "hdel", "hgetall", "incr",
    "zadd", "zrange", "zcard", "sismember", "rpush", "llen", "expire",
    "blpop", "ping",
)

#: claim, ack, retry, release, extend, reap, promote and schedule .lua, plus the direct
#: calls of a worker: BLPOP / RPUSH / LTRIM / EXPIRE on the wake key, PING, INFO (the
#: eviction check), and for periodic schedules GET of their version, HGETALL of them and
#: their state, TIME. Tasks that enqueue more work use the worker's user: enqueue's
#: commands are all here.
WORKER_COMMANDS = (
    *_SCRIPTING,
    "time", "exists", "del", "expire", "get", "incr",
    "hget", "hmget", "hset", "hdel", "hincrby", "hexists", "hgetall",
    "lindex", "llen", "lmove", "lrem", "rpush", "ltrim", "blpop",
    "sismember",
    "zadd", "zcard", "zpopmin", "zrange", "zrangebyscore", "zrem",
    "ping", "info",
)


def key_pattern(queue: str) -> str:
    """The ACL key pattern of every key of a queue (queue names hold no glob characters)."""
    return f"~emq:{{{check_queue_name(queue)}}}:*"


def _rules(commands: Iterable[str], queues: tuple[str, ...]) -> list[str]:
    if not queues:
        raise ValueError("name at least one queue")
    return ["resetkeys", *(key_pattern(q) for q in queues), "resetchannels", "-@all",
            *(f"+{c}" for c in commands)]


def producer_rules(*queues: str) -> list[str]:
    """ACL rules (for ``ACL SETUSER``) of a user that enqueues to and follows these queues."""
    return _rules(PRODUCER_COMMANDS, queues)


def worker_rules(*queues: str) -> list[str]:
    """ACL rules (for ``ACL SETUSER``) of a user that runs a worker on these queues."""
    return _rules(WORKER_COMMANDS, queues)


def setuser(user: str, rules: Iterable[str], password: str = "<password>") -> str:
    """The ``ACL SETUSER`` line (as typed in redis-cli) that creates or resets the user."""
    return " ".join(["ACL SETUSER", user, "reset", "on", f">{password}", *rules])
