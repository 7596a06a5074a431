-- withdraw: cancel a job that is not running, or every step of a workflow not yet started.
-- Includes: keys, wake, place

-- Withdraw a job that is not running and mark it cancelled (cancel.lua, wf_cancel). row:
-- its {state, group, ttl, waiters}; state pending (it leaves its lane; an emptied lane
-- leaves the ring), delayed, dead or waiting. A chord callback's results hash goes; the row
-- expires after its ttl.
local function cancel_job(id, row, now)
  local jk = job_key(id)
  local state, g = row[1], row[2]
  if state == 'pending' then
    local was = placed(g)
    redis.call('ZREM', lane_key(g), id)
    settle(g, was, now)
  elseif state == 'delayed' then
    redis.call('ZREM', K_delayed, id)
  elseif state == 'dead' then
    redis.call('ZREM', K_dead, id)
  end
  redis.call('DEL', chord_key(id))
  redis.call('HSET', jk, 'state', 'cancelled', 'finished', now)
  redis.call('HDEL', jk, 'payload')
  notify(id, row[4])
  local ttl = tonumber(row[3] or '0')
  if ttl > 0 then redis.call('EXPIRE', jk, ttl) else redis.call('DEL', jk) end
end

-- Cancel every step of workflow `wf` that has not started (waiting, pending, delayed: as
-- cancel_job), its link_error step unreleased, and mark it cancelled; returns how many.
-- Admin verbs only (wfcancel.lua, cancel.lua): no native twin.
local function wf_cancel(wf, now)
  local wk = wf_key(wf)
  local w = redis.call('HMGET', wk, 'steps', 'lerr')
  if not w[1] then return 0 end
  redis.call('HSET', wk, 'state', 'cancelled')
  local n = 0
  local ids = w[1]
  if w[2] then ids = ids .. ' ' .. w[2] end
  for id in string.gmatch(ids, '%S+') do
    local row = redis.call('HMGET', job_key(id), 'state', 'group', 'ttl', 'waiters')
    if row[1] == 'pending' or row[1] == 'delayed' or row[1] == 'waiting' then
      cancel_job(id, row, now)
      n = n + 1
    end
  end
  return n
end
