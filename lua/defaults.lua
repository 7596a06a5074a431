-- defaults: set or clear the settings every group has unless it has its own.
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: core, keys, settings, ring, place, wake
-- ARGV[1]  n, the number of (field, value) pairs that follow
-- ARGV[2 .. 2n+1]  pairs: field limit | rate | max_size | weight, value ('' clears it;
--          rate as "max_jobs:per_ms")
-- ARGV[2n+2 ..]  every group known to the queue (lanes, books, settings)
-- Reply: {groups_on_ring, groups_waiting}.
-- Side effects: `gdefaults`; the ring is rebuilt in one pass (groups that stay keep their
--   order, groups that opened join at the tail with a wake) and `gwait` follows each group's
--   new rate budget; the turn count of a group that left restarts. In time mode the ring
--   is `gvt`: groups that stay keep their virtual time, groups that opened enter (ring_push).

local n = tonumber(ARGV[1])
local now = now_ms()
local candidates, seen, was = {}, {}, {}
local function candidate(g)
  if not seen[g] then seen[g] = true; candidates[#candidates + 1] = g end
end
for i = 2 * n + 2, #ARGV do candidate(ARGV[i]) end
local tf = time_fair()
local ring
if tf then ring = redis.call('ZRANGE', K_gvt, 0, -1)
else ring = redis.call('LRANGE', K_ring, 0, -1) end
-- A queue with tenants settles group by group (a tenant's groups stand in its own ring)
local tenanted = redis.call('EXISTS', K_gtenant) == 1
if tenanted then
  for _, t in ipairs(redis.call('HVALS', K_gtenant)) do
    local own
    if tf then own = redis.call('ZRANGE', tgvt_key(t), 0, -1)
    else own = redis.call('LRANGE', tring_key(t), 0, -1) end
    for _, g in ipairs(own) do candidate(g) end
  end
end
for _, g in ipairs(ring) do if string.byte(g, 1) ~= 255 then candidate(g) end end
for _, g in ipairs(redis.call('ZRANGE', K_gwait, 0, -1)) do candidate(g) end
for _, g in ipairs(candidates) do was[g] = placed(g) end
for i = 0, n - 1 do
  local field, value = ARGV[2 + 2 * i], ARGV[3 + 2 * i]
  if value == '' then redis.call('HDEL', K_gdefaults, field)
  else redis.call('HSET', K_gdefaults, field, value) end
end
DEFAULTS = nil
if tenanted then
  for _, g in ipairs(candidates) do settle(g, was[g], now) end
  local waiting = redis.call('ZCARD', K_gwait)
  if waiting > 0 then wake('d') end
  return {tf and redis.call('ZCARD', K_gvt) or redis.call('LLEN', K_ring), waiting}
end
local want, at = {}, {}
for _, g in ipairs(candidates) do
  if open(g) then
    at[g] = ready_at(g, now)
    if at[g] then want[g] = 'wait' else want[g] = 'ring' end
  end
end
local kept, entered = {}, false
for _, g in ipairs(ring) do
  if want[g] == 'ring' then kept[#kept + 1] = g; want[g] = 'kept'
  else redis.call('HDEL', K_gturn, g) end
end
for _, g in ipairs(candidates) do
  if want[g] == 'ring' then kept[#kept + 1] = g; entered = true end
  if want[g] == 'wait' then redis.call('ZADD', K_gwait, at[g], g)
  elseif was[g] == 'wait' then redis.call('ZREM', K_gwait, g) end
end
if tf then           -- time mode: leavers go, entrants start at their virtual time
  for _, g in ipairs(ring) do if want[g] ~= 'kept' then redis.call('ZREM', K_gvt, g) end end
  for _, g in ipairs(candidates) do if want[g] == 'ring' then ring_push(g) end end
else
  redis.call('DEL', K_ring)
  for i = 1, #kept, 1000 do
    redis.call('RPUSH', K_ring, unpack(kept, i, math.min(i + 999, #kept)))
  end
end
if entered then wake() end
local waiting = redis.call('ZCARD', K_gwait)
if waiting > 0 then wake('d') end
return {#kept, waiting}
