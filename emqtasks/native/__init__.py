"""The native twin of the Lua verbs: a Redis / Valkey module (``emq.c``), optional.

Each command takes exactly a verb's KEYS (the queue's 12 fixed keys) then its ARGV, and
answers what the script answers. ``module_path()`` finds a built ``emq.so`` (built by the
package build when a compiler exists, or by ``python -m emqtasks.native.build``).
"""

from __future__ import annotations

from pathlib import Path

from ..store.commands import COMMANDS as _COMMANDS

HERE = Path(__file__).resolve().parent

#: Lua verb -> module command (the names are the store's; re-exported for callers here).
COMMANDS = _COMMANDS


def module_path() -> Path | None:
    """The built module next to this file, or None when it was not built."""
    path = HERE / "emq.so"
    return path if path.is_file() else None


def load_args(load: bool | None = None) -> list[str]:
    """A server's ``--loadmodule`` arguments: the built module when there is one (or when
    ``load`` is True), none when ``load`` is False or nothing was built."""
    path = module_path()
    if load is False or path is None:
        return []
    return ["--loadmodule", str(path)]
