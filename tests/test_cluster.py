"""emqtasks on a real Redis Cluster (3 masters + 3 replicas on loopback, see cluster.py):
the URL, the queue verbs, queues spread over shards, a worker per shard, a slot migration
and a failover of the shard that holds a queue while a worker drains it."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import cluster_tasks as ct
import pytest
import worker_tasks as wt
from cluster import ClusterServers, module_cluster
from helpers import assert_invariants, due_now, expire_now, make_task, new_job
from redis.cluster import RedisCluster, key_slot
from workerproc import WorkerProc

from emqtasks import App
from emqtasks.errors import ConfigError, TaskFailed
from emqtasks.ops import check
from emqtasks.store import scripts
from emqtasks.store.cluster import is_cluster_url, parse_url
from emqtasks.store.connection import connect
from emqtasks.store.keys import FIXED, QueueKeys
from emqtasks.verdicts import RetryVerdict
from emqtasks.worker.resilience import Outage

RETRIED, DEAD = RetryVerdict.RETRIED, RetryVerdict.DEAD

pytestmark = pytest.mark.timeout(90)


cluster = pytest.fixture(scope="module", name="cluster")(module_cluster)


@pytest.fixture
def capp(cluster: ClusterServers) -> Iterator[App]:
    """An App on a fresh queue of the cluster; purged afterwards."""
    app = App(redis_url=cluster.url, queue=f"cq-{uuid.uuid4().hex[:10]}")
    yield app
    app.purge()
    app.close()


def keys_on(cluster: ClusterServers, port: int, name: str) -> list[str]:
    """The queue's keys that one node holds (a plain client: no routing)."""
    with cluster.node(port) as node:
        return list(node.scan_iter(match=QueueKeys(name).all_pattern, count=1000))


# -- the URL and the scripts' key contract (no cluster needed) ------------------------------
def test_a_cluster_url_names_startup_nodes_and_client_options() -> None:
    nodes, kwargs = parse_url("redis+cluster://app:s%40cret@h1:7000,h2:7001,[::1]:7002/0"
                              "?socket_timeout=2.5&client_name=w1&require_full_coverage=no")
    assert nodes == [("h1", 7000), ("h2", 7001), ("::1", 7002)]
    assert kwargs == {"username": "app", "password": "s@cret", "socket_timeout": 2.5,
                      "client_name": "w1", "require_full_coverage": False}
    assert parse_url("redis+cluster://h1")[0] == [("h1", 6379)]
    assert parse_url("rediss+cluster://h1:7000/")[1] == {"ssl": True}
    assert is_cluster_url("redis+cluster://h1:7000") and not is_cluster_url("redis://h1:7000")
    for bad in ("redis+cluster://h1:7000/3", "redis+cluster://h1:7000?db=2",
                "redis+cluster://", "redis+cluster://h1:port"):
        with pytest.raises(ConfigError):
            parse_url(bad)


def test_every_script_declares_the_queue_keys_and_forms_others_from_base() -> None:
    folder = scripts.lua_dir()
    keys = (folder / "lib" / "keys.lua").read_text()
    assert "BASE" in keys.split("\n\n", 1)[0] and "K_guard" in keys
    for name in scripts.VERBS:
        text = (folder / f"{name}.lua").read_text()
        head = text.split("\n\n", 1)[0]
        assert "KEYS: the queue's fixed keys (see lib/keys.lua)" in head, name
        code = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("--"))
        # Keys a verb forms come from lib/'s job_key / lane_key / notify (all BASE ..);
        # a verb names no key of its own, and nothing writes the guard.
        assert "BASE" not in code and "KEYS[" not in code and "K_guard" not in code, name
        assert not re.search(r"redis\.call\(\s*'\w+'\s*,\s*'", code), name
    assert FIXED[-1] == "guard"
    # The guard is declared with the rest: all of a queue's keys hash to its one slot.
    slots = {key_slot(k.encode()) for k in QueueKeys("q1").fixed}
    assert len(slots) == 1


