"""One release's side of a rolling deploy (tests/test_rolling_deploy.py).

``Side`` produces, drains and settles leases through whichever ``emqtasks`` is imported,
using only what the previous release and this one share: the public API, ``Queue``'s verbs,
``emqtasks.worker.child.Runner`` and the worker's ``Scheduler``. The test uses it in-process
for this release; run as a script (its PYTHONPATH holding the previous release's checkout)
it serves the same methods to the test as JSON lines, one request per line on stdin
(``{"op": name, "args": [...]}``), one answer per line on stdout (``{"ok": value}`` or
``{"error": traceback}``). Leases travel as lists of their fields.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from typing import Any

from rolling_tasks import register, runs_key

import emqtasks
from emqtasks import App, chain, chord
from emqtasks.queue import Lease

try:   # this release: the schedules package
    from emqtasks.schedules.schedule import ScheduleStore
except ImportError:   # the previous release: one module
    from emqtasks.schedules import ScheduleStore  # type: ignore[attr-defined,no-redef]
from emqtasks.worker.child import Runner
from emqtasks.worker.scheduler import Scheduler

#: The schedule a producer stores; its marker is set back this many seconds, so the
#: consumer's Scheduler catches up that many one-second slots at once instead of waiting.
SCHEDULE, MISSED = "rd-every", 3


class Side:
    """One release's code on one queue (EMQ_NATIVE, read from the environment, picks the
    path of its hot verbs)."""

    def __init__(self, url: str, queue: str, side: str) -> None:
        self.app = App(redis_url=url, queue=queue)
        self.tasks = register(self.app, side)
        self.q = self.app.queue()
        self.side = side

    # -- what the test asks of a side -----------------------------------------------------
    def where(self) -> str:
        """The folder emqtasks was imported from (the test checks it is the release meant)."""
        return str(emqtasks.__file__)

    def native(self) -> bool | None:
        """Whether the module served this side's hot verbs (None: none has run yet)."""
        return self.q.hot.native  # type: ignore[no-any-return]

    def enqueue(self, n: int, group: str, countdown: float | None = None) -> list[str]:
        add = self.tasks["add"]
        return [add.apply_async((i, 1), group=group, countdown=countdown).id
                for i in range(n)]

    def produce(self, schedule: bool = True) -> dict[str, Any]:
        """Jobs in three groups (two of them delayed), one that asks for a retry, one that
        goes dead, a chain, a chord and (with ``schedule``) a schedule whose missed slots a
        consumer catches up. Returns what a drain must end with."""
        t = self.tasks
        results: dict[str, Any] = {}
        for g in ("ga", "gb", "gc"):
            for i in range(3):
                results[t["add"].apply_async((i, 10), group=g).id] = i + 10
        for i in range(2):
            results[t["add"].apply_async((i, 20), group="gb", countdown=0.2).id] = i + 20
        flaky = t["flaky"].apply_async((7,), group="gc").id
        results[flaky] = 7
        boom = t["boom"].apply_async((), group="ga").id
        chained = chain(t["add"].s(1, 2), t["add"].s(3), t["add"].s(4).set(group="gb")).delay()
        chorded = chord([t["add"].s(i, i).set(group=f"m{i % 2}") for i in range(4)],
                        t["total"].s()).delay()
        steps = [s["id"] for h in (chained, chorded) for s in h.steps()]
        if schedule:
            self.app.schedule(SCHEDULE, t["add"], every=1, args=(5, 5), catchup="all")
            store = ScheduleStore(self.q)
            last = int(store.state()[SCHEDULE]["last"])
            self.q.client.hset(self.q.keys.schedstate, f"{SCHEDULE}:last", last - MISSED)
        return {"results": results, "flaky": flaky, "dead": [boom], "steps": steps,
                "workflows": {chained.id: 10, chorded.id: 12}, "schedule": schedule}

    def drain(self, expect: dict[str, Any], timeout: float = 8.0) -> dict[str, Any]:
        """Run everything ``expect`` (a produce()'s answer) names to its end through this
        release's verbs: first one lease is lost (claimed, renewed, expired) and reaped back,
        and its holder's late ack is refused; the schedule's missed slots are fired by the
        Scheduler's catch-up; then Runner.run_once, promote and park until all ended."""
        q = self.q
        report: dict[str, Any] = {"outcomes": [], "slots": []}
        lost = q.claim(1)
        q.extend(lost)
        q.client.zadd(q.keys.active, {lost[0].id: 0}, xx=True)   # its deadline long past
        report["lost"] = lost[0].id
        report["reaped"] = list(q.reap())
        report["late_ack"] = int(q.ack(lost[0], "null").verdict)
        ids = [*expect["results"], *expect["dead"], *expect["steps"]]
        if expect["schedule"]:
            Scheduler(self.app.registry).run_due(q)
            prefix = q.keys.job(f"sched:{SCHEDULE}:")
            report["slots"] = sorted(k[len(q.keys.job("")):] for k in q.scan(prefix + "*"))
            ids += report["slots"]
        runner = Runner(q, self.app.registry)
        deadline = time.monotonic() + timeout
        while not self._ended(ids, expect["workflows"]):
            if time.monotonic() > deadline:
                raise TimeoutError(f"not drained in {timeout}s: {self.app.stats()}")
            _, due_in = q.promote()
            outcome = runner.run_once()
            if outcome is not None:
                report["outcomes"].append([outcome.job_id, outcome.verdict])
            else:   # nothing claimable: wait for a wake or the next delayed job, bounded
                q.park(min(0.2, due_in if due_in is not None else 0.2))
        return report

    def _ended(self, ids: list[str], workflows: dict[str, Any]) -> bool:
        pipe = self.q.client.pipeline(transaction=False)
        for i in ids:
            pipe.hget(self.q.keys.job(i), "state")
        if not all(s in ("done", "dead") for s in pipe.execute()):
            return False
        return all(self.app.workflow(w).status() != "running" for w in workflows)

    def view(self, ids: list[str], workflows: list[str]) -> dict[str, Any]:
        """What this release reads of jobs and workflows: per id (state, result, error), per
        workflow (status, get()), the queue's totals."""
        jobs = {i: list(self.q.outcome(i)) for i in ids}
        flows = {w: [self.app.workflow(w).status(), self.app.workflow(w).get(timeout=2)]
                 for w in workflows}
        stats = self.app.stats()
        totals = {k: stats[k] for k in ("pending", "active", "delayed", "dead", "stale_acks")}
        runs = self.q.client.hgetall(runs_key(self.q.name))
        return {"jobs": jobs, "workflows": flows, "totals": totals, "runs": runs}

    # -- single verbs, on leases that may have been claimed by the other release ----------
    def claim(self, n: int = 1) -> list[list[Any]]:
        return [list(lease) for lease in self.q.claim(n)]

    def ack(self, lease: list[Any], result: str = "null") -> int:
        return int(self.q.ack(Lease(*lease), result).verdict)

    def retry(self, lease: list[Any], error: str, delay: float | None = None) -> int:
        return int(self.q.retry(Lease(*lease), error, delay))

    def extend(self, leases: list[list[Any]]) -> list[int]:
        return [int(v) for v in self.q.extend([Lease(*x) for x in leases])]

    def release(self, lease: list[Any]) -> int:
        return int(self.q.release(Lease(*lease)))

    def reap(self) -> list[int]:
        return list(self.q.reap())

    def promote(self) -> int:
        return int(self.q.promote()[0])

    def close(self) -> None:
        self.app.close()


def serve(side: Side) -> None:
    """Answer the test's requests until stdin closes."""
    for line in sys.stdin:
        request = json.loads(line)
        try:
            answer = {"ok": getattr(side, request["op"])(*request.get("args", []))}
        except Exception:
            answer = {"error": traceback.format_exc()}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    side.close()


if __name__ == "__main__":
    serve(Side(sys.argv[1], sys.argv[2], sys.argv[3]))
