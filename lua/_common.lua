-- _common.lua: helpers shared by the verbs; the loader puts this file in front of each.
--
-- Before this file the loader declares the queue's fixed keys (emqtasks/keys.py FIXED):
--   K_ring (list)  K_active (zset)  K_gactive (hash)  K_glimit (hash)  K_gweight (hash)
--   K_gturn (hash) K_gpaused (set)  K_paused (string) K_delayed (zset) K_dead (zset)
--   K_wake (list)  K_guard (never written: declared so that while the queue's Redis Cluster
--   slot migrates every script is refused with TRYAGAIN, never run on a half-moved queue)
-- and BASE, the queue's hash-tagged prefix "emq:{q}:" cut from KEYS[1]. The keys a script
-- forms itself all carry the queue's tag, so one slot: job rows (BASE .. 'job:' .. id),
-- lanes (BASE .. 'g:' .. group .. ':pending'), a rate-limited group's recent start times
-- (BASE .. 'g:' .. group .. ':starts'), result notifications (BASE .. 'done:' .. id), and
-- the fairness controls' books below (K_grate ... K_gwait), a group's recent busy time
-- (BASE .. 'g:' .. group .. ':busy') and the time-fair mode's books (K_fairness ... K_busy),
-- and workflows' hashes (BASE .. 'wf:' .. id) and chord results (BASE .. 'chord:' .. id),
-- see workflows below.
--
-- Ring membership is derived, never searched. A group is "open" when its lane is non-empty,
-- it is not paused and it is under its limit; an open group is on the ring, or, while its
-- rate budget is spent or a task asked it to back off, in `gwait` (scored by when it may
-- start again; promote brings it back). Every verb that changes what openness depends on
-- notes where the group stood before and puts it where it belongs after, once.
--
-- Lane scores carry a job's priority: priority * PRIO_SPAN + time (ms), so a lane pops its
-- lowest priority first and, within a priority, its oldest job first. Priority 0 (the
-- default) scores exactly its time.

local PRIO_SPAN = 1e13   -- above any ms timestamp until the year 2286; |score| < 2^53

local K_grate = BASE .. 'grate'           -- hash: group -> "max:per_ms", its rate limit
local K_gmax = BASE .. 'gmax'             -- hash: group -> cap on its waiting jobs
local K_gdefaults = BASE .. 'gdefaults'   -- hash: limit | rate | max_size | weight -> default
local K_gbackoff = BASE .. 'gbackoff'     -- hash: group -> ms until which it sits out
local K_gwait = BASE .. 'gwait'           -- zset: open groups held back, score = ready time
-- The time-fair mode (see "Fair share of worker time" below):
local K_fairness = BASE .. 'fairness'     -- string: 'time' when time-fair; absent: turns
local K_gvt = BASE .. 'gvt'               -- zset: time mode's ring, score = virtual time (us)
local K_gvrun = BASE .. 'gvrun'           -- hash: group -> virtual time (us); '' -> the floor
local K_gcost = BASE .. 'gcost'           -- hash: group -> estimated job cost (us); '' queue's
local K_busy = BASE .. 'busy'             -- hash: 10 s slot -> busy ms of the whole queue
-- The queue's own marks (emqtasks/clock.py, stats()):
local K_clock = BASE .. 'clock'           -- hash: seen (latest server ms a reap saw), step, at
local K_tally = BASE .. 'tally'           -- hash: stale_acks (acks the fence refused)

local WAKE_CAP = 16
local DEFAULT_GROUP = 'default'   -- a job's group when it names none (keys.py)
local WAKE_TTL = 60

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The queue's clock mark: the latest server time (ms) a reap saw, raised to now, never
-- lowered; returns the mark before (nil for none: never set, or unreadable).
local function clock_mark(now)
  local seen = tonumber(redis.call('HGET', K_clock, 'seen'))
  if seen and not (seen > -1e15 and seen < 1e15) then seen = nil end
  if not seen or now > seen then redis.call('HSET', K_clock, 'seen', now) end
  return seen
end

-- One more of a queue counter (stats()).
local function tally(counter) redis.call('HINCRBY', K_tally, counter, 1) end

-- A full server (used memory over maxmemory, policy noeviction) refuses a script at its
-- first write of a command that may grow memory (HSET, ZADD...: flagged deny-oom) and lets
-- everything after a first write through, so that no script stops half-way. The verbs that
-- settle, free or move work (claim, ack, retry, release, extend, reap, promote) must run on
-- a full server: a worker that ran a job must be able to say so, and draining is how the
-- server gets room again. Each makes this its first write: a DEL, which cannot grow memory,
-- of the guard key, which is never written, so it changes and replicates nothing. Their
-- twins in the module carry no deny-oom flag; enqueue is refused at its first HSET, and so
-- is the module's (OOM_REFUSED in its C source).
local function runs_when_full() redis.call('DEL', K_guard) end

local function job_key(id) return BASE .. 'job:' .. id end
local function lane_key(g) return BASE .. 'g:' .. g .. ':pending' end
local function starts_key(g) return BASE .. 'g:' .. g .. ':starts' end
local function lane_score(prio, t) return (tonumber(prio) or 0) * PRIO_SPAN + t end
local function busy_key(g) return BASE .. 'g:' .. g .. ':busy' end
-- A key of the queue by its name after the base (repair deletes derived keys by name).
local function queue_key(name) return BASE .. name end
-- Integers as text, exactly (a bare number would go as %.14g).
local function int_text(v) return string.format('%d', v) end
-- Integer text as every writer stores counts, times and settings: '0', or an optional '-'
-- and 1 to 15 digits without a leading zero (exact in a double, and what the module reads
-- the same way). A row field or a book holding anything else is unreadable.
local find, byte = string.find, string.byte
local function int_ok(s)
  if not s or #s > 16 or not find(s, '^%-?[1-9]%d*$') then return s == '0' end
  return #s <= 15 or byte(s, 1) == 45   -- 16 characters: a '-' and 15 digits
