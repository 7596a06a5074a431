"""The master (the metronome): park on the wake key, fan readiness, renew, supervise, stop.

Two threads. The park thread owns the only blocking Redis call: it reaps and promotes on
the tick, and while some child is idle it parks on BLPOP of the wake key for as long as
nothing is due; a token it takes becomes a byte on the wake pipe. The main thread never
blocks on Redis: it selects over the children's pipes and sentinels, the wake pipe and the
signal pipe, fans readiness to idle children, renews leases, enforces time limits, fails
the job of a dead child and replaces it, and runs the shutdown.
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import multiprocess

from ..config import WorkerSettings
from ..errors import TimeLimitExceeded, WorkerLost
from ..queue import WAKE_DUE, Lease, Queue
from ..registry import Registry
from .child import GO, GOT_WORK, IDLE, STOP, Child
from .resilience import TRANSIENT, Outage
from .slots import Running, Slots

log = logging.getLogger("emqtasks.worker")
_ctx = multiprocess.get_context("fork")


class ChildHandle:
    """The master's view of one child process."""

    def __init__(self, index: int, process: Any, pipe: Any) -> None:
        self.index = index
        self.process = process
        self.pipe = pipe
        self.idle = True
        self.born = time.monotonic()
        self.backoff = 0.25
        self.kill_reason: str | None = None
        self.limited: tuple[str, str] | None = None   # (id, nonce) past its time limit
        self.kill_at = 0.0                              # ... SIGKILLed if still running then
        self.renewed: dict[tuple[str, str], float] = {}


