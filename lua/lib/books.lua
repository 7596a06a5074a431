-- books: what the verbs that move a job in or out of its group's books read of them before
-- their first write (group_books), and a job into its lane by what they read (lane_in).
-- Includes: keys, core, settings, types, seat, place

local group_books, lane_in
do   -- the names it uses copied next to it, as lib/claim.lua explains
  local K_gactive, K_gpaused, K_gturn, K_gvrun, K_gvt, K_gwait, K_ring, K_wake =
    K_gactive, K_gpaused, K_gturn, K_gvrun, K_gvt, K_gwait, K_ring, K_wake
  local group_seat, int_ok, lane_key, lane_push, limit_of, misfit, time_fair =
    group_seat, int_ok, lane_key, lane_push, limit_of, misfit, time_fair
  local type_of, weight_text, tonumber = type_of, weight_text, tonumber

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
  -- a claim takes the group out of the ring and emqtasks check names the key. With nil, the
  -- group's limit it read (false for none), for active_drop, so the same call reads it once.
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
      local w = weight_text(g)
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
    return nil, lim or false
  end

  -- A job into g's lane: opening the group as lane_push does, or, when its books cannot be
  -- read (group_books returned true), only into the lane, the group left as it stands.
  function lane_in(g, id, score, now, books)
    if books then redis.call('ZADD', lane_key(g), score, id) else lane_push(g, id, score, now) end
  end
end
