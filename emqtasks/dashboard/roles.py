"""Who may use the dashboard, and what they may do: named tokens with a role.

``EMQ_DASHBOARD_TOKENS`` (or ``--tokens``) lists them as ``name:role:token`` entries, comma
or newline separated, or names a file holding them as ``@/path`` (one a line; ``#`` starts
a comment), so tokens need not sit in a process's environment. A ``viewer`` sees every
page and changes nothing (its POSTs are answered 403); an ``operator`` acts. The one
``--token`` of before stays an operator, named ``token``. The name is who the audit log
says made a change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError

ROLES = ("operator", "viewer")
#: Names go into the session cookie and the audit log: plain words only.
NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
#: The name the single ``--token`` signs in as.
SINGLE = "token"
#: Who acts on a dashboard without a token (loopback only).
LOOPBACK = "loopback"


@dataclass(frozen=True)
class Account:
    name: str
    role: str
    token: str

    @property
    def can_act(self) -> bool:
        return self.role == "operator"


def parse(spec: str) -> list[Account]:
    """The accounts of an ``EMQ_DASHBOARD_TOKENS`` value (ConfigError on a bad entry)."""
    text = spec.strip()
    if text.startswith("@"):
        path = Path(text[1:].strip())
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read the dashboard tokens file {path}: "
                              f"{exc.strerror or exc}") from None
        text = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    accounts: list[Account] = []
    for n, entry in enumerate(e.strip() for e in re.split(r"[,\n]", text)):
        if not entry:
            continue
        name, role, token = (entry.split(":", 2) + ["", ""])[:3]
        where = f"dashboard token entry {n + 1} ({name[:20]!r})"
        if not NAME.fullmatch(name):
            raise ConfigError(f"{where}: a name is 1-64 letters, digits, '_', '.' or '-'")
        if role not in ROLES:
            raise ConfigError(f"{where}: the role is operator or viewer, not {role[:20]!r}")
        if not token.strip():
            raise ConfigError(f"{where}: no token (name:role:token)")
        accounts.append(Account(name, role, token.strip()))
    return merge(accounts)


def merge(accounts: list[Account], single: str | None = None) -> list[Account]:
    """``accounts`` and the single ``--token`` (an operator named SINGLE); names and tokens
    must be unique (a token shared by two names could not say who acts)."""
    every = [*accounts, *([Account(SINGLE, "operator", single)] if single else [])]
    names = [a.name for a in every]
    tokens = [a.token for a in every]
    if len(set(names)) != len(names):
        raise ConfigError("two dashboard tokens have the same name")
    if len(set(tokens)) != len(tokens):
        raise ConfigError("two dashboard token entries have the same token")
    return every
