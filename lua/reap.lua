-- reap: return jobs whose lease expired to their lane, or to `dead` when out of attempts;
-- and keep the queue's clock mark (the latest server time a reap saw), run by every master
-- on its tick.
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: core, keys, marks, timefair, place, history, wake, workflow
-- ARGV[1]  limit, the most expired leases handled in this call
-- Reply: {returned, dead, now, seen}: counts; the server time (ms) and the queue's clock mark
--   before this call (0 for none): a mark ahead of now is a server clock stepped back.
-- Side effects: per expired id, removed from `active`, gactive-1, then:
--   - a claim never seen running (its row's `ran` is not its nonce: no renewal reached the
--     server, as for a claim whose reply was lost) is given back, at most `max` times per
--     job (`unrun` counts them): attempts-1, state pending, back in its lane;
--   - else its attempt is spent: state pending and back in its lane, or, out of attempts,
--     state dead with error "lease expired" in `dead`;
--   counted in the minute's history as retried (a lease the reaper took back) or dead.
--   A returned job keeps its original enqueue time as score (ahead of newer work); groups
--   rejoin the ring with a wake. A job claimed in time mode: its group pays its
--   claim-to-deadline time (no estimate fed). A dead workflow step fails its workflow
--   (wf_fail in lib/workflow.lua). The clock mark (clock_mark in lib/marks.lua) moves up to now,
--   never back.

local UNRUN = 'lease expired before the job was seen running (attempt not counted)'

runs_when_full()
local now = now_ms()
local seen = clock_mark(now)
local ids = redis.call('ZRANGEBYSCORE', K_active, '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local returned, dead = 0, 0
for _, id in ipairs(ids) do
  local jk = job_key(id)
  local row = redis.call('HMGET', jk, 'group', 'attempts', 'max', 'created', 'waiters', 'prio',
    'started', 'vcharge', 'wf', 'task', 'nonce', 'ran', 'unrun')
  if row[1] then time_settle(row[1], id, row[7], row[8], now, false) end
  redis.call('ZREM', K_active, id)
  if row[1] then
    active_drop(row[1], now)
    local unrun = tonumber(row[13] or '0') or 0
    if unrun ~= unrun then unrun = 0 end   -- nan: unreadable, as none
    if row[12] ~= row[11] and unrun < tonumber(row[3]) then
      redis.call('HINCRBY', jk, 'attempts', -1)
      redis.call('HINCRBY', jk, 'unrun', 1)
      redis.call('HSET', jk, 'state', 'pending', 'error', UNRUN)
      lane_push(row[1], id, lane_score(row[6], tonumber(row[4])), now)
      hist_failed(now, row[10] or '', row[1], false)
      returned = returned + 1
    elseif tonumber(row[2]) >= tonumber(row[3]) then
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
return {returned, dead, now, seen or 0}
