/* src/core.c: the scripts' number and text rules, the error of a call, the full server (twin of
 * lua/lib/core.lua: int_ok, runs_when_full).
 * Included once by emq.c (a unity build), after the files before it there; never alone. */

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

static RMS *mk_tmp(Q *q, const char *c) { return RedisModule_CreateString(q->ctx, c, strlen(c)); }
