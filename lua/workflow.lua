-- workflow: enqueue a whole workflow (chain, group, chord) in one call, or none of it.
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: core, keys, settings, jobrow
-- ARGV[1]  wf, the workflow's id (gated like a job id)
-- ARGV[2]  seconds the workflow's hash lives
-- ARGV[3]  f, then f field/value pairs of the workflow's hash (kind, steps, final, waiting,
--          lerr...: see lib/workflow.lua)
-- then     m, the number of steps; per step the 10 fields of enqueue.lua (id task payload
--          group max lease delay ttl countdown priority: J_* in lib/jobrow.lua), then its
--          mode ('r' ready now, 'w' waiting for a parent, 'e' the link_error step: waiting,
--          and expiring with the workflow's hash unless a failure releases it), then k and
--          k field/value pairs written on its row (wf, next, slot, par, imm, splice, comma,
--          cd, npend, nslots, shape)
-- Reply: {1, wf} enqueued; {0, id} refused, the workflow or step id exists; {-1, id} refused,
--   a malformed id; {2, id} refused, a ready step's lane holds its cap (max_size). A refusal
--   writes nothing.
-- Side effects: writes BASE .. 'wf:' .. wf and every step's row; ready steps join their
--   lanes (or `delayed` for a countdown) as enqueue does (new_job in lib/jobrow.lua, the
--   differences said below), waiting steps sit in no structure until the ack of their
--   parent releases them.

-- A step's own arguments after its J_* ten: its mode, then k and its k field/value pairs.
local W_MODE, W_K = J_PRIORITY + 1, J_PRIORITY + 2
local wf = ARGV[1]
local function bad(id) return #id > 128 or not string.match(id, '^[%w_.:%-]+$') end
if bad(wf) then return {-1, wf} end
local wk = wf_key(wf)
if redis.call('EXISTS', wk) == 1 then return {0, wf} end
local f = tonumber(ARGV[3])
local at = 4 + 2 * f
local m = tonumber(ARGV[at])
local steps = {}
local o = at + 1
for _ = 1, m do
  local k = tonumber(ARGV[o + W_K])
  steps[#steps + 1] = {o = o, k = k}
  o = o + W_K + 1 + 2 * k
end
-- First every check, then every write: a refused workflow leaves nothing behind.
local adding = {}
for _, s in ipairs(steps) do
  local id, g = ARGV[s.o + J_ID], ARGV[s.o + J_GROUP]
  if bad(id) then return {-1, id} end
  if redis.call('EXISTS', job_key(id)) == 1 then return {0, id} end
  if ARGV[s.o + W_MODE] == 'r' and tonumber(ARGV[s.o + J_COUNTDOWN]) <= 0 then
    adding[g] = (adding[g] or 0) + 1
    local cap = max_size_of(g)
    if cap and redis.call('ZCARD', lane_key(g)) + adding[g] > tonumber(cap) then
      return {2, id}
    end
  end
end
local now = now_ms()
local meta = {}
for i = 4, 3 + 2 * f do meta[#meta + 1] = ARGV[i] end
redis.call('HSET', wk, 'state', 'running', 'created', now, unpack(meta))
redis.call('EXPIRE', wk, tonumber(ARGV[2]))
for _, s in ipairs(steps) do
  local p = s.o
  local mode = ARGV[p + W_MODE]
  local extra = nil
  if s.k > 0 then
    extra = {}
    for i = p + W_K + 1, p + W_K + 2 * s.k do extra[#extra + 1] = ARGV[i] end
  end
  -- A step differs from a producer's job on purpose: it is not held to its lane's cap here,
  -- since every ready step's cap was checked above, before the first write (the workflow is
  -- written whole or not at all); a step of mode 'w' or 'e' is not ready (it waits for its
  -- parent); and the minute's history does not count it as enqueued: only enqueue.lua
  -- counted when each verb wrote its own row, and that is kept (its start and end count).
  new_job(p, tonumber(ARGV[p + J_PRIORITY]) or 0, now, nil, false, mode == 'r', extra)
  if mode == 'e' then redis.call('EXPIRE', job_key(ARGV[p + J_ID]), tonumber(ARGV[2])) end
end
return {1, wf}
