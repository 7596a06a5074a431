"""The fault tests' shared machinery: what the fault tasks recorded (Rec, Notes), workers on
the fault task modules, batch enqueue, waits, the invariant check, a relay that loses a reply
on purpose, and a sampler of where each id is.

Every fault test runs real processes against a real redis-server, is bounded in time, and
ends with the invariant checker clean. Tests that kill, restart, flush or CLIENT KILL the
server, or measure its memory, take a server of their own.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import redis
from workerproc import WorkerProc

from emqtasks import App
from emqtasks.native import COMMANDS
from emqtasks.observe.lanes import stats as queue_stats
from emqtasks.ops.check import check
from emqtasks.producer.task import Task, build_job
from emqtasks.store.functions import function_name
from emqtasks.store.queue import Queue
from emqtasks.store.scripts import VERBS, source

#: The logger the tests hand to Outage when they call a verb the way a child does.
log = logging.getLogger("test_faults")


def assert_clean(queue: Queue) -> None:
    report = check(queue)
    assert report.ok, "invariants broken:\n" + "\n".join(report.violations)


# -- what the fault tasks recorded -------------------------------------------------------

class Rec:
    """What the fault tasks recorded for one queue (``t:<queue>:*``)."""

    def __init__(self, client: Any, queue: str) -> None:
        self.r = client
        self.prefix = f"t:{queue}:"

    def runs(self, tag: str) -> int:
        return int(self.r.hget(self.prefix + "runs", tag) or 0)

    def starts(self, tag: str) -> int:
        return int(self.r.hget(self.prefix + "starts", tag) or 0)

    def pid(self, tag: str) -> int:
        return int(self.r.hget(self.prefix + "pid", tag) or 0)

    def all_runs(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.r.hgetall(self.prefix + "runs").items()}

    def all_starts(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.r.hgetall(self.prefix + "starts").items()}

    def clear(self) -> None:
        for key in self.r.scan_iter(match=self.prefix + "*"):
            self.r.delete(key)


class Notes(Rec):
    """Rec, plus the other fields the tasks of fault_tasks_more note by tag."""

    def note(self, name: str, tag: str) -> str | None:
        return self.r.hget(self.prefix + name, tag)  # type: ignore[no-any-return]


def recorded(app: App) -> Iterator[Notes]:
    """The body of a fault file's ``rec`` fixture: the records of the app's queue, cleared
    after the test."""
    notes = Notes(app.client, app.settings.queue)
    yield notes
    notes.clear()


# -- workers, jobs, waits ----------------------------------------------------------------

def start_worker(url: str, queue: str, *extra: str, concurrency: int = 2,
                 tick: float = 0.1, module: str = "fault_tasks",
                 whole_pool: bool = False) -> WorkerProc:
    w = WorkerProc(url, queue, *extra, concurrency=concurrency, tick=tick, modules=(module,))
    try:
        w.wait_ready()
        if whole_pool:
            w.wait_for(lambda: len(w.children()) == concurrency, what="the whole pool")
    except BaseException:
        w.__exit__(None, None, None)
        raise
    return w


def start_more_worker(url: str, queue: str, *extra: str, concurrency: int = 2,
                      tick: float = 0.1) -> WorkerProc:
    """A worker on fault_tasks_more, ready with its whole pool up."""
    return start_worker(url, queue, *extra, concurrency=concurrency, tick=tick,
                        module="fault_tasks_more", whole_pool=True)


def summary(w: WorkerProc) -> dict[str, int]:
    """The counts of the master's shutdown line ("stopped: N children started, ...")."""
    out = w.log_path.read_text()
    m = re.search(r"stopped: (\d+) children started, (\d+) died, (\d+) stopped at their "
                  r"time limit", out)
    assert m, f"no shutdown line; log:\n{out[-3000:]}"
    return dict(zip(("started", "died", "time_limited"), map(int, m.groups())))


def enqueue(app: App, task: Task, calls: Iterable[Sequence[Any]], **opts: Any) -> list[str]:
    """Batch enqueue (one round trip, as Task.map) on the given app's queue; returns ids."""
    jobs = [build_job(task.spec, tuple(c), {}, limit=app.settings.max_payload_bytes, **opts)
            for c in calls]
    app.queue().enqueue_many(jobs)
    return [j.id for j in jobs]


