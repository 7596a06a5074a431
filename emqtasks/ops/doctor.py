"""``emqtasks doctor``: what to check on a server and a queue before going live.

Each check is a function of a :class:`Context` returning :class:`Finding`\\ s; :data:`CHECKS`
lists them in the order they run and print, so a check is added by writing one function
and one row. A check that the server refuses to this user (CONFIG, INFO, SCAN) is reported
as a warning saying so, never as a crash. Everything here only reads, but for the ACL
check's harmless probes (see :func:`emqtasks.acl.refused_commands`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import redis

from .. import clock
from ..store.cluster import is_cluster, node_kwargs
from ..store.durable import Durable
from ..store.queue import Queue
from ..store.selection import MODULE_NAME, loaded_version, missing_hint, native_mode
from ..store.waits import aof_refusal
from . import acl
from .check import check
from .servers import ServerInfo, identify

Status = Literal["ok", "info", "warn", "error"]
STATUSES: tuple[Status, ...] = ("ok", "info", "warn", "error")
ROLES = ("any", "producer", "worker")
#: A worker degrades without these (the start-up eviction check is skipped): a warning.
OPTIONAL_COMMANDS = frozenset({"info"})
ROLE_COMMANDS = {"producer": acl.PRODUCER_COMMANDS, "worker": acl.WORKER_COMMANDS}
LATENCY_PINGS = 5
SLOW_RTT_MS = 10.0
AS_OPERATOR = "run `emqtasks doctor` as a user that may run it (an operator's) to check this"


@dataclass(frozen=True)
class Finding:
    """One line of the doctor's report: what was checked, how it stands, what to change."""

    name: str
    status: Status
    message: str
    fix: str = ""


@dataclass
class Context:
    """A queue to examine, and what the checks learn along the way (INFO sections, CONFIG)."""

    queue: Queue
    role: str = "any"
    durable: Durable | None = None     # the setting of the App / EMQ_DURABLE
    _info: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def client(self) -> Any:
        return self.queue.client

    @property
    def target(self) -> dict[str, Any]:
        """Send a server-level command to the node serving the queue's slot."""
        return node_kwargs(self.client, self.queue.keys.ring)

    def info(self, section: str) -> dict[str, Any]:
        if section not in self._info:
            reply = self.client.info(section, **self.target)
            if reply and all(isinstance(v, dict) for v in reply.values()):
                reply = next(iter(reply.values()))   # {node: {...}} from a cluster client
            self._info[section] = reply
        return self._info[section]

    def config(self, name: str) -> str | None:
        """A CONFIG GET value, or None when this user may not run CONFIG (or it is disabled)."""
        try:
            reply = self.client.config_get(name, **self.target)
        except redis.exceptions.ResponseError:
            return None
        if name not in reply and reply and all(isinstance(v, dict) for v in reply.values()):
            reply = next(iter(reply.values()))
        value = reply.get(name)
        return None if value is None else str(value)

    def server(self) -> ServerInfo:
        return identify(self.info("server"))


Check = Callable[[Context], Iterable[Finding]]


def check_server(ctx: Context) -> Iterable[Finding]:
    server = ctx.server()
    where = ""
    if is_cluster(ctx.client):
        node = ctx.client.get_node_from_key(ctx.queue.keys.ring)
        where = f", the queue's slot on {node.host}:{node.port}"
    yield Finding("server", "info", f"{server}, {server.mode}{where}")
    least = ".".join(map(str, server.minimum[:2]))
    if server.supported:
        yield Finding("version", "ok", f"{server} (the oldest supported {server.kind} is "
                                       f"{least})")
    else:
        yield Finding("version", "error", f"{server} is older than {server.kind} {least}: "
                      "the verbs need LMOVE and the worker cannot claim",
                      f"upgrade to {server.kind} >= {least}")


