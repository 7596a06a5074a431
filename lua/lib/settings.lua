-- settings: the queue's fairness mode and each group's effective settings (its own, else
-- the default for every group), each read once per script run. The only Lua file that reads
-- a group's settings or the defaults, and parses a rate (tests/test_store_layout.py).
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

-- A group's own setting, else the default for every group, else nil: the rule, here alone
-- (every other file reads a group's settings through these).
local function limit_of(g) return redis.call('HGET', K_glimit, g) or default('limit') end
local function max_size_of(g) return redis.call('HGET', K_gmax, g) or default('max_size') end
-- its text, for the checks before a write (an integer >= 1, else unreadable)
local function weight_text(g) return redis.call('HGET', K_gweight, g) or default('weight') end
local function weight_of(g) return tonumber(weight_text(g) or '1') end
-- "max_jobs:per_ms", parsed here alone: max_jobs, per_ms and whether either runs over 15
-- digits (past a double's exact integers: the checks before a write count it unreadable);
-- nil when the group has none or the text is not that.
local function rate_of(g)
  local r = redis.call('HGET', K_grate, g) or default('rate')
  if not r then return nil end
  local m, p = string.match(r, '^(%d+):(%d+)$')
  if not m then return nil end
  return tonumber(m), tonumber(p), #m > 15 or #p > 15
end

-- A group's tenant (nil: the group is its own tenant), a tenant's limit and weight: its
-- own, else the default for every tenant (field '' of the same hash: no tenant is named '').
local function tenant_of(g) return redis.call('HGET', K_gtenant, g) or nil end
local function tenant_limit(t)
  return tonumber(redis.call('HGET', TEN.limit, t) or redis.call('HGET', TEN.limit, ''))
end
local function tenant_weight(t)
  return tonumber(redis.call('HGET', TEN.weight, t) or redis.call('HGET', TEN.weight, '')) or 1
end
-- A tenant's rate: max_jobs, per_ms (its own, else every tenant's default), nil for none.
function TEN.rate_of(t)
  local r = redis.call('HGET', TEN.rate, t) or redis.call('HGET', TEN.rate, '')
  if not r then return nil end
  local m, p = string.match(r, '^(%d+):(%d+)$')
  if not m then return nil end
  return tonumber(m), tonumber(p)
end
-- A tenant's cap on its waiting jobs (its own, else the default), nil for none.
function TEN.max_of(t)
  return tonumber(redis.call('HGET', TEN.max, t) or redis.call('HGET', TEN.max, ''))
end