class Master:
    """Runs a pool of N children on one queue until told to stop."""

    #: Seconds between the SIGTERM that stops a job at its time limit (it raises
    #: TimeLimitExceeded in the task) and the SIGKILL for a task that did not stop.
    time_limit_grace = 1.0

    def __init__(self, make_queue: Callable[[], Queue], settings: WorkerSettings,
                 registry: Registry) -> None:
        self.make_queue = make_queue
        self.registry = registry
        self.settings = settings
        self.queue = make_queue()
        self.outage = Outage(log, "master", stop=self._give_up)
        self.slots = Slots(settings.concurrency)
        self.children: list[ChildHandle | None] = [None] * settings.concurrency
        self.selector = selectors.DefaultSelector()
        self.has_idle = threading.Event()
        self.park_stop = threading.Event()
        self.stats = {"started": 0, "died": 0, "replaced": 0, "time_limited": 0}
        self._stopping = False
        self._hard_stop = False
        self._respawn_at: dict[int, tuple[float, float]] = {}   # index -> (when, backoff)
        self._term_at = 0.0   # when the first SIGTERM / SIGINT arrived (set by the handler)
        self._grace_deadline = 0.0
        self._signal_r, self._signal_w = os.pipe()
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._signal_r, self._signal_w, self._wake_r, self._wake_w):
            os.set_blocking(fd, False)

    # -- lifecycle --------------------------------------------------------------------
    def run(self) -> int:
        self._install_signals()
        # Recover and promote before anyone claims; also proves the scripts run.
        self._reap(self.queue)
        self._promote(self.queue)
        for index in range(self.settings.concurrency):
            self._spawn(index)
        self.selector.register(self._signal_r, selectors.EVENT_READ, "signal")
        self.selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        park = threading.Thread(target=self._park_loop, name="emq-park", daemon=True)
        park.start()
        self._fan()  # work may already be waiting: a restarted pool must not need a wake
        try:
            while self._alive_children():
                try:
                    self._step()
                except Exception:   # e.g. an OOM reply to a renewal: keep supervising
                    log.exception("master loop error; carrying on")
                    time.sleep(0.5)
        finally:
            self.park_stop.set()
            self.has_idle.set()
            park.join(timeout=1.0)
        log.info("stopped: %(started)d children started, %(died)d died, "
                 "%(time_limited)d stopped at their time limit", self.stats)
        return 0

    def _install_signals(self) -> None:
        def on_signal(signum: int, _frame: Any) -> None:
            # The main loop dispatches; the flags only let a Redis retry loop that holds
            # the main thread give up (see _give_up), so a stop works during an outage.
            if not self._term_at:
                self._term_at = time.monotonic()
            elif signum == signal.SIGINT:
                self._hard_stop = True
            os.write(self._signal_w, bytes([signum]))

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    def _spawn(self, index: int, backoff: float = 0.25) -> None:
        master_end, child_end = _ctx.Pipe(duplex=True)
        self.slots.reset(index)
        child = Child(index, child_end, self.slots, self.make_queue, os.getpid(),
                      self.settings.max_tasks_per_child, self.settings.time_limit,
                      self.registry)
        others = [h.pipe.fileno() for h in self.children if h is not None]
        process = _ctx.Process(target=_child_entry, args=(child, master_end.fileno(), others),
                               name=f"emqtasks-child-{index}", daemon=False)
        signals = {signal.SIGINT, signal.SIGTERM}
        old = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
        try:
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        child_end.close()
        handle = ChildHandle(index, process, master_end)
        handle.backoff = backoff
        self.children[index] = handle
        self.selector.register(master_end, selectors.EVENT_READ, ("pipe", index))
        self.selector.register(process.sentinel, selectors.EVENT_READ, ("exit", index))
        self.stats["started"] += 1
        self.has_idle.set()

    def _give_up(self) -> bool:
        """Stop retrying Redis: a hard stop, or a stop asked for and its grace run out."""
        return self._hard_stop or (
            bool(self._term_at) and time.monotonic() > self._term_at + self.settings.grace)

    def _alive_children(self) -> bool:
        return any(h is not None for h in self.children) or (
            bool(self._respawn_at) and not self._stopping)

    def _note_idle(self) -> None:
        """has_idle says whether the park thread may take a wake: some child is idle."""
        if any(h is not None and h.idle for h in self.children):
            self.has_idle.set()
        else:
            self.has_idle.clear()

    # -- the main loop ----------------------------------------------------------------
    def _step(self) -> None:
        busy = any(h is not None and not h.idle for h in self.children)
        timeout = 0.1 if (busy or self._stopping) else 1.0
        for key, _ in self.selector.select(timeout):
            tag = key.data
            if tag == "signal":
                self._on_signals()
            elif tag == "wake":
                self._on_wake()
            elif tag[0] == "pipe":
                self._on_message(tag[1], key.fileobj)
            elif tag[0] == "exit":
                self._on_exit(tag[1])
        self._supervise_running()
        self._respawn_due()
        if self._stopping and not self._hard_stop and time.monotonic() > self._grace_deadline:
            log.warning("grace period over: stopping children now")
            self._kill_all()

    def _on_signals(self) -> None:
        try:
            received = os.read(self._signal_r, 64)
        except BlockingIOError:
            return
        for signum in received:
            if signum in (signal.SIGTERM, signal.SIGINT):
                if not self._stopping:
                    self._begin_warm_stop(signal.Signals(signum).name)
                elif signum == signal.SIGINT:
                    log.warning("second interrupt: stopping children now")
                    self._kill_all()

    def _begin_warm_stop(self, why: str) -> None:
        log.info("%s: finishing running jobs (grace %.1fs)", why, self.settings.grace)
        self._stopping = True
        self._grace_deadline = time.monotonic() + self.settings.grace
        self.slots.set_stopping()
        self.park_stop.set()
        self.has_idle.set()
        for h in self.children:
            if h is not None and h.idle:
                _send(h.pipe, STOP)

    def _on_wake(self) -> None:
        try:
            os.read(self._wake_r, 64)
        except BlockingIOError:
            return
        if self._stopping or not self._fan():
            self._call(self.queue.push_wake)   # not ours to use: hand it on

    def _fan(self) -> bool:
        """Wake one idle child; it recruits the next by reporting GOT_WORK, so a lone job
        costs one claim, and a burst still has every child busy within a few claims.
        False when no child was idle."""
        woken = False
        for h in self.children:
            if h is not None and h.idle and h.process.is_alive():
                if woken:
                    self.has_idle.set()   # more idle children: keep listening for wakes
                    return True
                h.idle = False
                _send(h.pipe, GO)
                woken = True
        self.has_idle.clear()
        return woken

    def _on_message(self, index: int, pipe: Any = None) -> None:
        h = self.children[index]
        if h is None or (pipe is not None and pipe is not h.pipe):
            # The EOF of a child that exited and was replaced earlier in this same select
            # batch: reading the replacement's pipe here would block the main loop.
            return
        try:
            message = h.pipe.recv_bytes()
        except (EOFError, OSError):
            self.selector.unregister(h.pipe)
            return
        if message == IDLE:
            h.idle = True
            if self._stopping:
                _send(h.pipe, STOP)
            else:
                self.has_idle.set()
        elif message == GOT_WORK and not self._stopping and not self._fan():
            # More work than this pool can take: let another master have a look too.
            self._call(self.queue.push_wake)

    def _on_exit(self, index: int) -> None:
        h = self.children[index]
        if h is None:
            return
        self.selector.unregister(h.process.sentinel)
        try:
            self.selector.unregister(h.pipe)
        except (KeyError, ValueError):
            pass
        h.process.join(timeout=1.0)
        code = h.process.exitcode
        running = self.slots.read(index)
        try:
            if running is not None:
                self._settle_lost_job(h, running, code)
            elif code not in (0, None):
                log.warning("child %d (pid %s) exited with %s", index, h.process.pid, code)
        except Exception:
            log.exception("could not settle the job of child %d; its lease will expire", index)
        finally:
            h.pipe.close()
            self.children[index] = None
        if not self._stopping:
            # A child that dies young with no job (a refused AUTH, a broken import) must
            # not be forked again in a tight loop: wait, doubling up to 10 s.
            lived = time.monotonic() - h.born
            delay = 0.0 if lived > 5 or running is not None else min(10.0, h.backoff * 2)
            self._respawn_at[index] = (time.monotonic() + delay, delay or 0.25)

    def _respawn_due(self) -> None:
        now = time.monotonic()
        for index, (when, backoff) in list(self._respawn_at.items()):
            if now < when or self._stopping:
                continue
            del self._respawn_at[index]
            self.stats["replaced"] += 1
            self._spawn(index, backoff)
            # No wake may be coming for work the old child left in the lanes.
            child = self.children[index]
            assert child is not None
            child.idle = False
            _send(child.pipe, GO)
            self._note_idle()

    def _settle_lost_job(self, h: ChildHandle, running: Running, code: int | None) -> None:
        lease = running.lease
        reason = h.kill_reason if h.limited == (lease.id, lease.nonce) else None
        if self._hard_stop and reason is None:
            ok = self._call(self.queue.release, lease, "released: worker stopped mid-job")
            log.warning("job %s released back to its lane at shutdown (%s)", lease.id,
                        "ok" if ok else "already settled")
            return
        self.stats["died"] += 1
        if reason is not None:
            error = reason
        else:
            how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            error = (f"{WorkerLost.__name__}: child pid {h.process.pid} died "
                     f"({how}) while running the job")
        verdict = self._call(self.queue.retry, lease, error, None, False)
        log.warning("job %s failed, %s: %s", lease.id,
                    verdict.outcome, error)

    # -- leases and limits --------------------------------------------------------------
    def _supervise_running(self) -> None:
        now = time.monotonic()
        due: list[Lease] = []
        for h in self.children:
            if h is None or h.idle or not h.process.is_alive():
                continue   # a dead child's job is settled by _on_exit, never renewed
            running = self.slots.read(h.index)
            if running is None:
                h.renewed.clear()
                continue
            lease = running.lease
            key = (lease.id, lease.nonce)
            if running.time_limit > 0 and now - running.started > running.time_limit:
                if h.limited != key:
                    # SIGTERM first: the child raises TimeLimitExceeded in the task, fails
                    # the job through the fence and stays to serve the next one.
                    h.limited, h.kill_at = key, now + self.time_limit_grace
                    h.kill_reason = (f"{TimeLimitExceeded.__name__}: ran past its time "
                                     f"limit of {running.time_limit:g}s")
                    self.stats["time_limited"] += 1
                    self.slots.flag_time_limit(h.index, lease.nonce)
                    h.process.terminate()
                elif now >= h.kill_at:
                    # A task blocked in C, or one that swallowed the exception: kill it.
                    h.process.kill()
                    continue
            last = h.renewed.get(key, running.started)
            every = self.settings.renew_every or lease.lease_ms / 3000
            if now - last >= every:
                h.renewed = {key: now}
                due.append(lease)
        if due:
            self._call(self.queue.extend, due)

    def _kill_all(self) -> None:
        self._hard_stop = True
        for h in self.children:
            if h is not None and h.process.is_alive():
                h.process.kill()

    # -- the park thread -----------------------------------------------------------------
    def _park_loop(self) -> None:
        outage = Outage(log, "park", stop=self.park_stop.is_set)
        try:
            # Its own connection: BLPOP holds it. A cluster client connects as it is made,
            # so a server down right now is an outage to ride out, as in a child.
            queue = outage.call(self.make_queue)
        except TRANSIENT:
            return   # stopped before the server came back
        tick = self.settings.tick
        next_reap = time.monotonic() + tick
        next_promote = next_reap
        while not self.park_stop.is_set():
            try:
                now = time.monotonic()
                if now >= next_reap:
                    outage.call(self._reap, queue)
                    next_reap = now + tick
                if now >= next_promote:
                    due_in, claimable = outage.call(self._promote, queue)
                    # While children are busy nobody parks to hear of new delayed work,
                    # so look at least every second; an idle pool hears it on the wake key.
                    look = tick if self.has_idle.is_set() else min(tick, 1.0)
                    next_promote = now + min(look, due_in if due_in is not None else look)
                    if claimable and self.has_idle.is_set() and not self.park_stop.is_set():
                        # Work waits on the ring while a child idles: its wake token was
                        # lost (a BLPOP reply dropped with the connection, a master killed
                        # holding it). Tokens are hints; the ring is the truth.
                        self.has_idle.clear()
                        os.write(self._wake_w, b"w")
                        continue
                horizon = max(min(next_reap, next_promote) - time.monotonic(), 0.001)
                if not self.has_idle.wait(horizon) or self.park_stop.is_set():
                    continue
                token = outage.call(queue.park, horizon)
                if token == WAKE_DUE:
                    next_promote = 0.0
                elif token is not None:
                    if self.park_stop.is_set():
                        outage.call(queue.push_wake)
                        break
                    self.has_idle.clear()
                    os.write(self._wake_w, b"w")
            except TRANSIENT:
                continue   # only when stopping; the outage already logged it
            except Exception:
                log.exception("park loop error; carrying on")
                self.park_stop.wait(1.0)

    def _reap(self, queue: Queue) -> None:
        returned, dead = queue.reap()
        if returned or dead:
            log.info("reaped expired leases: %d back to their lanes, %d dead", returned, dead)

    def _promote(self, queue: Queue) -> tuple[float | None, bool]:
        """Promote every due job; returns (seconds until the next is due or None, whether
        a claim would find work now)."""
        _, due_in, claimable = queue.promote_and_look()
        while due_in == 0:
            _, due_in, claimable = queue.promote_and_look()
        return due_in, claimable

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.outage.call(fn, *args)


def _send(pipe: Any, message: bytes) -> None:
    try:
        pipe.send_bytes(message)
    except (BrokenPipeError, OSError):
        pass   # the child is gone; its sentinel tells the rest


def _child_entry(child: Child, master_end_fd: int, others: list[int]) -> None:
    for fd in [master_end_fd, *others]:
        try:
            os.close(fd)   # so our master's death reads as EOF, and so do siblings'
        except OSError:
            pass
    child.main()
