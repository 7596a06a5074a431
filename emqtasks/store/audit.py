"""The audit log: every change an operator makes (the admin CLI, the dashboard), who made it.

One Redis stream per queue (``QueueKeys.audit``, in the queue's hash tag: Cluster-safe). An
entry's id is the server's clock when it was written (the "when"); its fields say who (a
dashboard token's name, or ``user@host`` of a CLI), through what (``cli`` / ``dashboard``),
the action, what it was aimed at and how many jobs it touched. Each write trims the stream
to AUDIT_DAYS and AUDIT_MAX entries, exactly (not ``~``: an admin action is rare, and an
approximate trim keeps old entries until a whole node of the stream can go), so the log is
bounded in time and in size whatever the traffic. ``purge`` spares it: a purge's trail
outlives the purge.
"""

from __future__ import annotations

import getpass
import os
import socket
from dataclasses import asdict, dataclass
from typing import Any

from redis.exceptions import ResponseError

from ..errors import CorruptKey
from .keys import QueueKeys

#: How long entries are kept, and the most kept whatever their age.
AUDIT_DAYS = 30
AUDIT_MAX = 10_000
_DAY_MS = 86_400_000
#: A field's value is cut to this many characters (a group name, a task's JSON arguments).
FIELD_MAX = 512


@dataclass(frozen=True)
class AuditEntry:
    """One change: when (unix ms, the server's clock), who, via, action, target, jobs."""

    id: str
    when: int
    who: str
    via: str
    action: str
    target: str
    jobs: int | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def cli_user() -> str:
    """Who runs this CLI: the OS user and the host (``alice@build-7``)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):   # a uid with no passwd entry (a container)
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def record(client: Any, keys: QueueKeys, who: str, via: str, action: str, target: str = "",
           jobs: int | None = None, max_entries: int = AUDIT_MAX) -> str:
    """Append one entry and trim the log (AUDIT_DAYS, ``max_entries``); the entry's id."""
    fields = {"who": who[:FIELD_MAX], "via": via[:FIELD_MAX], "action": action[:FIELD_MAX],
              "target": target[:FIELD_MAX], "jobs": "" if jobs is None else str(int(jobs))}
    try:
        entry_id = _s(client.xadd(keys.audit, fields, maxlen=max_entries, approximate=False))
        oldest = int(entry_id.split("-", 1)[0]) - AUDIT_DAYS * _DAY_MS
        client.xtrim(keys.audit, minid=str(max(0, oldest)), approximate=False)
    except ResponseError as exc:
        raise _unreadable(client, keys, exc) from None
    return entry_id


def entries(client: Any, keys: QueueKeys, count: int = 100,
            before: str | None = None) -> list[AuditEntry]:
    """The newest ``count`` entries, newest first (older than the id ``before`` if given)."""
    top = f"({before}" if before else "+"
    try:
        found = client.xrevrange(keys.audit, top, "-", count=count)
    except ResponseError as exc:
        raise _unreadable(client, keys, exc) from None
    return [_entry(i, f) for i, f in found]


def _unreadable(client: Any, keys: QueueKeys, exc: ResponseError) -> Exception:
    """CorruptKey for a log key of the wrong type (written by another program); any other
    error as it came."""
    if not str(exc).startswith("WRONGTYPE"):
        return exc
    return CorruptKey(f"{keys.audit} holds a {_s(client.type(keys.audit))}, not a stream: "
                      f"the audit log cannot be read or written (delete it; emqtasks check "
                      f"names it)", (keys.audit,))


def size(client: Any, keys: QueueKeys) -> int:
    return int(client.xlen(keys.audit))


def _entry(entry_id: Any, fields: dict[Any, Any]) -> AuditEntry:
    text = {_s(k): _s(v) for k, v in fields.items()}
    jobs = text.get("jobs", "")
    return AuditEntry(_s(entry_id), int(_s(entry_id).split("-", 1)[0]), text.get("who", ""),
                      text.get("via", ""), text.get("action", ""), text.get("target", ""),
                      int(jobs) if jobs.isdigit() else None)


def _s(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
