"""The versioned JSON envelope of a job's arguments and of its result. JSON only: no pickle."""

from __future__ import annotations

import json
import math
from typing import Any

from .errors import PayloadTooLarge, ResultTooLarge, SerializationError

VERSION = 1
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
_decode = json.JSONDecoder().decode


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (non-finite numbers are refused)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} overflows to {value}")
    return value


#: Arguments are decoded strictly: NaN, Infinity and numbers that overflow to them are what
#: Python's json accepts but JSON does not, and our encoder never writes them.
_decode_args = json.JSONDecoder(parse_constant=_refuse_constant,
                                parse_float=_finite_float).decode


#: What a container may hold without anything inside to look at.
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _key_not_text(value: Any, path: str) -> str | None:
    """Where in ``value`` a dict has a key that is not a string, or None. Iterative (a
    structure nested too deeply is the encoder's to refuse); the types of a container's
    items are read in one pass in C, so a container of plain values costs next to nothing,
    and a path is spelled out only for the key it names."""
    stack: list[tuple[Any, Any]] = [(value, path)]
    containers = (dict, list, tuple)
    while stack:
        item, where = stack.pop()
        if isinstance(item, dict):
            if not set(map(type, item)) <= {str}:
                for k in item:
                    if not isinstance(k, str):
                        return f"{_path(where)} has the key {k!r} ({type(k).__name__})"
            if not set(map(type, item.values())) <= _SCALARS:
                stack += [(v, (where, k)) for k, v in item.items()
                          if isinstance(v, containers)]
        elif not set(map(type, item)) <= _SCALARS:
            stack += [(v, (where, i)) for i, v in enumerate(item)
                      if isinstance(v, containers)]
    return None


def _path(where: Any) -> str:
    """``args[0]['x']`` from the chain ((("args", 0), "x")) _key_not_text keeps."""
    keys: list[str] = []
    while isinstance(where, tuple):
        where, key = where
        keys.append(f"[{key!r}]")
    return str(where) + "".join(reversed(keys))


def _refuse_keys_not_text(args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> None:
    """Raise SerializationError, naming where, if a dict of the call has a key that is not
    a string: JSON writes the key 1 as "1", silently, and {1: 'a', '1': 'b'} as one key
    twice, which a reader takes as one."""
    where = _key_not_text(args, "args") or _key_not_text(kwargs, "kwargs")
    if where is not None:
        raise SerializationError(f"task arguments: a dict key is not a string: the dict at "
                                 f"{where}; JSON keys are strings (convert it, e.g. str(key))")


def with_trace(payload: str, trace: dict[str, str]) -> str:
    """An encoded envelope (without one) given a trace context, last, as dumps_args puts it:
    a schedule's job is encoded once, and each firing carries its own context."""
    return f'{payload[:-1]},"t":{_encode(trace)}}}'


def dumps_args(args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any], limit: int,
               trace: dict[str, str] | None = None) -> str:
    """Encode a call; raises SerializationError or PayloadTooLarge, having written nothing.
    ``trace``: the sender's trace context (observe/tracing.py), last in the envelope, where
    a reader that does not know it ignores it."""
    env: dict[str, Any] = {"v": VERSION, "a": list(args), "k": kwargs}
    if trace:
        env["t"] = trace
    try:
        text = _encode(env)
    except (TypeError, ValueError, RecursionError) as exc:
        if isinstance(exc, TypeError):   # a key the encoder refuses (a tuple): say where
            _refuse_keys_not_text(args, kwargs)
        raise SerializationError(f"task arguments are not JSON-encodable: {exc}") from None
    if len(text) > limit:   # a character is at least one byte: refused without encoding
        raise PayloadTooLarge(f"payload of at least {len(text)} bytes is over the {limit}-byte "
                              f"limit (max_payload_bytes)")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise SerializationError(f"task arguments are not valid UTF-8 text: {exc.reason} "
                                 f"at character {exc.start}") from None
    if size > limit:
        raise PayloadTooLarge(f"payload of {size} bytes is over the {limit}-byte limit "
                              f"(max_payload_bytes)")
    _refuse_keys_not_text(args, kwargs)   # the keys it wrote as strings
    return text


def loads_args(text: str) -> tuple[list[Any], dict[str, Any]]:
    """Decode a call; raises SerializationError for anything that is not a v1 envelope.

    A payload that was not valid UTF-8 reaches here with its bad bytes as lone surrogates
    (clients decode with ``surrogateescape``, see app.connect) and is refused as such.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        byte = f" 0x{ord(bad) - 0xDC00:02x}" if 0xDC80 <= ord(bad) <= 0xDCFF else ""
        raise SerializationError(f"undecodable payload: not valid UTF-8 (bad byte{byte} at "
                                 f"character {exc.start})") from None
    except AttributeError:
        raise SerializationError(f"undecodable payload: {type(text).__name__}, not text") \
            from None
    try:
        env = _decode_args(text)
    except (TypeError, ValueError) as exc:
        raise SerializationError(f"undecodable payload: {exc}") from None
    except RecursionError:
        raise SerializationError("undecodable payload: nested too deeply") from None
    if (not isinstance(env, dict) or env.get("v") != VERSION
            or not isinstance(env.get("a"), list) or not isinstance(env.get("k"), dict)):
        raise SerializationError("payload is not a version-1 emqtasks envelope")
    return env["a"], env["k"]


def dumps_result(value: Any, limit: int) -> str:
    """Encode a task's result; SerializationError, or ResultTooLarge over ``limit`` bytes."""
    try:
        size = len((text := _encode(value)).encode("utf-8"))   # a lone surrogate fails here,
    except (TypeError, ValueError, RecursionError) as exc:     # not in the ack's write
        raise SerializationError(f"task result is not JSON-encodable: {exc}") from None
    if size > limit:
        raise ResultTooLarge(f"result of {size} bytes is over the {limit}-byte limit "
                             f"(max_result_bytes)")
    return text


def loads_result(text: str | None) -> Any:
    return None if text is None or text == "" else _decode(text)
