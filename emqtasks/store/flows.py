"""The verbs of workflows (canvas.py: lua/workflow.lua, wfcancel.lua, wffail.lua) and of
periodic schedules (schedules.py: lua/schedule.lua)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..verdicts import FireVerdict
from .core import QueueCore
from .durable import Durable
from .keys import QueueKeys
from .plan import Script, Steps
from .replies import NewJob, WorkflowSent
from .scripts import VERB_KEYS
from .waits import check, waited


class Flows(QueueCore):
    """Jobs that come in sets (a workflow's steps) or on a timing (a schedule's slots)."""

    # -- workflows (canvas.py) ----------------------------------------------------------
    def send_workflow(self, workflow_id: str, ttl: int, meta: dict[str, str],
                      steps: Sequence[tuple[NewJob, str, dict[str, str]]],
                      durable: Durable | None = None) -> WorkflowSent:
        """Write a workflow and its steps in one call (workflow_plan)."""
        return self.run(workflow_plan(self.keys, workflow_id, ttl, meta, steps, durable))

    def cancel_workflow(self, workflow_id: str) -> int:
        """Cancel every step of a workflow not yet started; how many (lua/wfcancel.lua)."""
        return int(self.scripts.wfcancel(self._k, [workflow_id]))

    def fail_workflow(self, workflow_id: str, step: str, orphan: str = "") -> bool:
        """Resolve a workflow as failed at ``step`` (cancelling ``orphan``, a step waiting for
        it); False when it had failed already (lua/wffail.lua)."""
        return int(self.scripts.wffail(self._k, [workflow_id, step, orphan])) == 1

    # -- periodic schedules (schedules.py, lua/schedule.lua) ------------------------------
    def _schedule(self, args: list[Any], durable: Durable | None = None,
                  job_id: str = "") -> Any:
        keys = (*self._k, *(self.keys.named(k) for k in VERB_KEYS["schedule"]))
        durable = self.durable if durable is None and job_id else durable
        if durable is None:
            return self.scripts.schedule(keys, args)
        reply, confirmed = self.run(waited(Script("schedule", keys, args), durable,
                                           self.keys.ring))
        check(durable, confirmed, [job_id], "the schedule's firing", reply)
        return reply

    def schedule_put(self, name: str, spec_json: str, timing_key: str, origin: str) -> bool:
        """Store (or update) a schedule; True when something changed."""
        return bool(self._schedule(["put", name, spec_json, timing_key, origin]))

    def schedule_drop(self, name: str) -> bool:
        return bool(self._schedule(["drop", name]))

    def schedule_fire(self, name: str, slot: int, overlap: bool,
                      job: NewJob, durable: Durable | None = None
                      ) -> tuple[FireVerdict, int, int]:
        """Enqueue one slot of a schedule, at most once per slot: (verdict, the server's
        time in ms, the latest slot handled). With ``durable``, the wait rides along."""
        verdict, now, last = self._schedule(["fire", name, slot, "1" if overlap else "0",
                                             *job], durable, job.id)
        return FireVerdict(int(verdict)), int(now), int(last)


def workflow_plan(keys: QueueKeys, workflow_id: str, ttl: int, meta: dict[str, str],
                  steps: Sequence[tuple[NewJob, str, dict[str, str]]],
                  durable: Durable | None = None) -> Steps[WorkflowSent]:
    """Write a workflow and its steps in one call (lua/workflow.lua): each step its job,
    its mode and its extra row fields. Ids are the caller's to gate. ``durable``: the
    wait rides along (NotDurable names every step's job)."""
    args: list[Any] = [workflow_id, ttl, len(meta)]
    for k, v in meta.items():
        args += [k, v]
    args.append(len(steps))
    for job, mode, extra in steps:
        args += [*job, mode, len(extra)]
        for k, v in extra.items():
            args += [k, v]
    op = Script("workflow", keys.fixed, args)
    if durable is None:
        code, what = yield op
    else:
        (code, what), confirmed = yield from waited(op, durable, keys.ring)
        if int(code) == 1:
            check(durable, confirmed, [job.id for job, _, _ in steps], "the workflow",
                  WorkflowSent(int(code), what))
    return WorkflowSent(int(code), what)
