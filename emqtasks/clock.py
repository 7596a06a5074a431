"""Steps of the server's clock: detected by the masters, reported by every view of a queue.

Every time a queue stores is the server's (lease deadlines, due times, rate windows, the
schedules' slots, result expiries), so a step of that clock (a `date -s`, a VM restored
from a snapshot, NTP stepping a clock that was far off, a failover to a replica whose clock
differs) moves all of them at once. Two things tell it:

- the queue's clock mark, the latest server time its reaps saw (hash ``clock``, field
  ``seen``, kept by reap.lua on every master's tick): a server clock behind it stepped
  back, and stays behind until it catches up;
- each master's monotonic clock between two ticks: a server clock that moved more or less
  than it, by more than STEP_TOLERANCE_MS beyond the round trips, stepped (either way).

A master that sees a step logs one line and records it on the queue (``step``, ``at``:
the step in ms, + forward, and the server time it was seen); ``stats()``, ``emqtasks
doctor`` and the dashboard show the mark being ahead and any step of the last day. What each
timing does across a step is in the README (*Clock steps*).
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .store.queue import Queue, Reaped

#: Differences smaller than this are noise (round trips, a master's thread scheduling), not
#: steps: NTP slews small offsets and steps only past 128 ms, and below 2 s no timing of a
#: queue changes its meaning (the shortest lease renewal period of a default task is 10 s).
STEP_TOLERANCE_MS = 2_000
#: How long a recorded step is reported after it was seen.
SHOWN_FOR_MS = 86_400_000

log = logging.getLogger("emqtasks.worker")


def elapsed() -> float:
    """Seconds on this host's clock that never steps and counts a suspended machine's sleep
    (Linux CLOCK_BOOTTIME; the monotonic clock elsewhere): a worker's laptop waking up must
    not look like the server's clock jumping."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(boottime) if boottime is not None else time.monotonic()


class ClockWatch:
    """One master's view of one queue's server clock, fed by each tick's reap."""

    def __init__(self) -> None:
        self._last: tuple[int, float, float] | None = None   # server ms, sent, answered
        self.ticks = 0

    def observe(self, reaped: Reaped, sent: float, answered: float) -> int:
        """The step this reading shows, in ms (+ forward, - back), or 0. ``sent`` and
        ``answered`` are the times (elapsed()) around the reap: the server read its clock
        somewhere between them."""
        now, step = reaped.server_ms, 0
        self.ticks += 1
        if self._last is None:
            if reaped.seen_ms and reaped.seen_ms - now > STEP_TOLERANCE_MS:
                step = now - reaped.seen_ms        # behind what the queue saw: stepped back
        else:
            last, last_sent, last_answered = self._last
            least = (sent - last_answered) * 1000   # the server's clock must have moved
            most = (answered - last_sent) * 1000    # between these, had it not stepped
            moved = now - last
            if moved > most + STEP_TOLERANCE_MS or moved < least - STEP_TOLERANCE_MS:
                step = round(moved - (least + most) / 2)
        self._last = (now, sent, answered)
        return step


def record(queue: Queue, step_ms: int, at_ms: int) -> None:
    """Note a step on the queue, for stats(), doctor and the dashboard (one HSET)."""
    queue.client.hset(queue.keys.clock, mapping={"step": step_ms, "at": at_ms})


def report(queue: Queue, step_ms: int, at_ms: int, first: bool = False) -> None:
    """A master saw a step: one log line, and the step recorded on the queue. ``first``:
    seen on the master's first tick (its clock behind the queue's mark), not between two."""
    way = "forward" if step_ms > 0 else "back"
    how = ("behind the latest time a reap of the queue saw" if first else
           "against this master's own clock since its last tick")
    log.warning("the clock of the server of queue %s stepped %s by %s (%s): timings stored "
                "before the step (leases, countdowns, rate windows, result expiries) are "
                "that much %s; see the README, 'Clock steps'", queue.name, way,
                span(step_ms), how, "nearer" if step_ms > 0 else "further off")
    record(queue, step_ms, at_ms)


def state(now_ms: int, seen: Any, step: Any, at: Any) -> dict[str, Any]:
    """What a view shows of a queue's clock, from the server's time and the clock hash's
    ``seen``, ``step`` and ``at``: ``behind_s`` (how far the server's clock is behind the
    latest time the queue saw, 0.0 when it is not), ``step_s`` / ``step_at`` (the last step
    a master saw within a day, else None) and ``warning`` (one line, or None)."""
    behind = max(0, _int(seen) - now_ms)
    if behind <= STEP_TOLERANCE_MS:
        behind = 0
    step_ms, at_ms = _int(step), _int(at)
    recent = bool(step_ms) and abs(now_ms - at_ms) < SHOWN_FOR_MS
    out: dict[str, Any] = {"behind_s": behind / 1000,
                           "step_s": step_ms / 1000 if recent else None,
                           "step_at": at_ms / 1000 if recent else None, "warning": None}
    if behind:
        out["warning"] = (f"the server's clock is {span(behind)} behind the latest time this "
                          f"queue saw (it was stepped back): leases, countdowns, rate limits "
                          f"and schedules wait that much longer, until it catches up")
    elif recent:
        when = datetime.fromtimestamp(at_ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        out["warning"] = (f"the server's clock stepped {'forward' if step_ms > 0 else 'back'} "
                          f"by {span(step_ms)} (seen at {when} UTC, server time)")
    return out


def read(queue: Queue) -> dict[str, Any]:
    """state() of a queue, read from its server (two round trips)."""
    seen, step, at = queue.client.hmget(queue.keys.clock, "seen", "step", "at")
    return state(queue.server_ms(), seen, step, at)


def span(ms: int) -> str:
    """A duration for a log line: 3.2s, 5m02s, 1h00m, 1d02h."""
    s = abs(ms) / 1000
    if s < 59.95:
        return f"{s:.1f}s"
    if round(s) < 3600:
        m, sec = divmod(round(s), 60)
        return f"{m}m{sec:02d}s"
    if round(s / 60) < 1440:
        h, m = divmod(round(s / 60), 60)
        return f"{h}h{m:02d}m"
    d, h = divmod(round(s / 3600), 24)
    return f"{d}d{h:02d}h"


def _int(value: Any) -> int:
    try:
        return int(float(value))
    except (TypeError, ValueError, OverflowError):
        return 0
