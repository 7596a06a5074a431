"""A verb as a plan: the commands it sends, and what it makes of their replies, with no I/O.

A verb that both the blocking ``Queue`` and its ``redis.asyncio`` twin (aqueue.py) run is
written once, as a generator of *steps*: it yields each command it needs (an ``Op`` below)
and gets its reply back (or the error it raised, thrown in at the yield), and returns the
verb's answer. ``run`` sends the steps on a redis-py client here; aqueue.py's ``arun`` awaits
them on a ``redis.asyncio`` client. So a verb's validation, keys, arguments, choice of path
(a hot verb through the module or its script) and decoding of the reply are in one place,
and the two runners only do I/O.

A plan that queues reads on a pipeline (``queue_books(pipe, keys)`` and the like) fills a
``Recorder`` and yields ``Pipe(recorder.cmds)``: the same function serves both.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any, NamedTuple, TypeVar

from redis import ConnectionPool
from redis.exceptions import ReadOnlyError, ResponseError

from .cluster import node_client, node_kwargs, scan_keys
from .connection import pool_wait

T = TypeVar("T")


class Cmd(NamedTuple):
    """One command by its redis-py method name (``hgetall``, ``time``...); with ``node``, a
    server-level command sent to the node holding that key (a cluster's, cluster.py)."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}
    node: str | None = None


def cmd(name: str, *args: Any, **kwargs: Any) -> Cmd:
    return Cmd(name, args, kwargs)


class Pipe(NamedTuple):
    """Commands in one round trip (a pipeline, not a transaction, on one connection); the
    reply is the list of theirs, an error in its place when ``raise_on_error`` is False.
    With ``near`` (a key), on a cluster it goes to the node holding that key (cluster.py)."""

    cmds: Sequence[Cmd]
    raise_on_error: bool = True
    near: str | None = None


class Hot(NamedTuple):
    """A hot verb: the module's EMQ.* command when the server has it, else the script
    (selection.py)."""

    verb: str
    keys: Sequence[str]
    args: Sequence[Any]


class Script(NamedTuple):
    """A verb that is a script only (scripts.py): EVALSHA, EVAL on NOSCRIPT."""

    verb: str
    keys: Sequence[str]
    args: Sequence[Any]


class Pop(NamedTuple):
    """BLPOP of ``keys`` for up to ``timeout`` seconds (blpop's rules)."""

    keys: Sequence[str]
    timeout: float


class Scan(NamedTuple):
    """The keys matching ``match`` on the server holding ``near`` (cluster.scan_keys)."""

    match: str
    near: str


class Bounded(NamedTuple):
    """``op``, waiting at most ``seconds`` for a free connection of a busy pool (PoolBusy)."""

    op: Op
    seconds: float | None


class Routing(NamedTuple):
    """The runner's choice of path for the hot verbs (its selection.Route), for a plan that
    sends a hot verb in a pipeline of its own (waits.py: a durable write and its wait)."""


Op = Cmd | Pipe | Hot | Script | Pop | Scan | Bounded | Routing
#: A verb's plan: yields Ops, is sent their replies, returns the verb's answer.
Steps = Generator[Op, Any, T]


class Recorder:
    """A stand-in for a pipeline: each method called on it is recorded as a Cmd."""

    def __init__(self) -> None:
        self.cmds: list[Cmd] = []

    def __getattr__(self, name: str) -> Any:
        def record(*args: Any, **kwargs: Any) -> Recorder:
            self.cmds.append(Cmd(name, args, kwargs))
            return self
        return record


def advance(steps: Steps[T], reply: Any, error: BaseException | None) -> Op:
    """The plan's next Op, given the last one's reply or error (StopIteration at its end)."""
    return steps.send(reply) if error is None else steps.throw(error)


def run(steps: Steps[T], client: Any, scripts: Any = None, hot: Any = None) -> T:
    """Carry a plan out on a redis-py client (``scripts`` and ``hot``: a Queue's, for the
    plans that run verbs)."""
    reply: Any = None
    error: Exception | None = None
    while True:
        try:
            op = advance(steps, reply, error)
        except StopIteration as stop:
            value: T = stop.value
            return value
        try:
            reply, error = execute(op, client, scripts, hot), None
        except Exception as exc:     # the plan decides: it is thrown in at its yield
            reply, error = None, exc


def execute(op: Op, client: Any, scripts: Any, hot: Any) -> Any:
    """One Op on a redis-py client."""
    if isinstance(op, Cmd):
        extra = node_kwargs(client, op.node) if op.node is not None else {}
        return getattr(client, op.name)(*op.args, **op.kwargs, **extra)
    if isinstance(op, Pipe):
        pipe = node_client(client, op.near).pipeline(transaction=False)
        for c in op.cmds:
            getattr(pipe, c.name)(*c.args, **c.kwargs)
        return pipe.execute(raise_on_error=op.raise_on_error)
    if isinstance(op, Hot):
        return hot.call(op.verb, op.keys, op.args)
    if isinstance(op, Routing):
        return hot
    if isinstance(op, Script):
        return getattr(scripts, op.verb)(op.keys, op.args)
    if isinstance(op, Pop):
        return blpop(client, op.keys, op.timeout)
    if isinstance(op, Scan):
        return list(scan_keys(client, op.match, op.near))
    with pool_wait(op.seconds):
        return execute(op.op, client, scripts, hot)


def block_seconds(timeout: float) -> float:
    """A BLPOP timeout that never means "for ever": Redis 6.2 truncates seconds x 1000 to
    whole ms, so 0.001 can become 0, which blocks indefinitely."""
    return max(timeout, 0.01)


def blpop(client: Any, keys: Sequence[str], timeout: float, bound: float | None = None) -> Any:
    """BLPOP; a pop that the server broke off because it stopped being a primary (REPLICAOF,
    a failover: "UNBLOCKED ... master -> replica") raises ReadOnlyError, what the next write
    to that server gets: an outage the worker rides out, not an error of its own.

    With ``bound`` (seconds, on this host's clock) a pop not answered by then raises
    TimeoutError and its connection is closed: a server times a BLPOP by its wall clock,
    so one whose clock was stepped back holds every pop that much longer. Not on a cluster
    client (its connections are the nodes'): there the pop is not bounded."""
    block = block_seconds(timeout)
    single = getattr(client, "connection", None)
    pool = getattr(client, "connection_pool", None)
    try:
        if bound is None or (single is None and not isinstance(pool, ConnectionPool)):
            return client.blpop(keys, timeout=block)
        conn: Any = single or pool.get_connection()   # type: ignore[union-attr]
        try:
            conn.send_command("BLPOP", *keys, block)
            return conn.read_response(timeout=bound)   # a timeout closes the connection
        finally:
            if single is None:
                pool.release(conn)   # type: ignore[union-attr]
    except ResponseError as exc:
        if str(exc).startswith("UNBLOCKED"):
            raise ReadOnlyError(str(exc)) from exc
        raise
