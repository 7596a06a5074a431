-- weight: set a group's weight, the consecutive claims it gets per turn of the ring.
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: settings
-- ARGV[1]  group
-- ARGV[2]  weight, an integer >= 1, or '' to clear it (the group then has the default
--          weight for every group, else 1; a weight of 1 with no default is stored as absent)
-- Reply: 1.
-- Side effects: `gweight`; the group's current turn count restarts.

if ARGV[2] == '' or (ARGV[2] == '1' and not default('weight')) then
  redis.call('HDEL', K_gweight, ARGV[1])
else
  redis.call('HSET', K_gweight, ARGV[1], ARGV[2])
end
redis.call('HDEL', K_gturn, ARGV[1])
return 1
