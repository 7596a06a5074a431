-- promote: move due entries of `delayed` back to their lanes.
--
-- KEYS: the queue's fixed keys (see _common.lua).
-- ARGV[1]  limit, the most entries moved in this call
-- Reply: {moved, next_due_in_ms, claimable}: next_due_in_ms is -1 when `delayed` is empty,
--   0 when more are due now (the limit cut the batch), else ms until the next one is due;
--   claimable is 1 when the ring is not empty and the queue is not paused (a claim would
--   find work), else 0: a master with an idle child fans on it, so a wake token that was
--   lost (its BLPOP reply dropped, its master killed holding it) strands nothing.
-- Side effects: per due id, state pending and into its lane with score now (behind work
--   already waiting); groups join the ring with a wake.

local now = now_ms()
local ids = redis.call('ZRANGEBYSCORE', K_delayed, '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, id in ipairs(ids) do
  redis.call('ZREM', K_delayed, id)
  local jk = job_key(id)
  local g = redis.call('HGET', jk, 'group')
  if g then
    redis.call('HSET', jk, 'state', 'pending')
    lane_push(g, id, now)
  end
end
local head = redis.call('ZRANGE', K_delayed, 0, 0, 'WITHSCORES')
local next_due = -1
if #head > 0 then next_due = math.max(0, tonumber(head[2]) - now) end
local claimable = 0
if redis.call('LLEN', K_ring) > 0 and redis.call('EXISTS', K_paused) == 0 then claimable = 1 end
return {#ids, next_due, claimable}
