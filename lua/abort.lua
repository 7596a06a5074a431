-- abort: ask the master running a job to stop it (ask), or end the attempt it stopped (end).
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: core, keys, fence, aborted
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
--   Side effects: as retry.lua's dead path, but state `aborted` and not into `dead`
--   (end_aborted, lib/aborted.lua; release.lua, and reap.lua when its lease expired, end so an
--   attempt whose abort was asked).
--   Never retried.

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
local unfit = end_aborted(id, row, ARGV[5])
if unfit then return redis.error_reply(unfit) end
return 1
