-- enqueue: admit jobs idempotently, one or many in one call, each with its own verdict.
--
-- KEYS: the queue's fixed keys (see _common.lua).
-- ARGV[1]      n, the number of jobs; then 9 fields per job:
--   id         job id (gated again here: 1-128 of [A-Za-z0-9_.:-])
--   task       registered task name
--   payload    the JSON envelope of the arguments
--   group      the lane
--   max        max attempts
--   lease      lease length, ms
--   delay      fixed retry delay, ms
--   ttl        seconds a finished row (and its result) lives; 0 keeps nothing
--   countdown  ms until due; 0 means now (into the lane), > 0 goes to `delayed`
-- Reply: an array of n integers, one per job: 1 enqueued, 0 duplicate (the row exists, so
--   nothing was written), -1 refused because the id is malformed.
-- Side effects: writes emq:{q}:job:<id>; adds the id to its lane (a lane that becomes
--   serviceable joins the ring and pushes a wake) or to `delayed`.

local n = tonumber(ARGV[1])
local now = now_ms()
local out = {}
for i = 0, n - 1 do
  local o = 1 + i * 9
  local id, task, payload, g = ARGV[o + 1], ARGV[o + 2], ARGV[o + 3], ARGV[o + 4]
  local countdown = tonumber(ARGV[o + 9])
  if #id > 128 or not string.match(id, '^[%w_.:%-]+$') then
    out[#out + 1] = -1
  else
    local jk = job_key(id)
    if redis.call('EXISTS', jk) == 1 then
      out[#out + 1] = 0
    else
      local state = 'pending'
      if countdown > 0 then state = 'delayed' end
      redis.call('HSET', jk, 'task', task, 'payload', payload, 'group', g, 'state', state,
        'attempts', 0, 'max', ARGV[o + 5], 'lease', ARGV[o + 6], 'delay', ARGV[o + 7],
        'ttl', ARGV[o + 8], 'created', now)
      if countdown > 0 then
        delay_push(id, now + countdown)
      else
        lane_push(g, id, now)
      end
      out[#out + 1] = 1
    end
  end
end
return out
