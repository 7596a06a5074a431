-- release: hand a leased job back unrun (fenced), at the head of its lane, its attempt
-- rolled back: a worker shutting down, or a task that hit an outside rate limit, is not
-- the job's failure.
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: core, keys, fence, timefair, place, types, rows, books, aborted
-- ARGV[1]  id
-- ARGV[2]  attempts token
-- ARGV[3]  nonce token
-- ARGV[4]  reason, kept on the row as its last error
-- ARGV[5]  back-off ms: the whole group sits out this long (RateLimited); '' or 0 for none
-- Reply: 1 released (or ended aborted, below), 0 stale (nothing was written).
-- An attempt whose abort was asked (the row's `abort` is its nonce, abort.lua 'ask': a job
--   held unstarted behind a long one, or one whose worker stops) is not handed back, or the
--   next claim would run it: it ends `aborted` as abort.lua 'end' ends it (end_aborted),
--   its error "Aborted: asked before it was released; " and the reason.
-- Side effects: removes the id from `active`; gactive-1; attempts-1, state pending, back in
--   its lane with its original enqueue time as score (so it keeps its place); with a
--   back-off, `gbackoff` holds the group until then and it waits in `gwait`, off the ring.
--   A job claimed in time mode: its group pays the time it held a worker (no estimate fed).
--   Books its group cannot read (group_books in lib/books.lua): a lane of the wrong type, the
--   job goes to `dead` with the reason naming it; others are left as they are (no back-off,
--   the job into its lane only: a claim takes the group out of the ring).

runs_when_full()
local id = ARGV[1]
local row = fenced(id, ARGV[2], ARGV[3])
if not row then return 0 end
local jk = job_key(id)
if redis.call('HGET', jk, 'abort') == ARGV[3] then
  local unfit = end_aborted(id, row, 'Aborted: asked before it was released; ' .. ARGV[4])
  if unfit then return redis.error_reply(unfit) end
  return 1
end
local now = now_ms()
local g = row[F_GROUP]
-- read before the first write (group_books): a lane of the wrong type sends the job to
-- `dead` with the reason; other books that cannot be read are left as they are
local books = group_books(g, true, true, row[F_VCHARGE])
if type(books) == 'string' then
  local refused = misfit({{K_active, 'zset'}}) or bury(id, g, nil, now, nil, books)
  if refused then return redis.error_reply(refused) end
  redis.call('ZREM', K_active, id)
  return 1
end
if not books then time_settle(g, id, row[F_STARTED], row[F_VCHARGE], now, false) end
redis.call('ZREM', K_active, id)
redis.call('HINCRBY', jk, 'attempts', -1)
redis.call('HSET', jk, 'state', 'pending', 'error', ARGV[4])
local back = redis.call('HMGET', jk, 'created', 'prio')
if not books then active_drop(g, now) end
lane_in(g, id, lane_score(back[2], tonumber(back[1] or '0')), now, books)
local off = tonumber(ARGV[5] or '') or 0
if off > 0 and not books then
  local was = placed(g)
  local until_ms = math.max(now + off, tonumber(redis.call('HGET', K_gbackoff, g) or '0'))
  redis.call('HSET', K_gbackoff, g, until_ms)
  settle(g, was, now)
end
return 1
