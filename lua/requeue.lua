-- requeue: bring dead jobs back to their lanes with fresh attempts.
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: core, keys, place
-- ARGV[1..] ids; with none, the oldest 500 of `dead`
-- Reply: the number requeued (ids not in `dead` are passed over).
-- Side effects: per id, out of `dead`; attempts 0 (and its given-back claims, `unrun`),
--   state pending, into its lane with score
--   now; groups join the ring with a wake.

local ids = ARGV
if #ids == 0 then ids = redis.call('ZRANGE', K_dead, 0, 499) end
local now = now_ms()
local n = 0
for _, id in ipairs(ids) do
  if redis.call('ZREM', K_dead, id) == 1 then
    local jk = job_key(id)
    local row = redis.call('HMGET', jk, 'group', 'prio')
    local g = row[1]
    if g then
      redis.call('HSET', jk, 'state', 'pending', 'attempts', 0)
      redis.call('HDEL', jk, 'unrun')
      lane_push(g, id, lane_score(row[2], now), now)
      n = n + 1
    end
  end
end
return n
