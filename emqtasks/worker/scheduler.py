"""The master's periodic schedules: fire each due slot once per master; the id dedupes.

Every master keeps every schedule of its queue whose task it serves, and enqueues each slot
as it falls due with the id ``sched:<name>:<slot>`` through lua/schedule.lua, which refuses
a slot that any master handled already: several masters cost one script call per slot
each, and the server keeps one job. No beat, no lock, no leader.

The park thread calls ``run_due`` on its tick (``look``: one GET of the schedules' version
counter, and a re-read only when it moved) and when the next slot is due, and folds the
answer (seconds until the next slot) into its park timeout: an idle master adds one GET per
tick and one script call per slot, nothing else. Slots are judged by the server's clock:
the master keeps an estimate (monotonic clock + the offset the last reply showed), and the
script refuses a slot that is early.

Catch-up: slots missed while no master ran are the ones between the schedule's marker (the
latest slot handled) and the moment this master loaded it; ``latest`` enqueues the most
recent, ``all`` each of them (at most CATCHUP_MAX, else only the latest, with a warning),
``none`` none. After that, every slot that falls due while this master runs is fired.

When the master traces (the tasks module installed an SDK), each firing is a new trace: a
``send`` span whose context the slot's job carries, so its run is traced like a sent job's.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass

from .. import serialization
from ..errors import EmqError, ServerFull
from ..observe import tracing
from ..producer.registry import Registry
from ..schedules.schedule import (
    CATCHUP_MAX,
    Fired,
    Schedule,
    ScheduleStore,
    build_slot_job,
    slot_id,
)
from ..store.queue import NewJob, Queue
from ..verdicts import FireVerdict
from .resilience import TRANSIENT

log = logging.getLogger("emqtasks.schedules")
_UNREAD = object()
#: A slot is fired this long after the server's clock reaches it (estimates are in ms).
_MARGIN = 0.002
#: How long a schedule whose fire raised waits before it is tried again.
_HOLD = 1.0


@dataclass
class Entry:
    """One schedule as this master keeps it."""

    schedule: Schedule
    job: NewJob          # the row of a slot, id and countdown filled per slot
    next: int            # the next slot to fire (UNIX s)
    hold: float = 0.0    # server seconds before which a failing schedule is not retried


class Scheduler:
    """The schedules of one queue, for one master's park thread (not thread-safe)."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.entries: dict[str, Entry] = {}
        self.offset: float | None = None   # server seconds minus time.monotonic()
        self._version: object = _UNREAD
        self._stores: dict[int, ScheduleStore] = {}
        self._noted: set[str] = set()      # log lines said once
        self._told_tasks = False           # whether this master noted its tasks on the queue

    # -- the hook ------------------------------------------------------------------------
    def run_due(self, queue: Queue, look: bool = True) -> float:
        """Fire every due slot; with ``look``, pick up changed schedules (one GET unless
        they changed). Returns the seconds until the next slot is due (inf: none)."""
        store = self._store(queue)
        if self._version is _UNREAD or look:
            version = store.version()
            if version != self._version or self.offset is None:
                self._reload(store, version)
        now = self.server_now()
        for entry in list(self.entries.values()):
            if entry.next <= now and entry.hold <= now:
                self._fire_due(store, entry)
        return self.due_in()

    def due_in(self) -> float:
        """Seconds until the next slot (or held schedule) is due; inf when there is none."""
        if not self.entries:
            return float("inf")
        now = self.server_now()
        soonest = min(max(e.next, e.hold) for e in self.entries.values())
        return max(0.0, soonest - now + _MARGIN)

    def server_now(self) -> float:
        return time.monotonic() + (self.offset or 0.0)

    # -- loading -------------------------------------------------------------------------
    def _store(self, queue: Queue) -> ScheduleStore:
        store = self._stores.get(id(queue))
        if store is None or store.queue is not queue:
            store = self._stores[id(queue)] = ScheduleStore(queue)
        return store

    def _reload(self, store: ScheduleStore, version: str | None) -> None:
        schedules, bad = store.load()
        if (schedules or bad) and not self._told_tasks:
            # The queue uses schedules now: let the CLI know what this worker serves.
            store.note_tasks([t.spec for t in self.registry.tasks().values()])
            self._told_tasks = True
        for name, why in bad.items():
            self._note(f"bad:{name}:{why}", "schedule %r is not readable, skipped: %s",
                       name, why)
        state = store.state()
        before = time.monotonic()
        t0 = store.server_seconds()
        self.offset = t0 - (before + time.monotonic()) / 2
        kept: dict[str, Entry] = {}
        for name, s in sorted(schedules.items()):
            old = self.entries.get(name)
            if old is not None and old.schedule == s:
                kept[name] = old
                continue
            last = int(state.get(name, {}).get("last", int(t0)))
            entry = self._entry(s, last, int(t0))
            if entry is not None:
                kept[name] = entry
                self._catch_up(store, entry, last, int(t0))
        gone = sorted(set(self.entries) - set(kept))
        if gone or any(self.entries.get(n) is not e for n, e in kept.items()):
            log.info("schedules kept by this master: %s%s", ", ".join(kept) or "none",
                     f" (dropped {', '.join(gone)})" if gone else "")
        self.entries = kept
        self._version = version

    def _entry(self, s: Schedule, last: int, t0: int) -> Entry | None:
        if s.task not in self.registry:
            self._note(f"task:{s.name}:{s.task}", "schedule %r: task %s is not registered "
                       "in this worker; left to the workers that serve it", s.name, s.task)
            return None
        task = self.registry.get(s.task)
        try:
            job = build_slot_job(task.spec, s, slot_id(s.name, 0),
                                 task.app.settings.max_payload_bytes)
        except EmqError as exc:
            self._note(f"job:{s.name}:{exc}", "schedule %r cannot make its job, skipped: %s",
                       s.name, exc)
            return None
        return Entry(s, job, s.timing.next_after(max(last, t0)))

    def _catch_up(self, store: ScheduleStore, entry: Entry, last: int, t0: int) -> None:
        """The slots missed while no master ran: after the marker, up to this load."""
        s = entry.schedule
        missed = s.timing.slots_between(last, t0, CATCHUP_MAX + 1)
        if not missed:
            return
        policy = s.catchup
        if policy == "all" and len(missed) > CATCHUP_MAX:
            log.warning("schedule %r: more than %d slots missed; catch-up 'all' enqueues "
                        "only the latest", s.name, CATCHUP_MAX)
            policy = "latest"
        if policy == "latest":
            latest = missed[-1] if len(missed) <= CATCHUP_MAX else \
                s.timing.latest_at_or_before(t0)
            fire = [latest] if latest is not None else []
        else:
            fire = missed if policy == "all" else []
        count = f"{len(missed)}" if len(missed) <= CATCHUP_MAX else f"over {CATCHUP_MAX}"
        log.info("schedule %r: %s missed slot(s) after %d up to %d; catch-up %r enqueues %d",
                 s.name, count, last, t0, s.catchup, len(fire))
        try:
            for slot in fire:
                self._fire(store, entry, slot)
        except TRANSIENT:
            raise
        except Exception:
            log.exception("schedule %r: could not enqueue its catch-up", s.name)

    # -- firing --------------------------------------------------------------------------
    def _fire_due(self, store: ScheduleStore, entry: Entry) -> None:
        timing = entry.schedule.timing
        now = int(self.server_now())
        due = timing.slots_between(entry.next - 1, now, CATCHUP_MAX + 1)
        if len(due) > CATCHUP_MAX:
            log.warning("schedule %r: this master fell more than %d slots behind; it "
                        "enqueues only the latest", entry.schedule.name, CATCHUP_MAX)
            latest = timing.latest_at_or_before(now)
            due = [latest] if latest is not None else []
        try:
            for slot in due:
                fired = self._fire(store, entry, slot)
                if fired.verdict == FireVerdict.EARLY:
                    entry.next = slot
                    return
                if fired.verdict == FireVerdict.GONE:
                    self.entries.pop(entry.schedule.name, None)
                    return
                entry.next = timing.next_after(max(slot, fired.last))
        except TRANSIENT:
            raise   # the park thread's Outage retries the whole call
        except ServerFull:
            entry.hold = self.server_now() + _HOLD
            raise   # the park thread says so, once for the whole outage
        except Exception:
            log.exception("schedule %r: could not enqueue a slot; trying again in %.0fs",
                          entry.schedule.name, _HOLD)
            entry.hold = self.server_now() + _HOLD

    def _fire(self, store: ScheduleStore, entry: Entry, slot: int) -> Fired:
        s = entry.schedule
        countdown = int(random.uniform(0, s.jitter) * 1000) if s.jitter else 0
        job = entry.job._replace(id=slot_id(s.name, slot), countdown_ms=countdown)
        span = tracing.firing(s.task, store.queue.name, s.name, slot)   # None untraced
        if span is not None and span.carrier:
            job = job._replace(payload=serialization.with_trace(job.payload, span.carrier))
        before = time.monotonic()
        fired = store.fire(s, slot, job)
        if span is not None:
            span.end(job.id, job.group, fired.verdict == FireVerdict.ENQUEUED)
        self.offset = fired.now_ms / 1000 - (before + time.monotonic()) / 2
        log.debug("schedule %r slot %d: %s", s.name, slot, fired.verdict.name.lower())
        return fired

    def _note(self, key: str, message: str, *args: object) -> None:
        if key not in self._noted:
            self._noted.add(key)
            log.warning(message, *args)
