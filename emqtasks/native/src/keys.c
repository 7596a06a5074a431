/* src/keys.c: the 12 fixed keys of a call (opened and type-checked once), the names of the keys
 * a command forms itself, and plain reads (twin of lua/lib/keys.lua).
 * Included once by emq.c (a unity build), after the files before it there; never alone. */

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
/* string: the id of the job holding a unique key (enqueue.c), PX its unique_for */
static RMS *unique_key(Q *q, RMS *k) { return mkname(q, "u:", k, ""); }

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

/* lane_score: priority * PRIO_SPAN + time; a priority that is no number is 0. */
static double lane_score(RMS *prio, double t) {
    double p;
    if (!prio || RedisModule_StringToDouble(prio, &p) != REDISMODULE_OK || !isfinite(p)) p = 0;
    return p * PRIO_SPAN + t;
}
