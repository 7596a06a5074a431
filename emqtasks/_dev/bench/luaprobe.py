"""Where a Lua verb's time goes inside the script, on a private stock server (no module).

    python -m emqtasks._dev.bench.luaprobe [-n 3000]

1. The helpers: each verb's helper files alone (its text up to the verb's own chunk, then
   ``return 0``): wall µs inside the script (``TIME`` before and after, p10 and median of n
   runs) and the bytes Lua allocates making their closures (``collectgarbage('count')``).
2. ack with claim-next, drained from a backlog of one group: ``TIME`` probes between its
   steps, the median µs of each step over n runs.

A probe is one ``TIME`` (about 1 µs, in the step after it). Wall time: a loaded machine
inflates every figure; compare the steps with each other. Not a test, not a verb.
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

from ..localserver import LocalRedis

PROBE = ("do local t = redis.call('TIME') "
         "P_[#P_ + 1] = tonumber(t[1]) * 1e6 + tonumber(t[2]) end\n")
#: ack.lua's steps: the probe goes before each of these lines (the first that matches)
ACK_STEPS = [
    ("TIME, the full-server guard", "local row = fenced("),
    ("the fence", "  local books, lim = group_books("),
    ("the group's books", "  redis.call('ZREM', K_active, id)"),
    ("the row's done writes", "  if not books then active_drop(g, now, lim) end"),
    ("the in-flight count", "  hist_succeeded(now,"),
    ("the history", "  notify(id, row[F_WAITERS])"),
    ("notify, workflow", "local next_job = false"),
]


def _split(full: str, verb_text: str) -> tuple[str, str]:
    at = full.rfind(verb_text[:200])
    return full[:at], full[at:]


def helpers(r: Any, n: int) -> None:
    from ...store.keys import QueueKeys
    from ...store.scripts import lua_dir, source

    keys = QueueKeys("probe").fixed
    print("the helpers alone: wall us inside the script p10 / median; bytes allocated")
    for verb in ("enqueue", "claim", "ack", "extend"):
        libs, _ = _split(source(verb), (lua_dir() / f"{verb}.lua").read_text())
        timed = r.script_load(
            "local t0 = redis.call('TIME')\n" + libs + "local t1 = redis.call('TIME')\n"
            "return tostring((t1[1] - t0[1]) * 1e6 + t1[2] - t0[2])\n")
        alloc = r.script_load("local m0 = collectgarbage('count')\n" + libs
                              + "return tostring((collectgarbage('count') - m0) * 1024)\n")
        walls = [float(r.evalsha(timed, len(keys), *keys)) for _ in range(n)]
        # a collector step inside a run gives less: the largest of a few
        size = max(float(r.evalsha(alloc, len(keys), *keys)) for _ in range(5))
        print(f"  {verb:8} {statistics.quantiles(walls, n=10)[0]:5.1f} / "
              f"{statistics.median(walls):5.1f} us; {size:,.0f} bytes")


def ack_steps(url: str, r: Any, n: int) -> None:
    from ...producer.app import App
    from ...store.scripts import lua_dir, source
    from . import tasks as bench_tasks

    app = App(redis_url=url, queue="probe-ack")
    noop = bench_tasks.bind(app)["noop"]
    for _ in range(0, n + 1, 1000):
        noop.map([("probe-count",)] * 1000)
    q = app.queue()
    lease = q.claim(1)[0]
    libs, body = _split(source("ack"), (lua_dir() / "ack.lua").read_text())
    for _, line in ACK_STEPS:
        if line not in body:
            raise SystemExit(f"ack.lua changed: no line {line!r} to probe before")
        body = body.replace(line, PROBE + line, 1)
    body = body.replace("return {verdict, next_job}", PROBE + "return {verdict, next_job, P_}")
    sha = r.script_load("local P_ = {}\n" + PROBE + libs + PROBE + body)
    keys = q.keys.fixed
    job = [lease.id, "", "", lease.attempts, lease.nonce]
    names = ["the helpers", *(s for s, _ in ACK_STEPS), "the claim of the next job"]
    steps: list[list[float]] = [[] for _ in names]
    for i in range(n):
        reply = r.evalsha(sha, len(keys), *keys, job[0], job[3], job[4], "null", f"n{i}", "")
        marks = [float(x) for x in reply[2]]
        for k in range(len(marks) - 1):
            steps[k].append(marks[k + 1] - marks[k])
        if not reply[1]:
            break
        job = reply[1]
    print("ack with claim-next, median wall us of each step:")
    for name, values in zip(names, steps):
        print(f"  {name:28} {statistics.median(values):5.1f}")
    app.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=3000, help="runs of each script")
    n = parser.parse_args().n
    os.environ["EMQ_NATIVE"] = "off"
    with LocalRedis(module=False) as server:
        r = server.client()
        helpers(r, n)
        ack_steps(server.url, r, n)
        r.close()


if __name__ == "__main__":
    main()