end
-- The type of a key as TYPE names it ('none' when missing).
local function type_of(key) return redis.call('TYPE', key)['ok'] end

-- The queue's fairness mode, read once per script run (the fairness verb sets MODE itself).
local MODE = nil
local function time_fair()
  if MODE == nil then MODE = redis.call('GET', K_fairness) == 'time' end
  return MODE
end

-- The defaults for every group, read once per script run (a verb that changes them resets
-- DEFAULTS to nil).
local DEFAULTS = nil
local function default(name)
  if DEFAULTS == nil then
    local d = redis.call('HMGET', K_gdefaults, 'limit', 'rate', 'max_size', 'weight',
      'history', 'hgroups')
    DEFAULTS = {limit = d[1] or nil, rate = d[2] or nil, max_size = d[3] or nil,
                weight = d[4] or nil, history = d[5] or nil, hgroups = d[6] or nil}
  end
  return DEFAULTS[name]
end

-- A group's own setting, else the default for every group, else nil.
local function limit_of(g) return redis.call('HGET', K_glimit, g) or default('limit') end
local function max_size_of(g) return redis.call('HGET', K_gmax, g) or default('max_size') end
local function weight_of(g)
  return tonumber(redis.call('HGET', K_gweight, g) or default('weight') or '1')
end
-- (max_jobs, per_ms) or nil
local function rate_of(g)
  local r = redis.call('HGET', K_grate, g) or default('rate')
  if not r then return nil end
  local m, p = string.match(r, '^(%d+):(%d+)$')
  return tonumber(m), tonumber(p)
end

-- History (App.set_history): per-minute counters in one hash a minute, BASE .. 'h:' ..
-- <unix minute>, which expires after the retention (gdefaults 'history', hours, default 24;
-- 0 is off). Per task: w<i>:<task> the wait (start - due) histogram, so its sum is the
-- starts, and ws:<task> its sum (ms); r<i>:<task> the run (end - start) histogram of the
-- successes (its sum: the successes), rs:<task> its sum; rt:<task> retried, dd:<task>
-- dead. Per group, two packed fields: a:<g> = enqueued + started * 2^32, b:<g> = succeeded
-- + retried * 2^32 + dead * 2^48. At most `hgroups` (default 1000) groups a minute get
-- fields of each kind (na / nb count them); the rest are counted together in oa / ob.
-- Bucket i of HB, 16 the rest. Every write that creates a field (the minute's first of
-- each kind) sets the hash's expiry. Per job: 7 HINCRBY (1 at enqueue, 3 at the claim, 3
-- at the ack), on 2 fields per group: see README "History in the server".
local HB = {5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000,
  1800000}
local HIST = nil     -- {key, ttl seconds, group cap}, false when off; read once per run
local H_STARTED, H_RETRIED, H_DEAD = 4294967296, 4294967296, 281474976710656

local function hist(now)
  if HIST == nil then
    local hours = tonumber(default('history') or '24') or 24
    if hours <= 0 then
      HIST = false
    else
      HIST = {BASE .. 'h:' .. math.floor(now / 60000), math.floor(hours * 3600) + 60,
              tonumber(default('hgroups') or '1000') or 1000}
    end
  end
  return HIST
end

local function hbucket(ms)
  for i = 1, #HB do if ms <= HB[i] then return i end end
  return #HB + 1
end

