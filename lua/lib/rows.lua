-- rows: what a verb cannot read of a job row (int_fault, row_fault), and the burial in `dead`
-- of a row that cannot be read (bury).
-- Includes: keys, core, types, history, wake, workflow

local int_fault, row_fault, bury
do   -- the names it uses copied next to it, as lib/claim.lua explains
  local K_dead, hist_failed, int_ok, job_key, notify, wf_fail, wrong_type =
    K_dead, hist_failed, int_ok, job_key, notify, wf_fail, wrong_type
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
  -- either), or nil. row: HMGET task payload lease state attempts fence group max ttl delay
  -- created (check.py ROW_INTS says the same).
  function row_fault(row, g)
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
