-- ack: complete a leased job (fenced), store its result, and optionally claim the next job
-- in the same call, so a busy worker pays one script call per job.
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: core, keys, fence, timefair, place, history, wake, workflow, marks, claim, books
-- ARGV[1]  id
-- ARGV[2]  attempts, the token read at claim time
-- ARGV[3]  nonce, drawn at claim time
-- ARGV[4]  result (JSON text)
-- ARGV[5]  next: '' for none, else the nonce for the next claim
-- ARGV[6]  optional: the W3C traceparent of the run's span; the waiting steps it releases
--          keep it (`tparent`, a chord's callback: `tlinks` for the members before the
--          last), see wf_handover; absent or '' (a worker that does not trace) keeps none
-- Reply: {verdict, next_job}: verdict 1 done (also to the same holder's ack sent again, its
--   reply lost: the row is done with its attempts and nonce; nothing more is written), 0
--   stale (nothing of the job was written: no result, no books; the queue's tally counts
--   it: `stale_acks`, tally in lib/marks.lua);
--   next_job as in claim.lua, or false when none was asked or none is serviceable
--   (or a queue-wide key a claim writes is of the wrong type: the next plain claim says which).
-- Side effects: counts the success in the minute's history; removes the id from `active`, state done with result and finish time; the
--   row expires after its ttl (deleted at once when ttl is 0); gactive-1, and a group held
--   back by its limit returns to the ring with a wake. A job claimed in time mode settles
--   its group's virtual time, cost estimate and busy time (time_settle in lib/timefair.lua). A
--   workflow step (a row with `next`) releases its waiting children in the same call: see
--   wf_handover in lib/workflow.lua. A group whose books cannot be read (group_books in
--   lib/books.lua) keeps them as they are: the job is done all the same.

runs_when_full()
local id = ARGV[1]
local verdict = 0
local now = now_ms()
local row = fenced(id, ARGV[2], ARGV[3])
if row then
  local jk, g = job_key(id), row[F_GROUP]
  -- read before the first write: books that cannot be read are left as they are (the job's
  -- outcome is written all the same: it ran)
  local books, lim = group_books(g, true, false, row[F_VCHARGE])
  if not books then time_settle(g, id, row[F_STARTED], row[F_VCHARGE], now, true) end
  redis.call('ZREM', K_active, id)
  local ttl = tonumber(row[F_TTL] or '0')
  if ttl > 0 then
    redis.call('HSET', jk, 'state', 'done', 'result', ARGV[4], 'finished', int_text(now))
    redis.call('HDEL', jk, 'payload')
    redis.call('EXPIRE', jk, ttl)
  else
    redis.call('DEL', jk)
  end
  if not books then active_drop(g, now, lim) end
  hist_succeeded(now, row[F_TASK] or '', g, tonumber(row[F_STARTED]))
  notify(id, row[F_WAITERS])
  if row[F_NEXT] then
    local tp = ARGV[6]
    if tp == '' then tp = nil end
    wf_handover(row[F_NEXT], row[F_SLOT], ARGV[4], now, tp)
  end
  verdict = 1
else
  -- The same holder's ack again (its reply was lost: a cut connection, a timeout; the
  -- worker sends it again): the first one was applied, so it is answered done again and
  -- nothing is written. (A row gone with ttl 0 cannot tell: stale.)
  local seen = redis.call('HMGET', job_key(id), 'state', 'attempts', 'nonce')
  if seen[1] == 'done' and seen[2] == ARGV[2] and seen[3] == ARGV[3] then
    verdict = 1
  else
    tally('stale_acks')
  end
end
local next_job = false
if ARGV[5] ~= '' and redis.call('EXISTS', K_paused) == 0 then
  next_job = claim_one(ARGV[5], now) or false
end
return {verdict, next_job}
