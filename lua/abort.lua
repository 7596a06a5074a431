-- abort: ask the master running a job to stop it (ask), or end the attempt it stopped (end).
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: core, keys, fence, timefair, place, history, wake, workflow, types, books
-- ARGV[1]  'ask' or 'end'
-- ask: ARGV[2] id.
--   Reply: 1 asked; 0 no such job; -1 not running (pending, delayed or waiting: the caller
--   cancels it, cancel.lua); -2 finished (done, dead, cancelled, expired, aborted).
--   Side effects: the row's `abort` is set to the running attempt's nonce (fenced: a later
--   claim has another nonce, so an abort aimed at this attempt never stops the next); the
--   token "<id> <nonce>" is pushed on the abort list of every master in the queue's
--   `workers` index (`aborts:<worker id>`, at most ABORT_CAP tokens, gone ABORT_TTL s
--   after the last push). A master blocks on its own list only while it runs jobs, so an
--   idle pool pays nothing; the master holding the attempt stops it, the others drop it.
-- end: ARGV[2] id, ARGV[3] attempts token, ARGV[4] nonce token, ARGV[5] error text.
--   Reply: 1 aborted, 0 stale (nothing written).
--   Side effects: as retry.lua's dead path, but state `aborted` and not into `dead`: out of
--   `active`, gactive-1, the time-fair settle, the minute's history (counted dead), the
--   waiters notified, the row expires after its ttl (0: deleted), a workflow step fails its
--   workflow (wf_fail). Never retried.

local ABORT_CAP = 64
local ABORT_TTL = 60

local mode, id = ARGV[1], ARGV[2]
local jk = job_key(id)
if mode == 'ask' then
  local row = redis.call('HMGET', jk, 'state', 'nonce')
  local state = row[1]
  if not state then return 0 end
  if state == 'pending' or state == 'delayed' or state == 'waiting' then return -1 end
  if state ~= 'active' then return -2 end
  local nonce = row[2] or ''
  redis.call('HSET', jk, 'abort', nonce)
  local token = id .. ' ' .. nonce
  for _, wid in ipairs(redis.call('HKEYS', K_workers)) do
    local lk = aborts_key(wid)
    if redis.call('LLEN', lk) < ABORT_CAP then
      redis.call('RPUSH', lk, token)
      redis.call('EXPIRE', lk, ABORT_TTL)
    end
  end
  return 1
end
if mode ~= 'end' then return redis.error_reply('ERR emq: abort mode must be ask or end') end

runs_when_full()
local row = fenced(id, ARGV[3], ARGV[4])
if not row then return 0 end
local g = row[F_GROUP]
local now = now_ms()
local books = group_books(g, true, false, row[F_VCHARGE])
local unfit = misfit({{K_active, 'zset'}})
if unfit then return redis.error_reply(unfit) end
if not books then time_settle(g, id, row[F_STARTED], row[F_VCHARGE], now, true) end
redis.call('ZREM', K_active, id)
local ttl = tonumber(row[F_TTL] or '0')
if ttl > 0 then
  redis.call('HSET', jk, 'state', 'aborted', 'error', ARGV[5], 'finished', now)
  redis.call('EXPIRE', jk, ttl)
else
  redis.call('DEL', jk)
end
if not books then active_drop(g, now) end
hist_failed(now, row[F_TASK] or '', g, true)
notify(id, row[F_WAITERS])
if row[F_WF] then wf_fail(row[F_WF], id, now) end
return 1
