"""A real Redis Cluster for tests: 3 masters + 3 replicas of ``redis-server --cluster-enabled
yes`` on free loopback ports, formed with ``redis-cli --cluster create`` (or by hand with
CLUSTER MEET / ADDSLOTSRANGE / REPLICATE when redis-cli is missing), stopped and removed at
the end. The servers themselves live in :mod:`emqtasks._dev.localcluster`, which the benchmark
shares; this module adds what tests need: a skip when there is no server binary, and
queue names placed on chosen shards.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from redis.cluster import key_slot

from emqtasks._dev.localcluster import LocalCluster
from emqtasks._dev.localserver import find_binary
from emqtasks.store.keys import QueueKeys


class ClusterServers(LocalCluster):
    """3 masters, 1 replica each, node timeout 1 s (a failover is quick to see)."""

    def __init__(self) -> None:
        super().__init__(masters=3, replicas=1, node_timeout_ms=1000)

    @classmethod
    def start_or_skip(cls, timeout: float = 30.0) -> ClusterServers:
        if find_binary("redis-server") is None:
            pytest.skip("no redis-server binary on PATH: cannot start a Redis Cluster")
        return cls().start(timeout)

    def master_of_queue(self, name: str) -> int:
        """The port of the master serving the queue's slot (from CLUSTER SLOTS)."""
        return self.owner_of(QueueKeys(name).ring)

    def queues_on_every_shard(self, prefix: str = "cq") -> list[str]:
        """One fresh queue name per master, in the order of ``masters()``."""
        wanted = {port: "" for port in self.masters()}
        owners = self.owners()
        while not all(wanted.values()):
            name = f"{prefix}-{uuid.uuid4().hex[:8]}"
            slot = key_slot(QueueKeys(name).ring.encode())
            port = next(p for (lo, hi), p in owners.items() if lo <= slot <= hi)
            if not wanted[port]:
                wanted[port] = name
        return list(wanted.values())


def module_cluster() -> Iterator[ClusterServers]:
    """The body of a module-scoped ``cluster`` fixture: one cluster for the test module's
    tests, stopped after the last (``cluster = pytest.fixture(...)(module_cluster)``)."""
    servers = ClusterServers.start_or_skip()
    try:
        yield servers
    finally:
        servers.close()
