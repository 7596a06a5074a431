"""A Sentinel setup on loopback for tests, the failover drill and the chaos soak: a primary,
its replicas (Replicated) and three sentinels, every one a ``redis-server`` process
(``redis-server sentinel.conf --sentinel``: the same binary).

The sentinels judge a server down after DOWN_AFTER_MS without an answer and may start a
new failover after FAILOVER_TIMEOUT_MS, so a killed primary is replaced within about 1-3 s
(production keeps the defaults, 30 s and 3 min). ``url`` is the
``redis+sentinel://`` URL of the service; ``fail_over()`` kills the primary (SIGKILL),
waits until the sentinels name another, and follows it (``primary`` / ``replicas`` are
then the new roles); ``rejoin()`` restarts the killed server as a replica of the new
primary, so the next drill has as many replicas again.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from ..errors import ConfigError
from ..ops.localserver import LocalRedis, free_port, start_on_free_port, terminate, wait_ready
from .replicated import Replicated

SERVICE = "emqmaster"
DOWN_AFTER_MS = 400
FAILOVER_TIMEOUT_MS = 2000


class Sentinel:
    """One ``redis-server --sentinel`` process watching ``SERVICE`` at a primary's port."""

    def __init__(self, binary: str, primary_port: int, quorum: int = 2,
                 down_after_ms: int = DOWN_AFTER_MS) -> None:
        self.binary = binary
        self.primary_port, self.quorum, self.down_after_ms = primary_port, quorum, down_after_ms
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="emq-sentinel-"))
        self.conf = self.dir / "sentinel.conf"   # a sentinel rewrites its file: its own
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> Sentinel:
        start_on_free_port(lambda: self._start(timeout), self._choose_port)
        return self

    def _choose_port(self) -> None:
        self.port = free_port()

    def _start(self, timeout: float) -> None:
        self.conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\nprotected-mode no\ndir {self.dir}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary_port} {self.quorum}\n"
            f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}\n"
            f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {SERVICE} 2\n")
        self.proc = subprocess.Popen([self.binary, str(self.conf), "--sentinel"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_ready(self.port, self.proc, time.monotonic() + timeout)

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True, socket_timeout=2.0)

    def close(self) -> None:
        if self.proc is not None:
            terminate(self.proc)
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


class Sentinels(Replicated):
    """A primary, ``replicas`` replicas and ``sentinels`` sentinels (quorum 2);
    ``down_after_ms`` longer than DOWN_AFTER_MS where the servers are loaded (the chaos soak):
    a server slow to answer for that long is judged down, and a primary so judged is
    replaced even though it lives (a failover no one asked for)."""

    def __init__(self, replicas: int = 2, sentinels: int = 3, *, aof: bool = False,
                 binary: str | None = None, module: bool | None = None,
                 down_after_ms: int = DOWN_AFTER_MS) -> None:
        super().__init__(replicas, aof=aof, binary=binary, module=module)
        self.sentinels = [Sentinel(self.primary.binary, self.primary.port,
                                   down_after_ms=down_after_ms)
                          for _ in range(sentinels)]
        self.down: list[LocalRedis] = []     # killed by fail_over, not yet rejoined

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}"

    def start(self, timeout: float = 20.0) -> Sentinels:
        super().start(timeout)
        for s in self.sentinels:
            s.primary_port = self.primary.port    # final now: it moves if it was taken
            s.start()
        self.wait_watched(timeout)
        return self

    def named_primary(self) -> int | None:
        """The port the sentinels' majority names as the primary (None: no majority)."""
        ports: list[int] = []
        for s in self.sentinels:
            try:
                addr: Any = s.client().sentinel_get_master_addr_by_name(SERVICE)
                ports.append(int(addr[1]))
            except (redis.RedisError, TypeError):
                continue
        best = max(set(ports), key=ports.count, default=None)
        return best if best is not None and ports.count(best) * 2 > len(self.sentinels) \
            else None

    def wait_watched(self, timeout: float = 20.0) -> None:
        """Until every sentinel sees every replica and the other sentinels (a failover needs
        them: a sentinel promotes only replicas it knows of)."""
        deadline = time.monotonic() + timeout
        while True:
            seen = []
            for s in self.sentinels:
                state: Any = s.client().sentinel_master(SERVICE)
                seen.append(int(state["num-slaves"]) >= len(self.replicas)
                            and int(state["num-other-sentinels"]) >= len(self.sentinels) - 1
                            and int(state["port"]) == self.primary.port)
            if all(seen):
                return
            if time.monotonic() > deadline:
                raise ConfigError(f"sentinels not watching after {timeout}s")
            time.sleep(0.1)

    def fail_over(self, timeout: float = 20.0) -> float:
        """SIGKILL the primary, wait until the sentinels name a replica, follow it; the
        seconds from the kill to the promotion."""
        old = self.primary
        old.kill()
        killed = time.monotonic()
        self.down.append(old)
        while (port := self.named_primary()) in (None, old.port):
            if time.monotonic() - killed > timeout:
                raise ConfigError(f"no replica promoted {timeout}s after the primary died")
            time.sleep(0.05)
        promoted = time.monotonic() - killed
        self.primary = next(r for r in self.replicas if r.port == port)
        self.replicas = [r for r in self.replicas if r is not self.primary]
        # the primary answers as one only once the sentinels have told it so
        client = self.primary.client()
        while client.info("replication")["role"] != "master":
            if time.monotonic() - killed > timeout:
                raise ConfigError("the promoted replica is not yet a primary")
            time.sleep(0.05)
        client.close()
        return promoted

    def rejoin(self, timeout: float = 20.0) -> None:
        """Restart the servers fail_over killed, as replicas of the primary now (empty: a
        crashed server's data is the new primary's to give), until all are in sync and seen
        by the sentinels."""
        for node in self.down:
            node.extra = (*[a for a in _without_replicaof(node.extra)],
                          "--replicaof", "127.0.0.1", str(self.primary.port))
            node.start()
            self.replicas.append(node)
        self.down = []
        self.wait_synced(timeout)
        self.wait_watched(timeout)

    def close(self) -> None:
        for s in self.sentinels:
            s.close()
        super().close()
        for node in self.down:
            node.close()


def _without_replicaof(extra: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    skip = 0
    for arg in extra:
        if skip:
            skip -= 1
        elif arg == "--replicaof":
            skip = 2
        else:
            out.append(arg)
    return out
