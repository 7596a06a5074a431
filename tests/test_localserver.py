"""The private servers tests and the embedded mode start (emqtasks.ops.localserver): a free
port is free only until someone binds it, so a server whose port another process took
between the choice and the bind starts again on a fresh one, and never takes the other
process's server for its own (a Sentinel rig once did: "unknown command 'SENTINEL'")."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from emqtasks._dev.localserver import LocalRedis
from emqtasks._dev.sentinels import Sentinel


@pytest.fixture(scope="module")
def squatter() -> Iterator[LocalRedis]:
    with LocalRedis(module=False) as server:
        yield server


@pytest.mark.timeout(30)
def test_a_server_whose_port_was_taken_starts_on_another(squatter: LocalRedis) -> None:
    # Given a server whose chosen port another server took before it bound it
    server = LocalRedis(module=False)
    server.port = squatter.port
    try:
        # When it starts
        server.start()
        # Then it answers on a port of its own, and what answers there is its own process
        assert server.port != squatter.port
        assert server.proc is not None
        assert server.client().info("server")["process_id"] == server.proc.pid
        # and the squatter was left alone
        assert squatter.client().ping()
    finally:
        server.close()


@pytest.mark.timeout(30)
def test_a_sentinel_whose_port_was_taken_starts_on_another(squatter: LocalRedis) -> None:
    sentinel = Sentinel(squatter.binary, squatter.port)
    sentinel.port = squatter.port
    try:
        sentinel.start()
        assert sentinel.port != squatter.port
        assert sentinel.client().execute_command("SENTINEL", "MASTERS")
    finally:
        sentinel.close()


@pytest.mark.timeout(30)
def test_a_restart_keeps_its_port() -> None:
    with LocalRedis(module=False) as server:
        port = server.port
        server.restart()
        assert server.port == port and server.client().ping()
