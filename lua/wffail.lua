-- wffail: resolve a workflow as failed at a step (the checker's repair of a step that waits
-- for a parent which is gone), as the dead path of retry and reap does.
--
-- KEYS: the queue's fixed keys (see _common.lua).
-- ARGV[1]  wf, the workflow's id
-- ARGV[2]  id, the step the workflow failed at
-- Reply: 1 the workflow was failed now, 0 it had failed already (or is gone).
-- Side effects: as wf_fail in _common.lua: the steps still waiting are cancelled, the
--   link_error step is released, once.

local wk = wf_key(ARGV[1])
if redis.call('EXISTS', wk) == 0 or redis.call('HEXISTS', wk, 'failed') == 1 then return 0 end
wf_fail(ARGV[1], ARGV[2], now_ms())
return 1
