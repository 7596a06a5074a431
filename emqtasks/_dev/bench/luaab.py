"""Server time of the Lua verbs as a Redis Functions library, one source tree against others,
interleaved on one private stock server (no module): what a cut to the scripts saves.

    python -m emqtasks._dev.bench.luaab base=/tmp/old new=. [-n 2000] [--rounds 16]
                                        [--server PATH] [--callgrind]

Each NAME=ROOT is a source tree (a checkout: ``git archive <commit> | tar -x -C ROOT``); its
library is composed by that tree's own ``compose_library`` from its own ``lua/``, so a change
to the composer counts too. Per round, in a rotating order, each tree on its own queue of 10
groups: 20 enqueues (every lane then holds jobs), n one-job enqueues (pipelined, 100 a
write), then n jobs drained one at a time, each an ack with claim-next and the job's own
``INCR`` in one round trip (as a worker's child does). Printed, medians of the rounds, the
first tree the base: server CPU (INFO ``used_cpu_user + used_cpu_sys``) per enqueue and per
drained job, and the time inside each FCALL (commandstats ``usec``: wall time). The machine's
load moves every figure: compare the columns of one run, not runs.

On a shared machine a cut of a few % drowns in that noise. ``--callgrind`` counts instead:
each tree on its own server run under ``valgrind --tool=callgrind``, the instructions of
the whole server (user space: the event loop, parsing, Lua, the commands) per enqueue and
per drained job, n of each after a warm-up (n 500 is enough: repeat runs agree within about
0.5% on the enqueue and 2% on the drain). Needs valgrind; about 10 s a tree.
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

from ...ops.localserver import LocalRedis, find_binary
from ...store.keys import FIXED, QueueKeys
from .functions import send_enqueues

VERBS = ("enqueue", "claim", "ack")
_COMPOSE = ("from emqtasks.store import functions\n"
            "from emqtasks.store.scripts import compose_library, lua_dir\n"
            "n, t = compose_library(lua_dir(), ('enqueue', 'claim', 'ack'))\n"
            "print(n)\nprint(int(hasattr(functions, 'fcall_keys')))\nprint(t, end='')\n")


def _stats(r: Any) -> tuple[float, int, int]:
    i = r.info()
    cs = r.info("commandstats").get("cmdstat_fcall", {})
    cpu = (float(i["used_cpu_user"]) + float(i["used_cpu_sys"])) * 1e6
    return cpu, int(cs.get("calls", 0)), int(cs.get("usec", 0))


class Tree:
    """One source tree's library, loaded on the server, on a queue of its own."""

    def __init__(self, r: Any, root: str, queue: str) -> None:
        self.r, self.queue, self.seq = r, queue, 0
        out = subprocess.check_output([sys.executable, "-c", _COMPOSE], cwd=root, text=True,
                                      env={**os.environ, "PYTHONPATH": root})
        name, first_only, text = out.split("\n", 2)
        r.function_load(text, replace=True)
        tag = name.split("_", 1)[1]
        # as that tree's client sends them: every fixed key, or the first alone
        keys = QueueKeys(queue).fixed[:1 if first_only == "1" else len(FIXED)]
        self.head = {v: ["FCALL", f"emq_{v}_{tag}", len(keys), *keys] for v in VERBS}

    def enqueue(self, n: int, groups: int = 10) -> tuple[float, float]:
        s0 = _stats(self.r)
        self.seq = send_enqueues(self.r, self.head["enqueue"], self.seq, n, groups, 100)
        s1 = _stats(self.r)
        return (s1[0] - s0[0]) / n, (s1[2] - s0[2]) / max(s1[1] - s0[1], 1)

    def drain(self, n: int) -> tuple[float, float]:
        r = self.r
        first = r.execute_command(*self.head["claim"], 1, "c0")
        job = first[0] if first else None
        s0 = _stats(r)
        done = 0
        pipe = r.pipeline(transaction=False)
        while job and done < n:
            pipe.execute_command(*self.head["ack"], job[0], job[3], job[4], "null",
                                 f"a{done}", "")
            pipe.execute_command("INCR", f"n:{self.queue}")
            (_, job), _ = pipe.execute()
            done += 1
        s1 = _stats(r)
        return (s1[0] - s0[0]) / max(done, 1), (s1[2] - s0[2]) / max(s1[1] - s0[1], 1)


