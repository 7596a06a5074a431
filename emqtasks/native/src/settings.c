/* src/settings.c: a group's own setting, else the default for every group (gdefaults), the
 * books' reads and the fairness mode (twin of lua/lib/settings.lua).
 * Included once by emq.c (a unity build), after the files before it there; never alone. */

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
