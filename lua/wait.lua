-- wait: read a job's outcome, registering the caller as a waiter if it has none yet, so
-- the verb that ends the job (ack, retry to dead, reap to dead, cancel, a claim that
-- finds it expired) pushes a token on
-- BASE .. 'done:' .. id for the caller to block on.
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: keys
-- ARGV[1]  id
-- ARGV[2]  '1' to register as a waiter when the job is not finished, '0' only to read
-- Reply: {state, result, error}; state is false when the row is gone.
-- Side effects: HINCRBY waiters on a live, unfinished row (never creates a row).

local jk = job_key(ARGV[1])
local row = redis.call('HMGET', jk, 'state', 'result', 'error')
local state = row[1]
if ARGV[2] == '1' and state and state ~= 'done' and state ~= 'dead' and state ~= 'cancelled'
  and state ~= 'expired' and state ~= 'aborted' then
  redis.call('HINCRBY', jk, 'waiters', 1)
end
return row
