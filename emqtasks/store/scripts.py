"""Loads the Lua verbs from ``lua/``, composes each with the helpers it includes, runs them by SHA.

A verb's header names the helper files of ``lua/lib/`` it uses, on one line
``-- Includes: keys, ring``; a helper file names its own the same way. The loader sends the
prelude (the fixed keys and BASE), then every file reached from the verb's list, each once and
after the files it includes, then the verb: so a verb loads only what it uses. An include that
names no file, or a cycle of includes, refuses the load (ConfigError naming the file).

Each verb computes its SHA on the client and runs EVALSHA; on NOSCRIPT it sends the source
with EVAL, which loads and runs it in one command (and caches it for the next EVALSHA). So a
``SCRIPT FLUSH`` or a restarted server costs one extra round trip, no error -- even when the
cache is flushed again right after the reload, which redis-py's own SCRIPT LOAD-then-EVALSHA
fallback does not survive.
"""

from __future__ import annotations

import functools
import hashlib
import re
import threading
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
    "wfcancel", "find", "lanes", "wake", "forget", "abort", "tenant",
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


_INCLUDES = re.compile(r"^-- Includes:(.*)$", re.MULTILINE)
_LIB_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def includes(text: str, where: str) -> list[str]:
    """The helper files a Lua file's header names on its ``-- Includes:`` line, in order
    (none without the line); words in parentheses after the names are a comment."""
    lines = _INCLUDES.findall(text.split("\n\n", 1)[0])
    if len(lines) > 1:
        raise ConfigError(f"{where} has more than one '-- Includes:' line")
    listed = lines[0].split("(", 1)[0].strip() if lines else ""
    names = [n.strip() for n in listed.split(",")] if listed else []
    for n in names:
        if not _LIB_NAME.match(n):
            raise ConfigError(f"{where} includes {n!r}: not a helper file's name")
    return names


def load_order(folder: Path, name: str) -> list[str]:
    """The helper files verb ``name`` loads, each once and after the files it includes."""
    order: list[str] = []
    visiting: list[str] = []

    def visit(lib: str, includer: str) -> None:
        if lib in order:
            return
        if lib in visiting:
            cycle = " -> ".join(f"lib/{n}.lua" for n in visiting[visiting.index(lib):] + [lib])
            raise ConfigError(f"lua/{includer} closes a cycle of includes: {cycle}")
        path = folder / "lib" / f"{lib}.lua"
        if not path.is_file():
            raise ConfigError(f"lua/{includer} includes {lib!r}: there is no lua/lib/{lib}.lua")
        visiting.append(lib)
        for dep in includes(path.read_text(), f"lua/lib/{lib}.lua"):
            visit(dep, f"lib/{lib}.lua")
        visiting.pop()
        order.append(lib)

    for lib in includes((folder / f"{name}.lua").read_text(), f"lua/{name}.lua"):
        visit(lib, f"{name}.lua")
    return order


def compose(folder: Path, name: str) -> str:
    """The full text of verb ``name`` from the Lua sources in ``folder``: the prelude, the
    helper files it includes (load_order), the verb."""
    text = (folder / f"{name}.lua").read_text()
    _check_header(name, text)
    helpers = "".join((folder / "lib" / f"{lib}.lua").read_text() + "\n"
                      for lib in load_order(folder, name))
    return _prelude(name) + helpers + text


_COMPOSING = threading.Lock()


@functools.cache
def _source(name: str) -> str:
    return compose(lua_dir(), name)


def source(name: str) -> str:
    """The full text sent to Redis for one verb: prelude, the helpers it includes, the verb
    (composed once, under a lock: many threads' first calls wait for one composition)."""
    with _COMPOSING:
        return _source(name)


#: A full server's refusal inside a script: its own reply (OOM) from Redis 7 on, the text of
#: a script error on 6.2 ("Error running script ...: -OOM command not allowed ...").
_OOM = "OOM command not allowed"


#: What a Functions call (functions.py) returns when the verb must go as EVALSHA instead.
FALLBACK: Any = object()


