-- marks: the queue's own marks (emqtasks/clock.py, stats()): the clock mark and the tally.
-- Includes: keys

-- The queue's clock mark: the latest server time (ms) a reap saw, raised to now, never
-- lowered; returns the mark before (nil for none: never set, or unreadable).
local function clock_mark(now)
  local seen = tonumber(redis.call('HGET', K_clock, 'seen'))
  if seen and not (seen > -1e15 and seen < 1e15) then seen = nil end
  if not seen or now > seen then redis.call('HSET', K_clock, 'seen', now) end
  return seen
end

-- One more of a queue counter (stats()).
local function tally(counter) redis.call('HINCRBY', K_tally, counter, 1) end
