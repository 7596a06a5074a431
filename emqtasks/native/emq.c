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
 * minute's history hash BASE.."h:"..minute (lib/history.lua hist_*: the same counters), then carry the
 * same prefix, so the same slot and the same ACL key pattern, and never alias a fixed key). Replies are what the script returns
 * through RESP2: Lua tables are arrays, false a nil bulk, numbers integers.
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
 * The state transitions are the scripts' to the field (lua/lib/*.lua explain the ring,
 * the books, the fence, the wake tokens and the time-fair mode's virtual times; this file
 * follows their helpers one for one). The mode switch (lua/fairness.lua) stays Lua-only.
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
#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "emq_api.h"

typedef RedisModuleString RMS;
typedef RedisModuleKey RMK;

#define WAKE_CAP 16
#define WAKE_TTL_MS 60000
#define NOTIFY_MAX 100
#define CLAIM_SKIP_MAX 64

enum {
    K_RING, K_ACTIVE, K_GACTIVE, K_GLIMIT, K_GWEIGHT, K_GTURN, K_GPAUSED, K_PAUSED,
    K_DELAYED, K_DEAD, K_WAKE, K_GUARD, NFIXED
};
static const char *FIXED[NFIXED] = {
    "ring", "active", "gactive", "glimit", "gweight", "gturn", "gpaused", "paused",
    "delayed", "dead", "wake", "guard",
};
/* The type each fixed key must have when it exists; EMPTY: any (never read as a value). */
static const int FIXED_TYPE[NFIXED] = {
    REDISMODULE_KEYTYPE_LIST, REDISMODULE_KEYTYPE_ZSET, REDISMODULE_KEYTYPE_HASH,
    REDISMODULE_KEYTYPE_HASH, REDISMODULE_KEYTYPE_HASH, REDISMODULE_KEYTYPE_HASH,
    REDISMODULE_KEYTYPE_SET, REDISMODULE_KEYTYPE_EMPTY, REDISMODULE_KEYTYPE_ZSET,
    REDISMODULE_KEYTYPE_ZSET, REDISMODULE_KEYTYPE_LIST, REDISMODULE_KEYTYPE_EMPTY,
};

static const char WRONGTYPE[] = "WRONGTYPE Operation against a key holding the wrong kind of value";

/* Strings made once at load: field names and constant values. */
static RMS *F_TASK, *F_PAYLOAD, *F_GROUP, *F_STATE, *F_ATTEMPTS, *F_MAX, *F_LEASE, *F_DELAY,
    *F_TTL, *F_CREATED, *F_NONCE, *F_STARTED, *F_FINISHED, *F_RESULT, *F_ERROR, *F_WAITERS,
    *F_FENCE, *F_PRIO, *F_VCHARGE, *F_WF, *F_NEXT, *F_SLOT, *F_NPEND, *F_IMM, *F_NSLOTS,
    *F_SPLICE, *F_COMMA, *F_CD, *F_FAILED, *F_WAITING, *F_LERR, *F_EMPTY, *F_RAN, *F_UNRUN,
    *F_SEEN, *F_STALE_ACKS;
static RMS *S_ACTIVE, *S_PENDING, *S_DELAYED, *S_DONE, *S_DEAD, *S_ZERO, *S_ONE, *S_D,
    *S_LEASE_EXPIRED, *S_XX, *S_MINUS1, *S_LEFT, *S_RIGHT, *S_WAITING, *S_CANCELLED,
    *S_FAILED, *S_UNRUN;

/* One command call: its context, the fixed keys and the handles open on them. */
typedef struct {
    RedisModuleCtx *ctx;
    RMS **k;               /* the 12 fixed key names */
    RMK *h[NFIXED];        /* open handle (NULL: not open, or opened READ and missing) */
    int mode[NFIXED];      /* 0 not open, READ, or READ|WRITE */
    char bad[NFIXED];      /* found of the wrong type */
    const char *base;
    size_t blen;
    long long now;
    const char *err;       /* the error reply, set by the first failure */
    int dread;             /* gdefaults read (once per call, as the scripts' DEFAULTS) */
    int tmode;             /* the fairness mode, read once per call: 0 unread, 1 turns, 2 time */
    RMS *dflt[6];          /* limit rate max_size weight history hgroups */
    int hstate;            /* history: 0 not read yet, 1 on (hkey, hh open), -1 off */
    RMS *hkey;             /* this minute's history hash, BASE.."h:"..minute */
    RMK *hh;
    long long httl;        /* its expiry, seconds */
    double hcap;           /* groups tracked a minute */
    RMS *hpend[2 * 32];    /* its writes not yet replicated: field, new value */
    int hn;
    long long hexp;        /* its expiry set in this call, not yet replicated (0: none) */
    int full;              /* enqueue on a full server: its first write is refused (OOM) */
    int books;             /* claim_books: 0 unchecked, 1 fine, -2 a key of the wrong type */
    char errbuf[320];      /* an error text of this call that names a key */
} Q;

static int fail(Q *q, const char *msg) {
    if (!q->err) q->err = msg;
    return -1;
}

/* A full server (used memory over maxmemory, policy noeviction). A script there is refused
 * at its first write of a command that may grow memory (deny-oom), and nothing after a first
 * write is refused, so no script stops half-way. The twins behave the same: EMQ.ENQUEUE
 * answers OOM before it writes its first job, as enqueue.lua's first HSET is refused (a
 * batch of duplicates only writes nothing and answers); the verbs that settle, free or move
 * work run, as their scripts do (their first write is one that cannot grow memory, see
 * runs_when_full in lua/lib/core.lua): no command is flagged deny-oom. */
#define OOM_REFUSED "OOM command not allowed when used memory > 'maxmemory'."

static int full(RedisModuleCtx *ctx) {
    return (RedisModule_GetContextFlags(ctx) & REDISMODULE_CTX_FLAGS_OOM) != 0;
}

static void sfree(Q *q, RMS *s) {
    if (s) RedisModule_FreeString(q->ctx, s);
}

static int eq(RMS *a, RMS *b) {
    size_t la, lb;
    const char *pa = RedisModule_StringPtrLen(a, &la), *pb = RedisModule_StringPtrLen(b, &lb);
    return la == lb && memcmp(pa, pb, la) == 0;
}

static int eqc(RMS *a, const char *c) {
    size_t la;
    const char *pa = RedisModule_StringPtrLen(a, &la);
    return la == strlen(c) && memcmp(pa, c, la) == 0;
}

static size_t slen(RMS *s) {
    size_t len;
    RedisModule_StringPtrLen(s, &len);
    return len;
}

/* Numbers as the scripts read them: tonumber() of a stored field or an argument. Lua takes
 * any number; here a value that is written back or answered as an integer must be one. */
static int num(Q *q, RMS *s, double *out, const char *what) {
    long long ll;
    if (RedisModule_StringToLongLong(s, &ll) == REDISMODULE_OK) {
        *out = (double)ll;
        return 0;
    }
    if (RedisModule_StringToDouble(s, out) == REDISMODULE_OK && isfinite(*out)) return 0;
    return fail(q, what);
}

/* A double as the scripts' integer reply makes it (truncated), clamped where C's cast
 * would be undefined. */
static long long to_ll(double d) {
    if (d >= 9.2e18) return 9200000000000000000LL;
    if (d <= -9.2e18) return -9200000000000000000LL;
    return (long long)d;
}

static int integer(Q *q, RMS *s, long long *out, const char *what) {
    if (RedisModule_StringToLongLong(s, out) == REDISMODULE_OK) return 0;
    return fail(q, what);
}

/* int_ok: integer text as every writer stores it: "0", or an optional '-' and 1 to 15
 * digits without a leading zero (the scripts' int_ok, to the byte). */
static int int_ok(RMS *s) {
    size_t len;
    const char *p = RedisModule_StringPtrLen(s, &len);
    if (len == 1 && p[0] == '0') return 1;
    size_t i = len > 0 && p[0] == '-' ? 1 : 0;
    if (len - i < 1 || len - i > 15 || p[i] < '1' || p[i] > '9') return 0;
    for (; i < len; i++)
        if (p[i] < '0' || p[i] > '9') return 0;
    return 1;
}

/* An int_ok value as a number (NULL: 0). */
static double int_val(RMS *s) {
    long long v = 0;
    if (s) RedisModule_StringToLongLong(s, &v);
    return (double)v;
}

/* Doubles replicated as text the way the scripts format numbers: integers exactly. */
static const char *fmt_num(double d, char buf[40]) {
    if (d == floor(d) && fabs(d) < 9007199254740992.0)
        snprintf(buf, 40, "%lld", (long long)d);
    else
        snprintf(buf, 40, "%.17g", d);
    return buf;
}

/* ---- keys ------------------------------------------------------------------------- */

static int type_ok(RMK *h, int type) {
    int t = RedisModule_KeyType(h);
    if (type == REDISMODULE_KEYTYPE_EMPTY) return 1;
    return t == REDISMODULE_KEYTYPE_EMPTY || t == type;
}

/* The handle of fixed key i, opened READ (NULL when missing) or READ|WRITE, its type
 * checked on the first open; NULL with q->err set when the key has the wrong type. Each
 * key is opened once per call in the mode the command needs (a READ handle is reopened
 * only on the rare path that then writes), since every open is a lookup. */
static RMK *fx(Q *q, int i, int write) {
    int want = write ? (REDISMODULE_READ | REDISMODULE_WRITE) : REDISMODULE_READ;
    if (q->bad[i]) {
        fail(q, WRONGTYPE);
        return NULL;
    }
    if (q->mode[i] && (q->mode[i] & want) == want) return q->h[i];
    if (q->h[i]) RedisModule_CloseKey(q->h[i]);
    q->h[i] = RedisModule_OpenKey(q->ctx, q->k[i], want);
    q->mode[i] = want;
    if (!type_ok(q->h[i], FIXED_TYPE[i])) {
        RedisModule_CloseKey(q->h[i]);
        q->h[i] = NULL;
        q->bad[i] = 1;
        fail(q, WRONGTYPE);
    }
    return q->h[i];
}

static void hist_flush(Q *q);

static void close_all(Q *q) {
    if (q->hstate == 1) hist_flush(q);
    for (int i = 0; i < NFIXED; i++)
        if (q->h[i]) RedisModule_CloseKey(q->h[i]);
    for (int i = 0; i < 6; i++)
        if (q->dflt[i]) RedisModule_FreeString(q->ctx, q->dflt[i]);
    if (q->hh) RedisModule_CloseKey(q->hh);
    if (q->hkey) RedisModule_FreeString(q->ctx, q->hkey);
}

#define B(i) (1u << (i))

/* Check the 12 keys are BASE..FIXED[i]; open (and type-check) the fixed keys the command
 * always writes (wmask) and reads (rmask) before it changes anything. Others open when
 * first touched. */
static int q_init(Q *q, RedisModuleCtx *ctx, RMS **argv, unsigned wmask, unsigned rmask) {
    memset(q, 0, sizeof *q);
    q->ctx = ctx;
    q->k = argv + 1;
    size_t len;
    const char *ring = RedisModule_StringPtrLen(q->k[K_RING], &len);
    if (len < 4 || memcmp(ring + len - 4, "ring", 4) != 0)
        return fail(q, "ERR emq: KEYS must be the queue's 12 fixed keys in order");
    q->base = ring;
    q->blen = len - 4;
    for (int i = 1; i < NFIXED; i++) {
        size_t l;
        const char *p = RedisModule_StringPtrLen(q->k[i], &l);
        size_t nl = strlen(FIXED[i]);
        if (l != q->blen + nl || memcmp(p, q->base, q->blen) != 0 ||
            memcmp(p + q->blen, FIXED[i], nl) != 0)
            return fail(q, "ERR emq: KEYS must be the queue's 12 fixed keys in order");
    }
    for (int i = 0; i < NFIXED; i++)
        if (wmask & B(i)) fx(q, i, 1);
        else if (rmask & B(i)) fx(q, i, 0);
    q->now = RedisModule_Milliseconds();
    return q->err ? -1 : 0;
}

/* BASE..mid..s..suffix, the name of a job row, lane or done list. */
static RMS *mkname(Q *q, const char *mid, RMS *s, const char *suffix) {
    size_t sl, ml = strlen(mid), xl = strlen(suffix);
    const char *sp = RedisModule_StringPtrLen(s, &sl);
    size_t total = q->blen + ml + sl + xl;
    char stackbuf[512];
    char *buf = total <= sizeof stackbuf ? stackbuf : RedisModule_Alloc(total);
    memcpy(buf, q->base, q->blen);
    memcpy(buf + q->blen, mid, ml);
    memcpy(buf + q->blen + ml, sp, sl);
    memcpy(buf + q->blen + ml + sl, suffix, xl);
    RMS *name = RedisModule_CreateString(q->ctx, buf, total);
    if (buf != stackbuf) RedisModule_Free(buf);
    return name;
}

static RMS *job_key(Q *q, RMS *id) { return mkname(q, "job:", id, ""); }
static RMS *lane_key(Q *q, RMS *g) { return mkname(q, "g:", g, ":pending"); }
static RMS *starts_key(Q *q, RMS *g) { return mkname(q, "g:", g, ":starts"); }

/* BASE..name: the fairness controls' books (grate gmax gdefaults gbackoff gwait). */
static RMS *book_key(Q *q, const char *name) {
    size_t nl = strlen(name);
    char buf[600];
    char *b = q->blen + nl <= sizeof buf ? buf : RedisModule_Alloc(q->blen + nl);
    memcpy(b, q->base, q->blen);
    memcpy(b + q->blen, name, nl);
    RMS *s = RedisModule_CreateString(q->ctx, b, q->blen + nl);
    if (b != buf) RedisModule_Free(b);
    return s;
}
#define PRIO_SPAN 1e13

/* A key the command formed itself, opened with a type check; *h NULL when READ and missing. */
static int dk(Q *q, RMS *name, int write, int type, RMK **h) {
    *h = RedisModule_OpenKey(q->ctx, name, write ? REDISMODULE_READ | REDISMODULE_WRITE
                                                 : REDISMODULE_READ);
    if (!type_ok(*h, type)) {
        RedisModule_CloseKey(*h);
        *h = NULL;
        return fail(q, WRONGTYPE);
    }
    return 0;
}

static size_t vlen(RMK *h) { return h ? RedisModule_ValueLength(h) : 0; }

static RMS *hget(RMK *h, RMS *field) {
    RMS *v = NULL;
    if (h) RedisModule_HashGet(h, REDISMODULE_HASH_NONE, field, &v, NULL);
    return v;
}

/* The lowest member of a zset (ZRANGE key 0 0), or NULL; its score in *score. */
static RMS *zfirst(RMK *h, double *score) {
    if (!h || RedisModule_ZsetFirstInScoreRange(h, -INFINITY, INFINITY, 0, 0) != REDISMODULE_OK)
        return NULL;
    RMS *m = NULL;
    if (!RedisModule_ZsetRangeEndReached(h)) m = RedisModule_ZsetRangeCurrentElement(h, score);
    RedisModule_ZsetRangeStop(h);
    return m;
}

/* ---- writes, each replicated as the plain command ------------------------------------ */

static int zadd(Q *q, RMK *h, RMS *key, double score, RMS *member, int xx) {
    int flags = xx ? REDISMODULE_ZADD_XX : 0;
    char buf[40];
    if (!h) return -1;
    if (RedisModule_ZsetAdd(h, score, member, &flags) != REDISMODULE_OK)
        return fail(q, "ERR emq: ZADD failed");
    if (flags & (REDISMODULE_ZADD_ADDED | REDISMODULE_ZADD_UPDATED)) {
        /* An integral score goes as 'l': no formatting, and the same text. */
        int integral = score == floor(score) && fabs(score) < 9007199254740992.0;
        if (xx && integral)
            RedisModule_Replicate(q->ctx, "ZADD", "ssls", key, S_XX, (long long)score, member);
        else if (xx)
            RedisModule_Replicate(q->ctx, "ZADD", "sscs", key, S_XX, fmt_num(score, buf), member);
        else if (integral)
            RedisModule_Replicate(q->ctx, "ZADD", "sls", key, (long long)score, member);
        else
            RedisModule_Replicate(q->ctx, "ZADD", "scs", key, fmt_num(score, buf), member);
    }
    return 0;
}

static int zrem(Q *q, RMK *h, RMS *key, RMS *member) {
    int deleted = 0;
    if (!h) return -1;
    if (RedisModule_ZsetRem(h, member, &deleted) != REDISMODULE_OK)
        return fail(q, "ERR emq: ZREM failed");
    if (deleted) RedisModule_Replicate(q->ctx, "ZREM", "ss", key, member);
    return deleted;
}

/* A hash field as HINCRBY reads it: absent is 0, anything but an integer refuses. */
static int hint(Q *q, RMK *h, RMS *field, long long *v) {
    if (q->err) return -1;               /* the handle is NULL for a key of the wrong type */
    RMS *cur = hget(h, field);
    *v = 0;
    int ok = !cur || RedisModule_StringToLongLong(cur, v) == REDISMODULE_OK;
    sfree(q, cur);
    return ok ? 0 : fail(q, "ERR hash value is not an integer");
}

static int hincr_from(Q *q, RMK *h, RMS *key, RMS *field, long long v, long long by,
                      long long *out);

/* HINCRBY: the current value must be an integer, as the server's own command insists. */
static int hincrby(Q *q, RMK *h, RMS *key, RMS *field, long long by, long long *out) {
    long long v;
    if (!h || hint(q, h, field, &v) < 0) return -1;
    return hincr_from(q, h, key, field, v, by, out);
}

/* The write half of HINCRBY, from a current value already read with hint(). */
static int hincr_from(Q *q, RMK *h, RMS *key, RMS *field, long long v, long long by,
                      long long *out) {
    if ((by > 0 && v > LLONG_MAX - by) || (by < 0 && v < LLONG_MIN - by))
        return fail(q, "ERR increment or decrement would overflow");
    v += by;
    RMS *nv = RedisModule_CreateStringFromLongLong(q->ctx, v);
    RedisModule_HashSet(h, REDISMODULE_HASH_NONE, field, nv, NULL);
    sfree(q, nv);
    RedisModule_Replicate(q->ctx, "HINCRBY", "ssl", key, field, by);
    *out = v;
    return 0;
}

static void hset1(Q *q, RMK *h, RMS *key, RMS *field, RMS *val) {
    RedisModule_HashSet(h, REDISMODULE_HASH_NONE, field, val, NULL);
    RedisModule_Replicate(q->ctx, "HSET", "sss", key, field, val);
}

static int hdel(Q *q, RMK *h, RMS *key, RMS *field) {
    if (!h || !RedisModule_KeyType(h)) return 0;
    if (RedisModule_HashSet(h, REDISMODULE_HASH_NONE, field, REDISMODULE_HASH_DELETE, NULL) > 0) {
        RedisModule_Replicate(q->ctx, "HDEL", "ss", key, field);
        return 1;
    }
    return 0;
}

