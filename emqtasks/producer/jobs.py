"""build_job: one call of a task made into the row an enqueue writes, checked first.

Below task.py, canvas.py, schedules.py and app.py, which all make jobs: none of them
imports another to reach it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from datetime import datetime
from typing import Any

from .. import serialization, validate
from ..errors import InvalidArgument, InvalidGroup
from ..store.keys import (
    DEFAULT_GROUP,
    Unique,
    check_group,
    check_job_id,
    check_tenant,
    check_unique,
    new_job_id,
)
from ..store.queue import NewJob
from ..validate import integer
from .callshape import fits, signature_of
from .registry import TaskSpec


def build_job(spec: TaskSpec, args: tuple[Any, ...], kwargs: dict[str, Any], *, limit: int,
              job_id: str | None = None, group: str | None = None,
              countdown: float | None = None, eta: datetime | float | None = None,
              priority: int = 0, trace: dict[str, str] | None = None) -> NewJob:
    """The row of one call of a task, gated: raises before anything is written. ``trace``:
    the trace context the job carries to its runs (observe/tracing.py)."""
    payload = serialization.dumps_args(args, kwargs, limit, trace)
    return NewJob(
        id=check_job_id(job_id) if job_id is not None else new_job_id(),
        task=spec.name,
        payload=payload,
        group=check_group(group if group is not None else _group_of(spec, args, kwargs)),
        max_attempts=spec.max_attempts,
        lease_ms=int(spec.lease * 1000),
        delay_ms=int(spec.retry_delay * 1000),
        ttl=spec.result_ttl,
        countdown_ms=validate.countdown_ms(countdown, eta),
        priority=integer(priority, "a priority", -100, 100),
    )


def tenant_of(spec: TaskSpec, args: tuple[Any, ...], kwargs: dict[str, Any],
              tenant: str | None = None) -> str | None:
    """The call's tenant: ``tenant`` (the call's own), else by the task's ``tenant=`` (a
    name, or a function of the call's arguments as a group's), else None (its group is
    its own tenant). Gated: InvalidGroup before anything is written."""
    if tenant is not None:
        return check_tenant(tenant)
    t = spec.tenant
    if t is None or isinstance(t, str):
        return t
    return check_tenant(_picked(spec, t, args, kwargs, "tenant"))


def unique_of(spec: TaskSpec, args: tuple[Any, ...], kwargs: dict[str, Any],
              key: str | None = None, hold: float | None = None,
              debounce: float | None = None, debounce_max: float | None = None
              ) -> Unique | None:
    """The call's unique key and its hold in ms: ``key`` (the call's own), else by the
    task's ``unique=`` (a string, or a function of the call's arguments as a group's), else
    None; held ``hold`` s, else the task's ``unique_for``, else validate.UNIQUE_FOR. With
    ``debounce`` (s), debounced, never later than ``debounce_max`` s after the burst's first
    call (default 10 x debounce). Gated: InvalidArgument (a hold or a debounce without a key;
    one not finite positive; debounce_max below debounce) before anything is written."""
    if hold is not None:
        hold = validate.unique_for(hold)
    deb_ms = dmax_ms = 0
    if debounce is not None:
        deb = validate.seconds(debounce, "debounce", low=0.001)
        dmax = 10 * deb if debounce_max is None else validate.seconds(
            debounce_max, "debounce_max", low=0.001)
        if dmax < deb:
            raise InvalidArgument(f"debounce_max ({debounce_max}) is below debounce "
                                  f"({debounce})")
        deb_ms, dmax_ms = max(1, round(deb * 1000)), max(1, round(dmax * 1000))
    elif debounce_max is not None:
        raise InvalidArgument("debounce_max without debounce")
    u = spec.unique
    if key is None and u is not None:
        key = u if isinstance(u, str) else _picked(spec, u, args, kwargs, "unique")
    if key is None:
        if hold is not None:
            raise InvalidArgument("unique_for without unique_key: a key is what is held")
        if debounce is not None:
            raise InvalidArgument("debounce without unique_key: the key names the burst")
        return None
    hold = hold if hold is not None else spec.unique_for or validate.UNIQUE_FOR
    # a debounced job's key is held at least until the latest it can be due
    hold_ms = max(1, round(hold * 1000), dmax_ms)
    return check_unique(key, hold_ms, deb_ms, dmax_ms)


def _group_of(spec: TaskSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    g = spec.group
    if g is None:
        return DEFAULT_GROUP
    if isinstance(g, str):
        return g
    return _picked(spec, g, args, kwargs, "group")


def _picked(spec: TaskSpec, g: Callable[..., str], args: tuple[Any, ...],
            kwargs: dict[str, Any], what: str) -> str:
    # The call as made, if it fits the group function; else the task's arguments by name,
    # so ``lambda tenant, **_: tenant`` serves ``build_report.delay("acme", 42)``.
    call = (args, kwargs) if fits(g, args, kwargs) else _by_name(spec.fn, args, kwargs)
    try:
        group: str = g(*call[0], **call[1])
    except Exception as exc:
        raise InvalidGroup(f"the {what} function of {spec.name} failed: {exc!r}") from exc
    return group


def _by_name(fn: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A call's arguments bound to the task's parameters, passed by name where they can be."""
    sig = signature_of(fn)
    try:
        bound = sig.bind(*args, **kwargs) if sig is not None else None
    except TypeError:
        bound = None
    if bound is None:
        return args, kwargs
    params = bound.signature.parameters
    star = any(params[n].kind is inspect.Parameter.VAR_POSITIONAL and v
               for n, v in bound.arguments.items())
    pos: list[Any] = []
    named: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        kind = params[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            pos.extend(value)
        elif kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        elif kind is inspect.Parameter.POSITIONAL_ONLY or (
                star and kind is inspect.Parameter.POSITIONAL_OR_KEYWORD):
            pos.append(value)
        else:
            named[name] = value
    return tuple(pos), named
