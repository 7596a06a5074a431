"""Which path runs a queue's hot verbs: the module's EMQ.* commands or the Lua scripts.

``EMQ_NATIVE`` picks: ``auto`` (the default) uses the module when the server has it, ``off``
always runs the scripts, ``require`` refuses to run without the module (NativeUnavailable).
Detection costs no extra command: the first hot verb is sent as its EMQ.* command, and a
server that does not know it answers before anything is written; in ``auto`` the call is
then sent as the script, and so is every later one of that queue object (a user not granted
one EMQ.* command, NOPERM, falls back for that verb only). A server restarted without the
module is noticed the same way; one that gains it is used by queues made after that (a
worker restart). Both paths leave the same state (tests/test_native_diff.py), so a queue
served by both at once is one queue.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from redis.exceptions import (
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    RedisError,
    ResponseError,
)

from ..errors import ConfigError, NativeUnavailable, ServerFull
from ..native import module_path
from .cluster import is_cluster
from .commands import COMMANDS
from .functions import fcall_keys, function_name, sent_again
from .scripts import FALLBACK, out_of_memory
from .wire import Owed, Wire, WireBroken

MODES = ("auto", "off", "require")
#: The name the module registers (MODULE LIST).
MODULE_NAME = "emq"


def native_mode(environ: Mapping[str, str] | None = None) -> str:
    """``EMQ_NATIVE`` (auto, off or require; auto when unset); ConfigError otherwise."""
    env = os.environ if environ is None else environ
    mode = (env.get("EMQ_NATIVE") or "auto").strip().lower()
    if mode not in MODES:
        raise ConfigError(f"EMQ_NATIVE must be one of {', '.join(MODES)}, not {mode!r}")
    return mode


def _module_missing(exc: RedisError) -> bool:
    """The server (or, on a cluster, the client's command table) does not know the command,
    or this user may not run it: nothing was executed."""
    if isinstance(exc, NoPermissionError):
        return True
    text = str(exc).lower()
    if isinstance(exc, ResponseError):
        return text.startswith("unknown command")
    return "doesn't exist in redis commands" in text   # redis-py's cluster command table


def missing_hint() -> str:
    """What to do when EMQ_NATIVE=require meets a server without the module."""
    path = module_path()
    where = (f"load it with --loadmodule {path}" if path else
             "it is not built here (`emqtasks native status` says why)")
    return f"EMQ_NATIVE=require but the server has no emq module: {where}"


def loaded_version(client: Any, **target: Any) -> int | None:
    """The version of the emq module the server has loaded, or None (MODULE LIST; a user
    that may not run it gets NoPermissionError)."""
    for entry in client.execute_command("MODULE", "LIST", **target) or []:
        row = entry if isinstance(entry, dict) else dict(zip(entry[::2], entry[1::2]))
        name = row.get("name", row.get(b"name"))
        if (name.decode() if isinstance(name, bytes) else str(name)) == MODULE_NAME:
            return int(row.get("ver") or row.get(b"ver") or 0)
    return None


class Route:
    """Which path serves each hot verb of one client, learnt from the replies (shared by
    HotVerbs here and the async twin, aqueue.AsyncHotVerbs, which only differ in I/O)."""

    def __init__(self, client: Any, scripts: Any, mode: str | None = None) -> None:
        self.client = client
        self.scripts = scripts
        self.mode = native_mode() if mode is None else mode
        #: Per verb: None until its first call tells, then whether the module serves it. A
        #: server without the module turns every verb to False; a user not granted one
        #: command (NOPERM) turns only that verb.
        self.serves: dict[str, bool | None] = dict.fromkeys(
            COMMANDS, False if self.mode == "off" else None)

    @property
    def native(self) -> bool | None:
        """Whether the module serves this client (None: no hot verb has run yet)."""
        known = [v for v in self.serves.values() if v is not None]
        return any(known) if known else None

    def refused(self, verb: str, exc: Exception) -> None:
        """The module's command of ``verb`` failed with ``exc``: raise what the caller gets
        (ServerFull for a full server, NativeUnavailable under EMQ_NATIVE=require, a real
        error as it is), or return when the call is to be sent as the script (the module
        is missing, or this user may not run its command: remembered)."""
        if isinstance(exc, OutOfMemoryError):   # EMQ.ENQUEUE on a full server: nothing written
            raise ServerFull.of(exc) from None
        if not isinstance(exc, RedisError) or not _module_missing(exc):
            raise exc
        if self.mode == "require":
            if isinstance(exc, NoPermissionError):
                raise exc     # this user may not run this verb at all
            raise NativeUnavailable(missing_hint()) from None
        if isinstance(exc, NoPermissionError) or (
                verb == "abort" and any(self.serves.values())):
            # (a module of a release before EMQ.ABORT serves the other verbs still)
            self.serves[verb] = False
        else:
            self.serves = dict.fromkeys(COMMANDS, False)


class HotVerbs(Route):
    """The eight hot verbs of one client, each called as ``call(verb, keys, args)``."""

    def __init__(self, client: Any, scripts: Any, mode: str | None = None) -> None:
        super().__init__(client, scripts, mode)
        self.wire = Wire(client)

    def call(self, verb: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        if self.serves[verb] is False:
            return self._script(verb, keys, args)
        try:
            reply = self._send(COMMANDS[verb], keys, args)
        except RedisError as exc:
            self.refused(verb, exc)
            return self._script(verb, keys, args)
        self.serves[verb] = True
        return reply

    def _script(self, verb: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """The verb's script: EVALSHA pre-packed on the wire (as the module's command is);
        NOSCRIPT, a broken connection or a client the wire cannot serve go through the
        scripts' own call (scripts.Verb: EVAL of the source, redis-py's retries)."""
        script = getattr(self.scripts, verb)
        functions = getattr(self.scripts, "functions", None)
        if self.wire.usable and functions is not None and functions.usable is not False:
            try:   # FCALL of the library where the server runs it (functions.py)
                reply = functions.call(self.client, self.wire.call, verb, keys, args)
                if reply is not FALLBACK:
                    return reply
            except WireBroken:
                return script(keys, args)   # redis-py's reconnect and retries
            except ResponseError as exc:
                if out_of_memory(exc):
                    raise ServerFull.of(exc) from None
                raise
        if self.wire.usable:
            try:
                return self.wire.call("EVALSHA", (script.sha, len(keys), *keys), args)
            except (NoScriptError, WireBroken):
                pass
            except ResponseError as exc:
                if out_of_memory(exc):
                    raise ServerFull.of(exc) from None   # refused at its first write
                raise
        return script(keys, args)

    def call_piped(self, verb: str, keys: Sequence[str], args: Sequence[Any],
                   also: Callable[[Any], None]) -> Any:
        """The verb and the commands ``also`` adds to a pipeline, in one round trip (the
        master's tick: reap and its heartbeat). A verb whose path is not known yet, or a
        cluster client (its pipelines refuse EVALSHA), pays a round trip for each."""
        served = self.serves[verb]
        if served is None or is_cluster(self.client):
            reply = self.call(verb, keys, args)
            pipe = self.client.pipeline(transaction=False)
            also(pipe)
            pipe.execute()
            return reply
        pipe = self.client.pipeline(transaction=False)
        # FCALL once a call has shown the server runs the library (functions.py): else a
        # piped EVALSHA would answer NOSCRIPT on every tick, the script never loaded by EVAL
        fcall = not served and getattr(getattr(self.scripts, "functions", None), "usable",
                                       False) is True
        if served:
            pipe.execute_command(COMMANDS[verb], *keys, *args)
        elif fcall:
            sent = fcall_keys(keys)
            pipe.execute_command("FCALL", function_name(verb), len(sent), *sent, *args)
        else:
            pipe.evalsha(getattr(self.scripts, verb).sha, len(keys), *keys, *args)
        also(pipe)
        first, *rest = pipe.execute(raise_on_error=False)
        for r in rest:
            if isinstance(r, Exception):
                raise r
        if isinstance(first, NoScriptError) or (served and isinstance(first, RedisError)) or (
                fcall and sent_again(first)):
            # a flushed script cache, or a server restarted without the module: the one
            # call again, through the path that copes (a real error is raised again there)
            return self.call(verb, keys, args)
        if isinstance(first, Exception):
            raise first
        return first

    def call_many(self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]
                  ) -> list[Any]:
        """Several verb calls in one round trip on a single-connection client (a worker
        child's batch); per call its reply or its error (an exception, not raised). A verb
        whose path is not known yet, or a client the wire cannot batch on, pays a round
        trip for each; a call refused for a missing script, function or module is sent
        again alone (``call`` copes), the others are not (every verb here is fenced: acks
        of one holder are answered DONE again, a claim is never sent twice)."""
        maybe = [self._packed(v, k, a) for v, k, a in calls] if self.postable else [None]
        packed = [p for p in maybe if p is not None]
        if len(packed) < len(calls):
            return [self._one(v, k, a) for v, k, a in calls]
        try:
            replies = self.wire.call_many(packed)
        except WireBroken:
            return [self._one(v, k, a) for v, k, a in calls]
        return [self._one(verb, keys, args) if self.send_again(command, reply) else reply
                for (verb, keys, args), (command, _, _), reply
                in zip(calls, packed, replies, strict=True)]

    # -- posted calls: written now, the reply read later (a worker child's acks) ---------
    @property
    def postable(self) -> bool:
        """Whether calls can be pipelined here: a single-connection client on the wire."""
        return self.wire.usable and self.wire.single

    def post(self, verb: str, keys: Sequence[str], args: Sequence[Any]) -> Owed | None:
        """The verb's call written now on the single connection, its reply read before the
        next call's (``collect``): its Owed; None when it cannot be posted (the verb's path
        not known yet, or a client of another shape): then ``call`` it. A reply that
        ``send_again`` names asks for the call through ``call``."""
        packed = self._packed(verb, keys, args) if self.postable else None
        if packed is None:
            return None
        return self.wire.post(*packed)

    def collect(self) -> None:
        """Read the replies of the posted calls (into their Owed)."""
        self.wire.collect()

    def poll(self) -> None:
        """Read the replies of the posted calls that have arrived (none waited for)."""
        self.wire.poll()

    def _packed(self, verb: str, keys: Sequence[str], args: Sequence[Any]
                ) -> tuple[str, Sequence[Any], Sequence[Any]] | None:
        """The verb's call as its path sends it: the module's command, FCALL of the library
        where the server runs it (as ``call``), else EVALSHA; None while the path is not
        known (a first call, through ``call``, tells)."""
        served = self.serves[verb]
        if served:
            return COMMANDS[verb], keys, args
        if served is None:
            return None
        functions = getattr(self.scripts, "functions", None)
        usable = functions.usable if functions is not None else False
        if usable:
            sent = fcall_keys(keys)
            return "FCALL", (function_name(verb), len(sent), *sent), args
        if usable is None:
            return None
        return "EVALSHA", (getattr(self.scripts, verb).sha, len(keys), *keys), args

    def send_again(self, command: str, reply: Any) -> bool:
        """Whether a pipelined call's reply says nothing was run and ``call`` copes: a
        missing script (NOSCRIPT), function or module, a refused FCALL (sent as EVALSHA),
        or a connection broken before its reply was read (a fenced verb sent twice is
        answered as once)."""
        if isinstance(reply, WireBroken | NoScriptError):
            return True
        if not isinstance(reply, RedisError):
            return False
        if command == "FCALL":
            return sent_again(reply)
        return command != "EVALSHA" and _module_missing(reply)

    def _one(self, verb: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return self.call(verb, keys, args)
        except RedisError as exc:
            return exc

    def _send(self, command: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        if self.wire.usable:
            try:
                return self.wire.call(command, keys, args)
            except WireBroken:
                pass    # sent again below, with redis-py's reconnect and retries
        return self.client.execute_command(command, *keys, *args)
