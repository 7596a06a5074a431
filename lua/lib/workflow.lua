-- workflow: a step's hand-over to the steps waiting for it, and a workflow's failure.
-- Includes: keys, wake, place
--
-- A workflow's steps are ordinary job rows carrying `wf` (the workflow's id). A step that
-- waits for a parent has state 'waiting' and sits in no structure: no lane, no `delayed`.
-- A parent's row names its children in `next` (space-separated ids) and, when they collect
-- results (a chord's callback, or each member of a group after a group), its `slot` in
-- their results: one slot serves them all, since a step's result has one place in the
-- value they collect (a chain's last step in a group: the chain's place). A waiting row
-- holds: `par` (its parents, in slot order), `imm` '1' (immutable: ignores their results),
-- `splice` (the byte offset in its payload where the parent's result goes, right after the
-- envelope's `"a":[`), `comma` '1' (its own arguments follow), `cd` (a countdown, ms,
-- counted from its release), and for a step that collects results `npend` (results not yet
-- in), `nslots` and, when the collected value is not a flat list (nested lists),
-- `shape`: the value's JSON with a '#' for each slot, in slot order (e.g. '[#,[#,#]]'; no
-- other '#' in it). The results wait in BASE .. 'chord:' .. callback_id (hash: slot ->
-- result JSON), once each (HSETNX), and the workflow's own hash is BASE .. 'wf:' .. wf_id
-- (`waiting`: the ids a failure cancels, `lerr`: the link_error step, `failed`: the step
-- that went dead first, `shape`: its result's, as a collecting row's).
--
-- Tracing: an ack may name the finished run's span (a W3C traceparent, `tp`); the step it
-- releases keeps it as `tparent` (its run's span is that span's child), and a chord's
-- callback keeps the other members' in `tlinks` (space-separated, its span links to them),
-- collected as they finish, until the list holds TLINKS_BYTES (the SDK keeps 128 links).

-- The helpers live in a block: a script has 200 local slots for every file it includes,
-- and only these three are used outside this file.
local wf_handover, wf_cancel_waiting, wf_fail
do
  local TLINKS_BYTES = 7168

  -- A waiting step goes to its lane (or `delayed` for a countdown), with `arg` (JSON text, or
  -- nil) spliced in as its first argument.
  local function wf_release(id, arg, now, tp)
    local jk = job_key(id)
    if tp then redis.call('HSET', jk, 'tparent', tp) end
    local g, prio, splice, comma, cd_text, payload =
      unpack(redis.call('HMGET', jk, 'group', 'prio', 'splice', 'comma', 'cd', 'payload'))
    if arg then
      local off = tonumber(splice)
      local sep = ''
      if comma == '1' then sep = ',' end
      redis.call('HSET', jk, 'payload',
        string.sub(payload, 1, off) .. arg .. sep .. string.sub(payload, off + 1))
    end
    local cd = tonumber(cd_text or '0') or 0
    if cd > 0 then
      redis.call('HSET', jk, 'state', 'delayed')
      delay_push(id, now + cd)
    else
      redis.call('HSET', jk, 'state', 'pending')
      lane_push(g, id, lane_score(prio, now), now)
    end
  end

  -- The collected results of a chord, in slot order: one JSON array, or `shape` with each '#'
  -- replaced by the next slot's result.
  local function wf_gather(rk, n, shape)
    local parts = {}
    for s = 0, n - 1, 1000 do
      local fields = {}
      for i = s, math.min(n, s + 1000) - 1 do fields[#fields + 1] = string.format('%d', i) end
      for _, v in ipairs(redis.call('HMGET', rk, unpack(fields))) do parts[#parts + 1] = v or 'null' end
    end
    if not shape then return '[' .. table.concat(parts, ',') .. ']' end
    local i = 0
    return (string.gsub(shape, '#', function()
      i = i + 1
      return parts[i] or 'null'
    end))
  end

  -- A chord member's span (tp) on its callback's row, for the callback's span to link to.
  local function wf_tlink(ck, tp)
    local have = redis.call('HGET', ck, 'tlinks')
    if not have then
      redis.call('HSET', ck, 'tlinks', tp)
    elseif #have < TLINKS_BYTES then
      redis.call('HSET', ck, 'tlinks', have .. ' ' .. tp)
    end
  end

  -- A step finished with `result` (its run's span `tp`, or nil): each waiting child it names
  -- is released (a chord's callback once its last member is in), in the same call as the ack.
  function wf_handover(nxt, slot, result, now, tp)
    for c in string.gmatch(nxt, '%S+') do
      local ck = job_key(c)
      local state, npend, imm, nslots, shape = unpack(redis.call('HMGET', ck, 'state', 'npend',
        'imm', 'nslots', 'shape'))
      if state == 'waiting' then
        local arg = result
        if imm == '1' then arg = nil end
        if not npend then
          wf_release(c, arg, now, tp)
        elseif slot then
          local rk = chord_key(c)
          if redis.call('HSETNX', rk, slot, result) == 1 then
            if redis.call('HINCRBY', ck, 'npend', -1) <= 0 then
              if arg then arg = wf_gather(rk, tonumber(nslots), shape) end
              redis.call('DEL', rk)
              wf_release(c, arg, now, tp)
            elseif tp then
              wf_tlink(ck, tp)
            end
          end
        end
      end
    end
  end

  -- A step still waiting in a workflow that failed at step `id` is cancelled.
  function wf_cancel_waiting(c, id, now)
    local ck = job_key(c)
    local state, waiters, ttl_text = unpack(redis.call('HMGET', ck, 'state', 'waiters', 'ttl'))
    if state == 'waiting' then
      redis.call('HSET', ck, 'state', 'cancelled', 'error', 'workflow failed at step ' .. id,
        'finished', now)
      redis.call('DEL', chord_key(c))
      notify(c, waiters)
      local ttl = tonumber(ttl_text or '0') or 0
      if ttl > 0 then redis.call('EXPIRE', ck, ttl) else redis.call('DEL', ck) end
    end
  end

  -- Step `id` of workflow `wf` went dead (or was found lost): the first such call fails the
  -- workflow, cancels every step still waiting and releases the link_error step, once.
  function wf_fail(wf, id, now)
    local wk = wf_key(wf)
    if redis.call('HSETNX', wk, 'failed', id) == 0 then return end
    redis.call('HSET', wk, 'state', 'failed')
    local waiting, lerr = unpack(redis.call('HMGET', wk, 'waiting', 'lerr'))
    for c in string.gmatch(waiting or '', '%S+') do wf_cancel_waiting(c, id, now) end
    if lerr then
      local state, imm = unpack(redis.call('HMGET', job_key(lerr), 'state', 'imm'))
      if state == 'waiting' then
        local arg = '"' .. id .. '"'
        if imm == '1' then arg = nil end
        wf_release(lerr, arg, now, nil)
        -- released: it lives as a job now, no longer with its workflow's hash
        redis.call('PERSIST', job_key(lerr))
      end
    end
  end
end
