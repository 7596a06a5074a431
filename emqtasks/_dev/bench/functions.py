"""Server CPU per call of the Lua verbs as EVALSHA against the same verbs as a Redis Functions
library (FCALL), on a private stock server (no module).

    python -m emqtasks._dev.bench.functions [--server PATH] [-n 2000] [--rounds 7] [--only enqueue]

``--only enqueue`` loads a library of that verb alone (the first measurement: is the library
worth building?); else the full library of every verb. Each round runs a batch of each form
on its own queue, EVALSHA then FCALL, alternating which goes first; the figure is the
server's time inside the command (INFO commandstats, usec over calls of the batch), median of
the rounds. Enqueue: n one-job calls; claim: n one-job claims of a prefilled queue of 10
groups; ack: n ack-and-claim-next calls draining it. Not a test: compare the two columns.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from ...ops.localserver import LocalRedis, find_binary
from ...store.keys import FIXED, QueueKeys
from ...store.scripts import compose_library, lua_dir, source

PAYLOAD = '{"v":1,"a":[42,"report"],"k":{}}'


def send_enqueues(r: Any, head: list[Any], seq: int, n: int, groups: int, batch: int) -> int:
    """n one-job enqueues by ``head`` (FCALL or EVALSHA, its keys), pipelined ``batch`` at a
    time, ids ``j<seq>`` after ``seq`` over ``groups`` groups; returns the last seq."""
    pipe = r.pipeline(transaction=False)
    for _ in range(n):
        seq += 1
        pipe.execute_command(*head, 1, f"j{seq}", "t", PAYLOAD, f"g{seq % groups}", 3, 10**7,
                             1000, 0, 0, 0)
        if len(pipe) >= batch:
            pipe.execute()
    pipe.execute()
    return seq


def _usec(r: Any, name: str) -> tuple[int, int]:
    s = r.info("commandstats").get(f"cmdstat_{name}", {})
    return int(s.get("calls", 0)), int(s.get("usec", 0))


class Form:
    def __init__(self, r: Any, fcall: bool, verbs: tuple[str, ...], queue: str) -> None:
        self.r, self.fcall = r, fcall
        self.keys = QueueKeys(queue).fixed
        if fcall:
            name, text = compose_library(lua_dir(), verbs)
            r.function_load(text, replace=True)
            tag = name.split("_", 1)[1]
            self.head = {v: ["FCALL", f"emq_{v}_{tag}", len(FIXED), *self.keys] for v in verbs}
        else:
            self.head = {v: ["EVALSHA", r.script_load(source(v)), len(FIXED), *self.keys]
                         for v in verbs}
        self.cmd = "fcall" if fcall else "evalsha"
        self.seq = 0

    def enqueue(self, n: int, groups: int = 1) -> float:
        c0, u0 = _usec(self.r, self.cmd)
        self.seq = send_enqueues(self.r, self.head["enqueue"], self.seq, n, groups, 200)
        c1, u1 = _usec(self.r, self.cmd)
        return (u1 - u0) / max(c1 - c0, 1)

    def claim(self, n: int) -> float:
        c0, u0 = _usec(self.r, self.cmd)
        pipe = self.r.pipeline(transaction=False)
        for i in range(n):
            pipe.execute_command(*self.head["claim"], 1, f"c{i}")
        self.leases = [x[0] for x in pipe.execute() if x]
        c1, u1 = _usec(self.r, self.cmd)
        return (u1 - u0) / max(c1 - c0, 1)

    def ack(self, n: int) -> float:
        c0, u0 = _usec(self.r, self.cmd)
        job = self.leases[0] if self.leases else None
        done = 0
        while job and done < n:
            _, job = self.r.execute_command(*self.head["ack"], job[0], job[3], job[4],
                                            "null", f"a{done}", "")
            done += 1
        c1, u1 = _usec(self.r, self.cmd)
        return (u1 - u0) / max(c1 - c0, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", default=None, help="redis-server or valkey-server")
    parser.add_argument("-n", type=int, default=2000, help="calls per batch")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--only", default=None, help="one verb's library (enqueue)")
    a = parser.parse_args()
    verbs: tuple[str, ...] = (a.only,) if a.only else ("enqueue", "claim", "ack")
    binary = a.server or find_binary("redis-server")
    figures: dict[str, dict[str, list[float]]] = {}
    with LocalRedis(module=False, binary=binary) as server:
        r = server.client()
        print(r.info("server").get("valkey_version") or r.info("server")["redis_version"],
              binary)
        for rnd in range(a.rounds):
            forms = [Form(r, False, verbs, f"e{rnd}"), Form(r, True, verbs, f"f{rnd}")]
            if rnd % 2:
                forms.reverse()
            for f in forms:
                col = figures.setdefault(f.cmd, {})
                col.setdefault("enqueue", []).append(f.enqueue(a.n, groups=10))
                if "claim" in verbs:
                    col.setdefault("claim", []).append(f.claim(a.n // 2))
                    col.setdefault("ack", []).append(f.ack(a.n // 2))
            r.flushall()
        for verb in verbs:
            ev = statistics.median(figures["evalsha"][verb])
            fc = statistics.median(figures["fcall"][verb])
            print(f"  {verb:8} EVALSHA {ev:6.1f} us/call  FCALL {fc:6.1f} us/call  "
                  f"{(ev - fc) / ev:+.0%} ")
        r.close()


if __name__ == "__main__":
    main()
