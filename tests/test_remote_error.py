"""A failed job's error text read back (producer/remote_error.py): the class path, message
and traceback the worker wrote, and the exception rebuilt from them, as AsyncResult.get()
re-raises it."""

from __future__ import annotations

import traceback

import pytest

from emqtasks import errors
from emqtasks.producer import remote_error


class Outer:
    class Inner(Exception):
        """A nested class: the traceback names it Outer.Inner."""


class TwoArgs(Exception):
    def __init__(self, code: int, why: str) -> None:
        super().__init__(f"{code} {why}")


def _text(exc: BaseException, note: str = "") -> str:
    """What the worker writes for an exception (worker/runner.py _describe)."""
    try:
        raise exc
    except BaseException as raised:
        tb = "".join(traceback.format_exception(type(raised), raised, raised.__traceback__))
        return f"{type(raised).__name__}: {raised}{f' ({note})' if note else ''}\n{tb}"


def _chained() -> str:
    try:
        try:
            {}["k"]
        except KeyError as cause:
            raise ValueError("first line\nsecond line") from cause
    except ValueError as exc:
        return _text(exc, "max_retries reached")
    raise AssertionError


def test_the_parts_of_a_chained_multi_line_error_with_a_note() -> None:
    parts = remote_error.parse(_chained())
    assert parts is not None
    assert parts.class_path == "builtins.ValueError"
    assert parts.message == "first line\nsecond line"         # no note, no cause
    assert parts.traceback.startswith("Traceback (most recent call last):")
    assert "KeyError: 'k'" in parts.traceback


@pytest.mark.parametrize("exc, cls, message", [
    (RuntimeError("boom"), RuntimeError, "boom"),
    (KeyError("order-7"), KeyError, "'order-7'"),               # str() of a KeyError: repr
    (Outer.Inner("nested"), Outer.Inner, "nested"),
    (errors.MaxRetriesExceededError("no more"), errors.MaxRetriesExceededError, "no more"),
    (ValueError(""), ValueError, ""),
])
def test_rebuilt_as_its_own_class_with_its_message(exc: Exception, cls: type, message: str
                                                   ) -> None:
    rebuilt = remote_error.rebuild(_text(exc))
    assert type(rebuilt) is cls and str(rebuilt) == message
    if isinstance(exc, KeyError):
        assert rebuilt is not None and rebuilt.args == ("order-7",)


@pytest.mark.parametrize("text", [
    _text(TwoArgs(402, "no funds")),                            # its constructor refuses
    _text(SystemExit(3)),                                       # not an Exception
    "Gone: x\nTraceback (most recent call last):\nno.such.module.Gone: x\n",
    "cancelled",                                                # names no exception
    "expired: not started before its expiry",
    "Traceback ...\nValueError: flaky",                         # written by hand
    None,
])
def test_not_rebuilt(text: str | None) -> None:
    assert remote_error.rebuild(text) is None


def test_a_text_without_a_traceback_names_our_errors_or_builtins() -> None:
    unknown = remote_error.parse("UnknownTask: no task named x")
    assert unknown is not None and unknown.class_path == "emqtasks.errors.UnknownTask"
    assert unknown.message == "no task named x" and unknown.traceback.startswith("Unknown")
    builtin = remote_error.parse("TypeError: arguments do not fit")
    assert builtin is not None and builtin.class_path == "builtins.TypeError"
