"""The keyspace: every key name of a queue is built here, and the gates on the names in it.

Every key of a queue carries the hash tag ``{q}`` so the whole queue lives in one Redis
Cluster slot. Scripts receive the queue's fixed keys as KEYS (in ``FIXED`` order) and form
the two dynamic kinds (job rows and lanes) from the same hash-tagged base.
"""

from __future__ import annotations

import os
import random
import re
import time
from typing import NamedTuple

from ..errors import InvalidArgument, InvalidGroup, InvalidJobId, InvalidQueueName

QUEUE_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
#: Caller-chosen job ids: letters, digits and ``_ . : -``, 1 to 128 characters.
JOB_ID = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")
#: Group names are arbitrary non-empty UTF-8 up to this many bytes.
GROUP_MAX_BYTES = 256
DEFAULT_GROUP = "default"

#: The fixed keys of a queue, in the order every script receives them as KEYS.
FIXED = (
    "ring",      # list: exactly the serviceable groups
    "active",    # zset: leased ids, score = lease deadline (ms, server clock)
    "gactive",   # hash: group -> jobs in flight
    "glimit",    # hash: group -> concurrency limit
    "gweight",   # hash: group -> weight for the deficit rotation
    "gturn",     # hash: group -> turns taken in its current weighted visit (derived)
    "gpaused",   # set: groups parked by a per-lane pause
    "paused",    # string: the queue-wide pause flag
    "delayed",   # zset: retries and countdowns, score = due time (ms, server clock)
    "dead",      # zset: jobs that used up their attempts, score = time of death
    "wake",      # list: readiness tokens, bounded
    "guard",     # never written: on a cluster, while the queue's slot migrates, a script
                 # that declares a missing key is refused (TRYAGAIN) instead of running on
                 # a half-moved queue; see cluster.py
)

# The constants the three languages share (lua/lib/wake.lua, lua/lib/keys.lua and
# native/src write them too; tests/test_store_layout.py fails when they differ, and checks
# FIXED's order there too). Python reads them from here only.
#: The wake list's bound: tokens are hints (the ring is the truth), so a full list drops the
#: push; a WAKE_DUE token is pushed only while the list holds under half of it.
WAKE_CAP = 16
#: Seconds the wake list lives after a push.
WAKE_TTL = 60
#: The wake tokens: work is claimable; `delayed` got a new earliest entry.
WAKE_WORK, WAKE_DUE = "1", "d"
#: The abort lists' bound (tokens a master has not taken yet) and their life after a push
#: (seconds): a master gone leaves its list to expire (lua/abort.lua).
ABORT_CAP = 64
ABORT_TTL = 60
#: A tenant's mark on the ring is the byte 0xff (never in UTF-8 text, so starting no group
#: name) and the tenant's name; here as the connections decode it (surrogateescape).
TENANT_MARK = "\udcff"
#: Lane scores are priority * PRIO_SPAN + the enqueue time in ms.
PRIO_SPAN = 10**13

#: The type each named key of a queue holds, by its name after the queue's base (the fixed
#: keys but ``paused`` and ``guard``, which may hold anything, and the books beside them).
NAMED_TYPES = {
    "ring": "list", "active": "zset", "gactive": "hash", "glimit": "hash", "gweight": "hash",
    "gturn": "hash", "gpaused": "set", "delayed": "zset", "dead": "zset", "wake": "list",
    "grate": "hash", "gmax": "hash", "gdefaults": "hash", "gbackoff": "hash", "gwait": "zset",
    "fairness": "string", "gvt": "zset", "gvrun": "hash", "gcost": "hash", "busy": "hash",
    "schedules": "hash", "schedstate": "hash", "schedver": "string", "tasks": "hash",
    "workers": "hash", "audit": "stream",
    "gtenant": "hash", "tactive": "hash", "tlimit": "hash", "tweight": "hash", "tpaused": "set",
    "trate": "hash", "tmax": "hash", "twait": "zset",
}
#: The families of keys named by an id or a group: (family, the name's prefix and suffix,
#: the type). A group's keys are matched by suffix in this order.
FAMILIES = (
    ("job", "job:", "", "hash"),          # a job's row
    ("minute", "h:", "", "hash"),         # a minute's history counters
    ("done", "done:", "", "list"),        # the end of a job, for get()
    ("workflow", "wf:", "", "hash"),
    ("chord", "chord:", "", "hash"),
    ("worker", "worker:", "", "string"),  # a master's heartbeat
    ("aborts", "aborts:", "", "list"),    # the aborts asked of one master (abort.lua)
    ("unique", "u:", "", "string"),       # a unique key's holder, its job id (enqueue.lua)
    ("lane", "g:", ":pending", "zset"),
    ("starts", "g:", ":starts", "list"),
    ("group_busy", "g:", ":busy", "hash"),
    ("tenant_ring", "t:", ":ring", "list"),   # a tenant's open groups (lua/lib/ring.lua)
    ("tenant_starts", "t:", ":starts", "list"),   # a rate-limited tenant's recent starts
    ("tenant_groups", "t:", ":groups", "set"),    # a tenant's groups (gtenant backwards)
    ("tenant_gvt", "t:", ":gvt", "zset"),     # the same in time mode (lua/lib/timefair.lua)
)


