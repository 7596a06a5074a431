-- history: the per-minute counters of App.set_history (README "History in the server").
-- Includes: keys, settings

-- History (App.set_history): per-minute counters in one hash a minute, BASE .. 'h:' ..
-- <unix minute>, which expires after the retention (gdefaults 'history', hours, default 24;
-- 0 is off). Per task: w<i>:<task> the wait (start - due) histogram, so its sum is the
-- starts, and ws:<task> its sum (ms); r<i>:<task> the run (end - start) histogram of the
-- successes (its sum: the successes), rs:<task> its sum; rt:<task> retried, dd:<task>
-- dead. Per group, two packed fields: a:<g> = enqueued + started * 2^32, b:<g> = succeeded
-- + retried * 2^32 + dead * 2^48. At most `hgroups` (default 1000) groups a minute get
-- fields of each kind (na / nb count them); the rest are counted together in oa / ob.
-- Per tenant (a group's, when it names one): tn:<t> its starts, tw<i>:<t> its wait
-- histogram; at most `hgroups` tenants a minute (nt counts them), the rest in otn.
-- Bucket i of HB, 16 the rest. Every write that creates a field (the minute's first of
-- each kind) sets the hash's expiry. Per job: 7 HINCRBY (1 at enqueue, 3 at the claim, 3
-- at the ack), on 2 fields per group: see README "History in the server".
local hist, hist_enqueued, hist_started, hist_succeeded, hist_failed
do   -- in a block: a script has 200 local slots for every file it includes
  local HB = {5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000,
    1800000}
  -- {key, ttl seconds, group cap, written}, false when off; read once per run. written: true
  -- once this run's HINCRBY of it went through (it is a hash: a claim after the ack of the
  -- same call need not ask its TYPE, claim_books in lib/claim.lua)
  local HIST = nil
  local H_STARTED, H_RETRIED, H_DEAD = 4294967296, 4294967296, 281474976710656
  -- The numbers a write sends, as text: a Lua number in redis.call's arguments is formatted
  -- by the server with %.17g (glibc's float printing, a few % of an enqueue's server CPU),
  -- text goes as it is; the same digits either way. HBT[i]: bucket i's name.
  local HBT = {'1', '2', '3', '4', '5', '6', '7', '8', '9', '10', '11', '12', '13', '14', '15',
    '16'}
  local BY_TEXT = {[1] = '1', [H_STARTED] = '4294967296', [H_DEAD] = '281474976710656'}
  local format = string.format

  function hist(now)
    if HIST == nil then
      local hours = tonumber(default('history') or '24') or 24
      if hours <= 0 then
        HIST = false
      else
        HIST = {BASE .. 'h:' .. format('%d', math.floor(now / 60000)),
                math.floor(hours * 3600) + 60,
                tonumber(default('hgroups') or '1000') or 1000}
      end
    end
    return HIST
  end

  -- the name of the bucket of ms ('1' ... '16')
  local function hbucket(ms)
    for i = 1, #HB do if ms <= HB[i] then return HBT[i] end end
    return HBT[#HB + 1]
  end

  -- A time in whole ms, 0 for what is not a sane one (a corrupted row's times).
  local function hclamp(ms)
    ms = math.floor(ms)
    if ms >= 0 and ms < 1e15 then return ms end
    return 0
  end

  -- A task's counter + 1; one that was created sets the hash's expiry.
  local function hcount(h, f)
    if redis.call('HINCRBY', h[1], f, '1') == 1 then redis.call('EXPIRE', h[1], h[2]) end
  end

  -- A group's packed field (kind 'a' or 'b') + by; a field that was created sets the expiry
  -- and counts against the cap: past it, the overflow's field takes the count instead.
  local function hgroup(h, kind, g, by)
    local f = kind .. ':' .. g
    local byt = BY_TEXT[by]
    local n = redis.call('HINCRBY', h[1], f, byt)
    h[4] = true
    if n == by then
      redis.call('EXPIRE', h[1], h[2])
      if redis.call('HINCRBY', h[1], 'n' .. kind, '1') > h[3] then
        redis.call('HDEL', h[1], f)
        redis.call('HINCRBY', h[1], 'o' .. kind, byt)
      end
    end
  end

  -- A start of tenant t's, wait bucket i: tn:<t> + 1, created against the cap (nt) as a
  -- group's field is; a tenant past it counts in otn, with no histogram that minute.
  local function htenant(h, t, i)
    local f = 'tn:' .. t
    if redis.call('HINCRBY', h[1], f, '1') == 1 then
      redis.call('EXPIRE', h[1], h[2])
      if redis.call('HINCRBY', h[1], 'nt', '1') > h[3] then
        redis.call('HDEL', h[1], f)
        redis.call('HINCRBY', h[1], 'otn', '1')
        return
      end
    end
    redis.call('HINCRBY', h[1], 'tw' .. i .. ':' .. t, '1')
  end

  function hist_enqueued(now, g)
    local h = hist(now)
    if h then hgroup(h, 'a', g, 1) end
  end

  -- A claim: the wait is the start time less the time the job became due (its lane score's).
  -- t: the group's tenant (false or nil: none).
  function hist_started(now, task, g, score, t)
    local h = hist(now)
    if not h then return end
    local wait = hclamp(now - (score - math.floor(score / PRIO_SPAN) * PRIO_SPAN))
    local i = hbucket(wait)
    hcount(h, 'w' .. i .. ':' .. task)
    redis.call('HINCRBY', h[1], 'ws:' .. task, format('%d', wait))
    hgroup(h, 'a', g, H_STARTED)
    if t then htenant(h, t, i) end
  end

  -- A success, with its run time when the row knows its start.
  function hist_succeeded(now, task, g, started)
    local h = hist(now)
    if not h then return end
    local run = 0
    if started then run = hclamp(now - started) end
    hcount(h, 'r' .. hbucket(run) .. ':' .. task)
    redis.call('HINCRBY', h[1], 'rs:' .. task, format('%d', run))
    hgroup(h, 'b', g, 1)
  end

  -- A failure: dead, or retried (a lease the reaper took back too).
  function hist_failed(now, task, g, dead)
    local h = hist(now)
    if not h then return end
    if dead then
      hcount(h, 'dd:' .. task)
      hgroup(h, 'b', g, H_DEAD)
    else
      hcount(h, 'rt:' .. task)
      hgroup(h, 'b', g, H_RETRIED)
    end
  end
end
