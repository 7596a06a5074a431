"""The async producer calls (``await task.adelay(...)``, ``await handle.aget()``...) against a
real server and worker: each call, the sync call's checks and errors, the module's path and
the scripts' (EMQ_NATIVE=off), a Redis Cluster, a pool per event loop, and a queue object
used from another loop (WrongEventLoop, not a hang)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import async_producer_tasks as t
import pytest
from cluster import ClusterServers, module_cluster
from workerproc import WorkerProc

from emqtasks import App, ResultTimeout, TaskFailed
from emqtasks.errors import (
    CorruptKey,
    InvalidArgument,
    InvalidJobId,
    LaneFull,
    PayloadTooLarge,
    WrongEventLoop,
)
from emqtasks.store.selection import loaded_version
from emqtasks.verdicts import CancelVerdict
from emqtasks.workflows.canvas import chain, group

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def served(redis_url: str) -> Iterator[str]:
    """A queue a worker on async_producer_tasks serves for the whole module."""
    queue = f"ap-{uuid.uuid4().hex[:10]}"
    worker = WorkerProc(redis_url, queue, modules=("async_producer_tasks",))
    try:
        worker.wait_ready()
        yield queue
    finally:
        worker.stop()
        App(redis_url=redis_url, queue=queue).purge()


@pytest.fixture
def tasks(redis_url: str, served: str) -> Iterator[App]:
    """The tasks' own App, pointed at the served queue."""
    t.app.configure(redis_url=redis_url, queue=served)
    yield t.app
    t.app.close()


def test_every_async_producer_call_against_a_real_server_and_worker(tasks: App) -> None:
    async def main() -> None:
        await tasks.aopen()
        # delay / apply_async / map / send_task, each followed by aget
        h = await t.add.adelay("acme", 2, 3)
        assert (h.verdict, await h.aget(timeout=20)) == ("enqueued", 5)
        job_id = f"fixed-{uuid.uuid4().hex[:8]}"
        first = await t.add.aapply_async(("acme", 1, 1), job_id=job_id, priority=5)
        again = await t.add.aapply_async(("acme", 1, 1), job_id=job_id)
        assert (first.id, again.duplicate) == (job_id, True)
        assert await first.aget(timeout=20) == 2
        many = await t.add.amap([("t1", i, i) for i in range(5)])
        assert [await m.aget(timeout=20) for m in many] == [0, 2, 4, 6, 8]
        by_name = await tasks.asend_task("ap.add", ("acme", 4, 4))
        assert await by_name.aget(timeout=20) == 8
        assert await h.astatus() == "done"
        info = await h.ainfo()
        assert info is not None and (info["state"], info["group"]) == ("done", "acme")
        assert (await tasks.ajob(h.id)) == info
        # 200 at once on one loop, as an ASGI server's requests would
        async def one(i: int) -> int:
            handle = await t.add.adelay(f"c{i % 7}", i, 1)
            value: int = await handle.aget(timeout=30)
            return value
        assert await asyncio.gather(*(one(i) for i in range(200))) == [i + 1 for i in range(200)]
        # a failure, a cancel, a timeout
        bad = await t.boom.adelay("no good")
        with pytest.raises(TaskFailed, match="no good"):
            await bad.aget(timeout=20)
        waiting = await t.later.aapply_async(countdown=3600)
        assert await waiting.astatus() == "delayed"
        with pytest.raises(ResultTimeout):
            await waiting.aget(timeout=0.2)
        stats = await tasks.astats()
        assert stats == {**tasks.stats(), "clock": stats["clock"]}
        assert stats["delayed"] == 1
        assert await tasks.acancel(waiting.id) == CancelVerdict.CANCELLED
        with pytest.raises(TaskFailed, match="cancelled"):
            await waiting.aget(timeout=5)
        # workflows: a signature, a chain, a group
        one_step = await t.add.s("acme", 5, 5).adelay()
        assert await one_step.aget(timeout=20) == 10
        assert await one_step.astatus() == "done"
        two = await chain(t.add.si("acme", 1, 2), t.add.si("acme", 3, 4)).aapply_async()
        assert await two.aget(timeout=20) == 7
        both = await group(t.add.s("a", 1, 1), t.add.s("b", 2, 2)).adelay()
        assert await both.aget(timeout=20) == [2, 4]
        # a nested tree, awaited, with partial args going to each first step
        tree = await group(t.add.s(1, 1), t.add.s(2, 2) | group(t.add.si("b", 1, 4))) \
            .aapply_async(("a",))
        assert await tree.aget(timeout=20) == [2, [5]]
        # a handle from an async call also follows the job by the blocking calls
        assert (h.get(timeout=1), h.status()) == (5, "done")
        await tasks.aclose()

    asyncio.run(main())


