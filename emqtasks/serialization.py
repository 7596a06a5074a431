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


def dumps_args(args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any], limit: int) -> str:
    """Encode a call; raises SerializationError or PayloadTooLarge, having written nothing."""
    try:
        text = _encode({"v": VERSION, "a": list(args), "k": kwargs})
    except (TypeError, ValueError, RecursionError) as exc:
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
