-- place: whether a group is open, and putting it where it belongs after a change.
-- Includes: keys, settings, ring
--
-- Ring membership is derived, never searched. A group is "open" when its lane is non-empty,
-- it is not paused and it is under its limit; an open group is on the ring, or, while its
-- rate budget is spent or a task asked it to back off, in `gwait` (scored by when it may
-- start again; promote brings it back). Every verb that changes what openness depends on
-- notes where the group stood before and puts it where it belongs after, once.

local function under_limit(g)
  local lim = limit_of(g)
  if not lim then return true end
  return tonumber(redis.call('HGET', K_gactive, g) or '0') < tonumber(lim)
end

-- Open: the lane waits, the group is not paused and is under its limit.
local function open(g)
  return redis.call('ZCARD', lane_key(g)) > 0
    and redis.call('SISMEMBER', K_gpaused, g) == 0
    and under_limit(g)
end

-- When the group's rate budget allows its next start (ms), or nil when it does now: in any
-- window of per_ms at most max_jobs starts, exactly (the list holds its last max_jobs).
local function rate_ready(g, now)
  local m, per = rate_of(g)
  if not m then return nil end
  local oldest = tonumber(redis.call('LINDEX', starts_key(g), m - 1))
  if oldest and oldest + per > now then return oldest + per end
  return nil
end

-- When the group may start its next job (ms), or nil when it may now: its rate budget and
-- a back-off a task asked for (RateLimited).
local function ready_at(g, now)
  local at = rate_ready(g, now)
  local off = tonumber(redis.call('HGET', K_gbackoff, g))
  if off then
    if off <= now then redis.call('HDEL', K_gbackoff, g)
    elseif not at or off > at then at = off end
  end
  return at
end

-- An open group goes on the ring, or in gwait while it may not start yet.
local function admit(g, now)
  local at = ready_at(g, now)
  if at then wait_push(g, at) else ring_enter(g) end
end

-- Add an id to its lane (score from lane_score); a lane that just became non-empty opens.
-- warm: the caller knows the lane held a job before this one (enqueue read its size earlier
-- in the call, and nothing in that call pops a lane), so an id the ZADD added leaves it with
-- two or more and the size need not be read (one command less per enqueue into a busy lane).
local function lane_push(g, id, score, now, warm)
  local lane = lane_key(g)
  if redis.call('ZADD', lane, score, id) == 1 and warm then return end
  if redis.call('ZCARD', lane) == 1
    and redis.call('SISMEMBER', K_gpaused, g) == 0 and under_limit(g) then
    admit(g, now)
  end
end

-- One job of group g left flight: the books drop, and a group held back only by its
-- limit opens again. lim: the group's limit as group_books read it in the same call (false
-- for none), nil to read it here.
local function active_drop(g, now, lim)
  local act = redis.call('HINCRBY', K_gactive, g, '-1')
  if act <= 0 then redis.call('HDEL', K_gactive, g) end
  local t = tenant_of(g)
  if t then
    -- its tenant's too: a tenant held back only by its limit returns to the ring
    local tact = redis.call('HINCRBY', K_tactive, t, -1)
    if tact <= 0 then redis.call('HDEL', K_tactive, t) end
    local tlim = tenant_limit(t)
    if tlim and tact + 1 >= tlim and tact < tlim
      and (time_fair() and redis.call('ZCARD', tgvt_key(t))
           or redis.call('LLEN', tring_key(t))) > 0
      and redis.call('SISMEMBER', TEN.paused, t) == 0 then
      tenant_enter(t)
      wake()
    end
  end
  if lim == nil then lim = limit_of(g) end
  if lim and act + 1 >= tonumber(lim) and act < tonumber(lim)
    and redis.call('ZCARD', lane_key(g)) > 0
    and redis.call('SISMEMBER', K_gpaused, g) == 0 then
    admit(g, now)
  end
end

-- Where an open group stands: 'wait', 'ring', or nil when it is not open. Read it before a
-- change to what openness depends on, then call settle().
local function placed(g)
  if redis.call('ZSCORE', K_gwait, g) then return 'wait' end
  if open(g) then return 'ring' end
  return nil
end

-- Put g where it belongs now, given where it stood (placed() before the change). Leaving
-- the ring here scans it (admin verbs and back-offs only, never a claim).
local function settle(g, was, now)
  local want, at = nil, nil
  if open(g) then
    at = ready_at(g, now)
    if at then want = 'wait' else want = 'ring' end
  end
  if was == want then
    if want == 'wait' then redis.call('ZADD', K_gwait, at, g) end
    return
  end
  if was == 'ring' then ring_leave(g, nil) elseif was == 'wait' then redis.call('ZREM', K_gwait, g) end
  if want == 'ring' then ring_enter(g) elseif want == 'wait' then wait_push(g, at) end
end
