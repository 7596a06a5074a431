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

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import redis

from ..store.cluster import node_kwargs
from ..store.keys import QueueKeys

#: How the verbs run: EVALSHA, and EVAL of the source when the server lost its script cache.
_SCRIPTING = ("evalsha", "eval")

#: enqueue.lua and wait.lua (with the lua/lib helpers they include: LINDEX reads a
#: rate-limited group's recent starts when its lane opens), plus the direct calls of a
#: producer: BLPOP in JobHandle.get, HGET (status), HGETALL (info), PING (CLI); and
#: schedule.lua's put / drop (INCR of the version) for App.schedule and unschedule; GET of
#: the fairness mode when a lane opens (and in time mode ZADD / HSET of the group's place);
#: TYPE of the keys a verb writes, checked before its first write.
PRODUCER_COMMANDS = (
    *_SCRIPTING,
    "time", "exists", "get", "hset", "hget", "hmget", "hincrby", "hdel", "hgetall", "incr",
    "zadd", "zrange", "zcard", "sismember", "rpush", "llen", "lindex", "expire",
    "blpop", "ping", "type",
    "wait",    # durable writes (store/durable.py); aof=True needs +waitaof too (Redis >= 7.2)
)

#: claim, ack, retry, release, extend, reap, promote and schedule .lua, plus the direct
#: calls of a worker: BLPOP / RPUSH / LTRIM / EXPIRE on the wake key, PING, INFO (the
#: eviction check), and for periodic schedules GET of their version, HGETALL of them and
#: their state, TIME; the heartbeat of heartbeat.py (SET with PX, HSET of the index, DEL and
#: HDEL at a stop); TYPE, as for a producer; abort.lua (its end; a task may ask an abort:
#: HKEYS of the heartbeats' index) and BLPOP of the master's abort list. Tasks that enqueue
#: more work use the worker's user: enqueue's commands are all here.
WORKER_COMMANDS = (
    *_SCRIPTING,
    "time", "exists", "del", "expire", "get", "set", "incr",
    "hget", "hmget", "hset", "hdel", "hincrby", "hexists", "hgetall", "hkeys",
    "lindex", "llen", "lmove", "lrem", "rpush", "lpush", "ltrim", "blpop", "pexpire",
    "sismember",
    "zadd", "zcard", "zpopmin", "zrange", "zrangebyscore", "zrem", "zscore",
    "ping", "info", "type",
    "wait",    # a durable worker's acks
)


#: The module's commands each role runs (emqtasks.native), granted by name: on Redis 6.2
#: and 7.0 a category rule such as ``+@write`` does not cover a module's commands, and a
#: server without the module refuses a rule that names them.
NATIVE_PRODUCER_COMMANDS = ("emq.enqueue",)
NATIVE_WORKER_COMMANDS = ("emq.enqueue", "emq.claim", "emq.ack", "emq.retry", "emq.extend",
                          "emq.release", "emq.reap", "emq.promote", "emq.abort")


#: The verbs as a Redis Functions library (store/functions.py, Redis >= 7.0 and Valkey: an
#: older server refuses a rule naming them): FCALL, and FUNCTION LOAD of the library the
#: first time a server lacks it. A user without them runs the scripts by EVALSHA.
FUNCTION_COMMANDS = ("fcall", "function|load")


def key_pattern(queue: str) -> str:
    """The ACL key pattern of every key of a queue (queue names hold no glob characters)."""
    return "~" + QueueKeys(queue).all_pattern


def _rules(commands: Iterable[str], queues: tuple[str, ...]) -> list[str]:
    if not queues:
        raise ValueError("name at least one queue")
    return ["resetkeys", *(key_pattern(q) for q in queues), "resetchannels", "-@all",
            *(f"+{c}" for c in commands)]


def producer_rules(*queues: str, native: bool = False, functions: bool = False) -> list[str]:
    """ACL rules (for ``ACL SETUSER``) of a user that enqueues to and follows these queues;
    ``native``: also the module's commands (only for a server that loads it); ``functions``:
    FCALL and FUNCTION LOAD, the faster scripts path (Redis >= 7.0, Valkey)."""
    return _rules((*PRODUCER_COMMANDS, *(FUNCTION_COMMANDS if functions else ()),
                   *(NATIVE_PRODUCER_COMMANDS if native else ())), queues)


def worker_rules(*queues: str, native: bool = False, functions: bool = False) -> list[str]:
    """ACL rules (for ``ACL SETUSER``) of a user that runs a worker on these queues;
    ``native``: also the module's commands (only for a server that loads it); ``functions``:
    FCALL and FUNCTION LOAD, the faster scripts path (Redis >= 7.0, Valkey)."""
    return _rules((*WORKER_COMMANDS, *(FUNCTION_COMMANDS if functions else ()),
                   *(NATIVE_WORKER_COMMANDS if native else ())), queues)


def setuser(user: str, rules: Iterable[str], password: str = "<password>") -> str:
    """The ``ACL SETUSER`` line (as typed in redis-cli) that creates or resets the user."""
    return " ".join(["ACL SETUSER", user, "reset", "on", f">{password}", *rules])


# -- which of a role's commands a user may run ---------------------------------------------------

