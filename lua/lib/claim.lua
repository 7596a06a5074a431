-- claim: lease the next job of the ring (claim_one).
-- Includes: keys, core, settings, history, wake, ring, place, timefair, types, seat, rows

-- The section runs in a block, with the names it uses copied next to the closures that use
-- them: every run of a script makes every closure of the files it includes, and a closure
-- captures a local by walking down the open ones, so capturing the far locals of the files
-- before this one made each run of a verb several microseconds slower.
local claim_one
do
  local K_active, K_gactive, K_gturn, K_gvrun, K_gvt, K_ring, K_wake =
    K_active, K_gactive, K_gturn, K_gvrun, K_gvt, K_ring, K_wake
  local bury, group_seat, hist, hist_started, job_key, lane_key, misfit, rate_ready =
    bury, group_seat, hist, hist_started, job_key, lane_key, misfit, rate_ready
  local ring_leave, ring_size, ring_turn, row_fault, starts_key, time_charge, time_fair =
    ring_leave, ring_size, ring_turn, row_fault, starts_key, time_charge, time_fair
  local notify, type_of, wait_push, wake, wrong_type = notify, type_of, wait_push, wake, wrong_type
  local K_tactive, TENANT_MARK, tenant_leave, tenant_limit, tenant_of, tgvt_key, tring_key =
    K_tactive, TENANT_MARK, tenant_leave, tenant_limit, tenant_of, tgvt_key, tring_key
  local TEN = TEN
  local LEASE_ROW, R_ATTEMPTS, R_EXPIRES, R_FENCE, R_LEASE, R_PAYLOAD, R_STATE, R_TASK, R_TTL =
    LEASE_ROW, R_ATTEMPTS, R_EXPIRES, R_FENCE, R_LEASE, R_PAYLOAD, R_STATE, R_TASK, R_TTL
  local unpack = unpack
  local byte, sub, tonumber, type = string.byte, string.sub, tonumber, type
  -- A claim meets what it cannot read without failing the queue: a job row it cannot read goes
  -- to `dead` with the reason (bury), a group whose books it cannot read leaves the ring
  -- (group_seat), and only a queue-wide key of the wrong type fails the call, before its first
  -- write (claim_books). Every check reads before the claim writes anything, so a refused call
  -- changes nothing and no job is ever left out of every structure.

  -- Once per call, before the first write: the queue-wide keys a claim may write half-way
  -- through a lease (`gturn`, this minute's history, in time mode `gvrun`). Returns false,
  -- or the error text naming the key of the wrong type. (`active` and `dead`, written right
  -- after the pop, are checked by that write: claim_one puts the job back on a refusal.)
  local BOOKS = nil
  local function claim_books(now)
    if BOOKS ~= nil then return BOOKS end
    local h = hist(now)
    -- one key at a time, no tables (every claim runs this); h[4]: written, so a hash
    BOOKS = misfit(K_gturn, 'hash') or (h and not h[4] and misfit(h[1], 'hash'))
      or (time_fair() and misfit(K_gvrun, 'hash')) or false
    return BOOKS
  end

  -- A wake at the end of a claim that skipped its fill: a hint, left out when `wake` is of
  -- the wrong type (the next tick's promote finds the work anyway).
  local function wake_soft()
    local t = type_of(K_wake)
    if t == 'none' or t == 'list' then wake() end
  end

  -- A popped job whose deadline (its row's `expires`, server ms, set by enqueue from the
  -- producer's `expires=`) has passed is never run: it ends `expired`, as a cancelled job
  -- ends (no attempt spent, no retry, not `dead`: Celery counts it revoked), the clients
  -- blocked in get() are woken, and the row lives its ttl. A row without the field (every
  -- job before expiries existed) never expires.
  local function expire(id, jk, row, now)
    redis.call('HSET', jk, 'state', 'expired', 'finished', now, 'error',
      'expired: not started before its expiry')
    redis.call('HDEL', jk, 'payload')
    notify(id, redis.call('HGET', jk, 'waiters'))
    local ttl = tonumber(row[R_TTL] or '0')
    if ttl > 0 then redis.call('EXPIRE', jk, ttl) else redis.call('DEL', jk) end
  end

  -- Claim one job: turn the ring one step (in time mode: take the least virtual time of
  -- `gvt`, for a tenant's mark the least of its groups, and charge it, time_charge), pop the head of that lane, lease it.
  -- Returns {id, task, payload, attempts, nonce, group, lease_ms, more, fence}, or nil when
  -- nothing is serviceable, or nil and an error text when a queue-wide key a claim writes is
  -- of the wrong type (claim_books: nothing was written). Ghosts (ids whose row is gone),
  -- stale ring entries, groups whose books cannot be read (group_seat) and rows that cannot be
  -- read (bury) and expired jobs (expire) are skipped, at most 64 of them per call; past that
  -- a wake is pushed so a worker comes back for the rest.
  function claim_one(nonce, now)
    local tf = time_fair()
    for _ = 1, 64 do
      local g, vs, tvs
      -- t: the group's tenant, false for none (time mode: tvs, the tenant's virtual time)
      local t = false
      if tf then
        local h = redis.call('ZRANGE', K_gvt, 0, 0, 'WITHSCORES')
        g, vs = h[1], tonumber(h[2])
        if g and byte(g, 1) == 255 then          -- a tenant's mark: its least-served group
          t, tvs = sub(g, 2), vs
          h = redis.call('ZRANGE', tgvt_key(t), 0, 0, 'WITHSCORES')
          g, vs = h[1] or '', tonumber(h[2])
        end
      else
        g = redis.call('LINDEX', K_ring, 0)
        if g and byte(g, 1) == 255 then          -- a tenant's mark: its ring's head group
          t = sub(g, 2)
          g = redis.call('LINDEX', tring_key(t), 0)
          if not g then g = '' end
        end
      end
      if not g then return nil end
      local books = claim_books(now)
      if books then return nil, books end
      local seat = g ~= '' and group_seat(g, tf)
      local lane = lane_key(g)
      local popped = seat and redis.pcall('ZPOPMIN', lane)
      if g == '' then
        tenant_leave(t, false)                 -- a stale mark (its tenant's ring is empty)
      elseif not seat or popped.err or #popped == 0 then
        ring_leave(g, false, false, t)
      else
        local id = popped[1]
        local jk = job_key(id)
        local row = redis.pcall('HMGET', jk, unpack(LEASE_ROW))
        local fault, refused = nil, nil
        if row.err then
          refused = bury(id, g, nil, now, type_of(jk))
        elseif row[R_STATE] then
          fault = row_fault(row, g)
          if fault then refused = bury(id, g, fault, now) end
        end
        local ok = not (row.err or fault or not row[R_STATE])
        local expired = ok and row[R_EXPIRES] and tonumber(row[R_EXPIRES]) <= now
        -- `active` first, by the write itself: a lease it refuses is no lease
        if ok and not expired
          and type(redis.pcall('ZADD', K_active, int_text(now + tonumber(row[R_LEASE])), id))
            == 'table' then
          refused = wrong_type(K_active, 'zset')
        end
        if refused then
          -- `dead` or `active` of the wrong type: the job goes back, the call changed nothing
          redis.call('ZADD', lane, popped[2], id)
          return nil, refused
        end
        if not ok or expired then
          -- a ghost (its row is gone), a buried row or an expired job: look again
          if expired then expire(id, jk, row, now) end
          if redis.call('ZCARD', lane) == 0 then ring_leave(g, false, false, t) end
        else
          local rotated, t_rotated = true, true
          if tf then
            time_charge(g, vs, jk, seat.est, seat.w, t, tvs)
          else
            rotated, t_rotated = ring_turn(g, seat.w, t)
          end
          local att = tonumber(row[R_ATTEMPTS]) + 1
          local lease = tonumber(row[R_LEASE])
          -- fence: grows with every claim of the row, never rolled back (attempts is: by a
          -- release, or a requeue of a dead job), so a task can guard writes elsewhere with it.
          local fence = tonumber(row[R_FENCE] or '0') + 1
          redis.call('HSET', jk, 'state', 'active', 'attempts', int_text(att), 'nonce', nonce,
            'started', int_text(now), 'fence', int_text(fence))
          local act = redis.call('HINCRBY', K_gactive, g, '1')
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
            ring_leave(g, rotated, t_rotated, t)
            if at then wait_push(g, at) end
          end
          if t then
            -- the tenant's jobs in flight; at its limit it leaves the ring (its groups stay
            -- in its own ring) until a completion returns it (active_drop)
            local tact = redis.call('HINCRBY', K_tactive, t, 1)
            local tlim = tenant_limit(t)
            -- and its rate: a spent budget takes it off the ring (time mode: out of gvt,
            -- its virtual time kept in gvrun) into `twait` until its next start is due
            -- (promote returns it; at its limit too, a completion does). A mark its last
            -- group took out already (ring_leave above) stays out, and out of `twait`.
            local tat = TEN.charge(t, now)
            local full = tlim and tact >= tlim
            if (full or tat) and (tf and (full or redis.call('ZCARD', tgvt_key(t)) > 0)
                or not tf and redis.call('LLEN', tring_key(t)) > 0) then
              tenant_leave(t, t_rotated)
              if tat and not full then TEN.wait_push(t, tat) end
            end
          end
          if (closed or at or t) and ring_size() == 0 then more = 0 end
          -- last: a history counter that cannot be counted fails the call with the books whole
          hist_started(now, row[R_TASK] or '', g, tonumber(popped[2]), t)
          -- the lease: emqtasks/store/protocol.py LEASE_REPLY, position by position
          return {id, row[R_TASK], row[R_PAYLOAD], att, nonce, g, lease, more, fence}
        end
      end
    end
    wake_soft()
    return nil
  end
end
