"""``AsyncQueue``: the producer's verbs of one queue on a ``redis.asyncio`` client.

It writes no verb of its own: each method carries out the plan the blocking ``Queue`` runs
(plan.py; enqueue_plan in hot.py, wait_plan in reads.py...), awaiting each command instead
of blocking on it. So validation, keys, arguments, the hot path's choice between the
module's EMQ.* command and the script (selection.Route, one per queue object as for
``Queue``), the decoding of replies and the errors are the sync verbs' own.

A queue object belongs to the event loop it was made on (its client's connections are that
loop's): a call from another loop raises WrongEventLoop before anything is sent, where
redis-py would fail deep inside or wait for ever on the other loop's pool.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterable, Sequence
from functools import cache
from typing import Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import (
    NoScriptError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
)

from ..errors import CorruptKey, ServerFull, WrongEventLoop
from ..verdicts import CancelVerdict, EnqueueVerdict
from .admin import cancel_plan
from .autopipe import BATCHABLE, AsyncBatcher, autopipeline_mode
from .cluster import is_cluster, node_kwargs
from .commands import COMMANDS
from .connection import MAX_BLOCK, pool_wait
from .core import corrupt_plan, groups_plan
from .durable import Durable
from .flows import workflow_plan
from .functions import Functions
from .hot import check_jobs, enqueue_plan
from .keys import QueueKeys, Unique
from .plan import (
    Bounded,
    Cmd,
    Hot,
    Op,
    Pipe,
    Pop,
    Routing,
    Scan,
    Script,
    Steps,
    advance,
    block_seconds,
)
from .reads import job_plan, status_plan, wait_plan
from .replies import NewJob, Outcome, WorkflowSent
from .scripts import FALLBACK, out_of_memory, source
from .selection import Route
from .wire import AsyncWire, WireBroken

T = TypeVar("T")


@cache
def _sha(verb: str) -> str:
    return hashlib.sha1(source(verb).encode("utf-8")).hexdigest()


class AsyncScripts:
    """The verbs' scripts on one async client: EVALSHA, EVAL of the source on NOSCRIPT (as
    scripts.Verb: no window between a reload and the run for a SCRIPT FLUSH); a full
    server's refusal is ServerFull."""

    def __init__(self, client: Any, wire: AsyncWire, functions: bool | None = None) -> None:
        self.client = client
        self.wire = wire
        #: FCALL of the verbs' library where the server runs it (functions.py)
        self.functions = Functions(client, functions)

    async def _fcall(self, command: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        return await _send(self.client, self.wire, command, keys, args)

    async def run(self, verb: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            if self.functions.usable is not False:
                reply = await self.functions.acall(self.client, self._fcall, verb, keys, args)
                if reply is not FALLBACK:
                    return reply
            try:
                return await _send(self.client, self.wire, "EVALSHA",
                                   (_sha(verb), len(keys), *keys), args)
            except NoScriptError:
                return await self.client.eval(source(verb), len(keys), *keys, *args)
        except ResponseError as exc:
            if out_of_memory(exc):
                raise ServerFull.of(exc) from None
            raise


class AsyncHotVerbs(Route):
    """The hot verbs of one async client: HotVerbs' choice of path, awaited."""

    scripts: AsyncScripts

    async def call(self, verb: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        if self.serves[verb] is False:
            return await self.scripts.run(verb, keys, args)
        try:
            reply = await _send(self.client, self.scripts.wire, COMMANDS[verb], keys, args)
        except RedisError as exc:
            self.refused(verb, exc)
            return await self.scripts.run(verb, keys, args)
        self.serves[verb] = True
        return reply


async def _send(client: Any, wire: AsyncWire, command: str, keys: Sequence[Any],
                args: Sequence[Any]) -> Any:
    """A command pre-packed on the wire where it can be, else by ``execute_command`` (a
    cluster client, or a connection that broke: redis-py's retries)."""
    if wire.usable:
        try:
            return await wire.call(command, keys, args)
        except WireBroken:
            pass
    return await client.execute_command(command, *keys, *args)


class AsyncQueue:
    """One queue on one ``redis.asyncio`` client, for the event loop it was made on."""

    def __init__(self, client: Any, name: str, native: str | None = None,
                 autopipeline: bool | None = None) -> None:
        self.client = client
        self.keys = QueueKeys(name)
        self.name = name
        self.scripts = AsyncScripts(client, AsyncWire(client))
        self.hot = AsyncHotVerbs(client, self.scripts, native)
        self.loop = asyncio.get_running_loop()
        self._cluster = is_cluster(client)
        #: Auto-pipelining of this queue's enqueues (store/autopipe.py): the calls of one
        #: turn of the loop go out together; None: off, or a cluster client.
        on = autopipeline_mode() if autopipeline is None else autopipeline
        self.batcher = AsyncBatcher(self.enqueue_now) if on and not self._cluster else None

    # -- the verbs (each the sync Queue's plan) ---------------------------------------------
    async def enqueue_many(self, jobs: Sequence[NewJob],
                           expires_ms: Sequence[int | None] | None = None,
                           tenants: Sequence[str | None] | None = None,
                           durable: Durable | None = None,
                           uniques: Sequence[Unique | None] | None = None,
                           holders: list[str | None] | None = None) -> list[EnqueueVerdict]:
        if self.batcher is not None and len(jobs) <= BATCHABLE and uniques is None:
            check_jobs(jobs, expires_ms, tenants)   # a call's own bad id fails it alone
            self._check_loop()
            return await self.batcher.enqueue(jobs, expires_ms, tenants, durable)
        return await self.enqueue_now(jobs, expires_ms, tenants, durable, uniques, holders)

    async def enqueue_now(self, jobs: Sequence[NewJob],
                          expires_ms: Sequence[int | None] | None = None,
                          tenants: Sequence[str | None] | None = None,
                          durable: Durable | None = None,
                          uniques: Sequence[Unique | None] | None = None,
                          holders: list[str | None] | None = None) -> list[EnqueueVerdict]:
        """enqueue_many in a round trip of its own (a batch of the batcher's)."""
        return await self.run(enqueue_plan(self.keys, jobs, expires_ms, tenants, durable,
                                           uniques, holders))

    async def corrupt(self, groups: Iterable[str], outcome: str) -> CorruptKey:
        return await self.run(corrupt_plan(self.keys, groups, outcome))

    async def status(self, job_id: str) -> str | None:
        return await self.run(status_plan(self.keys, job_id))

    async def job(self, job_id: str) -> dict[str, Any] | None:
        return await self.run(job_plan(self.keys, job_id))

    async def wait_outcome(self, job_id: str, deadline: float | None,
                           chunk: float = MAX_BLOCK) -> Outcome:
        return await self.run(wait_plan(self.keys, job_id, deadline, chunk))

    async def cancel(self, job_id: str) -> CancelVerdict:
        return await self.run(cancel_plan(self.keys, job_id))

    async def send_workflow(self, workflow_id: str, ttl: int, meta: dict[str, str],
                            steps: Sequence[tuple[NewJob, str, dict[str, str]]],
                            durable: Durable | None = None) -> WorkflowSent:
        return await self.run(workflow_plan(self.keys, workflow_id, ttl, meta, steps,
                                            durable))

    async def groups(self) -> set[str]:
        return await self.run(groups_plan(self.keys))

    async def ping(self) -> bool:
        """One round trip to the server holding the queue (opens a connection)."""
        return bool(await self.run(_ping(self.keys)))

    # -- the runner ----------------------------------------------------------------------
    async def run(self, steps: Steps[T]) -> T:
        """Carry out a plan (plan.py) on this queue's client, awaiting each command."""
        try:
            self._check_loop()
            if self._cluster:
                await self._ready()
        except BaseException:
            steps.close()
            raise
        reply: Any = None
        error: Exception | None = None
        while True:
            try:
                op = advance(steps, reply, error)
            except StopIteration as stop:
                value: T = stop.value
                return value
            try:
                reply, error = await self._execute(op), None
            except Exception as exc:     # the plan decides: it is thrown in at its yield
                reply, error = None, exc

    def _check_loop(self) -> None:
        if asyncio.get_running_loop() is not self.loop:
            raise WrongEventLoop(
                f"queue {self.name}: its connections belong to another event loop "
                "(an App keeps one pool per loop: take the queue again in this one)")

    async def _ready(self) -> None:
        """A cluster client reads its slot map first (node-routed commands need it); no
        node answering is a ConnectionError, as connect_cluster says it."""
        try:
            await self.client.initialize()
        except RedisClusterException as exc:
            raise RedisConnectionError(f"no Redis Cluster node answered: {exc}") from exc

    async def _execute(self, op: Op) -> Any:
        client = self.client
        if isinstance(op, Cmd):
            extra = node_kwargs(client, op.node) if op.node is not None else {}
            return await getattr(client, op.name)(*op.args, **op.kwargs, **extra)
        if isinstance(op, Pipe):
            if op.near is not None and hasattr(client, "get_node_from_key"):
                return await _node_pipe(client, op)
            pipe = client.pipeline(transaction=False)
            for c in op.cmds:
                getattr(pipe, c.name)(*c.args, **c.kwargs)
            return await pipe.execute(raise_on_error=op.raise_on_error)
        if isinstance(op, Hot):
            return await self.hot.call(op.verb, op.keys, op.args)
        if isinstance(op, Routing):
            return self.hot
        if isinstance(op, Script):
            return await self.scripts.run(op.verb, op.keys, op.args)
        if isinstance(op, Pop):
            try:
                return await client.blpop(list(op.keys), timeout=block_seconds(op.timeout))
            except ResponseError as exc:    # as plan.blpop: a primary turned replica
                if str(exc).startswith("UNBLOCKED"):
                    raise ReadOnlyError(str(exc)) from exc
                raise
        if isinstance(op, Scan):
            return [key async for key in client.scan_iter(
                match=op.match, count=1000, **node_kwargs(client, op.near))]
        return await self._bounded(op)

    async def _bounded(self, op: Bounded) -> Any:
        with pool_wait(op.seconds):
            return await self._execute(op.op)


async def _node_pipe(client: Any, op: Pipe) -> list[Any]:
    """``op`` on one connection of the cluster node holding ``op.near`` (redis.asyncio's
    cluster pipeline would send a keyless command such as WAIT to any node): the replies,
    an error in its place (raised with ``raise_on_error``)."""
    from redis.asyncio.cluster import PipelineCommand

    await client.initialize()   # the slot map (a no-op once read)
    node = client.get_node_from_key(op.near)
    cmds = [PipelineCommand(i, *(c.args if c.name == "execute_command"
                                 else (c.name.upper(), *c.args)))
            for i, c in enumerate(op.cmds)]
    await node.execute_pipeline(cmds)
    replies = [c.result for c in cmds]
    for r in replies:
        if op.raise_on_error and isinstance(r, Exception):
            raise r
    return replies


def _ping(keys: QueueKeys) -> Steps[Any]:
    reply = yield Cmd("ping", node=keys.ring)
    return reply
