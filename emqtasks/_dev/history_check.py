"""The chaos soak's checker: a pure function over its history (history.py), as Jepsen's are.

The records it reads (each also has ``t``, time.monotonic(), and ``pid``):

- ``enqueue invoke`` (``batch``, and ``ids`` with the ``doomed`` among them, or ``chord``: a
  chord's tag) then its outcome, ``enqueue ok`` / ``refused`` / ``unknown`` (``batch``): ok
  is an acknowledged enqueue, refused one the server said no to, unknown one never answered;
- ``start`` (``id``, ``run``: the holder's token, which the task returns as its result; a
  chord's callback also has ``chord`` and ``members``, the tokens it was given) and ``end``
  (the body returned ``run``);
- ``ack ok`` (the server acknowledged the holder's ack) and ``ack stale`` (it refused it: the
  holder was fenced out);
- ``get ok`` (``id``, ``value``: what a ``get()`` returned);
- ``final ok`` (``id``, ``state``, ``result``): the stored row read after the drain.

``check(records)`` returns the violations, each with the records involved.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

Record = dict[str, Any]


@dataclass
class Violation:
    kind: str        # lost, started after ack, acked twice, stale write, chord early, bad read
    what: str
    records: list[Record] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [f"{self.kind}: {self.what}",
                *(f"    {json.dumps(r, separators=(',', ':'))}" for r in self.records)]


def member_id(run: str) -> str:
    """The job id in a run token (``<job id>|<attempt>|<pid>|<nonce>``)."""
    return run.split("|", 1)[0]


def check(records: Iterable[Record]) -> list[Violation]:
    recs = sorted(records, key=lambda r: r["t"])
    by_id: dict[str, list[Record]] = defaultdict(list)
    invoked: dict[Any, Record] = {}
    acknowledged: list[tuple[Record, Record]] = []
    final: dict[str, Record] = {}
    for r in recs:
        if r["op"] == "enqueue":
            if r["type"] == "invoke":
                invoked[r["batch"]] = r
            elif r["type"] == "ok" and r["batch"] in invoked:
                acknowledged.append((invoked[r["batch"]], r))
        elif "id" in r:
            by_id[r["id"]].append(r)
            if r["op"] == "final":
                final[r["id"]] = r
    out: list[Violation] = []
    out += _lost(acknowledged, by_id, final)
    for job_id, ops in by_id.items():
        out += _after_ack(job_id, ops)
        out += _stale_writes(job_id, ops, final.get(job_id))
        out += _reads(job_id, ops, final.get(job_id))
    out += _chords(recs)
    return out


def _lost(acknowledged: list[tuple[Record, Record]], by_id: dict[str, list[Record]],
          final: dict[str, Record]) -> list[Violation]:
    """Every acknowledged enqueue ran to done (the doomed ones: dead, by their policy)."""
    out = []
    callbacks = {r["chord"]: r["id"] for ops in by_id.values() for r in ops
                 if r["op"] == "start" and r.get("chord")}
    for invoke, ok in acknowledged:
        if invoke.get("chord"):
            cb = callbacks.get(invoke["chord"])
            row = final.get(cb) if cb else None
            if row is None or row["state"] != "done":
                out.append(Violation("lost", f"chord {invoke['chord']}'s callback "
                                     f"{'never started' if cb is None else 'is not done'}",
                                     [invoke, ok, *([row] if row else [])]))
            continue
        doomed = set(invoke.get("doomed", ()))
        for job_id in invoke["ids"]:
            want = "dead" if job_id in doomed else "done"
            row = final.get(job_id)
            if row is None or row["state"] != want:
                state = row["state"] if row else "no row read"
                out.append(Violation("lost", f"{job_id} was acknowledged but is {state}, "
                                     f"not {want}", [invoke, ok, *by_id.get(job_id, [])]))
    return out


def _after_ack(job_id: str, ops: list[Record]) -> list[Violation]:
    """A job whose ack was acknowledged never starts again, nor is acknowledged again."""
    acks = [r for r in ops if r["op"] == "ack" and r["type"] == "ok"]
    if not acks:
        return []
    first = acks[0]
    out = []
    later = [r for r in ops if r["op"] == "start" and r["t"] > first["t"]]
    if later:
        out.append(Violation("started after ack", f"{job_id} started again after its ack "
                             "was acknowledged", [first, *later]))
    others = [r for r in acks[1:] if r["run"] != first["run"]]
    if others:
        out.append(Violation("acked twice", f"{job_id}: the acks of {len(others) + 1} "
                             "holders were acknowledged", [first, *others]))
    return out


def _stale_writes(job_id: str, ops: list[Record], row: Record | None) -> list[Violation]:
    """A holder fenced out (its ack refused as stale) wrote nothing: its result is not the
    stored one."""
    if row is None:
        return []
    return [Violation("stale write", f"{job_id}: the result of a holder whose ack was "
                      "refused as stale is the stored one", [r, row])
            for r in ops if r["op"] == "ack" and r["type"] == "stale"
            and row.get("result") == r["run"]]


def _reads(job_id: str, ops: list[Record], row: Record | None) -> list[Violation]:
    """Every get() returned the stored result."""
    if row is None:
        return []
    return [Violation("bad read", f"{job_id}: a get() returned {r['value']!r}, the stored "
                      f"result is {row.get('result')!r}", [r, row])
            for r in ops if r["op"] == "get" and r["type"] == "ok"
            and r["value"] != row.get("result")]


def _chords(recs: list[Record]) -> list[Violation]:
    """A chord's callback never started before its last member finished (the run whose
    result it was given had returned it)."""
    ended = {r["run"]: r for r in recs if r["op"] == "end"}
    out = []
    for r in recs:
        if r["op"] != "start" or not r.get("chord"):
            continue
        early = [m for m in r.get("members", ()) if m not in ended or ended[m]["t"] > r["t"]]
        if early:
            out.append(Violation("chord early", f"chord {r['chord']}'s callback {r['id']} "
                                 f"started before its member(s) "
                                 f"{', '.join(member_id(m) for m in early)} finished",
                                 [r, *(ended[m] for m in early if m in ended)]))
    return out
