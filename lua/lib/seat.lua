-- seat: what a claim reads of a group's books, each checked before it writes (group_seat).
-- Includes: keys, core, settings, timefair

local group_seat
do   -- the names it uses copied next to it, as lib/claim.lua explains
  local DEFAULT_COST, K_gactive, K_gcost, K_gturn, K_gwait, K_wake =
    DEFAULT_COST, K_gactive, K_gcost, K_gturn, K_gwait, K_wake
  local int_ok, limit_of, rate_of, starts_key, type_of, weight_text =
    int_ok, limit_of, rate_of, starts_key, type_of, weight_text
  local ipairs, tonumber = ipairs, tonumber

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
    local w = weight_text(g)
    if w and not (int_ok(w) and tonumber(w) >= 1) then return nil end
    local seat = {act = tonumber(act or '0'), lim = tonumber(lim), w = tonumber(w or '1')}
    local m, per, long = rate_of(g)
    if m then
      if long then return nil end
      for _, kw in ipairs({{starts_key(g), 'list'}, {K_gwait, 'zset'}, {K_wake, 'list'}}) do
        local t = type_of(kw[1])
        if t ~= 'none' and t ~= kw[2] then return nil end
      end
      seat.m, seat.per = m, per
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
end
