-- fence: a leased job's verbs act only for the claim that holds it.
-- Includes: keys

-- The fence: the row is active and the caller holds the current attempts and nonce.
-- Returns {state, attempts, nonce, group, max, ttl, waiters, started, vcharge, wf, next,
-- slot, task}, or nil when stale (wf, next and slot are a workflow step's, lib/workflow.lua:
-- nil for a plain job).
local function fenced(id, attempts, nonce)
  local row = redis.call('HMGET', job_key(id), 'state', 'attempts', 'nonce', 'group', 'max', 'ttl',
    'waiters', 'started', 'vcharge', 'wf', 'next', 'slot', 'task')
  if row[1] ~= 'active' or row[2] ~= attempts or row[3] ~= nonce then return nil end
  return row
end
