-- wfcancel: cancel every step of a workflow that has not started, in one call.
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: core, withdraw
-- ARGV[1]  wf, the workflow's id
-- Reply: the number of steps cancelled (0 when the workflow is gone).
-- Side effects: the workflow's state is cancelled (its link_error step too, unreleased);
--   each step waiting, pending (its lane left; an emptied lane leaves the ring) or delayed
--   is cancelled as cancel.lua does; running, finished and dead steps are left alone, and
--   the children of a running step stay cancelled when its ack comes (wf_cancel).

return wf_cancel(ARGV[1], now_ms())
