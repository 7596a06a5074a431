-- ring: where a serviceable group sits: the ring (in time mode `gvt`, lib/timefair.lua), its
-- tenant's ring, or `gwait`; and the rings' turns (deficit round robin by weight).
-- Includes: keys, core, settings, wake

-- A group (or a tenant's mark) entering time mode's ring starts at its own virtual time or
-- the floor, whichever is later (lib/timefair.lua explains the floor): the queue's floor,
-- gvrun[''], or for a tenant's group its tenant's, gvrun[fl] (fl: mark .. tenant .. mark).
local function vstart(g, fl)
  local floor = tonumber(redis.call('HGET', K_gvrun, fl or '')) or 0
  local own = tonumber(redis.call('HGET', K_gvrun, g))
  if own and own > floor then return own end
  return floor
end

-- Tenants: a tenant's mark stands on the ring (time mode: in `gvt`, at the tenant's virtual
-- time) exactly while its own ring (time mode: its zset, tgvt_key) holds a group and the
-- tenant is open (not paused, under its limit), as a group stands on it while it is open.
local function tenant_open(t)
  if redis.call('SISMEMBER', TEN.paused, t) == 1 then return false end
  local lim = tenant_limit(t)
  return not lim or (tonumber(redis.call('HGET', K_tactive, t)) or 0) < lim
end

-- When the tenant's rate budget allows its next start (ms), or nil when it does now: in
-- any window of per_ms at most max_jobs starts over all its groups (as rate_ready, a group).
function TEN.ready(t, now)
  local m, per = TEN.rate_of(t)
  if not m then return nil end
  local oldest = tonumber(redis.call('LINDEX', TEN.starts(t), m - 1))
  if oldest and oldest + per > now then return oldest + per end
  return nil
end

-- Hold a tenant's mark off the ring until `at` (promote brings it back, no polling); a new
-- earliest return re-times the parked masters.
function TEN.wait_push(t, at)
  redis.call('ZADD', TEN.wait, at, t)
  if redis.call('ZRANGE', TEN.wait, 0, 0)[1] == t then wake('d') end
end

-- The mark joins the ring, or `twait` while the tenant's rate budget is spent.
local function tenant_enter(t)
  local tf = time_fair()
  -- either mode: a spent rate budget holds the mark back (time mode: its virtual time
  -- stays in gvrun, and it returns at that or the floor, as a group's rate wait does)
  local at = TEN.ready(t, now_ms())
  if at then return TEN.wait_push(t, at) end
  local m = TENANT_MARK .. t
  if tf then
    local v = int_text(vstart(m))
    redis.call('ZADD', K_gvt, v, m)
    redis.call('HSET', K_gvrun, m, v)
  else
    redis.call('RPUSH', K_ring, m)
  end
  redis.call('HDEL', K_gturn, m)
end

-- from_tail as ring_leave's below. A mark waiting out its rate leaves `twait` instead.
local function tenant_leave(t, from_tail)
  local m, count = TENANT_MARK .. t, 0
  if time_fair() then
    redis.call('ZREM', K_gvt, m)
  else
    if from_tail == true then count = -1 elseif from_tail == false then count = 1 end
    redis.call('LREM', K_ring, count, m)
  end
  redis.call('HDEL', K_gturn, m)
  redis.call('ZREM', TEN.wait, t)
end

-- A claim of tenant t: its start counted when it has a rate; returns when its budget lets
-- it start again (nil: now).
function TEN.charge(t, now)
  local m, per = TEN.rate_of(t)
  if not m then return nil end
  local k = TEN.starts(t)
  redis.call('LPUSH', k, now)
  redis.call('LTRIM', k, 0, m - 1)
  redis.call('PEXPIRE', k, per)
  return TEN.ready(t, now)
end

local function ring_push(g)
  local t = tenant_of(g)
  if time_fair() then
    if not t then
      local v = int_text(vstart(g))
      redis.call('ZADD', K_gvt, v, g)
      redis.call('HSET', K_gvrun, g, v)
    else
      local v, tz = int_text(vstart(g, TENANT_MARK .. t .. TENANT_MARK)), tgvt_key(t)
      redis.call('HSET', K_gvrun, g, v)
      if redis.call('ZADD', tz, v, g) == 1 and redis.call('ZCARD', tz) == 1
        and tenant_open(t) then
        tenant_enter(t)
      end
    end
  else
    if not t then
      redis.call('RPUSH', K_ring, g)
    elseif redis.call('RPUSH', tring_key(t), g) == 1 and tenant_open(t) then
      tenant_enter(t)
    end
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
-- head), so LREM finds it in one step; nil scans the whole ring (admin verbs only). For a
-- tenant's group, from_tail is its place in its tenant's ring and t_tail the tenant mark's
-- in the queue's; t: its tenant, false for none, nil to read it. A claim knows the mark
-- stands (it just served the tenant): there the tenant's last group takes it out unread.
local function ring_leave(g, from_tail, t_tail, t)
  if t == nil then t = tenant_of(g) end
  if time_fair() then
    if not t then
      redis.call('ZREM', K_gvt, g)
    else
      local tz = tgvt_key(t)
      redis.call('ZREM', tz, g)
      if redis.call('ZCARD', tz) == 0 and (t_tail ~= nil or tenant_open(t)) then
        tenant_leave(t, t_tail)
      end
    end
  else
    local count = 0
    if from_tail == true then count = -1 elseif from_tail == false then count = 1 end
    if not t then
      redis.call('LREM', K_ring, count, g)
    else
      local tr = tring_key(t)
      redis.call('LREM', tr, count, g)
      if redis.call('LLEN', tr) == 0 and (t_tail ~= nil or tenant_open(t)) then
        tenant_leave(t, t_tail)
      end
    end
  end
  redis.call('HDEL', K_gturn, g)
end

-- One turn of a ring for the member at its head, m, of weight w: a weighted member keeps
-- the head for `w` consecutive claims (deficit round robin). True if m moved to the tail.
local function turn(ring, m, w)
  if w > 1 and redis.call('HINCRBY', K_gturn, m, 1) < w then return false end
  if w > 1 then redis.call('HDEL', K_gturn, m) end
  redis.call('LMOVE', ring, ring, 'LEFT', 'RIGHT')
  return true
end

-- Rotate for a claim of g (the head), of weight w, of tenant t (or false): one turn of the
-- tenant's ring for g, then one of the queue's for the tenant's mark, by the tenant's
-- weight. Returns whether g moved to the tail, and whether its tenant's mark did.
local function ring_turn(g, w, t)
  if not t then
    local moved = turn(K_ring, g, w)
    return moved, moved
  end
  local moved = turn(tring_key(t), g, w)
  return moved, turn(K_ring, TENANT_MARK .. t, tenant_weight(t))
end