/* HDEL on fixed key i, opened for writing only when the field is there. */
static int hdel_fx(Q *q, int i, RMS *field) {
    RMK *h = fx(q, i, 0);
    int exists = 0;
    if (!h || !RedisModule_ValueLength(h)) return 0;
    RedisModule_HashGet(h, REDISMODULE_HASH_EXISTS, field, &exists, NULL);
    return exists ? hdel(q, fx(q, i, 1), q->k[i], field) : 0;
}

static int rpush(Q *q, RMK *h, RMS *key, RMS *val) {
    if (!h) return -1;
    if (RedisModule_ListPush(h, REDISMODULE_LIST_TAIL, val) != REDISMODULE_OK)
        return fail(q, "ERR emq: RPUSH failed");
    RedisModule_Replicate(q->ctx, "RPUSH", "ss", key, val);
    return 0;
}

/* EXPIRE key secs, at an absolute time so that the replica's deadline is the primary's. */
static int expire_at(Q *q, RMK *h, RMS *key, long long at_ms) {
    if (!h) return -1;
    int rc = RedisModule_SetAbsExpire ? RedisModule_SetAbsExpire(h, at_ms)
                                      : RedisModule_SetExpire(h, at_ms - q->now);
    if (rc != REDISMODULE_OK) return fail(q, "ERR emq: EXPIRE failed");
    RedisModule_Replicate(q->ctx, "PEXPIREAT", "sl", key, at_ms);
    return 0;
}

/* ---- lua/lib/*.lua, helper for helper ---------------------------------------------- */

/* A readiness token; 'd' tokens fill at most half the list, so a '1' always fits. */
static int wake(Q *q, int due) {
    size_t cap = due ? WAKE_CAP / 2 : WAKE_CAP;
    if (vlen(fx(q, K_WAKE, 0)) >= cap) return 0;
    RMK *w = fx(q, K_WAKE, 1);
    if (rpush(q, w, q->k[K_WAKE], due ? S_D : S_ONE) < 0) return -1;
    return expire_at(q, w, q->k[K_WAKE], q->now + WAKE_TTL_MS);
}

/* Schedule an id in `delayed`; if it is now the earliest entry, tell the parked masters. */
static int delay_push(Q *q, RMS *id, double due) {
    RMK *d = fx(q, K_DELAYED, 1);
    if (zadd(q, d, q->k[K_DELAYED], due, id, 0) < 0) return -1;
    double s;
    RMS *first = zfirst(d, &s);
    int is_first = first && eq(first, id);
    sfree(q, first);
    return is_first ? wake(q, 1) : 0;
}

/* A job reached an end: one token per client blocked in get() on it (at most 100). */
static int notify(Q *q, RMS *id, RMS *waiters) {
    long long n = waiters && int_ok(waiters) ? (long long)int_val(waiters) : 0;
    if (n > NOTIFY_MAX) n = NOTIFY_MAX;
    if (n <= 0) return 0;
    RMS *key = mkname(q, "done:", id, "");
    RMK *h;
    int rc = dk(q, key, 1, REDISMODULE_KEYTYPE_LIST, &h);
    for (long long i = 0; rc == 0 && i < n; i++) rc = rpush(q, h, key, S_ONE);
    if (rc == 0) rc = expire_at(q, h, key, q->now + 60000);
    RedisModule_CloseKey(h);
    sfree(q, key);
    return rc;
}

/* SISMEMBER gpaused g, without a call when no group is paused (the common case). */
static int group_paused(Q *q, RMS *g, int *paused) {
    *paused = 0;
    RMK *h = fx(q, K_GPAUSED, 0);
    if (q->err) return -1;
    if (vlen(h) == 0) return 0;
    /* The call looks the key up itself (and may expire it): no handle of ours stays open. */
    RedisModule_CloseKey(q->h[K_GPAUSED]);
    q->h[K_GPAUSED] = NULL;
    q->mode[K_GPAUSED] = 0;
    RedisModuleCallReply *r = RedisModule_Call(q->ctx, "SISMEMBER", "ss", q->k[K_GPAUSED], g);
    if (!r || RedisModule_CallReplyType(r) != REDISMODULE_REPLY_INTEGER) {
        if (r) RedisModule_FreeCallReply(r);
        return fail(q, WRONGTYPE);
    }
    *paused = RedisModule_CallReplyInteger(r) != 0;
    RedisModule_FreeCallReply(r);
    return 0;
}

static RMS *mk_tmp(Q *q, const char *c) { return RedisModule_CreateString(q->ctx, c, strlen(c)); }

/* HGET BASE..book field (the key type-checked), or NULL. */
static int book_get(Q *q, const char *book, RMS *field, RMS **out) {
    RMS *key = book_key(q, book);
    RMK *h;
    *out = NULL;
    int rc = dk(q, key, 0, REDISMODULE_KEYTYPE_HASH, &h);
    if (rc == 0) *out = hget(h, field);
    if (h) RedisModule_CloseKey(h);
    sfree(q, key);
    return rc;
}

enum { D_LIMIT, D_RATE, D_MAX_SIZE, D_WEIGHT, D_HISTORY, D_HGROUPS };

/* gdefaults, read once per call (the scripts' DEFAULTS). */
static int read_defaults(Q *q) {
    if (q->dread) return 0;
    RMS *key = book_key(q, "gdefaults");
    RMK *h;
    int rc = dk(q, key, 0, REDISMODULE_KEYTYPE_HASH, &h);
    sfree(q, key);
    if (rc < 0) return -1;
    if (h && RedisModule_KeyType(h) != REDISMODULE_KEYTYPE_EMPTY) {
        RMS *l = mk_tmp(q, "limit"), *r = mk_tmp(q, "rate"), *m = mk_tmp(q, "max_size"),
            *w = mk_tmp(q, "weight"), *hi = mk_tmp(q, "history"), *hg = mk_tmp(q, "hgroups");
        RedisModule_HashGet(h, REDISMODULE_HASH_NONE, l, &q->dflt[D_LIMIT], r,
                            &q->dflt[D_RATE], m, &q->dflt[D_MAX_SIZE], w,
                            &q->dflt[D_WEIGHT], hi, &q->dflt[D_HISTORY], hg,
                            &q->dflt[D_HGROUPS], NULL);
        sfree(q, l); sfree(q, r); sfree(q, m); sfree(q, w); sfree(q, hi); sfree(q, hg);
    }
    if (h) RedisModule_CloseKey(h);
    q->dread = 1;
    return 0;
}

/* A group's own setting (fixed key i or a book), else the default for every group (gdefaults,
 * read once per call), else NULL: limit_of, rate_of, max_size_of, weight_of. */
static int setting(Q *q, int fixed, const char *book, RMS *g, int d, RMS **out) {
    *out = NULL;
    if (fixed >= 0) {
        RMK *h = fx(q, fixed, 0);
        if (q->err) return -1;
        *out = hget(h, g);
    } else if (book_get(q, book, g, out) < 0) {
        return -1;
    }
    if (*out) return 0;
    if (read_defaults(q) < 0) return -1;
    if (q->dflt[d]) *out = RedisModule_CreateStringFromString(q->ctx, q->dflt[d]);
    return 0;
}

/* A group's limit (*has 0: none), and its jobs in flight. */
static int limit_of(Q *q, RMS *g, int *has, double *lim) {
    RMS *l;
    *has = 0;
    if (setting(q, K_GLIMIT, NULL, g, D_LIMIT, &l) < 0) return -1;
    *has = l != NULL;
    int rc = l ? num(q, l, lim, "ERR emq: a group limit is not a number") : 0;
    sfree(q, l);
    return rc;
}

static int weight_of(Q *q, RMS *g, double *w) {
    RMS *s;
    *w = 1;
    if (setting(q, K_GWEIGHT, NULL, g, D_WEIGHT, &s) < 0) return -1;
    int rc = s ? num(q, s, w, "ERR emq: a group weight is not a number") : 0;
    sfree(q, s);
    return rc;
}

/* (max_jobs, per_ms), *has 0 when none (or not "digits:digits", as the script's match). */
static int rate_of(Q *q, RMS *g, int *has, long long *m, long long *per) {
    RMS *s;
    *has = 0;
    if (setting(q, -1, "grate", g, D_RATE, &s) < 0) return -1;
    if (!s) return 0;
    size_t len;
    const char *p = RedisModule_StringPtrLen(s, &len);
    size_t i = 0, a = 0, b;
    long long x = 0, y = 0;
    int ovf = 0;
    while (i < len && p[i] >= '0' && p[i] <= '9') {
        if (x > (LLONG_MAX - 9) / 10) ovf = 1; else x = x * 10 + (p[i] - '0');
        i++;
    }
    a = i;
    if (a > 0 && i < len && p[i] == ':') {
        b = ++i;
        while (i < len && p[i] >= '0' && p[i] <= '9') {
            if (y > (LLONG_MAX - 9) / 10) ovf = 1; else y = y * 10 + (p[i] - '0');
            i++;
        }
        if (i > b && i == len) {
            if (ovf) {
                sfree(q, s);
                return fail(q, "ERR emq: a group rate is out of range");
            }
            *has = 1;
            *m = x;
            *per = y;
        }
    }
    sfree(q, s);
    return 0;
}

/* LINDEX key i, a read (no handle of ours stays open on the key). */
static int lindex(Q *q, RMS *key, long long i, RMS **out) {
    *out = NULL;
    RedisModuleCallReply *r = RedisModule_Call(q->ctx, "LINDEX", "sl", key, i);
    if (!r) return fail(q, WRONGTYPE);
    int t = RedisModule_CallReplyType(r);
    if (t == REDISMODULE_REPLY_STRING) {
        *out = RedisModule_CreateStringFromCallReply(r);
    } else if (t != REDISMODULE_REPLY_NULL) {
        RedisModule_FreeCallReply(r);
        return fail(q, WRONGTYPE);
    }
    RedisModule_FreeCallReply(r);
    return 0;
}

/* When the group's rate budget allows its next start (*has 1, *at ms), or *has 0 now. */
static int rate_ready(Q *q, RMS *g, int *has, double *at) {
    int rated;
    long long m, per;
    *has = 0;
    if (rate_of(q, g, &rated, &m, &per) < 0) return -1;
    if (!rated) return 0;
    RMS *key = starts_key(q, g), *o;
    int rc = lindex(q, key, m - 1, &o);
    sfree(q, key);
    if (rc < 0) return -1;
    double oldest;
    if (o && RedisModule_StringToDouble(o, &oldest) == REDISMODULE_OK && isfinite(oldest) &&
        oldest + (double)per > (double)q->now) {
        *has = 1;
        *at = oldest + (double)per;
    }
    sfree(q, o);
    return 0;
}

/* When the group may start its next job: its rate budget and a back-off (RateLimited). */
static int ready_at(Q *q, RMS *g, int *has, double *at) {
    if (rate_ready(q, g, has, at) < 0) return -1;
    RMS *key = book_key(q, "gbackoff"), *v;
    RMK *h;
    int rc = dk(q, key, 0, REDISMODULE_KEYTYPE_HASH, &h);
    v = rc == 0 ? hget(h, g) : NULL;
    double off;
    if (v && RedisModule_StringToDouble(v, &off) == REDISMODULE_OK && !isnan(off)) {
        if (off <= (double)q->now) {
            RedisModule_CloseKey(h);
            rc = dk(q, key, 1, REDISMODULE_KEYTYPE_HASH, &h);
            if (rc == 0) hdel(q, h, key, g);
        } else if (!*has || off > *at) {
            *has = 1;
            *at = off;
        }
    }
    if (h) RedisModule_CloseKey(h);
    sfree(q, v);
    sfree(q, key);
    return rc;
}

static int gactive_of(Q *q, RMS *g, double *act) {
    RMK *h = fx(q, K_GACTIVE, 0);
    RMS *a = hget(h, g);
    *act = 0;
    if (q->err) return -1;
    int rc = a ? num(q, a, act, "ERR emq: a gactive count is not a number") : 0;
    sfree(q, a);
    return rc;
}

static int under_limit(Q *q, RMS *g, int *ok) {
    int has;
    double lim, act;
    *ok = 1;
    if (limit_of(q, g, &has, &lim) < 0) return -1;
    if (!has) return 0;
    if (gactive_of(q, g, &act) < 0) return -1;
    *ok = act < lim;
    return 0;
}

/* ---- the time-fair mode (lua/lib/timefair.lua, "Fair share of worker time") --------- */

#define DEFAULT_COST 10000.0   /* us: the first guess of a queue that has run nothing */

/* time_fair(): GET BASE.."fairness" == "time", read once per call; -1 error. */
static int time_fair(Q *q) {
    if (q->tmode) return q->tmode == 2;
    RMS *key = book_key(q, "fairness");
    RMK *h = RedisModule_OpenKey(q->ctx, key, REDISMODULE_READ);
    int absent = !h || RedisModule_KeyType(h) == REDISMODULE_KEYTYPE_EMPTY;
    if (h) RedisModule_CloseKey(h);
    if (absent) {                                /* turns: no call needed */
        sfree(q, key);
        q->tmode = 1;
        return 0;
    }
    RedisModuleCallReply *r = RedisModule_Call(q->ctx, "GET", "s", key);
    sfree(q, key);
    if (!r) return fail(q, WRONGTYPE);
    int t = RedisModule_CallReplyType(r);
    q->tmode = 1;
    if (t == REDISMODULE_REPLY_STRING) {
        RMS *v = RedisModule_CreateStringFromCallReply(r);
        if (eqc(v, "time")) q->tmode = 2;
        sfree(q, v);
    } else if (t != REDISMODULE_REPLY_NULL) {
        RedisModule_FreeCallReply(r);
        q->tmode = 0;
        return fail(q, WRONGTYPE);
    }
    RedisModule_FreeCallReply(r);
    return q->tmode == 2;
}

/* tonumber(HGET BASE..book field): *has 0 when absent or no number. */
static int book_num(Q *q, const char *book, RMS *field, int *has, double *v) {
    RMS *s;
    *has = 0;
    if (book_get(q, book, field, &s) < 0) return -1;
    if (s && RedisModule_StringToDouble(s, v) == REDISMODULE_OK && !isnan(*v)) *has = 1;
    sfree(q, s);
    return 0;
}

/* HSET BASE..book field <integer text>. */
static int book_set_ll(Q *q, const char *book, RMS *field, long long v) {
    RMS *key = book_key(q, book), *val = RedisModule_CreateStringFromLongLong(q->ctx, v);
    RMK *h;
    int rc = dk(q, key, 1, REDISMODULE_KEYTYPE_HASH, &h);
    if (rc == 0) {
        RedisModule_HashSet(h, REDISMODULE_HASH_NONE, field, val, NULL);
        RedisModule_Replicate(q->ctx, "HSET", "sss", key, field, val);
    }
    if (h) RedisModule_CloseKey(h);
    sfree(q, val);
    sfree(q, key);
    return rc;
}

/* ZADD BASE.."gvt" [XX] v g; ZREM BASE.."gvt" g. */
static int gvt_add(Q *q, RMS *g, double v, int xx) {
    RMS *key = book_key(q, "gvt");
    RMK *h;
    int rc = dk(q, key, 1, REDISMODULE_KEYTYPE_ZSET, &h);
    if (rc == 0 && !(xx && RedisModule_KeyType(h) == REDISMODULE_KEYTYPE_EMPTY))
        rc = zadd(q, h, key, v, g, xx);
    if (h) RedisModule_CloseKey(h);
    sfree(q, key);
    return rc;
}

static int gvt_rem(Q *q, RMS *g) {
    RMS *key = book_key(q, "gvt");
    RMK *h;
    int rc = dk(q, key, 0, REDISMODULE_KEYTYPE_ZSET, &h);
    if (rc == 0 && h) {
        double s;
        if (RedisModule_ZsetScore(h, g, &s) == REDISMODULE_OK) {
            RedisModule_CloseKey(h);
            rc = dk(q, key, 1, REDISMODULE_KEYTYPE_ZSET, &h);
            if (rc == 0) rc = zrem(q, h, key, g) < 0 ? -1 : 0;
        }
    }
    if (h) RedisModule_CloseKey(h);
    sfree(q, key);
    return rc;
}

/* vstart: the later of the group's virtual time and the floor gvrun['']. */
static int vstart(Q *q, RMS *g, double *v) {
    int hf, ho;
    double floor_v = 0, own = 0;
    if (book_num(q, "gvrun", F_EMPTY, &hf, &floor_v) < 0) return -1;
    if (!hf) floor_v = 0;
    if (book_num(q, "gvrun", g, &ho, &own) < 0) return -1;
    *v = ho && own > floor_v ? own : floor_v;
    return 0;
}

/* An entering group: on the ring (turns), or in gvt at vstart (time). */
static int ring_push(Q *q, RMS *g) {
    int tf = time_fair(q);
    if (tf < 0) return -1;
    if (!tf) return rpush(q, fx(q, K_RING, 1), q->k[K_RING], g);
    double v;
    if (vstart(q, g, &v) < 0) return -1;
    long long vi = (long long)v;
    if (gvt_add(q, g, (double)vi, 0) < 0) return -1;
    return book_set_ll(q, "gvrun", g, vi);
}

/* ring_size(): the serviceable groups of the queue's mode. */
static int ring_size(Q *q, size_t *n) {
    int tf = time_fair(q);
    *n = 0;
    if (tf < 0) return -1;
    if (!tf) {
        *n = vlen(fx(q, K_RING, 0));
        return q->err ? -1 : 0;
    }
    RMS *key = book_key(q, "gvt");
    RMK *h;
    int rc = dk(q, key, 0, REDISMODULE_KEYTYPE_ZSET, &h);
    *n = vlen(h);
    if (h) RedisModule_CloseKey(h);
    sfree(q, key);
    return rc;
}

/* busy_add: HINCRBY key slot ms; a new slot clears those six to eleven slots back and sets
 * PEXPIRE key 70000. */
static int busy_add(Q *q, RMS *key, long long ms) {
    RMK *h;
    long long slot = (long long)floor((double)q->now / 10000.0), v;
    int rc = dk(q, key, 1, REDISMODULE_KEYTYPE_HASH, &h);
    RMS *f = RedisModule_CreateStringFromLongLong(q->ctx, slot);
    if (rc == 0) rc = hincrby(q, h, key, f, ms, &v);
    sfree(q, f);
    if (rc == 0 && v == ms) {
        for (long long back = 6; back <= 11; back++) {
            RMS *old = RedisModule_CreateStringFromLongLong(q->ctx, slot - back);
            hdel(q, h, key, old);
            sfree(q, old);
        }
        rc = expire_at(q, h, key, q->now + 70000);
    }
    if (h) RedisModule_CloseKey(h);
    return rc;
}

/* time_settle: a job charged in time mode (vcharge on its row) leaves flight; call before
 * the row changes, with the id still in `active`. */
