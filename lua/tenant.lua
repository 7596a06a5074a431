-- tenant: set a tenant's weight, concurrency limit, rate or lane cap (or the default for
-- every tenant), or pause or resume a tenant.
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: core, keys, settings, wake, ring
-- ARGV[1]  what: 'weight', 'limit', 'rate', 'max_size' or 'pause'
-- ARGV[2]  the tenant; '' for the default of every tenant without its own (weight, limit,
--          rate, max_size)
-- ARGV[3]  weight: an integer >= 1, its consecutive claims per turn of the ring ('' clears
--          it: then the default, else 1; a tenant's 1 with no default is stored as absent);
--          limit: an integer >= 1, its jobs in flight at most ('' clears it); rate:
--          '<max_jobs>:<per_ms>', both integers >= 1, its starts over all its groups in any
--          window of per_ms at most ('' clears it); max_size: an integer >= 1, its waiting
--          jobs over all its groups at most ('' clears it); pause: '1' pause, '0' resume
-- Reply: 1 (pause: 1 changed, 0 already so); an error for a value out of range (nothing
--   written).
-- Side effects: `tweight` (the turn counts restart), `tlimit`, `trate`, `tmax` or
--   `tpaused`; each tenant concerned leaves the ring when it is no longer open (paused, at
--   its limit), or joins it with a wake when it opens while its own ring holds a group; a
--   rate change puts a standing tenant's mark on the ring or in `twait` as its new budget
--   allows. Its groups stay in its ring meanwhile, their own controls untouched. Time mode
--   the same, with `gvt` for the ring (a tenant returns at its virtual time or the floor)
--   and its zset for its ring.

local what, t, v = ARGV[1], ARGV[2], ARGV[3]
if what == 'rate' then
  local m, p = string.match(v, '^(%d+):(%d+)$')
  if v ~= '' and not (m and int_ok(m) and int_ok(p) and tonumber(m) >= 1 and tonumber(p) >= 1) then
    return redis.error_reply('ERR emq: a tenant rate is <max_jobs>:<per_ms>, integers >= 1')
  end
elseif what ~= 'pause' and v ~= '' and not (int_ok(v) and tonumber(v) >= 1) then
  return redis.error_reply('ERR emq: a tenant ' .. what .. ' is an integer >= 1')
end
if what ~= 'weight' and what ~= 'limit' and what ~= 'pause' and what ~= 'rate'
  and what ~= 'max_size' then
  return redis.error_reply('ERR emq: a tenant control is weight, limit, rate, max_size or pause')
end
if t == '' and what == 'pause' then
  return redis.error_reply('ERR emq: pause names a tenant')
end
-- the tenants concerned: the one named, or for a default every tenant of a group
local tenants = {t}
if t == '' then
  tenants = {}
  local seen = {}
  for _, name in ipairs(redis.call('HVALS', K_gtenant)) do
    if not seen[name] then seen[name] = true; tenants[#tenants + 1] = name end
  end
end
local function standing(name)
  local own = time_fair() and redis.call('ZCARD', tgvt_key(name))
    or redis.call('LLEN', tring_key(name))
  return own > 0 and tenant_open(name)
end
local was = {}
for i, name in ipairs(tenants) do was[i] = standing(name) end
local reply = 1
if what == 'weight' then
  if v == '' or (v == '1' and t ~= '' and not redis.call('HGET', TEN.weight, '')) then
    redis.call('HDEL', TEN.weight, t)
  else
    redis.call('HSET', TEN.weight, t, v)
  end
  for _, name in ipairs(tenants) do redis.call('HDEL', K_gturn, TENANT_MARK .. name) end
elseif what == 'limit' or what == 'rate' or what == 'max_size' then
  local book = TEN.limit
  if what == 'rate' then book = TEN.rate elseif what == 'max_size' then book = TEN.max end
  if v == '' then redis.call('HDEL', book, t) else redis.call('HSET', book, t, v) end
else
  if v == '1' then reply = redis.call('SADD', TEN.paused, t)
  else reply = redis.call('SREM', TEN.paused, t) end
end
local woke = false
for i, name in ipairs(tenants) do
  local stands = standing(name)
  if was[i] and not stands then
    tenant_leave(name, nil)
  elseif stands and was[i] and what == 'rate' then
    -- on the ring or in `twait`, as its new budget allows (a mark that moves goes last)
    local waits = redis.call('ZSCORE', TEN.wait, name)
    if waits or TEN.ready(name, now_ms()) then
      tenant_leave(name, nil)
      tenant_enter(name)
      if not redis.call('ZSCORE', TEN.wait, name) then woke = true end
    end
  elseif stands and not was[i] then
    tenant_enter(name)
    woke = true
  end
end
if woke then wake() end
return reply
