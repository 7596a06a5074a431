-- timefair: the time-fair mode's charge at a claim and settlement when a job leaves flight.
-- Includes: keys, core, settings
--
-- Fair share of worker time (time mode): each open group has a virtual time, the worker
-- time it was given divided by its weight (us); a claim serves the open group with the
-- least (the lowest member of gvt, O(log n)) and charges it its estimated cost / weight
-- (gcost: a moving average of its recent jobs); the job's row keeps that charge
-- (`vcharge`), and when the job leaves flight its group pays the difference to what it
-- really used (time_settle). The floor, gvrun[''], is the virtual time of the last group
-- served: a group that enters starts at its own virtual time or the floor, whichever is
-- later, so time spent away banks no credit; a refund takes no group below the floor (+1),
-- so the credit of an overestimate never jumps a group that entered meanwhile. Every job
-- costs at least 1 us of virtual time (at its claim and at its settlement), so a group of
-- jobs too short for the ms clock still moves past the floor, and a group entering there is
-- served before its next job.
local DEFAULT_COST = 10000      -- us: the first guess of a queue that has run nothing

-- Add ms of busy time to a 10 s slot of a busy hash (the last minute's, for stats); a new
-- slot clears the ones that fell out of the minute and sets the key to go 70 s later (a key
-- written on goes on: every 10 s brings a new slot).
local function busy_add(key, ms, now)
  local slot = math.floor(now / 10000)
  if redis.call('HINCRBY', key, slot, ms) == ms then
    redis.call('HDEL', key, slot - 6, slot - 7, slot - 8, slot - 9, slot - 10, slot - 11)
    redis.call('PEXPIRE', key, 70000)
  end
end

-- A job charged at its claim in time mode (its row holds `vcharge`) leaves flight: its group
-- pays what it really used, the time from its claim to now or to its lease deadline if that
-- came first, less the charge. `sample`: the run was a real one (ack, retry), so it feeds the
-- group's and the queue's cost estimates (3/4 old + 1/4 new); a release or a reap does not.
-- Call before the row changes, with the id still in `active`.
local function time_settle(g, id, row_started, vcharge, now, sample)
  if not vcharge then return end
  local deadline = tonumber(redis.call('ZSCORE', K_active, id)) or now
  local used = math.max(0, math.min(now, deadline) - (tonumber(row_started) or now))
  -- read before the first write, as the module does: what cannot be read changes nothing
  local w = weight_of(g)
  local charged = tonumber(vcharge) or error('a job row\'s vcharge is not a number')
  redis.call('HDEL', job_key(id), 'vcharge')
  local delta = math.max(1, math.floor(used * 1000 / w)) - charged
  if delta ~= 0 then
    local own = tonumber(redis.call('HGET', K_gvrun, g)) or 0
    local v = own + delta
    if delta < 0 then
      -- A refund stops just past the floor: below it, the group would go ahead of every group
      -- that entered at the floor while its overestimated jobs ran, and its jobs too short to
      -- pay much would hold them off for thousands of claims. It never raises a group.
      local floor = tonumber(redis.call('HGET', K_gvrun, '')) or 0
      v = math.max(v, math.min(own, floor + 1))
    end
    v = int_text(v)
    redis.call('HSET', K_gvrun, g, v)
    redis.call('ZADD', K_gvt, 'XX', v, g)
  end
  if sample then
    for _, who in ipairs({g, ''}) do
      local est = tonumber(redis.call('HGET', K_gcost, who))
      local new = used * 1000
      if est then new = math.floor((3 * est + used * 1000) / 4) end
      redis.call('HSET', K_gcost, who, int_text(new))
    end
  end
  if used > 0 then
    busy_add(busy_key(g), used, now)
    busy_add(K_busy, used, now)
  end
end

-- Claim in time mode from g, the open group with the least virtual time vs: charge it the
-- estimated cost est of this job over its weight w, and raise the floor to vs.
local function time_charge(g, vs, jk, est, w)
  local charge = math.max(1, math.floor(est / w))
  local v = int_text(vs + charge)
  redis.call('ZADD', K_gvt, v, g)
  redis.call('HSET', K_gvrun, g, v)
  if vs > (tonumber(redis.call('HGET', K_gvrun, '')) or 0) then
    redis.call('HSET', K_gvrun, '', int_text(vs))
  end
  redis.call('HSET', jk, 'vcharge', int_text(charge))
end
