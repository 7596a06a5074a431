-- enqueue: admit jobs idempotently, one or many in one call, each with its own verdict.
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: core, keys, enqueue, jobrow
-- ARGV[1]      n, the number of jobs; then 10 fields per job:
--   id         job id (gated again here: 1-128 of [A-Za-z0-9_.:-])
--   task       registered task name
--   payload    the JSON envelope of the arguments
--   group      the lane
--   max        max attempts
--   lease      lease length, ms
--   delay      fixed retry delay, ms
--   ttl        seconds a finished row (and its result) lives; 0 keeps nothing
--   countdown  ms until due; 0 means now (into the lane), > 0 goes to `delayed`
--   priority   -100..100, lower runs first within the lane (0 the default)
-- then, optionally (sent only when a job of the call has one), n expiries, one per job:
--   ms from now after which the job, not yet started, is never run ('' for none); the
--   row keeps `expires` = now + that, and a claim that meets it later ends it `expired`.
-- then, optionally (sent only when a job of the call names one, after the expiries, all ''
--   when none has one), n tenants, one per job: the tenant of the job's group ('' for none:
--   the group is its own tenant). A group belongs to one tenant: a job naming another than
--   its group's (none counts as one) is refused unless the group is empty (nothing waiting
--   in its lane, nothing in flight); then the group passes to the job's tenant.
-- then, optionally (sent only when a job of the call has one, after the expiries and the
--   tenants, '' for none), n unique keys, one per job: '<ms>:<key>' ('' for none). While the
--   job holding key (its id in emq:{q}:u:<key>, for at most ms) is not finished (its row
--   exists with no `finished`: pending, delayed, waiting or running), the job is not written
--   and its reply is the holder's id (a string); else it is written and takes the key.
--   A holder that ended releases its key by ending: the next enqueue sees it finished (or
--   gone) and takes the key over, so no end verb needs to know of keys.
--   'd<ms>:<debounce ms>:<max ms>:<key>' debounces: a holder still delayed and never
--   started (attempts 0) that was debounced (its row's `dfirst`, the first call's time) takes
--   this job's payload and is due debounce ms from now, never later than dfirst + max ms; the
--   reply is its id. Else (no holder, or one that started or is due) the job is written, due
--   in debounce ms, and takes the key.
-- Reply: an array of n integers, one per job (or a holder's id, above): 1 enqueued, 0 duplicate (the row exists, so
--   nothing was written), -1 refused because the id is malformed, 2 refused because the
--   lane holds its cap of waiting jobs (max_size), or, due now, its tenant's lanes hold the
--   tenant's cap over all its groups (the tenant's max_size: nothing was written), 4 refused because
--   its group belongs to another tenant and is not empty (nothing was written), 3 refused because
--   its lane, or a book of its group that opening the lane reads (limit, jobs in flight,
--   rate, start times), cannot be read (nothing was written; the others go on). An error
--   (WRONGTYPE, naming the key) when a queue-wide key the call writes is of the wrong
--   type: nothing was written (enqueue_books in lib/enqueue.lua).
-- Side effects: counts the job in the minute's history (lib/history.lua); writes emq:{q}:job:<id> (field prio when not 0); adds the id to its lane
--   (a lane that opens joins the ring, or gwait while its rate budget is spent, and pushes
--   a wake) or to `delayed`. A countdown is not held to the cap: it joins its lane when due.

local n = tonumber(ARGV[1])
local now = now_ms()
-- The optional expiries (ARGV[tail + i]), checked before anything is written: at most ten
-- years either way, so now + one stays integer text of 15 digits (int_ok).
local MAX_EXPIRES_MS = 315576000000
local tail = 2 + n * 10
local tenants, uniques = nil, nil
if #ARGV >= tail then
  if #ARGV == tail - 1 + 3 * n and n > 0 then
    tenants, uniques = tail + n, tail + 2 * n
  elseif #ARGV == tail - 1 + 2 * n and n > 0 then
    tenants = tail + n
  elseif #ARGV ~= tail - 1 + n then
    return redis.error_reply('ERR emq: n expiries or none, then n tenants, n unique keys')
  end
  for i = 0, n - 1 do
    local ex = ARGV[tail + i]
    if ex ~= '' and not (int_ok(ex) and math.abs(tonumber(ex)) <= MAX_EXPIRES_MS) then
      return redis.error_reply('ERR emq: an expiry must be integer ms within 10 years')
    end
    local u = uniques and ARGV[uniques + i] or ''
    local ms = string.match(u, '^(%d+):.') or string.match(u, '^d(%d+):%d+:%d+:.')
    if u ~= '' and not (ms and #ms <= 12 and tonumber(ms) > 0) then
      return redis.error_reply('ERR emq: a unique key is <ms>:<key>, ms a positive integer')
    end
  end
end
-- Before the first write: every key the call writes (enqueue_books).
local refused, books, caps, warm = enqueue_books(n, now)
if books then return redis.error_reply(books) end
local out = {}
for i = 0, n - 1 do
  local at = 2 + i * 10    -- ARGV[at + J_*]: job i's arguments (lib/jobrow.lua)
  local id = ARGV[at + J_ID]
  local u = uniques and ARGV[uniques + i] or ''
  if #id > 128 or not string.match(id, '^[%w_.:%-]+$') then
    out[#out + 1] = -1
  elseif redis.call('EXISTS', job_key(id)) == 1 then
    out[#out + 1] = 0
  elseif refused[i] then
    out[#out + 1] = 3
  else
    -- a key held answers its holder (a debounced one takes this job's payload), else written
    local held = u ~= '' and unique_held(u, at, now)
    -- a job due now of a tenant with a lane cap over all its groups: refused past it (2)
    local tn = tenants and ARGV[tenants + i] or ''
    local due = tn ~= '' and tonumber(ARGV[at + J_COUNTDOWN]) <= 0
    if held then
      out[#out + 1] = held
    elseif due and TEN.full(tn) then
      out[#out + 1] = 2
    elseif not tenant_claim(ARGV[at + J_GROUP], tenants and ARGV[tenants + i],
                            caps[i] and tonumber(caps[i]) == 0) then
      out[#out + 1] = 4
    else
      -- A producer's job: held to its lane's cap when due now (caps[i], nil for a countdown:
      -- it joins its lane when due), and counted in the minute's history as enqueued.
      local prio = tonumber(ARGV[at + J_PRIORITY]) or 0
      local ex, extra = ARGV[tail + i], nil
      if ex and ex ~= '' then extra = {'expires', int_text(now + tonumber(ex))} end
      if u ~= '' then
        extra = extra or {}
        extra[#extra + 1], extra[#extra + 2] = 'unique', unique_parts(u)
        if string.sub(u, 1, 1) == 'd' then
          extra[#extra + 1], extra[#extra + 2] = 'dfirst', now
        end
      end
      out[#out + 1] = new_job(at, prio, now, caps[i], true, true, extra, warm[i])
      if out[#out] == 1 and u ~= '' then unique_take(u, id) end
      if out[#out] == 1 and due then TEN.took(tn) end
    end
  end
end
return out
