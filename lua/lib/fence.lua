-- fence: a leased job's verbs act only for the claim that holds it.
-- Includes: keys

-- The row fenced() answers: these fields in this order (emqtasks/store/protocol.py
-- FENCED_ROW; the module's fence.c reads the same into its Row), each read as row[F_*].
-- (wf, next and slot are a workflow step's, lib/workflow.lua: false for a plain job.)
local FENCED_ROW = {'state', 'attempts', 'nonce', 'group', 'max', 'ttl', 'waiters', 'started',
  'vcharge', 'wf', 'next', 'slot', 'task'}
local F_STATE, F_ATTEMPTS, F_NONCE, F_GROUP, F_MAX, F_TTL, F_WAITERS, F_STARTED, F_VCHARGE,
  F_WF, F_NEXT, F_SLOT, F_TASK = 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13

-- The fence: the row is active and the caller holds the current attempts and nonce.
-- Returns the row (FENCED_ROW), or nil when stale.
local function fenced(id, attempts, nonce)
  local row = redis.call('HMGET', job_key(id), unpack(FENCED_ROW))
  if row[F_STATE] ~= 'active' or row[F_ATTEMPTS] ~= attempts or row[F_NONCE] ~= nonce then
    return nil
  end
  return row
end
