"""Loads the Lua verbs from ``lua/``, composes each with the shared prelude, runs them by SHA.

Each verb computes its SHA on the client and runs EVALSHA; on NOSCRIPT it sends the source
with EVAL, which loads and runs it in one command (and caches it for the next EVALSHA). So a
``SCRIPT FLUSH`` or a restarted server costs one extra round trip, no error -- even when the
cache is flushed again right after the reload, which redis-py's own SCRIPT LOAD-then-EVALSHA
fallback does not survive.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path
from typing import Any

from redis.commands.core import Script
from redis.exceptions import NoScriptError, OutOfMemoryError, ResponseError

from ..errors import ConfigError, ServerFull
from .keys import FIXED

VERBS = (
    "enqueue", "claim", "ack", "retry", "release", "extend", "reap", "promote",
    "pause", "pause_group", "limit", "weight", "cancel", "requeue", "wait",
    "repair", "rate", "maxsize", "defaults", "schedule", "fairness", "workflow", "wffail",
    "wfcancel", "find", "lanes", "wake",
)
#: Keys a verb takes after the fixed ones, in KEYS order; its prelude declares them as
#: ``K_<name>``, so a script still forms no key of its own but job rows, lanes and done lists.
VERB_KEYS: dict[str, tuple[str, ...]] = {
    "schedule": ("schedules", "schedstate", "schedver"),
}


def lua_dir() -> Path:
    """The folder of Lua sources: inside the installed package, or the checkout's ``lua/``."""
    packaged = Path(str(resources.files("emqtasks"))) / "lua"
    if packaged.is_dir():
        return packaged
    checkout = Path(__file__).resolve().parents[2] / "lua"
    if checkout.is_dir():
        return checkout
    raise ConfigError("emqtasks is installed without its lua/ folder")


def _prelude(verb: str = "") -> str:
    names = ", ".join(f"K_{k}" for k in FIXED)
    values = ", ".join(f"KEYS[{i}]" for i in range(1, len(FIXED) + 1))
    base = f"local BASE = string.sub(KEYS[1], 1, -{len(FIXED[0]) + 1})"
    extra = VERB_KEYS.get(verb, ())
    more = "" if not extra else "local {} = {}\n".format(
        ", ".join(f"K_{k}" for k in extra),
        ", ".join(f"KEYS[{len(FIXED) + i}]" for i in range(1, len(extra) + 1)))
    return f"local {names} = {values}\n{base}\n{more}"


def _check_header(name: str, text: str) -> None:
    head = text.split("\n\n", 1)[0]
    if not head.startswith(f"-- {name}:") or "KEYS" not in head or "Reply" not in head:
        raise ConfigError(f"lua/{name}.lua must open with its contract (name, KEYS, Reply)")


@functools.cache
def source(name: str) -> str:
    """The full text sent to Redis for one verb: prelude, shared helpers, the verb."""
    folder = lua_dir()
    text = (folder / f"{name}.lua").read_text()
    _check_header(name, text)
    return _prelude(name) + (folder / "_common.lua").read_text() + "\n" + text


#: A full server's refusal inside a script: its own reply (OOM) from Redis 7 on, the text of
#: a script error on 6.2 ("Error running script ...: -OOM command not allowed ...").
_OOM = "OOM command not allowed"


class Verb(Script):
    """A redis-py ``Script`` whose NOSCRIPT fallback is EVAL of the source: no window
    between a reload and the run for another SCRIPT FLUSH to fail the call. A full server's
    refusal is ServerFull (the script was stopped at its first write: nothing written)."""

    def __call__(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        from redis.client import Pipeline

        client = self.registered_client if client is None else client
        if isinstance(client, Pipeline):   # pipelines load their scripts before EXEC
            return super().__call__(keys, args, client)
        keys, args = list(keys or ()), list(args or ())
        try:
            try:
                return client.evalsha(self.sha, len(keys), *keys, *args)
            except NoScriptError:
                return client.eval(self.script, len(keys), *keys, *args)
        except ResponseError as exc:
            if isinstance(exc, OutOfMemoryError) or _OOM in str(exc):
                raise ServerFull.of(exc) from None   # refused at its first write: no write
            raise


class Scripts:
    """One ``Verb`` per verb, bound to a client."""

    def __init__(self, client: Any) -> None:
        for name in VERBS:
            setattr(self, name, Verb(client, source(name)))

    enqueue: Any
    claim: Any
    ack: Any
    retry: Any
    release: Any
    extend: Any
    reap: Any
    promote: Any
    pause: Any
    pause_group: Any
    limit: Any
    weight: Any
    cancel: Any
    requeue: Any
    wait: Any
    repair: Any
    rate: Any
    maxsize: Any
    defaults: Any
    schedule: Any
    fairness: Any
    workflow: Any
    wffail: Any
    wfcancel: Any
    find: Any
    lanes: Any
    wake: Any
