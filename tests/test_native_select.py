"""EMQ_NATIVE: which path runs the hot verbs (auto / off / require), on real servers with and
without the module; a queue served by both paths at once is one queue; the CLI's ``native``
commands and the worker's refusal under require."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
import redis
from helpers import assert_invariants, new_job
from workerproc import HERE, WorkerProc

from emqtasks import App
from emqtasks._dev.localserver import LocalRedis
from emqtasks.errors import ConfigError, NativeUnavailable
from emqtasks.native import module_path
from emqtasks.ops import acl
from emqtasks.store.functions import functions_wanted, library
from emqtasks.store.queue import Queue
from emqtasks.store.selection import native_mode
from emqtasks.verdicts import EnqueueVerdict

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(module_path() is None, reason="the module is not built")]
HOT = ("enqueue", "claim", "ack", "retry", "extend", "release", "reap", "promote")


@pytest.fixture(scope="module")
def with_module() -> Iterator[LocalRedis]:
    with LocalRedis(module=True) as server:
        yield server


@pytest.fixture(scope="module")
def without_module() -> Iterator[LocalRedis]:
    with LocalRedis(module=False) as server:
        yield server


def calls(client: redis.Redis) -> dict[str, int]:
    """Calls per command since the last CONFIG RESETSTAT: emq.* and the scripts' (evalsha,
    and fcall where the server runs them as a library: counted as evalsha)."""
    stats = client.info("commandstats")
    out = {k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.items()
           if k.startswith(("cmdstat_emq.", "cmdstat_evalsha", "cmdstat_eval"))}
    if "cmdstat_fcall" in stats:
        out["evalsha"] = out.get("evalsha", 0) + stats["cmdstat_fcall"]["calls"]
    return out


def one_of_each(q: Queue) -> None:
    """Every hot verb once: enqueue, claim, extend, retry, claim, release, claim, ack,
    reap, promote."""
    assert q.enqueue_many([new_job(f"j-{uuid.uuid4().hex[:6]}", max_attempts=5)])
    lease = q.claim()[0]
    q.extend([lease])
    q.retry(lease, "boom", delay=0)
    q.promote()
    lease = q.claim()[0]
    q.release(lease)
    lease = q.claim()[0]
    q.ack(lease, '"ok"')
    q.reap()


@pytest.mark.parametrize("mode,native", [("auto", True), ("off", False), ("require", True)])
def test_a_server_with_the_module(with_module: LocalRedis, mode: str, native: bool) -> None:
    client = with_module.client()
    client.config_resetstat()
    q = Queue(client, f"sel-{uuid.uuid4().hex[:8]}", native=mode)
    # nothing sent yet: detection costs no command
    assert q.hot.native is (False if mode == "off" else None)
    one_of_each(q)
    assert q.hot.native is native
    seen = calls(client)
    if native:
        assert {f"emq.{v}" for v in HOT} <= set(seen) and "evalsha" not in seen
    else:
        assert not any(k.startswith("emq.") for k in seen) and seen["evalsha"] >= 8
    assert_invariants(q)
    client.close()


def test_auto_without_the_module_runs_the_scripts(without_module: LocalRedis) -> None:
    # One connection: its connect-time commands (CLIENT SETINFO, refused by Redis < 7.2)
    # come before the reset of the counters
    client = without_module.client(single_connection_client=True)
    # The scripts as a library (store/functions.py): the first FCALL answers "Function not
    # found" unless a test before loaded it, or, on a server without FCALL, unknown command
    wanted = functions_wanted()
    functions = wanted and int(client.info("server")["redis_version"].split(".")[0]) >= 7
    loaded = functions and library()[0] in str(client.execute_command("FUNCTION", "LIST"))
    client.config_resetstat()
    q = Queue(client, f"sel-{uuid.uuid4().hex[:8]}", native="auto")
    one_of_each(q)
    assert q.hot.native is False
    # The first hot verb learnt it (one unknown-command reply); the rest went straight to
    # Lua (whose first EVALSHA of each script answers NOSCRIPT, as ever; FCALL none)
    errors = client.info("errorstats")
    assert errors["errorstat_ERR"]["count"] == 1 + (wanted and not loaded)
    assert set(errors) == ({"errorstat_ERR"} if functions
                           else {"errorstat_ERR", "errorstat_NOSCRIPT"})
    assert_invariants(q)
    client.close()


def test_require_without_the_module_is_refused_and_writes_nothing(
        without_module: LocalRedis) -> None:
    client = without_module.client()
    client.flushall()
    q = Queue(client, "sel-required", native="require")
    with pytest.raises(NativeUnavailable, match="no emq module"):
        q.enqueue_many([new_job("a")])
    assert client.dbsize() == 0
    client.close()


def test_a_server_restarted_without_the_module_falls_back() -> None:
    server = LocalRedis(module=True, persist=True).start()
    try:
        client = server.client()
        q = Queue(client, "sel-restart", native="auto")
        assert q.enqueue_many([new_job("a"), new_job("b")])
        assert q.hot.native is True
        server.module = False
        server.restart()
        # The state written through the module is plain data (effects in the AOF): the
        # scripts take over from it
        assert [lease.id for lease in q.claim(2)] == ["a", "b"]
        assert q.hot.native is False
        assert_invariants(q)
        client.close()
    finally:
        server.close()


def test_a_user_not_granted_the_module_falls_back_per_verb(with_module: LocalRedis) -> None:
    admin = with_module.client()
    queue = f"sel-{uuid.uuid4().hex[:8]}"
    admin.execute_command(*acl.setuser("sel-lua-only", acl.worker_rules(queue), "pw").split())
    client = redis.Redis(port=with_module.port, username="sel-lua-only", password="pw",
                         decode_responses=True)
    q = Queue(client, queue, native="auto")
    one_of_each(q)
    assert q.hot.native is False
    with pytest.raises(redis.exceptions.NoPermissionError):   # require: raised as it is
        Queue(client, queue, native="require").claim()
    client.close()
    admin.execute_command("ACL", "DELUSER", "sel-lua-only")
    admin.close()


def test_a_bad_mode_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMQ_NATIVE", "fast")
    with pytest.raises(ConfigError, match="EMQ_NATIVE must be one of auto, off, require"):
        native_mode()
    monkeypatch.setenv("EMQ_NATIVE", " Require ")
    assert native_mode() == "require"


def test_one_queue_served_by_both_paths(with_module: LocalRedis,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A Lua worker and a native worker on one queue, fed by a native producer and a Lua
    producer: every job runs exactly once and the queue's invariants hold."""
    queue = f"sel-{uuid.uuid4().hex[:8]}"
    apps = {mode: App(redis_url=with_module.url, queue=queue) for mode in ("off", "require")}
    workers = {}
    for mode, app in apps.items():
        monkeypatch.setenv("EMQ_NATIVE", mode)   # read when a queue (or a worker) is made
        assert app.queue().hot.mode == mode
        workers[mode] = WorkerProc(with_module.url, queue)
        workers[mode].wait_ready()
    monkeypatch.delenv("EMQ_NATIVE")
    tags = [f"g{i % 7}:t{i}" for i in range(300)]
    try:
        for i, tag in enumerate(tags):
            apps["off" if i % 2 else "require"].send_task("t.record", (tag,))
        client = apps["off"].client
        runs = f"t:{queue}:runs"
        workers["off"].wait_for(lambda: client.hlen(runs) == len(tags), timeout=60,
                                what="every job run")
        assert sorted(client.hkeys(runs)) == sorted(tags)
        assert set(client.hvals(runs)) == {"1"}
        assert apps["off"].queue().hot.native is False
        assert apps["require"].queue().hot.native is True
    finally:
        codes = {mode: w.stop() for mode, w in workers.items()}
    assert codes == {"off": 0, "require": 0}
    assert "Lua scripts" in workers["off"].output()
    assert "native module (EMQ.* commands)" in workers["require"].output()
    assert_invariants(apps["off"].queue())
    client.delete(runs, f"t:{queue}:order", f"t:{queue}:seqof", f"t:{queue}:seq")
    for app in apps.values():
        app.purge()
        app.close()


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "emqtasks", *args], capture_output=True,
                          text=True, timeout=60, env=env, check=False)


