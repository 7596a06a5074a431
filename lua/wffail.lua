-- wffail: resolve a workflow as failed at a step (the checker's repair of a step that waits
-- for a parent which is gone), as the dead path of retry and reap does.
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: core, keys, workflow
-- ARGV[1]  wf, the workflow's id
-- ARGV[2]  id, the step the workflow failed at (the lost parent)
-- ARGV[3]  the orphaned step ('' for none): cancelled even when the workflow's hash is gone
-- Reply: 1 the workflow was failed now, 0 it had failed already (the orphan still cancelled).
-- Side effects: as wf_fail in lib/workflow.lua: the steps still waiting are cancelled, the
--   link_error step is released, once.

local wk = wf_key(ARGV[1])
local now = now_ms()
local fresh = 0
if redis.call('EXISTS', wk) == 1 and redis.call('HEXISTS', wk, 'failed') == 0 then
  wf_fail(ARGV[1], ARGV[2], now)
  fresh = 1
end
if ARGV[3] and ARGV[3] ~= '' then wf_cancel_waiting(ARGV[3], ARGV[2], now) end
return fresh