def test_a_workflow_lives_in_its_queue_slot(cluster: ClusterServers, capp: App) -> None:
    """A chord onto a chain, in process: every key it forms (rows, the workflow's hash, the
    chord's results) sits on the queue's one master, and the hand-over works there."""
    from emqtasks import chain, chord

    add = make_task(capp, name="c.add")
    q = capp.queue()
    h = chord([add.s(i) for i in range(5)], chain(add.s(), add.s())).apply_async(app=capp)
    owner = cluster.master_of_queue(q.name)
    acked = 0
    for _ in range(20):
        leases = q.claim(10)
        if not leases:
            break
        for lease in leases:
            if acked == 2:   # mid-chord: the results wait in the chord's hash
                names = keys_on(cluster, owner, q.name)
                assert any(":chord:" in n for n in names) and any(":wf:" in n for n in names)
            q.ack(lease, json.dumps(json.loads(lease.payload)["a"]))
            acked += 1
    assert acked == 7 and h.status() == "done"
    assert h.get(timeout=5) == [[[[0], [1], [2], [3], [4]]]]
    everything = sum((keys_on(cluster, port, q.name) for port in cluster.masters()), [])
    assert sorted(everything) == sorted(keys_on(cluster, owner, q.name))


# -- queues on shards ----------------------------------------------------------------------
def test_queues_spread_over_the_shards_and_each_lives_on_one(cluster: ClusterServers) -> None:
    names = cluster.queues_on_every_shard()
    apps = [App(redis_url=cluster.url, queue=n) for n in names]
    try:
        assert isinstance(apps[0].client, RedisCluster)
        for app in apps:
            make_task(app, group="A").apply_async(args=(1,), job_id="j1")
        owners = [cluster.master_of_queue(n) for n in names]
        assert len(set(owners)) == 3
        for name, owner in zip(names, owners):
            # every key of the queue is on its owner, none on the other masters
            assert len(keys_on(cluster, owner, name)) >= 3
            assert all(keys_on(cluster, m, name) == [] for m in cluster.masters() if m != owner)
    finally:
        for app in apps:
            app.purge()
            app.close()


# -- the verbs on a cluster ------------------------------------------------------------------
def test_enqueue_is_idempotent_and_map_is_one_batch(capp: App) -> None:
    t = make_task(capp, group=lambda n: f"g{n % 2}")
    first = t.apply_async(args=(1,), job_id="inv-1")
    again = t.apply_async(args=(1,), job_id="inv-1")
    assert (first.duplicate, again.duplicate) == (False, True)
    handles = t.map([(i,) for i in range(10)])
    assert len({h.id for h in handles}) == 10 and not any(h.duplicate for h in handles)
    stats = capp.stats()
    assert stats["pending"] == 11 and set(stats["groups"]) == {"g0", "g1"}


def test_claims_take_turns_between_groups(capp: App) -> None:
    q = capp.queue()
    q.enqueue_many([new_job(f"{g}{i}", g) for g in "ABC" for i in range(3)])
    assert [lease.group for lease in q.claim(6)] == list("ABCABC")
    assert_invariants(q)


def test_ack_retry_dead_promote_and_reap(capp: App) -> None:
    q = capp.queue()
    q.enqueue_many([new_job("a", "A", max_attempts=2), new_job("b", "B")])
    la, lb = q.claim(2)
    assert q.ack(lb, '"ok"')[0] and capp.job("b")["state"] == "done"
    assert q.retry(la, "boom", delay=60) == RETRIED and capp.job("a")["state"] == "delayed"
    due_now(q, "a")
    assert q.promote()[0] == 1 and capp.job("a")["state"] == "pending"
    (la2,) = q.claim()
    assert la2.attempts == 2 and q.retry(la2, "boom again") == DEAD
    assert capp.job("a")["state"] == "dead" and [j["id"] for j in capp.dead_jobs()] == ["a"]
    assert capp.requeue_dead() == 1
    (la3,) = q.claim()
    expire_now(q, la3.id)
    assert q.reap() == (1, 0) and capp.job("a")["state"] == "pending"
    assert_invariants(q)
    assert check.check(q).ok   # its snapshot is a MULTI transaction: one slot, one node
    # The history lives in the queue's slot too, and reads back on the cluster
    h = capp.history(minutes=2)["total"]
    assert (h["enqueued"], h["started"], h["succeeded"], h["retried"], h["dead"]) == \
        (2, 4, 1, 2, 1)


