-- promote: move due entries of `delayed` back to their lanes, and groups whose wait in
-- `gwait` (a spent rate budget, a back-off) is over back to the ring, and tenants whose
-- wait in `twait` (a spent tenant rate) is over.
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: core, keys, place, ring, rows, books
-- ARGV[1]  limit, the most entries moved in this call (jobs and groups each)
-- Reply: {moved, next_due_in_ms, claimable}: moved counts jobs; next_due_in_ms is -1 when
--   `delayed`, `gwait` and `twait` are empty, 0 when more are due now (the limit cut the batch),
--   else ms until the next job is due or the next group may start again; claimable is 1
--   when the ring is not empty and the queue is not paused (a claim would find work),
--   else 0: a master with an idle child fans on it, so a wake token that was lost (its
--   BLPOP reply dropped, its master killed holding it) strands nothing.
-- Side effects: per due id, state pending and into its lane with score now (behind work
--   already waiting, within its priority); per due group, back on the ring (or in gwait
--   again until its new ready time); groups join the ring with a wake; per due tenant, out
--   of `twait` and its mark back on the ring (time mode: into `gvt` at its virtual time or
--   the floor) with a wake while it is open and its own ring (its zset) holds a group, or
--   in `twait` again while its budget is still spent.
--   What promote cannot read costs that job or that group, never the tick: a job key that is
--   not a hash is replaced by a dead row, a row without a group goes to `dead` with the
--   reason (bury in lib/rows.lua), a job whose lane is of the wrong type goes to `dead` naming
--   it; a job whose group's other books cannot be read goes into its lane only, and such a
--   group leaves `gwait` without joining the ring (group_books in lib/books.lua).

runs_when_full()
local now = now_ms()
local limit = tonumber(ARGV[1])
-- Each zset's head first: an idle tick reads one entry of each and ranges over none.
local function head_at(key)
  local head = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return head[2] and tonumber(head[2]) or false
end
local function due(key, at)
  if at and at <= now then
    return redis.call('ZRANGEBYSCORE', key, '-inf', now, 'LIMIT', 0, limit)
  end
  return {}
end
local delayed_at = head_at(K_delayed)
local ids = due(K_delayed, delayed_at)
for _, id in ipairs(ids) do
  local jk = job_key(id)
  local row = redis.pcall('HMGET', jk, 'group', 'prio')
  local refused, books = nil, nil
  if row.err then
    refused = bury(id, nil, nil, now, type_of(jk))
  elseif row[1] then
    books = group_books(row[1], false, true)
    if type(books) == 'string' then refused = bury(id, row[1], nil, now, nil, books) end
  elseif type_of(jk) == 'hash' then
    refused = bury(id, nil, 'no group', now)
  end
  if refused then return redis.error_reply(refused) end
  redis.call('ZREM', K_delayed, id)
  if row[1] and type(books) ~= 'string' then
    redis.call('HSET', jk, 'state', 'pending')
    lane_in(row[1], id, lane_score(row[2], now), now, books)
  end
end
local gwait_at = head_at(K_gwait)
local groups = due(K_gwait, gwait_at)
for _, g in ipairs(groups) do
  redis.call('ZREM', K_gwait, g)
  -- a group whose books cannot be read stays out (group_books), as a claim leaves it
  if not group_books(g, false, true) and open(g) then admit(g, now) end
end
-- tenants whose rate lets them start again: their marks back on the ring, if still open
local twait_at = head_at(TEN.wait)
local tenants = due(TEN.wait, twait_at)
for _, t in ipairs(tenants) do
  redis.call('ZREM', TEN.wait, t)
  -- time mode: its mark back in gvt at its virtual time or the floor (tenant_enter)
  if (time_fair() and redis.call('ZCARD', tgvt_key(t))
      or redis.call('LLEN', tring_key(t))) > 0 and tenant_open(t) then
    tenant_enter(t)
    wake()
  end
end
-- the next due time: a head read before its step holds unless that step moved entries
local next_due = -1
for _, read in ipairs({{K_delayed, delayed_at, #ids}, {K_gwait, gwait_at, #groups},
                       {TEN.wait, twait_at, #tenants}}) do
  local at = read[2]
  if read[3] > 0 then at = head_at(read[1]) end
  if at then
    local wait = math.max(0, at - now)
    if next_due < 0 or wait < next_due then next_due = wait end
  end
end
local claimable = 0
if ring_any() and redis.call('EXISTS', K_paused) == 0 then claimable = 1 end
return {#ids, next_due, claimable}
