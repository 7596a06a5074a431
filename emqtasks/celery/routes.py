"""``task_routes``: task names (or glob patterns) -> the queue their jobs go to.

Celery's forms: a dict ``{"proj.tasks.add": {"queue": "math"}, "proj.mail.*": "mail"}`` or
a list of such dicts, read in order; the first match wins, an exact name before a pattern of
the same dict. A router function has no meaning here (ConfigError): routes are data, read
at decoration and by ``send_task``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from ..store.keys import check_queue_name

Routes = tuple[tuple[str, str], ...]   # (name or pattern, queue), in the order they apply


def parse_routes(value: Any) -> Routes:
    if value is None:
        return ()
    tables = [value] if isinstance(value, Mapping) or callable(value) else value
    if not isinstance(tables, (list, tuple)):
        raise ConfigError(f"task_routes is a dict of task name (or glob pattern) -> "
                          f"{{'queue': name}} or a list of such dicts, not {value!r}")
    out: list[tuple[str, str]] = []
    for table in tables:
        if not isinstance(table, Mapping):
            raise ConfigError(f"task_routes: a router function or {type(table).__name__} has "
                              f"no meaning in emqtasks: give a dict of task name (or glob "
                              f"pattern) -> {{'queue': name}}, not {table!r}")
        exact = [(k, v) for k, v in table.items() if not _is_pattern(k)]
        for pattern, route in exact + [(k, v) for k, v in table.items() if _is_pattern(k)]:
            out.append((_pattern(pattern), _queue_of(pattern, route)))
    return tuple(out)


def route(routes: Routes, name: str) -> str | None:
    """The queue of task ``name`` by the routes, or None (no route names it)."""
    for pattern, queue in routes:
        if pattern == name or (_is_pattern(pattern) and fnmatch.fnmatchcase(name, pattern)):
            return queue
    return None


def _is_pattern(key: str) -> bool:
    return any(c in key for c in "*?[")


def _pattern(key: Any) -> str:
    if not isinstance(key, str) or not key:
        raise ConfigError(f"task_routes: a key is a task name or glob pattern, not {key!r} "
                          f"(a compiled regex has no meaning here: use a glob such as "
                          f"'proj.mail.*')")
    return key


def _queue_of(pattern: str, route_value: Any) -> str:
    if isinstance(route_value, str):
        return check_queue_name(route_value)
    if isinstance(route_value, Mapping) and isinstance(route_value.get("queue"), str):
        extra = set(route_value) - {"queue", "routing_key"}
        if extra:
            raise ConfigError(f"task_routes[{pattern!r}]: {', '.join(sorted(extra))} "
                              f"have no meaning in emqtasks (there are no exchanges): give "
                              f"{{'queue': name}}")
        return check_queue_name(route_value["queue"])
    raise ConfigError(f"task_routes[{pattern!r}] is a queue name or {{'queue': name}}, "
                      f"not {route_value!r}")
