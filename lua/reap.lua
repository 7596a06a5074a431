-- reap: return jobs whose lease expired to their lane, or to `dead` when out of attempts.
--
-- KEYS: the queue's fixed keys (see _common.lua).
-- ARGV[1]  limit, the most expired leases handled in this call
-- Reply: {returned, dead} counts.
-- Side effects: counts it in the minute's history (_common.lua); per expired id, removed from `active`, gactive-1; state pending and back in
--   its lane with its original enqueue time as score (ahead of newer work), or state dead
--   with error "lease expired" in `dead`; groups rejoin the ring with a wake. A job claimed
--   in time mode: its group pays its claim-to-deadline time (no estimate fed). A dead
--   workflow step fails its workflow (wf_fail in _common.lua).

runs_when_full()
local now = now_ms()
local ids = redis.call('ZRANGEBYSCORE', K_active, '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local returned, dead = 0, 0
for _, id in ipairs(ids) do
  local jk = job_key(id)
  local row = redis.call('HMGET', jk, 'group', 'attempts', 'max', 'created', 'waiters', 'prio',
    'started', 'vcharge', 'wf', 'task')
  if row[1] then time_settle(row[1], id, row[7], row[8], now, false) end
  redis.call('ZREM', K_active, id)
  if row[1] then
    active_drop(row[1], now)
    if tonumber(row[2]) >= tonumber(row[3]) then
      redis.call('HSET', jk, 'state', 'dead', 'error', 'lease expired', 'finished', now)
      redis.call('ZADD', K_dead, now, id)
      hist_failed(now, row[10] or '', row[1], true)
      notify(id, row[5])
      if row[9] then wf_fail(row[9], id, now) end
      dead = dead + 1
    else
      redis.call('HSET', jk, 'state', 'pending', 'error', 'lease expired')
      lane_push(row[1], id, lane_score(row[6], tonumber(row[4])), now)
      hist_failed(now, row[10] or '', row[1], false)
      returned = returned + 1
    end
  end
end
return {returned, dead}
