-- cancel: withdraw a job that is not running.
--
-- KEYS: the queue's fixed keys (see _common.lua).
-- ARGV[1]  id
-- Reply: 1 cancelled; 0 no such job; -1 running (a leased job is not interrupted);
--   -2 already finished (done or cancelled).
-- Side effects: the id leaves its lane (an emptied lane leaves the ring), `delayed` or
--   `dead`; state cancelled; the row expires after its ttl; a chord callback's results hash
--   goes. A step of a running workflow (not its link_error step) takes its workflow with
--   it, as wfcancel.lua does (wf_cancel): the steps after it could never start, and the
--   workflow's `get()` would otherwise wait for ever.

local id = ARGV[1]
local jk = job_key(id)
local row = redis.call('HMGET', jk, 'state', 'group', 'ttl', 'waiters', 'wf')
local state, g = row[1], row[2]
if not state then return 0 end
if state == 'active' then return -1 end
if state == 'done' or state == 'cancelled' then return -2 end
if state == 'pending' then
  local was = placed(g)
  redis.call('ZREM', lane_key(g), id)
  settle(g, was, now_ms())
elseif state == 'delayed' then
  redis.call('ZREM', K_delayed, id)
elseif state == 'dead' then
  redis.call('ZREM', K_dead, id)
end
redis.call('HSET', jk, 'state', 'cancelled', 'finished', now_ms())
redis.call('HDEL', jk, 'payload')
notify(id, row[4])
local ttl = tonumber(row[3] or '0')
if ttl > 0 then redis.call('EXPIRE', jk, ttl) else redis.call('DEL', jk) end
redis.call('DEL', chord_key(id))   -- a chord's callback: the members' results it waited for
local w = row[5] and redis.call('HMGET', wf_key(row[5]), 'state', 'lerr')
if w and w[1] == 'running' and w[2] ~= id then
  -- (the link_error step strands no step: it waits for a failure that may never come)
  wf_cancel(row[5], now_ms())
end
return 1