def check_eviction(ctx: Context) -> Iterable[Finding]:
    policy = ctx.config("maxmemory-policy") or ctx.info("memory").get("maxmemory_policy")
    maxmemory = int(ctx.info("memory").get("maxmemory") or 0)
    if policy is None:
        yield Finding("maxmemory-policy", "warn", "cannot read maxmemory-policy (neither "
                      "CONFIG GET nor INFO memory tells it)", "make sure it is noeviction")
    elif policy == "noeviction":
        yield Finding("maxmemory-policy", "ok", f"noeviction, maxmemory {maxmemory:,} bytes: a "
                      "full server refuses writes (enqueues fail), never drops keys"
                      if maxmemory else "noeviction, no maxmemory limit: keys are never evicted")
    else:
        yield Finding("maxmemory-policy", "error",
                      f"{policy}: the server may evict queue keys, and jobs would vanish",
                      "CONFIG SET maxmemory-policy noeviction (and set it in the server's "
                      "configuration file)")


def check_persistence(ctx: Context) -> Iterable[Finding]:
    aof = ctx.config("appendonly")
    if aof is None:
        aof = "yes" if str(ctx.info("persistence").get("aof_enabled")) == "1" else "no"
    save = ctx.config("save")
    if aof == "yes":
        fsync = ctx.config("appendfsync")
        if fsync == "always":
            yield Finding("persistence", "ok", "appendonly yes, appendfsync always: an "
                          "acknowledged enqueue survives a crash")
        elif fsync == "everysec":
            yield Finding("persistence", "ok", "appendonly yes, appendfsync everysec: a crash "
                          "may lose the last second of writes")
        elif fsync is None:
            yield Finding("persistence", "ok", "appendonly yes (appendfsync unknown: CONFIG "
                          "refused to this user)")
        else:
            yield Finding("persistence", "warn", f"appendonly yes, appendfsync {fsync}: the "
                          "OS decides when writes reach the disk (a crash may lose ~30 s)",
                          "CONFIG SET appendfsync everysec (or always)")
    elif save:
        yield Finding("persistence", "warn", f"RDB snapshots only (save {save!r}): a crash "
                      "loses every job since the last snapshot",
                      "CONFIG SET appendonly yes (with appendfsync everysec or always)")
    elif save is None:
        yield Finding("persistence", "warn", "appendonly no; the RDB schedule is unknown "
                      "(CONFIG refused to this user)", "CONFIG SET appendonly yes")
    else:
        yield Finding("persistence", "error", "no persistence (appendonly no, no RDB "
                      "snapshots): a restart loses every job",
                      "CONFIG SET appendonly yes (with appendfsync everysec or always)")


def check_replication(ctx: Context) -> Iterable[Finding]:
    info = ctx.info("replication")
    if info.get("role") != "master":   # Redis and Valkey say "slave" in INFO
        yield Finding("replication", "error", "this node is a replica: it refuses writes "
                      "(READONLY)", "point the URL at the master")
        return
    replicas = int(info.get("connected_slaves") or 0)
    if replicas == 0:
        yield Finding("replication", "info", "no replicas: losing this machine loses the "
                      "queue, unless its disk survives")
        return
    minimum = ctx.config("min-replicas-to-write")
    if minimum is None:
        yield Finding("replication", "info", f"{replicas} replica(s); min-replicas-to-write "
                      "unknown (CONFIG refused to this user)")
    elif int(minimum) >= 1:
        yield Finding("replication", "ok", f"{replicas} replica(s), min-replicas-to-write "
                      f"{minimum}: writes are refused when too few replicas follow")
    else:
        yield Finding("replication", "warn", f"{replicas} replica(s), min-replicas-to-write "
                      "0: replication is asynchronous, a failover after a crash may lose the "
                      "last acknowledged enqueues", "CONFIG SET min-replicas-to-write 1 "
                      "(writes are then refused while no replica follows)")


