-- workflow: enqueue a whole workflow (chain, group, chord) in one call, or none of it.
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: core, keys, settings, wake, place
-- ARGV[1]  wf, the workflow's id (gated like a job id)
-- ARGV[2]  seconds the workflow's hash lives
-- ARGV[3]  f, then f field/value pairs of the workflow's hash (kind, steps, final, waiting,
--          lerr...: see lib/workflow.lua)
-- then     m, the number of steps; per step the 10 fields of enqueue.lua (id task payload
--          group max lease delay ttl countdown priority), then its mode ('r' ready now, 'w'
--          waiting for a parent, 'e' the link_error step: waiting, and expiring with the
--          workflow's hash unless a failure releases it), then k and k field/value pairs
--          written on its row (wf, next, slot, par, imm, splice, comma, cd, npend, nslots)
-- Reply: {1, wf} enqueued; {0, id} refused, the workflow or step id exists; {-1, id} refused,
--   a malformed id; {2, id} refused, a ready step's lane holds its cap (max_size). A refusal
--   writes nothing.
-- Side effects: writes BASE .. 'wf:' .. wf and every step's row; ready steps join their
--   lanes (or `delayed` for a countdown) as enqueue does, waiting steps sit in no structure
--   until the ack of their parent releases them.

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
  local k = tonumber(ARGV[o + 11])
  steps[#steps + 1] = {o = o, k = k}
  o = o + 12 + 2 * k
end
-- First every check, then every write: a refused workflow leaves nothing behind.
local adding = {}
for _, s in ipairs(steps) do
  local id, g = ARGV[s.o], ARGV[s.o + 3]
  if bad(id) then return {-1, id} end
  if redis.call('EXISTS', job_key(id)) == 1 then return {0, id} end
  if ARGV[s.o + 10] == 'r' and tonumber(ARGV[s.o + 8]) <= 0 then
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
  local id, g = ARGV[p], ARGV[p + 3]
  local countdown = tonumber(ARGV[p + 8])
  local prio = tonumber(ARGV[p + 9]) or 0
  local state = 'waiting'
  if ARGV[p + 10] == 'r' then
    state = 'pending'
    if countdown > 0 then state = 'delayed' end
  end
  local jk = job_key(id)
  redis.call('HSET', jk, 'task', ARGV[p + 1], 'payload', ARGV[p + 2], 'group', g, 'state', state,
    'attempts', 0, 'max', ARGV[p + 4], 'lease', ARGV[p + 5], 'delay', ARGV[p + 6],
    'ttl', ARGV[p + 7], 'created', now)
  if prio ~= 0 then redis.call('HSET', jk, 'prio', prio) end
  if s.k > 0 then
    local extra = {}
    for i = p + 12, p + 11 + 2 * s.k do extra[#extra + 1] = ARGV[i] end
    redis.call('HSET', jk, unpack(extra))
  end
  if state == 'delayed' then
    delay_push(id, now + countdown)
  elseif state == 'pending' then
    lane_push(g, id, lane_score(prio, now), now)
  elseif ARGV[p + 10] == 'e' then
    redis.call('EXPIRE', jk, tonumber(ARGV[2]))
  end
end
return {1, wf}