static int time_settle(Q *q, RMS *g, RMS *id, RMK *row, RMS *row_key, RMS *started,
                       RMS *vcharge, int sample) {
    if (!vcharge) return 0;
    double deadline = (double)q->now, st = (double)q->now, w = 1, vc;
    RMK *a = fx(q, K_ACTIVE, 0);
    if (q->err) return -1;
    if (a) {
        double s;
        if (RedisModule_ZsetScore(a, id, &s) == REDISMODULE_OK) deadline = s;
    }
    if (started && (RedisModule_StringToDouble(started, &st) != REDISMODULE_OK || isnan(st)))
        st = (double)q->now;
    double end = (double)q->now < deadline ? (double)q->now : deadline;
    double used = end - st > 0 ? end - st : 0;
    if (num(q, vcharge, &vc, "ERR emq: a job row's vcharge is not a number") < 0) return -1;
    if (weight_of(q, g, &w) < 0) return -1;
    hdel(q, row, row_key, F_VCHARGE);
    double paid = floor(used * 1000 / w);
    double delta = (paid > 1 ? paid : 1) - vc;      /* every job costs at least 1 us */
    if (delta != 0) {
        int has;
        double own = 0, floor_v = 0;
        if (book_num(q, "gvrun", g, &has, &own) < 0) return -1;
        if (!has) own = 0;
        double v = own + delta;
        if (delta < 0) {
            /* a refund stops just past the floor and never raises a group: as timefair.lua */
            if (book_num(q, "gvrun", F_EMPTY, &has, &floor_v) < 0) return -1;
            if (!has) floor_v = 0;
            double least = own < floor_v + 1 ? own : floor_v + 1;
            if (v < least) v = least;
        }
        long long vi = to_ll(v);
        if (book_set_ll(q, "gvrun", g, vi) < 0 || gvt_add(q, g, (double)vi, 1) < 0) return -1;
    }
    if (sample) {
        RMS *who[2] = {g, F_EMPTY};
        for (int i = 0; i < 2; i++) {
            int has;
            double est, nv = used * 1000;
            if (book_num(q, "gcost", who[i], &has, &est) < 0) return -1;
            if (has) nv = floor((3 * est + used * 1000) / 4);
            if (book_set_ll(q, "gcost", who[i], to_ll(nv)) < 0) return -1;
        }
    }
    if (used > 0) {
        RMS *bk = mkname(q, "g:", g, ":busy"), *qk = book_key(q, "busy");
        int rc = busy_add(q, bk, to_ll(used));
        if (rc == 0) rc = busy_add(q, qk, to_ll(used));
        sfree(q, bk);
        sfree(q, qk);
        if (rc < 0) return -1;
    }
    return 0;
}

/* time_charge: a claim in time mode from g (virtual time vs) is charged its estimated cost
 * over the group's weight; the floor rises to vs. */
static int time_charge(Q *q, RMS *g, double vs, double w, double est, RMK *job, RMS *jkey) {
    double charge = floor(est / w);
    if (!(charge > 1)) charge = 1;                  /* math.max(1, ...): at least 1 us */
    long long v = (long long)(vs + charge);
    int hf;
    double floor_v = 0;
    if (gvt_add(q, g, (double)v, 0) < 0 || book_set_ll(q, "gvrun", g, v) < 0) return -1;
    if (book_num(q, "gvrun", F_EMPTY, &hf, &floor_v) < 0) return -1;
    if (!hf) floor_v = 0;
    if (vs > floor_v && book_set_ll(q, "gvrun", F_EMPTY, (long long)vs) < 0) return -1;
    RMS *c = RedisModule_CreateStringFromLongLong(q->ctx, (long long)charge);
    RedisModule_HashSet(job, REDISMODULE_HASH_NONE, F_VCHARGE, c, NULL);
    RedisModule_Replicate(q->ctx, "HSET", "sss", jkey, F_VCHARGE, c);
    sfree(q, c);
    return 0;
}

static int ring_enter(Q *q, RMS *g) {
    if (ring_push(q, g) < 0) return -1;
    hdel_fx(q, K_GTURN, g);
    return wake(q, 0);
}

/* Hold an open group back until `at`; a new earliest return re-times the parked masters. */
static int wait_push(Q *q, RMS *g, double at) {
    RMS *key = book_key(q, "gwait");
    RMK *h;
    int rc = dk(q, key, 1, REDISMODULE_KEYTYPE_ZSET, &h);
    if (rc == 0) rc = zadd(q, h, key, at, g, 0);
    int first = 0;
    if (rc == 0) {
        double s;
        RMS *f = zfirst(h, &s);
        first = f && eq(f, g);
        sfree(q, f);
    }
    if (h) RedisModule_CloseKey(h);
    sfree(q, key);
    return rc < 0 ? -1 : first ? wake(q, 1) : 0;
}

/* An open group goes on the ring, or in gwait while it may not start yet. */
static int admit(Q *q, RMS *g) {
    int has;
    double at;
    if (ready_at(q, g, &has, &at) < 0) return -1;
    return has ? wait_push(q, g, at) : ring_enter(q, g);
}

/* ring_leave for a group known to stand at the head (from_tail false) or the tail: LREM
 * with count 1 / -1 finds it in one step, so here it is a pop from that end. */
static int ring_leave(Q *q, RMS *g, int from_tail) {
    int tf = time_fair(q);
    if (tf < 0) return -1;
    if (tf) {
        if (gvt_rem(q, g) < 0) return -1;
        hdel_fx(q, K_GTURN, g);
        return 0;
    }
    RMK *r = fx(q, K_RING, 1);
    int end = from_tail ? REDISMODULE_LIST_TAIL : REDISMODULE_LIST_HEAD;
    if (!r) return -1;
    RMS *got = RedisModule_ListPop(r, end);
    if (!got) return fail(q, "ERR emq: the ring is empty where a group should stand");
    if (!eq(got, g)) {
        RedisModule_ListPush(r, end, got);
        sfree(q, got);
        return fail(q, "ERR emq: the ring changed under a claim");
    }
    sfree(q, got);
    RedisModule_Replicate(q->ctx, "LREM", "sss", q->k[K_RING], from_tail ? S_MINUS1 : S_ONE, g);
    hdel_fx(q, K_GTURN, g);
    return 0;
}

/* ring_leave(g, nil): LREM ring 0 g, a scan of the whole ring (back-offs only), in order. */
static int ring_leave_scan(Q *q, RMS *g) {
    int tf = time_fair(q);
    if (tf < 0) return -1;
    if (tf) return ring_leave(q, g, 0);
    RMK *r = fx(q, K_RING, 0);
    if (q->err) return -1;
    size_t n = vlen(r), removed = 0;
    if (n > 0) {
        r = fx(q, K_RING, 1);
        if (!r) return -1;
        for (size_t i = 0; i < n; i++) {
            RMS *e = RedisModule_ListPop(r, REDISMODULE_LIST_HEAD);
            if (!e) break;
            if (eq(e, g)) removed++;
            else RedisModule_ListPush(r, REDISMODULE_LIST_TAIL, e);
            sfree(q, e);
        }
    }
    if (removed) RedisModule_Replicate(q->ctx, "LREM", "sls", q->k[K_RING], 0LL, g);
    hdel_fx(q, K_GTURN, g);
    return 0;
}

/* Add an id to its lane; a lane that just became non-empty opens. */
static int lane_push_into(Q *q, RMK *lane, RMS *key, RMS *g, RMS *id, double score) {
    int rc = zadd(q, lane, key, score, id, 0);
    if (rc == 0 && vlen(lane) == 1) {
        int paused, ok;
        if ((rc = group_paused(q, g, &paused)) == 0 && !paused &&
            (rc = under_limit(q, g, &ok)) == 0 && ok)
            rc = admit(q, g);
    }
    return rc;
}

static int lane_push(Q *q, RMS *g, RMS *id, double score) {
    RMS *key = lane_key(q, g);
    RMK *lane;
    int rc = dk(q, key, 1, REDISMODULE_KEYTYPE_ZSET, &lane);
    if (rc == 0) rc = lane_push_into(q, lane, key, g, id, score);
    if (lane) RedisModule_CloseKey(lane);
    sfree(q, key);
    return rc;
}

static int lane_len(Q *q, RMS *g, size_t *n) {
    RMS *key = lane_key(q, g);
    RMK *lane;
    int rc = dk(q, key, 0, REDISMODULE_KEYTYPE_ZSET, &lane);
    *n = vlen(lane);
    if (lane) RedisModule_CloseKey(lane);
    sfree(q, key);
    return rc;
}

/* lane_score: priority * PRIO_SPAN + time; a priority that is no number is 0. */
static double lane_score(RMS *prio, double t) {
    double p;
    if (!prio || RedisModule_StringToDouble(prio, &p) != REDISMODULE_OK || !isfinite(p)) p = 0;
    return p * PRIO_SPAN + t;
}

/* One job of group g left flight: the books drop, and a group held back only by its
 * limit opens again. */
static int active_drop(Q *q, RMS *g) {
    int has;
    double lim = 0;
    long long act;
    RMK *ga = fx(q, K_GACTIVE, 1);
    if (hincrby(q, ga, q->k[K_GACTIVE], g, -1, &act) < 0) return -1;
    if (act <= 0) hdel(q, ga, q->k[K_GACTIVE], g);
    if (limit_of(q, g, &has, &lim) < 0) return -1;
    if (has && (double)act + 1 >= lim && (double)act < lim) {
        size_t n;
        int paused;
        if (lane_len(q, g, &n) < 0) return -1;
        if (n > 0) {
            if (group_paused(q, g, &paused) < 0) return -1;
            if (!paused) return admit(q, g);
        }
    }
    return 0;
}

/* Open: the lane waits, the group is not paused and is under its limit. */
static int is_open(Q *q, RMS *g, int *open) {
    size_t n;
    int paused, ok;
    *open = 0;
    if (lane_len(q, g, &n) < 0) return -1;
    if (n == 0) return 0;
    if (group_paused(q, g, &paused) < 0) return -1;
    if (paused) return 0;
    if (under_limit(q, g, &ok) < 0) return -1;
    *open = ok;
    return 0;
}

enum { P_NONE, P_WAIT, P_RING };

/* Where an open group stands; read it before a change, then settle(). */
static int placed(Q *q, RMS *g, int *where) {
    RMS *key = book_key(q, "gwait");
    RMK *h;
    double s;
    int rc = dk(q, key, 0, REDISMODULE_KEYTYPE_ZSET, &h), open;
    *where = P_NONE;
    if (rc == 0 && h && RedisModule_KeyType(h) != REDISMODULE_KEYTYPE_EMPTY &&
        RedisModule_ZsetScore(h, g, &s) == REDISMODULE_OK)
        *where = P_WAIT;
    if (h) RedisModule_CloseKey(h);
    sfree(q, key);
    if (rc < 0) return -1;
    if (*where == P_NONE) {
        if (is_open(q, g, &open) < 0) return -1;
        if (open) *where = P_RING;
    }
    return 0;
}

/* Put g where it belongs now, given where it stood. */
static int settle(Q *q, RMS *g, int was) {
    int want = P_NONE, open, has = 0;
    double at = 0;
    if (is_open(q, g, &open) < 0) return -1;
    if (open) {
        if (ready_at(q, g, &has, &at) < 0) return -1;
        want = has ? P_WAIT : P_RING;
    }
    RMS *key = book_key(q, "gwait");
    RMK *h = NULL;
    int rc = 0;
    if (was == want) {
        if (want == P_WAIT) {
            rc = dk(q, key, 1, REDISMODULE_KEYTYPE_ZSET, &h);
            if (rc == 0) rc = zadd(q, h, key, at, g, 0);
        }
    } else {
        if (was == P_RING) rc = ring_leave_scan(q, g);
        else if (was == P_WAIT) {
            rc = dk(q, key, 1, REDISMODULE_KEYTYPE_ZSET, &h);
            if (rc == 0) rc = zrem(q, h, key, g) < 0 ? -1 : 0;
        }
        if (h) RedisModule_CloseKey(h);
        h = NULL;
        if (rc == 0 && want == P_RING) rc = ring_enter(q, g);
        else if (rc == 0 && want == P_WAIT) rc = wait_push(q, g, at);
    }
    if (h) RedisModule_CloseKey(h);
    sfree(q, key);
    return rc;
}

/* ---- history (lua/lib/history.lua hist_*) ------------------------------------------- */

static const double HB[15] = {5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000,
                              60000, 300000, 1800000};

static int hbucket(double ms) {
    for (int i = 0; i < 15; i++)
        if (ms <= HB[i]) return i + 1;
    return 16;
}

/* A setting as the scripts' tonumber(x or default) or default. */
static double dflt_num(RMS *s, double d) {
    double v;
    if (s && RedisModule_StringToDouble(s, &v) == REDISMODULE_OK) return v;
    return d;
}

/* 1 history on (this minute's hash open), 0 off, -1 error. */
static int hist_open(Q *q) {
    if (q->hstate == 0) {
        if (read_defaults(q) < 0) return -1;
        double hours = dflt_num(q->dflt[D_HISTORY], 24);
        if (hours <= 0) {
            q->hstate = -1;
        } else {
            char name[48];
            snprintf(name, sizeof name, "h:%lld", (long long)floor((double)q->now / 60000.0));
            q->httl = (long long)floor(hours * 3600) + 60;
            q->hcap = dflt_num(q->dflt[D_HGROUPS], 1000);
            q->hkey = book_key(q, name);
            if (dk(q, q->hkey, 1, REDISMODULE_KEYTYPE_HASH, &q->hh) < 0) return -1;
            q->hstate = 1;
        }
    }
    return q->hstate == 1;
}

/* The field prefix..name. */
static RMS *hfield(Q *q, const char *prefix, RMS *name) {
    size_t pl = strlen(prefix), nl = 0;
    const char *np = name ? RedisModule_StringPtrLen(name, &nl) : "";
    char stackbuf[512];
    char *buf = pl + nl <= sizeof stackbuf ? stackbuf : RedisModule_Alloc(pl + nl);
    memcpy(buf, prefix, pl);
    memcpy(buf + pl, np, nl);
    RMS *f = RedisModule_CreateString(q->ctx, buf, pl + nl);
    if (buf != stackbuf) RedisModule_Free(buf);
    return f;
}

/* Replicate the history writes of this call so far: one HSET of the new values (what the
 * scripts' HINCRBYs left), then the PEXPIREAT of the deadline set. The history hash is a
 * key of its own, so its writes may go after the others of the call (all in one
 * MULTI/EXEC); a field's HDEL goes after the HSET that holds it. */
static void hist_flush(Q *q) {
    if (q->hn) {
        RMS *argv[1 + 2 * 32];
        argv[0] = q->hkey;
        for (int i = 0; i < 2 * q->hn; i++) argv[1 + i] = q->hpend[i];
        RedisModule_Replicate(q->ctx, "HSET", "v", argv, (size_t)(1 + 2 * q->hn));
        for (int i = 0; i < 2 * q->hn; i++) sfree(q, q->hpend[i]);
        q->hn = 0;
    }
    if (q->hexp) {
        RedisModule_Replicate(q->ctx, "PEXPIREAT", "sl", q->hkey, q->hexp);
        q->hexp = 0;
    }
}

/* HINCRBY of the history hash (f is taken), replicated at the end of the call. */
static int hadd(Q *q, RMS *f, long long by, long long *out) {
    long long v;
    if (hint(q, q->hh, f, &v) < 0) {
        sfree(q, f);
        return -1;
    }
    if ((by > 0 && v > LLONG_MAX - by) || (by < 0 && v < LLONG_MIN - by)) {
        sfree(q, f);
        return fail(q, "ERR increment or decrement would overflow");
    }
    v += by;
    RMS *nv = RedisModule_CreateStringFromLongLong(q->ctx, v);
    RedisModule_HashSet(q->hh, REDISMODULE_HASH_NONE, f, nv, NULL);
    if (out) *out = v;
    for (int i = 0; i < q->hn; i++)
        if (eq(q->hpend[2 * i], f)) {
            sfree(q, q->hpend[2 * i + 1]);
            q->hpend[2 * i + 1] = nv;
            sfree(q, f);
            return 0;
        }
    if (q->hn == 32) hist_flush(q);
    q->hpend[2 * q->hn] = f;
    q->hpend[2 * q->hn + 1] = nv;
    q->hn++;
    return 0;
}

static int hexpire(Q *q) {
    long long at = q->now + q->httl * 1000;
    int rc = RedisModule_SetAbsExpire ? RedisModule_SetAbsExpire(q->hh, at)
                                      : RedisModule_SetExpire(q->hh, at - q->now);
    if (rc != REDISMODULE_OK) return fail(q, "ERR emq: EXPIRE failed");
    q->hexp = at;
    return 0;
}

/* A task's counter + 1; one that was created sets the hash's expiry. */
static int hcount(Q *q, RMS *f) {
    long long v;
    if (hadd(q, f, 1, &v) < 0) return -1;
    return v == 1 ? hexpire(q) : 0;
}

#define H_STARTED 4294967296LL
#define H_RETRIED 4294967296LL
#define H_DEAD 281474976710656LL

/* A group's packed field (kind "a" or "b") + by; a field that was created sets the expiry
 * and counts against the cap: past it, the overflow's field takes the count instead. */
static int hgroup(Q *q, const char *kind, RMS *g, long long by) {
    long long v, n;
    char p[4];
    snprintf(p, sizeof p, "%s:", kind);
    RMS *f = hfield(q, p, g);
    if (hadd(q, RedisModule_CreateStringFromString(q->ctx, f), by, &v) < 0) {
        sfree(q, f);
        return -1;
    }
    int rc = 0;
    if (v == by) {
        char nk[4], ok[4];
        snprintf(nk, sizeof nk, "n%s", kind);
        snprintf(ok, sizeof ok, "o%s", kind);
        rc = hexpire(q);
        if (rc == 0) rc = hadd(q, mk_tmp(q, nk), 1, &n);
        if (rc == 0 && (double)n > q->hcap) {
            hist_flush(q);                        /* the HSET of f before its HDEL */
            hdel(q, q->hh, q->hkey, f);
            rc = hadd(q, mk_tmp(q, ok), by, NULL);
        }
    }
    sfree(q, f);
    return rc;
}

static double hclamp(double ms) {
    ms = floor(ms);
    return ms >= 0 && ms < 1e15 ? ms : 0;
}

static int hist_enqueued(Q *q, RMS *g) {
    int on = hist_open(q);
    return on <= 0 ? on : hgroup(q, "a", g, 1);
}

/* A claim: the wait is the start time less the time the job became due (its lane score's). */
static int hist_started(Q *q, RMS *task, RMS *g, double score) {
    int on = hist_open(q);
    if (on <= 0) return on;
    double wait = hclamp((double)q->now - (score - floor(score / PRIO_SPAN) * PRIO_SPAN));
    char c[8];
    snprintf(c, sizeof c, "w%d:", hbucket(wait));
    if (hcount(q, hfield(q, c, task)) < 0 ||
        hadd(q, hfield(q, "ws:", task), (long long)wait, NULL) < 0)
        return -1;
    return hgroup(q, "a", g, H_STARTED);
}

