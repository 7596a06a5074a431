"""A failed job's error text read back: the exception's class path, its message and its
traceback, and the exception rebuilt from them (``AsyncResult.get()`` re-raises the task's
own class, as Celery's does; the Django backend names the class).

The worker writes ``Name: message`` (a note may follow in parentheses), then Python's
traceback, whose last exception line names the class with its module (none for
``builtins``). A text without a traceback (a job that could never run) names only the class.
"""

from __future__ import annotations

import ast
import builtins
import re
import sys
from dataclasses import dataclass

from .. import errors

__all__ = ["RemoteError", "parse", "rebuild"]

_NAME = re.compile(r"[A-Za-z_]\w*")
_TRACEBACK = "Traceback (most recent call last):"


@dataclass(frozen=True)
class RemoteError:
    #: ``module.QualName`` (``builtins.ValueError``); a bare name when none is known
    class_path: str
    #: ``str(exc)`` as the task saw it
    message: str
    #: Python's traceback text, or the whole error text when it has none
    traceback: str


def parse(text: str | None) -> RemoteError | None:
    """The parts of a row's error text; None for a text that names no exception (a
    cancelled or expired job's, one a consumer wrote by hand)."""
    if not text:
        return None
    first, _, rest = text.partition("\n")
    name, sep, head_message = first.partition(": ")
    if not sep or not _NAME.fullmatch(name):
        return None
    # Python's traceback follows the header line, or the header's lines (a message on many)
    start = text.find(f"\n{_TRACEBACK}\n")
    if start >= 0:
        rest = text[start + 1:]
    own_line = re.compile(rf"^((?:[A-Za-z_]\w*\.)*){re.escape(name)}(?:: (.*))?$")
    lines = rest.splitlines()
    # the last line naming the class is the raised exception's (causes are printed first)
    for i in range(len(lines) - 1, -1, -1):
        found = own_line.match(lines[i])
        if found:
            message = "\n".join([found.group(2) or "", *lines[i + 1:]]).rstrip("\n")
            return RemoteError(_qualified(found.group(1), name), message, rest)
    return RemoteError(_qualified("", name), head_message, text)


def _qualified(prefix: str, name: str) -> str:
    if prefix:
        return f"{prefix}{name}"
    # Python's traceback names no module for builtins and __main__ (the worker's, not
    # ours: left bare, it resolves to nothing); a text without a traceback is ours
    if isinstance(getattr(builtins, name, None), type):
        return f"builtins.{name}"
    return f"{errors.__name__}.{name}" if hasattr(errors, name) else name


def rebuild(text: str | None) -> Exception | None:
    """The task's exception as ``cls(message)`` when its module is imported here and it is an
    Exception (never a BaseException such as SystemExit); None when it does not or its
    constructor refuses one message."""
    parts = parse(text)
    if parts is None:
        return None
    cls = _resolve(parts.class_path)
    if cls is None:
        return None
    message: object = parts.message
    if issubclass(cls, KeyError):
        # a KeyError's str() is its key's repr: the key back, when it is a literal
        try:
            message = ast.literal_eval(parts.message)
        except (ValueError, SyntaxError):
            pass
    try:
        return cls(message)
    except Exception:
        return None


def _resolve(path: str) -> type[Exception] | None:
    """The class at ``module.Qual.Name``: the longest prefix that is a module this process
    has imported already, then attributes. Never an import: the path is a row's text, which
    a producer may write, and importing a module runs its code."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        found: object = sys.modules.get(".".join(parts[:cut]))
        if found is None:
            continue
        for attr in parts[cut:]:
            found = getattr(found, attr, None)
        if isinstance(found, type) and issubclass(found, Exception):
            return found
        return None
    return None
