-- jobrow: the one writer of a new job's row (new_job), for every verb that creates a job
-- (enqueue, schedule's fire, workflow), and the row of a schedule's skipped slot (skip_job).
-- Includes: keys, wake, place, history
--
-- What differs between the callers is an argument, and each caller says why: its priority
-- (a schedule's job has none), whether it is held to its lane's cap, whether the minute's
-- history counts it as enqueued, whether it is ready (a workflow step waiting for a parent
-- is not) and the fields of its own (a workflow step's). tests/test_store_layout.py fails
-- when another file writes a job row's fields of NEW_ROW.

-- A job's arguments, as ARGV[at + J_*] with `at` the index of its id: enqueue takes ten per
-- job, workflow ten per step (then its own), schedule's fire ten for its slot's job
-- (emqtasks/store/protocol.py JOB_ARGS; the module's J_* in jobrow.c).
local J_ID, J_TASK, J_PAYLOAD, J_GROUP, J_MAX, J_LEASE, J_DELAY, J_TTL, J_COUNTDOWN,
  J_PRIORITY = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9

local new_job, skip_job
do   -- the names it uses copied next to it, as lib/claim.lua explains (each name a closure
     -- captures costs every run of a verb that loads the file: the arguments are read by
     -- one unpack rather than by their J_* each)
  local delay_push, hist_enqueued, job_key, lane_key, lane_push, lane_score =
    delay_push, hist_enqueued, job_key, lane_key, lane_push, lane_score
  local J_COUNTDOWN, J_MAX = J_COUNTDOWN, J_MAX
  local tonumber, unpack, format = tonumber, unpack, string.format

  -- The row of the job whose arguments start at ARGV[at] (J_*), written now, and the job
  -- put where its state says: a ready job is pending in its lane, or delayed for its
  -- countdown; one not ready is waiting (in no structure until a parent releases it).
  --   prio     its priority (0: no `prio` field, the lane score is its time)
  --   cap      the lane cap it is held to (nil: none): a job due now whose lane holds that
  --            many is refused before anything is written (returns 2)
  --   counted  true: the minute's history counts it as enqueued to its group
  --   ready    false: state 'waiting', not placed
  --   extra    nil, or field/value pairs of the caller's own, written after the row
  --   warm     true: the lane is known to hold a job already (lane_push in lib/place.lua)
  -- Returns 1 written, 2 refused for the cap. The row's existence is the caller's check.
  function new_job(at, prio, now, cap, counted, ready, extra, warm)
    local id, task, payload, group, max, lease, delay, ttl, countdown =
      unpack(ARGV, at, at + J_COUNTDOWN)
    countdown = tonumber(countdown)
    if cap then
      local size = redis.call('ZCARD', lane_key(group))
      if size >= tonumber(cap) then return 2 end
      warm = warm or size > 0
    end
    local state = 'waiting'
    if ready then
      state = 'pending'
      if countdown > 0 then state = 'delayed' end
    end
    local jk = job_key(id)
    redis.call('HSET', jk, 'task', task, 'payload', payload, 'group', group, 'state', state,
      'attempts', '0', 'max', max, 'lease', lease, 'delay', delay, 'ttl', ttl, 'created',
      format('%d', now))   -- (text: a number would go through the server's %.17g)
    if prio ~= 0 then redis.call('HSET', jk, 'prio', prio) end
    if extra then redis.call('HSET', jk, unpack(extra)) end
    if state == 'delayed' then
      delay_push(id, now + countdown)
    elseif state == 'pending' then
      lane_push(group, id, lane_score(prio, now), now, warm)
    end
    if counted then hist_enqueued(now, group) end
    return 1
  end

  -- The row of a schedule's slot skipped by its overlap control (the job whose arguments
  -- start at ARGV[at]): state 'skipped' with the reason, kept ttl seconds (> 0).
  function skip_job(at, now, ttl, why)
    local id, task, _, group, max = unpack(ARGV, at, at + J_MAX)
    local jk = job_key(id)
    redis.call('HSET', jk, 'task', task, 'group', group, 'state', 'skipped', 'attempts', 0,
      'max', max, 'ttl', ttl, 'created', now, 'finished', now, 'error', why)
    redis.call('EXPIRE', jk, ttl)
  end
end
