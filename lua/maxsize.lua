-- maxsize: set or clear the cap on a group's waiting jobs.
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: keys
-- ARGV[1]  group
-- ARGV[2]  the cap (an integer >= 0), or '' to clear the group's own cap
-- Reply: 1.
-- Side effects: `gmax`. Jobs already waiting stay; enqueues into a full lane are refused.

if ARGV[2] == '' then
  redis.call('HDEL', K_gmax, ARGV[1])
else
  redis.call('HSET', K_gmax, ARGV[1], ARGV[2])
end
return 1
