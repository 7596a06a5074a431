-- tenant: set a tenant's weight or concurrency limit, or pause or resume it.
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: core, keys, settings, wake, ring
-- ARGV[1]  what: 'weight', 'limit' or 'pause'
-- ARGV[2]  the tenant
-- ARGV[3]  weight: an integer >= 1, its consecutive claims per turn of the ring ('' or 1:
--          the default 1, stored as absent); limit: an integer >= 1, its jobs in flight at
--          most ('' clears it); pause: '1' pause, '0' resume
-- Reply: 1 (pause: 1 changed, 0 already so); an error for a value out of range (nothing
--   written).
-- Side effects: `tweight` (the tenant's turn count restarts), `tlimit` or `tpaused`; the
--   tenant's mark leaves the ring when the tenant is no longer open (paused, at its limit),
--   or joins it with a wake when it opens while its own ring holds a group. Its groups stay
--   in its ring meanwhile, their own controls untouched. Time mode keeps the books only.

local what, t, v = ARGV[1], ARGV[2], ARGV[3]
local function standing()
  return not time_fair() and redis.call('LLEN', tring_key(t)) > 0 and tenant_open(t)
end
if what ~= 'pause' and v ~= '' and not (int_ok(v) and tonumber(v) >= 1) then
  return redis.error_reply('ERR emq: a tenant ' .. what .. ' is an integer >= 1')
end
local was = standing()
local reply = 1
if what == 'weight' then
  if v == '' or v == '1' then redis.call('HDEL', K_tweight, t)
  else redis.call('HSET', K_tweight, t, v) end
  redis.call('HDEL', K_gturn, TENANT_MARK .. t)
elseif what == 'limit' then
  if v == '' then redis.call('HDEL', K_tlimit, t) else redis.call('HSET', K_tlimit, t, v) end
elseif what == 'pause' then
  if v == '1' then reply = redis.call('SADD', K_tpaused, t)
  else reply = redis.call('SREM', K_tpaused, t) end
else
  return redis.error_reply('ERR emq: a tenant control is weight, limit or pause')
end
local stands = standing()
if was and not stands then
  tenant_leave(t, nil)
elseif stands and not was then
  tenant_enter(t)
  wake()
end
return reply
