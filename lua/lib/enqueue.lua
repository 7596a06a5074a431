-- enqueue: what an enqueue.lua call will write, checked before its first write.
-- Includes: keys, core, settings, history, types, jobrow (J_*)

local enqueue_books
do   -- the names it uses copied next to it, as lib/claim.lua explains
  local K_delayed, K_gactive, K_gbackoff, K_gpaused, K_gturn, K_gvrun, K_gvt =
    K_delayed, K_gactive, K_gbackoff, K_gpaused, K_gturn, K_gvrun, K_gvt
  local K_gwait, K_ring, K_wake = K_gwait, K_ring, K_wake
  local hist, int_ok, lane_key, limit_of, max_size_of, misfit, rate_of, starts_key =
    hist, int_ok, lane_key, limit_of, max_size_of, misfit, rate_of, starts_key
  local time_fair, type_of = time_fair, type_of
  local J_COUNTDOWN, J_GROUP = J_COUNTDOWN, J_GROUP
  local ipairs, tonumber, type = ipairs, tonumber, type

  -- Before the first write of enqueue.lua's call (ARGV: n, then 10 per job, J_*), what it
  -- will write. Returns refused, books, caps, warm: caps[i] the lane cap of job i when due
  -- now; warm[i] true when job i's lane already holds a job (it stays so for the call);
  -- refused[i] is true for job i (0-based) whose lane is
  -- not a zset, whose lane cap cannot be read, or, when its lane is empty (the job opens it),
  -- whose group's limit, jobs in flight (with a limit), rate or start times cannot be read
  -- (as group_seat reads them): such a job is refused with nothing written and the others go
  -- on. books is the error text naming a queue-wide key the call writes that is of the wrong
  -- type (then nothing is written at all); the keys the call only reads fail it by their read
  -- (a server's WRONGTYPE), before any write too. The keys opening a lane writes are checked
  -- only when a job opens one.
  function enqueue_books(n, now)
    local refused, caps, opening, later, warm = {}, {}, {}, false, {}
    local h = hist(now)
    for i = 0, n - 1 do
      local at = 2 + i * 10
      local g = ARGV[at + J_GROUP]
      if tonumber(ARGV[at + J_COUNTDOWN]) > 0 then
        later = true
      else
        local size = redis.pcall('ZCARD', lane_key(g))
        local cap = max_size_of(g)
        caps[i] = cap
        if type(size) == 'table' or (cap and not int_ok(cap)) then
          refused[i] = true
        elseif size == 0 then
          opening[#opening + 1] = i
        else
          warm[i] = true
        end
      end
    end
    -- the minute's history first, alone (most calls check no other key)
    local books = h and misfit(h[1], 'hash')
    if books then return refused, books, caps, warm end
    local keys = {}
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
    books = #keys > 0 and misfit(keys)
    if books then return refused, books, caps, warm end
    local seen = {}
    for _, i in ipairs(opening) do
      local g = ARGV[2 + i * 10 + J_GROUP]
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
        if ok then
          local m, _, long = rate_of(g)
          if long then
            ok = false
          elseif m then
            local t = type_of(starts_key(g))
            ok = t == 'none' or t == 'list'
          end
        end
        seen[g] = ok
      end
      if not seen[g] then refused[i] = true end
    end
    return refused, nil, caps, warm
  end
end

-- A job of group g names tenant t ('' or nil: none, the group is its own tenant): true when
-- g is t's (passing it to t when it is empty: nothing in its lane nor in flight), false when
-- it is another tenant's and busy (the job is refused, nothing written). full: the job will
-- be refused for its lane's cap of 0 (then the group stays whose it is).
local function tenant_claim(g, t, full)
  if t == '' then t = nil end
  local cur = redis.call('HGET', K_gtenant, g) or nil
  if cur == t then return true end
  local waiting = redis.pcall('ZCARD', lane_key(g))   -- a lane of the wrong type: busy
  if type(waiting) ~= 'number' or waiting > 0
    or (tonumber(redis.call('HGET', K_gactive, g) or '0') or 1) > 0 then
    return false
  end
  if full then return true end
  if t then
    redis.call('HSET', K_gtenant, g, t)
    redis.call('SADD', TEN.groups(t), g)
  else
    redis.call('HDEL', K_gtenant, g)
  end
  if cur then redis.call('SREM', TEN.groups(cur), g) end
  return true
end

-- A tenant's lane cap (TEN.max_of) over the call: TEN.full(t) says whether a job due now of
-- tenant t would pass it (its waiting jobs counted over its groups once per call, O(its
-- groups), only when it has a cap), TEN.took(t) counts a job written into one of its lanes.
do
  -- per run (a Functions library resets a `local NAME = nil` on every call: store/scripts.py)
  local TCOUNTS = nil
  function TEN.full(t)
    local cap = TEN.max_of(t)
    if not cap then return false end
    TCOUNTS = TCOUNTS or {}
    if not TCOUNTS[t] then
      local c = 0
      for _, g in ipairs(redis.call('SMEMBERS', TEN.groups(t))) do
        local n = redis.pcall('ZCARD', lane_key(g))
        if type(n) == 'number' then c = c + n end
      end
      TCOUNTS[t] = c
    end
    return TCOUNTS[t] >= cap
  end
  function TEN.took(t)
    if TCOUNTS and TCOUNTS[t] then TCOUNTS[t] = TCOUNTS[t] + 1 end
  end
end

-- A unique key of enqueue.lua ('<ms>:<key>' or 'd<ms>:<debounce>:<max>:<key>', checked):
-- unique_parts: its key, ms, and debounce and max ms (nil when not debounced).
-- unique_held: the id of the job holding it while that job is not finished (its row exists
-- with no `finished`), else nil (free, expired, or its holder ended: the key is taken over);
-- a debounced key's holder answers only while it may be debounced (delayed, never started,
-- debounced itself: then it takes job `at`'s payload and its due time moves), else nil (a
-- new job is made). unique_take: job id takes the key for its ms.
local unique_parts, unique_held, unique_take
do
  local unique_key, job_key, K_delayed = unique_key, job_key, K_delayed
  function unique_parts(u)
    local ms, deb, max, k = string.match(u, '^d(%d+):(%d+):(%d+):(.*)$')
    if ms then return k, ms, tonumber(deb), tonumber(max) end
    ms, k = string.match(u, '^(%d+):(.*)$')
    return k, ms
  end
  function unique_held(u, at, now)
    local key, ms, deb, max = unique_parts(u)
    local k = unique_key(key)
    if redis.call('TYPE', k)['ok'] ~= 'string' then return nil end
    local holder = redis.call('GET', k)
    local jk = job_key(holder)
    if redis.call('TYPE', jk)['ok'] ~= 'hash' then return nil end   -- (C: not a live row)
    local state, finished, attempts, first =
      unpack(redis.call('HMGET', jk, 'state', 'finished', 'attempts', 'dfirst'))
    if not state or finished then return nil end
    if not deb then return holder end
    if state ~= 'delayed' or attempts ~= '0' or not tonumber(first) then return nil end
    redis.call('HSET', jk, 'payload', ARGV[at + J_PAYLOAD])
    redis.call('ZADD', K_delayed, 'XX', math.min(now + deb, tonumber(first) + max), holder)
    redis.call('SET', k, holder, 'PX', ms)
    return holder
  end
  function unique_take(u, id)
    local k, ms = unique_parts(u)
    redis.call('SET', unique_key(k), id, 'PX', ms)
  end
end