def test_a_stale_holder_cannot_ack(capp: App) -> None:
    q = capp.queue()
    q.enqueue_many([new_job("x", "A")])
    (old,) = q.claim()
    expire_now(q, old.id)
    q.reap()
    (new,) = q.claim()
    assert q.ack(old, '"stale"') == (False, None)
    assert capp.job("x")["state"] == "active"
    assert q.ack(new, '"fresh"')[0] and capp.job("x")["result"] == '"fresh"'


def test_pause_limit_stats_and_purge(cluster: ClusterServers, capp: App) -> None:
    q = capp.queue()
    q.enqueue_many([new_job(f"l{i}", "L") for i in range(3)] + [new_job("o", "O")])
    capp.pause()
    assert q.claim(4) == [] and capp.stats()["paused"] is True
    capp.resume()
    capp.set_group_limit("L", 1)
    assert sorted(lease.group for lease in q.claim(4)) == ["L", "O"]
    stats = capp.stats()
    assert (stats["pending"], stats["active"]) == (2, 2)
    row = stats["groups"]["L"]
    assert {k: row[k] for k in ("pending", "active", "limit", "weight", "paused")} == \
        {"pending": 2, "active": 1, "limit": 1, "weight": 1, "paused": False}
    assert row["state"] == "at_limit" and capp.lane("L")["state"] == "at_limit"
    owner = cluster.master_of_queue(capp.settings.queue)
    assert set(keys_on(cluster, owner, capp.settings.queue)) >= {q.keys.gactive, q.keys.active}
    assert capp.purge() > 0
    assert keys_on(cluster, owner, capp.settings.queue) == []


def test_verbs_reload_after_script_flush_on_every_node(cluster: ClusterServers,
                                                      capp: App) -> None:
    q = capp.queue()
    t = make_task(capp, group="A")
    t.delay(1)
    for port in cluster.live_ports():
        with cluster.node(port) as node:
            node.script_flush()
    t.delay(2)
    (lease,) = q.claim()
    assert q.ack(lease)[0]
    assert capp.stats()["pending"] == 1


def test_a_result_waiter_blocks_on_the_queue_shard(capp: App) -> None:
    q = capp.queue()
    h = make_task(capp, group="A").delay(7)

    def finish() -> None:
        time.sleep(0.3)
        (lease,) = q.claim()
        q.ack(lease, "42")

    threading.Thread(target=finish, daemon=True).start()
    began = time.monotonic()
    assert h.get(timeout=10) == 42
    assert time.monotonic() - began < 5
    h2 = make_task(capp, name="tests.cluster.dies", max_attempts=1).delay()
    (lease,) = q.claim()
    q.retry(lease, "RuntimeError: no")
    with pytest.raises(TaskFailed):
        h2.get(timeout=5)


def test_connect_gives_a_cluster_client_that_pings(cluster: ClusterServers) -> None:
    client = connect(cluster.url + "/?client_name=emq-probe&socket_timeout=4")
    try:
        assert isinstance(client, RedisCluster) and client.ping()
    finally:
        client.close()


def test_the_admin_command_runs_on_a_cluster_and_says_when_it_cannot(
        cluster: ClusterServers, capp: App) -> None:
    make_task(capp, group="acme").delay(1)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "emqtasks.cli", *args], text=True,
                              capture_output=True, timeout=30)

    shown = cli("stats", "--json", "--redis-url", cluster.url, "-Q", capp.settings.queue)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["groups"]["acme"]["pending"] == 1
    for url in ("redis+cluster://127.0.0.1:1", "redis+cluster://127.0.0.1:port"):
        failed = cli("stats", "--redis-url", url)
        assert failed.returncode == 2
        assert failed.stderr.startswith("emqtasks: error: cannot reach Redis at")
        assert len(failed.stderr.strip().splitlines()) == 1


