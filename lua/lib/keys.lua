-- keys: the keyspace a script forms beyond the fixed keys, and the lanes' score.
-- Includes: (none)
--
-- Before this file the loader declares the queue's fixed keys (emqtasks/keys.py FIXED):
--   K_ring (list)  K_active (zset)  K_gactive (hash)  K_glimit (hash)  K_gweight (hash)
--   K_gturn (hash) K_gpaused (set)  K_paused (string) K_delayed (zset) K_dead (zset)
--   K_wake (list)  K_guard (never written: declared so that while the queue's Redis Cluster
--   slot migrates every script is refused with TRYAGAIN, never run on a half-moved queue)
-- and BASE, the queue's hash-tagged prefix "emq:{q}:" cut from KEYS[1]. The keys a script
-- forms itself all carry the queue's tag, so one slot: job rows (BASE .. 'job:' .. id),
-- lanes (BASE .. 'g:' .. group .. ':pending'), a rate-limited group's recent start times
-- (BASE .. 'g:' .. group .. ':starts'), result notifications (BASE .. 'done:' .. id), and
-- the fairness controls' books below (K_grate ... K_gwait), a group's recent busy time
-- (BASE .. 'g:' .. group .. ':busy') and the time-fair mode's books (K_fairness ... K_busy),
-- and workflows' hashes (BASE .. 'wf:' .. id) and chord results (BASE .. 'chord:' .. id),
-- see lib/workflow.lua.
--
-- Lane scores carry a job's priority: priority * PRIO_SPAN + time (ms), so a lane pops its
-- lowest priority first and, within a priority, its oldest job first. Priority 0 (the
-- default) scores exactly its time.

local PRIO_SPAN = 1e13   -- above any ms timestamp until the year 2286; |score| < 2^53
local DEFAULT_GROUP = 'default'   -- a job's group when it names none (keys.py)

local K_grate = BASE .. 'grate'           -- hash: group -> "max:per_ms", its rate limit
local K_gmax = BASE .. 'gmax'             -- hash: group -> cap on its waiting jobs
local K_gdefaults = BASE .. 'gdefaults'   -- hash: limit | rate | max_size | weight -> default
local K_gbackoff = BASE .. 'gbackoff'     -- hash: group -> ms until which it sits out
local K_gwait = BASE .. 'gwait'           -- zset: open groups held back, score = ready time
-- The time-fair mode (lib/timefair.lua):
local K_fairness = BASE .. 'fairness'     -- string: 'time' when time-fair; absent: turns
local K_gvt = BASE .. 'gvt'               -- zset: time mode's ring, score = virtual time (us)
local K_gvrun = BASE .. 'gvrun'           -- hash: group -> virtual time (us); '' -> the floor
local K_gcost = BASE .. 'gcost'           -- hash: group -> estimated job cost (us); '' queue's
local K_busy = BASE .. 'busy'             -- hash: 10 s slot -> busy ms of the whole queue
-- Tenants (lib/ring.lua): a group may belong to a tenant; the ring then holds the tenant's
-- mark (TENANT_MARK .. tenant: no group name starts with that byte, they are UTF-8) and the
-- tenant's own ring holds its open groups. A group with no tenant is its own tenant.
local TENANT_MARK = '\255'
local K_gtenant = BASE .. 'gtenant'       -- hash: group -> its tenant (absent: its own)
local K_tactive = BASE .. 'tactive'       -- hash: tenant -> jobs in flight
-- A tenant's controls, in one table (a verb's main chunk is near Lua's 200 locals):
-- limit / weight: hash tenant -> concurrency limit / claims per turn; paused: set of paused
-- tenants; rate / max: hash tenant -> "max:per_ms" / cap on its waiting jobs ('': every
-- tenant's default, for all but paused); wait: zset tenant -> when its rate lets it start
-- again (its mark is off the ring meanwhile); starts(t): list, its recent start times;
-- groups(t): set, its groups (gtenant read backwards: its waiting jobs are counted over them).
-- The key names are formed at each read from the current BASE: a Functions library builds
-- this table once and runs it for every queue (store/functions.py).
local TEN = {}
do
  local names = {limit = 'tlimit', weight = 'tweight', paused = 'tpaused', rate = 'trate',
                 max = 'tmax', wait = 'twait'}
  setmetatable(TEN, {__index = function(_, k)
    local name = names[k]
    return name and BASE .. name
  end})
end
function TEN.starts(t) return BASE .. 't:' .. t .. ':starts' end
function TEN.groups(t) return BASE .. 't:' .. t .. ':groups' end
-- The queue's own marks (emqtasks/clock.py, stats()):
local K_clock = BASE .. 'clock'           -- hash: seen (latest server ms a reap saw), step, at
local K_tally = BASE .. 'tally'           -- hash: stale_acks (acks the fence refused)
-- The masters (store/beats.py) and the aborts asked of them (abort.lua):
local K_workers = BASE .. 'workers'       -- hash: worker id -> "1", the heartbeats' index
local function aborts_key(wid) return BASE .. 'aborts:' .. wid end   -- list: "<id> <nonce>"

local function job_key(id) return BASE .. 'job:' .. id end
local function lane_key(g) return BASE .. 'g:' .. g .. ':pending' end
local function starts_key(g) return BASE .. 'g:' .. g .. ':starts' end
-- string: the id of the job holding a unique key (enqueue.lua), PX its unique_for
local function unique_key(k) return BASE .. 'u:' .. k end
local function lane_score(prio, t) return (tonumber(prio) or 0) * PRIO_SPAN + t end
-- A tenant's ring: its open groups, turned once per claim of the tenant.
local function tring_key(t) return BASE .. 't:' .. t .. ':ring' end
-- Time mode's twin (lib/timefair.lua): a zset of the tenant's open groups by virtual time.
local function tgvt_key(t) return BASE .. 't:' .. t .. ':gvt' end
local function busy_key(g) return BASE .. 'g:' .. g .. ':busy' end
-- A key of the queue by its name after the base (repair deletes derived keys by name).
local function queue_key(name) return BASE .. name end

-- A workflow's hash and a chord's collected results (lib/workflow.lua).
local function wf_key(wf) return BASE .. 'wf:' .. wf end
local function chord_key(id) return BASE .. 'chord:' .. id end
