-- limit: set or clear a group's concurrency limit.
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: core, place
-- ARGV[1]  group
-- ARGV[2]  the limit (an integer >= 1), or '' to clear it
-- Reply: 1.
-- Side effects: `glimit`; the group leaves the ring if it is now at its limit, or rejoins
--   it with a wake when the new limit frees it.

local g = ARGV[1]
local was = placed(g)
if ARGV[2] == '' then
  redis.call('HDEL', K_glimit, g)
else
  redis.call('HSET', K_glimit, g, ARGV[2])
end
settle(g, was, now_ms())
return 1
