-- wfcancel: cancel every step of a workflow that has not started, in one call.
--
-- KEYS: the queue's fixed keys (see _common.lua).
-- ARGV[1]  wf, the workflow's id
-- Reply: the number of steps cancelled (0 when the workflow is gone).
-- Side effects: the workflow's state is cancelled (its link_error step too, unreleased);
--   each step waiting, pending (its lane left; an emptied lane leaves the ring) or delayed
--   is cancelled as cancel.lua does; running, finished and dead steps are left alone, and
--   the children of a running step stay cancelled when its ack comes.

local wk = wf_key(ARGV[1])
local w = redis.call('HMGET', wk, 'steps', 'lerr')
if not w[1] then return 0 end
redis.call('HSET', wk, 'state', 'cancelled')
local now = now_ms()
local n = 0
local ids = w[1]
if w[2] then ids = ids .. ' ' .. w[2] end
for id in string.gmatch(ids, '%S+') do
  local jk = job_key(id)
  local row = redis.call('HMGET', jk, 'state', 'group', 'ttl', 'waiters')
  local state, g = row[1], row[2]
  if state == 'pending' or state == 'delayed' or state == 'waiting' then
    if state == 'pending' then
      local was = placed(g)
      redis.call('ZREM', lane_key(g), id)
      settle(g, was, now)
    elseif state == 'delayed' then
      redis.call('ZREM', K_delayed, id)
    end
    redis.call('DEL', chord_key(id))
    redis.call('HSET', jk, 'state', 'cancelled', 'finished', now)
    redis.call('HDEL', jk, 'payload')
    notify(id, row[4])
    local ttl = tonumber(row[3] or '0')
    if ttl > 0 then redis.call('EXPIRE', jk, ttl) else redis.call('DEL', jk) end
    n = n + 1
  end
end
return n
