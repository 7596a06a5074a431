-- lanes: the backlog and the head of each named lane, for the lane table (read-only).
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: core, keys
-- ARGV[1..] group names (the caller sends at most 1000 a call: the work bound)
-- Reply: a flat list, per group in ARGV order: its pending count, its head's score
--   (priority * PRIO_SPAN + enqueue time in ms, as a string; '' for an empty lane), and its
--   busy ms over the last minute (the time-fair mode's 10 s slots: this one and five before).
-- Side effects: none. Two commands a group run here instead of two round-trip replies
--   parsed by the client: the lane table of 10,000 groups costs a few calls.

local current = math.floor(now_ms() / 10000)
local out = {}
for _, g in ipairs(ARGV) do
  local lane = lane_key(g)
  out[#out + 1] = redis.call('ZCARD', lane)
  local head = redis.call('ZRANGE', lane, 0, 0, 'WITHSCORES')
  out[#out + 1] = head[2] or ''
  local slots, busy = redis.call('HGETALL', busy_key(g)), 0
  for i = 1, #slots, 2 do
    local slot = tonumber(slots[i])
    if slot and slot > current - 6 and slot <= current then busy = busy + tonumber(slots[i + 1]) end
  end
  out[#out + 1] = busy
end
return out
