"""The Lua verbs as one Redis Functions library (Redis >= 7.0, Valkey): FCALL instead of
EVALSHA, so the helpers a verb includes are built once per load, not on every call.

EVALSHA runs a verb's whole text each time: Lua makes a closure of every helper it includes
before the verb's first line (~9 KB allocated per enqueue, ~14 KB per ack). The library
(scripts.compose_library) builds them once; each verb is a function ``emq_<verb>_<tag>``,
the tag a hash of the library's text. Two releases' workers on one server each load their
own library and call their own functions; FUNCTION LOAD REPLACE only ever replaces a
library of the same text (a concurrent load of the same release).

Per client (Functions): the first call is FCALL. "Function not found" (never loaded, a
FUNCTION FLUSH, a fresh replica promoted) loads the library and calls once more, as NOSCRIPT
sends EVAL today. A server without FCALL (Redis 6.2), a user refused FCALL or FUNCTION LOAD
(an ACL without ``+fcall`` / ``+function|load``, a managed service that disables them) or a
cluster client (FUNCTION LOAD would have to reach every primary) runs EVALSHA from then on.
A full server refuses FCALL before the function runs (a library function is flagged
scripting), where EVALSHA refuses only at the first write: that call is sent again as
EVALSHA, so replies stay the scripts' own. ``EMQ_LUA_FUNCTIONS=0`` keeps EVALSHA.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from redis.exceptions import NoPermissionError, RedisError, ResponseError

from .cluster import is_cluster
from .keys import FIXED
from .scripts import FALLBACK, Scripts, compose_library, lua_dir, out_of_memory

__all__ = ["FALLBACK", "Functions", "function_name", "functions_wanted", "library",
           "scripts", "sent_again"]


def functions_wanted(environ: Mapping[str, str] | None = None) -> bool:
    """``EMQ_LUA_FUNCTIONS``: on unless 0, off, false or no."""
    env = os.environ if environ is None else environ
    return (env.get("EMQ_LUA_FUNCTIONS") or "1").strip().lower() not in ("0", "off", "false",
                                                                         "no")


_LIBRARY: tuple[str, str] | None = None
_BUILDING = threading.Lock()


def library() -> tuple[str, str]:
    """The library's name (``emq_<tag>``) and its text, for FUNCTION LOAD.

    Composed once per process, under a lock: threads that make their first call at once
    (500 get()s on the module's path, whose first script is ``wait``) wait for that one
    composition instead of each reading the Lua files (they took tens of seconds, past
    their timeouts)."""
    global _LIBRARY
    if _LIBRARY is None:
        with _BUILDING:
            if _LIBRARY is None:
                _LIBRARY = compose_library(lua_dir())
    return _LIBRARY


def function_name(verb: str) -> str:
    """The name verb is registered under in this release's library."""
    return f"emq_{verb}_{library()[0].split('_', 1)[1]}"


def fcall_keys(keys: Sequence[Any]) -> tuple[Any, ...]:
    """The KEYS an FCALL sends: the queue's first fixed key and the verb's own after the
    fixed ones. The library forms the other fixed keys from the first (they are its base and
    a name, keys.py), once per queue: eleven keys fewer to parse and to make into Lua strings
    on every call. (Never a cluster's: there the verbs go as EVALSHA, every key declared.)"""
    return (keys[0], *keys[len(FIXED):])


def _refused(exc: RedisError) -> bool:
    """The server has no FCALL / FUNCTION, or this user may not run them."""
    return isinstance(exc, NoPermissionError) or str(exc).lower().startswith(
        ("unknown command", "unknown subcommand"))


def _not_found(exc: RedisError) -> bool:
    return "function not found" in str(exc).lower()


def sent_again(exc: BaseException) -> bool:
    """An FCALL reply that a call through Functions.call would not raise (it loads the
    library, or sends EVALSHA): for a caller that sent FCALL in a pipeline of its own."""
    return isinstance(exc, ResponseError) and (
        _not_found(exc) or _refused(exc) or out_of_memory(exc))


class Functions:
    """Whether one client's server runs the library: None until the first call tells."""

    def __init__(self, client: Any, wanted: bool | None = None) -> None:
        on = functions_wanted() if wanted is None else wanted
        self.usable: bool | None = None if on and not is_cluster(client) else False

    def _outcome(self, exc: ResponseError) -> str:
        """What a refused FCALL means: load (then once more), evalsha, or raise."""
        if _not_found(exc):
            return "load"
        if _refused(exc):
            self.usable = False
            return "evalsha"
        if out_of_memory(exc):
            return "evalsha"    # EVALSHA's own OOM rule: refused at the first write only
        return "raise"

    def _loaded(self, load: Callable[[], Any]) -> bool:
        try:
            load()
            return True
        except ResponseError:
            self.usable = False   # no FUNCTION, no +function|load, or a disabled command
            return False

    def call(self, client: Any, send: Callable[[str, Sequence[Any], Sequence[Any]], Any],
             verb: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """The verb by FCALL through ``send`` (command, keys, args), or FALLBACK."""
        if self.usable is False:
            return FALLBACK
        sent = fcall_keys(keys)
        head = (function_name(verb), len(sent), *sent)
        for attempt in (0, 1):
            try:
                reply = send("FCALL", head, args)
                self.usable = True
                return reply
            except ResponseError as exc:
                outcome = self._outcome(exc)
                if outcome == "raise":
                    raise
                if outcome == "evalsha" or attempt or not self._loaded(
                        lambda: client.execute_command("FUNCTION", "LOAD", "REPLACE",
                                                       library()[1])):
                    return FALLBACK
        return FALLBACK

    async def acall(self, client: Any,
                    send: Callable[[str, Sequence[Any], Sequence[Any]], Awaitable[Any]],
                    verb: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """call(), on an async client."""
        if self.usable is False:
            return FALLBACK
        sent = fcall_keys(keys)
        head = (function_name(verb), len(sent), *sent)
        for attempt in (0, 1):
            try:
                reply = await send("FCALL", head, args)
                self.usable = True
                return reply
            except ResponseError as exc:
                outcome = self._outcome(exc)
                if outcome == "raise":
                    raise
                if outcome == "evalsha" or attempt:
                    return FALLBACK
                try:
                    await client.execute_command("FUNCTION", "LOAD", "REPLACE", library()[1])
                except ResponseError:
                    self.usable = False
                    return FALLBACK
        return FALLBACK


def scripts(client: Any, wanted: bool | None = None) -> Scripts:
    """The verbs bound to ``client``: FCALL of the library where its server runs it
    (``wanted``: None = EMQ_LUA_FUNCTIONS), else EVALSHA."""
    return Scripts(client, Functions(client, wanted))