/* A success, with its run time when the row knows its start (as the script's tonumber). */
static int hist_succeeded(Q *q, RMS *task, RMS *g, RMS *started) {
    int on = hist_open(q);
    if (on <= 0) return on;
    double st, run = 0;
    if (started && RedisModule_StringToDouble(started, &st) == REDISMODULE_OK)
        run = hclamp((double)q->now - st);
    char b[8];
    snprintf(b, sizeof b, "r%d:", hbucket(run));
    if (hcount(q, hfield(q, b, task)) < 0 ||
        hadd(q, hfield(q, "rs:", task), (long long)run, NULL) < 0)
        return -1;
    return hgroup(q, "b", g, 1);
}

/* A failure: dead, or retried (a lease the reaper took back too). */
static int hist_failed(Q *q, RMS *task, RMS *g, int dead) {
    int on = hist_open(q);
    if (on <= 0) return on;
    if (hcount(q, hfield(q, dead ? "dd:" : "rt:", task)) < 0) return -1;
    return hgroup(q, "b", g, dead ? H_DEAD : H_RETRIED);
}

/* The fence's view of a row. */
typedef struct {
    RMK *h;
    RMS *key, *state, *attempts, *nonce, *group, *max, *ttl, *waiters, *started, *vcharge;
    RMS *task;
    RMS *wf, *next, *slot;  /* a workflow step's (see workflows below); NULL for a plain job */
} Row;

static void row_free(Q *q, Row *r) {
    if (r->h) RedisModule_CloseKey(r->h);
    sfree(q, r->key);
    sfree(q, r->state);
    sfree(q, r->attempts);
    sfree(q, r->nonce);
    sfree(q, r->group);
    sfree(q, r->max);
    sfree(q, r->ttl);
    sfree(q, r->waiters);
    sfree(q, r->started);
    sfree(q, r->vcharge);
    sfree(q, r->task);
    sfree(q, r->wf);
    sfree(q, r->next);
    sfree(q, r->slot);
    memset(r, 0, sizeof *r);
}

/* The fence: the row is active and the caller holds the current attempts and nonce.
 * 1 fenced (the row open in *r, for writing unless read_only is 1; the rest of the row read
 * unless read_only), 0 stale, -1 error. The fence's three fields come first: a stale call
 * and a heartbeat (extend, read_only 2: it writes `ran`) read no more. */
static int fenced_as(Q *q, RMS *id, RMS *attempts, RMS *nonce, Row *r, int read_only) {
    memset(r, 0, sizeof *r);
    r->key = job_key(q, id);
    if (dk(q, r->key, read_only != 1, REDISMODULE_KEYTYPE_HASH, &r->h) < 0) {
        row_free(q, r);
        return -1;
    }
    if (RedisModule_KeyType(r->h) != REDISMODULE_KEYTYPE_EMPTY)
        RedisModule_HashGet(r->h, REDISMODULE_HASH_NONE, F_STATE, &r->state, F_ATTEMPTS,
                            &r->attempts, F_NONCE, &r->nonce, NULL);
    if (!r->state || !eqc(r->state, "active") || !r->attempts || !eq(r->attempts, attempts) ||
        !r->nonce || !eq(r->nonce, nonce)) {
        row_free(q, r);
        return 0;
    }
    if (!read_only)
        RedisModule_HashGet(r->h, REDISMODULE_HASH_NONE, F_GROUP, &r->group, F_MAX, &r->max,
                            F_TTL, &r->ttl, F_WAITERS, &r->waiters, F_STARTED, &r->started,
                            F_VCHARGE, &r->vcharge, F_WF, &r->wf, F_NEXT, &r->next, F_SLOT,
                            &r->slot, F_TASK, &r->task, NULL);
    return 1;
}

static int fenced(Q *q, RMS *id, RMS *attempts, RMS *nonce, Row *r) {
    return fenced_as(q, id, attempts, nonce, r, 0);
}

/* ---- claim_one ------------------------------------------------------------------- */

typedef struct {
    RMS *id, *task, *payload, *nonce, *group;
    long long attempts, lease, more, fence;
} Job;

static void job_free(Q *q, Job *j) {
    sfree(q, j->id);
    sfree(q, j->task);
    sfree(q, j->payload);
    sfree(q, j->nonce);
    sfree(q, j->group);
    memset(j, 0, sizeof *j);
}

static void reply_job(RedisModuleCtx *ctx, Job *j) {
    RedisModule_ReplyWithArray(ctx, 9);
    RedisModule_ReplyWithString(ctx, j->id);
    if (j->task) RedisModule_ReplyWithString(ctx, j->task); else RedisModule_ReplyWithNull(ctx);
    if (j->payload) RedisModule_ReplyWithString(ctx, j->payload);
    else RedisModule_ReplyWithNull(ctx);
    RedisModule_ReplyWithLongLong(ctx, j->attempts);
    RedisModule_ReplyWithString(ctx, j->nonce);
    RedisModule_ReplyWithString(ctx, j->group);
    RedisModule_ReplyWithLongLong(ctx, j->lease);
    RedisModule_ReplyWithLongLong(ctx, j->more);
    RedisModule_ReplyWithLongLong(ctx, j->fence);
}

/* The head of the ring without moving it (LINDEX ring 0): popped and pushed straight back,
 * the only way to read a list element with 6.2's key API. */
static RMS *ring_head(Q *q) {
    if (vlen(fx(q, K_RING, 0)) == 0) return NULL;
    RMK *r = fx(q, K_RING, 1);
    if (!r) return NULL;
    RMS *g = RedisModule_ListPop(r, REDISMODULE_LIST_HEAD);
    if (g) RedisModule_ListPush(r, REDISMODULE_LIST_HEAD, g);
    return g;
}

/* As lua/lib/claim.lua: a row a claim cannot read goes to `dead` with the reason
 * (bury), a group whose books it cannot read leaves the ring (group_seat), and only a
 * queue-wide key of the wrong type fails the call, before its first write (claim_books). */

static int wf_fail(Q *q, RMS *wf, RMS *id);

/* Whether key is missing or of the type; a read that fails nothing. */
static int key_fits(Q *q, RMS *key, int type) {
    RMK *h = RedisModule_OpenKey(q->ctx, key, REDISMODULE_READ);
    int ok = type_ok(h, type);
    if (h) RedisModule_CloseKey(h);
    return ok;
}

/* The key's TYPE, as the scripts name it (a module type by its own name). */
static void type_name(Q *q, RMS *key, char *out, size_t size) {
    RedisModuleCallReply *r = RedisModule_Call(q->ctx, "TYPE", "s", key);
    RMS *t = r && RedisModule_CallReplyType(r) == REDISMODULE_REPLY_STRING
                 ? RedisModule_CreateStringFromCallReply(r) : NULL;
    size_t len = 0;
    const char *p = t ? RedisModule_StringPtrLen(t, &len) : "";
    snprintf(out, size, "%.*s", (int)len, p);
    sfree(q, t);
    if (r) RedisModule_FreeCallReply(r);
}

static const char *const TYPE_NAMES[6] = {"", "string", "list", "hash", "set", "zset"};

/* The first of n keys (NULL ones skipped) that is neither missing nor of its type: -2 with
 * q->errbuf naming it as the scripts do ("WRONGTYPE emq: <key> holds a <t>, not a <want>";
 * q->err is left to the caller), else 1. */
static int types_fit(Q *q, RMS **keys, const int *types, int n) {
    for (int i = 0; i < n; i++) {
        if (!keys[i] || key_fits(q, keys[i], types[i])) continue;
        size_t kl;
        const char *kp = RedisModule_StringPtrLen(keys[i], &kl);
        char t[64];
        type_name(q, keys[i], t, sizeof t);
        snprintf(q->errbuf, sizeof q->errbuf, "WRONGTYPE emq: %.*s holds a %s, not a %s",
                 (int)kl, kp, t, TYPE_NAMES[types[i]]);
        return -2;
    }
    return 1;
}

/* This minute's history hash, or NULL when the history is off (gdefaults read first). */
static RMS *hist_key(Q *q) {
    if (dflt_num(q->dflt[D_HISTORY], 24) <= 0) return NULL;
    char name[48];
    snprintf(name, sizeof name, "h:%lld", (long long)floor((double)q->now / 60000.0));
    return book_key(q, name);
}

/* Once per call, before the first write: the queue-wide keys a claim may write half-way
 * through a lease (gturn, this minute's history hash, in time mode gvrun; `active` and
 * `dead` are checked right before a lease or a burial, where the scripts' write meets
 * them). 1 fine, -2 one is of the wrong type (q->errbuf names it; q->err is left to the
 * caller), -1 error. */
static int claim_books(Q *q) {
    if (q->books) return q->books;
    if (read_defaults(q) < 0) return -1;         /* the scripts' hist(now) reads them first */
    int tf = time_fair(q);
    if (tf < 0) return -1;
    RMS *keys[3] = {q->k[K_GTURN], hist_key(q), tf ? book_key(q, "gvrun") : NULL};
    const int types[3] = {REDISMODULE_KEYTYPE_HASH, REDISMODULE_KEYTYPE_HASH,
                          REDISMODULE_KEYTYPE_HASH};
    q->books = types_fit(q, keys, types, 3);
    sfree(q, keys[1]);
    sfree(q, keys[2]);
    return q->books;
}

/* What a claim of g reads of its group's books, each checked before the claim writes. */
typedef struct {
    double act, lim, w, est;
    int has_lim, rated;
    long long m, per;
} Seat;

/* A setting's value (fixed key i or a book, else the default): 1 absent or int_ok (*v its
 * value, *has whether present), 0 unreadable, -1 error. */
static int seat_int(Q *q, int fixed, const char *book, RMS *g, int d, int *has, double *v) {
    RMS *s;
    if (setting(q, fixed, book, g, d, &s) < 0) return -1;
    int ok = !s || int_ok(s);
    *has = s != NULL;
    *v = ok ? int_val(s) : 0;
    sfree(q, s);
    return ok;
}

/* "digits:digits" with at most 15 digits on each side; 0 when not so. */
static int rate_text(RMS *s, long long *m, long long *per, int *too_long) {
    size_t len, i = 0, a, b;
    const char *p = RedisModule_StringPtrLen(s, &len);
    *too_long = 0;
    while (i < len && p[i] >= '0' && p[i] <= '9') i++;
    a = i;
    if (a == 0 || i >= len || p[i] != ':') return 0;
    b = ++i;
    while (i < len && p[i] >= '0' && p[i] <= '9') i++;
    if (i == b || i != len) return 0;
    if (a > 15 || len - b > 15) {
        *too_long = 1;
        return 0;
    }
    *m = 0;
    *per = 0;
    for (size_t k = 0; k < a; k++) *m = *m * 10 + (p[k] - '0');
    for (size_t k = b; k < len; k++) *per = *per * 10 + (p[k] - '0');
    return 1;
}

/* group_seat (lib/seat.lua): 1 read into *s, 0 unreadable (the group leaves the ring), -1
 * error. */
static int group_seat(Q *q, RMS *g, int tf, Seat *s) {
    memset(s, 0, sizeof *s);
    RMK *ga = fx(q, K_GACTIVE, 0);
    if (q->err) return -1;
    RMS *v = hget(ga, g);
    int ok = !v || int_ok(v), has, rc;
    s->act = ok ? int_val(v) : 0;
    sfree(q, v);
    if (!ok) return 0;
    if ((rc = seat_int(q, K_GLIMIT, NULL, g, D_LIMIT, &s->has_lim, &s->lim)) <= 0) return rc;
    if ((rc = seat_int(q, K_GWEIGHT, NULL, g, D_WEIGHT, &has, &s->w)) <= 0) return rc;
    if (!has) s->w = 1;
    if (s->w < 1) return 0;
    if (setting(q, -1, "grate", g, D_RATE, &v) < 0) return -1;
    if (v) {
        int too_long;
        s->rated = rate_text(v, &s->m, &s->per, &too_long);
        sfree(q, v);
        if (too_long) return 0;
    }
    if (s->rated) {
        RMS *sk = starts_key(q, g), *gw = book_key(q, "gwait");
        ok = key_fits(q, sk, REDISMODULE_KEYTYPE_LIST) &&
             key_fits(q, gw, REDISMODULE_KEYTYPE_ZSET) &&
             key_fits(q, q->k[K_WAKE], REDISMODULE_KEYTYPE_LIST);
        sfree(q, sk);
        sfree(q, gw);
        if (!ok) return 0;
    }
    if (tf) {
        if (book_get(q, "gcost", g, &v) < 0) return -1;
        if (!v && book_get(q, "gcost", F_EMPTY, &v) < 0) return -1;
        ok = !v || int_ok(v);
        s->est = v ? int_val(v) : DEFAULT_COST;
        sfree(q, v);
        return ok;
    }
    if (s->w > 1) {
        RMK *t = fx(q, K_GTURN, 0);
        if (q->err) return -1;
        v = hget(t, g);
        ok = !v || int_ok(v);
        sfree(q, v);
        return ok;
    }
    return 1;
}

/* The fields a claim reads of a row, and the integer ones each verb of the job's life reads
 * (the scripts' ROW and ROW_INTS). */
enum { R_TASK, R_PAYLOAD, R_LEASE, R_STATE, R_ATTEMPTS, R_FENCE, R_GROUP, R_MAX, R_TTL,
       R_DELAY, R_CREATED, NROW };
static const struct { int at; const char *name; int required; } ROW_INTS[] = {
    {R_ATTEMPTS, "attempts", 1}, {R_LEASE, "lease", 1}, {R_FENCE, "fence", 0},
    {R_MAX, "max", 1}, {R_TTL, "ttl", 0}, {R_DELAY, "delay", 0}, {R_CREATED, "created", 1},
};

/* Why a row popped from g's lane cannot be leased, written into buf; 0 when it can. */
static int row_fault(RMS **row, RMS *g, char *buf, size_t size) {
    if (!row[R_GROUP]) return snprintf(buf, size, "no group"), 1;
    if (!eq(row[R_GROUP], g)) return snprintf(buf, size, "its group is not the lane it was in"), 1;
    for (size_t i = 0; i < sizeof ROW_INTS / sizeof ROW_INTS[0]; i++) {
        RMS *v = row[ROW_INTS[i].at];
        if (!v) {
            if (ROW_INTS[i].required) return snprintf(buf, size, "no %s", ROW_INTS[i].name), 1;
        } else if (!int_ok(v)) {
            return snprintf(buf, size, "%s is not an integer", ROW_INTS[i].name), 1;
        }
    }
    return 0;
}

/* bury (lib/rows.lua): job id, popped from g's lane, goes to `dead` with the reason; a key
 * of another type than a hash (keytype its TYPE) is replaced by a dead row; a row without
 * a group gets g. job: the row's handle, open for writing (closed here). */
static int bury(Q *q, RMS *id, RMS *g, const char *reason, const char *keytype, RMK *job,
                RMS *jkey, const char *whole) {
    char text[400];
    RMS *group = NULL, *task = NULL, *waiters = NULL, *wf = NULL;
    int rc = zadd(q, fx(q, K_DEAD, 1), q->k[K_DEAD], (double)q->now, id, 0);
    if (rc < 0) {
        RedisModule_CloseKey(job);
        return -1;
    }
    if (keytype) {
        RedisModule_DeleteKey(job);
        RedisModule_Replicate(q->ctx, "DEL", "s", jkey);
        snprintf(text, sizeof text, "unreadable job row: the key holds a %s, not a hash", keytype);
    } else if (whole) {                          /* a job buried for its lane (group_books) */
        snprintf(text, sizeof text, "%s", whole);
    } else {
        snprintf(text, sizeof text, "unreadable job row: %s", reason);
    }
    RMS *err = mk_tmp(q, text), *now_s = RedisModule_CreateStringFromLongLong(q->ctx, q->now);
    RedisModule_HashSet(job, REDISMODULE_HASH_NONE, F_STATE, S_DEAD, F_ERROR, err, F_FINISHED,
                        now_s, NULL);
    RedisModule_Replicate(q->ctx, "HSET", "sssssss", jkey, F_STATE, S_DEAD, F_ERROR, err,
                          F_FINISHED, now_s);
    sfree(q, err);
    sfree(q, now_s);
    RedisModule_HashGet(job, REDISMODULE_HASH_NONE, F_GROUP, &group, F_TASK, &task, F_WAITERS,
                        &waiters, F_WF, &wf, NULL);
    if (!group && g) hset1(q, job, jkey, F_GROUP, g);
    RedisModule_CloseKey(job);
    rc = g ? hist_failed(q, task, g, 1) : 0;
    if (rc == 0) rc = notify(q, id, waiters);
    if (rc == 0 && wf) rc = wf_fail(q, wf, id);
    sfree(q, group); sfree(q, task); sfree(q, waiters); sfree(q, wf);
    return rc < 0 ? -1 : 0;
}

/* One turn at the ring's head group g: 1 claimed into *out, 0 look again (the group's
 * books unreadable, its lane empty or not a zset, its head a ghost or a buried row), -1
 * error. */