# -- workers ---------------------------------------------------------------------------------
def test_the_doctor_examines_the_node_that_serves_the_queue(cluster: ClusterServers,
                                                           capp: App) -> None:
    from emqtasks.ops.doctor import run

    capp.send_task("some.task", (1,))
    found = {f.name: f for f in run(capp.queue())}
    port = cluster.master_of_queue(capp.settings.queue)
    assert found["server"].message.endswith(f", cluster, the queue's slot on 127.0.0.1:{port}")
    assert found["version"].status == "ok"
    assert found["replication"].message.startswith("1 replica(s)")
    assert found["acl producer"].status == found["acl worker"].status == "ok"
    assert found["invariants"].status == "ok" and "1 jobs" in found["invariants"].message
    assert found["persistence"].status == "error"   # the test cluster keeps nothing on disk


def test_a_worker_per_queue_drains_queues_on_three_shards(cluster: ClusterServers) -> None:
    names = cluster.queues_on_every_shard()
    apps = [App(redis_url=cluster.url, queue=n) for n in names]
    workers = [WorkerProc(cluster.url, n, concurrency=2) for n in names]
    try:
        for w in workers:
            w.wait_ready()
        for a, w in zip(apps, workers):   # each master's heartbeat, on its queue's shard
            w.wait_for(lambda a=a: a.workers(), 10)
            assert [x["pid"] for x in a.workers()] == [w.pid]
        tags = {n: [f"{g}:{i}" for g in "abc" for i in range(15)] for n in names}
        handles = {n: [a.send_task(wt.record, (t,)) for t in tags[n]]
                   for n, a in zip(names, apps)}
        for n in names:
            assert [h.get(timeout=30) for h in handles[n]] == tags[n]
        r = apps[0].client
        for n in names:   # each ran once, on its own queue's worker
            runs = r.hgetall(f"t:{n}:runs")
            assert runs == {t: "1" for t in tags[n]}
        for w in workers:
            assert w.stop() == 0
        for a in apps:
            s = a.stats()
            assert (s["pending"], s["active"], s["dead"]) == (0, 0, 0)
    finally:
        for w in workers:
            w.__exit__()
        for n, a in zip(names, apps):
            for key in a.client.scan_iter(match=f"t:{n}:*"):
                a.client.delete(key)
            a.purge()
            a.close()


class SlotMove:
    """Moves one slot between masters by hand, as ``redis-cli --cluster reshard`` does."""

    def __init__(self, cluster: ClusterServers, key: str) -> None:
        self.cluster = cluster
        self.slot = key_slot(key.encode())
        self.src = cluster.owner_of(key)
        self.dst = next(m for m in cluster.masters() if m != self.src)
        self.ids = {}
        for port in cluster.masters():
            with cluster.node(port) as n:
                self.ids[port] = n.execute_command("CLUSTER", "MYID")

    def begin(self) -> None:
        with self.cluster.node(self.dst) as n:
            n.execute_command("CLUSTER", "SETSLOT", self.slot, "IMPORTING", self.ids[self.src])
        with self.cluster.node(self.src) as n:
            n.execute_command("CLUSTER", "SETSLOT", self.slot, "MIGRATING", self.ids[self.dst])

    def move(self, keys: list[str] | None = None) -> None:
        with self.cluster.node(self.src) as n:
            keys = keys or n.execute_command("CLUSTER", "GETKEYSINSLOT", self.slot, 1000)
            if keys:
                n.execute_command("MIGRATE", "127.0.0.1", self.dst, "", 0, 5000, "KEYS", *keys)

    def finish(self) -> None:
        for port in (self.dst, self.src, *self.cluster.masters()):
            with self.cluster.node(port) as n:
                n.execute_command("CLUSTER", "SETSLOT", self.slot, "NODE", self.ids[self.dst])
        self.cluster.wait_stable()


