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


def _signature_uncached(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


@functools.lru_cache(maxsize=1024)
def _signature_cached(fn: Callable[..., Any]) -> inspect.Signature | None:
    return _signature_uncached(fn)


def _hashable(fn: Callable[..., Any]) -> bool:
    # a callable object whose class defines __eq__ without __hash__ cannot be a cache key
    try:
        hash(fn)
    except TypeError:
        return False
    return True


def signature_of(fn: Callable[..., Any]) -> inspect.Signature | None:
    """fn's signature, or None when it has none to inspect (some builtins)."""
    return _signature_cached(fn) if _hashable(fn) else _signature_uncached(fn)


def _binds(fn: Callable[..., Any], args: Any, kwargs: dict[str, Any]) -> bool:
    sig = signature_of(fn)
    if sig is None:   # no signature to inspect: call it as made
        return True
    try:
        sig.bind(*args, **kwargs)
    except TypeError:
        return False
    return True


@functools.lru_cache(maxsize=4096)
def _shape_fits(fn: Callable[..., Any], nargs: int, names: tuple[str, ...]) -> bool:
    return _binds(fn, range(nargs), dict.fromkeys(names))


def fits(fn: Callable[..., Any], args: tuple[Any, ...] | list[Any],
         kwargs: dict[str, Any]) -> bool:
    """Whether fn(*args, **kwargs) binds (True when fn has no signature to inspect)."""
    try:
        return _shape_fits(fn, len(args), tuple(kwargs))
    except TypeError:   # fn cannot be a cache key (_binds itself raises no TypeError)
        return _binds(fn, args, kwargs)


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
