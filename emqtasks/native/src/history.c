/* src/history.c: the minute's history counters (twin of lua/lib/history.lua hist_*).
 * Included once by emq.c (a unity build), after the files before it there; never alone. */

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
        double hours = dflt_num(default_of(q, D_HISTORY), 24);
        if (hours <= 0) {
            q->hstate = -1;
        } else {
            char name[48];
            snprintf(name, sizeof name, "h:%lld", (long long)floor((double)q->now / 60000.0));
            q->httl = (long long)floor(hours * 3600) + 60;
            q->hcap = dflt_num(default_of(q, D_HGROUPS), 1000);
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
/* A start of tenant t's, wait bucket i (the script's htenant): tn:<t> + 1, created against
 * the cap (nt); past it the minute counts it in otn, with no histogram. */
static int htenant(Q *q, RMS *t, int i) {
    long long v, n;
    RMS *f = hfield(q, "tn:", t);
    if (hadd(q, RedisModule_CreateStringFromString(q->ctx, f), 1, &v) < 0) {
        sfree(q, f);
        return -1;
    }
    int rc = 0, over = 0;
    if (v == 1) {
        rc = hexpire(q);
        if (rc == 0) rc = hadd(q, mk_tmp(q, "nt"), 1, &n);
        if (rc == 0 && (double)n > q->hcap) {
            hist_flush(q);                        /* the HSET of f before its HDEL */
            hdel(q, q->hh, q->hkey, f);
            rc = hadd(q, mk_tmp(q, "otn"), 1, NULL);
            over = 1;
        }
    }
    sfree(q, f);
    if (rc < 0 || over) return rc;
    char c[8];
    snprintf(c, sizeof c, "tw%d:", i);
    return hadd(q, hfield(q, c, t), 1, NULL);
}

/* t: the group's tenant (NULL: none). */
static int hist_started(Q *q, RMS *task, RMS *g, double score, RMS *t) {
    int on = hist_open(q);
    if (on <= 0) return on;
    double wait = hclamp((double)q->now - (score - floor(score / PRIO_SPAN) * PRIO_SPAN));
    char c[8];
    int i = hbucket(wait);
    snprintf(c, sizeof c, "w%d:", i);
    if (hcount(q, hfield(q, c, task)) < 0 ||
        hadd(q, hfield(q, "ws:", task), (long long)wait, NULL) < 0)
        return -1;
    if (hgroup(q, "a", g, H_STARTED) < 0) return -1;
    return t ? htenant(q, t, i) : 0;
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

/* This minute's history hash, or NULL when the history is off (gdefaults read first). */
static RMS *hist_key(Q *q) {
    if (dflt_num(default_of(q, D_HISTORY), 24) <= 0) return NULL;
    char name[48];
    snprintf(name, sizeof name, "h:%lld", (long long)floor((double)q->now / 60000.0));
    return book_key(q, name);
}
