/* emq.c: the native twin of emqtasks' Lua verbs, as a Redis / Valkey module.
 *
 * Each command does what lua/<verb>.lua does, with the same arguments: the script's KEYS
 * then its ARGV, without numkeys. KEYS are the queue's 12 fixed keys in keys.py FIXED order
 * (ring active gactive glimit gweight gturn gpaused paused delayed dead wake guard), all
 * of the form BASE..name with BASE = KEYS[1] minus "ring" (anything else is refused: the
 * keys a command forms itself, job rows BASE.."job:"..id, lanes BASE.."g:"..group..":pending",
 * a rated group's start times BASE.."g:"..group..":starts", done lists BASE.."done:"..id,
 * workflows' hashes BASE.."wf:"..id and chord results BASE.."chord:"..id, the fairness
 * controls' books BASE..{grate gmax gdefaults gbackoff gwait}, the time-fair mode's
 * BASE..{fairness gvt gvrun gcost busy} and a group's BASE.."g:"..group..":busy", and the
 * minute's history hash BASE.."h:"..minute (lua/lib/history.lua hist_*: the same
 * counters), then carry the same prefix, so the same slot and the same ACL key pattern, and
 * never alias a fixed key). Replies are what the script returns through RESP2: Lua tables
 * are arrays, false a nil bulk, numbers integers.
 *
 *   EMQ.ENQUEUE <keys> n {id task payload group max lease delay ttl countdown priority}*n
 *       -> array of n integers: 1 enqueued, 0 duplicate (the row exists), -1 malformed id,
 *          2 the lane holds its max_size (jobs due now only), 3 its lane or the group books
 *          opening it reads cannot be read; an error naming a queue-wide key it writes of
 *          the wrong type (nothing written)
 *   EMQ.CLAIM   <keys> n nonce_prefix
 *       -> array of up to n jobs {id task payload attempts nonce group lease_ms more fence};
 *          job i
 *          gets the nonce prefix..":"..i; empty when the queue is paused or nothing is
 *          serviceable; a row it cannot read is buried in `dead`, a group whose books it
 *          cannot read leaves the ring, and it goes on; an error naming a queue-wide key it
 *          writes of the wrong type (nothing written)
 *   EMQ.ACK     <keys> id attempts nonce result next_nonce
 *       -> {1 done | 0 stale, next job as in claim or nil}; next_nonce '' claims nothing;
 *          a stale ack is counted in BASE.."tally" (field stale_acks);
 *          a workflow step's ack releases the steps waiting for it (a chord's callback
 *          once its last member is in), before the claim of the next job
 *   EMQ.RETRY   <keys> id attempts nonce error delay_ms final
 *       -> 1 retry scheduled, 2 dead, 0 stale; delay '' is the row's own; final '1' kills;
 *          a dead workflow step fails its workflow (as EMQ.REAP's dead path does)
 *   EMQ.EXTEND  <keys> lease_ms {id attempts nonce}*
 *       -> array, per job 1 extended or 0 stale; an extended row's `ran` is its nonce (the
 *          job was seen running)
 *   EMQ.RELEASE <keys> id attempts nonce reason backoff_ms
 *       -> 1 released (attempt rolled back, back in its lane), 0 stale; a back-off > 0 holds
 *          the group in gwait until then (gbackoff)
 *   EMQ.REAP    <keys> limit
 *       -> {returned, dead, now_ms, seen_ms}; a claim never seen running (`ran` is not its
 *          nonce) is given back, at most `max` times (`unrun`); seen is the queue's clock
 *          mark (BASE.."clock" field seen) before the call, 0 for none, raised to now
 *   EMQ.PROMOTE <keys> limit
 *       -> {moved, next_due_in_ms (-1 none, 0 more due now), claimable}; due groups in gwait
 *          go back to the ring, and next_due covers gwait's head too
 *
 * The state transitions are the scripts' to the field (the files of lua/lib explain the ring,
 * the books, the fence, the wake tokens and the time-fair mode's virtual times; src/ follows
 * their helpers one for one, each C file named after the Lua file it twins). The mode switch
 * (lua/fairness.lua) stays Lua-only.
 *
 * Where this differs from the scripts, it is on input they take without a check:
 *   - arity is exact (a script ignores extra ARGV, and extend's partial triple is stale);
 *   - counts (claim n, enqueue n, reap / promote limit) are integers >= 0: a negative
 *     claim n answers [] from the script and a negative LIMIT means "all" there;
 *   - numbers are finite and written as such (a script's tonumber() takes " 5", "0x10",
 *     "inf"; a value it writes back or answers as an integer must be an integer here);
 *     enqueue checks every job's numbers before it writes the first job, where the script
 *     stores them as given and fails later; retry's delay is '' or a number (the script
 *     reads anything else as "the row's own");
 *   - the fixed keys a command always touches are type-checked before its first write;
 *     any other key of the wrong type stops the command where a script would stop too,
 *     with what was written before kept (and replicated), as with a script; claim and
 *     enqueue check what they write and read before writing, as their scripts now do
 *     (lua/lib/claim.lua and lua/lib/enqueue.lua), so a refused call writes nothing;
 *   - a priority, or a release back-off, that is no number counts as 0, as the scripts'
 *     `tonumber(x) or 0`; a non-integral one is stored as %.17g text (what 6.2's scripts
 *     write; 7's and Valkey's write the shortest round-trip text, "0.1" for 0.1), and a
 *     rate whose digits overflow 64 bits is refused (a script reads it as a float);
 *   - a waiting workflow step's splice offset outside its payload is clamped to it (a
 *     script's string.sub reads a negative one from the end);
 *   - error texts are its own.
 * Rows the fence reads, and a duplicate's row, are opened for writing (one lookup, not
 * two): a WATCH on such a row is touched even when nothing changed. Writes through the key
 * API raise no keyspace notifications.
 *
 * Writes go through the low-level key API, each one followed by RedisModule_Replicate of
 * the plain command with the same effect (ZADD, HSET, LMOVE...), never the EMQ.* command
 * itself: the server wraps one call's effects in MULTI/EXEC, so a replica or an AOF replay
 * without this module reproduces the state. RM_Call is used for reads only (SISMEMBER, LINDEX):
 * on 6.2 a replicated RM_Call would be emitted ahead of the RM_Replicate'd effects. The
 * effects are deterministic where a script's are not always: claim's ZPOPMIN goes as
 * ZREM of the id, every EXPIRE as PEXPIREAT of the deadline the primary set.
 *
 * Time is the server's clock, as the scripts' now_ms: TIME seconds*1000 + usec/1000,
 * which is what RedisModule_Milliseconds() computes; read once per call.
 */
/* One translation unit (a unity build): the files of src/ are included here in dependency
 * order, each once, so every function stays static and the compiler inlines across them as
 * it did when they were one file. src/ is split along the seams of lua/lib/<file>.lua (a C file
 * named after the Lua file it twins) plus the command glue (commands, enqueue, lease, sweep,
 * module) and the replicated writes (writes). */
#include "src/common.h"

#include "src/core.c"
#include "src/keys.c"
#include "src/writes.c"
#include "src/wake.c"
#include "src/settings.c"
#include "src/timefair.c"
#include "src/ring.c"
#include "src/place.c"
#include "src/history.c"
#include "src/fence.c"
#include "src/types.c"
#include "src/seat.c"
#include "src/rows.c"
#include "src/books.c"
#include "src/claim.c"
#include "src/workflow.c"
#include "src/jobrow.c"
#include "src/commands.c"
#include "src/enqueue.c"
#include "src/lease.c"
#include "src/sweep.c"
#include "src/abort.c"
#include "src/module.c"
