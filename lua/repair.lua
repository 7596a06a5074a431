-- repair: rebuild the derived structures (ring, gactive, gturn, wake) from the lanes, the
-- active set and the rows, and put back jobs whose row says they wait but no structure
-- holds them (what a server restart without full persistence can leave behind).
--
-- KEYS: the queue's fixed keys (see _common.lua).
-- ARGV[1]  n, the number of groups that follow
-- ARGV[2 .. n+1]  every group known to the queue (lanes, books, settings)
-- ARGV[n+2 ..]  ids of rows in state pending, delayed or active that no structure holds
-- Reply: {groups_on_ring, jobs_restored}.
-- Side effects: `ring` (or in time mode `gvt`, each group at its virtual time or the floor),
--   `gwait`, `gactive` and `gturn` rewritten (an open group whose rate
--   budget is spent or that backs off waits in `gwait`); restored ids into their lane, or
--   `delayed` (due now), or `active` (lease expired now, for the reaper); ids in `active`
--   whose row is gone are dropped; a wake when the ring is not empty.

local n = tonumber(ARGV[1])
-- Candidates for the ring: the groups the caller found, those on the ring now (one may have
-- become serviceable since the caller looked), and the groups of restored jobs.
local candidates, seen = {}, {}
local function candidate(g)
  if g and not seen[g] then seen[g] = true; candidates[#candidates + 1] = g end
end
for i = 2, n + 1 do candidate(ARGV[i]) end
for _, g in ipairs(redis.call('LRANGE', K_ring, 0, -1)) do candidate(g) end
for _, g in ipairs(redis.call('ZRANGE', K_gvt, 0, -1)) do candidate(g) end
for _, g in ipairs(redis.call('ZRANGE', K_gwait, 0, -1)) do candidate(g) end
redis.call('DEL', K_ring, K_gactive, K_gturn, K_gwait, K_gvt)
local restored = 0
local now = now_ms()
for i = n + 2, #ARGV do
  local id = ARGV[i]
  local row = redis.call('HMGET', job_key(id), 'state', 'group', 'created')
  if row[1] == 'pending' and row[2] then
    if not redis.call('ZSCORE', lane_key(row[2]), id) then
      local prio = redis.call('HGET', job_key(id), 'prio')
      redis.call('ZADD', lane_key(row[2]), lane_score(prio, tonumber(row[3] or now)), id)
      restored = restored + 1
    end
    candidate(row[2])
  elseif row[1] == 'delayed' and not redis.call('ZSCORE', K_delayed, id) then
    redis.call('ZADD', K_delayed, now, id)
    restored = restored + 1
  elseif row[1] == 'active' and not redis.call('ZSCORE', K_active, id) then
    redis.call('ZADD', K_active, now, id)   -- an expired lease: the next reap returns it
    restored = restored + 1
  end
end
local active = redis.call('ZRANGE', K_active, 0, -1)
for _, id in ipairs(active) do
  local g = redis.call('HGET', job_key(id), 'group')
  if g then redis.call('HINCRBY', K_gactive, g, 1) else redis.call('ZREM', K_active, id) end
end
local ringed = 0
for _, g in ipairs(candidates) do
  if open(g) then
    local at = ready_at(g, now)
    if at then
      redis.call('ZADD', K_gwait, at, g)
    else
      ring_push(g)
      ringed = ringed + 1
    end
  end
end
if ringed > 0 then wake() end
return {ringed, restored}