def test_native_commands_and_the_worker_under_require(without_module: LocalRedis,
                                                      with_module: LocalRedis) -> None:
    env = dict(os.environ, EMQ_NATIVE="require")
    path = _cli("native", "path", env=env)
    assert path.returncode == 0 and path.stdout.strip() == str(module_path())
    ok = _cli("native", "status", "--redis-url", with_module.url, env=env)
    assert ok.returncode == 0, ok.stderr
    assert "emq module loaded" in ok.stdout and "hot verbs: the EMQ.* commands" in ok.stdout
    missing = _cli("native", "status", "--redis-url", without_module.url, env=env)
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"emqtasks: error: EMQ_NATIVE=require but the server has no emq module: load it "
        f"with --loadmodule {module_path()}"]
    off = _cli("native", "status", "--redis-url", with_module.url,
               env=dict(env, EMQ_NATIVE="off"))
    assert off.returncode == 0 and "hot verbs: the Lua scripts" in off.stdout
    worker = _cli("worker", "-A", "worker_tasks", "--redis-url", without_module.url,
                  env=dict(env, PYTHONPATH=os.pathsep.join(
                      [str(HERE), env.get("PYTHONPATH", "")])))
    assert worker.returncode == 2
    assert worker.stderr.strip().splitlines()[-1].startswith(
        "emqtasks: error: EMQ_NATIVE=require but the server has no emq module")




def test_a_call_on_a_dropped_connection_is_sent_again(with_module: LocalRedis) -> None:
    """The pre-packed path (native/wire.py) keeps a connection; when the server drops it,
    the call goes again through redis-py, which reconnects."""
    admin = with_module.client(single_connection_client=True)
    client = with_module.client()
    q = Queue(client, f"sel-{uuid.uuid4().hex[:8]}", native="require")
    assert q.enqueue_many([new_job("a")]) == [EnqueueVerdict.ENQUEUED]
    killed = admin.client_kill_filter(_type="normal", skipme=True)
    assert killed >= 1
    assert q.enqueue_many([new_job("b")]) == [EnqueueVerdict.ENQUEUED]
    assert [lease.id for lease in q.claim(2)] == ["a", "b"]
    assert_invariants(q)
    client.close()
    admin.close()
