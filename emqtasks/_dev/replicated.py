"""A primary and its replicas on loopback, for the durable-write tests and benchmark (and the
failover drill: emqtasks._dev.sentinels adds the sentinels): each a LocalRedis, the replicas
started with ``--replicaof``.

``pause(replica)`` SIGSTOPs one (it stops acknowledging, as a replica across a slow network
would) and ``resume`` SIGCONTs it; ``paused()`` is a context that always resumes.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator

from ..errors import ConfigError
from ..ops.localserver import LocalRedis


class Replicated:
    """``replicas`` replicas of one primary; ``aof`` runs them all with appendonly yes and
    appendfsync always (under everysec a WAITAOF waits up to a second for the next fsync)."""

    def __init__(self, replicas: int = 1, *, aof: bool = False, binary: str | None = None,
                 module: bool | None = None) -> None:
        extra = ("--appendonly", "yes", "--appendfsync", "always") if aof else ()
        # no 5 s wait for more replicas before a full sync (the default's)
        self.primary = LocalRedis(binary=binary, module=module,
                                  extra=(*extra, "--repl-diskless-sync-delay", "0"))
        self._extra = extra
        self.replicas = [LocalRedis(binary=binary, module=module) for _ in range(replicas)]

    def _replica_extra(self) -> tuple[str, ...]:
        """A replica's options, once the primary's port is final (it moves if taken)."""
        return (*self._extra, "--repl-diskless-sync-delay", "0",   # once promoted
                "--replicaof", "127.0.0.1", str(self.primary.port))

    @property
    def url(self) -> str:
        return self.primary.url

    def start(self, timeout: float = 20.0) -> Replicated:
        self.primary.start()     # on another port if its first was taken
        for r in self.replicas:
            r.extra = self._replica_extra()
            r.start()
        self.wait_synced(timeout)
        return self

    def wait_synced(self, timeout: float = 20.0) -> None:
        """Until every replica is online and has acknowledged a write made after all the
        others (the primary's offset, which a replica reports once a second, is no test while
        clients keep writing: the chaos soak's rejoin)."""
        client = self.primary.client()
        deadline = time.monotonic() + timeout
        try:
            while True:
                info = client.info("replication")
                online = [v for k, v in info.items() if k.startswith("slave")
                          and isinstance(v, dict) and v.get("state") == "online"]
                if len(online) == len(self.replicas):
                    break
                if time.monotonic() > deadline:
                    raise ConfigError(f"replicas not in sync after {timeout}s: {info}")
                time.sleep(0.05)
            # Online is not yet acknowledging at once (a replica just synced may take a
            # moment to answer GETACK): one write and a blocking WAIT for all of them.
            pipe = client.pipeline(transaction=False)
            pipe.set("replicated-probe", "1")
            pipe.execute_command("WAIT", len(self.replicas),  # type: ignore[no-untyped-call]
                                 max(1, int((deadline - time.monotonic()) * 1000)))
            if int(pipe.execute()[1]) < len(self.replicas):
                raise ConfigError(f"replicas not acknowledging after {timeout}s")
        finally:
            client.close()

    def pause(self, i: int = 0) -> None:
        proc = self.replicas[i].proc
        assert proc is not None
        proc.send_signal(signal.SIGSTOP)

    def resume(self, i: int = 0) -> None:
        proc = self.replicas[i].proc
        if proc is not None:
            proc.send_signal(signal.SIGCONT)

    @contextlib.contextmanager
    def paused(self, *which: int) -> Iterator[None]:
        """Replicas ``which`` (all by default) stopped for the block, resumed after it."""
        chosen = which or tuple(range(len(self.replicas)))
        try:
            for i in chosen:
                self.pause(i)
            yield
        finally:
            for i in chosen:
                self.resume(i)

    def close(self) -> None:
        for i in range(len(self.replicas)):
            self.resume(i)   # a stopped process ignores SIGTERM until it is resumed
        for r in self.replicas:
            r.close()
        self.primary.close()

    def __enter__(self) -> Replicated:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()
