-- schedule: store, drop and fire periodic schedules; each slot is enqueued at most once.
--
-- KEYS: the queue's fixed keys (see lib/keys.lua), then three of its own (emqtasks/scripts.py
--   VERB_KEYS; the prelude names them):
--   K_schedules   (emq:{q}:schedules)  hash: name -> the schedule's spec (JSON, as
--                 emqtasks/schedules.py writes it)
--   K_schedstate  (emq:{q}:schedstate) hash, per schedule name:
--                         '<name>:last'   the latest slot handled (UNIX s): a slot at or
--                                         before it is refused, whatever the rows' ttl
--                         '<name>:job'    the id of the last job enqueued (overlap control)
--                         '<name>:lastid' the id of the last slot handled (enqueued or skipped)
--                         '<name>:key'    what decides its slots (emqtasks/cron.py Timing.key)
--                         '<name>:origin' 'code' (declared in a worker's modules) or 'runtime'
--   K_schedver    (emq:{q}:schedver)   string: bumped by every change of `schedules`;
--                 masters re-read the schedules when it moved
-- Includes: core, keys, jobrow
-- ARGV[1]  op, one of:
--   'put'   ARGV[2] name, ARGV[3] spec JSON, ARGV[4] timing key, ARGV[5] origin.
--           A new schedule, or one whose timing key changed, owes no slot before now: its
--           `last` becomes max(last, now). The origin is kept, never compared.
--   'drop'  ARGV[2] name: the spec and its state go.
--   'fire'  ARGV[2] name, ARGV[3] slot (UNIX s), ARGV[4] overlap: '1' allowed, '0' skip
--           the slot while the job of the schedule's previous slot is pending, delayed or
--           active; then the 9 fields of one job as enqueue.lua takes them
--           (id task payload group max lease delay ttl countdown).
-- Reply:
--   put:  1 stored (new or changed; the version is bumped), 0 unchanged.
--   drop: 1 removed (the version is bumped), 0 no such schedule.
--   fire: {verdict, now_ms, last}: verdict 1 enqueued; 0 duplicate (the slot is at or
--         before `last`, or its row exists: nothing written but `last`); 2 skipped by
--         overlap control (the slot's id gets a row in state `skipped`, kept for the job's
--         ttl, and the slot counts as handled); -1 early (the slot is after the server's
--         now: nothing written); -2 no such schedule (dropped meanwhile: nothing written).
--         `last` is the marker after the call.
-- Side effects of an enqueued slot: the row and its lane (or `delayed` for a countdown),
--   the ring and a wake, written by the same helper as enqueue.lua's (new_job in
--   lib/jobrow.lua), with the differences said below.

local SCHEDULES, STATE, VERSION = K_schedules, K_schedstate, K_schedver
local op, name = ARGV[1], ARGV[2]

if op == 'put' then
  local spec, key, origin = ARGV[3], ARGV[4], ARGV[5]
  redis.call('HSET', STATE, name .. ':origin', origin)
  local old = redis.call('HGET', SCHEDULES, name)
  local old_key = redis.call('HGET', STATE, name .. ':key')
  if old == spec and old_key == key then return 0 end
  redis.call('HSET', SCHEDULES, name, spec)
  if old_key ~= key then
    local now_s = math.floor(now_ms() / 1000)
    local last = tonumber(redis.call('HGET', STATE, name .. ':last') or '0')
    redis.call('HSET', STATE, name .. ':key', key, name .. ':last', math.max(last, now_s))
  end
  redis.call('INCR', VERSION)
  return 1
end

if op == 'drop' then
  if redis.call('HDEL', SCHEDULES, name) == 0 then return 0 end
  redis.call('HDEL', STATE, name .. ':last', name .. ':job', name .. ':lastid', name .. ':key',
    name .. ':origin')
  redis.call('INCR', VERSION)
  return 1
end

-- fire
local now = now_ms()
local slot = tonumber(ARGV[3])
local last = tonumber(redis.call('HGET', STATE, name .. ':last') or '-1')
if redis.call('HEXISTS', SCHEDULES, name) == 0 then return {-2, now, last} end
if slot * 1000 > now then return {-1, now, last} end
if slot <= last then return {0, now, last} end
local at = 5        -- ARGV[at + J_*]: the slot's job (lib/jobrow.lua)
local id = ARGV[at + J_ID]
local ttl = tonumber(ARGV[at + J_TTL])
local jk = job_key(id)
redis.call('HSET', STATE, name .. ':last', slot, name .. ':lastid', id)
if redis.call('EXISTS', jk) == 1 then return {0, now, slot} end
if ARGV[4] == '0' then
  local prev = redis.call('HGET', STATE, name .. ':job')
  local st = prev and redis.call('HGET', job_key(prev), 'state')
  if st == 'pending' or st == 'delayed' or st == 'active' then
    if ttl > 0 then
      skip_job(at, now, ttl, 'skipped: the previous job of the schedule, ' .. prev ..
        ', is still ' .. st)
    end
    return {2, now, slot}
  end
end
-- A slot's job differs from a producer's on purpose: it has no priority (a schedule takes
-- none: lane score = its time); it is not held to its lane's cap, since the slot is marked
-- handled above and a refusal would drop it for good, with no caller to raise LaneFull to
-- (work the queue accepted is never dropped, README "Lane cap"); and the minute's history
-- does not count it as enqueued: only enqueue.lua counted when each verb wrote its own row,
-- and that is kept (its start and end count).
new_job(at, 0, now, nil, false, true, nil)
redis.call('HSET', STATE, name .. ':job', id)
return {1, now, slot}