static int claim_at(Q *q, RMS *g, double vs, RMS *nonce, Job *out) {
    RMS *lkey = lane_key(q, g), *id = NULL, *jkey = NULL, *row[NROW] = {0};
    RMK *lane = NULL, *job = NULL;
    double score;
    long long act, more = 1;
    int rotated = 1, rc, tf = time_fair(q);
    Seat s;
    if (tf < 0 || (rc = group_seat(q, g, tf, &s)) < 0) {
        sfree(q, lkey);
        return -1;
    }
    if (rc == 1) {                               /* ZPOPMIN, as the scripts' pcall */
        lane = RedisModule_OpenKey(q->ctx, lkey, REDISMODULE_READ | REDISMODULE_WRITE);
        if (!type_ok(lane, REDISMODULE_KEYTYPE_ZSET)) rc = 0;
        else if (!(id = zfirst(lane, &score))) rc = 0;
    }
    if (rc == 0) {                               /* nothing to take here: leave the ring */
        rc = ring_leave(q, g, 0);
        goto out;
    }
    jkey = job_key(q, id);
    job = RedisModule_OpenKey(q->ctx, jkey, REDISMODULE_READ | REDISMODULE_WRITE);
    int jt = RedisModule_KeyType(job);
    if (jt == REDISMODULE_KEYTYPE_HASH)
        RedisModule_HashGet(job, REDISMODULE_HASH_NONE, F_TASK, &row[R_TASK], F_PAYLOAD,
                            &row[R_PAYLOAD], F_LEASE, &row[R_LEASE], F_STATE, &row[R_STATE],
                            F_ATTEMPTS, &row[R_ATTEMPTS], F_FENCE, &row[R_FENCE], F_GROUP,
                            &row[R_GROUP], F_MAX, &row[R_MAX], F_TTL, &row[R_TTL], F_DELAY,
                            &row[R_DELAY], F_CREATED, &row[R_CREATED], NULL);
    char why[64];
    int buried = jt != REDISMODULE_KEYTYPE_EMPTY && jt != REDISMODULE_KEYTYPE_HASH;
    if (!buried && row[R_STATE]) buried = row_fault(row, g, why, sizeof why);
    /* `dead` for a burial, `active` for a lease: of the wrong type, the call changes nothing
     * (the scripts' write is refused and the job put back) */
    if (buried || row[R_STATE]) {
        int fixed = buried ? K_DEAD : K_ACTIVE;
        const int type = REDISMODULE_KEYTYPE_ZSET;
        if ((rc = types_fit(q, &q->k[fixed], &type, 1)) < 0) goto out;
    }
    if (buried || !row[R_STATE]) {               /* a buried row or a ghost: look again */
        zrem(q, lane, lkey, id);
        if (buried) {
            char t[64];
            if (jt != REDISMODULE_KEYTYPE_HASH) type_name(q, jkey, t, sizeof t);
            rc = bury(q, id, g, why, jt != REDISMODULE_KEYTYPE_HASH ? t : NULL, job, jkey, NULL);
            job = NULL;
        }
        if (rc >= 0) rc = vlen(lane) == 0 ? ring_leave(q, g, 0) : 0;
        if (rc > 0) rc = 0;
        goto out;
    }

    zrem(q, lane, lkey, id);
    if (tf) {                                    /* time mode: charge the estimate */
        if ((rc = time_charge(q, g, vs, s.w, s.est, job, jkey)) < 0) goto out;
    } else if (s.w > 1) {                        /* ring_turn: a weighted group keeps the head */
        RMK *turn = fx(q, K_GTURN, 1);
        long long t;
        if ((rc = hincrby(q, turn, q->k[K_GTURN], g, 1, &t)) < 0) goto out;
        if (t < s.w) rotated = 0;
        else hdel(q, turn, q->k[K_GTURN], g);
    }
    if (rotated && !tf) {                        /* LMOVE ring ring LEFT RIGHT */
        RMK *r = fx(q, K_RING, 1);
        RMS *head = r ? RedisModule_ListPop(r, REDISMODULE_LIST_HEAD) : NULL;
        if (head) {
            RedisModule_ListPush(r, REDISMODULE_LIST_TAIL, head);
            sfree(q, head);
        }
        RedisModule_Replicate(q->ctx, "LMOVE", "ssss", q->k[K_RING], q->k[K_RING], S_LEFT,
                              S_RIGHT);
    }
    long long att = (long long)int_val(row[R_ATTEMPTS]) + 1;
    long long lease = (long long)int_val(row[R_LEASE]);
    /* fence: grows with every claim of the row, never rolled back (attempts is: by a
     * release, or a requeue of a dead job), so a task can guard writes elsewhere with it. */
    long long fence = (long long)int_val(row[R_FENCE]) + 1;
    RMS *att_new = RedisModule_CreateStringFromLongLong(q->ctx, att);
    RMS *now_s = RedisModule_CreateStringFromLongLong(q->ctx, q->now);
    RMS *fence_new = RedisModule_CreateStringFromLongLong(q->ctx, fence);
    RedisModule_HashSet(job, REDISMODULE_HASH_NONE, F_STATE, S_ACTIVE, F_ATTEMPTS, att_new,
                        F_NONCE, nonce, F_STARTED, now_s, F_FENCE, fence_new, NULL);
    RedisModule_Replicate(q->ctx, "HSET", "sssssssssss", jkey, F_STATE, S_ACTIVE, F_ATTEMPTS,
                          att_new, F_NONCE, nonce, F_STARTED, now_s, F_FENCE, fence_new);
    sfree(q, fence_new);
    sfree(q, att_new);
    sfree(q, now_s);
    if ((rc = zadd(q, fx(q, K_ACTIVE, 1), q->k[K_ACTIVE], (double)(q->now + lease), id, 0)) < 0)
        goto out;
    if ((rc = hincr_from(q, fx(q, K_GACTIVE, 1), q->k[K_GACTIVE], g, (long long)s.act, 1,
                         &act)) < 0)
        goto out;
    /* more: 1 when other work is serviceable right now, so the claimant's master wakes
     * another child (or another master) only when there is something to take. */
    if (s.rated) {                               /* LPUSH, LTRIM 0 m-1, PEXPIRE per */
        RMS *skey = starts_key(q, g);
        RMK *sh;
        if ((rc = dk(q, skey, 1, REDISMODULE_KEYTYPE_LIST, &sh)) == 0) {
            RMS *t = RedisModule_CreateStringFromLongLong(q->ctx, q->now);
            RedisModule_ListPush(sh, REDISMODULE_LIST_HEAD, t);
            RedisModule_Replicate(q->ctx, "LPUSH", "ss", skey, t);
            sfree(q, t);
            if (s.m >= 1 && (long long)vlen(sh) > s.m) {
                while ((long long)vlen(sh) > s.m)
                    sfree(q, RedisModule_ListPop(sh, REDISMODULE_LIST_TAIL));
                RedisModule_Replicate(q->ctx, "LTRIM", "sll", skey, 0LL, s.m - 1);
            }
            if (s.per > 0) {
                rc = expire_at(q, sh, skey, q->now + s.per);
            } else {                             /* PEXPIRE 0 deletes the key */
                RedisModule_DeleteKey(sh);
                RedisModule_Replicate(q->ctx, "DEL", "s", skey);
            }
        }
        if (sh) RedisModule_CloseKey(sh);
        sfree(q, skey);
        if (rc < 0) goto out;
    }
    int closed = (s.has_lim && (double)act >= s.lim) || vlen(lane) == 0, wait = 0;
    double at = 0;
    if (s.rated && !closed && (rc = rate_ready(q, g, &wait, &at)) < 0) goto out;
    if (closed || wait) {
        if ((rc = ring_leave(q, g, rotated)) < 0) goto out;
        if (wait && (rc = wait_push(q, g, at)) < 0) goto out;
        size_t left;
        if ((rc = ring_size(q, &left)) < 0) goto out;
        if (left == 0) more = 0;
    }
    /* last: a history counter that cannot be counted fails the call with the books whole */
    if ((rc = hist_started(q, row[R_TASK], g, score)) < 0) goto out;
    out->id = id;
    out->task = row[R_TASK];
    out->payload = row[R_PAYLOAD];
    out->nonce = nonce;
    out->attempts = att;
    out->lease = lease;
    out->more = more;
    out->fence = fence;
    id = row[R_TASK] = row[R_PAYLOAD] = NULL;
    rc = 1;
out:
    if (lane) RedisModule_CloseKey(lane);
    if (job) RedisModule_CloseKey(job);
    sfree(q, lkey); sfree(q, jkey); sfree(q, id);
    for (int i = 0; i < NROW; i++) sfree(q, row[i]);
    return rc;
}

/* bury for the verbs past the claim (release, reap, promote): `dead` checked first as the
 * scripts' bury does (its ZADD), refused with q->err naming it; jt: the job key's type (not a
 * hash: replaced by a dead row); whole: the row's whole error text (group_books's reason).
 * job: open for writing, closed here. 0 buried, -1 error. */
static int bury_as(Q *q, RMS *id, RMS *g, const char *reason, const char *whole, RMK *job,
                   RMS *jkey, int jt) {
    const int type = REDISMODULE_KEYTYPE_ZSET;
    if (types_fit(q, &q->k[K_DEAD], &type, 1) == -2) {
        RedisModule_CloseKey(job);
        return fail(q, q->errbuf);
    }
    char t[64];
    if (jt != REDISMODULE_KEYTYPE_HASH) type_name(q, jkey, t, sizeof t);
    return bury(q, id, g, reason, jt != REDISMODULE_KEYTYPE_HASH ? t : NULL, job, jkey, whole);
}

/* group_books (lua/lib/books.lua): what the verbs that move a job in or out of its group's books
 * read of them before their first write. 0 readable, 1 not (the job is settled without
 * them), 2 g's lane is of the wrong type (why: the reason, the job goes to `dead`), -1
 * error. */
static int group_books(Q *q, RMS *g, int leaving, int lane, RMS *vcharge, char *why,
                       size_t size) {
    RMS *lk = lane_key(q, g), *v;
    int rc = 0, has_lim, has, ok;
    double act, lim, w;
    if (lane && !key_fits(q, lk, REDISMODULE_KEYTYPE_ZSET)) {
        char t[64];
        size_t gl;
        const char *gp = RedisModule_StringPtrLen(g, &gl);
        type_name(q, lk, t, sizeof t);
        snprintf(why, size, "its group's lane (g:%.*s:pending) holds a %s, not a zset",
                 (int)gl, gp, t);
        rc = 2;
        goto out;
    }
    RMK *ga = fx(q, K_GACTIVE, 0);
    if (q->err) { rc = -1; goto out; }
    v = hget(ga, g);
    ok = !v || int_ok(v);
    act = ok ? int_val(v) : 0;
    sfree(q, v);
    if (!ok) { rc = 1; goto out; }
    if ((rc = seat_int(q, K_GLIMIT, NULL, g, D_LIMIT, &has_lim, &lim)) <= 0) {
        rc = rc < 0 ? -1 : 1;
        goto out;
    }
    rc = 0;
    if (vcharge) {
        if (!int_ok(vcharge)) { rc = 1; goto out; }
        if ((rc = seat_int(q, K_GWEIGHT, NULL, g, D_WEIGHT, &has, &w)) <= 0) {
            rc = rc < 0 ? -1 : 1;
            goto out;
        }
        rc = 0;
        if (has && w < 1) { rc = 1; goto out; }
    }
    int opens = lane;
    if (leaving && has_lim && !lane && act >= lim && act - 1 < lim) {   /* it reopens */
        if (!key_fits(q, lk, REDISMODULE_KEYTYPE_ZSET)) { rc = 1; goto out; }
        opens = 1;
    }
    if (opens) {
        int tf = time_fair(q);
        Seat seat;
        if (tf < 0 || (ok = group_seat(q, g, tf, &seat)) < 0) { rc = -1; goto out; }
        if (!ok) { rc = 1; goto out; }
        /* (ring_enter clears the turn count in either mode) */
        RMS *keys[3] = {tf ? book_key(q, "gvt") : NULL, tf ? book_key(q, "gvrun") : NULL,
                        book_key(q, "gwait")};
        const int types[6] = {tf ? REDISMODULE_KEYTYPE_ZSET : REDISMODULE_KEYTYPE_LIST,
                              REDISMODULE_KEYTYPE_HASH, REDISMODULE_KEYTYPE_ZSET,
                              REDISMODULE_KEYTYPE_LIST, REDISMODULE_KEYTYPE_SET,
                              REDISMODULE_KEYTYPE_HASH};
        RMS *names[6] = {tf ? keys[0] : q->k[K_RING], q->k[K_GTURN], keys[2], q->k[K_WAKE],
                         q->k[K_GPAUSED], keys[1]};
        for (int i = 0; i < 6 && rc == 0; i++)
            if (names[i] && !key_fits(q, names[i], types[i])) rc = 1;
        for (int i = 0; i < 3; i++) sfree(q, keys[i]);
    }
out:
    sfree(q, lk);
    return rc;
}

/* lane_in (lua/lib/books.lua): into g's lane, opening the group as lane_push does, or, when its
 * books cannot be read (books 1), only into the lane. */
static int lane_push(Q *q, RMS *g, RMS *id, double score);
static int lane_in(Q *q, RMS *g, RMS *id, double score, int books) {
    if (!books) return lane_push(q, g, id, score);
    RMS *key = lane_key(q, g);
    RMK *lane;
    int rc = dk(q, key, 1, REDISMODULE_KEYTYPE_ZSET, &lane);
    if (rc == 0) rc = zadd(q, lane, key, score, id, 0);
    if (lane) RedisModule_CloseKey(lane);
    sfree(q, key);
    return rc;
}

/* A wake at the end of a claim that skipped its fill: left out when `wake` is of the wrong
 * type (the scripts' wake_soft). */
static int wake_soft(Q *q) {
    return key_fits(q, q->k[K_WAKE], REDISMODULE_KEYTYPE_LIST) ? wake(q, 0) : 0;
}

/* Claim one job: turn the ring one step, pop the head of that lane, lease it.
 * 1 claimed into *out, 0 nothing serviceable, -1 error, -2 a queue-wide key a claim writes
 * is of the wrong type (claim_books: nothing written, q->errbuf says which). Ghosts,
 * stale ring entries, unreadable groups and buried rows are skipped, at most 64 per call;
 * past that a wake is pushed so a worker comes back. */
static int claim_one(Q *q, RMS *nonce, Job *out) {
    memset(out, 0, sizeof *out);
    int tf = time_fair(q);
    if (tf < 0) return -1;
    for (int iter = 0; iter < CLAIM_SKIP_MAX; iter++) {
        double vs = 0;
        RMS *g = NULL;
        if (tf) {                                /* ZRANGE gvt 0 0 WITHSCORES */
            RMS *key = book_key(q, "gvt");
            RMK *h;
            int rc = dk(q, key, 0, REDISMODULE_KEYTYPE_ZSET, &h);
            if (rc == 0) g = zfirst(h, &vs);
            if (h) RedisModule_CloseKey(h);
            sfree(q, key);
            if (rc < 0) return -1;
        } else {
            g = ring_head(q);
        }
        if (!g) return q->err ? -1 : 0;
        int rc = claim_books(q);
        if (rc == 1) rc = claim_at(q, g, vs, nonce, out);
        if (rc == 1) {
            out->group = g;
            return 1;
        }
        sfree(q, g);
        if (rc < 0) return rc;
    }
    return wake_soft(q) < 0 ? -1 : 0;
}

/* ---- workflows (lua/lib/workflow.lua) ---------------------------------------------- */
/* A step's row names its waiting children in `next` and, for a chord's callback, its
 * `slot`; the ack releases them (wf_handover), a dead step fails its workflow (wf_fail).
 * Keys formed here: the child rows, BASE.."chord:"..callback_id and BASE.."wf:"..wf_id. */

static void del_key(Q *q, RMK *h, RMS *key) {
    if (!h || RedisModule_KeyType(h) == REDISMODULE_KEYTYPE_EMPTY) return;
    RedisModule_DeleteKey(h);
    RedisModule_Replicate(q->ctx, "DEL", "s", key);
}

/* A waiting step goes to its lane (or `delayed` for a countdown), with arg (JSON text of
 * alen bytes, or NULL) spliced in as its first argument. */
static int wf_release(Q *q, RMS *id, const char *arg, size_t alen) {
    RMS *jk = job_key(q, id), *g = NULL, *prio = NULL, *splice = NULL, *comma = NULL;
    RMS *cd_s = NULL, *payload = NULL;
    RMK *h;
    int rc = dk(q, jk, 1, REDISMODULE_KEYTYPE_HASH, &h);
    if (rc == 0 && RedisModule_KeyType(h) != REDISMODULE_KEYTYPE_EMPTY)
        RedisModule_HashGet(h, REDISMODULE_HASH_NONE, F_GROUP, &g, F_PRIO, &prio, F_SPLICE,
                            &splice, F_COMMA, &comma, F_CD, &cd_s, F_PAYLOAD, &payload, NULL);
    if (rc == 0 && arg) {
        double off_d;
        if (!splice || !payload)
            rc = fail(q, "ERR emq: a waiting step has no splice or payload");
        else if (num(q, splice, &off_d, "ERR emq: a waiting step's splice is not a number") < 0)
            rc = -1;
        else {
            size_t pl;
            const char *pp = RedisModule_StringPtrLen(payload, &pl);
            size_t off = off_d <= 0 ? 0 : off_d >= (double)pl ? pl : (size_t)off_d;
            size_t sep = comma && eqc(comma, "1") ? 1 : 0, total = pl + alen + sep;
            char *buf = RedisModule_Alloc(total ? total : 1);
            memcpy(buf, pp, off);
            memcpy(buf + off, arg, alen);
            if (sep) buf[off + alen] = ',';
            memcpy(buf + off + alen + sep, pp + off, pl - off);
            RMS *np = RedisModule_CreateString(q->ctx, buf, total);
            RedisModule_Free(buf);
            hset1(q, h, jk, F_PAYLOAD, np);
            sfree(q, np);
        }
    }
    double cd = 0;
    if (cd_s && (RedisModule_StringToDouble(cd_s, &cd) != REDISMODULE_OK || !isfinite(cd))) cd = 0;
    if (rc == 0 && cd > 0) {
        hset1(q, h, jk, F_STATE, S_DELAYED);
        rc = delay_push(q, id, (double)q->now + cd);
    } else if (rc == 0 && !g) {
        rc = fail(q, "ERR emq: a waiting step has no group");
    } else if (rc == 0) {
        hset1(q, h, jk, F_STATE, S_PENDING);
        rc = lane_push(q, g, id, lane_score(prio, (double)q->now));
    }
    if (h) RedisModule_CloseKey(h);
    sfree(q, jk); sfree(q, g); sfree(q, prio); sfree(q, splice); sfree(q, comma);
    sfree(q, cd_s); sfree(q, payload);
    return rc;
}

/* The collected results of a chord, in slot order, as one JSON array. */
static RMS *wf_gather(Q *q, RMK *rh, long long n) {
    size_t cap = 256, len = 0;
    char *buf = RedisModule_Alloc(cap);
    buf[len++] = '[';
    for (long long i = 0; i < n; i++) {
        RMS *f = RedisModule_CreateStringFromLongLong(q->ctx, i), *v = hget(rh, f);
        size_t vl = 4;
        const char *vp = v ? RedisModule_StringPtrLen(v, &vl) : "null";
        if (len + vl + 2 > cap) {
            while (len + vl + 2 > cap) cap *= 2;
            buf = RedisModule_Realloc(buf, cap);
        }
        if (i) buf[len++] = ',';
        memcpy(buf + len, vp, vl);
        len += vl;
        sfree(q, f);
        sfree(q, v);
    }
    buf[len++] = ']';
    RMS *out = RedisModule_CreateString(q->ctx, buf, len);
    RedisModule_Free(buf);
    return out;
}

/* One child c of a finished step: released if it waits for this step alone, else (a
 * chord's callback) the result goes in its slot, once, and the last one releases it. */
static int wf_child(Q *q, RMS *c, RMS *slot, RMS *result) {
    RMS *ck = job_key(q, c), *state = NULL, *npend = NULL, *imm = NULL, *nslots = NULL;
    RMK *h;
    int rc = dk(q, ck, 1, REDISMODULE_KEYTYPE_HASH, &h);
    if (rc == 0 && RedisModule_KeyType(h) != REDISMODULE_KEYTYPE_EMPTY)
        RedisModule_HashGet(h, REDISMODULE_HASH_NONE, F_STATE, &state, F_NPEND, &npend, F_IMM,
                            &imm, F_NSLOTS, &nslots, NULL);
    if (rc == 0 && state && eq(state, S_WAITING)) {
        size_t rl;
        const char *rp = RedisModule_StringPtrLen(result, &rl);
        int mutable = !(imm && eqc(imm, "1"));
        if (!npend) {
            RedisModule_CloseKey(h);
            h = NULL;
            rc = wf_release(q, c, mutable ? rp : NULL, rl);
        } else if (slot) {
            RMS *rk = mkname(q, "chord:", c, "");
            RMK *rh;
            int exists = 0;
            rc = dk(q, rk, 1, REDISMODULE_KEYTYPE_HASH, &rh);
            if (rc == 0 && RedisModule_KeyType(rh) != REDISMODULE_KEYTYPE_EMPTY)
                RedisModule_HashGet(rh, REDISMODULE_HASH_EXISTS, slot, &exists, NULL);
            long long left = 1;
            if (rc == 0 && !exists) {
                hset1(q, rh, rk, slot, result);
                rc = hincrby(q, h, ck, F_NPEND, -1, &left);
            }
            if (rc == 0 && !exists && left <= 0) {
                RMS *list = NULL;
                double n = 0;
                if (mutable) {
                    if (!nslots) rc = fail(q, "ERR emq: a chord's callback has no nslots");
                    else if (num(q, nslots, &n, "ERR emq: nslots is not a number") == 0)
                        list = wf_gather(q, rh, to_ll(ceil(n)));
                    else rc = -1;
                }
                if (rc == 0) del_key(q, rh, rk);
                if (rh) RedisModule_CloseKey(rh);
                rh = NULL;
                RedisModule_CloseKey(h);
                h = NULL;
                if (rc == 0) {
                    size_t ll = 0;
                    const char *lp = list ? RedisModule_StringPtrLen(list, &ll) : NULL;
                    rc = wf_release(q, c, lp, ll);
                }
                sfree(q, list);
            }
            if (rh) RedisModule_CloseKey(rh);
            sfree(q, rk);
        }
    }
    if (h) RedisModule_CloseKey(h);
    sfree(q, ck); sfree(q, state); sfree(q, npend); sfree(q, imm); sfree(q, nslots);
    return rc;
}

