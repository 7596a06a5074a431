"""Auto-pipelining of enqueues (issue 31 item 3, store/autopipe.py): calls of many threads or
coroutines made while one is in flight go out together, each caller with its own verdict
(enqueued, duplicate, LaneFull) and its own NotDurable; nothing lost, nothing doubled; a
sparse call still costs one round trip. Both paths (EMQ_NATIVE require and off)."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from emqtasks import App, ConfigError, Durable, InvalidGroup, LaneFull, NotDurable
from emqtasks._dev.localserver import find_binary
from emqtasks._dev.replicated import Replicated
from emqtasks.config import Settings
from emqtasks.errors import NativeUnavailable
from emqtasks.store import keys as store_keys
from emqtasks.store.autopipe import autopipeline_mode

pytestmark = pytest.mark.timeout(120)

THREADS = 8
PER_THREAD = 500
CAP = 50          # the full lane's max_size


def noop(*args: Any, **kwargs: Any) -> None:
    return None


@pytest.fixture(params=["require", "off"])
def papp(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
         redis_url: str) -> Iterator[App]:
    monkeypatch.setenv("EMQ_NATIVE", request.param)
    a = App(redis_url, queue=f"ap-{uuid.uuid4().hex[:10]}", autopipeline=True)
    a.task(name="tests.ap.noop")(noop)
    try:
        a.queue().claim(1)
    except NativeUnavailable:
        a.close()
        pytest.skip("the server has no emq module")
    yield a
    a.purge()
    a.close()


def enqueue_calls(client: Any) -> int:
    """Calls of the enqueue verb the server ran so far (the module's command, or a script)."""
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items()
               if k in ("cmdstat_emq.enqueue", "cmdstat_evalsha", "cmdstat_eval",
                        "cmdstat_fcall"))


def in_threads(n: int, work: Callable[[int], None]) -> None:
    """work(k) on n threads started together; the first error re-raised."""
    errors: list[BaseException] = []
    gate = threading.Barrier(n)

    def run(k: int) -> None:
        gate.wait()
        try:
            work(k)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(100)
    assert not any(t.is_alive() for t in threads)
    if errors:
        raise errors[0]


def test_eight_threads_each_get_their_own_verdict(papp: App) -> None:
    """8 threads x 500 calls: 20 ids sent by two threads each (one enqueued, one duplicate),
    a lane capped at 50 that 80 calls aim at (50 enqueued, 30 LaneFull), the rest fresh."""
    t = papp.tasks["tests.ap.noop"]
    papp.set_group_max_size("full", CAP)
    outcomes: list[list[tuple[str, str]]] = [[] for _ in range(THREADS)]

    def work(k: int) -> None:
        mine = outcomes[k]
        for i in range(PER_THREAD):
            if i < 10:     # ids dup-0..19, each sent by threads k and k ^ 1
                job_id = f"dup-{(k // 2) * 10 + i}"
                mine.append((job_id, t.apply_async((i,), job_id=job_id).verdict))
            elif i < 20:
                job_id = f"full-{k}-{i}"
                try:
                    mine.append((job_id, t.apply_async((i,), job_id=job_id,
                                                       group="full").verdict))
                except LaneFull as exc:
                    assert exc.job_id == job_id and exc.group == "full"
                    mine.append((job_id, "full"))
            else:
                h = t.apply_async((i,), group=f"g{i % 5}")
                mine.append((h.id, h.verdict))

    before = enqueue_calls(papp.client)
    in_threads(THREADS, work)
    calls = enqueue_calls(papp.client) - before

    every = [o for per in outcomes for o in per]
    assert len(every) == THREADS * PER_THREAD
    dups = Counter(v for job_id, v in every if job_id.startswith("dup-"))
    assert dups == {"enqueued": 40, "duplicate": 40}
    by_dup_id: dict[str, list[str]] = {}
    for job_id, v in every:
        if job_id.startswith("dup-"):
            by_dup_id.setdefault(job_id, []).append(v)
    assert all(sorted(vs) == ["duplicate", "enqueued"] for vs in by_dup_id.values())
    full = Counter(v for job_id, v in every if job_id.startswith("full-"))
    assert full == {"enqueued": CAP, "full": THREADS * 10 - CAP}
    fresh = [(j, v) for j, v in every if not j.startswith(("dup-", "full-"))]
    assert {v for _, v in fresh} == {"enqueued"}
    # nothing lost, nothing doubled: the lanes hold exactly what was answered "enqueued"
    stats = papp.stats()
    assert stats["groups"]["full"]["pending"] == CAP
    assert stats["pending"] == sum(1 for _, v in every if v == "enqueued")
    q = papp.queue()
    for job_id, v in every:
        if v == "enqueued":
            assert q.status(job_id) == "pending"
        elif v == "full":
            assert q.status(job_id) is None
    # the calls went out batched: fewer verb runs than calls
    assert calls < THREADS * PER_THREAD


