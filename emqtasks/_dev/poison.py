"""Poisoned rows for the chaos soak: what a user with a producer's ACL may write into its
queue (``acl.producer_rules``: HSET, ZADD, RPUSH, INCR, and EVAL over them) that no verb
can read. Each poisoned job must end in ``dead`` with a reason; the queue must go on.

Flavours:

- ``field``: a job row as enqueue writes it, but one count or time is not an integer
  (``attempts`` = ``abc``...), its id at the head of a group's waiting lane;
- ``string``: a job key holding a string (INCR), its id at the head of a lane;
- ``lane``: a group's lane key holding a string (INCR), the group on the ring, and a row of
  that group (spoilt as in ``field``: the claim cannot reach it, ``check --repair`` buries
  it).

A job goes into a group that has jobs waiting (the first of ``groups`` whose lane is not
empty, so it is on the ring), else into a group of its own whose lane it opens.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

from ..store.keys import QueueKeys
from ..store.queue import NewJob

FLAVOURS = ("field", "string", "lane")
#: A field of the row and what it holds instead of integer text.
SPOILS = (("attempts", "abc"), ("attempts", "-"), ("max", "ten"), ("lease", "2.5"),
          ("created", "yesterday"))

#: KEYS[1] the job's key; KEYS[2] ring (list); KEYS[3] wake (list); KEYS[4..] the lanes
#: (zsets) of the candidate groups, the last one a group of the job's own (no lane yet).
#: ARGV[1] the flavour; ARGV[2] the job id; ARGV[3] the row's fields, JSON (the group is
#: set here); ARGV[4..] the groups of KEYS[4..]. Reply: the group the job went to.
SCRIPT = """
local flavour, id = ARGV[1], ARGV[2]
local n = #KEYS - 3
local pick = n
if flavour ~= 'lane' then
  for i = 1, n - 1 do
    if redis.call('ZCARD', KEYS[3 + i]) > 0 then pick = i break end
  end
end
local lane, g = KEYS[3 + pick], ARGV[3 + pick]
if flavour == 'string' then
  redis.call('INCR', KEYS[1])
else
  for k, v in pairs(cjson.decode(ARGV[3])) do redis.call('HSET', KEYS[1], k, v) end
  redis.call('HSET', KEYS[1], 'group', g)
end
if flavour == 'lane' then
  redis.call('INCR', lane)
else
  local head = redis.call('ZRANGE', lane, 0, 0, 'WITHSCORES')
  local t = redis.call('TIME')
  local score = t[1] * 1000 + math.floor(t[2] / 1000)
  if head[2] then score = tonumber(head[2]) end
  redis.call('ZADD', lane, score - 1, id)
end
if pick == n then
  redis.call('RPUSH', KEYS[2], g)
  if redis.call('LLEN', KEYS[3]) < 16 then
    redis.call('RPUSH', KEYS[3], '1')
    redis.call('EXPIRE', KEYS[3], 60)
  end
end
return g
"""


def row_of(job: NewJob, spoil: tuple[str, str]) -> dict[str, Any]:
    """The fields enqueue writes for ``job`` (group aside), one of them spoilt; all text
    (a number through Lua would be written as %.14g)."""
    row: dict[str, Any] = {
        "task": job.task, "payload": job.payload, "state": "pending", "attempts": 0,
        "max": job.max_attempts, "lease": job.lease_ms, "delay": job.delay_ms,
        "ttl": job.ttl, "created": int(time.time() * 1000)}
    row[spoil[0]] = spoil[1]
    return {k: str(v) for k, v in row.items()}


def write(client: Any, queue: str, flavour: str, job: NewJob, groups: list[str],
          own_group: str, rng: random.Random) -> str:
    """Write one poisoned job (its id and payload from ``job``); the group it went to."""
    keys = QueueKeys(queue)
    spoilt = row_of(job, rng.choice(SPOILS))
    every = [*groups, own_group]
    return str(client.eval(SCRIPT, 3 + len(every), keys.job(job.id), keys.ring, keys.wake,
                           *(keys.lane(g) for g in every), flavour, job.id,
                           json.dumps(spoilt), *every))