/* The next id of a space-separated list (Lua's %S+) from *i, or NULL at its end. */
static RMS *next_word(Q *q, const char *p, size_t len, size_t *i) {
    while (*i < len && isspace((unsigned char)p[*i])) (*i)++;
    size_t st = *i;
    while (*i < len && !isspace((unsigned char)p[*i])) (*i)++;
    return *i > st ? RedisModule_CreateString(q->ctx, p + st, *i - st) : NULL;
}

/* A step finished with `result`: each waiting child it names is released (a chord's
 * callback once its last member is in), in the same call as the ack. */
static int wf_handover(Q *q, RMS *next, RMS *slot, RMS *result) {
    size_t len, i = 0;
    const char *p = RedisModule_StringPtrLen(next, &len);
    RMS *c;
    int rc = 0;
    while (rc == 0 && (c = next_word(q, p, len, &i)) != NULL) {
        rc = wf_child(q, c, slot, result);
        sfree(q, c);
    }
    return rc;
}

/* A waiting step of a failed workflow is cancelled (its chord results dropped). */
static int wf_cancel_waiting(Q *q, RMS *c, RMS *msg) {
    RMS *ck = job_key(q, c), *state = NULL, *waiters = NULL, *ttl_s = NULL;
    RMK *h;
    int rc = dk(q, ck, 1, REDISMODULE_KEYTYPE_HASH, &h);
    if (rc == 0 && RedisModule_KeyType(h) != REDISMODULE_KEYTYPE_EMPTY)
        RedisModule_HashGet(h, REDISMODULE_HASH_NONE, F_STATE, &state, F_WAITERS, &waiters,
                            F_TTL, &ttl_s, NULL);
    if (rc == 0 && state && eq(state, S_WAITING)) {
        RMS *now_s = RedisModule_CreateStringFromLongLong(q->ctx, q->now);
        RedisModule_HashSet(h, REDISMODULE_HASH_NONE, F_STATE, S_CANCELLED, F_ERROR, msg,
                            F_FINISHED, now_s, NULL);
        RedisModule_Replicate(q->ctx, "HSET", "sssssss", ck, F_STATE, S_CANCELLED, F_ERROR, msg,
                              F_FINISHED, now_s);
        sfree(q, now_s);
        RMS *rk = mkname(q, "chord:", c, "");
        RMK *rh;
        rc = dk(q, rk, 1, REDISMODULE_KEYTYPE_HASH, &rh);
        if (rc == 0) del_key(q, rh, rk);
        if (rh) RedisModule_CloseKey(rh);
        sfree(q, rk);
        if (rc == 0) rc = notify(q, c, waiters);
        double ttl = 0;
        if (ttl_s && (RedisModule_StringToDouble(ttl_s, &ttl) != REDISMODULE_OK || !isfinite(ttl)))
            ttl = 0;
        if (rc == 0 && ttl > 0) rc = expire_at(q, h, ck, q->now + to_ll(ttl) * 1000);
        else if (rc == 0) del_key(q, h, ck);
    }
    if (h) RedisModule_CloseKey(h);
    sfree(q, ck); sfree(q, state); sfree(q, waiters); sfree(q, ttl_s);
    return rc;
}

/* Step id of workflow wf went dead: the first such call fails the workflow, cancels every
 * step still waiting and releases the link_error step, once. */
static int wf_fail(Q *q, RMS *wf, RMS *id) {
    RMS *wk = mkname(q, "wf:", wf, ""), *waiting = NULL, *lerr = NULL;
    RMK *h;
    int exists = 0, rc = dk(q, wk, 1, REDISMODULE_KEYTYPE_HASH, &h);
    if (rc == 0 && RedisModule_KeyType(h) != REDISMODULE_KEYTYPE_EMPTY)
        RedisModule_HashGet(h, REDISMODULE_HASH_EXISTS, F_FAILED, &exists, NULL);
    if (rc == 0 && !exists) {
        hset1(q, h, wk, F_FAILED, id);
        hset1(q, h, wk, F_STATE, S_FAILED);
        RedisModule_HashGet(h, REDISMODULE_HASH_NONE, F_WAITING, &waiting, F_LERR, &lerr, NULL);
    }
    if (h) RedisModule_CloseKey(h);
    sfree(q, wk);
    if (rc == 0 && !exists && waiting) {
        size_t idl, len, i = 0;
        const char *ip = RedisModule_StringPtrLen(id, &idl);
        const char *p = RedisModule_StringPtrLen(waiting, &len);
        const char *pre = "workflow failed at step ";
        size_t prl = strlen(pre);
        char *m = RedisModule_Alloc(prl + idl);
        memcpy(m, pre, prl);
        memcpy(m + prl, ip, idl);
        RMS *msg = RedisModule_CreateString(q->ctx, m, prl + idl), *c;
        RedisModule_Free(m);
        while (rc == 0 && (c = next_word(q, p, len, &i)) != NULL) {
            rc = wf_cancel_waiting(q, c, msg);
            sfree(q, c);
        }
        sfree(q, msg);
    }
    if (rc == 0 && lerr) {
        RMS *lk = job_key(q, lerr), *state = NULL, *imm = NULL;
        RMK *lh;
        rc = dk(q, lk, 0, REDISMODULE_KEYTYPE_HASH, &lh);
        if (rc == 0 && lh)
            RedisModule_HashGet(lh, REDISMODULE_HASH_NONE, F_STATE, &state, F_IMM, &imm, NULL);
        if (lh) RedisModule_CloseKey(lh);
        if (rc == 0 && state && eq(state, S_WAITING)) {
            size_t idl;
            const char *ip = RedisModule_StringPtrLen(id, &idl);
            char *arg = RedisModule_Alloc(idl + 2);
            arg[0] = '"';
            memcpy(arg + 1, ip, idl);
            arg[idl + 1] = '"';
            rc = wf_release(q, lerr, imm && eqc(imm, "1") ? NULL : arg, idl + 2);
            RedisModule_Free(arg);
            /* released: it lives as a job now, no longer with its workflow's hash */
            if (rc == 0 && dk(q, lk, 1, REDISMODULE_KEYTYPE_HASH, &lh) == 0 && lh &&
                RedisModule_KeyType(lh) != REDISMODULE_KEYTYPE_EMPTY &&
                RedisModule_GetExpire(lh) != REDISMODULE_NO_EXPIRE) {
                RedisModule_SetExpire(lh, REDISMODULE_NO_EXPIRE);
                RedisModule_Replicate(q->ctx, "PERSIST", "s", lk);
            }
            if (lh) RedisModule_CloseKey(lh);
            if (q->err) rc = -1;
        }
        sfree(q, lk); sfree(q, state); sfree(q, imm);
    }
    sfree(q, waiting);
    sfree(q, lerr);
    return rc;
}

/* ---- commands ---------------------------------------------------------------------- */

#define ARGV0 (1 + NFIXED)     /* argv index of ARGV[1] */

/* The end of every command: close the keys; answer the error if one was met. A command
 * replies itself only when q->err is unset, and nothing after its reply can set it. */
static int finish(Q *q) {
    close_all(q);
    if (q->err) return RedisModule_ReplyWithError(q->ctx, q->err);
    return REDISMODULE_OK;
}

static int paused(Q *q) {
    return RedisModule_KeyType(fx(q, K_PAUSED, 0)) != REDISMODULE_KEYTYPE_EMPTY;
}

/* The scripts' gate: 1-128 of [A-Za-z0-9_.:-]. */
static int id_ok(RMS *id) {
    size_t len;
    const char *p = RedisModule_StringPtrLen(id, &len);
    if (len < 1 || len > 128) return 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)p[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == ':' || c == '-'))
            return 0;
    }
    return 1;
}

static int count_arg(Q *q, RMS *s, long long *n, const char *what) {
    if (RedisModule_StringToLongLong(s, n) != REDISMODULE_OK || *n < 0) return fail(q, what);
    return 0;
}

static int need_group(Q *q, Row *r) {
    if (r->group) return 0;
    row_free(q, r);
    return fail(q, "ERR emq: an active row has no group");
}

/* A group whose lane a job of this call opens: what opening reads of its books (the
 * scripts' enqueue_books, as group_seat reads them). 1 readable, 0 not, -1 error. */
static int opening_ok(Q *q, RMS *g) {
    int paused, has_lim;
    double lim;
    RMS *v;
    if (group_paused(q, g, &paused) < 0 || book_get(q, "gbackoff", g, &v) < 0) return -1;
    sfree(q, v);
    int ok = seat_int(q, K_GLIMIT, NULL, g, D_LIMIT, &has_lim, &lim);
    if (ok < 0) return -1;
    if (ok && has_lim) {
        RMK *ga = fx(q, K_GACTIVE, 0);
        if (q->err) return -1;
        v = hget(ga, g);
        ok = !v || int_ok(v);
        sfree(q, v);
    }
    if (!ok) return 0;
    if (setting(q, -1, "grate", g, D_RATE, &v) < 0) return -1;
    long long m, per;
    int too_long, rated = v && rate_text(v, &m, &per, &too_long);
    ok = !(v && too_long);
    sfree(q, v);
    if (ok && rated) {
        RMS *sk = starts_key(q, g);
        ok = key_fits(q, sk, REDISMODULE_KEYTYPE_LIST);
        sfree(q, sk);
    }
    return ok;
}

/* enqueue_books (lib/enqueue.lua): before the first write, what the call will write. refused[i]
 * 1 for a job refused (its lane not a zset, its cap unreadable, or the books its opening
 * reads unreadable). 1 fine, -2 a queue-wide key it writes of the wrong type (q->errbuf), -1
 * error. */
static int enqueue_books(Q *q, RMS **a, long long n, char *refused) {
    int later = 0, rc = 1, tf;
    long long nopen = 0;
    long long *opening = RedisModule_Alloc(sizeof(long long) * (size_t)(n ? n : 1));
    if (read_defaults(q) < 0) rc = -1;
    RMS *keys[6] = {rc == 1 ? hist_key(q) : NULL, NULL, NULL, NULL, NULL, NULL};
    int types[6] = {REDISMODULE_KEYTYPE_HASH};
    for (long long i = 0; rc == 1 && i < n; i++) {
        RMS **f = a + i * 10, *cap = NULL;
        double countdown;
        refused[i] = 0;
        num(q, f[8], &countdown, "ERR emq: countdown must be a number");   /* checked */
        if (countdown > 0) {
            later = 1;
            continue;
        }
        RMS *lk = lane_key(q, f[3]);
        RMK *lane = RedisModule_OpenKey(q->ctx, lk, REDISMODULE_READ);
        int lane_ok = type_ok(lane, REDISMODULE_KEYTYPE_ZSET);
        size_t size = lane_ok ? vlen(lane) : 0;
        if (lane) RedisModule_CloseKey(lane);
        sfree(q, lk);
        if (setting(q, -1, "gmax", f[3], D_MAX_SIZE, &cap) < 0) rc = -1;
        else if (!lane_ok || (cap && !int_ok(cap))) refused[i] = 1;
        else if (size == 0) opening[nopen++] = i;
        sfree(q, cap);
    }
    int nk = 1;
    if (rc == 1 && later) {
        keys[nk] = q->k[K_DELAYED], types[nk++] = REDISMODULE_KEYTYPE_ZSET;
        keys[nk] = q->k[K_WAKE], types[nk++] = REDISMODULE_KEYTYPE_LIST;
    }
    RMS *gvt = NULL, *gvrun = NULL, *gwait = NULL;
    if (rc == 1 && nopen > 0) {
        if ((tf = time_fair(q)) < 0) rc = -1;
        else if (tf) {
            keys[nk] = gvt = book_key(q, "gvt"), types[nk++] = REDISMODULE_KEYTYPE_ZSET;
            keys[nk] = gvrun = book_key(q, "gvrun"), types[nk++] = REDISMODULE_KEYTYPE_HASH;
        } else {
            keys[nk] = q->k[K_RING], types[nk++] = REDISMODULE_KEYTYPE_LIST;
        }
    }
    if (rc == 1 && (rc = types_fit(q, keys, types, nk)) == 1 && nopen > 0) {
        RMS *more[3] = {q->k[K_GTURN], gwait = book_key(q, "gwait"), q->k[K_WAKE]};
        const int mt[3] = {REDISMODULE_KEYTYPE_HASH, REDISMODULE_KEYTYPE_ZSET,
                           REDISMODULE_KEYTYPE_LIST};
        rc = types_fit(q, more, mt, 3);
    }
    /* each group whose lane a job opens, once (its first job's verdict for all of them) */
    for (long long j = 0; rc == 1 && j < nopen; j++) {
        long long i = opening[j], first = i;
        for (long long k = 0; k < j; k++)
            if (eq(a[opening[k] * 10 + 3], a[i * 10 + 3])) {
                first = opening[k];
                break;
            }
        if (first != i) {
            refused[i] = refused[first];
            continue;
        }
        int ok = opening_ok(q, a[i * 10 + 3]);
        if (ok < 0) rc = -1;
        else refused[i] = !ok;
    }
    sfree(q, keys[0]);
    sfree(q, gvt);
    sfree(q, gvrun);
    sfree(q, gwait);
    RedisModule_Free(opening);
    return rc;
}

static int enqueue_one(Q *q, RMS **f, RMS *now_s, int refused, long long *verdict) {
    RMS *id = f[0], *g = f[3], *cap_s = NULL;
    double countdown, prio = 0, cap = 0;
    num(q, f[8], &countdown, "ERR emq: countdown must be a number");
    if (RedisModule_StringToDouble(f[9], &prio) != REDISMODULE_OK || !isfinite(prio)) prio = 0;
    if (!id_ok(id)) {
        *verdict = -1;
        return 0;
    }
    /* One open each for the row and the lane (each open is a lookup): the row's for
     * EXISTS (any type counts) and the write, the lane's type checked before the row is
     * written. */
    RMS *jk = job_key(q, id), *lk = NULL;
    RMK *job = RedisModule_OpenKey(q->ctx, jk, REDISMODULE_READ | REDISMODULE_WRITE), *lane = NULL;
    int rc = 0;
    *verdict = 0;
    if (refused) {                               /* enqueue_books: its lane or books unreadable */
        if (RedisModule_KeyType(job) == REDISMODULE_KEYTYPE_EMPTY) *verdict = 3;
        RedisModule_CloseKey(job);
        sfree(q, jk);
        return 0;
    }
    if (countdown <= 0) {                        /* max_size_of: the cap on waiting jobs */
        rc = setting(q, -1, "gmax", g, D_MAX_SIZE, &cap_s);
        if (rc == 0 && cap_s) rc = num(q, cap_s, &cap, "ERR emq: a group max_size is not a number");
        sfree(q, cap_s);
    }
    if (rc == 0 && RedisModule_KeyType(job) == REDISMODULE_KEYTYPE_EMPTY) {
        if (countdown <= 0) {
            lk = lane_key(q, g);
            rc = dk(q, lk, 1, REDISMODULE_KEYTYPE_ZSET, &lane);
        }
        if (rc == 0 && cap_s && (double)vlen(lane) >= cap) {
            *verdict = 2;
        } else if (rc == 0 && q->full) {
            rc = fail(q, OOM_REFUSED);
        } else if (rc == 0) {
            RMS *state = countdown > 0 ? S_DELAYED : S_PENDING;
            RedisModule_HashSet(job, REDISMODULE_HASH_NONE, F_TASK, f[1], F_PAYLOAD, f[2],
                                F_GROUP, g, F_STATE, state, F_ATTEMPTS, S_ZERO, F_MAX, f[4],
                                F_LEASE, f[5], F_DELAY, f[6], F_TTL, f[7], F_CREATED, now_s,
                                NULL);
            RedisModule_Replicate(q->ctx, "HSET", "sssssssssssssssssssss", jk, F_TASK, f[1],
                                  F_PAYLOAD, f[2], F_GROUP, g, F_STATE, state, F_ATTEMPTS,
                                  S_ZERO, F_MAX, f[4], F_LEASE, f[5], F_DELAY, f[6], F_TTL,
                                  f[7], F_CREATED, now_s);
            if (prio != 0) {
                char buf[40];
                RMS *p = mk_tmp(q, fmt_num(prio, buf));
                RedisModule_HashSet(job, REDISMODULE_HASH_NONE, F_PRIO, p, NULL);
                RedisModule_Replicate(q->ctx, "HSET", "sss", jk, F_PRIO, p);
                sfree(q, p);
            }
            rc = countdown > 0 ? delay_push(q, id, (double)q->now + countdown)
                               : lane_push_into(q, lane, lk, g, id,
                                                prio * PRIO_SPAN + (double)q->now);
            if (rc == 0) rc = hist_enqueued(q, g);
            *verdict = 1;
        }
    }
    RedisModule_CloseKey(job);
    if (lane) RedisModule_CloseKey(lane);
    sfree(q, jk);
    sfree(q, lk);
    return rc;
}

