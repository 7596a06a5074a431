"""Workflows: signatures, chains, groups and chords, enqueued whole in one script call.

``task.s(...)`` is a call not yet made; ``chain(a, b)`` (or ``a | b``) runs b with a's result
as its first argument; ``group([...])`` runs its members side by side; ``chord(group, cb)``
runs cb once with every member's result, in order. The hand-over is the server's: the ack of
a step releases the steps waiting for it in the same script call (lua/lib/workflow.lua,
workflows), so nothing can be lost between a step's completion and the next step's start,
and a chord's callback can only be released once.

Nesting: a chain may hold groups (a group followed by a step is a chord onto it), and a
chord's callback may be a chain. Deeper (a group of chains, a group right after a group)
is refused with NestingTooDeep.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .. import serialization, validate
from ..errors import (
    EmptyGroup,
    InvalidArgument,
    InvalidJobId,
    LaneFull,
    NestingTooDeep,
    ResultTimeout,
    TaskFailed,
    UnknownTask,
    WorkflowError,
    WorkflowTooLarge,
)
from ..observe import tracing
from ..producer.handle import Handle
from ..producer.jobs import build_job
from ..producer.registry import default_app
from ..store.keys import check_job_id, new_job_id
from ..store.plan import Pipe, Recorder, Steps, cmd
from ..store.queue import NewJob, Queue, WorkflowSent
from ..store.reads import wait_plan

if TYPE_CHECKING:
    from ..producer.app import App
    from ..producer.task import Task
    from ..store.aqueue import AsyncQueue

#: What a step's result is assumed to take at most (bytes of JSON) where the signature does
#: not declare its own (``.set(result_bytes=...)``): the budget a chord's collected results
#: are checked against at enqueue.
DEFAULT_RESULT_BYTES = 64
#: How long a workflow's hash lives (its steps' rows keep their own result_ttl).
WORKFLOW_TTL = 7 * 86_400
#: The most steps one workflow holds: it is enqueued in one script call, which stays far
#: under the arguments Redis takes in one command (about 20 a step) and runs well under a
#: second.
MAX_STEPS = 20_000
_OPTIONS = ("group", "countdown", "priority", "job_id", "result_bytes")


class Signature:
    """One call of a task, not yet made: ``task.s(*args, **kwargs)`` or ``task.si(...)``."""

    def __init__(self, task: Task[Any, Any] | str, args: Sequence[Any] = (),
                 kwargs: dict[str, Any] | None = None, *, immutable: bool = False,
                 app: App | None = None, **options: Any) -> None:
        self.task = task
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.immutable = immutable
        self._app = app
        for name in options:
            if name not in _OPTIONS:
                raise InvalidArgument(f"unknown signature option {name!r}: "
                                      f"{', '.join(_OPTIONS)}")
        self.options = dict(options)

    @property
    def name(self) -> str:
        return self.task if isinstance(self.task, str) else self.task.name

    def set(self, **options: Any) -> Signature:
        """A copy with options: group=, countdown=, priority=, job_id=, result_bytes=."""
        return Signature(self.task, self.args, self.kwargs, immutable=self.immutable,
                         app=self._app, **{**self.options, **options})

    def __or__(self, other: Any) -> Chain:
        return Chain(self, other)

    def delay(self, *args: Any, **kwargs: Any) -> WorkflowHandle:
        """Enqueue this call (a workflow of one step). As in Celery, extra args go in front
        of the signature's own (what a parent's result does in a chain); an immutable
        signature ignores them."""
        return self.apply_async(args, kwargs)

    def apply_async(self, args: Iterable[Any] = (), kwargs: dict[str, Any] | None = None,
                    **options: Any) -> WorkflowHandle:
        """``delay`` with options: workflow_id=, link_error=, app= (see Chain.apply_async)."""
        front = () if self.immutable else tuple(args)
        sig = Signature(self.task, (*front, *self.args), {**self.kwargs, **(kwargs or {})},
                        immutable=self.immutable, app=self._app, **self.options)
        return Chain(sig).apply_async(**options)

    async def adelay(self, *args: Any, **kwargs: Any) -> WorkflowHandle:
        """delay(), awaited (on the App's async client of the running event loop)."""
        return await self.aapply_async(args, kwargs)

    async def aapply_async(self, args: Iterable[Any] = (), kwargs: dict[str, Any] | None = None,
                           **options: Any) -> WorkflowHandle:
        """apply_async(), awaited."""
        front = () if self.immutable else tuple(args)
        sig = Signature(self.task, (*front, *self.args), {**self.kwargs, **(kwargs or {})},
                        immutable=self.immutable, app=self._app, **self.options)
        return await Chain(sig).aapply_async(**options)

    def __repr__(self) -> str:
        return f"{self.name}.{'si' if self.immutable else 's'}{self.args!r}"


class _SentAsAChain:
    """A group or a chord is sent as a workflow of one stage, and piped into a chain."""

    def __or__(self, other: Any) -> Chain:
        return Chain(self, other)

    def delay(self) -> WorkflowHandle:
        return self.apply_async()

    def apply_async(self, **options: Any) -> WorkflowHandle:
        return Chain(self).apply_async(**options)

    async def adelay(self) -> WorkflowHandle:
        return await Chain(self).aapply_async()

    async def aapply_async(self, **options: Any) -> WorkflowHandle:
        return await Chain(self).aapply_async(**options)


class Group(_SentAsAChain):
    """Signatures run side by side; ``get()`` gives their results in order."""

    def __init__(self, *sigs: Any) -> None:
        items = list(sigs[0]) if len(sigs) == 1 and not isinstance(sigs[0], Signature) \
            else list(sigs)
        for s in items:
            if not isinstance(s, Signature):
                raise NestingTooDeep(f"a group holds signatures only, not {type(s).__name__} "
                                     f"(nesting deeper than supported)")
        self.sigs: list[Signature] = items

    def __repr__(self) -> str:
        return f"group({self.sigs!r})"


class Chord(_SentAsAChain):
    """A group and a callback run once with the members' results in order."""

    def __init__(self, header: Group | Iterable[Signature], body: Signature | Chain) -> None:
        self.header = header if isinstance(header, Group) else Group(list(header))
        if not isinstance(body, (Signature, Chain)):
            raise NestingTooDeep(f"a chord's callback is a signature or a chain, not "
                                 f"{type(body).__name__}")
        self.body = body


class Chain:
    """Steps run one after the other, each given the result of the one before."""

    def __init__(self, *steps: Any) -> None:
        self.steps: list[Any] = []
        for s in steps:
            if not isinstance(s, (Signature, Group, Chord, Chain)):
                raise InvalidArgument(f"a chain holds signatures, groups, chords and chains, "
                                      f"not {s!r}")
            self.steps.append(s)

    def __or__(self, other: Any) -> Chain:
        return Chain(*self.steps, other)

    def delay(self) -> WorkflowHandle:
        return self.apply_async()

    def stages(self) -> list[Signature | Group]:
        """The steps flattened: each a signature or a group (the group's next stage is the
        chord's callback)."""
        out: list[Signature | Group] = []
        for s in self.steps:
            if isinstance(s, Chain):
                out += s.stages()
            elif isinstance(s, Chord):
                out.append(s.header)
                out += s.body.stages() if isinstance(s.body, Chain) else [s.body]
            else:
                out.append(s)
        return out

    def apply_async(self, *, workflow_id: str | None = None, link_error: Signature | None = None,
                    app: App | None = None) -> WorkflowHandle:
        """Enqueue every step in one script call; nothing is written when any is refused.

        Raises EmptyGroup, NestingTooDeep, UnknownTask, WorkflowTooLarge (PayloadTooLarge),
        LaneFull or WorkflowError (a step id that exists), all before anything is written.
        """
        builder = _Builder(self.stages(), link_error, app)
        with tracing.sending(builder.first, None) as span:
            built = builder.build(workflow_id, span.carrier)
            queue = built.app.queue(built.queue)
            span.set(built.attributes(queue.name))
            return built.handle(queue, queue.send_workflow(*built.sent()))

    async def adelay(self) -> WorkflowHandle:
        return await self.aapply_async()

    async def aapply_async(self, *, workflow_id: str | None = None,
                           link_error: Signature | None = None,
                           app: App | None = None) -> WorkflowHandle:
        """apply_async(), awaited: the same rows, checks and errors, sent on redis.asyncio."""
        builder = _Builder(self.stages(), link_error, app)
        with tracing.sending(builder.first, None) as span:
            built = builder.build(workflow_id, span.carrier)
            queue = built.app.aqueue(built.queue)
            span.set(built.attributes(queue.name))
            return built.handle(queue, await queue.send_workflow(*built.sent()))


def chain(*steps: Any) -> Chain:
    """``chain(a, b, c)``: b gets a's result as its first argument, c gets b's."""
    return Chain(*steps)


def group(*sigs: Any) -> Group:
    """``group([a, b])`` or ``group(a, b)``: run side by side."""
    return Group(*sigs)


def chord(header: Group | Iterable[Signature], body: Signature | Chain) -> Chord:
    """``chord(group, callback)``: the callback gets the members' results, in order."""
    return Chord(header, body)


# -- building the workflow's rows -------------------------------------------------------------

class _Step:
    __slots__ = ("sig", "job", "mode", "extra", "size")

    def __init__(self, sig: Signature, job: NewJob, mode: str) -> None:
        self.sig, self.job, self.mode = sig, job, mode
        self.extra: dict[str, str] = {}
        self.size = len(job.payload.encode("utf-8"))


class _Builder:
    def __init__(self, stages: list[Signature | Group], link_error: Signature | None,
                 app: App | None) -> None:
        if not stages:
            raise EmptyGroup("an empty workflow: nothing to run")
        for i, st in enumerate(stages):
            if isinstance(st, Group) and not st.sigs:
                raise EmptyGroup("an empty group: a chord needs at least one member"
                                 if i + 1 < len(stages) else "an empty group")
            if isinstance(st, Group) and i > 0 and isinstance(stages[i - 1], Group):
                raise NestingTooDeep("a group right after a group (nesting deeper than "
                                     "supported: put a step between them)")
        self.stages = stages
        self.link_error = link_error
        self.app = app or self._app_of(stages)
        self.limit = self.app.settings.max_payload_bytes
        first = stages[0]
        #: The task of the first step: what the workflow's send span is named after.
        self.first = (first if isinstance(first, Signature) else first.sigs[0]).name
        #: The trace context every step carries (its enqueue's span): build() sets it.
        self.trace: dict[str, str] | None = None

    @staticmethod
    def _app_of(stages: list[Signature | Group]) -> App:
        first = stages[0]
        sig = first if isinstance(first, Signature) else first.sigs[0]
        if sig._app is not None:
            return sig._app
        if isinstance(sig.task, str):
            app: App = default_app()
            return app
        return sig.task.app

    def _spec(self, sig: Signature) -> Any:
        if not isinstance(sig.task, str):
            return sig.task.spec
        spec = self.app._local_spec(sig.task)
        if spec is None:
            raise UnknownTask(f"workflow step {sig.task!r} is not a registered task")
        return spec

    def _step(self, sig: Signature, mode: str) -> _Step:
        o = sig.options
        job = build_job(self._spec(sig), sig.args, sig.kwargs, limit=self.limit,
                        job_id=o.get("job_id"), group=o.get("group"),
                        countdown=o.get("countdown") if mode == "r" else None,
                        priority=o.get("priority", 0), trace=self.trace)
        step = _Step(sig, job, mode)
        if mode == "w":
            cd = validate.countdown_ms(o.get("countdown"), None)
            if cd:
                step.extra["cd"] = str(cd)
            if sig.immutable:
                step.extra["imm"] = "1"
            else:
                # the parent's result goes first: right after the envelope's '"a":['
                step.extra["splice"] = str(job.payload.index('"a":[') + 5)
                step.extra["comma"] = "1" if sig.args else "0"
        return step

    @staticmethod
    def _result_bytes(sig: Signature) -> int:
        return validate.integer(sig.options.get("result_bytes", DEFAULT_RESULT_BYTES),
                                "result_bytes", 1)

    def build(self, workflow_id: str | None,
              trace: dict[str, str] | None = None) -> _Built:
        """Every row of the workflow, checked: what one call of the workflow verb writes.
        ``trace``: the trace context its steps carry (observe/tracing.py)."""
        self.trace = trace
        wf = check_job_id(workflow_id) if workflow_id is not None else new_job_id()
        levels: list[list[_Step]] = []
        for i, st in enumerate(self.stages):
            mode = "r" if i == 0 else "w"
            sigs = [st] if isinstance(st, Signature) else st.sigs
            levels.append([self._step(s, mode) for s in sigs])
        queue_names = {self._spec(s.sig).queue for lv in levels for s in lv}
        if len(queue_names) > 1:
            raise WorkflowError("a workflow's steps must all use one queue")
        for st, parents, children in zip(self.stages, levels, levels[1:]):
            self._link(parents, children, isinstance(st, Group))
        steps = [s for lv in levels for s in lv]
        if len(steps) > MAX_STEPS:
            raise WorkflowError(f"a workflow of {len(steps)} steps: at most {MAX_STEPS}")
        ids = [s.job.id for s in steps]
        if len(set(ids)) != len(ids) or wf in ids:
            raise InvalidJobId("a workflow's step ids (and its own id) must all differ")
        lerr = None
        if self.link_error is not None:
            lerr = self._step(self.link_error, "w")
            lerr.mode = "e"            # waiting, and expiring with the workflow's hash
            if not self.link_error.immutable and lerr.size + 130 > self.limit:
                raise WorkflowTooLarge("the link_error step's arguments leave no room for "
                                       "the failed step's id")
        for s in steps:
            s.extra["wf"] = wf
        waiting = [s.job.id for s in steps if s.mode == "w"]
        last = levels[-1]
        meta = {"kind": "group" if len(last) > 1 or isinstance(self.stages[-1], Group)
                else "chain", "final": " ".join(s.job.id for s in last),
                "steps": " ".join(ids), "waiting": " ".join(waiting)}
        rows = list(steps)
        if lerr is not None:
            lerr.extra["wf"] = wf
            lerr.extra["errof"] = wf
            meta["lerr"] = lerr.job.id
            if lerr.job.id in ids or lerr.job.id == wf:
                raise InvalidJobId("the link_error step's id must differ from the steps'")
            rows.append(lerr)
        return _Built(self.app, self._spec(steps[0].sig).queue, wf, meta, rows)

    def _link(self, parents: list[_Step], children: list[_Step], from_group: bool) -> None:
        # By the parents' stage, not their count: a group of one is a chord onto [r0].
        if not from_group:                 # a step onto a step, or onto a group's members
            p = parents[0]
            p.extra["next"] = " ".join(c.job.id for c in children)
            for c in children:
                c.extra["par"] = p.job.id
                self._fits(c, [self._result_bytes(p.sig)])
            return
        (c,) = children                    # a group onto its chord's callback
        for i, p in enumerate(parents):
            p.extra["next"] = c.job.id
            p.extra["slot"] = str(i)
        c.extra["par"] = " ".join(p.job.id for p in parents)
        c.extra["npend"] = c.extra["nslots"] = str(len(parents))
        # the results go in as one list: [r0,r1,...]
        self._fits(c, [sum(self._result_bytes(p.sig) + 1 for p in parents) + 1])

    def _fits(self, child: _Step, incoming: list[int]) -> None:
        if child.sig.immutable:
            return
        need = child.size + sum(incoming) + 1
        if need > self.limit:
            raise WorkflowTooLarge(
                f"step {child.sig!r} could receive {need} bytes of arguments (its own "
                f"{child.size} and the declared result_bytes of what it collects), over the "
                f"{self.limit}-byte limit (max_payload_bytes)")


class _Built:
    """A workflow ready to send: its App, queue, id, hash and rows."""

    def __init__(self, app: App, queue: str | None, wf: str, meta: dict[str, str],
                 rows: list[_Step]) -> None:
        self.app, self.queue, self.wf, self.meta, self.rows = app, queue, wf, meta, rows

    def sent(self) -> tuple[str, int, dict[str, str], list[tuple[NewJob, str, dict[str, str]]]]:
        """The workflow verb's arguments (Queue.send_workflow)."""
        return self.wf, WORKFLOW_TTL, self.meta, [(s.job, s.mode, s.extra) for s in self.rows]

    def attributes(self, queue: str) -> dict[str, Any]:
        """Its send span's attributes: the queue, the workflow's id and number of rows."""
        return {"messaging.destination.name": queue, "messaging.message.id": self.wf,
                "messaging.batch.message_count": len(self.rows)}

    def handle(self, queue: Queue | AsyncQueue, reply: WorkflowSent) -> WorkflowHandle:
        """The handle, or the error, the verb's answer makes."""
        code, what = reply
        if code == 0 and what == self.wf:
            return WorkflowHandle(queue, self.wf, "duplicate", self.app)
        if code == 0:
            raise WorkflowError(f"step id {what} exists already: nothing was written")
        if code == 2:
            group = next(s.job.group for s in self.rows if s.job.id == what)
            raise LaneFull(group, what)
        if code != 1:  # pragma: no cover - ids are gated before the call
            raise InvalidJobId(f"the server refused the id {what!r}")
        return WorkflowHandle(queue, self.wf, app=self.app)


# -- following a workflow ---------------------------------------------------------------------

class WorkflowHandle(Handle):
    """A workflow's id and a way to follow it: ``get``, ``status``, ``steps``, ``cancel``
    (``aget`` and ``astatus`` awaited, on the App's async client of the running loop).

    ``verdict`` is "enqueued", or "duplicate" when the workflow id existed (nothing written).
    """

    kind = "workflow"

    def _meta(self) -> Steps[dict[str, str]]:
        meta: dict[str, str] = yield cmd("hgetall", self._queue.keys.workflow(self.id))
        if not meta:
            raise TaskFailed(self.id, "the workflow is gone (expired, purged or never existed)")
        return meta

    def status(self) -> str:
        """running, done, failed (a step went dead) or cancelled."""
        return self._sync().run(self._status_plan())

    async def astatus(self) -> str:
        """status(), awaited."""
        return await self._aio().run(self._status_plan())

    def _status_plan(self) -> Steps[str]:
        return (yield from self._status((yield from self._meta())))

    def _status(self, meta: dict[str, str]) -> Steps[str]:
        if meta.get("state") in ("failed", "cancelled"):
            return meta["state"]
        finals = meta.get("final", "").split()
        pipe = Recorder()
        for i in finals:
            pipe.hget(self._queue.keys.job(i), "state")
        states = yield Pipe(pipe.cmds)
        return "done" if states and all(s == "done" for s in states) else "running"

    def steps(self) -> list[dict[str, Any]]:
        """Each step in order: id, task, state (waiting: for its parent), attempts, group."""
        return self._sync().run(self._steps_plan())

    def _steps_plan(self) -> Steps[list[dict[str, Any]]]:
        meta = yield from self._meta()
        return (yield from self._step_rows(meta.get("steps", "").split()))

    def _step_rows(self, ids: list[str]) -> Steps[list[dict[str, Any]]]:
        pipe = Recorder()
        for i in ids:
            pipe.hmget(self._queue.keys.job(i), "task", "state", "attempts", "group")
        out = []
        for i, (task, state, attempts, grp) in zip(ids, (yield Pipe(pipe.cmds))):
            out.append({"id": i, "task": task, "state": state, "group": grp,
                        "attempts": int(attempts) if attempts is not None else None})
        return out

    def info(self, start: int = 0, count: int | None = None) -> dict[str, Any]:
        """Status, kind, failed step, link_error step, the number of steps (``total``) and
        the steps (or ``count`` of them from ``start``), from one read of the workflow."""
        return self._sync().run(self._info_plan(start, count))

    def _info_plan(self, start: int, count: int | None) -> Steps[dict[str, Any]]:
        meta = yield from self._meta()
        ids = meta.get("steps", "").split()
        status = yield from self._status(meta)
        rows = yield from self._step_rows(ids[start:None if count is None else start + count])
        return {"id": self.id, "kind": meta.get("kind"), "status": status,
                "failed_step": meta.get("failed"), "link_error": meta.get("lerr"),
                "total": len(ids), "steps": rows}

    def get(self, timeout: float | None = None) -> Any:
        """The last step's result (a chain, a chord), or the members' results in order (a
        group). TaskFailed names the step that went dead (``job_id``); ResultTimeout when
        not finished within ``timeout`` seconds."""
        return self._sync().run(self._get_plan(timeout))

    async def aget(self, timeout: float | None = None) -> Any:
        """get(), awaited."""
        return await self._aio().run(self._get_plan(timeout))

    def _get_plan(self, timeout: float | None) -> Steps[Any]:
        timeout = validate.optional_seconds(timeout, "timeout", high=math.inf)
        deadline = None if timeout is None else time.monotonic() + timeout
        meta = yield from self._meta()
        results = []
        for i in meta.get("final", "").split():
            results.append((yield from self._wait(i, deadline, timeout)))
        return results if meta.get("kind") == "group" else results[0]

    def _wait(self, job_id: str, deadline: float | None, timeout: float | None) -> Steps[Any]:
        state, result, error, ended = yield from wait_plan(self._queue.keys, job_id, deadline)
        if not ended:
            raise ResultTimeout(f"workflow {self.id}: step {job_id} still {state} after "
                                f"{timeout}s")
        if state != "done":
            yield from self._raise_failed(job_id, state, error)
        return serialization.loads_result(result)

    def _raise_failed(self, job_id: str, state: str | None, error: str | None) -> Steps[None]:
        meta = yield cmd("hgetall", self._queue.keys.workflow(self.id))
        failed = meta.get("failed")
        if failed:
            row = yield cmd("hmget", self._queue.keys.job(failed), "task", "error")
            raise TaskFailed(failed, f"workflow {self.id} failed at step {failed} "
                                     f"({row[0]}): {row[1] or 'dead'}")
        if meta.get("state") == "cancelled" or state == "cancelled":
            raise TaskFailed(job_id, f"workflow {self.id} was cancelled")
        raise TaskFailed(job_id, error or f"the row of step {job_id} is gone")

    def cancel(self) -> int:
        """Cancel every step not yet started (one script call); returns how many."""
        return self._sync().cancel_workflow(self.id)

    def __repr__(self) -> str:
        return f"<WorkflowHandle {self.id}>"