#: One harmless call per command a role may need (each of PRODUCER_COMMANDS and
#: WORKER_COMMANDS must have one: the doctor tries them on Redis 6.2), on ``emq:{q}:doctor``
#: (a key of the queue that no verb uses): reads of a key that does not exist, and writes
#: whose arguments make the command fail after its ACL check (an odd field list, a number
#: that is not one, an expiry of 0) or do nothing (XX). Only RPUSH writes: it is tried just
#: before LTRIM, BLPOP, EXPIRE and DEL, which empty the key or let it expire.
PROBES: dict[str, tuple[str, ...]] = {
    "evalsha": ("0" * 40, "1", "{k}"), "eval": ("return 1", "1", "{k}"),
    "time": (), "ping": (), "info": ("server",),
    "exists": ("{k}",), "hget": ("{k}", "f"), "hmget": ("{k}", "f"), "hgetall": ("{k}",),
    "hkeys": ("{k}",),
    "hset": ("{k}", "f", "v", "odd"), "hdel": ("{k}", "f"), "hincrby": ("{k}", "f", "x"),
    "lindex": ("{k}", "0"), "llen": ("{k}",), "lmove": ("{k}", "{k}", "LEFT", "LEFT"),
    "lrem": ("{k}", "0", "x"), "sismember": ("{k}", "m"),
    "zadd": ("{k}", "XX", "1", "m"), "zcard": ("{k}",), "zpopmin": ("{k}",),
    "zrange": ("{k}", "0", "-1"), "zrangebyscore": ("{k}", "0", "1"), "zrem": ("{k}", "m"),
    "rpush": ("{k}", "x"), "lpush": ("{k}", "x"), "incr": ("{k}",),
    "ltrim": ("{k}", "1", "0"), "blpop": ("{k}", "0.01"), "pexpire": ("{k}", "1000"),
    "get": ("{k}",), "hexists": ("{k}", "f"), "zscore": ("{k}", "m"),
    "set": ("{k}", "v", "PX", "0"),   # refused after the ACL check: invalid expire time
    "expire": ("{k}", "1"), "del": ("{k}",), "type": ("{k}",),
    "wait": ("0", "1"),   # for no replica: answers at once
}

#: ``redis.acl_check_cmd`` (Redis >= 7.0, Valkey) over calls packed as n, arg1..argn, ...
_LUA_CHECK = """
local out, i = {}, 1
while i <= #ARGV do
  local n, call = tonumber(ARGV[i]), {}
  for j = 1, n do call[j] = ARGV[i + j] end
  out[#out + 1] = redis.acl_check_cmd(unpack(call)) and 1 or 0
  i = i + n + 1
end
return out
"""


def probe_key(queue: str) -> str:
    return QueueKeys(queue).doctor


def _calls(commands: Iterable[str], key: str) -> list[list[str]]:
    wanted = set(commands)
    unknown = sorted(wanted - set(PROBES))
    if unknown:
        raise ValueError(f"no harmless probe for {', '.join(unknown)}")
    return [[c, *(a.replace("{k}", key) for a in args)] for c, args in PROBES.items()
            if c in wanted]


def refused_commands(client: Any, commands: Iterable[str], queue: str) -> tuple[str, list[str]]:
    """(how it was found, the commands this client's user may not run on ``queue``'s keys).

    Asked with ``ACL DRYRUN`` when the user may run it, else with ``redis.acl_check_cmd``
    in a script (Redis >= 7.0, Valkey), else by trying each command with harmless
    arguments (Redis 6.2). On a cluster, the node serving the queue's slot answers.
    """
    key = probe_key(queue)
    calls = _calls(commands, key)
    target = node_kwargs(client, key)
    methods: tuple[tuple[str, Callable[..., list[bool] | None]], ...] = (
        ("ACL DRYRUN", _dryrun), ("redis.acl_check_cmd", _lua_check), ("trying", _try))
    for name, method in methods:
        allowed = method(client, calls, key, target)
        if allowed is not None:
            return name, [call[0] for call, ok in zip(calls, allowed) if not ok]
    raise AssertionError("trying always answers")


def _dryrun(client: Any, calls: Sequence[list[str]], key: str,
            target: dict[str, Any]) -> list[bool] | None:
    try:
        user = client.execute_command("ACL", "WHOAMI", **target)
        return [client.execute_command("ACL", "DRYRUN", user, *call, **target) == "OK"
                for call in calls]
    except redis.exceptions.ResponseError:   # refused to this user, or before Redis 7.0
        return None


def _lua_check(client: Any, calls: Sequence[list[str]], key: str,
               target: dict[str, Any]) -> list[bool] | None:
    packed = [x for call in calls for x in (str(len(call)), *call)]
    try:
        answer = client.eval(_LUA_CHECK, 1, key, *packed)
    except redis.exceptions.ResponseError:   # no EVAL for this user, or before Redis 7.0
        return None
    return [bool(x) for x in answer]


def _try(client: Any, calls: Sequence[list[str]], key: str,
         target: dict[str, Any]) -> list[bool]:
    allowed = []
    for call in calls:
        try:
            client.execute_command(*call, **target)
            allowed.append(True)
        except redis.exceptions.NoPermissionError:
            allowed.append(False)
        except redis.exceptions.ResponseError:   # refused after the ACL check: allowed
            allowed.append(True)
    return allowed