static int cmd_enqueue(RedisModuleCtx *ctx, RMS **argv, int argc) {
    if (argc < ARGV0 + 1) return RedisModule_WrongArity(ctx);
    long long n;
    if (RedisModule_StringToLongLong(argv[ARGV0], &n) != REDISMODULE_OK || n < 0)
        return RedisModule_ReplyWithError(ctx, "ERR emq: n must be an integer >= 0");
    if (n > argc || (long long)(argc - ARGV0 - 1) != n * 10) return RedisModule_WrongArity(ctx);
    Q q;
    if (q_init(&q, ctx, argv, 0, 0) < 0) return finish(&q);
    RMS **a = argv + ARGV0 + 1;
    /* Every number of every job is checked before the first job is written. */
    for (long long i = 0; i < n; i++) {
        RMS **f = a + i * 10;
        double d;
        long long ll;
        if (num(&q, f[4], &d, "ERR emq: max must be a number") < 0 ||
            num(&q, f[5], &d, "ERR emq: lease must be a number") < 0 ||
            num(&q, f[6], &d, "ERR emq: delay must be a number") < 0 ||
            integer(&q, f[7], &ll, "ERR emq: ttl must be an integer") < 0 ||
            num(&q, f[8], &d, "ERR emq: countdown must be a number") < 0)
            return finish(&q);
    }
    long long *out = RedisModule_Alloc(sizeof(long long) * (size_t)(n ? n : 1));
    char *refused = RedisModule_Alloc((size_t)(n ? n : 1));
    int books = enqueue_books(&q, a, n, refused);
    if (books == -2) fail(&q, q.errbuf);
    RMS *now_s = RedisModule_CreateStringFromLongLong(ctx, q.now);
    q.full = full(ctx);
    for (long long i = 0; books == 1 && i < n; i++) {
        if (enqueue_one(&q, a + i * 10, now_s, refused[i], &out[i]) < 0) break;
        if (out[i] == 1) q.full = 0;   /* written: a script is not stopped half-way */
    }
    sfree(&q, now_s);
    RedisModule_Free(refused);
    if (!q.err) {
        RedisModule_ReplyWithArray(ctx, (long)n);
        for (long long i = 0; i < n; i++) RedisModule_ReplyWithLongLong(ctx, out[i]);
    }
    RedisModule_Free(out);
    return finish(&q);
}

static RMS *claim_nonce(Q *q, RMS *prefix, long long i) {
    size_t pl;
    const char *p = RedisModule_StringPtrLen(prefix, &pl);
    char digits[24], stackbuf[128];
    int tl = 0;
    do digits[tl++] = (char)('0' + i % 10); while ((i /= 10) > 0);   /* i >= 1 */
    size_t total = pl + 1 + (size_t)tl;
    char *buf = total <= sizeof stackbuf ? stackbuf : RedisModule_Alloc(total);
    memcpy(buf, p, pl);
    buf[pl] = ':';
    for (int d = 0; d < tl; d++) buf[pl + 1 + d] = digits[tl - 1 - d];
    RMS *s = RedisModule_CreateString(q->ctx, buf, total);
    if (buf != stackbuf) RedisModule_Free(buf);
    return s;
}

static int cmd_claim(RedisModuleCtx *ctx, RMS **argv, int argc) {
    if (argc != ARGV0 + 2) return RedisModule_WrongArity(ctx);
    Q q;
    /* The keys are type-checked where the script meets them: a claim that finds nothing to
     * take answers [] whatever its books, and claim_books checks those it writes. */
    if (q_init(&q, ctx, argv, 0, 0) < 0) return finish(&q);
    long long n;
    if (count_arg(&q, argv[ARGV0], &n, "ERR emq: n must be an integer >= 0") < 0)
        return finish(&q);
    Job *jobs = NULL;
    long long got = 0, cap = 0;
    if (!paused(&q)) {
        for (long long i = 1; i <= n; i++) {
            if (got == cap) {
                cap = cap ? cap * 2 : 4;
                jobs = RedisModule_Realloc(jobs, sizeof(Job) * (size_t)cap);
            }
            RMS *nonce = claim_nonce(&q, argv[ARGV0 + 1], i);
            int rc = claim_one(&q, nonce, &jobs[got]);
            if (rc <= 0) {
                sfree(&q, nonce);
                if (rc == -2) fail(&q, q.errbuf);
                break;
            }
            got++;
        }
    }
    if (!q.err) {
        RedisModule_ReplyWithArray(ctx, (long)got);
        for (long long i = 0; i < got; i++) reply_job(ctx, &jobs[i]);
    }
    for (long long i = 0; i < got; i++) job_free(&q, &jobs[i]);
    RedisModule_Free(jobs);
    return finish(&q);
}

/* ack's first half: the fenced job is done. 1 done, 0 stale, -1 error. */
static int ack_done(Q *q, RMS **a) {
    Row r;
    int f = fenced(q, a[0], a[1], a[2], &r);
    if (f <= 0) return f;
    long long ttl = 0;
    if (need_group(q, &r) < 0) return -1;
    if ((r.ttl && integer(q, r.ttl, &ttl, "ERR emq: a job row's ttl is not an integer") < 0) ||
        (ttl > 0 && ttl > (LLONG_MAX - q->now) / 1000 && fail(q, "ERR invalid expire time") < 0)) {
        row_free(q, &r);
        return -1;
    }
    /* read before the first write: books that cannot be read are left as they are (the
     * job's outcome is written all the same: it ran) */
    char why[320];
    int books = group_books(q, r.group, 1, 0, r.vcharge, why, sizeof why);
    if (books < 0 ||
        (!books && time_settle(q, r.group, a[0], r.h, r.key, r.started, r.vcharge, 1) < 0)) {
        row_free(q, &r);
        return -1;
    }
    zrem(q, fx(q, K_ACTIVE, 1), q->k[K_ACTIVE], a[0]);
    if (ttl > 0) {
        RMS *now_s = RedisModule_CreateStringFromLongLong(q->ctx, q->now);
        RedisModule_HashSet(r.h, REDISMODULE_HASH_NONE, F_STATE, S_DONE, F_RESULT, a[3],
                            F_FINISHED, now_s, NULL);
        RedisModule_Replicate(q->ctx, "HSET", "sssssss", r.key, F_STATE, S_DONE, F_RESULT, a[3],
                              F_FINISHED, now_s);
        sfree(q, now_s);
        hdel(q, r.h, r.key, F_PAYLOAD);
        expire_at(q, r.h, r.key, q->now + ttl * 1000);
    } else {
        RedisModule_DeleteKey(r.h);
        RedisModule_Replicate(q->ctx, "DEL", "s", r.key);
    }
    int rc = books ? 0 : active_drop(q, r.group);
    if (rc == 0) rc = hist_succeeded(q, r.task, r.group, r.started);
    if (rc == 0) rc = notify(q, a[0], r.waiters);
    if (rc == 0 && r.next) rc = wf_handover(q, r.next, r.slot, a[3]);
    row_free(q, &r);
    return rc < 0 ? -1 : 1;
}

static int cmd_ack(RedisModuleCtx *ctx, RMS **argv, int argc) {
    if (argc != ARGV0 + 5) return RedisModule_WrongArity(ctx);
    Q q;
    if (q_init(&q, ctx, argv, B(K_ACTIVE) | B(K_GACTIVE), B(K_GLIMIT) | B(K_PAUSED)) < 0) return finish(&q);
    RMS **a = argv + ARGV0;
    int verdict = ack_done(&q, a), got = 0;
    Job job;
    if (verdict == 0) {                          /* a stale ack, counted for stats() */
        RMS *key = book_key(&q, "tally");
        RMK *h;
        long long n;
        if (dk(&q, key, 1, REDISMODULE_KEYTYPE_HASH, &h) == 0)
            hincrby(&q, h, key, F_STALE_ACKS, 1, &n);
        if (h) RedisModule_CloseKey(h);
        sfree(&q, key);
        if (q.err) verdict = -1;
    }
    /* a queue-wide key a claim writes of the wrong type (-2): no next job, the ack stands */
    if (verdict >= 0 && slen(a[4]) > 0 && !paused(&q)) got = claim_one(&q, a[4], &job);
    if (!q.err) {
        RedisModule_ReplyWithArray(ctx, 2);
        RedisModule_ReplyWithLongLong(ctx, verdict);
        if (got == 1) reply_job(ctx, &job);
        else RedisModule_ReplyWithNull(ctx);
    }
    if (got == 1) {
        job.nonce = NULL;          /* the argument, not ours to free */
        job_free(&q, &job);
    }
    return finish(&q);
}

/* The row's fixed retry delay, for a retry that names none. */
static int row_delay(Q *q, RMK *h, double *delay) {
    RMS *d = hget(h, F_DELAY);
    *delay = 0;
    int rc = d ? num(q, d, delay, "ERR emq: a job row's delay is not a number") : 0;
    sfree(q, d);
    return rc;
}

/* 1 retry scheduled, 2 dead, 0 stale, -1 error. */
static int retry(Q *q, RMS **a) {
    double delay = 0, att, max;
    int has_delay = slen(a[4]) > 0;
    if (has_delay && num(q, a[4], &delay, "ERR emq: delay must be a number or ''") < 0)
        return -1;
    Row r;
    int f = fenced(q, a[0], a[1], a[2], &r);
    if (f <= 0) return f;
    if (need_group(q, &r) < 0) return -1;
    int dead = eqc(a[5], "1");
    if (!dead) {
        if (num(q, r.attempts, &att, "ERR emq: a job row's attempts is not a number") < 0 ||
            (r.max ? num(q, r.max, &max, "ERR emq: a job row's max is not a number")
                   : fail(q, "ERR emq: a job row has no max")) < 0 ||
            (!has_delay && row_delay(q, r.h, &delay) < 0)) {
            row_free(q, &r);
            return -1;
        }
        dead = att >= max;
    }
    char why[320];                               /* read before the first write, as ack */
    int books = group_books(q, r.group, 1, 0, r.vcharge, why, sizeof why);
    /* the queue-wide keys the job leaves and goes into, as retry.lua */
    RMS *into[3] = {q->k[K_ACTIVE], dead ? q->k[K_DEAD] : q->k[K_DELAYED],
                    dead ? NULL : q->k[K_WAKE]};
    const int types[3] = {REDISMODULE_KEYTYPE_ZSET, REDISMODULE_KEYTYPE_ZSET,
                          REDISMODULE_KEYTYPE_LIST};
    if (books >= 0 && types_fit(q, into, types, 3) == -2) {
        row_free(q, &r);
        return fail(q, q->errbuf);
    }
    if (books < 0 ||
        (!books && time_settle(q, r.group, a[0], r.h, r.key, r.started, r.vcharge, 1) < 0)) {
        row_free(q, &r);
        return -1;
    }
    zrem(q, fx(q, K_ACTIVE, 1), q->k[K_ACTIVE], a[0]);
    int rc = books ? 0 : active_drop(q, r.group);
    if (rc == 0 && dead) {
        RMS *now_s = RedisModule_CreateStringFromLongLong(q->ctx, q->now);
        RedisModule_HashSet(r.h, REDISMODULE_HASH_NONE, F_STATE, S_DEAD, F_ERROR, a[3],
                            F_FINISHED, now_s, NULL);
        RedisModule_Replicate(q->ctx, "HSET", "sssssss", r.key, F_STATE, S_DEAD, F_ERROR, a[3],
                              F_FINISHED, now_s);
        sfree(q, now_s);
        rc = zadd(q, fx(q, K_DEAD, 1), q->k[K_DEAD], (double)q->now, a[0], 0);
        if (rc == 0) rc = hist_failed(q, r.task, r.group, 1);
        if (rc == 0) rc = notify(q, a[0], r.waiters);
        if (rc == 0 && r.wf) rc = wf_fail(q, r.wf, a[0]);
    } else if (rc == 0 && (rc = hist_failed(q, r.task, r.group, 0)) == 0) {
        RedisModule_HashSet(r.h, REDISMODULE_HASH_NONE, F_STATE, S_DELAYED, F_ERROR, a[3], NULL);
        RedisModule_Replicate(q->ctx, "HSET", "sssss", r.key, F_STATE, S_DELAYED, F_ERROR, a[3]);
        rc = delay_push(q, a[0], (double)q->now + delay);
    }
    row_free(q, &r);
    return rc < 0 ? -1 : dead ? 2 : 1;
}

static int cmd_retry(RedisModuleCtx *ctx, RMS **argv, int argc) {
    if (argc != ARGV0 + 6) return RedisModule_WrongArity(ctx);
    Q q;
    /* `active` checked in retry(), after the row, as retry.lua */
    if (q_init(&q, ctx, argv, B(K_GACTIVE), B(K_GLIMIT)) < 0) return finish(&q);
    int verdict = retry(&q, argv + ARGV0);
    if (!q.err) RedisModule_ReplyWithLongLong(ctx, verdict);
    return finish(&q);
}

static int cmd_extend(RedisModuleCtx *ctx, RMS **argv, int argc) {
    if (argc < ARGV0 + 1 || (argc - ARGV0 - 1) % 3 != 0) return RedisModule_WrongArity(ctx);
    Q q;
    if (q_init(&q, ctx, argv, B(K_ACTIVE), 0) < 0) return finish(&q);
    double lease;
    if (num(&q, argv[ARGV0], &lease, "ERR emq: lease must be a number") < 0) return finish(&q);
    int n = (argc - ARGV0 - 1) / 3;
    long long *out = RedisModule_Alloc(sizeof(long long) * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) {
        RMS **t = argv + ARGV0 + 1 + 3 * i;
        Row r;
        int f = fenced_as(&q, t[0], t[1], t[2], &r, 2);
        if (f < 0) break;
        if (f == 1) {
            int rc = zadd(&q, fx(&q, K_ACTIVE, 1), q.k[K_ACTIVE], (double)q.now + lease, t[0], 1);
            if (rc == 0) {                       /* seen running: its expiry spends it */
                RedisModule_HashSet(r.h, REDISMODULE_HASH_NONE, F_RAN, t[2], NULL);
                RedisModule_Replicate(q.ctx, "HSET", "sss", r.key, F_RAN, t[2]);
            }
            row_free(&q, &r);
            if (rc < 0) break;
        }
        out[i] = f;
    }
    if (!q.err) {
        RedisModule_ReplyWithArray(ctx, n);
        for (int i = 0; i < n; i++) RedisModule_ReplyWithLongLong(ctx, out[i]);
    }
    RedisModule_Free(out);
    return finish(&q);
}

/* 1 released, 0 stale, -1 error. */
static int release(Q *q, RMS **a) {
    Row r;
    int f = fenced(q, a[0], a[1], a[2], &r);
    if (f <= 0) return f;
    if (need_group(q, &r) < 0) return -1;
    long long att;
    double created = 0, off = 0;
    RMS *c = NULL, *prio = NULL;
    RedisModule_HashGet(r.h, REDISMODULE_HASH_NONE, F_CREATED, &c, F_PRIO, &prio, NULL);
    int rc = integer(q, r.attempts, &att, "ERR hash value is not an integer");
    if (rc == 0 && c) rc = num(q, c, &created, "ERR emq: a job row's created is not a number");
    /* back-off: tonumber(ARGV[5]) or 0 */
    if (RedisModule_StringToDouble(a[4], &off) != REDISMODULE_OK || isnan(off)) off = 0;
    sfree(q, c);
    /* read before the first write (group_books): a lane of the wrong type sends the job to
     * `dead` with the reason; other books that cannot be read are left as they are */
    char why[320];
    int books = rc == 0 ? group_books(q, r.group, 1, 1, r.vcharge, why, sizeof why) : 0;
    if (books < 0) rc = -1;
    if (rc == 0 && books == 2) {
        const int type = REDISMODULE_KEYTYPE_ZSET;   /* `active` first, as release.lua */
        if (types_fit(q, &q->k[K_ACTIVE], &type, 1) == -2) {
            sfree(q, prio);
            row_free(q, &r);
            return fail(q, q->errbuf);
        }
        rc = bury_as(q, a[0], r.group, NULL, why, r.h, r.key, REDISMODULE_KEYTYPE_HASH);
        r.h = NULL;
        if (rc == 0) zrem(q, fx(q, K_ACTIVE, 1), q->k[K_ACTIVE], a[0]);
        sfree(q, prio);
        row_free(q, &r);
        return rc < 0 ? -1 : 1;
    }
    if (rc == 0 && !books)
        rc = time_settle(q, r.group, a[0], r.h, r.key, r.started, r.vcharge, 0);
    if (rc == 0) {
        zrem(q, fx(q, K_ACTIVE, 1), q->k[K_ACTIVE], a[0]);
        rc = hincrby(q, r.h, r.key, F_ATTEMPTS, -1, &att);
    }
    if (rc == 0) {
        RedisModule_HashSet(r.h, REDISMODULE_HASH_NONE, F_STATE, S_PENDING, F_ERROR, a[3], NULL);
        RedisModule_Replicate(q->ctx, "HSET", "sssss", r.key, F_STATE, S_PENDING, F_ERROR, a[3]);
        rc = books ? 0 : active_drop(q, r.group);
    }
    if (rc == 0) rc = lane_in(q, r.group, a[0], lane_score(prio, created), books);
    sfree(q, prio);
    if (rc == 0 && off > 0 && !books) {
        int was;
        RMS *cur = NULL, *key = book_key(q, "gbackoff");
        double until = (double)q->now + off, prev = 0;
        RMK *h;
        rc = placed(q, r.group, &was);
        if (rc == 0) rc = dk(q, key, 1, REDISMODULE_KEYTYPE_HASH, &h);
        if (rc == 0) {
            cur = hget(h, r.group);
            if (cur) rc = num(q, cur, &prev, "ERR emq: a group back-off is not a number");
            if (rc == 0) {
                char buf[40];
                if (prev > until) until = prev;
                RMS *u = mk_tmp(q, fmt_num(until, buf));
                RedisModule_HashSet(h, REDISMODULE_HASH_NONE, r.group, u, NULL);
                RedisModule_Replicate(q->ctx, "HSET", "sss", key, r.group, u);
                sfree(q, u);
            }
        }
        if (h) RedisModule_CloseKey(h);
        sfree(q, cur);
        sfree(q, key);
        if (rc == 0) rc = settle(q, r.group, was);
    }
    row_free(q, &r);
    return rc < 0 ? -1 : 1;
}

static int cmd_release(RedisModuleCtx *ctx, RMS **argv, int argc) {
    if (argc != ARGV0 + 5) return RedisModule_WrongArity(ctx);
    Q q;
    /* `active` checked in release(), after the row and its group's books, as release.lua */
    if (q_init(&q, ctx, argv, B(K_GACTIVE), B(K_GLIMIT)) < 0) return finish(&q);
    int verdict = release(&q, argv + ARGV0);
    if (!q.err) RedisModule_ReplyWithLongLong(ctx, verdict);
    return finish(&q);
}

/* ZRANGEBYSCORE key -inf now LIMIT 0 limit, copied out before anything is changed. */
static RMS **due_in(RMK *h, double now, long long limit, long long *count);
static RMS **due_ids(Q *q, int fixed, long long limit, long long *count) {
    return due_in(fx(q, fixed, 0), (double)q->now, limit, count);
}

static RMS **due_in(RMK *h, double now, long long limit, long long *count) {
    RMS **ids = NULL;
    long long n = 0, cap = 0;
    if (limit > 0 && h &&
        RedisModule_ZsetFirstInScoreRange(h, -INFINITY, now, 0, 0) == REDISMODULE_OK) {
        while (n < limit && !RedisModule_ZsetRangeEndReached(h)) {
            double s;
            if (n == cap) {
                cap = cap ? cap * 2 : 16;
                ids = RedisModule_Realloc(ids, sizeof(RMS *) * (size_t)cap);
            }
            ids[n++] = RedisModule_ZsetRangeCurrentElement(h, &s);
            if (!RedisModule_ZsetRangeNext(h)) break;
        }
        RedisModule_ZsetRangeStop(h);
    }
    *count = n;
    return ids;
}

