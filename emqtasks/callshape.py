"""Whether a call's arguments bind to a function, worked out once per shape of call.

Enqueue (a group function) and the worker (a task) check every call; binding to an
``inspect.Signature`` costs ~10 us, but whether it binds depends only on the number of
positional arguments and the keyword names, so that answer is cached.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any


@functools.lru_cache(maxsize=1024)
def signature_of(fn: Callable[..., Any]) -> inspect.Signature | None:
    """fn's signature, or None when it has none to inspect (some builtins)."""
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


@functools.lru_cache(maxsize=4096)
def _shape_fits(fn: Callable[..., Any], nargs: int, names: tuple[str, ...]) -> bool:
    sig = signature_of(fn)
    if sig is None:   # no signature to inspect: call it as made
        return True
    try:
        sig.bind(*range(nargs), **dict.fromkeys(names))
    except TypeError:
        return False
    return True


def fits(fn: Callable[..., Any], args: tuple[Any, ...] | list[Any],
         kwargs: dict[str, Any]) -> bool:
    """Whether fn(*args, **kwargs) binds (True when fn has no signature to inspect)."""
    return _shape_fits(fn, len(args), tuple(kwargs))


def misfit(fn: Callable[..., Any], args: tuple[Any, ...] | list[Any],
           kwargs: dict[str, Any]) -> str | None:
    """None when the call binds, else the signature and why not (for an error message)."""
    if fits(fn, args, kwargs):
        return None
    sig = signature_of(fn)
    try:
        sig.bind(*args, **kwargs)  # type: ignore[union-attr]
    except TypeError as exc:
        return f"{sig}: {exc}"
    return None  # pragma: no cover - a shape that does not fit never binds
