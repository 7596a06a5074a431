"""Workflows: signatures, chains, groups and chords, enqueued whole in one script call.

``task.s(...)`` is a call not yet made; ``chain(a, b)`` (or ``a | b``) runs b with a's result
as its first argument; ``group([...])`` runs its members side by side; ``chord(group, cb)``
runs cb once with every member's result, in order. The hand-over is the server's: the ack of
a step releases the steps waiting for it in the same script call (lua/lib/workflow.lua,
workflows), so nothing can be lost between a step's completion and the next step's start,
and a chord's callback can only be released once.

Nesting is free, as in Celery: a group of chains or chords, a group right after a group
(each member of the second gets the first's list), chains and chords in a chord's header, a
chord whose body is a group or a chain. A group's result is its members' results in order (a
chain's: its last step's, a list when that step is a group; a chord's: its body's; a group
directly in a group is unrolled into it, as Celery's group does), so the
workflow is a tree of steps the acks hand over along (see "building" below), bounded by
MAX_STEPS and max_payload_bytes (WorkflowTooLarge).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Union, cast

from .. import serialization, validate
from ..errors import (
    EmptyGroup,
    InvalidArgument,
    InvalidJobId,
    LaneFull,
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
#: The deepest nesting of canvases (a chord in a group in a chord ...) one workflow may have:
#: building it recurses once a level, far under Python's recursion limit.
MAX_DEPTH = 200
_OPTIONS = ("group", "countdown", "priority", "job_id", "result_bytes")


#: What a workflow is built of: a call, or a chain, group or chord of them (nested freely).
Canvas = Union["Signature", "Chain", "Group", "Chord"]


class _Node:
    """What every canvas shares: ``|``, sending (Celery's ``delay`` / ``apply_async``: the
    args and kwargs go to the first steps, as a parent's result would), and an errback."""

    _errback: Signature | None = None

    def __or__(self, other: Any) -> Chain:
        return Chain(self, other)

    def link_error(self, errback: Signature) -> Signature:
        """Celery's ``sig.link_error(errback)``: run ``errback`` (with the failed step's id
        as its first argument) when the workflow fails; returns ``errback``."""
        if not isinstance(errback, Signature):
            raise InvalidArgument(f"link_error takes a signature, not {errback!r}")
        self._errback = errback
        return errback

    def on_error(self, errback: Signature) -> Any:
        """``link_error``, returning the canvas (Celery's ``on_error``)."""
        self.link_error(errback)
        return self

    def _partial(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                 options: dict[str, Any]) -> Canvas:
        """A copy whose first steps get ``args`` in front, ``kwargs`` merged into theirs and
        ``options`` (a signature's) over theirs."""
        raise NotImplementedError

    def delay(self, *args: Any, **kwargs: Any) -> WorkflowHandle:
        """Enqueue it, ``args`` and ``kwargs`` going to its first step(s)."""
        return self.apply_async(args, kwargs)

    def apply_async(self, args: Iterable[Any] = (), kwargs: dict[str, Any] | None = None, *,
                    workflow_id: str | None = None, link_error: Signature | None = None,
                    app: App | None = None, countdown: float | None = None) -> WorkflowHandle:
        """Enqueue every step in one script call; nothing is written when any is refused.

        ``args`` go in front of the first step's own arguments (each first step's: the
        members of a group that starts it), ``kwargs`` are merged into theirs (Celery's
        partial arguments); an immutable signature ignores ``args``. ``link_error``: a
        signature run with the failed step's id when any step goes dead. ``countdown``:
        the first steps start that many seconds from now (over their own ``countdown``).

        Raises EmptyGroup, UnknownTask, WorkflowTooLarge (PayloadTooLarge: a step's
        arguments, more than MAX_STEPS steps or MAX_DEPTH levels), LaneFull or
        WorkflowError (a step id that exists), all before anything is written.
        """
        builder = _Builder(self._sent(args, kwargs, countdown), link_error or self._errback,
                           app)
        with tracing.sending(builder.first, None) as span:
            built = builder.build(workflow_id, span.carrier)
            queue = built.app.queue(built.queue)
            span.set(built.attributes(queue.name))
            return built.handle(queue, queue.send_workflow(
                *built.sent(), durable=built.app.settings.durable))

    async def adelay(self, *args: Any, **kwargs: Any) -> WorkflowHandle:
        """delay(), awaited (on the App's async client of the running event loop)."""
        return await self.aapply_async(args, kwargs)

    async def aapply_async(self, args: Iterable[Any] = (), kwargs: dict[str, Any] | None = None,
                           *, workflow_id: str | None = None,
                           link_error: Signature | None = None,
                           app: App | None = None,
                           countdown: float | None = None) -> WorkflowHandle:
        """apply_async(), awaited: the same rows, checks and errors, sent on redis.asyncio."""
        builder = _Builder(self._sent(args, kwargs, countdown), link_error or self._errback,
                           app)
        with tracing.sending(builder.first, None) as span:
            built = builder.build(workflow_id, span.carrier)
            queue = built.app.aqueue(built.queue)
            span.set(built.attributes(queue.name))
            return built.handle(queue, await queue.send_workflow(
                *built.sent(), durable=built.app.settings.durable))

    def _sent(self, args: Iterable[Any], kwargs: dict[str, Any] | None,
              countdown: float | None = None) -> Canvas:
        args = tuple(args)
        options = {} if countdown is None else {"countdown": countdown}
        if not args and not kwargs and not options:
            return cast(Canvas, self)
        return self._partial(args, dict(kwargs or {}), options)


class Signature(_Node):
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
        """A copy with options: group=, countdown=, priority=, job_id=, result_bytes= (and
        its errback: Celery's ``set()`` changes the signature itself)."""
        return self._copy(self.args, self.kwargs, {**self.options, **options})

    def _partial(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                 options: dict[str, Any]) -> Signature:
        front = () if self.immutable else args
        return self._copy((*front, *self.args), {**self.kwargs, **kwargs},
                          {**self.options, **options})

    def _copy(self, args: tuple[Any, ...], kwargs: dict[str, Any],
              options: dict[str, Any]) -> Signature:
        copy = Signature(self.task, args, kwargs, immutable=self.immutable, app=self._app,
                         **options)
        copy._errback = self._errback
        return copy

    def __repr__(self) -> str:
        return f"{self.name}.{'si' if self.immutable else 's'}{self.args!r}"


def _canvas(x: Any, where: str) -> Canvas:
    if not isinstance(x, (Signature, Chain, Group, Chord)):
        raise InvalidArgument(f"{where} holds signatures, chains, groups and chords, not {x!r}")
    return x


class Group(_Node):
    """Canvases run side by side; its result is their results in order (a chain's: its last
    step's, a list if that is a group; a chord's: its body's). A group directly in a group
    is unrolled into it, as Celery's is: ``group(a, group(b, c))`` is ``group(a, b, c)``."""

    def __init__(self, *tasks: Any) -> None:
        items: Any = tasks
        if len(tasks) == 1 and not isinstance(tasks[0], (Signature, Chain, Chord, Group)):
            items = tasks[0]            # group([a, b]): one iterable
        self.tasks: list[Canvas] = []
        for t in items:
            if isinstance(t, Group):    # unrolled already, its own members
                self.tasks.extend(t.tasks)
            else:
                self.tasks.append(_canvas(t, "a group"))

    @property
    def sigs(self) -> list[Canvas]:
        """The members (the name before groups held more than signatures)."""
        return self.tasks

    def __call__(self, *args: Any, **kwargs: Any) -> WorkflowHandle:
        """Celery's ``group(...)()``: ``delay()`` (``args`` go to every member)."""
        return self.delay(*args, **kwargs)

    def _partial(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                 options: dict[str, Any]) -> Group:
        return Group([t._partial(args, kwargs, options) for t in self.tasks])

    def __repr__(self) -> str:
        return f"group({self.tasks!r})"


class Chord(_Node):
    """A header (a group) and a body run once with the header's results in order."""

    def __init__(self, header: Any, body: Any = None) -> None:
        self.header = header if isinstance(header, Group) else Group(header)
        self.body: Canvas | None = None if body is None else _canvas(body, "a chord's body")

    def __call__(self, body: Any = None, **options: Any) -> WorkflowHandle:
        """Celery's ``chord(header)(body)``: send it, with that body."""
        sent = Chord(self.header, body if body is not None else self.body)
        sent._errback = self._errback
        return sent.apply_async(**options)

    def _partial(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                 options: dict[str, Any]) -> Chord:
        return Chord(self.header._partial(args, kwargs, options), self.body)

    def __repr__(self) -> str:
        return f"chord({self.header!r}, {self.body!r})"


class Chain(_Node):
    """Canvases run one after the other, each given the result of the one before (a group's
    result, its list: the step after a group is a chord's body onto it, as in Celery)."""

    def __init__(self, *steps: Any) -> None:
        if len(steps) == 1 and isinstance(steps[0], (list, tuple)):
            steps = tuple(steps[0])     # chain([a, b]), as Celery takes it
        self.steps: list[Canvas] = [_canvas(s, "a chain") for s in steps]

    def __or__(self, other: Any) -> Chain:
        longer = Chain(*self.steps, other)
        longer._errback = self._errback
        return longer

    def __call__(self, *args: Any, **kwargs: Any) -> WorkflowHandle:
        """Celery's ``chain(...)()`` and ``(a | b)(x)``: ``delay()`` (to the first step)."""
        return self.delay(*args, **kwargs)

    def _partial(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                 options: dict[str, Any]) -> Chain:
        if not self.steps:
            return self
        return Chain(self.steps[0]._partial(args, kwargs, options), *self.steps[1:])

    def __repr__(self) -> str:
        return " | ".join(repr(s) for s in self.steps)


def chain(*steps: Any) -> Chain:
    """``chain(a, b, c)``: b gets a's result as its first argument, c gets b's."""
    return Chain(*steps)


def group(*tasks: Any) -> Group:
    """``group([a, b])`` or ``group(a, b)``: run side by side."""
    return Group(*tasks)


def chord(header: Any, body: Any = None) -> Chord:
    """``chord(group, callback)``: the callback gets the members' results, in order."""
    return Chord(header, body)


# -- building the workflow's rows -------------------------------------------------------------
#
# A canvas is compiled into steps: each canvas gives a *value* (a step: its result; a list
# of values: a group's), and a step fed a value either waits for one parent (the value is a
# step: its result is spliced in) or collects (the value is a list: each step in it fills
# its slot, and the server builds the list from the value's `shape`). A value is fed whole
# to the steps after it, so each step's result has one slot wherever it goes, and the rows
# keep the form they had when workflows were lines (`next`, one `slot`): the server's
# hand-over is unchanged but for the shape of what a step collects.

#: A canvas's value while building: a step (its result) or a list of values (a group's).
_Value = Union["_Step", list[Any]]


class _Step:
    __slots__ = ("sig", "job", "mode", "extra", "size", "children")

    def __init__(self, sig: Signature, job: NewJob, mode: str) -> None:
        self.sig, self.job, self.mode = sig, job, mode
        self.extra: dict[str, str] = {}
        self.size = len(job.payload.encode("utf-8"))
        #: the steps this step's result goes to
        self.children: list[str] = []


def _leaves(value: _Value) -> list[_Step]:
    if isinstance(value, _Step):
        return [value]
    return [leaf for v in value for leaf in _leaves(v)]


def _shape(value: _Value) -> str:
    """The value's JSON with a '#' where each step's result goes, in order."""
    if isinstance(value, _Step):
        return "#"
    return "[" + ",".join(_shape(v) for v in value) + "]"


def _walk(root: Canvas) -> Iterator[Canvas]:
    """Every canvas in ``root``, depth first (iterative: the depth is checked here, before
    anything recurses over it)."""
    todo: list[tuple[Canvas, int]] = [(root, 0)]
    while todo:
        node, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise WorkflowTooLarge(f"a workflow nested {depth} levels deep: at most "
                                   f"{MAX_DEPTH}")
        yield node
        children: list[Canvas] = (node.steps if isinstance(node, Chain) else
                                  node.tasks if isinstance(node, Group) else
                                  [node.header, *([node.body] if node.body else [])]
                                  if isinstance(node, Chord) else [])
        todo.extend((c, depth + 1) for c in reversed(children))


def _chord_body(root: Canvas) -> Signature | None:
    """The body of a workflow that is one chord (``chord(h, body)``, ``group | body``): its
    errback is the workflow's, as Celery's documents it (``group(...) |
    xsum.s().on_error(on_chord_error.s())``: run when a member fails, the body never will)."""
    if isinstance(root, Chord) and isinstance(root.body, Signature):
        return root.body
    if isinstance(root, Chain) and len(root.steps) == 2 and isinstance(root.steps[0], Group) \
            and isinstance(root.steps[1], Signature):
        return root.steps[1]
    return None


class _Builder:
    def __init__(self, root: Canvas, link_error: Signature | None, app: App | None) -> None:
        body = _chord_body(root)
        if body is not None and body._errback is not None:
            if link_error is not None and link_error is not body._errback:
                raise WorkflowError(f"two errbacks, {link_error!r} and {body._errback!r} on "
                                    f"the chord's body: one serves the whole workflow")
            link_error = body._errback
        sigs: list[Signature] = []
        for i, node in enumerate(_walk(root)):
            if isinstance(node, Signature):
                sigs.append(node)
            elif isinstance(node, Group) and not node.tasks:
                raise EmptyGroup("an empty group: nothing to run (a chord needs at least "
                                 "one member)")
            elif isinstance(node, Chain) and not node.steps:
                raise EmptyGroup("an empty chain: nothing to run")
            elif isinstance(node, Chord) and node.body is None:
                raise EmptyGroup("a chord without a body: chord(header, body), or call "
                                 "chord(header)(body)")
            if i and node._errback is not None and node is not body:
                raise WorkflowError(f"link_error on {node!r} inside a workflow: one errback "
                                    f"serves the whole workflow: set it on the outermost "
                                    f"canvas, the body of a chord that is the workflow, or "
                                    f"apply_async(link_error=...)")
        # counted before a row is built: the bound is on the work of one script call
        if len(sigs) > MAX_STEPS:
            raise WorkflowTooLarge(f"a workflow of {len(sigs)} steps: at most {MAX_STEPS}")
        self.root = root
        self.link_error = link_error
        self.app = app or self._app_of(sigs[0])
        self.limit = self.app.settings.max_payload_bytes
        #: The task of the first step: what the workflow's send span is named after.
        self.first = sigs[0].name
        #: The trace context every step carries (its enqueue's span): build() sets it.
        self.trace: dict[str, str] | None = None
        self.steps: list[_Step] = []

    @staticmethod
    def _app_of(sig: Signature) -> App:
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

    def _step(self, sig: Signature, mode: str, by_ack: bool = True) -> _Step:
        """A step's job and extras; ``mode`` "w": it waits, released by an ack (``by_ack``:
        its run's parent is then on its row) or by a failure (link_error)."""
        o = sig.options
        job = build_job(self._spec(sig), sig.args, sig.kwargs, limit=self.limit,
                        job_id=o.get("job_id"), group=o.get("group"),
                        countdown=o.get("countdown") if mode == "r" else None,
                        priority=o.get("priority", 0),
                        # a step an ack releases: its run reads its parent off its row
                        trace=tracing.released(self.trace) if mode == "w" and by_ack
                        else self.trace)
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

    def _compile(self, node: Canvas, source: _Value | None) -> _Value:
        """The steps of ``node`` fed ``source`` (None: they start at once); its value."""
        if isinstance(node, Signature):
            step = self._step(node, "r" if source is None else "w")
            self.steps.append(step)
            if source is not None:
                self._feed(source, step)
            return step
        if isinstance(node, Group):        # every member is fed the same value
            return [self._compile(t, source) for t in node.tasks]
        if isinstance(node, Chord):
            assert node.body is not None   # refused in __init__
            return self._compile(node.body, self._compile(node.header, source))
        value = source
        for s in node.steps:
            value = self._compile(s, value)
        assert value is not None           # a chain has steps (refused in __init__)
        return value

    def _feed(self, source: _Value, child: _Step) -> None:
        """Wire ``child`` to wait for ``source``: one parent, or every step of a group's
        value, each into its slot (by the group, not its size: a group of one gives [r0])."""
        if isinstance(source, _Step):
            source.children.append(child.job.id)
            child.extra["par"] = source.job.id
            self._fits(child, self._result_bytes(source.sig))
            return
        leaves, shape = _leaves(source), _shape(source)
        for i, p in enumerate(leaves):
            # a step's result has one place in one value, whichever steps collect it: one
            # `slot` on its row serves them all (the form rows had before trees)
            assert p.extra.get("slot", str(i)) == str(i)
            p.extra["slot"] = str(i)
            p.children.append(child.job.id)
        child.extra["par"] = " ".join(p.job.id for p in leaves)   # in slot order
        child.extra["npend"] = child.extra["nslots"] = str(len(leaves))
        if shape != "[" + ",".join("#" * len(leaves)) + "]":
            child.extra["shape"] = shape
        # the results go in as the shape, each '#' one result
        self._fits(child, len(shape) - len(leaves)
                   + sum(self._result_bytes(p.sig) for p in leaves))

    def build(self, workflow_id: str | None,
              trace: dict[str, str] | None = None) -> _Built:
        """Every row of the workflow, checked: what one call of the workflow verb writes.
        ``trace``: the trace context its steps carry (observe/tracing.py)."""
        self.trace = trace
        self.steps = []
        wf = check_job_id(workflow_id) if workflow_id is not None else new_job_id()
        value = self._compile(self.root, None)
        steps = self.steps
        queue_names = {self._spec(s.sig).queue for s in steps}
        if len(queue_names) > 1:
            raise WorkflowError("a workflow's steps must all use one queue")
        ids = [s.job.id for s in steps]
        if len(set(ids)) != len(ids) or wf in ids:
            raise InvalidJobId("a workflow's step ids (and its own id) must all differ")
        for s in steps:
            if s.children:
                s.extra["next"] = " ".join(s.children)
        lerr = None
        if self.link_error is not None:
            lerr = self._step(self.link_error, "w", by_ack=False)
            lerr.mode = "e"            # waiting, and expiring with the workflow's hash
            if not self.link_error.immutable and lerr.size + 130 > self.limit:
                raise WorkflowTooLarge("the link_error step's arguments leave no room for "
                                       "the failed step's id")
        for s in steps:
            s.extra["wf"] = wf
        waiting = [s.job.id for s in steps if s.mode == "w"]
        final = _leaves(value)
        meta = {"kind": "chain" if isinstance(value, _Step) else "group",
                "final": " ".join(s.job.id for s in final),
                "steps": " ".join(ids), "waiting": " ".join(waiting)}
        shape = _shape(value)
        if not isinstance(value, _Step) and shape != "[" + ",".join("#" * len(final)) + "]":
            meta["shape"] = shape          # nested lists: get() fills them in
        rows = list(steps)
        if lerr is not None:
            lerr.extra["wf"] = wf
            lerr.extra["errof"] = wf
            meta["lerr"] = lerr.job.id
            if lerr.job.id in ids or lerr.job.id == wf:
                raise InvalidJobId("the link_error step's id must differ from the steps'")
            rows.append(lerr)
        return _Built(self.app, self._spec(steps[0].sig).queue, wf, meta, rows)

    def _fits(self, child: _Step, incoming: int) -> None:
        if child.sig.immutable:
            return
        need = child.size + incoming + 1
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
        """The workflow's result as Celery gives it: a chain's last step's, a chord's body's,
        a group's members' results in order (a member chain's last: a list if a group).
        TaskFailed names the step that went dead (``job_id``); ResultTimeout when not
        finished within ``timeout`` seconds."""
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
        if meta.get("shape"):          # nested lists (a member chain ending in a group)
            return _fill(meta["shape"], results)
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


def _fill(shape: str, results: list[Any]) -> Any:
    """The value of a workflow's shape ('#' for each result, in order) with its results."""
    it = iter(results)

    def walk(x: Any) -> Any:
        return [walk(y) for y in x] if isinstance(x, list) else next(it)

    return walk(json.loads(shape.replace("#", "0")))
