"""Run a function when the current Django transaction commits (``on_commit=True``).

Django is imported here, on the first such call only: ``import emqtasks`` loads no Django.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import ConfigError


def run_on_commit(fn: Callable[[], None]) -> None:
    """``fn()`` once the default database's transaction commits; never if it rolls back;
    at once outside a transaction (Django's ``transaction.on_commit``)."""
    try:
        from django.db import transaction
    except ImportError:
        raise ConfigError("on_commit=True (delay_on_commit) needs Django: "
                          "pip install 'emqtasks[django]'") from None
    transaction.on_commit(fn)
