-- release: hand a leased job back unrun (fenced), at the head of its lane, its attempt
-- rolled back: a worker shutting down is not the job's failure.
--
-- KEYS: the queue's fixed keys (see _common.lua).
-- ARGV[1]  id
-- ARGV[2]  attempts token
-- ARGV[3]  nonce token
-- ARGV[4]  reason, kept on the row as its last error
-- Reply: 1 released, 0 stale (nothing was written).
-- Side effects: removes the id from `active`; gactive-1; attempts-1, state pending, back in
--   its lane with its original enqueue time as score (so it keeps its place).

local id = ARGV[1]
local row = fenced(id, ARGV[2], ARGV[3])
if not row then return 0 end
local jk = job_key(id)
redis.call('ZREM', K_active, id)
active_drop(row[4])
redis.call('HINCRBY', jk, 'attempts', -1)
redis.call('HSET', jk, 'state', 'pending', 'error', ARGV[4])
lane_push(row[4], id, tonumber(redis.call('HGET', jk, 'created') or '0'))
return 1
