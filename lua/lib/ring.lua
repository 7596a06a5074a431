-- ring: where a serviceable group sits: the ring (in time mode `gvt`, lib/timefair.lua) or
-- `gwait`; and the ring's turn (deficit round robin by weight).
-- Includes: keys, core, settings, wake

-- A group entering time mode's ring starts at its own virtual time or the floor, whichever
-- is later (lib/timefair.lua explains the floor).
local function vstart(g)
  local floor = tonumber(redis.call('HGET', K_gvrun, '')) or 0
  local own = tonumber(redis.call('HGET', K_gvrun, g))
  if own and own > floor then return own end
  return floor
end

local function ring_push(g)
  if time_fair() then
    local v = int_text(vstart(g))
    redis.call('ZADD', K_gvt, v, g)
    redis.call('HSET', K_gvrun, g, v)
  else
    redis.call('RPUSH', K_ring, g)
  end
end

-- How many groups are serviceable now (the ring of the queue's mode).
local function ring_size()
  if time_fair() then return redis.call('ZCARD', K_gvt) end
  return redis.call('LLEN', K_ring)
end

-- Whether any group is serviceable, in one command and without reading the mode (the other
-- mode's ring is always empty): what an idle master's promote asks once per tick.
local function ring_any()
  return redis.call('EXISTS', K_ring, K_gvt) > 0
end

local function ring_enter(g)
  ring_push(g)
  redis.call('HDEL', K_gturn, g)
  wake()
end

-- Hold an open group back until `at`; a new earliest return re-times the parked masters.
local function wait_push(g, at)
  redis.call('ZADD', K_gwait, at, g)
  if redis.call('ZRANGE', K_gwait, 0, 0)[1] == g then wake('d') end
end

-- from_tail: where the group is known to stand (just rotated to the tail, or still at the
-- head), so LREM finds it in one step; nil scans the whole ring (admin verbs only).
local function ring_leave(g, from_tail)
  if time_fair() then
    redis.call('ZREM', K_gvt, g)
  else
    local count = 0
    if from_tail == true then count = -1 elseif from_tail == false then count = 1 end
    redis.call('LREM', K_ring, count, g)
  end
  redis.call('HDEL', K_gturn, g)
end

-- Rotate the ring for a claim of g (the head), of weight w. A weighted group keeps the head
-- for `w` consecutive claims (deficit round robin). Returns true if g moved to the tail.
local function ring_turn(g, w)
  if w > 1 and redis.call('HINCRBY', K_gturn, g, 1) < w then return false end
  if w > 1 then redis.call('HDEL', K_gturn, g) end
  redis.call('LMOVE', K_ring, K_ring, 'LEFT', 'RIGHT')
  return true
end