def wait_until(predicate: Callable[[], object], timeout: float, what: str,
               worker: WorkerProc | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            tail = f"\nworker log:\n{worker.output()[-4000:]}" if worker else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{tail}")
        time.sleep(0.02)


def quiet(queue: Queue) -> bool:
    s = queue_stats(queue)
    return s["pending"] == 0 and s["active"] == 0 and s["delayed"] == 0


def reaped_then_completed(queue: Queue, job_id: str) -> None:
    """An orphaned lease (its holder never heard of it) expires, the reaper returns it with
    its attempt given back (nobody was seen running it), and its next claim, the first
    attempt again, runs to completion; the queue is whole after each step."""
    time.sleep(0.4)   # the server clock must pass the short lease these tests use
    assert queue.reap() == (1, 0)
    (lease,) = queue.claim()
    assert (lease.id, lease.attempts, lease.fence) == (job_id, 1, 2)
    assert queue.ack(lease, "null") == (True, None)
    assert_clean(queue)


def is_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def rss_mb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    return 0


def preload_scripts(client: Any) -> None:
    for name in VERBS:
        client.script_load(source(name))


def verb_marker(q: Queue, verb: str) -> bytes:
    """What marks a verb's request on the wire: its EMQ.* command on the native path (known
    once the queue ran a hot verb), its function's name where the scripts go by FCALL (the
    library, known once the queue ran a script), else its script's SHA."""
    if q.hot.native:
        return COMMANDS[verb].encode()
    if q.scripts.functions is not None and q.scripts.functions.usable:
        return function_name(verb).encode()
    return str(getattr(q.scripts, verb).sha).encode()


# -- a relay that loses a reply, a sampler of where ids are ------------------------------

class Relay:
    """A TCP relay in front of a Redis server that can lose one reply on purpose.

    ``arm(marker)``: the next request whose bytes contain ``marker`` is forwarded, the
    server's reply to it is read and thrown away, and both sides of that connection are
    closed: the command was applied, its caller sees a dropped connection.
    """

    def __init__(self, port: int) -> None:
        self.target = ("127.0.0.1", port)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.marker: bytes | None = None
        self.victim = threading.Event()    # a matching request was sent on
        self.dropped = threading.Event()   # and its reply thrown away
        self.closed = False
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def arm(self, marker: bytes) -> None:
        with self.lock:
            self.marker = marker
            self.victim.clear()
            self.dropped.clear()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.socks += [client, upstream]
            state = {"drop": False}
            threading.Thread(target=self._up, args=(client, upstream, state),
                             daemon=True).start()
            threading.Thread(target=self._down, args=(client, upstream, state),
                             daemon=True).start()

    @staticmethod
    def _close(*socks: socket.socket) -> None:
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def _up(self, client: socket.socket, upstream: socket.socket, state: dict) -> None:
        try:
            while data := client.recv(65536):
                with self.lock:
                    if self.marker is not None and self.marker in data:
                        self.marker = None
                        state["drop"] = True
                        self.victim.set()
                upstream.sendall(data)
        except OSError:
            pass
        self._close(client, upstream)

    def _down(self, client: socket.socket, upstream: socket.socket, state: dict) -> None:
        try:
            while data := upstream.recv(65536):
                if state["drop"]:
                    self.dropped.set()
                    break
                client.sendall(data)
        except OSError:
            pass
        self._close(client, upstream)

    def close(self) -> None:
        self.closed = True
        self.listener.close()
        with self.lock:
            self._close(*self.socks)


class Places:
    """Samples, in MULTI snapshots, where each id of some groups is: lanes, active, delayed,
    dead. Records any id seen in two places at once, and each id's delayed score."""

    def __init__(self, url: str, q: Queue, groups: list[str], every: float = 0.01) -> None:
        self.client = redis.Redis.from_url(url, decode_responses=True)
        self.k, self.groups, self.every = q.keys, groups, every
        self.overlaps: list[tuple[str, list[str]]] = []
        self.delayed_at: dict[str, float] = {}
        self.samples = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        k = self.k
        while not self.stop.wait(self.every):
            pipe = self.client.pipeline(transaction=True)
            for g in self.groups:
                pipe.zrange(k.lane(g), 0, -1)
            pipe.zrange(k.active, 0, -1)
            pipe.zrange(k.delayed, 0, -1, withscores=True)
            pipe.zrange(k.dead, 0, -1)
            *lanes, active, delayed, dead = pipe.execute()
            seen: dict[str, list[str]] = {}
            for g, ids in zip(self.groups, lanes):
                for i in ids:
                    seen.setdefault(i, []).append(f"lane {g}")
            for i in active:
                seen.setdefault(i, []).append("active")
            for i, score in delayed:
                seen.setdefault(i, []).append("delayed")
                self.delayed_at[i] = max(score, self.delayed_at.get(i, 0))
            for i in dead:
                seen.setdefault(i, []).append("dead")
            self.overlaps.extend((i, p) for i, p in seen.items() if len(p) > 1)
            self.samples += 1

    def __enter__(self) -> Places:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)
        self.client.close()
