-- pause: set or clear the queue-wide pause flag (claims answer empty while it is set).
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: ring, wake
-- ARGV[1]  '1' pause, '0' resume
-- Reply: 1.
-- Side effects: sets or deletes `paused`; a resume with work on the ring pushes a wake.

if ARGV[1] == '1' then
  redis.call('SET', K_paused, '1')
else
  redis.call('DEL', K_paused)
  if ring_any() then wake() end
end
return 1
