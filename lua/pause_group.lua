-- pause_group: park one lane (it keeps its backlog and its in-flight work) or unpark it.
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: core, place
-- ARGV[1]  group
-- ARGV[2]  '1' pause, '0' resume
-- Reply: 1 changed, 0 already so.
-- Side effects: `gpaused` membership; the group leaves the ring, or rejoins it with a wake
--   when it is serviceable again.

local g = ARGV[1]
local was = placed(g)
local changed
if ARGV[2] == '1' then
  changed = redis.call('SADD', K_gpaused, g)
else
  changed = redis.call('SREM', K_gpaused, g)
end
settle(g, was, now_ms())
return changed
