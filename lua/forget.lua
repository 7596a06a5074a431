-- forget: delete a finished job's row, its result with it (AsyncResult.forget()).
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: keys
-- ARGV[1]  id
-- Reply: 1 forgotten; 0 no such job; -1 not finished (pending, delayed, waiting, active:
--   cancel it first; its row is what moves it along).
-- Side effects: the row is deleted; a dead job leaves `dead` too (nothing left to requeue).

local id = ARGV[1]
local jk = job_key(id)
local state = redis.call('HGET', jk, 'state')
if not state then return 0 end
if state == 'dead' then
  redis.call('ZREM', K_dead, id)
elseif state ~= 'done' and state ~= 'cancelled' and state ~= 'expired' and state ~= 'skipped'
  and state ~= 'aborted' then
  return -1
end
redis.call('DEL', jk)
return 1