-- A time in whole ms, 0 for what is not a sane one (a corrupted row's times).
local function hclamp(ms)
  ms = math.floor(ms)
  if ms >= 0 and ms < 1e15 then return ms end
  return 0
end

-- A task's counter + 1; one that was created sets the hash's expiry.
local function hcount(h, f)
  if redis.call('HINCRBY', h[1], f, 1) == 1 then redis.call('EXPIRE', h[1], h[2]) end
end

-- A group's packed field (kind 'a' or 'b') + by; a field that was created sets the expiry
-- and counts against the cap: past it, the overflow's field takes the count instead.
local function hgroup(h, kind, g, by)
  local f = kind .. ':' .. g
  if redis.call('HINCRBY', h[1], f, by) == by then
    redis.call('EXPIRE', h[1], h[2])
    if redis.call('HINCRBY', h[1], 'n' .. kind, 1) > h[3] then
      redis.call('HDEL', h[1], f)
      redis.call('HINCRBY', h[1], 'o' .. kind, by)
    end
  end
end

local function hist_enqueued(now, g)
  local h = hist(now)
  if h then hgroup(h, 'a', g, 1) end
end

-- A claim: the wait is the start time less the time the job became due (its lane score's).
local function hist_started(now, task, g, score)
  local h = hist(now)
  if not h then return end
  local wait = hclamp(now - (score - math.floor(score / PRIO_SPAN) * PRIO_SPAN))
  hcount(h, 'w' .. hbucket(wait) .. ':' .. task)
  redis.call('HINCRBY', h[1], 'ws:' .. task, wait)
  hgroup(h, 'a', g, H_STARTED)
end

-- A success, with its run time when the row knows its start.
local function hist_succeeded(now, task, g, started)
  local h = hist(now)
  if not h then return end
  local run = 0
  if started then run = hclamp(now - started) end
  hcount(h, 'r' .. hbucket(run) .. ':' .. task)
  redis.call('HINCRBY', h[1], 'rs:' .. task, run)
  hgroup(h, 'b', g, 1)
end

-- A failure: dead, or retried (a lease the reaper took back too).
local function hist_failed(now, task, g, dead)
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

-- A readiness token for a parked master; the list stays short whatever the traffic.
-- Token '1': work is claimable. Token 'd': `delayed` has a new earliest entry, so a parked
-- master re-reads when to promote instead of sleeping past it.
-- 'd' tokens may fill only half the list, so there is always room for a '1'.
local function wake(token)
  local cap = WAKE_CAP
  if token == 'd' then cap = WAKE_CAP / 2 end
  if redis.call('LLEN', K_wake) < cap then
    redis.call('RPUSH', K_wake, token or '1')
    -- Tokens are hints (the ring is the truth, and every master re-reads it each tick):
    -- one nobody took within a minute may go, so an idle queue keeps no stray key.
    redis.call('EXPIRE', K_wake, WAKE_TTL)
  end
end

-- Schedule an id in `delayed`; if it is now the earliest entry, tell the parked masters.
local function delay_push(id, due)
  redis.call('ZADD', K_delayed, due, id)
  if redis.call('ZRANGE', K_delayed, 0, 0)[1] == id then wake('d') end
end

-- A job reached an end (done, dead, cancelled): wake each client blocked in get() on it.
-- `waiters` on the row counts them; a client registers before it looks, so none is missed.
-- (A count that is not integer text, HINCRBY's, wakes none: the module reads it the same.)
local function notify(id, waiters)
  local n = 0
  if int_ok(waiters) then n = math.min(tonumber(waiters), 100) end
  if n > 0 then
    local key = BASE .. 'done:' .. id
    for _ = 1, n do redis.call('RPUSH', key, '1') end
    redis.call('EXPIRE', key, 60)
  end
end

local function under_limit(g)
  local lim = limit_of(g)
  if not lim then return true end
  return tonumber(redis.call('HGET', K_gactive, g) or '0') < tonumber(lim)
end

-- Open: the lane waits, the group is not paused and is under its limit.
local function open(g)
  return redis.call('ZCARD', lane_key(g)) > 0
    and redis.call('SISMEMBER', K_gpaused, g) == 0
    and under_limit(g)
end

-- When the group's rate budget allows its next start (ms), or nil when it does now: in any
-- window of per_ms at most max_jobs starts, exactly (the list holds its last max_jobs).
local function rate_ready(g, now)
  local m, per = rate_of(g)
  if not m then return nil end
  local oldest = tonumber(redis.call('LINDEX', starts_key(g), m - 1))
  if oldest and oldest + per > now then return oldest + per end
  return nil
end

-- When the group may start its next job (ms), or nil when it may now: its rate budget and
-- a back-off a task asked for (RateLimited).
local function ready_at(g, now)
  local at = rate_ready(g, now)
  local off = tonumber(redis.call('HGET', K_gbackoff, g))
  if off then
    if off <= now then redis.call('HDEL', K_gbackoff, g)
    elseif not at or off > at then at = off end
  end
  return at
end

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

local function vstart(g)
  local floor = tonumber(redis.call('HGET', K_gvrun, '')) or 0
  local own = tonumber(redis.call('HGET', K_gvrun, g))
  if own and own > floor then return own end
  return floor
end

local function ring_push(g)
  if time_fair() then
    local v = int_text(vstart(g))
    redis.call('ZADD', K_gvt, v, g)
    redis.call('HSET', K_gvrun, g, v)
  else
    redis.call('RPUSH', K_ring, g)
  end
end

-- How many groups are serviceable now (the ring of the queue's mode).
local function ring_size()
  if time_fair() then return redis.call('ZCARD', K_gvt) end
  return redis.call('LLEN', K_ring)
end

-- Whether any group is serviceable, in one command and without reading the mode (the other
-- mode's ring is always empty): what an idle master's promote asks once per tick.
local function ring_any()
  return redis.call('EXISTS', K_ring, K_gvt) > 0
end

local function ring_enter(g)
  ring_push(g)
  redis.call('HDEL', K_gturn, g)
  wake()
end

-- Hold an open group back until `at`; a new earliest return re-times the parked masters.
local function wait_push(g, at)
  redis.call('ZADD', K_gwait, at, g)
  if redis.call('ZRANGE', K_gwait, 0, 0)[1] == g then wake('d') end
end

-- An open group goes on the ring, or in gwait while it may not start yet.
local function admit(g, now)
  local at = ready_at(g, now)
  if at then wait_push(g, at) else ring_enter(g) end
end

-- from_tail: where the group is known to stand (just rotated to the tail, or still at the
-- head), so LREM finds it in one step; nil scans the whole ring (admin verbs only).
local function ring_leave(g, from_tail)
  if time_fair() then
    redis.call('ZREM', K_gvt, g)
  else
    local count = 0
    if from_tail == true then count = -1 elseif from_tail == false then count = 1 end
    redis.call('LREM', K_ring, count, g)
  end
  redis.call('HDEL', K_gturn, g)
end

-- Add an id to its lane (score from lane_score); a lane that just became non-empty opens.
local function lane_push(g, id, score, now)
  local lane = lane_key(g)
  redis.call('ZADD', lane, score, id)
  if redis.call('ZCARD', lane) == 1
    and redis.call('SISMEMBER', K_gpaused, g) == 0 and under_limit(g) then
    admit(g, now)
  end
end

-- One job of group g left flight: the books drop, and a group held back only by its
-- limit opens again.
local function active_drop(g, now)
  local act = redis.call('HINCRBY', K_gactive, g, -1)
  if act <= 0 then redis.call('HDEL', K_gactive, g) end
  local lim = limit_of(g)
  if lim and act + 1 >= tonumber(lim) and act < tonumber(lim)
    and redis.call('ZCARD', lane_key(g)) > 0
    and redis.call('SISMEMBER', K_gpaused, g) == 0 then
    admit(g, now)
  end
end

-- Where an open group stands: 'wait', 'ring', or nil when it is not open. Read it before a
-- change to what openness depends on, then call settle().
local function placed(g)
  if redis.call('ZSCORE', K_gwait, g) then return 'wait' end
  if open(g) then return 'ring' end
  return nil
end

-- Put g where it belongs now, given where it stood (placed() before the change). Leaving
-- the ring here scans it (admin verbs and back-offs only, never a claim).
local function settle(g, was, now)
  local want, at = nil, nil
  if open(g) then
    at = ready_at(g, now)
    if at then want = 'wait' else want = 'ring' end
  end
  if was == want then
    if want == 'wait' then redis.call('ZADD', K_gwait, at, g) end
    return
  end
  if was == 'ring' then ring_leave(g, nil) elseif was == 'wait' then redis.call('ZREM', K_gwait, g) end
  if want == 'ring' then ring_enter(g) elseif want == 'wait' then wait_push(g, at) end
end

-- The fence: the row is active and the caller holds the current attempts and nonce.
-- Returns {state, attempts, nonce, group, max, ttl, waiters, started, vcharge, wf, next,
-- slot, task}, or nil when stale (wf, next and slot are a workflow step's, below: nil for a
-- plain job).
local function fenced(id, attempts, nonce)
  local row = redis.call('HMGET', job_key(id), 'state', 'attempts', 'nonce', 'group', 'max', 'ttl',
    'waiters', 'started', 'vcharge', 'wf', 'next', 'slot', 'task')
  if row[1] ~= 'active' or row[2] ~= attempts or row[3] ~= nonce then return nil end
  return row
end

-- Rotate the ring for a claim of g (the head), of weight w. A weighted group keeps the head
-- for `w` consecutive claims (deficit round robin). Returns true if g moved to the tail.
local function ring_turn(g, w)
  if w > 1 and redis.call('HINCRBY', K_gturn, g, 1) < w then return false end
  if w > 1 then redis.call('HDEL', K_gturn, g) end
  redis.call('LMOVE', K_ring, K_ring, 'LEFT', 'RIGHT')
  return true
end

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

-- ---- workflows (emqtasks/canvas.py, lua/workflow.lua) -------------------------------------
-- A workflow's steps are ordinary job rows carrying `wf` (the workflow's id). A step that
-- waits for a parent has state 'waiting' and sits in no structure: no lane, no `delayed`.
-- A parent's row names its children in `next` (space-separated ids) and, when the child is
-- a chord's callback, its `slot` in the child's results. A waiting row holds: `par` (its
-- parents), `imm` '1' (immutable: ignores their results), `splice` (the byte offset in its
-- payload where the parent's result goes, right after the envelope's `"a":[`), `comma` '1'
-- (its own arguments follow), `cd` (a countdown, ms, counted from its release), and for a
-- chord's callback `npend` (members not yet done) and `nslots`. The members' results wait
-- in BASE .. 'chord:' .. callback_id (hash: slot -> result JSON), once each (HSETNX), and
-- the workflow's own hash is BASE .. 'wf:' .. wf_id (`waiting`: the ids a failure cancels,
-- `lerr`: the link_error step, `failed`: the step that went dead first).
local function wf_key(wf) return BASE .. 'wf:' .. wf end
local function chord_key(id) return BASE .. 'chord:' .. id end

-- A waiting step goes to its lane (or `delayed` for a countdown), with `arg` (JSON text, or
-- nil) spliced in as its first argument.
local function wf_release(id, arg, now)
  local jk = job_key(id)
  local r = redis.call('HMGET', jk, 'group', 'prio', 'splice', 'comma', 'cd', 'payload')
  if arg then
    local off = tonumber(r[3])
    local sep = ''
    if r[4] == '1' then sep = ',' end
    redis.call('HSET', jk, 'payload', string.sub(r[6], 1, off) .. arg .. sep .. string.sub(r[6], off + 1))
  end
  local cd = tonumber(r[5] or '0') or 0
  if cd > 0 then
    redis.call('HSET', jk, 'state', 'delayed')
    delay_push(id, now + cd)
  else
    redis.call('HSET', jk, 'state', 'pending')
    lane_push(r[1], id, lane_score(r[2], now), now)
  end
end

-- The collected results of a chord, in slot order, as one JSON array.
local function wf_gather(rk, n)
  local parts = {}
  for s = 0, n - 1, 1000 do
    local fields = {}
    for i = s, math.min(n, s + 1000) - 1 do fields[#fields + 1] = string.format('%d', i) end
    for _, v in ipairs(redis.call('HMGET', rk, unpack(fields))) do parts[#parts + 1] = v or 'null' end
  end
  return '[' .. table.concat(parts, ',') .. ']'
end

-- A step finished with `result`: each waiting child it names is released (a chord's
-- callback once its last member is in), in the same call as the ack.
local function wf_handover(nxt, slot, result, now)
  for c in string.gmatch(nxt, '%S+') do
    local ck = job_key(c)
    local cr = redis.call('HMGET', ck, 'state', 'npend', 'imm', 'nslots')
    if cr[1] == 'waiting' then
      local arg = result
      if cr[3] == '1' then arg = nil end
      if not cr[2] then
        wf_release(c, arg, now)
      elseif slot then
        local rk = chord_key(c)
        if redis.call('HSETNX', rk, slot, result) == 1
          and redis.call('HINCRBY', ck, 'npend', -1) <= 0 then
          if arg then arg = wf_gather(rk, tonumber(cr[4])) end
          redis.call('DEL', rk)
          wf_release(c, arg, now)
        end
      end
    end
  end
end

-- A step still waiting in a workflow that failed at step `id` is cancelled.
local function wf_cancel_waiting(c, id, now)
  local ck = job_key(c)
  local cr = redis.call('HMGET', ck, 'state', 'waiters', 'ttl')
  if cr[1] == 'waiting' then
    redis.call('HSET', ck, 'state', 'cancelled', 'error', 'workflow failed at step ' .. id,
      'finished', now)
    redis.call('DEL', chord_key(c))
    notify(c, cr[2])
    local ttl = tonumber(cr[3] or '0') or 0
    if ttl > 0 then redis.call('EXPIRE', ck, ttl) else redis.call('DEL', ck) end
  end
end

-- Withdraw a job that is not running and mark it cancelled (cancel.lua, wf_cancel). row:
-- its {state, group, ttl, waiters}; state pending (it leaves its lane; an emptied lane
-- leaves the ring), delayed, dead or waiting. A chord callback's results hash goes; the row
-- expires after its ttl.
local function cancel_job(id, row, now)
  local jk = job_key(id)
  local state, g = row[1], row[2]
  if state == 'pending' then
    local was = placed(g)
    redis.call('ZREM', lane_key(g), id)
    settle(g, was, now)
  elseif state == 'delayed' then
    redis.call('ZREM', K_delayed, id)
  elseif state == 'dead' then
    redis.call('ZREM', K_dead, id)
  end
  redis.call('DEL', chord_key(id))
  redis.call('HSET', jk, 'state', 'cancelled', 'finished', now)
  redis.call('HDEL', jk, 'payload')
  notify(id, row[4])
  local ttl = tonumber(row[3] or '0')
  if ttl > 0 then redis.call('EXPIRE', jk, ttl) else redis.call('DEL', jk) end
end

-- Cancel every step of workflow `wf` that has not started (waiting, pending, delayed: as
-- cancel_job), its link_error step unreleased, and mark it cancelled; returns how many.
-- Admin verbs only (wfcancel.lua, cancel.lua): no native twin.
local function wf_cancel(wf, now)
  local wk = wf_key(wf)
  local w = redis.call('HMGET', wk, 'steps', 'lerr')
  if not w[1] then return 0 end
  redis.call('HSET', wk, 'state', 'cancelled')
  local n = 0
  local ids = w[1]
  if w[2] then ids = ids .. ' ' .. w[2] end
  for id in string.gmatch(ids, '%S+') do
    local row = redis.call('HMGET', job_key(id), 'state', 'group', 'ttl', 'waiters')
    if row[1] == 'pending' or row[1] == 'delayed' or row[1] == 'waiting' then
      cancel_job(id, row, now)
      n = n + 1
    end
  end
  return n
end

-- Step `id` of workflow `wf` went dead (or was found lost): the first such call fails the
-- workflow, cancels every step still waiting and releases the link_error step, once.
local function wf_fail(wf, id, now)
  local wk = wf_key(wf)
  if redis.call('HSETNX', wk, 'failed', id) == 0 then return end
  redis.call('HSET', wk, 'state', 'failed')
  local w = redis.call('HMGET', wk, 'waiting', 'lerr')
  for c in string.gmatch(w[1] or '', '%S+') do wf_cancel_waiting(c, id, now) end
  if w[2] then
    local lr = redis.call('HMGET', job_key(w[2]), 'state', 'imm')
    if lr[1] == 'waiting' then
      local arg = '"' .. id .. '"'
      if lr[2] == '1' then arg = nil end
      wf_release(w[2], arg, now)
      -- released: it lives as a job now, no longer with its workflow's hash
      redis.call('PERSIST', job_key(w[2]))
    end
  end
end

-- ---- claim --------------------------------------------------------------------------------
-- The claim and enqueue sections run in a block, with the names they use copied next to the
-- closures that use them: every run of a script makes every closure of this file, and a
-- closure captures a local by walking down the open ones, so capturing the prelude's far
-- locals from here made each run of every verb several microseconds slower.
local claim_one, enqueue_books, group_seat, bury, group_books, int_fault, lane_in, misfit_of
do
  local DEFAULT_COST, K_active, K_dead, K_delayed, K_gactive, K_gbackoff, K_gcost =
    DEFAULT_COST, K_active, K_dead, K_delayed, K_gactive, K_gbackoff, K_gcost
  local K_gpaused, K_grate, K_gturn, K_gvrun, K_gvt, K_gwait, K_gweight, K_ring, K_wake =
    K_gpaused, K_grate, K_gturn, K_gvrun, K_gvt, K_gwait, K_gweight, K_ring, K_wake
  local default, hist, hist_failed, hist_started, int_ok, job_key, lane_key, limit_of =
    default, hist, hist_failed, hist_started, int_ok, job_key, lane_key, limit_of
  local max_size_of, notify, rate_ready, ring_leave, ring_size, ring_turn, starts_key =
    max_size_of, notify, rate_ready, ring_leave, ring_size, ring_turn, starts_key
  local time_charge, time_fair, type_of, wait_push, wake, wf_fail, lane_push =
    time_charge, time_fair, type_of, wait_push, wake, wf_fail, lane_push
  local ipairs, tonumber, type = ipairs, tonumber, type
  -- A claim meets what it cannot read without failing the queue: a job row it cannot read goes
  -- to `dead` with the reason (bury), a group whose books it cannot read leaves the ring
  -- (group_seat), and only a queue-wide key of the wrong type fails the call, before its first
  -- write (claim_books). Every check reads before the claim writes anything, so a refused call
  -- changes nothing and no job is ever left out of every structure.

  -- The error text naming a key of the wrong type (the module's is the same).
  local function wrong_type(key, want)
    return 'WRONGTYPE emq: ' .. key .. ' holds a ' .. type_of(key) .. ', not a ' .. want
  end

  -- The first of keys ({key, type}...) that is neither missing nor of its type, as
  -- wrong_type's text; nil when all fit.
  local function misfit(keys)
    for _, kw in ipairs(keys) do
      local t = type_of(kw[1])
      if t ~= 'none' and t ~= kw[2] then return wrong_type(kw[1], kw[2]) end
    end
    return nil
  end

  misfit_of = misfit

  -- Once per call, before the first write: the queue-wide keys a claim may write half-way
  -- through a lease (`gturn`, this minute's history, in time mode `gvrun`). Returns false,
  -- or the error text naming the key of the wrong type. (`active` and `dead`, written right
  -- after the pop, are checked by that write: claim_one puts the job back on a refusal.)
  local BOOKS = nil
  local function claim_books(now)
    if BOOKS ~= nil then return BOOKS end
    local keys = {{K_gturn, 'hash'}}
    local h = hist(now)
    if h then keys[#keys + 1] = {h[1], 'hash'} end
    if time_fair() then keys[#keys + 1] = {K_gvrun, 'hash'} end
    BOOKS = misfit(keys) or false
    return BOOKS
  end

  -- What a claim of g reads of its group's books, each checked before the claim writes:
  -- {act, lim, w, m, per, est}, or nil when one is unreadable (its jobs in flight, limit or
  -- turn count not an integer, its weight not an integer >= 1, its rate's numbers over 15
  -- digits, a rated group's start times, `gwait` or `wake` of the wrong type, in time mode
  -- its cost estimate not an integer). A group with unreadable books leaves the ring: it
  -- costs that group, not the queue (emqtasks check names the key).
  function group_seat(g, tf)
    local act = redis.call('HGET', K_gactive, g)
    if act and not int_ok(act) then return nil end
    local lim = limit_of(g)
    if lim and not int_ok(lim) then return nil end
    local w = redis.call('HGET', K_gweight, g) or default('weight')
    if w and not (int_ok(w) and tonumber(w) >= 1) then return nil end
    local seat = {act = tonumber(act or '0'), lim = tonumber(lim), w = tonumber(w or '1')}
    local rate = redis.call('HGET', K_grate, g) or default('rate')
    local m, per = nil, nil
    if rate then m, per = string.match(rate, '^(%d+):(%d+)$') end
    if m then
      if #m > 15 or #per > 15 then return nil end
      for _, kw in ipairs({{starts_key(g), 'list'}, {K_gwait, 'zset'}, {K_wake, 'list'}}) do
        local t = type_of(kw[1])
        if t ~= 'none' and t ~= kw[2] then return nil end
      end
      seat.m, seat.per = tonumber(m), tonumber(per)
    end
    if tf then
      local est = redis.call('HGET', K_gcost, g) or redis.call('HGET', K_gcost, '')
      if est and not int_ok(est) then return nil end
      seat.est = tonumber(est or DEFAULT_COST)
    elseif seat.w > 1 then
      local turn = redis.call('HGET', K_gturn, g)
      if turn and not int_ok(turn) then return nil end
    end
    return seat
  end

  -- Why a row's field v (a count or a time every verb of the job's life reads as an integer)
  -- cannot be read, or nil.
  function int_fault(v, name, required)
    if not v then
      if required then return 'no ' .. name end
    elseif not int_ok(v) then
      return name .. ' is not an integer'
    end
    return nil
  end

  -- Why a row popped from g's lane cannot be leased (what its later verbs could not read
  -- either), or nil. row: HMGET task payload lease state attempts fence group max ttl delay
  -- created (check.py ROW_INTS says the same).
  local function row_fault(row, g)
    if not row[7] then return 'no group' end
    if row[7] ~= g then return 'its group is not the lane it was in' end
    return int_fault(row[5], 'attempts', true) or int_fault(row[3], 'lease', true)
      or int_fault(row[6], 'fence') or int_fault(row[8], 'max', true)
      or int_fault(row[9], 'ttl') or int_fault(row[10], 'delay')
      or int_fault(row[11], 'created', true)
  end

  -- A job popped from g's lane whose row cannot be read goes to `dead` with the reason; a
  -- key of another type than a hash (keytype: its TYPE) is replaced by a dead row (a hash
  -- was never there to keep). A row that lost its group gets the lane's, so a requeue brings
  -- it back there (repair buries rows outside lanes too: g may be nil).
  -- (text: the whole error to leave on the row, for a job buried for its lane, see
  -- group_books.)
  function bury(id, g, reason, now, keytype, text)
    local jk = job_key(id)
    if type(redis.pcall('ZADD', K_dead, now, id)) == 'table' then
      return wrong_type(K_dead, 'zset')   -- nothing written: the caller puts the job back
    end
    if keytype then
      redis.call('DEL', jk)
      reason = 'the key holds a ' .. keytype .. ', not a hash'
    end
    redis.call('HSET', jk, 'state', 'dead', 'error', text or ('unreadable job row: ' .. reason),
      'finished', now)
    local r = redis.call('HMGET', jk, 'group', 'task', 'waiters', 'wf')
    if g and not r[1] then redis.call('HSET', jk, 'group', g) end
    if g then hist_failed(now, r[2] or '', g, true) end
    notify(id, r[3])
    if r[4] then wf_fail(r[4], id, now) end
    return nil
  end

  -- The verbs that move a job in or out of its group's books (ack, retry, release, reap,
  -- promote, requeue) read them with this before their first write, as a claim does with
  -- group_seat: what cannot be read costs that group, not the job and not the queue.
  -- leaving: the job leaves flight (its group's jobs in flight drop, and a group at its limit
  -- reopens); lane: it goes into g's lane (the group may open); vcharge: its row's charge
  -- (time mode: time_settle reads it and the group's weight). Returns nil when the books can
  -- be read; the reason as text when g's lane is of the wrong type (the job goes to `dead`
  -- with it, never into the lane); true when other books cannot (jobs in flight or limit not
  -- an integer, or, when the group may open, what a claim of it reads (group_seat) or the
  -- keys an opening writes): then the job is settled without them, they stay as they are,
  -- a claim takes the group out of the ring and emqtasks check names the key.
  function group_books(g, leaving, lane, vcharge)
    local lk = lane_key(g)
    if lane then
      local t = type_of(lk)
      if t ~= 'none' and t ~= 'zset' then
        return 'its group\'s lane (g:' .. g .. ':pending) holds a ' .. t .. ', not a zset'
      end
    end
    local act = redis.call('HGET', K_gactive, g)
    if act and not int_ok(act) then return true end
    local lim = limit_of(g)
    if lim and not int_ok(lim) then return true end
    if vcharge then
      local w = redis.call('HGET', K_gweight, g) or default('weight')
      if not int_ok(vcharge) or (w and not (int_ok(w) and tonumber(w) >= 1)) then
        return true
      end
    end
    local opens = lane
    if leaving and lim and not lane then
      local a, l = tonumber(act or '0'), tonumber(lim)
      if a >= l and a - 1 < l then                  -- active_drop reopens it
        local t = type_of(lk)
        if t ~= 'none' and t ~= 'zset' then return true end
        opens = true
      end
    end
    if opens then
      local tf = time_fair()
      if not group_seat(g, tf) then return true end
      -- (ring_enter clears the turn count in either mode)
      local keys = {{K_ring, 'list'}, {K_gturn, 'hash'}}
      if tf then keys[1], keys[6] = {K_gvt, 'zset'}, {K_gvrun, 'hash'} end
      keys[3], keys[4], keys[5] = {K_gwait, 'zset'}, {K_wake, 'list'}, {K_gpaused, 'set'}
      if misfit(keys) then return true end
    end
    return nil
  end

  -- A job into g's lane: opening the group as lane_push does, or, when its books cannot be
  -- read (group_books returned true), only into the lane, the group left as it stands.
  function lane_in(g, id, score, now, books)
    if books then redis.call('ZADD', lane_key(g), score, id) else lane_push(g, id, score, now) end
  end

  -- A wake at the end of a claim that skipped its fill: a hint, left out when `wake` is of
  -- the wrong type (the next tick's promote finds the work anyway).
  local function wake_soft()
    local t = type_of(K_wake)
    if t == 'none' or t == 'list' then wake() end
  end

  -- Claim one job: turn the ring one step (in time mode: take the group of least virtual time
  -- and charge it, time_charge), pop the head of that lane, lease it.
  -- Returns {id, task, payload, attempts, nonce, group, lease_ms, more, fence}, or nil when
  -- nothing is serviceable, or nil and an error text when a queue-wide key a claim writes is
  -- of the wrong type (claim_books: nothing was written). Ghosts (ids whose row is gone),
  -- stale ring entries, groups whose books cannot be read (group_seat) and rows that cannot be
  -- read (bury) are skipped, at most 64 of them per call; past that a wake is pushed so a
  -- worker comes back for the rest.
  function claim_one(nonce, now)
    local tf = time_fair()
    for _ = 1, 64 do
      local g, vs
      if tf then
        local h = redis.call('ZRANGE', K_gvt, 0, 0, 'WITHSCORES')
        g, vs = h[1], tonumber(h[2])
      else
        g = redis.call('LINDEX', K_ring, 0)
      end
      if not g then return nil end
      local books = claim_books(now)
      if books then return nil, books end
      local seat = group_seat(g, tf)
      local lane = lane_key(g)
      local popped = seat and redis.pcall('ZPOPMIN', lane)
      if not seat or popped.err or #popped == 0 then
        ring_leave(g, false)
      else
        local id = popped[1]
        local jk = job_key(id)
        local row = redis.pcall('HMGET', jk, 'task', 'payload', 'lease', 'state', 'attempts',
          'fence', 'group', 'max', 'ttl', 'delay', 'created')
        local fault, refused = nil, nil
        if row.err then
          refused = bury(id, g, nil, now, type_of(jk))
        elseif row[4] then
          fault = row_fault(row, g)
          if fault then refused = bury(id, g, fault, now) end
        end
        -- `active` first, by the write itself: a lease it refuses is no lease
        if not (row.err or fault or not row[4])
          and type(redis.pcall('ZADD', K_active, now + tonumber(row[3]), id)) == 'table' then
          refused = wrong_type(K_active, 'zset')
        end
        if refused then
          -- `dead` or `active` of the wrong type: the job goes back, the call changed nothing
          redis.call('ZADD', lane, popped[2], id)
          return nil, refused
        end
        if row.err or not row[4] or fault then
          -- a ghost (its row is gone) or a buried row: look again
          if redis.call('ZCARD', lane) == 0 then ring_leave(g, false) end
        else
          local rotated = true
          if tf then time_charge(g, vs, jk, seat.est, seat.w) else rotated = ring_turn(g, seat.w) end
          local att = tonumber(row[5]) + 1
          local lease = tonumber(row[3])
          -- fence: grows with every claim of the row, never rolled back (attempts is: by a
          -- release, or a requeue of a dead job), so a task can guard writes elsewhere with it.
          local fence = tonumber(row[6] or '0') + 1
          redis.call('HSET', jk, 'state', 'active', 'attempts', att, 'nonce', nonce, 'started', now,
            'fence', fence)
          local act = redis.call('HINCRBY', K_gactive, g, 1)
          if seat.m then
            local starts = starts_key(g)
            redis.call('LPUSH', starts, now)
            redis.call('LTRIM', starts, 0, seat.m - 1)
            redis.call('PEXPIRE', starts, seat.per)
          end
          -- more: 1 when other work is serviceable right now, so the claimant's master
          -- wakes another child (or another master) only when there is something to take.
          local more = 1
          local closed = (seat.lim and act >= seat.lim) or redis.call('ZCARD', lane) == 0
          local at = nil
          if seat.m and not closed then at = rate_ready(g, now) end
          if closed or at then
            ring_leave(g, rotated)
            if at then wait_push(g, at) end
            if ring_size() == 0 then more = 0 end
          end
          -- last: a history counter that cannot be counted fails the call with the books whole
          hist_started(now, row[1] or '', g, tonumber(popped[2]))
          return {id, row[1], row[2], att, nonce, g, lease, more, fence}
        end
      end
    end
    wake_soft()
    return nil
  end

  -- ---- enqueue ------------------------------------------------------------------------------
  -- Before the first write of enqueue.lua's call (ARGV: n, then 10 fields per job), what it
  -- will write. Returns refused, books, caps: caps[i] the lane cap of job i when due now;
  -- refused[i] is true for job i (0-based) whose lane is
  -- not a zset, whose lane cap cannot be read, or, when its lane is empty (the job opens it),
  -- whose group's limit, jobs in flight (with a limit), rate or start times cannot be read
  -- (as group_seat reads them): such a job is refused with nothing written and the others go
  -- on. books is the error text naming a queue-wide key the call writes that is of the wrong
  -- type (then nothing is written at all); the keys the call only reads fail it by their read
  -- (a server's WRONGTYPE), before any write too. The keys opening a lane writes are checked
  -- only when a job opens one.
  function enqueue_books(n, now)
    local refused, caps, opening, keys, later = {}, {}, {}, {}, false
    local h = hist(now)
    if h then keys[#keys + 1] = {h[1], 'hash'} end
    for i = 0, n - 1 do
      local o = 1 + i * 10
      local g = ARGV[o + 4]
      if tonumber(ARGV[o + 9]) > 0 then
        later = true
      else
        local size = redis.pcall('ZCARD', lane_key(g))
        local cap = max_size_of(g)
        caps[i] = cap
        if type(size) == 'table' or (cap and not int_ok(cap)) then
          refused[i] = true
        elseif size == 0 then
          opening[#opening + 1] = i
        end
      end
    end
    if later then
      keys[#keys + 1] = {K_delayed, 'zset'}
      keys[#keys + 1] = {K_wake, 'list'}
    end
    if #opening > 0 then
      if time_fair() then
        keys[#keys + 1] = {K_gvt, 'zset'}
        keys[#keys + 1] = {K_gvrun, 'hash'}
      else
        keys[#keys + 1] = {K_ring, 'list'}
      end
      for _, k in ipairs({{K_gturn, 'hash'}, {K_gwait, 'zset'}, {K_wake, 'list'}}) do
        keys[#keys + 1] = k
      end
    end
    local books = misfit(keys)
    if books then return refused, books, caps end
    local seen = {}
    for _, i in ipairs(opening) do
      local g = ARGV[1 + i * 10 + 4]
      if seen[g] == nil then
        redis.call('SISMEMBER', K_gpaused, g)
        redis.call('HGET', K_gbackoff, g)
        local ok = true
        local lim = limit_of(g)
        if lim and not int_ok(lim) then ok = false end
        if ok and lim then
          local act = redis.call('HGET', K_gactive, g)
          if act and not int_ok(act) then ok = false end
        end
        local rate = ok and (redis.call('HGET', K_grate, g) or default('rate'))
        local m, per = nil, nil
        if rate then m, per = string.match(rate, '^(%d+):(%d+)$') end
        if m and (#m > 15 or #per > 15) then ok = false end
        if ok and m then
          local t = type_of(starts_key(g))
          ok = t == 'none' or t == 'list'
        end
        seen[g] = ok
      end
      if not seen[g] then refused[i] = true end
    end
    return refused, nil, caps
  end
end
