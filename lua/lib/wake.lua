-- wake: the tokens that wake a parked master (a claimable group, a new earliest delayed
-- entry) and the clients blocked in get() on a job that reached its end.
-- Includes: core

local WAKE_CAP = 16
local WAKE_TTL = 60

-- A readiness token for a parked master; the list stays short whatever the traffic.
-- Token '1': work is claimable. Token 'd': `delayed` has a new earliest entry, so a parked
-- master re-reads when to promote instead of sleeping past it.
-- 'd' tokens may fill only half the list, so there is always room for a '1'.
local function wake(token)
  local cap = WAKE_CAP
  if token == 'd' then cap = WAKE_CAP / 2 end
  if redis.call('LLEN', K_wake) < cap then
    redis.call('RPUSH', K_wake, token or '1')
    -- Tokens are hints (the ring is the truth, and every master re-reads it each tick):
    -- one nobody took within a minute may go, so an idle queue keeps no stray key.
    redis.call('EXPIRE', K_wake, WAKE_TTL)
  end
end

-- Schedule an id in `delayed`; if it is now the earliest entry, tell the parked masters.
local function delay_push(id, due)
  redis.call('ZADD', K_delayed, due, id)
  if redis.call('ZRANGE', K_delayed, 0, 0)[1] == id then wake('d') end
end

-- A job reached an end (done, dead, cancelled): wake each client blocked in get() on it.
-- `waiters` on the row counts them; a client registers before it looks, so none is missed.
-- (A count that is not integer text, HINCRBY's, wakes none: the module reads it the same.)
local function notify(id, waiters)
  local n = 0
  if int_ok(waiters) then n = math.min(tonumber(waiters), 100) end
  if n > 0 then
    local key = BASE .. 'done:' .. id
    for _ = 1, n do redis.call('RPUSH', key, '1') end
    redis.call('EXPIRE', key, 60)
  end
end
