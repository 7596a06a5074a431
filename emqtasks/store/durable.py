"""The durable setting (``emqtasks.Durable``, ``EMQ_DURABLE``): how many copies a write must
reach before the call returns. What it sends is waits.py's.

Durable writes: a write followed, on the same connection and in the same round trip, by
``WAIT replicas timeout_ms`` (or ``WAITAOF 1 replicas timeout_ms``).

Redis replicates asynchronously: a primary answers a write before any replica has it, so a
primary that dies right after loses what it acknowledged. ``WAIT`` blocks the connection
that wrote until that many replicas have acknowledged the replication offset of its last
write (or the timeout passes) and answers how many did; ``WAITAOF`` (Redis 7.2, Valkey)
waits for the write to be fsynced to the append-only file, here (``numlocal`` 1) and on the
replicas. What WAIT counts is the offset of *this connection's* last write, so it must ride
on the connection that wrote: the write and the wait go as one pipeline (not a
transaction) on one connection, on a cluster the connection of the node holding the queue.

The choice mirrors Kafka's ``acks=all`` with ``min.insync.replicas`` and PostgreSQL's
``synchronous_commit`` with a synchronous standby: the write is applied on the primary
first and is not rolled back when too few copies confirm it; the caller is told
(NotDurable) and may send it again (a job id makes that safe: DUPLICATE if it survived).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, InvalidArgument

#: The longest wait a durable write may ask for: under the clients' socket timeout (30 s,
#: connection.py), so a WAIT that runs to its timeout is answered, never cut off.
MAX_TIMEOUT = 20.0


@dataclass(frozen=True)
class Durable:
    """How many copies a write must reach before the call returns.

    ``replicas``: replicas that must acknowledge the write (an integer >= 1); ``timeout``:
    seconds the server waits for them (finite, > 0, at most MAX_TIMEOUT); ``aof``: wait for
    the write to be fsynced to the append-only file here and on ``replicas`` replicas
    (WAITAOF: Redis >= 7.2 or Valkey, with ``appendonly yes``) instead of only received.
    """

    replicas: int = 1
    timeout: float = 0.5
    aof: bool = False

    def __post_init__(self) -> None:
        if (not isinstance(self.replicas, int) or isinstance(self.replicas, bool)
                or self.replicas < 1):
            raise InvalidArgument(f"Durable replicas is an integer >= 1, not {self.replicas!r}")
        t = self.timeout
        if (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t)
                or not 0 < t <= MAX_TIMEOUT):
            raise InvalidArgument(f"Durable timeout is a finite number of seconds > 0 and "
                                  f"<= {MAX_TIMEOUT:g}, not {t!r}")
        if not isinstance(self.aof, bool):
            raise InvalidArgument(f"Durable aof is True or False, not {self.aof!r}")
        object.__setattr__(self, "timeout", float(t))

    @property
    def timeout_ms(self) -> int:
        return max(1, math.ceil(self.timeout * 1000))

    def confirmed(self, reply: Any) -> int:
        """Replicas that confirmed, from the wait's reply (WAITAOF: [local, replicas]; a
        local fsync that did not happen in time confirms nothing)."""
        if self.aof:
            local, replicas = (int(x) for x in reply)
            return int(replicas) if local >= 1 else 0
        return int(reply)


def durable_of(value: Any, what: str = "durable") -> Durable | None:
    """A ``durable`` setting as a Durable, None when off: True, False, a Durable."""
    if value is True:
        return Durable()
    if value is False:
        return None
    if isinstance(value, Durable):
        return value
    raise InvalidArgument(f"{what} is True, False or emqtasks.Durable(...), not {value!r}")


def parse_durable(text: str) -> Durable | None:
    """``EMQ_DURABLE``: ``1``/``0`` (true/false, on/off), or ``replicas=2,timeout=0.5,aof=1``;
    ConfigError naming what is wrong."""
    word = text.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return Durable()
    if word in ("", "0", "false", "no", "off"):
        return None
    values: dict[str, Any] = {}
    for part in word.split(","):
        name, eq, raw = (s.strip() for s in part.partition("="))
        try:
            if not eq:
                raise ValueError("name=value")
            if name == "replicas":
                values[name] = int(raw)
            elif name == "timeout":
                values[name] = float(raw)
            elif name == "aof":
                if raw not in ("0", "1", "true", "false", "yes", "no", "on", "off"):
                    raise ValueError("aof is 1 or 0")
                values[name] = raw in ("1", "true", "yes", "on")
            else:
                raise ValueError("the names are replicas, timeout and aof")
            if name in values and list(values).count(name) > 1:   # pragma: no cover
                raise ValueError("twice")
        except ValueError as exc:
            raise ConfigError(f"EMQ_DURABLE={text!r}: {part.strip()!r} ({exc}); give 1, 0, "
                              "or replicas=N,timeout=SECONDS,aof=0|1") from None
    try:
        return Durable(**values)
    except InvalidArgument as exc:
        raise ConfigError(f"EMQ_DURABLE={text!r}: {exc}") from None
