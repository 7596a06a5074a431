"""The versioned JSON envelope of a job's arguments and of its result. JSON only: no pickle."""

from __future__ import annotations

import json
from typing import Any

from .errors import PayloadTooLarge, SerializationError

VERSION = 1
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
_decode = json.JSONDecoder().decode


def dumps_args(args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any], limit: int) -> str:
    """Encode a call; raises SerializationError or PayloadTooLarge, having written nothing."""
    try:
        text = _encode({"v": VERSION, "a": list(args), "k": kwargs})
    except (TypeError, ValueError) as exc:
        raise SerializationError(f"task arguments are not JSON-encodable: {exc}") from None
    if len(text) > limit or len(text.encode("utf-8")) > limit:
        raise PayloadTooLarge(f"payload of {len(text.encode('utf-8'))} bytes is over the "
                              f"{limit}-byte limit")
    return text


def loads_args(text: str) -> tuple[list[Any], dict[str, Any]]:
    """Decode a call; raises SerializationError for anything that is not a v1 envelope."""
    try:
        env = _decode(text)
    except (TypeError, ValueError) as exc:
        raise SerializationError(f"undecodable payload: {exc}") from None
    if (not isinstance(env, dict) or env.get("v") != VERSION
            or not isinstance(env.get("a"), list) or not isinstance(env.get("k"), dict)):
        raise SerializationError("payload is not a version-1 emqtasks envelope")
    return env["a"], env["k"]


def dumps_result(value: Any) -> str:
    try:
        return _encode(value)
    except (TypeError, ValueError) as exc:
        raise SerializationError(f"task result is not JSON-encodable: {exc}") from None


def loads_result(text: str | None) -> Any:
    return None if text is None or text == "" else _decode(text)