def check_durability(ctx: Context) -> Iterable[Finding]:
    """Whether an acknowledged enqueue survives the loss of the primary, with this server
    and the durable setting (EMQ_DURABLE, or the App's)."""
    head = "acknowledged enqueues survive the loss of the primary:"
    d = ctx.durable
    info = ctx.info("replication")
    replicas = int(info.get("connected_slaves") or 0)
    if d is None and replicas == 0:
        yield Finding("durability", "info", f"{head} no, because there is no replica (and "
                      "durable is off)")
        return
    if d is None:
        yield Finding("durability", "warn",
                      f"{head} no, because durable is off: replication is asynchronous, "
                      f"a primary that dies loses what its {replicas} replica(s) had not "
                      "received", "set EMQ_DURABLE=1 (or App(durable=True)): each "
                      "enqueue waits for a replica (WAIT)")
        return
    if d.aof:
        why = aof_refusal(ctx.info("server"), ctx.info("persistence"))
        if why is not None:
            yield Finding("durability", "error", f"{head} no, because {why}",
                          "use Durable(aof=False), or a server with WAITAOF and appendonly yes")
            return
    if replicas < d.replicas:
        yield Finding("durability", "error",
                      f"{head} no, because {replicas} replica(s) connected and durable asks "
                      f"for {d.replicas}: every durable write raises NotDurable after "
                      f"{d.timeout:g}s", "connect more replicas, or ask for fewer "
                      "(Durable(replicas=N))")
        return
    how = ("written to the append-only file here and on" if d.aof else "received by")
    yield Finding("durability", "ok",
                  f"{head} yes: each enqueue and stored result returns once {how} "
                  f"{d.replicas} of the {replicas} replica(s) (timeout {d.timeout:g}s, "
                  f"else NotDurable)" + ("" if d.aof else "; in their memory: losing them "
                                         "and the primary at once loses it"))


def check_latency(ctx: Context) -> Iterable[Finding]:
    times = []
    for _ in range(LATENCY_PINGS):
        started = time.perf_counter()
        ctx.queue.ping()
        times.append((time.perf_counter() - started) * 1000)
    median = statistics.median(times)
    text = f"round trip {median:.2f} ms (median of {LATENCY_PINGS} PINGs)"
    if median <= SLOW_RTT_MS:
        yield Finding("latency", "ok", text)
    else:
        yield Finding("latency", "warn", f"{text}: each child settles and claims in one round "
                      f"trip, so it runs at most {1000 / median:,.0f} jobs/s",
                      "run the workers nearer the server")


def check_acl(ctx: Context) -> Iterable[Finding]:
    """Per role: may this user run every command the role sends and its scripts call?

    With ``--role any`` a user that can act as one role passes, and the other role's gaps are
    told as info; a user fit for neither, or for not the role asked, is an error."""
    wanted = {c for cmds in ROLE_COMMANDS.values() for c in cmds}
    method, refused = acl.refused_commands(ctx.client, wanted, ctx.queue.name)
    roles = [r for r in ROLE_COMMANDS if ctx.role in ("any", r)]
    missing = {r: [c for c in ROLE_COMMANDS[r] if c in refused] for r in roles}
    needed = {r: [c for c in m if c not in OPTIONAL_COMMANDS] for r, m in missing.items()}
    strict = ctx.role != "any" or all(needed.values())
    for role in roles:
        yield _acl_finding(ctx.queue.name, role, needed[role], missing[role], strict,
                           f"(checked with {method})", _username(ctx.client))


def _username(client: Any) -> str:
    pool = getattr(client, "connection_pool", None)
    return str(getattr(pool, "connection_kwargs", {}).get("username") or "default") \
        if pool is not None else "<user>"


