-- retry: fail a leased job (fenced): into `delayed` for a retry, or into `dead` when it has
-- used its attempts (or when the caller says the failure is final).
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: core, keys, fence, timefair, place, history, wake, workflow, types, books
-- ARGV[1]  id
-- ARGV[2]  attempts token
-- ARGV[3]  nonce token
-- ARGV[4]  error text (type, message, traceback)
-- ARGV[5]  delay ms before the retry; '' means the row's own fixed delay
-- ARGV[6]  '1' to dead-letter now whatever the attempts left (a job that can never run)
-- ARGV[7]  optional: the W3C traceparent of the failed attempt's span, kept on the row
--          (`tlink`) for the next attempt's span to link to; absent or '' leaves it as is
-- Reply: 1 retry scheduled, 2 dead, 0 stale (nothing was written).
-- Side effects: counts it in the minute's history (lib/history.lua); removes the id from
--   `active`; gactive-1 (a group held back by its limit returns to the ring with a wake);
--   state delayed or dead, the error (and the attempt's span, ARGV[7]) on the row; a job claimed in time mode settles its
--   group's time (time_settle in lib/timefair.lua). A dead workflow step fails its workflow
--   (wf_fail in lib/workflow.lua). A group whose books cannot be read (group_books in lib/books.lua)
--   keeps them as they are: the failure is written all the same.

runs_when_full()
local id = ARGV[1]
local row = fenced(id, ARGV[2], ARGV[3])
if not row then return 0 end
local jk, g = job_key(id), row[F_GROUP]
local now = now_ms()
-- read before the first write: where the job goes (its attempts and max; its delay), its
-- group's books (those that cannot be read are left as they are), and the queue-wide keys
-- it leaves and goes into (of the wrong type: the call fails, nothing written)
local dead = ARGV[6] == '1' or tonumber(row[F_ATTEMPTS]) >= tonumber(row[F_MAX])
local delay = nil
if not dead then
  delay = tonumber(ARGV[5]) or tonumber(redis.call('HGET', jk, 'delay') or '0')
  if not delay then return redis.error_reply('ERR emq: a job row\'s delay is not a number') end
end
local books, lim = group_books(g, true, false, row[F_VCHARGE])
local into = {{K_active, 'zset'}, {K_dead, 'zset'}}
if not dead then into[2], into[3] = {K_delayed, 'zset'}, {K_wake, 'list'} end
local unfit = misfit(into)
if unfit then return redis.error_reply(unfit) end
if not books then time_settle(g, id, row[F_STARTED], row[F_VCHARGE], now, true) end
if ARGV[7] and ARGV[7] ~= '' then redis.call('HSET', jk, 'tlink', ARGV[7]) end
redis.call('ZREM', K_active, id)
if not books then active_drop(g, now, lim) end
if dead then
  redis.call('HSET', jk, 'state', 'dead', 'error', ARGV[4], 'finished', now)
  redis.call('ZADD', K_dead, now, id)
  hist_failed(now, row[F_TASK] or '', g, true)
  notify(id, row[F_WAITERS])
  if row[F_WF] then wf_fail(row[F_WF], id, now) end
  return 2
end
hist_failed(now, row[F_TASK] or '', g, false)
redis.call('HSET', jk, 'state', 'delayed', 'error', ARGV[4])
delay_push(id, now + delay)
return 1