def kind_of(name: str) -> str | None:
    """What a key is, by its name after the base: the name of a named key (NAMED_TYPES), the
    family of one named by an id or a group (FAMILIES), else None (``paused``, ``guard``,
    ``doctor``, a key no verb writes)."""
    if name in NAMED_TYPES:
        return name
    for family, prefix, suffix, _ in FAMILIES:
        if name.startswith(prefix) and name.endswith(suffix):
            return family
    return None


def ident_of(name: str) -> str:
    """The job id, group or minute a key of a family names, from its name after the base
    (``job:7`` -> ``7``, ``g:acme:pending`` -> ``acme``)."""
    kind = kind_of(name)
    for family, prefix, suffix, _ in FAMILIES:
        if family == kind:
            return name[len(prefix):len(name) - len(suffix)]
    raise ValueError(f"{name!r} names no key of a family")


def expected_type(name: str) -> str | None:
    """The type the key of this name (after the base) must hold, or None when any will do."""
    if name in NAMED_TYPES:
        return NAMED_TYPES[name]
    kind = kind_of(name)
    return next((held for family, _, _, held in FAMILIES if family == kind), None)


def check_queue_name(name: str) -> str:
    if not isinstance(name, str) or not QUEUE_NAME.fullmatch(name):
        raise InvalidQueueName(
            f"invalid queue name {name!r}: use 1-64 letters, digits, '_', '.' or '-'"
        )
    return name


def check_job_id(job_id: str) -> str:
    if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
        raise InvalidJobId(
            f"invalid job id {job_id!r}: use 1-128 letters, digits, '_', '.', ':' or '-'"
        )
    return job_id


