-- withdraw: cancel a job that is not running, or every step of a workflow not yet started.
-- Includes: keys, wake, place

-- What withdrawing reads of a job's row: these fields in this order, read as row[C_*].
local CANCEL_ROW = {'state', 'group', 'ttl', 'waiters', 'wf'}
local C_STATE, C_GROUP, C_TTL, C_WAITERS, C_WF = 1, 2, 3, 4, 5

-- Withdraw a job that is not running and mark it cancelled (cancel.lua, wf_cancel). row:
-- its CANCEL_ROW; state pending (it leaves its lane; an emptied lane
-- leaves the ring), delayed, dead or waiting. A chord callback's results hash goes; the row
-- expires after its ttl.
local function cancel_job(id, row, now)
  local jk = job_key(id)
  local state, g = row[C_STATE], row[C_GROUP]
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
  notify(id, row[C_WAITERS])
  local ttl = tonumber(row[C_TTL] or '0')
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
    local row = redis.call('HMGET', job_key(id), unpack(CANCEL_ROW))
    local state = row[C_STATE]
    if state == 'pending' or state == 'delayed' or state == 'waiting' then
      cancel_job(id, row, now)
      n = n + 1
    end
  end
  return n
end
