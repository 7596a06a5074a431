"""What a durable write sends: the write and ``WAIT`` / ``WAITAOF`` in one pipeline on one
connection (durable.py says why), and what is made of the reply (NotDurable)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import cache
from typing import Any

from redis.exceptions import NoScriptError, RedisError, ResponseError

from ..errors import ConfigError, NotDurable, ServerFull
from .commands import COMMANDS
from .durable import Durable
from .plan import Cmd, Hot, Pipe, Routing, Script, Steps
from .scripts import out_of_memory, source

#: The first release of Redis with WAITAOF (Valkey reports redis_version 7.2.4).
WAITAOF_SINCE = (7, 2)


def wait_command(durable: Durable) -> Cmd:
    """The wait, as sent after the write."""
    if durable.aof:
        return Cmd("execute_command", ("WAITAOF", 1, durable.replicas, durable.timeout_ms))
    return Cmd("execute_command", ("WAIT", durable.replicas, durable.timeout_ms))


def version_of(info: dict[str, Any]) -> tuple[str, tuple[int, ...]]:
    """(the server's name and version as it says it, the Redis version it is compatible with)."""
    redis_version = str(info.get("redis_version", "0"))
    valkey = info.get("valkey_version")
    said = f"Valkey {valkey}" if valkey else f"Redis {redis_version}"
    numbers = tuple(int(p) for p in redis_version.split(".")[:3] if p.isdigit())
    return said, numbers


def aof_refusal(server: dict[str, Any], persistence: dict[str, Any]) -> str | None:
    """Why ``aof=True`` cannot be honoured on this server (INFO server and persistence), or
    None: no WAITAOF before Redis 7.2; WAITAOF 1 needs ``appendonly yes`` here."""
    said, numbers = version_of(server)
    if numbers < WAITAOF_SINCE:
        return (f"Durable(aof=True) needs WAITAOF, which the server ({said}) does not have "
                f"(Redis >= 7.2 or Valkey): use Durable(aof=False), or upgrade")
    if str(persistence.get("aof_enabled", "0")) != "1":
        return (f"Durable(aof=True) waits for the append-only file, but the server ({said}) "
                f"runs with appendonly no: set appendonly yes, or use Durable(aof=False)")
    return None


@cache
def _sha(verb: str) -> str:
    return hashlib.sha1(source(verb).encode("utf-8")).hexdigest()


def waited_plan(route: Any, op: Hot | Script, durable: Durable,
                near: str) -> Steps[tuple[Any, int]]:
    """The write ``op`` and the wait in one pipeline on the connection of the server
    holding ``near``: (the write's reply, the replicas that confirmed it).

    A hot verb goes as the module's command or its script as ``route`` (a queue's
    selection.Route) knows; a first call learns it as HotVerbs.call does (a server without
    the module answers the command before anything is written: then the script). NOSCRIPT
    is answered by EVAL of the source in the same way. aof=True is checked against the
    server once per route, before the first write (ConfigError, nothing written)."""
    if durable.aof and not getattr(route, "aof_checked", False):
        server, persistence = yield Pipe([Cmd("info", ("server",)),
                                          Cmd("info", ("persistence",))], near=near)
        why = aof_refusal(server, persistence)
        if why is not None:
            raise ConfigError(why)
        route.aof_checked = True
    wait = wait_command(durable)
    keys, args = list(op.keys), list(op.args)
    first: Any
    if isinstance(op, Hot) and route.serves[op.verb] is not False:
        first, waited = yield Pipe([Cmd("execute_command", (COMMANDS[op.verb], *keys, *args)),
                                    wait], raise_on_error=False, near=near)
        if not isinstance(first, RedisError):
            route.serves[op.verb] = True
            return first, _confirmed(durable, waited)
        route.refused(op.verb, first)   # raises unless the module is missing: the script
    # The first call of a verb on this route goes as EVAL (which caches the script), so a
    # script not yet loaded costs no NOSCRIPT and no second wait; later ones as EVALSHA.
    loaded: set[str] = route.__dict__.setdefault("scripts_sent", set())
    first = NoScriptError()
    if op.verb in loaded:
        first, waited = yield Pipe([Cmd("evalsha", (_sha(op.verb), len(keys), *keys, *args)),
                                    wait], raise_on_error=False, near=near)
    if isinstance(first, NoScriptError):
        first, waited = yield Pipe([Cmd("eval", (source(op.verb), len(keys), *keys, *args)),
                                    wait], raise_on_error=False, near=near)
    if isinstance(first, ResponseError) and out_of_memory(first):
        raise ServerFull.of(first)
    if isinstance(first, Exception):
        raise first
    loaded.add(op.verb)
    return first, _confirmed(durable, waited)


def waited(op: Hot | Script, durable: Durable, near: str) -> Steps[tuple[Any, int]]:
    """waited_plan on the runner's route: (the write's reply, the replicas that
    confirmed it)."""
    route = yield Routing()
    return (yield from waited_plan(route, op, durable, near))


def _confirmed(durable: Durable, waited: Any) -> int:
    if isinstance(waited, Exception):
        raise waited
    return durable.confirmed(waited)


def check(durable: Durable, confirmed: int, job_ids: Sequence[str], what: str,
          reply: Any = None) -> None:
    """NotDurable (carrying the write's ``reply``) when fewer replicas than asked
    confirmed the write."""
    if confirmed < durable.replicas:
        exc = NotDurable(list(job_ids), confirmed, durable.replicas, what, durable.aof)
        exc.reply = reply
        raise exc