def check_group(group: object) -> str:
    """A group name: any non-empty UTF-8 text up to GROUP_MAX_BYTES bytes, or InvalidGroup.

    Anything else goes, braces, colons, spaces, control characters and NUL included: a lane
    is ``emq:{q}:g:<group>:pending`` (the tag is the first ``{...}``, the queue's; the lane's
    name is the group's bytes between a fixed prefix and a fixed suffix, so two groups
    never share a lane), and other structures hold groups as members or fields, never in
    key names. Lone surrogates (text that is not UTF-8) are refused.
    """
    if not isinstance(group, str) or not group:
        raise InvalidGroup(f"invalid group {group!r}: a group is a non-empty string")
    try:
        size = len(group.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidGroup(f"invalid group {group[:40]!r}: not valid UTF-8 text "
                           f"(a lone surrogate)") from None
    if size > GROUP_MAX_BYTES:
        raise InvalidGroup(f"invalid group: {size} bytes is longer than {GROUP_MAX_BYTES} "
                           f"bytes")
    return group


def check_tenant(tenant: object) -> str:
    """A tenant's name: the rules of a group's (check_group), or InvalidGroup."""
    if not isinstance(tenant, str) or not tenant:
        raise InvalidGroup(f"invalid tenant {tenant!r}: a tenant is a non-empty string")
    return check_group(tenant)


_last_ms = 0
_seq = 0
#: The random part of job ids: a generator seeded from the OS, seeded again in a forked
#: child (so no two processes share a stream). Not os.urandom per id: a system call that
#: lets go of the GIL, which, where many threads enqueue at once, hands it to another
#: thread and waits to get it back (a thread switch per id).
_random = random.Random(os.urandom(16))
os.register_at_fork(after_in_child=lambda: _random.seed(os.urandom(16)))


class Unique(NamedTuple):
    """A job's unique key, the ms it holds the key at most, and, for a debounced job, the
    debounce and its cap in ms (0: not debounced); enqueue.lua's unique keys."""

    key: str
    hold_ms: int
    debounce_ms: int = 0
    debounce_max_ms: int = 0

    def wire(self) -> str:
        """'<ms>:<key>', or 'd<ms>:<debounce>:<max>:<key>' (lua/enqueue.lua)."""
        if self.debounce_ms:
            return f"d{self.hold_ms}:{self.debounce_ms}:{self.debounce_max_ms}:{self.key}"
        return f"{self.hold_ms}:{self.key}"


#: The longest unique key (its key's name stays far under any server's limit).
MAX_UNIQUE_KEY = 512


def check_unique(key: object, ms: object, debounce_ms: int = 0,
                 debounce_max_ms: int = 0) -> Unique:
    """A unique key (a non-empty string of at most MAX_UNIQUE_KEY characters) and its hold in
    ms (a positive integer of at most 12 digits), or InvalidArgument."""
    if not isinstance(key, str) or not key or len(key) > MAX_UNIQUE_KEY:
        raise InvalidArgument(f"a unique key is a string of 1-{MAX_UNIQUE_KEY} characters, "
                              f"not {key!r}")
    if isinstance(ms, bool) or not isinstance(ms, int) or not 0 < ms < 10**12:
        raise InvalidArgument(f"a unique key's hold is a positive integer of ms, not {ms!r}")
    return Unique(key, ms, debounce_ms, debounce_max_ms)


def new_job_id() -> str:
    """A time-ordered unique id: 12 hex digits of ms, 4 of a per-ms sequence, 8 random."""
    global _last_ms, _seq
    ms = time.time_ns() // 1_000_000
    if ms <= _last_ms:
        ms, _seq = _last_ms, (_seq + 1) & 0xFFFF
    else:
        _seq = 0
    _last_ms = ms
    return f"{ms:012x}{_seq:04x}{_random.getrandbits(32):08x}"


class QueueKeys:
    """Key names of one queue."""

    __slots__ = ("name", "base", "fixed", "ring", "active", "delayed", "dead", "wake",
                 "gactive", "glimit", "gweight", "gpaused", "paused", "grate", "gmax",
                 "gdefaults", "gbackoff", "gwait", "fairness", "gvt", "gvrun", "gcost",
                 "busy", "gtenant", "tactive", "tlimit", "tweight", "tpaused",
                 "trate", "tmax", "twait")

    def __init__(self, name: str) -> None:
        self.name = check_queue_name(name)
        self.base = f"emq:{{{name}}}:"
        self.fixed = tuple(self.base + k for k in FIXED)
        b = self.base
        self.ring, self.active, self.delayed, self.dead = b + "ring", b + "active", \
            b + "delayed", b + "dead"
        self.wake, self.paused, self.gpaused = b + "wake", b + "paused", b + "gpaused"
        self.gactive, self.glimit, self.gweight = b + "gactive", b + "glimit", b + "gweight"
        # The fairness controls' books, formed by the scripts from the same base:
        # rate limits, lane caps, the defaults for every group, back-offs, and the open
        # groups held back until a time (see lua/lib/place.lua).
        self.grate, self.gmax, self.gdefaults = b + "grate", b + "gmax", b + "gdefaults"
        self.gbackoff, self.gwait = b + "gbackoff", b + "gwait"
        # The time-fair mode's books (lua/lib/timefair.lua): the
        # mode flag, its ring (a zset by virtual time), each group's virtual time and cost
        # estimate, and the queue's busy time in 10 s slots.
        self.fairness, self.gvt, self.gvrun = b + "fairness", b + "gvt", b + "gvrun"
        self.gcost, self.busy = b + "gcost", b + "busy"
        # Tenants (lua/lib/ring.lua): each group's tenant, and each tenant's jobs in flight,
        # limit, weight and pause.
        self.gtenant, self.tactive, self.tlimit = b + "gtenant", b + "tactive", b + "tlimit"
        self.tweight, self.tpaused = b + "tweight", b + "tpaused"
        # a tenant's rate and lane cap over all its groups, and the tenants waiting out
        # their rate (zset, score: when they may start again)
        self.trate, self.tmax, self.twait = b + "trate", b + "tmax", b + "twait"

    def named(self, name: str) -> str:
        """The key of a name after the base: a named key (NAMED_TYPES, ``paused``,
        ``guard``), or one of a family as name_of gives it back."""
        return self.base + name

    def name_of(self, key: str) -> str:
        """A key of this queue by its name after the base (what named() takes)."""
        return key[len(self.base):]

    def job(self, job_id: str) -> str:
        return f"{self.base}job:{job_id}"

    def done(self, job_id: str) -> str:
        """The list a finishing verb pushes to, for clients blocked in ``get()``."""
        return f"{self.base}done:{job_id}"

    def workflow(self, workflow_id: str) -> str:
        """hash: a workflow's state, steps and failure (lua/lib/workflow.lua)."""
        return f"{self.base}wf:{workflow_id}"

    def chord(self, callback_id: str) -> str:
        """hash: a chord callback's collected results, slot -> result JSON."""
        return f"{self.base}chord:{callback_id}"

    def lane(self, group: str) -> str:
        return f"{self.base}g:{group}:pending"

    def starts(self, group: str) -> str:
        """A rate-limited group's last start times (ms), newest first, at most max_jobs."""
        return f"{self.base}g:{group}:starts"

    def tenant_ring(self, tenant: str) -> str:
        """list: the tenant's open groups, turned once per claim of the tenant."""
        return f"{self.base}t:{tenant}:ring"

    def tenant_starts(self, tenant: str) -> str:
        """list: a rate-limited tenant's recent start times (ms), newest first."""
        return f"{self.base}t:{tenant}:starts"

    def tenant_groups(self, tenant: str) -> str:
        """set: the tenant's groups (gtenant read backwards), over which its cap counts."""
        return f"{self.base}t:{tenant}:groups"

    def tenant_gvt(self, tenant: str) -> str:
        """zset: the tenant's open groups in time mode, by virtual time (lua/lib/timefair.lua)."""
        return f"{self.base}t:{tenant}:gvt"

    def group_busy(self, group: str) -> str:
        """hash: 10 s slot -> ms of worker time the group's time-mode jobs used (last minute)."""
        return f"{self.base}g:{group}:busy"

    @property
    def lane_pattern(self) -> str:
        # Group names may hold glob characters; a SCAN pattern escapes none of them, so
        # callers recover the group from the key by slicing, not from the pattern.
        return f"{self.base}g:*:pending"

    def group_of_lane(self, key: str) -> str:
        return key[len(self.base) + 2 : -len(":pending")]

    # -- periodic schedules (schedules.py, lua/schedule.lua) ------------------------------
    @property
    def schedules(self) -> str:
        """hash: schedule name -> its spec (JSON)."""
        return self.base + "schedules"

    @property
    def schedstate(self) -> str:
        """hash: ``<name>:last`` / ``:job`` / ``:lastid`` / ``:key`` / ``:origin`` per schedule."""
        return self.base + "schedstate"

    @property
    def schedver(self) -> str:
        """string: bumped by every change of ``schedules``."""
        return self.base + "schedver"

    @property
    def tasks(self) -> str:
        """hash: task name -> its options (JSON), as the workers of the queue serve them."""
        return self.base + "tasks"

    @property
    def clock(self) -> str:
        """hash: ``seen`` (the latest server time a reap saw, ms), and the last step of the
        server's clock a master saw: ``step`` (ms, + forward) and ``at`` (server ms)."""
        return self.base + "clock"

    @property
    def tally(self) -> str:
        """hash: counters of the queue's life, ``stale_acks`` (acks refused by the fence)."""
        return self.base + "tally"

    # -- what the worker and the verbs keep for the views ---------------------------------
    @property
    def workers(self) -> str:
        """hash: the index of the masters' heartbeats, worker id -> "1" (store/beats.py)."""
        return self.base + "workers"

    def worker(self, worker_id: str) -> str:
        """string: one master's heartbeat (JSON), expiring unless it beats again."""
        return f"{self.base}worker:{worker_id}"

    def aborts(self, worker_id: str) -> str:
        """list: ``<job id> <nonce>`` tokens, the aborts asked of one master (abort.lua);
        the master blocks on it while it runs jobs."""
        return f"{self.base}aborts:{worker_id}"

    def unique(self, key: str) -> str:
        """string: the id of the job holding a unique key (enqueue.lua), PX its unique_for."""
        return f"{self.base}u:{key}"

    def minute(self, minute: int) -> str:
        """hash: the counters the verbs keep of one unix minute (store/minutes.py)."""
        return f"{self.base}h:{minute}"

    @property
    def audit(self) -> str:
        """stream: the changes operators made (store/audit.py), one entry each, capped."""
        return self.base + "audit"

    @property
    def doctor(self) -> str:
        """A key of the queue no verb uses: the doctor's ACL probes run on it (acl.py)."""
        return self.base + "doctor"

    @property
    def all_pattern(self) -> str:
        # Queue names hold no glob characters, and Redis globs give braces no meaning.
        return self.base + "*"