def _sync_and_async(app: App, call: Any) -> tuple[Exception, Exception]:
    """The error the blocking call raises, and the one its async twin raises."""
    errors: list[Exception] = []
    for run in (lambda: call(app, False), lambda: asyncio.run(call(app, True))):
        try:
            run()
        except Exception as exc:
            errors.append(exc)
        else:
            raise AssertionError("no error")
    return errors[0], errors[1]


def test_the_async_calls_check_and_fail_as_the_sync_calls(redis_url: str, app: App) -> None:
    def send(**options: Any) -> Any:
        def call(a: App, aio: bool) -> Any:
            args = ("ap.add", ("acme", 1, 1))
            return a.asend_task(*args, **options) if aio else a.send_task(*args, **options)
        return call

    for options, error in (({"priority": 500}, InvalidArgument),
                           ({"job_id": "bad id!"}, InvalidJobId),
                           ({"countdown": float("nan")}, InvalidArgument)):
        sync, aio = _sync_and_async(app, send(**options))
        assert type(sync) is type(aio) is error and str(sync) == str(aio)
    # a payload over the App's limit
    small = App(redis_url=redis_url, queue=app.settings.queue, max_payload_bytes=64)
    sync, aio = _sync_and_async(small, lambda a, aio: (a.asend_task if aio else a.send_task)(
        "ap.add", ("acme", "x" * 100, 1)))
    assert type(sync) is type(aio) is PayloadTooLarge and str(sync) == str(aio)
    # a full lane: LaneFull for one call, a "full" verdict per call of map
    app.set_group_max_size("full", 0)
    sync, aio = _sync_and_async(app, send(group="full"))
    assert type(sync) is type(aio) is LaneFull and aio.group == "full"  # type: ignore[attr-defined]

    async def mapped() -> list[str]:
        t.app.configure(redis_url=redis_url, queue=app.settings.queue)
        return [h.verdict for h in await t.add.amap([("full", 1, 1), ("ok", 1, 1)])]
    assert asyncio.run(mapped()) == ["full", "enqueued"]
    # a key of the wrong type where the job would go: CorruptKey naming it, both ways
    app.client.set(app.queue().keys.lane("spoilt"), "oops")
    sync, aio = _sync_and_async(app, send(group="spoilt", job_id="spoilt-1"))
    assert type(sync) is type(aio) is CorruptKey and str(sync) == str(aio)
    assert "holds a string, not a zset" in str(aio)
    t.app.close()


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_the_module_path_and_the_scripts_path(redis_url: str, app: App, mode: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMQ_NATIVE", mode)
    native = mode == "auto" and loaded_version(app.client) is not None

    async def main() -> None:
        handles = [await app.asend_task("ap.add", ("acme", 20, 1))]
        handles += await t.add.amap([("acme", 1, 2)])
        assert app.aqueue().hot.native is native
        # completed here by a claim and an ack (no worker): aget sees the ack's result
        q = app.queue()
        for lease in q.claim(2):
            q.ack(lease, "42")
        assert [await h.aget(timeout=5) for h in handles] == [42, 42]
        await app.aclose()

    t.app.configure(redis_url=redis_url, queue=app.settings.queue)
    try:
        asyncio.run(main())
    finally:
        t.app.close()


def test_a_pool_per_event_loop_and_a_queue_object_refuses_another_loop(app: App) -> None:
    async def first() -> tuple[Any, Any]:
        return app.aqueue(), await app.asend_task("ap.later", countdown=3600)

    queue, handle = asyncio.run(first())   # that loop is closed now, its pool left behind

    async def second() -> None:
        with pytest.raises(WrongEventLoop, match="another event loop"):
            await queue.status(handle.id)
        # the App itself opens this loop's pool: the handle follows its job from here
        assert await handle.astatus() == "delayed"
        assert app.aqueue() is not queue and app.aqueue() is app.aqueue()
        await app.aclose()

    asyncio.run(second())


def test_a_busy_pool_is_a_result_timeout_not_a_hang(redis_url: str, queue_name: str) -> None:
    sep = "&" if "?" in redis_url else "?"
    one = App(redis_url=f"{redis_url}{sep}max_connections=1", queue=queue_name)

    async def main() -> None:
        a = await one.asend_task("ap.later", countdown=3600)
        b = await one.asend_task("ap.later", countdown=3600)
        holder = asyncio.create_task(a.aget(timeout=1))   # holds the one connection in BLPOP
        await asyncio.sleep(0.2)
        started = time.monotonic()
        with pytest.raises(ResultTimeout):
            await b.aget(timeout=0.3)
        assert time.monotonic() - started < 2.0
        with pytest.raises(ResultTimeout):
            await holder
        await one.aclose()

    try:
        asyncio.run(main())
    finally:
        one.purge()
        one.close()


cluster = pytest.fixture(scope="module", name="cluster")(module_cluster)


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_enqueue_and_get_on_a_redis_cluster(cluster: ClusterServers, mode: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMQ_NATIVE", mode)
    app = App(redis_url=cluster.url, queue=f"apc-{uuid.uuid4().hex[:8]}")
    with cluster.node(cluster.master_of_queue(app.settings.queue)) as node:
        cluster_has_module = loaded_version(node) is not None

    async def main() -> None:
        h = await app.asend_task("ap.add", ("acme", 1, 2))
        many = await app.aqueue().enqueue_many([])   # nothing to send: no round trip
        assert many == []
        waiting = await app.asend_task("ap.later", countdown=3600)
        q = app.queue()
        (lease,) = q.claim(1)
        q.ack(lease, "3")
        assert await h.aget(timeout=5) == 3
        stats = await app.astats()
        assert stats == {**app.stats(), "clock": stats["clock"]} and stats["delayed"] == 1
        assert await app.acancel(waiting.id) == CancelVerdict.CANCELLED
        # the path the blocking calls took (the module when the cluster has it), or none
        assert app.aqueue().hot.native is app.queue().hot.native is (mode == "auto" and
                                                                     cluster_has_module)
        await app.aclose()

    try:
        asyncio.run(main())
    finally:
        app.purge()
        app.close()


def test_the_async_twins_take_every_option_the_sync_calls_take(redis_url: str,
                                                                app: App) -> None:
    # Given the same call sent both ways with a tenant, a unique key, an expiry and a delay
    def options(aio: bool) -> dict[str, Any]:
        return {"tenant": "twins", "unique_key": f"twins-{aio}", "unique_for": 60,
                "expires": 3600, "countdown": 3600, "group": f"twins-{aio}"}

    async def twice() -> list[Any]:
        return [await app.asend_task("ap.later", **options(True)) for _ in range(2)]
    sync = [app.send_task("ap.later", **options(False)) for _ in range(2)]
    aio = asyncio.run(twice())
    # Then each way the second call is the first's duplicate, and the rows are alike
    for first, second in (sync, aio):
        assert (first.verdict, second.verdict) == ("enqueued", "duplicate")
        assert second.id == first.id
    rows = [app.job(h[0].id) or {} for h in (sync, aio)]
    assert rows[0]["state"] == rows[1]["state"] == "delayed"
    assert set(app.tenant("twins")["groups"]) == {"twins-False", "twins-True"}
    # and aapply_async takes Celery's task_id= and queue= as apply_async does
    other = f"{app.settings.queue}-other"

    async def by_task() -> Any:
        t.app.configure(redis_url=redis_url, queue=app.settings.queue)
        try:
            return await t.later.aapply_async(task_id="twin-7", queue=other, countdown=3600)
        finally:
            await t.app.aclose()
    handle = asyncio.run(by_task())
    assert handle.id == "twin-7"
    assert (App(redis_url=redis_url, queue=other).job("twin-7") or {}).get("state") == "delayed"
    App(redis_url=redis_url, queue=other).purge()