def test_calls_made_while_one_is_in_flight_go_out_together(papp: App) -> None:
    """The server holds writes (CLIENT PAUSE WRITE) while the first call is in flight: the
    seven made meanwhile are one batch, one verb run, each its own verdict."""
    t = papp.tasks["tests.ap.noop"]
    t.delay(0)
    admin = redis.Redis.from_url(papp.settings.redis_url)
    verdicts: list[str] = []
    first_sent = threading.Event()

    def first() -> None:
        first_sent.set()
        verdicts.append(t.apply_async((0,), job_id="first").verdict)

    before = enqueue_calls(admin)
    admin.execute_command("CLIENT", "PAUSE", 500, "WRITE")
    leader = threading.Thread(target=first)
    leader.start()
    assert first_sent.wait(10)
    in_threads(7, lambda k: verdicts.append(t.apply_async((k,), job_id=f"f-{k}").verdict))
    leader.join(10)
    assert sorted(verdicts) == ["enqueued"] * 8
    assert enqueue_calls(admin) - before <= 3 < 8
    admin.close()


def test_a_sparse_call_costs_one_round_trip(papp: App,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A call with nothing else in flight is written at once, alone: one write, one verb
    run (counted by the server), as without auto-pipelining."""
    t = papp.tasks["tests.ap.noop"]
    t.delay(0)
    writes: list[int] = []
    send = redis.connection.AbstractConnection.send_packed_command

    def counted(self: Any, command: Any, check_health: bool = True) -> None:
        writes.append(1)
        send(self, command, check_health)

    admin = redis.Redis.from_url(papp.settings.redis_url, decode_responses=True)
    before = enqueue_calls(admin)
    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)
    t.delay(1)
    monkeypatch.undo()
    assert (len(writes), enqueue_calls(admin) - before) == (1, 1)
    admin.close()


def test_256_coroutines_each_get_their_own_verdict(papp: App) -> None:
    t = papp.tasks["tests.ap.noop"]

    async def go() -> tuple[list[tuple[str, str]], int]:
        await t.adelay(0)
        before = enqueue_calls(papp.client)

        async def one(k: int) -> tuple[str, str]:
            if k < 20:      # dup-0..9, each sent twice
                job_id = f"adup-{k % 10}"
                return job_id, (await t.aapply_async((k,), job_id=job_id)).verdict
            if k < 40:
                job_id = f"afull-{k}"
                try:
                    return job_id, (await t.aapply_async((k,), job_id=job_id,
                                                         group="afull")).verdict
                except LaneFull:
                    return job_id, "full"
            h = await t.adelay(k)
            return h.id, h.verdict

        got = await asyncio.gather(*(one(k) for k in range(256)))
        calls = enqueue_calls(papp.client) - before
        await papp.aclose()
        return list(got), calls

    papp.set_group_max_size("afull", 5)
    got, calls = asyncio.run(go())
    assert Counter(v for j, v in got if j.startswith("adup-")) == \
        {"enqueued": 10, "duplicate": 10}
    assert Counter(v for j, v in got if j.startswith("afull-")) == {"enqueued": 5, "full": 15}
    assert Counter(v for j, v in got if not j.startswith(("adup-", "afull-"))) == \
        {"enqueued": 216}
    assert papp.stats()["pending"] == 10 + 5 + 216 + 1
    assert calls <= 2     # the calls of one turn of the loop: one batch


def test_tenants_go_through_a_batch_each_refusal_its_callers_own(papp: App) -> None:
    """8 threads x 60 calls, batched: calls naming tenant acme for its busy group "busy",
    calls naming tenant beta (some with an expiry), calls naming none; and on four threads
    four calls each naming globex for "busy". Exactly those 16 callers get InvalidGroup,
    nothing of theirs written; every other call is enqueued, its tenant recorded."""
    t = papp.tasks["tests.ap.noop"]
    t.apply_async((0,), job_id="owner", group="busy", tenant="acme")    # acme's, busy
    refused_ids = {f"refused-{k}-{i}" for k in range(0, THREADS, 2) for i in (7, 22, 37, 52)}
    outcomes: list[list[tuple[str, str]]] = [[] for _ in range(THREADS)]

    def work(k: int) -> None:
        mine = outcomes[k]
        for i in range(60):
            job_id = f"j-{k}-{i}"
            try:
                if f"refused-{k}-{i}" in refused_ids:
                    job_id = f"refused-{k}-{i}"
                    h = t.apply_async((i,), job_id=job_id, group="busy", tenant="globex")
                elif i % 3 == 0:
                    h = t.apply_async((i,), job_id=job_id, group="busy", tenant="acme")
                elif i % 3 == 1:
                    h = t.apply_async((i,), job_id=job_id, group=f"beta-{k}", tenant="beta",
                                      expires=600 if i % 2 else None)
                else:
                    h = t.apply_async((i,), job_id=job_id, group=f"plain-{k}")
                mine.append((job_id, h.verdict))
            except InvalidGroup as exc:
                assert job_id in str(exc) and "another tenant" in str(exc)
                mine.append((job_id, "refused"))

    before = enqueue_calls(papp.client)
    in_threads(THREADS, work)
    calls = enqueue_calls(papp.client) - before

    every = dict(o for per in outcomes for o in per)
    assert len(every) == THREADS * 60
    assert {j for j, v in every.items() if v == "refused"} == refused_ids
    assert {v for j, v in every.items() if j not in refused_ids} == {"enqueued"}
    q = papp.queue()
    for job_id in refused_ids:
        assert q.status(job_id) is None
    acme = sum(1 for j in every if j.startswith("j-") and int(j.rsplit("-", 1)[1]) % 3 == 0)
    assert papp.client.zcard(q.keys.lane("busy")) == 1 + acme
    assert papp.client.hget(q.keys.gtenant, "busy") == "acme"
    for k in range(THREADS):
        assert papp.client.hget(q.keys.gtenant, f"beta-{k}") == "beta"
        assert papp.client.hget(q.keys.gtenant, f"plain-{k}") is None
    assert papp.stats()["pending"] == 1 + len(every) - len(refused_ids)
    assert calls < THREADS * 60     # the calls went out batched


def test_coroutines_name_tenants_through_a_batch(papp: App) -> None:
    """The calls of one turn of the loop are one batch: the globex callers for acme's busy
    group get InvalidGroup, the others are enqueued under their own tenants."""
    t = papp.tasks["tests.ap.noop"]
    t.apply_async((0,), job_id="owner", group="busy", tenant="acme")

    async def go() -> tuple[list[str], int]:
        await t.adelay(0)
        before = enqueue_calls(papp.client)

        async def one(k: int) -> str:
            tenant = "globex" if k % 8 == 3 else "acme"
            try:
                h = await t.aapply_async((k,), job_id=f"a-{k}", group="busy", tenant=tenant)
                return h.verdict
            except InvalidGroup as exc:
                assert f"a-{k}" in str(exc)
                return "refused"

        got = await asyncio.gather(*(one(k) for k in range(32)))
        calls = enqueue_calls(papp.client) - before
        await papp.aclose()
        return list(got), calls

    got, calls = asyncio.run(go())
    assert [k for k, v in enumerate(got) if v == "refused"] == [3, 11, 19, 27]
    assert Counter(got) == {"enqueued": 28, "refused": 4}
    assert all(papp.queue().status(f"a-{k}") is None for k in (3, 11, 19, 27))
    assert papp.client.zcard(papp.queue().keys.lane("busy")) == 1 + 28
    assert calls <= 2


def test_autopipeline_setting(monkeypatch: pytest.MonkeyPatch, redis_url: str) -> None:
    """Off by default in this release; EMQ_AUTOPIPELINE=1 or App(autopipeline=True) on."""
    assert autopipeline_mode({}) is False
    assert autopipeline_mode({"EMQ_AUTOPIPELINE": "1"}) is True
    assert autopipeline_mode({"EMQ_AUTOPIPELINE": "0"}) is False
    with pytest.raises(ConfigError):
        autopipeline_mode({"EMQ_AUTOPIPELINE": "maybe"})
    assert Settings().autopipeline is False
    assert Settings.from_env({}).autopipeline is False
    assert Settings.from_env({"EMQ_AUTOPIPELINE": "on"}).autopipeline is True
    monkeypatch.delenv("EMQ_AUTOPIPELINE", raising=False)
    default = App(redis_url, queue="ap-default")
    assert default.queue().batcher is None
    monkeypatch.setenv("EMQ_AUTOPIPELINE", "1")
    env_on = App(redis_url, queue="ap-env-on")
    assert env_on.queue().batcher is not None
    monkeypatch.setenv("EMQ_AUTOPIPELINE", "0")
    off = App(redis_url, queue="ap-off")
    assert off.queue().batcher is None
    on = App(redis_url, queue="ap-on", autopipeline=True)
    assert on.queue().batcher is not None
    for a in (default, env_on, off, on):
        a.close()


def test_job_ids_of_a_forked_child_are_its_own() -> None:
    """The ids' random part comes from a generator seeded again in a forked child."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:    # pragma: no cover - the child
        os.write(write, store_keys.new_job_id()[-8:].encode())
        os._exit(0)
    os.close(write)
    mine = store_keys.new_job_id()[-8:]
    theirs = os.read(read, 64).decode()
    os.waitpid(pid, 0)
    os.close(read)
    assert len(theirs) == 8 and theirs != mine


# -- durable: one WAIT after a batch, NotDurable for each of its callers ---------------------
@pytest.fixture(scope="module")
def pair() -> Iterator[Replicated]:
    if find_binary("redis-server") is None:
        pytest.skip("no redis-server")
    with Replicated(1) as servers:
        yield servers


def test_a_durable_batch_waits_once_and_each_caller_is_told(pair: Replicated) -> None:
    a = App(pair.url, queue=f"apd-{uuid.uuid4().hex[:8]}", durable=Durable(timeout=0.3),
            autopipeline=True)
    t = a.task(name="tests.ap.dnoop")(noop)
    t.delay()
    admin = redis.Redis.from_url(pair.url, decode_responses=True)
    failures: dict[str, NotDurable] = {}

    def work(k: int) -> None:
        try:
            t.apply_async((k,), job_id=f"d-{k}")
        except NotDurable as exc:
            failures[f"d-{k}"] = exc

    waits_before = int(admin.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))
    with pair.paused():
        in_threads(THREADS, work)
    waits = int(admin.info("commandstats")["cmdstat_wait"]["calls"]) - waits_before
    assert sorted(failures) == [f"d-{k}" for k in range(THREADS)]
    for job_id, exc in failures.items():
        assert exc.job_ids == [job_id] and exc.confirmed == 0 and exc.wanted == 1
        assert [v.word for v in exc.reply] == ["enqueued"]   # type: ignore[attr-defined]
        assert a.queue().status(job_id) == "pending"
    assert waits < THREADS    # a batch waits once
    admin.close()
    a.purge()
    a.close()


