"""The verbs of workflows (canvas.py: lua/workflow.lua, wfcancel.lua, wffail.lua) and of
periodic schedules (schedules.py: lua/schedule.lua)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..verdicts import FireVerdict
from .core import QueueCore
from .keys import QueueKeys
from .plan import Script, Steps
from .replies import NewJob, WorkflowSent
from .scripts import VERB_KEYS


class Flows(QueueCore):
    """Jobs that come in sets (a workflow's steps) or on a timing (a schedule's slots)."""

    # -- workflows (canvas.py) ----------------------------------------------------------
    def send_workflow(self, workflow_id: str, ttl: int, meta: dict[str, str],
                      steps: Sequence[tuple[NewJob, str, dict[str, str]]]) -> WorkflowSent:
        """Write a workflow and its steps in one call (workflow_plan)."""
        return self.run(workflow_plan(self.keys, workflow_id, ttl, meta, steps))

    def cancel_workflow(self, workflow_id: str) -> int:
        """Cancel every step of a workflow not yet started; how many (lua/wfcancel.lua)."""
        return int(self.scripts.wfcancel(self._k, [workflow_id]))

    def fail_workflow(self, workflow_id: str, step: str, orphan: str = "") -> bool:
        """Resolve a workflow as failed at ``step`` (cancelling ``orphan``, a step waiting for
        it); False when it had failed already (lua/wffail.lua)."""
        return int(self.scripts.wffail(self._k, [workflow_id, step, orphan])) == 1

    # -- periodic schedules (schedules.py, lua/schedule.lua) ------------------------------
    def _schedule(self, args: list[Any]) -> Any:
        keys = (*self._k, *(self.keys.named(k) for k in VERB_KEYS["schedule"]))
        return self.scripts.schedule(keys, args)

    def schedule_put(self, name: str, spec_json: str, timing_key: str, origin: str) -> bool:
        """Store (or update) a schedule; True when something changed."""
        return bool(self._schedule(["put", name, spec_json, timing_key, origin]))

    def schedule_drop(self, name: str) -> bool:
        return bool(self._schedule(["drop", name]))

    def schedule_fire(self, name: str, slot: int, overlap: bool,
                      job: NewJob) -> tuple[FireVerdict, int, int]:
        """Enqueue one slot of a schedule, at most once per slot: (verdict, the server's
        time in ms, the latest slot handled)."""
        verdict, now, last = self._schedule(["fire", name, slot, "1" if overlap else "0",
                                             *job])
        return FireVerdict(int(verdict)), int(now), int(last)


def workflow_plan(keys: QueueKeys, workflow_id: str, ttl: int, meta: dict[str, str],
                  steps: Sequence[tuple[NewJob, str, dict[str, str]]]) -> Steps[WorkflowSent]:
    """Write a workflow and its steps in one call (lua/workflow.lua): each step its job,
    its mode and its extra row fields. Ids are the caller's to gate."""
    args: list[Any] = [workflow_id, ttl, len(meta)]
    for k, v in meta.items():
        args += [k, v]
    args.append(len(steps))
    for job, mode, extra in steps:
        args += [*job, mode, len(extra)]
        for k, v in extra.items():
            args += [k, v]
    code, what = yield Script("workflow", keys.fixed, args)
    return WorkflowSent(int(code), what)
