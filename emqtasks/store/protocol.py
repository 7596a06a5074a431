"""The names the three languages share beyond the keyspace: a job row's fields, a job's
arguments, the rows the verbs read field by field and the order of the lease reply.

The Lua library (``lua/lib``) and the native module (``native/src``) write these by hand;
``tests/test_store_layout.py`` reads both and fails on any difference from the tables here
(the keys' order and the constants it checks against ``keys.py``). Python decodes with them:
``Lease`` (replies.py) is the lease reply, field for field, and ``row_fault`` there judges a
row by ROW_INTS.
"""

from __future__ import annotations

#: Every field a job row (``emq:{q}:job:<id>``, a hash) may hold: the ten ``NEW_ROW`` fields
#: and ``prio`` and ``expires`` (the deadline of ``apply_async(expires=...)``, server ms: a
#: claim that meets the job after it ends it ``expired``) written when the job is created;
#: the lease's (``nonce``, ``started``,
#: ``fence``, ``ran``, ``unrun``, ``vcharge``: lua/lib/claim.lua, lua/lib/timefair.lua); the
#: end's (``finished``, ``result``, ``error``) and the clients blocked on it (``waiters``);
#: a workflow step's (``wf`` ... ``shape``: lua/lib/workflow.lua); the span of its last failed
#: attempt (``tlink``, a W3C traceparent retry.lua keeps for the next attempt's span link);
#: a released step's, from the ack that released it (``tparent``: the releasing run's span,
#: its run's parent; ``tlinks``: a chord callback's other members' spans, space-separated,
#: linked; lua/lib/workflow.lua);
#: the attempt an abort was asked of (``abort``: its nonce, lua/abort.lua);
#: the unique key a job was enqueued with (``unique``) and a debounced job's first call
#: (``dfirst``, server ms; lua/enqueue.lua).
ROW_FIELDS = (
    "task", "payload", "group", "state", "attempts", "max", "lease", "delay", "ttl",
    "created", "prio", "expires",
    "nonce", "started", "fence", "ran", "unrun", "vcharge",
    "finished", "result", "error", "waiters",
    "wf", "next", "slot", "par", "imm", "splice", "comma", "cd", "npend", "nslots", "shape",
    "tlink", "tparent", "tlinks", "abort", "unique", "dfirst",
)

#: The arguments of one job, in order: enqueue takes ten per job, a workflow ten per step
#: (then its own), a schedule's fire the ten of its slot's job (``NewJob``, field for field;
#: lua/lib/jobrow.lua ``J_*``, native/src/jobrow.c ``J_*``).
JOB_ARGS = ("id", "task", "payload", "group", "max", "lease", "delay", "ttl", "countdown",
            "priority")

#: The fields a new job's row is written with, in this order, by the one writer of a new
#: row in each language (lua/lib/jobrow.lua ``new_job``, native/src/jobrow.c ``new_job``);
#: ``prio`` follows when the priority is not 0.
NEW_ROW = ("task", "payload", "group", "state", "attempts", "max", "lease", "delay", "ttl",
           "created")

#: What the fence reads of a leased job's row, in this order (lua/lib/fence.lua
#: ``FENCED_ROW`` and its ``F_*`` indexes; native/src/fence.c reads the same into ``Row``).
FENCED_ROW = ("state", "attempts", "nonce", "group", "max", "ttl", "waiters", "started",
              "vcharge", "wf", "next", "slot", "task")

#: What a claim reads of the row of the job it popped, in this order (lua/lib/rows.lua
#: ``LEASE_ROW`` and its ``R_*`` indexes; native/src/rows.c ``R_*``).
LEASE_ROW = ("task", "payload", "lease", "state", "attempts", "fence", "group", "max", "ttl",
             "delay", "created", "expires")

#: A row's integer fields as every verb reads them: (name, required); lua/lib/rows.lua
#: ``row_fault``'s ``int_fault`` calls, native/src/rows.c ``ROW_INTS``.
ROW_INTS = (("attempts", True), ("lease", True), ("fence", False), ("max", True),
            ("ttl", False), ("delay", False), ("created", True), ("expires", False))

#: One leased job as claim (and ack's next job) answers it, position by position: the fields
#: of ``Lease`` (lua/lib/claim.lua ``claim_one``'s reply, native/src/claim.c ``reply_job``).
LEASE_REPLY = ("id", "task", "payload", "attempts", "nonce", "group", "lease_ms", "more",
               "fence")
