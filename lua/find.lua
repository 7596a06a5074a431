-- find: a bounded look through one of a queue's job sets for jobs matching a filter (the
-- dashboard's search; read-only).
--
-- KEYS: the queue's fixed keys (see lib/keys.lua).
-- Includes: keys
-- ARGV[1]  the set: dead | delayed | active | lane (the lane of ARGV[6])
-- ARGV[2]  the rank to start at: newest first for dead / delayed / active, a lane oldest
--          first (the order its jobs start in)
-- ARGV[3]  how many entries to look at in this call (the work bound, at most 2000: about
--          a millisecond per 100 entries read, so one call blocks the server briefly)
-- ARGV[4]  the most matches to return
-- ARGV[5]  task name, exact ('' = any)
-- ARGV[6]  group, exact ('' = any; required for lane)
-- ARGV[7]  text the job's error contains, case-insensitive, plain ('' = any)
-- ARGV[8]  only entries scored at most this ('' = no bound): a snapshot of `dead` taken
--          when a count was shown, so jobs that die later are not acted on
-- Reply: {next rank (-1: the set ended), entries looked at, id1, id2, ...}
-- Side effects: none. The rank is that of the set bounded by ARGV[8]: a caller pages on
--   by passing the next rank back with the same bound.

local which, start, look, most = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local want_task, want_group, text, bound = ARGV[5], ARGV[6], string.lower(ARGV[7]), ARGV[8]
if look > 2000 then look = 2000 end
local key
if which == 'dead' then key = K_dead
elseif which == 'delayed' then key = K_delayed
elseif which == 'active' then key = K_active
elseif which == 'lane' and want_group ~= '' then key = lane_key(want_group)
else return redis.error_reply('ERR find: unknown set ' .. which) end

-- A set or a job key of the wrong type (a producer-ACL user may write one) holds no match:
-- the search goes on past it instead of failing the page (emqtasks check names the key).
local ids
if which == 'lane' then
  ids = redis.pcall('ZRANGE', key, start, start + look - 1)
elseif bound ~= '' then
  ids = redis.pcall('ZREVRANGEBYSCORE', key, bound, '-inf', 'LIMIT', start, look)
else
  ids = redis.pcall('ZREVRANGE', key, start, start + look - 1)
end
if ids.err then return {-1, 0} end
local out = {-1, 0}
local n = 0
-- a lane holds only its group's jobs: no group to check there
if which == 'lane' then want_group = '' end
local any = want_task == '' and want_group == '' and text == ''
for i, id in ipairs(ids) do
  local ok = any
  if not any then
    local row = redis.pcall('HMGET', job_key(id), 'task', 'group', 'error')
    ok = not row.err and (want_task == '' or row[1] == want_task)
      and (want_group == '' or row[2] == want_group)
      and (text == '' or (row[3] and string.find(string.lower(row[3]), text, 1, true)))
  end
  if ok then
    n = n + 1
    out[#out + 1] = id
    if n >= most then
      out[2] = i
      out[1] = (i < #ids or #ids == look) and start + i or -1
      return out
    end
  end
end
out[2] = #ids
out[1] = (#ids == look) and start + look or -1
return out
