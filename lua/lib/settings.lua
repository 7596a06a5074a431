-- settings: the queue's fairness mode and each group's effective settings (its own, else
-- the default for every group), each read once per script run.
-- Includes: keys

-- The queue's fairness mode, read once per script run (the fairness verb sets MODE itself).
local MODE = nil
local function time_fair()
  if MODE == nil then MODE = redis.call('GET', K_fairness) == 'time' end
  return MODE
end

-- The defaults for every group, read once per script run (a verb that changes them resets
-- DEFAULTS to nil).
local DEFAULTS = nil
local function default(name)
  if DEFAULTS == nil then
    local d = redis.call('HMGET', K_gdefaults, 'limit', 'rate', 'max_size', 'weight',
      'history', 'hgroups')
    DEFAULTS = {limit = d[1] or nil, rate = d[2] or nil, max_size = d[3] or nil,
                weight = d[4] or nil, history = d[5] or nil, hgroups = d[6] or nil}
  end
  return DEFAULTS[name]
end

-- A group's own setting, else the default for every group, else nil.
local function limit_of(g) return redis.call('HGET', K_glimit, g) or default('limit') end
local function max_size_of(g) return redis.call('HGET', K_gmax, g) or default('max_size') end
local function weight_of(g)
  return tonumber(redis.call('HGET', K_gweight, g) or default('weight') or '1')
end
-- (max_jobs, per_ms) or nil
local function rate_of(g)
  local r = redis.call('HGET', K_grate, g) or default('rate')
  if not r then return nil end
  local m, p = string.match(r, '^(%d+):(%d+)$')
  return tonumber(m), tonumber(p)
end
