-- reap: return jobs whose lease expired to their lane, or to `dead` when out of attempts,
-- or end an attempt whose abort was asked `aborted`; and keep the queue's clock mark (the
-- latest server time a reap saw), run by every master on its tick.
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: core, keys, marks, timefair, place, history, wake, workflow, types, rows, books, fence, aborted
-- ARGV[1]  limit, the most expired leases handled in this call
-- Reply: {returned, dead, now, seen}: counts; the server time (ms) and the queue's clock mark
--   before this call (0 for none): a mark ahead of now is a server clock stepped back.
--   `dead` counts every job the reap ended: into `dead`, buried, or ended `aborted` (below).
--   (An aborted one is counted there, not in a fifth count, so the reply keeps the shape
--   every reader takes: Reaped in store/replies.py, the module's reap (sweep.c), an older
--   module or script.)
-- Side effects: per expired id, removed from `active`, gactive-1, then:
--   - an attempt whose abort was asked (the row's `abort` is its nonce, abort.lua 'ask'),
--     its worker gone before it stopped it, is not handed back, or the next claim would
--     run the job the user asked to stop: it ends `aborted` as abort.lua 'end' ends it
--     (end_aborted in lib/aborted.lua: not into `dead`, never retried, waiters notified),
--     its error "Aborted: asked, and its lease expired"; seen running or not. An `abort`
--     naming an older attempt (a stale ask) changes nothing: the lease goes as below;
--   - a claim never seen running (its row's `ran` is not its nonce: no renewal reached the
--     server, as for a claim whose reply was lost) is given back, at most `max` times per
--     job (`unrun` counts them): attempts-1, state pending, back in its lane;
--   - else its attempt is spent: state pending and back in its lane, or, out of attempts,
--     state dead with error "lease expired" in `dead`;
--   counted in the minute's history as retried (a lease the reaper took back) or dead.
--   A returned job keeps its original enqueue time as score (ahead of newer work); groups
--   rejoin the ring with a wake. A job claimed in time mode: its group pays its
--   claim-to-deadline time (no estimate fed). A dead workflow step fails its workflow
--   (wf_fail in lib/workflow.lua). The clock mark (clock_mark in lib/marks.lua) moves up to now,
--   never back.
--   What the reaper cannot read costs that job or that group, never the tick: a job key that
--   is not a hash is replaced by a dead row, a row without a group or whose attempts, max or
--   created is not an integer (or, for an attempt ending aborted, its ttl) goes to `dead`
--   with the reason (bury in lib/rows.lua), a job bound for a lane of the wrong type goes to
--   `dead` naming it, and other books its group cannot read are left as they are
--   (group_books in lib/books.lua).

local UNRUN = 'lease expired before the job was seen running (attempt not counted)'
local ABORTED = 'Aborted: asked, and its lease expired'   -- the module's S_REAP_ABORTED
-- What the reaper reads of an expired lease's row, in this order, each read as row[E_*].
local EXPIRED_ROW = {'group', 'attempts', 'max', 'created', 'waiters', 'prio', 'started',
  'vcharge', 'wf', 'task', 'nonce', 'ran', 'unrun', 'state', 'abort', 'ttl'}
local E_GROUP, E_ATTEMPTS, E_MAX, E_CREATED, E_WAITERS, E_PRIO, E_STARTED, E_VCHARGE, E_WF,
  E_TASK, E_NONCE, E_RAN, E_UNRUN, E_STATE, E_ABORT, E_TTL =
  1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16

runs_when_full()
local now = now_ms()
-- read first: an `active` of the wrong type fails the call before the clock mark is written
local ids = redis.call('ZRANGEBYSCORE', K_active, '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local seen = clock_mark(now)
local returned, dead = 0, 0
for _, id in ipairs(ids) do
  local jk = job_key(id)
  local row = redis.pcall('HMGET', jk, unpack(EXPIRED_ROW))
  local g, refused = nil, nil
  if row.err then
    refused = bury(id, nil, nil, now, type_of(jk))
    dead = dead + 1
  elseif row[E_GROUP] then
    g = row[E_GROUP]
  elseif type_of(jk) == 'hash' then
    refused = bury(id, nil, 'no group', now)
    dead = dead + 1
  end
  if refused then return redis.error_reply(refused) end
  if not g then
    redis.call('ZREM', K_active, id)          -- a ghost, or a row buried above
  else
    -- read before the job's first write: its row, then its group's books (group_books); an
    -- attempt whose abort was asked ends aborted (end_aborted), its ttl read with the row
    local asked = row[E_NONCE] and row[E_ABORT] == row[E_NONCE] and row[E_STATE] == 'active'
    local fault = int_fault(row[E_ATTEMPTS], 'attempts', true) or int_fault(row[E_MAX], 'max', true)
      or int_fault(row[E_CREATED], 'created', true) or (asked and int_fault(row[E_TTL], 'ttl'))
      or nil
    local ended = not fault and asked and fenced(id, row[E_ATTEMPTS], row[E_NONCE])
    if ended then
      local unfit = end_aborted(id, ended, ABORTED)
      if unfit then return redis.error_reply(unfit) end
      dead = dead + 1
    else
      local unrun = tonumber(row[E_UNRUN] or '0') or 0
      if unrun ~= unrun then unrun = 0 end   -- nan: unreadable, as none
      local give_back = not fault and row[E_RAN] ~= row[E_NONCE] and unrun < tonumber(row[E_MAX])
      local to_dead = fault or (not give_back and tonumber(row[E_ATTEMPTS]) >= tonumber(row[E_MAX]))
      local books = group_books(g, true, not to_dead, row[E_VCHARGE])
      if type(books) == 'string' then fault, to_dead = books, true end
      if fault then
        refused = bury(id, g, fault, now, nil, type(books) == 'string' and books or nil)
      elseif to_dead then
        refused = misfit({{K_dead, 'zset'}})   -- of the wrong type: this job stays as it is
      end
      if refused then return redis.error_reply(refused) end
      if not books then time_settle(g, id, row[E_STARTED], row[E_VCHARGE], now, false) end
      redis.call('ZREM', K_active, id)
      if not books then active_drop(g, now) end
      if fault then
        dead = dead + 1
      elseif give_back then
        redis.call('HINCRBY', jk, 'attempts', -1)
        redis.call('HINCRBY', jk, 'unrun', 1)
        redis.call('HSET', jk, 'state', 'pending', 'error', UNRUN)
        lane_in(g, id, lane_score(row[E_PRIO], tonumber(row[E_CREATED])), now, books)
        hist_failed(now, row[E_TASK] or '', g, false)
        returned = returned + 1
      elseif to_dead then
        redis.call('HSET', jk, 'state', 'dead', 'error', 'lease expired', 'finished', now)
        redis.call('ZADD', K_dead, now, id)
        hist_failed(now, row[E_TASK] or '', g, true)
        notify(id, row[E_WAITERS])
        if row[E_WF] then wf_fail(row[E_WF], id, now) end
        dead = dead + 1
      else
        redis.call('HSET', jk, 'state', 'pending', 'error', 'lease expired')
        lane_in(g, id, lane_score(row[E_PRIO], tonumber(row[E_CREATED])), now, books)
        hist_failed(now, row[E_TASK] or '', g, false)
        returned = returned + 1
      end
    end
  end
end
return {returned, dead, now, seen or 0}
