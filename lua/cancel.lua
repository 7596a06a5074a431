-- cancel: withdraw a job that is not running.
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: core, keys, withdraw
-- ARGV[1]  id
-- Reply: 1 cancelled; 0 no such job; -1 running (a leased job is not interrupted);
--   -2 already finished (done, cancelled, expired or aborted).
-- Side effects: the id leaves its lane (an emptied lane leaves the ring), `delayed` or
--   `dead`; state cancelled; the row expires after its ttl; a chord callback's results hash
--   goes. A step of a running workflow (not its link_error step) takes its workflow with
--   it, as wfcancel.lua does (wf_cancel): the steps after it could never start, and the
--   workflow's `get()` would otherwise wait for ever.

local id = ARGV[1]
local row = redis.call('HMGET', job_key(id), unpack(CANCEL_ROW))
local state = row[C_STATE]
if not state then return 0 end
if state == 'active' then return -1 end
if state == 'done' or state == 'cancelled' or state == 'expired' or state == 'aborted' then
  return -2
end
local now = now_ms()
cancel_job(id, row, now)
local wf = row[C_WF]
local w = wf and redis.call('HMGET', wf_key(wf), 'state', 'lerr')
if w and w[1] == 'running' and w[2] ~= id then
  -- (the link_error step strands no step: it waits for a failure that may never come)
  wf_cancel(wf, now)
end
return 1
