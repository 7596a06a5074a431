-- requeue: bring dead jobs back to their lanes with fresh attempts.
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: core, keys, books
-- ARGV[1..] ids; with none, the oldest 500 of `dead`
-- Reply: the number requeued (ids not in `dead` are passed over).
-- Side effects: per id, out of `dead`; attempts 0 (and its given-back claims, `unrun`),
--   state pending, into its lane with score
--   now; groups join the ring with a wake. A row without a group goes to the default group
--   (DEFAULT_GROUP, as enqueue's); one whose lane is of the wrong type stays in `dead`, its
--   error saying why; a group whose other books cannot be read gets the job in its lane only
--   (group_books in lib/books.lua); a job key that is not a hash stays in `dead`.

local ids = ARGV
if #ids == 0 then ids = redis.call('ZRANGE', K_dead, 0, 499) end
local now = now_ms()
local n = 0
for _, id in ipairs(ids) do
  if redis.call('ZSCORE', K_dead, id) then
    local jk = job_key(id)
    local row = redis.pcall('HMGET', jk, 'group', 'prio')
    local t = (row.err or not row[1]) and type_of(jk) or 'hash'
    if t == 'none' then
      redis.call('ZREM', K_dead, id)          -- no row to requeue (as before)
    elseif t == 'hash' then
      -- a row that lost its group goes where enqueue puts a job without one
      local g = row[1] or DEFAULT_GROUP
      local books = group_books(g, false, true)
      if type(books) == 'string' then
        redis.call('HSET', jk, 'error', 'not requeued: ' .. books)
      else
        redis.call('ZREM', K_dead, id)
        redis.call('HSET', jk, 'state', 'pending', 'attempts', 0, 'group', g)
        redis.call('HDEL', jk, 'unrun')
        lane_in(g, id, lane_score(row[2], now), now, books)
        n = n + 1
      end
    end
    -- a key of another type stays in `dead`: there is no row to requeue (check names it)
  end
end
return n
