-- aborted: an attempt ends `aborted` (abort.lua 'end'; release.lua, and reap.lua for an
-- expired lease, when the attempt it would hand back is the one an abort was asked of: the
-- abort is not lost with the attempt).
-- Includes: core, keys, fence, timefair, place, history, wake, workflow, types, books

-- The fenced attempt of `id` (row: FENCED_ROW, from fenced()) ends `aborted` with `err`: as
-- retry.lua's dead path, but not into `dead`: out of `active`, gactive-1, the time-fair
-- settle, the minute's history (counted dead), the waiters notified, the row expires after
-- its ttl (0: deleted), a workflow step fails its workflow (wf_fail). Returns nil, or the
-- error text when `active` is of the wrong type (nothing written).
local function end_aborted(id, row, err)
  local jk = job_key(id)
  local g = row[F_GROUP]
  local now = now_ms()
  local books = group_books(g, true, false, row[F_VCHARGE])
  local unfit = misfit({{K_active, 'zset'}})
  if unfit then return unfit end
  if not books then time_settle(g, id, row[F_STARTED], row[F_VCHARGE], now, true) end
  redis.call('ZREM', K_active, id)
  local ttl = tonumber(row[F_TTL] or '0')
  if ttl > 0 then
    redis.call('HSET', jk, 'state', 'aborted', 'error', err, 'finished', now)
    redis.call('EXPIRE', jk, ttl)
  else
    redis.call('DEL', jk)
  end
  if not books then active_drop(g, now) end
  hist_failed(now, row[F_TASK] or '', g, true)
  notify(id, row[F_WAITERS])
  if row[F_WF] then wf_fail(row[F_WF], id, now) end
  return nil
end