def test_a_queue_rides_through_the_migration_of_its_slot(cluster: ClusterServers,
                                                         capp: App) -> None:
    q = capp.queue()
    producer = App(redis_url=cluster.url, queue=capp.settings.queue)
    assert producer.client.ping()   # it has read the slot map: it will be the old one
    # Given a queue in which every key but the guard exists: weighted, limited, paused
    # lanes, jobs active, delayed (and due) and dead, the queue-wide pause flag set
    q.enqueue_many([new_job(f"a{i}", "A") for i in range(4)]
                   + [new_job("b", "B"), new_job("c", "C")]
                   + [new_job(f"d{i}", "D", countdown_ms=60_000) for i in range(2)])
    q.pause_group("C")
    _, lb = q.claim(2)
    assert lb.group == "B" and q.retry(lb, "x", final=True) == DEAD
    q.set_group_limit("B", 5)
    q.set_group_weight("A", 3)
    assert q.claim(1)[0].group == "A"   # A's weighted visit has begun: gturn
    capp.pause()
    q.push_wake()
    due_now(q, "d0")
    due_now(q, "d1")
    assert [bool(q.client.exists(k)) for k in q.keys.fixed] == [True] * 11 + [False]
    # When its slot starts migrating and the due jobs' rows have already moved
    move = SlotMove(cluster, q.keys.ring)
    move.begin()
    move.move([q.keys.job("d0"), q.keys.job("d1")])
    # Then a script is refused (TRYAGAIN, then redis-py's ClusterError), never run on a
    # half-moved queue: promote would otherwise drop d0 from `delayed` and fail on its row
    with pytest.raises(Exception, match="TTL exhausted"):
        q.promote()
    with cluster.node(move.src) as n:
        assert n.zrange(q.keys.delayed, 0, -1) == ["d0", "d1"]
    # And a call made the worker's way (Outage: retry with backoff) completes once the
    # migration does
    mover = threading.Timer(0.5, lambda: (move.move(), move.finish()))
    mover.start()
    outage = Outage(logging.getLogger("test"), "test")
    assert outage.call(q.promote)[0] == 2
    mover.join(10)
    assert keys_on(cluster, move.src, capp.settings.queue) == []
    capp.resume()
    # And clients with the old slot map follow MOVED
    assert producer.send_task("tests.helpers.noop", (1,), group="P").duplicate is False
    assert producer.client.get_node_from_key(q.keys.ring).port == move.dst
    assert check.check(q).ok, check.check(q).violations
    producer.close()


def test_a_failover_of_the_queue_shard_during_a_drain_loses_no_job(
        cluster: ClusterServers) -> None:
    name = cluster.queues_on_every_shard("fo")[0]
    app = App(redis_url=cluster.url, queue=name)
    master = cluster.master_of_queue(name)
    handles = [app.send_task(ct.work, (f"j{i}", 0.01)) for i in range(600)]
    accepted: list = []
    refused: list[str] = []
    stop = threading.Event()

    producer = App(redis_url=cluster.url, queue=name)

    def produce() -> None:   # keeps enqueueing through the fault; counts what returned
        i = 0
        while not stop.is_set():
            try:
                accepted.append(producer.send_task(ct.work, (f"p{i}", 0.0)))
            except Exception as exc:
                refused.append(repr(exc))
            i += 1
            time.sleep(0.005)

    try:
        with WorkerProc(cluster.url, name, concurrency=4, modules=("cluster_tasks",)) as w:
            w.wait_ready()
            w.wait_for(lambda: app.stats()["pending"] < 550, what="the drain under way")
            thread = threading.Thread(target=produce, daemon=True)
            thread.start()
            # When the master of the queue's shard hands over to its replica mid-drain
            promoted = cluster.failover(master)
            assert cluster.master_of_queue(name) == promoted != master
            assert app.stats()["pending"] > 0, "the drain ended before the failover"
            time.sleep(0.5)
            stop.set()
            thread.join(10)
            # Then every job whose enqueue returned completes (at least once) ...
            for h in handles + accepted:
                assert h.get(timeout=30) == h.info()["result"].strip('"')
            assert len(accepted) > 10, refused[:3]
            # ... and the worker is still running and still takes new work
            assert w.proc.poll() is None
            assert app.send_task(ct.work, ("after",)).get(timeout=15) == "after"
            s = app.stats()
            assert (s["pending"], s["active"], s["dead"]) == (0, 0, 0)
            assert check.check(app.queue()).ok
            assert w.stop() == 0
    finally:
        stop.set()
        app.purge()
        app.close()
        producer.close()


