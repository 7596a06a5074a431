-- repair: rebuild the derived structures (ring, the tenants' rings, gactive, tactive, gturn,
-- wake) from the lanes, the
-- active set and the rows, move rows a claim cannot read to `dead` with the reason, and put
-- back jobs whose row says they wait but no structure holds them (what a server restart
-- without full persistence can leave behind).
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: core, keys, settings, seat, rows, place, ring, wake
-- ARGV[1]  n, the number of groups that follow
-- ARGV[2 .. n+1]  every group known to the queue (lanes, books, settings)
-- then     d, and d names (after BASE) of derived keys to delete first: each holds the wrong
--          type (or unreadable learnt values), and is rebuilt here or by the verbs
-- then     b, and b triples (id, group or '', reason): jobs whose row a claim cannot read,
--          taken out of their lane, `delayed` or `active` and buried in `dead` (bury)
-- then     ids of rows in state pending, delayed, active or dead that no structure holds
-- Reply: {groups_on_ring, jobs_restored}.
-- Side effects: the d keys deleted; `ring` (or in time mode `gvt`, each group at its virtual
--   time or the floor), `gwait`, `gactive` and `gturn` rewritten (an open group whose rate
--   budget is spent or that backs off waits in `gwait`; a group whose books a claim cannot
--   read stays off the ring); buried rows in `dead`; restored ids into their lane, or
--   `delayed` (due now), or `active` (lease expired now, for the reaper), or `dead`; ids in
--   `active` whose row is gone are dropped; a wake when the ring is not empty.

local n = tonumber(ARGV[1])
local p = n + 2
for i = p + 1, p + tonumber(ARGV[p]) do redis.call('DEL', queue_key(ARGV[i])) end
p = p + tonumber(ARGV[p]) + 1
local now = now_ms()
for i = p + 1, p + 3 * tonumber(ARGV[p]), 3 do
  local id, g = ARGV[i], ARGV[i + 1]
  if g == '' then g = nil end
  if g then redis.call('ZREM', lane_key(g), id) end
  redis.call('ZREM', K_delayed, id)
  redis.call('ZREM', K_active, id)
  local t = type_of(job_key(id))
  if t == 'hash' or t == 'none' then t = nil end
  local refused = bury(id, g, ARGV[i + 2], now, t)   -- `dead` was rebuilt above if it had to
  if refused then return redis.error_reply(refused) end
end
p = p + 3 * tonumber(ARGV[p]) + 1
-- Candidates for the ring: the groups the caller found, those on the ring now (one may have
-- become serviceable since the caller looked), and the groups of restored jobs.
local candidates, seen = {}, {}
local function candidate(g)
  if g and not seen[g] then seen[g] = true; candidates[#candidates + 1] = g end
end
for i = 2, n + 1 do candidate(ARGV[i]) end
for _, g in ipairs(redis.call('LRANGE', K_ring, 0, -1)) do
  if string.byte(g, 1) ~= 255 then candidate(g) end      -- a tenant's mark: its ring below
end
local tenants = {}
for _, t in ipairs(redis.call('HVALS', K_gtenant)) do
  if not tenants[t] then
    tenants[t] = true
    for _, g in ipairs(redis.call('LRANGE', tring_key(t), 0, -1)) do candidate(g) end
    for _, g in ipairs(redis.call('ZRANGE', tgvt_key(t), 0, -1)) do candidate(g) end
    redis.call('DEL', tring_key(t), tgvt_key(t), TEN.groups(t))
  end
end
-- each tenant's set of groups, read back from gtenant (a tenant's lane cap counts over it)
local owners = redis.call('HGETALL', K_gtenant)
for i = 1, #owners, 2 do redis.call('SADD', TEN.groups(owners[i + 1]), owners[i]) end
for _, g in ipairs(redis.call('ZRANGE', K_gvt, 0, -1)) do
  if string.byte(g, 1) ~= 255 then candidate(g) end
end
for _, g in ipairs(redis.call('ZRANGE', K_gwait, 0, -1)) do candidate(g) end
redis.call('DEL', K_ring, K_gactive, K_gturn, K_gwait, K_gvt, K_tactive, TEN.wait)
local restored = 0
for i = p, #ARGV do
  local id = ARGV[i]
  local row = redis.call('HMGET', job_key(id), 'state', 'group', 'created')
  if row[1] == 'pending' and row[2] then
    if not redis.call('ZSCORE', lane_key(row[2]), id) then
      local prio = redis.call('HGET', job_key(id), 'prio')
      redis.call('ZADD', lane_key(row[2]), lane_score(prio, tonumber(row[3] or now) or now), id)
      restored = restored + 1
    end
    candidate(row[2])
  elseif row[1] == 'delayed' and not redis.call('ZSCORE', K_delayed, id) then
    redis.call('ZADD', K_delayed, now, id)
    restored = restored + 1
  elseif row[1] == 'active' and not redis.call('ZSCORE', K_active, id) then
    redis.call('ZADD', K_active, now, id)   -- an expired lease: the next reap returns it
    restored = restored + 1
  elseif row[1] == 'dead' and not redis.call('ZSCORE', K_dead, id) then
    redis.call('ZADD', K_dead, now, id)
    restored = restored + 1
  end
end
local active = redis.call('ZRANGE', K_active, 0, -1)
for _, id in ipairs(active) do
  local g = redis.call('HGET', job_key(id), 'group')
  if g then
    redis.call('HINCRBY', K_gactive, g, 1)
    local t = tenant_of(g)
    if t then redis.call('HINCRBY', K_tactive, t, 1) end
  else
    redis.call('ZREM', K_active, id)
  end
end
local ringed = 0
local tf = time_fair()
for _, g in ipairs(candidates) do
  if group_seat(g, tf) and open(g) then
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
