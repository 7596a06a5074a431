"""Which server answers: Redis or Valkey, its version, and the oldest of each emqtasks supports.

Valkey reports ``redis_version:7.2.4`` (the Redis it forked from) for compatibility and its
own version in ``valkey_version``; ``server_name:valkey`` names it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: The oldest version of each server emqtasks supports: LMOVE arrived in Redis 6.2, and
#: every Valkey (forked from Redis 7.2.4) has it.
MINIMUM = {"Redis": (6, 2, 0), "Valkey": (7, 2, 0)}


def parse_version(text: str) -> tuple[int, ...]:
    """``"7.0.15"`` -> (7, 0, 15); non-numeric parts end it (``"8.0-rc1"`` -> (8,))."""
    out: list[int] = []
    for part in str(text).split("."):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


@dataclass(frozen=True)
class ServerInfo:
    """A server's name (``Redis`` or ``Valkey``), version and mode (standalone, cluster...)."""

    kind: str
    version: str
    mode: str = "standalone"

    @property
    def version_tuple(self) -> tuple[int, ...]:
        return parse_version(self.version)

    @property
    def minimum(self) -> tuple[int, ...]:
        return MINIMUM.get(self.kind, MINIMUM["Redis"])

    @property
    def supported(self) -> bool:
        return self.version_tuple >= self.minimum

    def __str__(self) -> str:
        return f"{self.kind} {self.version}"


def identify(info: Mapping[str, Any]) -> ServerInfo:
    """The server an ``INFO server`` reply describes."""
    mode = str(info.get("server_mode") or info.get("redis_mode") or "standalone")
    if str(info.get("server_name", "")).lower() == "valkey" or "valkey_version" in info:
        return ServerInfo("Valkey", str(info.get("valkey_version") or info.get("redis_version")),
                          mode)
    return ServerInfo("Redis", str(info.get("redis_version", "0")), mode)


def describe(client: Any, **target: Any) -> ServerInfo:
    """The server a client talks to (on a cluster, pass ``target_nodes`` for one node)."""
    info = client.info("server", **target)
    if "redis_version" not in info and info and all(isinstance(v, dict) for v in info.values()):
        info = next(iter(info.values()))   # {node: {...}} from a cluster client
    return identify(info)
