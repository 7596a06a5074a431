-- core: the server's clock, integer text, key types, and the write a full server lets through.
-- Includes: (none: the prelude's fixed keys only)

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A full server (used memory over maxmemory, policy noeviction) refuses a script at its
-- first write of a command that may grow memory (HSET, ZADD...: flagged deny-oom) and lets
-- everything after a first write through, so that no script stops half-way. The verbs that
-- settle, free or move work (claim, ack, retry, release, extend, reap, promote) must run on
-- a full server: a worker that ran a job must be able to say so, and draining is how the
-- server gets room again. Each makes this its first write: a DEL, which cannot grow memory,
-- of the guard key, which is never written, so it changes and replicates nothing. Their
-- twins in the module carry no deny-oom flag; enqueue is refused at its first HSET, and so
-- is the module's (OOM_REFUSED in its C source).
local function runs_when_full() redis.call('DEL', K_guard) end

-- Integers as text, exactly (a bare number would go as %.14g).
local function int_text(v) return string.format('%d', v) end
-- Integer text as every writer stores counts, times and settings: '0', or an optional '-'
-- and 1 to 15 digits without a leading zero (exact in a double, and what the module reads
-- the same way). A row field or a book holding anything else is unreadable.
local find, byte = string.find, string.byte
local function int_ok(s)
  if not s or #s > 16 or not find(s, '^%-?[1-9]%d*$') then return s == '0' end
  return #s <= 15 or byte(s, 1) == 45   -- 16 characters: a '-' and 15 digits
end
-- The type of a key as TYPE names it ('none' when missing).
local function type_of(key) return redis.call('TYPE', key)['ok'] end