def replicated(cluster: ClusterServers, master: int, timeout: float = 10.0) -> None:
    """Until the master's replica has every write the master had when this was called."""
    with cluster.node(master) as m:
        target = int(m.info("replication")["master_repl_offset"])
    with cluster.node(cluster.replica_of(master)) as r:
        deadline = time.monotonic() + timeout
        while int(r.info("replication")["slave_repl_offset"]) < target:
            assert time.monotonic() < deadline, "the replica did not catch up"
            time.sleep(0.02)


def test_a_worker_rides_out_the_crash_of_its_queue_master(cluster: ClusterServers) -> None:
    """Near the end of the module: it leaves one shard without a replica."""
    name = cluster.queues_on_every_shard("kill")[0]
    app = App(redis_url=cluster.url, queue=name)
    master = cluster.master_of_queue(name)
    replica = cluster.replica_of(master)
    handles = [app.send_task(ct.work, (f"k{i}", 0.01)) for i in range(600)]
    # Replication is asynchronous: a crash can lose what the replica had not received yet
    # (the README's durability section). Here the replica has every enqueue.
    replicated(cluster, master)
    try:
        with WorkerProc(cluster.url, name, concurrency=4, modules=("cluster_tasks",)) as w:
            w.wait_ready()
            w.wait_for(lambda: app.stats()["pending"] < 550, what="the drain under way")
            # When the master of the queue's shard is SIGKILLed mid-drain
            cluster.kill(master)
            deadline = time.monotonic() + 20
            while replica not in cluster.masters():   # node timeout 1 s, then an election
                assert time.monotonic() < deadline, "the replica was not promoted"
                time.sleep(0.05)
            cluster.wait_stable(replicas=0)
            # Then every job enqueued before the crash completes, the worker kept running
            # (it retried with backoff instead of dying), and new work is taken
            assert [h.get(timeout=30) for h in handles] == [f"k{i}" for i in range(600)]
            assert w.proc.poll() is None
            assert app.send_task(ct.work, ("after",)).get(timeout=15) == "after"
            s = app.stats()
            assert (s["pending"], s["active"], s["dead"]) == (0, 0, 0)
            assert check.check(app.queue()).ok
            # An outage the worker saw (the cluster client often rides a failover out on
            # its own) is said once it ends
            out = w.output()
            assert "Redis unavailable" not in out or "Redis is back" in out, out
            assert w.stop() == 0
    finally:
        app.purge()
        app.close()


def test_a_worker_rides_out_a_restart_of_the_whole_cluster(cluster: ClusterServers) -> None:
    """Every node SIGKILLed, then started again on its port (no persistence: data gone):
    the worker logs the outage once (redis-py's "cannot be connected" is transient) and
    takes new work when the cluster is back."""
    name = cluster.queues_on_every_shard("rs")[0]
    app = App(redis_url=cluster.url, queue=name)
    try:
        with WorkerProc(cluster.url, name, concurrency=2, modules=("cluster_tasks",)) as w:
            w.wait_ready()
            assert app.send_task(ct.work, ("before",)).get(timeout=10) == "before"
            for port in cluster.ports:
                cluster.kill(port)
            time.sleep(1.5)
            for port in cluster.ports:
                cluster.restart(port)
            cluster.wait_stable(20)
            app.close()   # this producer's client saw every node go: a fresh one
            assert app.send_task(ct.work, ("after",)).get(timeout=30) == "after"
            assert w.proc.poll() is None
            assert "Redis is back" in w.output() and "Traceback" not in w.output()
            assert w.stop() == 0
    finally:
        app.purge()
        app.close()
