-- claim: lease up to n jobs, each from the next turn of the ring (fair however many).
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: core, claim
-- ARGV[1]  n, the most jobs to claim (n turns of the ring)
-- ARGV[2]  nonce prefix, random per call; job i gets nonce prefix .. ':' .. i
-- Reply: an array of up to n jobs, each {id, task, payload, attempts, nonce, group, lease_ms, more,
--   fence};
--   empty when the queue is paused or nothing is serviceable; an error (WRONGTYPE, naming
--   the key) when a queue-wide key a claim writes is of the wrong type: nothing was written.
-- Side effects: counts it in the minute's history (lib/history.lua); per job, attempts+1,
--   fence+1, state active, `active` score now+lease, gactive+1; a group at its limit or with
--   an empty lane leaves the ring; a tenant at its limit leaves it, and one whose rate
--   budget the claim spent leaves it for `twait` (both modes). In time mode each claim is served from the group of least
--   virtual time and charged to it (time_charge, lib/timefair.lua). A row the claim cannot read
--   goes to `dead` with the reason, a group whose books it cannot read leaves the ring, and
--   the claim goes on (claim_one in lib/claim.lua).

runs_when_full()
if redis.call('EXISTS', K_paused) == 1 then return {} end
local now = now_ms()
local out = {}
for i = 1, tonumber(ARGV[1]) do
  local job, books = claim_one(ARGV[2] .. ':' .. i, now)
  if books then return redis.error_reply(books) end
  if not job then break end
  out[#out + 1] = job
end
return out
