-- rows: what a verb cannot read of a job row (int_fault, row_fault), and the burial in `dead`
-- of a row that cannot be read (bury).
-- Includes: keys, core, types, history, wake, workflow

-- What a claim reads of the row of the job it popped: these fields in this order
-- (emqtasks/store/protocol.py LEASE_ROW; the module's R_* in rows.c), read as row[R_*].
local LEASE_ROW = {'task', 'payload', 'lease', 'state', 'attempts', 'fence', 'group', 'max',
  'ttl', 'delay', 'created', 'expires'}
local R_TASK, R_PAYLOAD, R_LEASE, R_STATE, R_ATTEMPTS, R_FENCE, R_GROUP, R_MAX, R_TTL, R_DELAY,
  R_CREATED, R_EXPIRES = 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12

local int_fault, row_fault, bury
do   -- the names it uses copied next to it, as lib/claim.lua explains
  local K_dead, hist_failed, int_ok, job_key, notify, wf_fail, wrong_type =
    K_dead, hist_failed, int_ok, job_key, notify, wf_fail, wrong_type
  local R_ATTEMPTS, R_CREATED, R_DELAY, R_EXPIRES, R_FENCE, R_GROUP, R_LEASE, R_MAX, R_TTL =
    R_ATTEMPTS, R_CREATED, R_DELAY, R_EXPIRES, R_FENCE, R_GROUP, R_LEASE, R_MAX, R_TTL
  local type = type

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
  -- either), or nil. row: LEASE_ROW (ops/check.py ROW_INTS says the same, in the same order).
  function row_fault(row, g)
    if not row[R_GROUP] then return 'no group' end
    if row[R_GROUP] ~= g then return 'its group is not the lane it was in' end
    return int_fault(row[R_ATTEMPTS], 'attempts', true) or int_fault(row[R_LEASE], 'lease', true)
      or int_fault(row[R_FENCE], 'fence') or int_fault(row[R_MAX], 'max', true)
      or int_fault(row[R_TTL], 'ttl') or int_fault(row[R_DELAY], 'delay')
      or int_fault(row[R_CREATED], 'created', true) or int_fault(row[R_EXPIRES], 'expires')
  end

  -- A job popped from g's lane whose row cannot be read goes to `dead` with the reason; a
  -- key of another type than a hash (keytype: its TYPE) is replaced by a dead row (a hash
  -- was never there to keep). A row that lost its group gets the lane's, so a requeue brings
  -- it back there (repair buries rows outside lanes too: g may be nil).
  -- (text: the whole error to leave on the row, for a job buried for its lane, see
  -- group_books in lib/books.lua.)
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
end