def test_a_forked_child_never_writes_on_its_parents_kept_connection(papp: App) -> None:
    """The wire keeps a pool connection between calls (redis-py's checkout costs more than
    a round trip); a forked child opens its own, and both enqueue on their own sockets."""
    t = papp.tasks["tests.ap.noop"]
    t.delay(0)
    wire = papp.queue().hot.wire
    kept = list(wire._kept or ())
    assert kept, "the wire keeps the connection of its last call"
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:    # pragma: no cover - the child
        try:
            fresh = not wire._kept and all(wire._take() is not k for k in kept)
            os.write(write, b"own" if fresh and t.delay(1).verdict == "enqueued" else b"no")
        finally:
            os._exit(0)
    os.close(write)
    said = os.read(read, 16)
    os.waitpid(pid, 0)
    os.close(read)
    assert said == b"own"
    assert t.delay(2).verdict == "enqueued"
    assert papp.stats()["pending"] == 3


def test_a_small_pool_keeps_no_connection(redis_url: str) -> None:
    """Kept connections are a pool's, two at most, and none of a small pool (whose idle
    kept ones would starve its other users)."""
    small = App(f"{redis_url}?max_connections=2", queue=f"ap-{uuid.uuid4().hex[:8]}")
    big = App(redis_url, queue=f"ap-{uuid.uuid4().hex[:8]}")
    try:
        for a in (small, big):
            t = a.task(name="tests.ap.noop")(noop)
            in_threads(4, lambda k, t=t: [t.delay(k) for _ in range(20)])   # type: ignore[misc]
        assert small.queue().hot.wire._kept is None
        assert len(big.queue().hot.wire._kept or ()) <= 2
        assert big.queue("other").hot.wire._kept is big.queue().hot.wire._kept
    finally:
        for a in (small, big):
            a.purge()
            a.close()


def test_a_child_forked_while_a_batch_is_in_flight_can_enqueue(papp: App) -> None:
    """A fork while another thread's call is in flight: the child's batcher starts with
    nothing in flight (else its first call would wait for a leader that is not there)."""
    import signal
    import time

    t = papp.tasks["tests.ap.noop"]
    t.delay(0)
    batcher = papp.queue().batcher
    assert batcher is not None
    admin = redis.Redis.from_url(papp.settings.redis_url)
    admin.execute_command("CLIENT", "PAUSE", 1000, "WRITE")
    flying = threading.Thread(target=lambda: t.delay(1))
    flying.start()
    deadline = time.monotonic() + 5
    while not batcher._busy and time.monotonic() < deadline:
        time.sleep(0.005)
    assert batcher._busy
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:    # pragma: no cover - the child
        try:
            signal.alarm(20)
            os.write(write, t.delay(2).verdict.encode())
        finally:
            os._exit(0)
    os.close(write)
    said = os.read(read, 16)
    os.waitpid(pid, 0)
    os.close(read)
    flying.join(10)
    assert said == b"enqueued"
    assert papp.stats()["pending"] == 3
    admin.close()