def _instructions(path: str) -> int:
    with open(path) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"no totals in {path}")


def callgrind(trees: list[list[str]], binary: str, n: int) -> None:
    """Each tree's server instructions per enqueue and per drained job (module docstring)."""
    with tempfile.TemporaryDirectory(prefix="emq-cg-") as tmp:
        wrapper = os.path.join(tmp, "server")
        with open(wrapper, "w") as f:
            f.write(f"#!/bin/sh\nexec valgrind --tool=callgrind --dump-instr=no "
                    f"--callgrind-out-file={tmp}/out.%p {binary} \"$@\"\n")
        os.chmod(wrapper, 0o755)
        base: tuple[float, float] | None = None
        for name, root in trees:
            with LocalRedis(module=False, binary=wrapper) as server:
                pid = str(server.proc.pid) if server.proc else ""
                r = server.client()
                tree = Tree(r, root, "q")
                tree.enqueue(70)   # the library built, every lane holding jobs
                subprocess.run(["callgrind_control", "-z", pid], check=True, capture_output=True)
                tree.enqueue(n)
                subprocess.run(["callgrind_control", "-d", "enqueue", pid], check=True,
                               capture_output=True)
                tree.drain(n)
                subprocess.run(["callgrind_control", "-d", "drain", pid], check=True,
                               capture_output=True)
                r.close()
            dumps = sorted(glob.glob(f"{tmp}/out.{pid}.*"), key=lambda p: int(p.rsplit(".")[-1]))
            enq, drained = (_instructions(p) / n for p in dumps[:2])
            base = base or (enq, drained)
            print(f"  {name:8} per enqueue {enq / 1000:7.1f}k instructions "
                  f"({enq / base[0] - 1:+.1%})  per drained job {drained / 1000:7.1f}k "
                  f"({drained / base[1] - 1:+.1%})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("trees", nargs="+", help="NAME=ROOT, the first the base")
    parser.add_argument("--server", default=None, help="redis-server or valkey-server")
    parser.add_argument("-n", type=int, default=2000, help="enqueues, and jobs drained")
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--callgrind", action="store_true",
                        help="count the server's instructions under valgrind instead")
    a = parser.parse_args()
    trees = [t.split("=", 1) for t in a.trees]
    binary = a.server or find_binary("redis-server")
    if binary is None:
        raise SystemExit("no redis-server on PATH (--server PATH)")
    if a.callgrind:
        callgrind(trees, binary, a.n)
        return
    figures: dict[str, dict[str, list[float]]] = {name: {} for name, _ in trees}
    with LocalRedis(module=False, binary=binary) as server:
        r = server.client()
        info = r.info("server")
        print(info.get("valkey_version") or info["redis_version"], server.binary)
        for rnd in range(a.rounds):
            k = rnd % len(trees)
            order = trees[k:] + trees[:k]
            if (rnd // len(trees)) % 2:
                order.reverse()
            for name, root in order:
                tree = Tree(r, root, f"{name}{rnd}")
                tree.enqueue(20)
                fig = figures[name]
                for key, v in zip(("enqueue cpu", "enqueue in-call"), tree.enqueue(a.n)):
                    fig.setdefault(key, []).append(v)
                for key, v in zip(("drained cpu", "ack in-call"), tree.drain(a.n)):
                    fig.setdefault(key, []).append(v)
            r.flushall()
        r.close()
    base = trees[0][0]
    for key in ("enqueue cpu", "enqueue in-call", "drained cpu", "ack in-call"):
        b = statistics.median(figures[base][key])
        cols = "  ".join(f"{name} {statistics.median(figures[name][key]):6.1f} "
                         f"({statistics.median(figures[name][key]) / b - 1:+.0%})"
                         for name, _ in trees[1:])
        print(f"  {key:16} {base} {b:6.1f} us  {cols}")


if __name__ == "__main__":
    main()
