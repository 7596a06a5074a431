"""The dashboard's actions that take free input: enqueue a task by name.

Everything is checked before a byte is written: the task is one the queue knows (a worker
of the queue noted it, or it ran there in the last hour: the dashboard imports no task
code), the arguments are a JSON array and object, the group a group name, the countdown
a finite number of seconds, 0 or more. A refusal says which value and why (400).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..config import Settings
from ..errors import EmqError, InvalidArgument, LaneFull
from ..producer.jobs import build_job
from ..producer.registry import TaskSpec
from ..schedules.schedule import spec_from_options
from ..store.queue import Queue
from ..validate import MAX_COUNTDOWN, seconds, task_name
from ..verdicts import EnqueueVerdict

#: The largest arguments accepted (the producer's default limit).
PAYLOAD_LIMIT = Settings.max_payload_bytes


@dataclass(frozen=True)
class Enqueued:
    id: str
    task: str
    group: str
    duplicate: bool


def known_tasks(queue: Queue, recent: dict[str, Any]) -> dict[str, str | None]:
    """The task names the queue knows: name -> the options a worker noted (None when the
    name is known only from the last hour's history)."""
    noted: dict[str, str] = queue.client.hgetall(queue.keys.tasks)
    return {**dict.fromkeys(recent), **noted}


def enqueue(queue: Queue, known: dict[str, str | None], form: dict[str, str]) -> Enqueued:
    """One job of the task the form names; InvalidArgument (nothing written) on bad input,
    LaneFull when its lane is at its cap."""
    name = task_name(form.get("task", "").strip())
    if name not in known:
        raise InvalidArgument(f"unknown task {name[:80]!r}: no worker of queue {queue.name!r} "
                              f"noted it and it did not run here in the last hour")
    args = _json(form.get("args", "") or "[]", "the arguments", list, "array")
    kwargs = _json(form.get("kwargs", "") or "{}", "the keyword arguments", dict, "object")
    group = form.get("group", "").strip() or None
    text = form.get("countdown", "").strip()
    countdown = None
    if text:
        try:
            number = float(text)
        except ValueError:
            raise InvalidArgument(f"the countdown is a number of seconds, not "
                                  f"{text[:40]!r}") from None
        countdown = seconds(number, "the countdown", high=MAX_COUNTDOWN)
    spec, group_fn = (spec_from_options(name, options) if (options := known[name])
                      else (TaskSpec(name=name, fn=_elsewhere), False))
    if group is None and group_fn:
        raise InvalidArgument(f"task {name!r} picks its group with a function the dashboard "
                              f"cannot run: give the group")
    try:
        job = build_job(spec, tuple(args), kwargs, limit=PAYLOAD_LIMIT, group=group,
                        countdown=countdown)
    except InvalidArgument:
        raise
    except EmqError as exc:   # a group name, arguments too large or not JSON-able
        raise InvalidArgument(str(exc)) from None
    verdict = queue.enqueue_many([job])[0]
    if verdict == EnqueueVerdict.FULL:
        raise LaneFull(job.group, job.id)
    if verdict == EnqueueVerdict.UNREADABLE:
        raise queue.corrupt([job.group], f"job {job.id} was not enqueued")
    return Enqueued(job.id, name, job.group, verdict == EnqueueVerdict.DUPLICATE)


def _json(text: str, what: str, kind: type, kind_name: str) -> Any:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidArgument(f"{what} are not valid JSON: {exc}") from None
    if not isinstance(value, kind):
        raise InvalidArgument(f"{what} must be a JSON {kind_name}, not "
                              f"{type(value).__name__}")
    return value


def _elsewhere(*_args: Any, **_kwargs: Any) -> None:   # pragma: no cover - runs on a worker
    raise InvalidArgument("this task runs on a worker")


__all__ = ["Enqueued", "enqueue", "known_tasks"]
