-- rate: set or clear a group's rate limit (at most max_jobs starts in any window of per_ms).
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: core, keys, place
-- ARGV[1]  group
-- ARGV[2]  max_jobs (an integer >= 1), or '' to clear the group's own rate
-- ARGV[3]  per_ms (an integer >= 1); ignored when clearing
-- Reply: 1.
-- Side effects: `grate`; the group moves between the ring and `gwait` as its new budget
--   allows (a cleared rate falls back to the default rate for every group, if one is set).

local g = ARGV[1]
local was = placed(g)
if ARGV[2] == '' then
  redis.call('HDEL', K_grate, g)
else
  redis.call('HSET', K_grate, g, ARGV[2] .. ':' .. ARGV[3])
end
settle(g, was, now_ms())
return 1
