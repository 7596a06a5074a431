-- extend: push the lease deadlines of running jobs out (fenced each); the heartbeat.
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: core, keys, fence
-- ARGV[1]  lease ms from now
-- ARGV[2..] triples: id, attempts token, nonce token
-- Reply: an array, per job 1 extended or 0 stale (nothing was written for it).
-- Side effects: `active` score of each fenced id set to now + lease; its row's `ran` set to
--   the claim's nonce: the job was seen running (its master renews at first sight), so an
--   expiry of this claim spends its attempt (reap.lua).

runs_when_full()
local now = now_ms()
local lease = tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV, 3 do
  if fenced(ARGV[i], ARGV[i + 1], ARGV[i + 2]) then
    redis.call('ZADD', K_active, 'XX', now + lease, ARGV[i])
    redis.call('HSET', job_key(ARGV[i]), 'ran', ARGV[i + 2])
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