class Verb(Script):
    """A redis-py ``Script`` whose NOSCRIPT fallback is EVAL of the source: no window
    between a reload and the run for another SCRIPT FLUSH to fail the call. A full server's
    refusal is ServerFull (the script was stopped at its first write: nothing written).
    With ``functions`` (functions.Functions) it goes as FCALL where the server runs the
    library, else as above."""

    def __init__(self, client: Any, script: str, verb: str = "",
                 functions: Any = None) -> None:
        super().__init__(client, script)
        self.verb = verb
        self.functions = functions

    def __call__(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        from redis.client import Pipeline

        client = self.registered_client if client is None else client
        if isinstance(client, Pipeline):   # pipelines load their scripts before EXEC
            return super().__call__(keys, args, client)
        keys, args = list(keys or ()), list(args or ())
        try:
            if self.functions is not None and self.functions.usable is not False:
                reply = self.functions.call(
                    client, lambda c, k, a: client.execute_command(c, *k, *a),
                    self.verb, keys, args)
                if reply is not FALLBACK:
                    return reply
            try:
                return client.evalsha(self.sha, len(keys), *keys, *args)
            except NoScriptError:
                return client.eval(self.script, len(keys), *keys, *args)
        except ResponseError as exc:
            if out_of_memory(exc):
                raise ServerFull.of(exc) from None   # refused at its first write: no write
            raise


def out_of_memory(exc: ResponseError) -> bool:
    """Whether a script's error is a full server's refusal (nothing was written)."""
    return isinstance(exc, OutOfMemoryError) or _OOM in str(exc)


class Scripts:
    """One ``Verb`` per verb, bound to a client."""

    def __init__(self, client: Any, functions: Any = None) -> None:
        #: FCALL of the verbs' library where the server runs it (a functions.Functions;
        #: None: EVALSHA only). functions.scripts() makes both.
        self.functions = functions
        for name in VERBS:
            setattr(self, name, Verb(client, source(name), name, self.functions))

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
    forget: Any
    tenant: Any


# --- Redis Functions (Redis >= 7.0, Valkey): the verbs as one library -----------------------
# EVALSHA runs a verb's whole text on every call, so Lua rebuilds every helper closure it
# includes each time (~9 KB allocated per enqueue, ~14 KB per ack). A library's main chunk
# runs once per FUNCTION LOAD: the helpers are built once, each verb is a registered function.
# The prelude's key names, BASE, KEYS and ARGV become main-chunk locals the helpers close over,
# set by each verb on entry (a server runs one function at a time, so sharing them is safe).


def library_order(folder: Path, verbs: tuple[str, ...]) -> list[str]:
    """Every helper file the verbs load, each once and after the files it includes."""
    order: list[str] = []
    for verb in verbs:
        for lib in load_order(folder, verb):
            if lib not in order:
                order.append(lib)   # its own includes came earlier in this verb's order
    return order


#: Per-run state in the helper files: a cache read once per script run (``local MODE = nil``,
#: at a file's top level or in its ``do`` block). The library builds the helpers once, so it
#: hoists each to its main chunk and resets it to nil on every call, as a fresh EVAL would be.
_RUN_STATE = re.compile(r"^(?:  )?local ([A-Z][A-Z_]*) = nil\b.*$", re.MULTILINE)
#: A key formed from BASE at a helper file's top level (lib/keys.lua): formed on every call.
_BASE_KEY = re.compile(r"^local (K_[a-z_]+) = BASE \.\. '([a-z_]+)'.*$", re.MULTILINE)


#: lib/core.lua's guard write, a no-op in the library (compose_library says why).
_GUARD = "local function runs_when_full() redis.call('DEL', K_guard) end"


#: A block's copy of names from before it (``local K_ring, job_key =\n K_ring, job_key``,
#: lib/claim.lua says why): the library drops the per-call names from it, or a copy made at
#: the build would keep the first call's keys.
_COPY = re.compile(r"^( +)local (\w+(?:, \w+)*) =\s+(\w+(?:, \w+)*)$", re.MULTILINE)


def _uncopy(text: str, per_call: set[str]) -> str:
    def edit(m: re.Match[str]) -> str:
        names, values = m.group(2).split(", "), m.group(3).split(", ")
        if names != values:
            return m.group(0)
        kept = [n for n in names if n not in per_call]
        return f"{m.group(1)}local {', '.join(kept)} = {', '.join(kept)}" if kept else ""
    return _COPY.sub(edit, text)


def compose_library(folder: Path, verbs: tuple[str, ...] = VERBS) -> tuple[str, str]:
    """The library's name and full text, for FUNCTION LOAD.

    A library's main chunk runs at load with no Lua library at hand (only ``redis``), so it
    declares the per-call locals (KEYS, ARGV, BASE, the keys, the per-run state) and one
    ``build`` function holding every helper file once and the verbs as closures; the first
    call runs ``build`` (once per load). Each verb is registered as ``emq_<verb>_<tag>``; it
    sets the per-call locals, then runs its closure. The tag is a hash of the text, so two
    releases' workers on one server each load (and call) their own library."""
    helpers = "".join((folder / "lib" / f"{lib}.lua").read_text() + "\n"
                      for lib in library_order(folder, verbs))
    state = _RUN_STATE.findall(helpers)
    keyed = _BASE_KEY.findall(helpers)
    if len(set(state)) != len(state):
        raise ConfigError(f"two helper files hold per-run state of one name: {sorted(state)}")
    fixed = [f"K_{k}" for k in FIXED]
    shared = ["KEYS", "ARGV", "BASE", *fixed, *(k for k, _ in keyed), *state]
    helpers = _uncopy(_BASE_KEY.sub("", _RUN_STATE.sub("", helpers)), set(shared))
    # A full server refuses an FCALL before the function runs (the library's functions carry
    # no allow-oom flag), so inside one no command is refused for memory: the guard's DEL
    # (lib/core.lua runs_when_full), there for EVALSHA's first-write rule, would be one
    # command of every settling call (claim, ack...) for nothing.
    helpers = helpers.replace(_GUARD, "local function runs_when_full() end")
    # BASE and the names formed from it change only with the queue (keys_[1]): formed again
    # only when a call names another queue than the call before (KEY1_, the library's one
    # state across calls, derived from the call's own keys: ~15 concatenations a call saved).
    # The fixed keys are formed from it too: a call sends the first alone (and the verb's
    # own keys after it: functions.fcall_keys), or all of them (the benches), the same.
    enter = ["KEYS, ARGV = keys_, argv_",
             "if keys_[1] ~= KEY1_ then",
             "KEY1_ = keys_[1]",
             f"BASE = string.sub(keys_[1], 1, -{len(FIXED[0]) + 1})",
             "{} = keys_[1], {}".format(", ".join(fixed),
                                        ", ".join(f"BASE .. '{k}'" for k in FIXED[1:])),
             *(f"{k} = BASE .. '{name}'" for k, name in keyed),
             "end",
             *(f"{k} = nil" for k in state)]
    out = ["local " + ", ".join(shared) + "\n",
           "local V_, KEY1_\nlocal function build_()\n", helpers, "local v_ = {}\n"]
    for verb in verbs:
        text = (folder / f"{verb}.lua").read_text()
        _check_header(verb, text)
        extra = VERB_KEYS.get(verb, ())
        more = "" if not extra else "local {} = {}\n".format(   # the last of KEYS
            ", ".join(f"K_{k}" for k in extra),
            ", ".join(f"KEYS[#KEYS - {len(extra) - i}]" for i in range(1, len(extra) + 1)))
        out.append(f"v_.{verb} = function()\n{more}{text}\nend\n")
    out.append("return v_\nend\nlocal function enter_(keys_, argv_)\n"
               + "\n".join(enter) + "\nif not V_ then V_ = build_() end\nend\n")
    for verb in verbs:
        out.append(f"redis.register_function('emq_{verb}_@TAG@', function(keys_, argv_)\n"
                   f"enter_(keys_, argv_)\nreturn V_.{verb}()\nend)\n")
    text = "".join(out)
    tag = hashlib.sha1(text.encode()).hexdigest()[:12]
    name = f"emq_{tag}"
    return name, f"#!lua name={name}\n" + text.replace("@TAG@", tag)