def _acl_finding(queue: str, role: str, needed: list[str], missing: list[str], strict: bool,
                 how: str, user: str) -> Finding:
    name = f"acl {role}"
    if needed and strict:
        also = [c for c in missing if c not in needed]
        return Finding(name, "error", f"this user may not run {', '.join(needed)} on queue "
                       f"{queue}, which the {role} needs {how}"
                       + (f"; nor {', '.join(also)} (optional)" if also else ""),
                       f"ACL SETUSER {user} {' '.join('+' + c for c in missing)} "
                       f"(emqtasks.acl.{role}_rules({queue!r}) gives every rule)")
    if needed:
        return Finding(name, "info", f"not a {role}: lacks {', '.join(needed)} {how}")
    if missing:
        return Finding(name, "warn", f"the {role} may run everything but {', '.join(missing)} "
                       f"{how}: its start-up eviction check is skipped",
                       " ".join(f"+{c}" for c in missing) + " for the user")
    return Finding(name, "ok", f"this user may run every command the {role} needs on queue "
                   f"{queue} {how}")


def check_clock(ctx: Context) -> Iterable[Finding]:
    """A step of the server's clock: behind the queue's clock mark now, or seen by a master
    within a day (clock.py). A warning: nothing is lost, but timings moved."""
    state = clock.read(ctx.queue)
    if state["warning"] is None:
        yield Finding("server clock", "ok", "no step of the server's clock seen (the masters "
                      "compare it with their own on each tick)")
    else:
        yield Finding("server clock", "warn", state["warning"],
                      "keep the server's clock synchronised (NTP slewing, not stepping); "
                      "README 'Clock steps' says what each timing did")


def check_invariants(ctx: Context) -> Iterable[Finding]:
    try:
        report = check(ctx.queue)
    except redis.exceptions.NoPermissionError:
        yield Finding("invariants", "warn", "cannot read the whole queue as this user (SCAN "
                      "and every structure)", AS_OPERATOR)
        return
    size = f"{report.jobs} jobs in {report.groups} groups"
    if report.ok:
        yield Finding("invariants", "ok", f"the queue's invariants hold ({size})")
        return
    status: Status = "error" if report.lost else "warn"
    yield Finding("invariants", status, f"{len(report.violations)} violation(s) ({size}), "
                  f"first: {report.violations[0]}; a live queue can show passing "
                  "differences", "emqtasks check on a quiet queue; emqtasks check --repair "
                  "mends")


def check_module(ctx: Context) -> Iterable[Finding]:
    mode = native_mode()
    try:
        version = loaded_version(ctx.client, **ctx.target)
    except redis.exceptions.NoPermissionError:
        yield Finding("native module", "info", "cannot list modules as this user")
        return
    if version is not None:
        path = "the scripts (EMQ_NATIVE=off)" if mode == "off" else "its EMQ.* commands"
        yield Finding("native module", "ok", f"module {MODULE_NAME} loaded (version "
                      f"{version}): {path} serve this queue")
    elif mode == "require":
        yield Finding("native module", "error", missing_hint(), "emqtasks native path")
    else:
        yield Finding("native module", "info",
                      "native module not loaded: the Lua scripts serve this queue")


#: (name, check) in the order they run and print.
CHECKS: tuple[tuple[str, Check], ...] = (
    ("server", check_server),
    ("maxmemory-policy", check_eviction),
    ("persistence", check_persistence),
    ("replication", check_replication),
    ("durability", check_durability),
    ("latency", check_latency),
    ("server clock", check_clock),
    ("acl", check_acl),
    ("invariants", check_invariants),
    ("native module", check_module),
)


def run(queue: Queue, role: str = "any", skip: Iterable[str] = (),
        durable: Durable | None = None) -> list[Finding]:
    """Every finding of every check not skipped, in order (``durable``: the setting the
    durability check judges)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    ctx = Context(queue, role, durable)
    skipped = set(skip)
    findings: list[Finding] = []
    for name, fn in CHECKS:
        if name in skipped:
            continue
        try:
            findings.extend(fn(ctx))
        except redis.exceptions.NoPermissionError as exc:
            findings.append(Finding(name, "warn", f"refused to this user: {exc}", AS_OPERATOR))
        except redis.exceptions.ResponseError as exc:
            findings.append(Finding(name, "warn", f"could not check: {exc}"))
    return findings


def worst(findings: Iterable[Finding]) -> Status:
    return max((f.status for f in findings), key=STATUSES.index, default="ok")
