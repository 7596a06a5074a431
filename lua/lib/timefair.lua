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
--
-- Tenants (two levels, as CFS's group scheduling): `gvt` holds the groups without a tenant
-- and each open tenant's mark (TENANT_MARK .. t) at the tenant's virtual time,
-- gvrun[mark]; a tenant's zset (tgvt_key) holds its open groups at theirs, gvrun[g], with
-- the tenant's own floor, gvrun[mark .. t .. TENANT_MARK]. A claim takes the least of `gvt`
-- and, for a mark, the least of its tenant's zset: the group pays charge = est / its weight
-- within its tenant, the tenant charge * group weight / tenant weight (about est / tenant
-- weight, computed from the group's charge so the settlement finds the same figure without
-- a second field on the row) in `gvt`. A group without a tenant is its own tenant: it stands
-- in `gvt` itself, as before tenants existed.
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
-- (in a block: its helpers take no top-level local of the verbs near Lua's 200-local limit)
local time_settle, time_charge
do
-- Pay delta on member m (a group, or a tenant's mark) of zset z whose floor is gvrun[fl].
local function vpay(m, z, fl, delta)
  if delta == 0 then return end
  local own = tonumber(redis.call('HGET', K_gvrun, m)) or 0
  local v = own + delta
  if delta < 0 then
    -- A refund stops just past the floor: below it, the group would go ahead of every group
    -- that entered at the floor while its overestimated jobs ran, and its jobs too short to
    -- pay much would hold them off for thousands of claims. It never raises a group.
    local floor = tonumber(redis.call('HGET', K_gvrun, fl)) or 0
    v = math.max(v, math.min(own, floor + 1))
  end
  v = int_text(v)
  redis.call('HSET', K_gvrun, m, v)
  redis.call('ZADD', z, 'XX', v, m)
end

function time_settle(g, id, row_started, vcharge, now, sample)
  if not vcharge then return end
  local deadline = tonumber(redis.call('ZSCORE', K_active, id)) or now
  local used = math.max(0, math.min(now, deadline) - (tonumber(row_started) or now))
  -- read before the first write, as the module does: what cannot be read changes nothing
  local w = weight_of(g)
  local charged = tonumber(vcharge) or error('a job row\'s vcharge is not a number')
  local t = tenant_of(g)
  redis.call('HDEL', job_key(id), 'vcharge')
  local delta = math.max(1, math.floor(used * 1000 / w)) - charged
  if not t then
    vpay(g, K_gvt, '', delta)
  else
    local m = TENANT_MARK .. t
    vpay(g, tgvt_key(t), m .. TENANT_MARK, delta)
    local tw = tenant_weight(t)
    vpay(m, K_gvt, '', math.max(1, math.floor(used * 1000 / tw))
      - math.max(1, math.floor(charged * w / tw)))
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

-- Raise the floor gvrun[fl] to v.
local function vfloor(fl, v)
  if v > (tonumber(redis.call('HGET', K_gvrun, fl)) or 0) then
    redis.call('HSET', K_gvrun, fl, int_text(v))
  end
end

-- Claim in time mode from g, the open group with the least virtual time vs: charge it the
-- estimated cost est of this job over its weight w, and raise the floor to vs. t: its tenant
-- (false: none) whose mark stood first in `gvt` at tvs: the tenant pays too (see the top).
function time_charge(g, vs, jk, est, w, t, tvs)
  local charge = math.max(1, math.floor(est / w))
  local v = int_text(vs + charge)
  if t then
    local m = TENANT_MARK .. t
    redis.call('ZADD', tgvt_key(t), v, g)
    vfloor(m .. TENANT_MARK, vs)
    local tv = int_text(tvs + math.max(1, math.floor(charge * w / tenant_weight(t))))
    redis.call('ZADD', K_gvt, tv, m)
    redis.call('HSET', K_gvrun, m, tv)
    vfloor('', tvs)
  else
    redis.call('ZADD', K_gvt, v, g)
    vfloor('', vs)
  end
  redis.call('HSET', K_gvrun, g, v)
  redis.call('HSET', jk, 'vcharge', int_text(charge))
end
end
