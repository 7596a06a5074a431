-- fairness: switch the queue between fair turns (the ring) and fair worker time (`gvt`).
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: keys, settings, ring, wake
-- ARGV[1]  mode: 'turns' or 'time'
-- Reply: the number of serviceable groups moved from one ring to the other (0 when the queue
--   already had that mode).
-- Side effects: `fairness` set to 'time' (or deleted for turns). To time: every group on the
--   ring enters `gvt` at its virtual time or the floor (ring_push), the ring and the weighted
--   turn counts (`gturn`) go. To turns: the groups of `gvt` join the ring in the order of
--   their virtual time (the least served first), `gvt` goes. A tenant's groups move between
--   its ring (turns) and its zset (time: tgvt_key, under its mark in `gvt`). Jobs in flight keep their
--   charges: whatever the mode, each settles its group's virtual time when it leaves flight.
--   `twait` is decided again: each tenant's mark enters the new ring as its first group does
--   (tenant_enter), or waits in `twait` again while its rate budget is spent; so a mark whose
--   wait ran out before promote saw it stands once, not on the ring and in `twait` at once
--   (promote would then have put it on the ring a second time).

local to_time = ARGV[1] == 'time'
if to_time == time_fair() then return 0 end
redis.call('DEL', TEN.wait)
-- every tenant's ring (a list in turns, a zset in time) goes; its groups are moved
local function tenants_drain(moved)
  local seen = {}
  for _, t in ipairs(redis.call('HVALS', K_gtenant)) do
    if not seen[t] then
      seen[t] = true
      local key = to_time and tring_key(t) or tgvt_key(t)
      local own = to_time and redis.call('LRANGE', key, 0, -1) or redis.call('ZRANGE', key, 0, -1)
      for _, g in ipairs(own) do moved[#moved + 1] = g end
      redis.call('DEL', key)
    end
  end
end
local moved = {}
if to_time then
  -- the ring's groups, then every tenant's ring
  for _, g in ipairs(redis.call('LRANGE', K_ring, 0, -1)) do
    if string.byte(g, 1) ~= 255 then moved[#moved + 1] = g end
  end
  tenants_drain(moved)
  redis.call('DEL', K_ring, K_gturn)
  redis.call('SET', K_fairness, 'time')
  MODE = true
  for _, g in ipairs(moved) do ring_push(g) end
else
  for _, g in ipairs(redis.call('ZRANGE', K_gvt, 0, -1)) do
    if string.byte(g, 1) ~= 255 then moved[#moved + 1] = g end
  end
  tenants_drain(moved)
  redis.call('DEL', K_gvt, K_fairness)
  MODE = false
  if redis.call('EXISTS', K_gtenant) == 1 then
    for _, g in ipairs(moved) do ring_push(g) end   -- into their tenants' rings
  else
    for i = 1, #moved, 1000 do
      redis.call('RPUSH', K_ring, unpack(moved, i, math.min(i + 999, #moved)))
    end
  end
end
if #moved > 0 then wake() end
return #moved
