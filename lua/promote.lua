-- promote: move due entries of `delayed` back to their lanes.
--
-- KEYS: the queue's fixed keys (see _common.lua).
-- ARGV[1]  limit, the most entries moved in this call
-- Reply: {moved, next_due_in_ms}: next_due_in_ms is -1 when `delayed` is empty, 0 when
--   more are due now (the limit cut the batch), else ms until the next one is due.
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
return {#ids, next_due}
