"""`emqtasks doctor`: each check against a real server set up to pass or to fail it, the
least-privilege users of emqtasks.acl, and the command's table, --json and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest
from workerproc import HERE

from emqtasks import App
from emqtasks._dev.localserver import LocalRedis
from emqtasks.native import module_path
from emqtasks.ops import acl
from emqtasks.ops.doctor import CHECKS, Finding, run, worst
from emqtasks.store.connection import connect
from emqtasks.store.queue import Queue

pytestmark = pytest.mark.timeout(60)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(HERE))
    env.pop("EMQ_REDIS_URL", None)
    return subprocess.run([sys.executable, "-m", "emqtasks.cli", "doctor", *args],
                          capture_output=True, text=True, timeout=30, env=env, check=False)


def _by_name(findings: list[Finding]) -> dict[str, Finding]:
    return {f.name: f for f in findings}


def _doctor(url: str, queue: str, role: str = "any") -> dict[str, Finding]:
    client = connect(url)
    try:
        return _by_name(run(Queue(client, queue), role=role))
    finally:
        client.close()


@pytest.fixture
def durable() -> Iterator[LocalRedis]:
    """A server set up as for production: append-only, fsync always, noeviction."""
    with LocalRedis(persist=True, extra=("--maxmemory-policy", "noeviction")) as server:
        yield server


def test_a_server_set_up_for_production_passes_with_every_check(durable: LocalRedis,
                                                                queue_name: str) -> None:
    app = App(redis_url=durable.url, queue=queue_name)
    app.send_task("some.task", (1,))
    app.close()
    found = _doctor(durable.url, queue_name)
    assert worst(found.values()) != "error", found
    assert found["server"].status == "info" and found["server"].message.split()[0] in (
        "Redis", "Valkey")
    assert found["version"].status == "ok"
    assert found["maxmemory-policy"].status == "ok"
    assert found["persistence"].status == "ok" and "appendfsync always" in \
        found["persistence"].message
    assert found["replication"].message.startswith("no replicas")
    assert found["latency"].status == "ok" and "median of 5 PINGs" in found["latency"].message
    assert found["acl producer"].status == found["acl worker"].status == "ok"
    assert found["invariants"].status == "ok" and "1 jobs in 1 groups" in \
        found["invariants"].message
    if module_path() is None:
        assert found["native module"] == Finding(
            "native module", "info", "native module not loaded: the Lua scripts serve this "
            "queue")
    else:   # the test servers load it when it is built
        assert found["native module"].status == "ok"
        assert found["native module"].message.startswith("module emq loaded (version 1)")
    # The command: a table, exit 0; --json the same findings
    table = _cli("--redis-url", durable.url, "-Q", queue_name)
    assert table.returncode == 0, table.stdout + table.stderr
    assert "0 error(s)" in table.stdout and "What to change" not in table.stdout
    machine = json.loads(_cli("--redis-url", durable.url, "-Q", queue_name, "--json").stdout)
    assert machine["ok"] is True and machine["queue"] == queue_name
    assert [f["name"] for f in machine["findings"]] == list(found)


def test_an_evicting_server_fails_naming_the_setting_and_what_to_change(queue_name: str) -> None:
    with LocalRedis(persist=True, extra=("--maxmemory-policy", "allkeys-lru")) as server:
        result = _cli("--redis-url", server.url, "-Q", queue_name)
        machine = json.loads(_cli("--redis-url", server.url, "-Q", queue_name,
                                  "--json").stdout)
    assert result.returncode == 1, result.stdout + result.stderr
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("maxmemory-policy"))
    assert "ERROR" in line and "allkeys-lru" in line and "jobs would vanish" in line
    assert "error maxmemory-policy: CONFIG SET maxmemory-policy noeviction" in result.stdout
    errors = [f for f in machine["findings"] if f["status"] == "error"]
    assert machine["ok"] is False and [f["name"] for f in errors] == ["maxmemory-policy"]


def test_no_persistence_is_an_error_and_rdb_only_a_warning(private_redis: LocalRedis,
                                                          queue_name: str) -> None:
    # LocalRedis runs with appendonly no and no RDB snapshots
    found = _doctor(private_redis.url, queue_name)
    assert found["persistence"].status == "error"
    assert "a restart loses every job" in found["persistence"].message
    private_redis.client().config_set("save", "3600 1")
    found = _doctor(private_redis.url, queue_name)
    assert found["persistence"].status == "warn" and "RDB snapshots only" in \
        found["persistence"].message
    assert found["persistence"].fix.startswith("CONFIG SET appendonly yes")


def _users(server: LocalRedis, queue: str) -> dict[str, str]:
    """URLs of a producer, a worker, and a worker without ZPOPMIN (promote and reap use it)."""
    admin = server.client()
    broken = [r for r in acl.worker_rules(queue) if r != "+zpopmin"]
    for user, rules in (("p", acl.producer_rules(queue)), ("w", acl.worker_rules(queue)),
                        ("broken", broken)):
        admin.execute_command(*acl.setuser(user, rules, "pw").split())
    admin.close()
    return {u: f"redis://{u}:pw@127.0.0.1:{server.port}/0" for u in ("p", "w", "broken")}


def test_least_privilege_users_pass_for_their_role(durable: LocalRedis, queue_name: str) -> None:
    urls = _users(durable, queue_name)
    for user, role in (("p", "producer"), ("w", "worker")):
        for asked in (role, "any"):
            result = _cli("--redis-url", urls[user], "-Q", queue_name, "--role", asked)
            assert result.returncode == 0, (user, asked, result.stdout, result.stderr)
            line = next(ln for ln in result.stdout.splitlines()
                        if ln.startswith(f"acl {role}"))
            assert " ok " in line and "every command the" in line, line
    # What a least-privilege user may not read is a warning saying so, not a crash
    found = _doctor(urls["p"], queue_name, role="producer")
    assert found["invariants"].status == "warn" and "as this user" in found["invariants"].message
    assert "acl worker" not in found
    # A producer is not a worker: asked for that role, it fails naming what it lacks
    found = _doctor(urls["p"], queue_name, role="worker")
    assert found["acl worker"].status == "error"
    assert "lmove" in found["acl worker"].message and "zpopmin" in found["acl worker"].message
    # With --role any a producer passes; the worker role's gaps are told as info
    found = _doctor(urls["p"], queue_name)
    assert found["acl producer"].status == "ok" and found["acl worker"].status == "info"


def test_a_user_lacking_a_verbs_command_is_named(durable: LocalRedis, queue_name: str) -> None:
    urls = _users(durable, queue_name)
    result = _cli("--redis-url", urls["broken"], "-Q", queue_name, "--role", "worker")
    assert result.returncode == 1, result.stdout + result.stderr
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("acl worker"))
    assert "ERROR" in line and "may not run zpopmin on queue" in line, line
    assert f"error acl worker: ACL SETUSER broken +zpopmin (emqtasks.acl.worker_rules(" \
           f"'{queue_name}') gives every rule)" in result.stdout
    # A user of another queue may run nothing on this one's keys
    found = _doctor(urls["w"], f"other-{uuid.uuid4().hex[:6]}", role="worker")
    assert found["acl worker"].status == "error" and "evalsha" in found["acl worker"].message
    # The probes left nothing behind
    assert durable.client().keys("*") == []


def test_replication_and_a_replica_url(durable: LocalRedis, queue_name: str) -> None:
    with LocalRedis() as replica:
        replica.client().replicaof("127.0.0.1", durable.port)
        deadline = time.monotonic() + 15
        while durable.client().info("replication")["connected_slaves"] < 1:
            assert time.monotonic() < deadline, "the replica did not attach"
            time.sleep(0.05)
        found = _doctor(durable.url, queue_name)
        assert found["replication"].status == "warn"
        assert found["replication"].fix.startswith("CONFIG SET min-replicas-to-write 1")
        durable.client().config_set("min-replicas-to-write", "1")
        assert _doctor(durable.url, queue_name)["replication"].status == "ok"
        # Pointed at the replica: it refuses writes
        found = _doctor(replica.url, queue_name)
        assert found["replication"] == Finding(
            "replication", "error", "this node is a replica: it refuses writes (READONLY)",
            "point the URL at the master")


def test_lost_jobs_are_an_error_and_checks_can_be_skipped(durable: LocalRedis,
                                                          queue_name: str) -> None:
    app = App(redis_url=durable.url, queue=queue_name)
    h = app.send_task("some.task", (1,), group="g")
    app.client.zrem(app.queue().keys.lane("g"), h.id)    # the row waits in no structure
    app.close()
    found = _doctor(durable.url, queue_name)
    assert found["invariants"].status == "error" and "lost" in found["invariants"].message
    assert "check --repair" in found["invariants"].fix
    skipped = _cli("--redis-url", durable.url, "-Q", queue_name, "--skip", "invariants")
    assert skipped.returncode == 0 and "invariants" not in skipped.stdout
    bad = _cli("--redis-url", durable.url, "--skip", "nonsense")
    assert bad.returncode == 2 and "no check named nonsense" in bad.stderr


def test_an_unreachable_server_is_one_line_and_exit_2() -> None:
    result = _cli("--redis-url", "redis://127.0.0.1:1/0")
    assert result.returncode == 2
    assert result.stderr.startswith("emqtasks: error: cannot reach Redis at redis://127.0.0.1:1")


def test_the_check_list_is_data() -> None:
    names = [name for name, _ in CHECKS]
    assert names[0] == "server" and len(set(names)) == len(names)
    assert {"maxmemory-policy", "persistence", "replication", "latency", "acl", "invariants",
            "native module"} <= set(names)


def test_every_command_of_a_role_has_a_harmless_probe() -> None:
    # A command added to a role needs a probe too: without one, trying it on Redis 6.2
    # (no ACL DRYRUN, no acl_check_cmd) could change the queue
    assert set(acl.PRODUCER_COMMANDS) | set(acl.WORKER_COMMANDS) <= set(acl.PROBES)