static void free_ids(Q *q, RMS **ids, long long n) {
    for (long long i = 0; i < n; i++) sfree(q, ids[i]);
    RedisModule_Free(ids);
}

/* One expired lease: 1 returned to its lane, 2 dead, 0 a ghost, -1 error. As reap.lua: a
 * job key that is not a hash, a row without a group or one whose attempts, max or created is
 * not an integer is buried, a job bound for a lane of the wrong type goes to `dead` naming
 * it, other books its group cannot read are left as they are (group_books). */
static int reap_one(Q *q, RMS *id) {
    RMS *jk = job_key(q, id);
    RMS *g = NULL, *att_s = NULL, *max_s = NULL, *created_s = NULL, *waiters = NULL;
    RMS *prio = NULL, *started = NULL, *vcharge = NULL, *wf = NULL, *task = NULL;
    RMS *nonce = NULL, *ran = NULL, *unrun_s = NULL;
    RMK *job = RedisModule_OpenKey(q->ctx, jk, REDISMODULE_READ | REDISMODULE_WRITE);
    double unrun = 0;
    int rc = 0, jt = RedisModule_KeyType(job), books = 0;
    char fault[400] = "", why[320];
    const char *whole = NULL;
    if (jt == REDISMODULE_KEYTYPE_HASH)
        RedisModule_HashGet(job, REDISMODULE_HASH_NONE, F_GROUP, &g, F_ATTEMPTS, &att_s, F_MAX,
                            &max_s, F_CREATED, &created_s, F_WAITERS, &waiters, F_PRIO, &prio,
                            F_STARTED, &started, F_VCHARGE, &vcharge, F_WF, &wf, F_TASK, &task,
                            F_NONCE, &nonce, F_RAN, &ran, F_UNRUN, &unrun_s, NULL);
    if (!g) {                                    /* not a hash, no group, or a ghost */
        if (jt != REDISMODULE_KEYTYPE_EMPTY) {
            rc = bury_as(q, id, NULL, "no group", NULL, job, jk, jt);
            job = NULL;
        }
        if (rc == 0) zrem(q, fx(q, K_ACTIVE, 1), q->k[K_ACTIVE], id);
        if (rc == 0 && jt != REDISMODULE_KEYTYPE_EMPTY) rc = 2;
        goto out;
    }
    /* read before the job's first write: its row, then its group's books */
    const struct { RMS *v; const char *name; } ints[3] = {
        {att_s, "attempts"}, {max_s, "max"}, {created_s, "created"}};
    for (int i = 0; i < 3 && !fault[0]; i++) {
        if (!ints[i].v) snprintf(fault, sizeof fault, "no %s", ints[i].name);
        else if (!int_ok(ints[i].v)) snprintf(fault, sizeof fault, "%s is not an integer",
                                              ints[i].name);
    }
    double att = int_val(att_s), max = int_val(max_s), created = int_val(created_s);
    /* never seen running (`ran` is not this claim's nonce): given back, `max` times at most;
     * an unreadable count of them counts as none, as the script's tonumber */
    if (unrun_s && (RedisModule_StringToDouble(unrun_s, &unrun) != REDISMODULE_OK || isnan(unrun)))
        unrun = 0;
    int give_back = !fault[0] && !((!ran && !nonce) || (ran && nonce && eq(ran, nonce))) &&
                    unrun < max;
    int to_dead = fault[0] || (!give_back && att >= max);
    books = group_books(q, g, 1, !to_dead, vcharge, why, sizeof why);
    if (books < 0) { rc = -1; goto out; }
    if (books == 2) {
        whole = why;
        to_dead = 1;
    }
    if (fault[0] || whole) {
        rc = bury_as(q, id, g, fault, whole, job, jk, REDISMODULE_KEYTYPE_HASH);
        job = NULL;
        if (rc < 0) goto out;
        job = RedisModule_OpenKey(q->ctx, jk, REDISMODULE_READ | REDISMODULE_WRITE);
    } else if (to_dead) {                        /* of the wrong type: this job stays as it is */
        const int type = REDISMODULE_KEYTYPE_ZSET;
        if (types_fit(q, &q->k[K_DEAD], &type, 1) == -2) {
            rc = fail(q, q->errbuf);
            goto out;
        }
    }
    if (!books && (rc = time_settle(q, g, id, job, jk, started, vcharge, 0)) < 0) goto out;
    zrem(q, fx(q, K_ACTIVE, 1), q->k[K_ACTIVE], id);
    if (!books && (rc = active_drop(q, g)) < 0) goto out;
    if (fault[0] || whole) {
        rc = 2;
    } else if (give_back) {
        long long v;
        rc = hincrby(q, job, jk, F_ATTEMPTS, -1, &v);
        if (rc == 0) rc = hincrby(q, job, jk, F_UNRUN, 1, &v);
        if (rc == 0) {
            RedisModule_HashSet(job, REDISMODULE_HASH_NONE, F_STATE, S_PENDING, F_ERROR, S_UNRUN,
                                NULL);
            RedisModule_Replicate(q->ctx, "HSET", "sssss", jk, F_STATE, S_PENDING, F_ERROR,
                                  S_UNRUN);
            rc = lane_in(q, g, id, lane_score(prio, created), books);
        }
        if (rc == 0) rc = hist_failed(q, task, g, 0);
        if (rc == 0) rc = 1;
    } else if (to_dead) {
        RMS *now_s = RedisModule_CreateStringFromLongLong(q->ctx, q->now);
        RedisModule_HashSet(job, REDISMODULE_HASH_NONE, F_STATE, S_DEAD, F_ERROR,
                            S_LEASE_EXPIRED, F_FINISHED, now_s, NULL);
        RedisModule_Replicate(q->ctx, "HSET", "sssssss", jk, F_STATE, S_DEAD, F_ERROR,
                              S_LEASE_EXPIRED, F_FINISHED, now_s);
        sfree(q, now_s);
        rc = zadd(q, fx(q, K_DEAD, 1), q->k[K_DEAD], (double)q->now, id, 0);
        if (rc == 0) rc = hist_failed(q, task, g, 1);
        if (rc == 0) rc = notify(q, id, waiters);
        if (rc == 0 && wf) rc = wf_fail(q, wf, id);
        if (rc == 0) rc = 2;
    } else {
        RedisModule_HashSet(job, REDISMODULE_HASH_NONE, F_STATE, S_PENDING, F_ERROR,
                            S_LEASE_EXPIRED, NULL);
        RedisModule_Replicate(q->ctx, "HSET", "sssss", jk, F_STATE, S_PENDING, F_ERROR,
                              S_LEASE_EXPIRED);
        rc = lane_in(q, g, id, lane_score(prio, created), books);
        if (rc == 0) rc = hist_failed(q, task, g, 0);
        if (rc == 0) rc = 1;
    }
out:
    if (job) RedisModule_CloseKey(job);
    sfree(q, jk); sfree(q, g); sfree(q, att_s); sfree(q, max_s);
    sfree(q, created_s); sfree(q, waiters); sfree(q, prio); sfree(q, wf); sfree(q, task);
    sfree(q, started); sfree(q, vcharge); sfree(q, nonce); sfree(q, ran); sfree(q, unrun_s);
    return rc;
}

static int cmd_reap(RedisModuleCtx *ctx, RMS **argv, int argc) {
    if (argc != ARGV0 + 1) return RedisModule_WrongArity(ctx);
    Q q;
    if (q_init(&q, ctx, argv, B(K_ACTIVE), 0) < 0) return finish(&q);
    long long limit, n, returned = 0, dead = 0, seen = 0;
    if (count_arg(&q, argv[ARGV0], &limit, "ERR emq: limit must be an integer >= 0") < 0)
        return finish(&q);
    /* The clock mark: the latest server time a reap saw, raised to now, never lowered
     * (an unreadable one counts as none, as the script's tonumber). */
    RMS *ckey = book_key(&q, "clock");
    RMK *ch;
    if (dk(&q, ckey, 1, REDISMODULE_KEYTYPE_HASH, &ch) == 0) {
        RMS *s = hget(ch, F_SEEN);
        double d = 0;
        int readable = s && RedisModule_StringToDouble(s, &d) == REDISMODULE_OK &&
                       d > -1e15 && d < 1e15;
        if (readable) seen = to_ll(d);
        if (!readable || (double)q.now > d) {
            RMS *now_s = RedisModule_CreateStringFromLongLong(ctx, q.now);
            RedisModule_HashSet(ch, REDISMODULE_HASH_NONE, F_SEEN, now_s, NULL);
            RedisModule_Replicate(ctx, "HSET", "sss", ckey, F_SEEN, now_s);
            sfree(&q, now_s);
        }
        sfree(&q, s);
    }
    if (ch) RedisModule_CloseKey(ch);
    sfree(&q, ckey);
    if (q.err) return finish(&q);
    RMS **ids = due_ids(&q, K_ACTIVE, limit, &n);
    for (long long i = 0; i < n; i++) {
        int rc = reap_one(&q, ids[i]);
        if (rc < 0) break;
        returned += rc == 1;
        dead += rc == 2;
    }
    free_ids(&q, ids, n);
    if (!q.err) {
        RedisModule_ReplyWithArray(ctx, 4);
        RedisModule_ReplyWithLongLong(ctx, returned);
        RedisModule_ReplyWithLongLong(ctx, dead);
        RedisModule_ReplyWithLongLong(ctx, q.now);
        RedisModule_ReplyWithLongLong(ctx, seen);
    }
    return finish(&q);
}

/* One due id of `delayed`, as promote.lua: a job key that is not a hash or a row without a
 * group is buried, a job whose lane is of the wrong type goes to `dead` naming it, one whose
 * group's other books cannot be read goes into its lane only (group_books). */
static int promote_one(Q *q, RMS *id) {
    RMS *jk = job_key(q, id), *g = NULL, *prio = NULL;
    RMK *job = RedisModule_OpenKey(q->ctx, jk, REDISMODULE_READ | REDISMODULE_WRITE);
    int jt = RedisModule_KeyType(job), rc = 0, books = 0;
    char why[320];
    if (jt == REDISMODULE_KEYTYPE_HASH)
        RedisModule_HashGet(job, REDISMODULE_HASH_NONE, F_GROUP, &g, F_PRIO, &prio, NULL);
    if (!g && jt != REDISMODULE_KEYTYPE_EMPTY) {
        rc = bury_as(q, id, NULL, "no group", NULL, job, jk, jt);
        job = NULL;
    } else if (g) {
        books = group_books(q, g, 0, 1, NULL, why, sizeof why);
        if (books < 0) rc = -1;
        else if (books == 2) {
            rc = bury_as(q, id, g, NULL, why, job, jk, jt);
            job = NULL;
        }
    }
    if (rc == 0) zrem(q, fx(q, K_DELAYED, 1), q->k[K_DELAYED], id);
    if (rc == 0 && g && books != 2) {
        RedisModule_HashSet(job, REDISMODULE_HASH_NONE, F_STATE, S_PENDING, NULL);
        RedisModule_Replicate(q->ctx, "HSET", "sss", jk, F_STATE, S_PENDING);
        rc = lane_in(q, g, id, lane_score(prio, (double)q->now), books);
    }
    if (job) RedisModule_CloseKey(job);
    sfree(q, jk);
    sfree(q, g);
    sfree(q, prio);
    return rc;
}

static int cmd_promote(RedisModuleCtx *ctx, RMS **argv, int argc) {
    if (argc != ARGV0 + 1) return RedisModule_WrongArity(ctx);
    Q q;
    if (q_init(&q, ctx, argv, B(K_DELAYED), B(K_PAUSED)) < 0) return finish(&q);
    long long limit, n;
    if (count_arg(&q, argv[ARGV0], &limit, "ERR emq: limit must be an integer >= 0") < 0)
        return finish(&q);
    RMS **ids = due_ids(&q, K_DELAYED, limit, &n);
    for (long long i = 0; i < n; i++)
        if (promote_one(&q, ids[i]) < 0) break;
    free_ids(&q, ids, n);
    if (q.err) return finish(&q);
    /* groups whose wait is over: out of gwait, back on the ring if still open */
    /* (no handle on gwait stays open across admit: one that emptied the zset, whose key
     * then went, would not see the zset admit makes again) */
    RMS *wkey = book_key(&q, "gwait");
    RMK *wh;
    long long ng = 0;
    RMS **groups = NULL;
    if (dk(&q, wkey, 0, REDISMODULE_KEYTYPE_ZSET, &wh) == 0) {
        groups = due_in(wh, (double)q.now, limit, &ng);
        if (wh) RedisModule_CloseKey(wh);
        for (long long i = 0; i < ng; i++) {
            int open, rc = dk(&q, wkey, 1, REDISMODULE_KEYTYPE_ZSET, &wh);
            if (rc == 0) rc = zrem(&q, wh, wkey, groups[i]) < 0 ? -1 : 0;
            if (wh) RedisModule_CloseKey(wh);
            if (rc < 0) break;
            /* a group whose books cannot be read stays out, as a claim leaves it */
            char why[320];
            int books = group_books(&q, groups[i], 0, 1, NULL, why, sizeof why);
            if (books < 0 || (!books && is_open(&q, groups[i], &open) < 0)) break;
            if (!books && open && admit(&q, groups[i]) < 0) break;
        }
    }
    free_ids(&q, groups, ng);
    if (q.err || dk(&q, wkey, 0, REDISMODULE_KEYTYPE_ZSET, &wh) < 0) {
        sfree(&q, wkey);
        return finish(&q);
    }
    long long next_due = -1;
    for (int k = 0; k < 2; k++) {
        double score;
        RMS *head = zfirst(k == 0 ? fx(&q, K_DELAYED, 0) : wh, &score);
        if (head) {
            double d = score - (double)q.now;  /* the script's integer reply truncates */
            long long due = d <= 0 ? 0 : to_ll(d);
            if (next_due < 0 || due < next_due) next_due = due;
            sfree(&q, head);
        }
    }
    if (wh) RedisModule_CloseKey(wh);
    sfree(&q, wkey);
    /* ring_any: EXISTS ring gvt, without reading the mode */
    RMS *gk = book_key(&q, "gvt");
    RMK *gh = RedisModule_OpenKey(ctx, gk, REDISMODULE_READ);   /* EXISTS: of any type */
    RMK *rh = RedisModule_OpenKey(ctx, q.k[K_RING], REDISMODULE_READ);
    long long ringed = (gh && RedisModule_KeyType(gh) != REDISMODULE_KEYTYPE_EMPTY) ||
                       (rh && RedisModule_KeyType(rh) != REDISMODULE_KEYTYPE_EMPTY);
    if (gh) RedisModule_CloseKey(gh);
    if (rh) RedisModule_CloseKey(rh);
    sfree(&q, gk);
    if (q.err) return finish(&q);
    long long claimable = ringed > 0 && !paused(&q);
    RedisModule_ReplyWithArray(ctx, 3);
    RedisModule_ReplyWithLongLong(ctx, n);
    RedisModule_ReplyWithLongLong(ctx, next_due);
    RedisModule_ReplyWithLongLong(ctx, claimable);
    return finish(&q);
}

/* ---- load -------------------------------------------------------------------------- */

static RMS *mk(RedisModuleCtx *ctx, const char *s) {
    return RedisModule_CreateString(ctx, s, strlen(s));
}

__attribute__((visibility("default"))) int RedisModule_OnLoad(RedisModuleCtx *ctx, RMS **argv,
                                                          int argc) {
    (void)argv;
    (void)argc;
    if (EMQ_InitApi(ctx, "emq", 1, REDISMODULE_APIVER_1) != REDISMODULE_OK)
        return REDISMODULE_ERR;
    F_TASK = mk(ctx, "task"); F_PAYLOAD = mk(ctx, "payload"); F_GROUP = mk(ctx, "group");
    F_STATE = mk(ctx, "state"); F_ATTEMPTS = mk(ctx, "attempts"); F_MAX = mk(ctx, "max");
    F_LEASE = mk(ctx, "lease"); F_DELAY = mk(ctx, "delay"); F_TTL = mk(ctx, "ttl");
    F_CREATED = mk(ctx, "created"); F_NONCE = mk(ctx, "nonce"); F_STARTED = mk(ctx, "started");
    F_FINISHED = mk(ctx, "finished"); F_RESULT = mk(ctx, "result"); F_ERROR = mk(ctx, "error");
    F_WAITERS = mk(ctx, "waiters"); F_FENCE = mk(ctx, "fence"); F_PRIO = mk(ctx, "prio");
    F_VCHARGE = mk(ctx, "vcharge"); F_EMPTY = mk(ctx, "");
    S_ACTIVE = mk(ctx, "active"); S_PENDING = mk(ctx, "pending"); S_DELAYED = mk(ctx, "delayed");
    S_DONE = mk(ctx, "done"); S_DEAD = mk(ctx, "dead"); S_ZERO = mk(ctx, "0");
    S_ONE = mk(ctx, "1"); S_D = mk(ctx, "d"); S_LEASE_EXPIRED = mk(ctx, "lease expired");
    S_XX = mk(ctx, "XX"); S_MINUS1 = mk(ctx, "-1"); S_LEFT = mk(ctx, "LEFT");
    S_RIGHT = mk(ctx, "RIGHT"); S_WAITING = mk(ctx, "waiting");
    S_CANCELLED = mk(ctx, "cancelled"); S_FAILED = mk(ctx, "failed");
    F_WF = mk(ctx, "wf"); F_NEXT = mk(ctx, "next"); F_SLOT = mk(ctx, "slot");
    F_NPEND = mk(ctx, "npend"); F_IMM = mk(ctx, "imm"); F_NSLOTS = mk(ctx, "nslots");
    F_SPLICE = mk(ctx, "splice"); F_COMMA = mk(ctx, "comma"); F_CD = mk(ctx, "cd");
    F_FAILED = mk(ctx, "failed"); F_WAITING = mk(ctx, "waiting"); F_LERR = mk(ctx, "lerr");
    F_RAN = mk(ctx, "ran"); F_UNRUN = mk(ctx, "unrun"); F_SEEN = mk(ctx, "seen");
    F_STALE_ACKS = mk(ctx, "stale_acks");
    S_UNRUN = mk(ctx, "lease expired before the job was seen running (attempt not counted)");
    static const struct { const char *name; RedisModuleCmdFunc fn; } cmds[] = {
        {"emq.enqueue", cmd_enqueue}, {"emq.claim", cmd_claim}, {"emq.ack", cmd_ack},
        {"emq.retry", cmd_retry}, {"emq.extend", cmd_extend}, {"emq.release", cmd_release},
        {"emq.reap", cmd_reap}, {"emq.promote", cmd_promote},
    };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        /* Keys 1..12 so that Cluster routes the call and refuses it while the slot moves
         * (the guard key is never written, as with the scripts). */
        if (RedisModule_CreateCommand(ctx, cmds[i].name, cmds[i].fn, "write", 1,
                                      NFIXED, 1) != REDISMODULE_OK)
            return REDISMODULE_ERR;
    return REDISMODULE_OK;
}
