/* src/settings.c: a group's own setting, else the default for every group (gdefaults), the
 * books' reads and the fairness mode (twin of lua/lib/settings.lua). The only C file that
 * reads a group's settings or the defaults, and parses a rate (tests/test_store_layout.py).
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

/* The defaults in gdefaults, by field: the first four are a group's settings' (each group may
 * have its own, in its book below), the last two the queue's alone. */
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

/* The default d as read_defaults read it (NULL: unset), the scripts' default(name): call
 * read_defaults first, its error is the caller's to return. Borrowed, not to be freed. */
static RMS *default_of(Q *q, int d) { return q->dflt[d]; }

/* Where a group's own setting d lives: a fixed key, or (fixed -1) the book BASE..book. */
static const struct { int fixed; const char *book; } OWN[D_HISTORY] = {
    [D_LIMIT] = {K_GLIMIT, NULL}, [D_RATE] = {-1, "grate"},
    [D_MAX_SIZE] = {-1, "gmax"}, [D_WEIGHT] = {K_GWEIGHT, NULL}};

/* A group's own setting d (D_LIMIT ... D_WEIGHT), else the default for every group
 * (gdefaults, read once per call), else NULL: the rule, here alone (every other file reads a
 * group's settings through this file). *out is the caller's to free. */
static int setting(Q *q, int d, RMS *g, RMS **out) {
    *out = NULL;
    if (OWN[d].fixed >= 0) {
        RMK *h = fx(q, OWN[d].fixed, 0);
        if (q->err) return -1;
        *out = hget(h, g);
    } else if (book_get(q, OWN[d].book, g, out) < 0) {
        return -1;
    }
    if (*out) return 0;
    if (read_defaults(q) < 0) return -1;
    if (q->dflt[d]) *out = RedisModule_CreateStringFromString(q->ctx, q->dflt[d]);
    return 0;
}

/* A setting as the checks before a write read it (group_seat, group_books, enqueue_books):
 * 1 absent or int_ok (*v its value, *has whether present), 0 unreadable, -1 error. */
static int setting_int(Q *q, int d, RMS *g, int *has, double *v) {
    RMS *s;
    if (setting(q, d, g, &s) < 0) return -1;
    int ok = !s || int_ok(s);
    *has = s != NULL;
    *v = ok ? int_val(s) : 0;
    sfree(q, s);
    return ok;
}

/* A setting as a number (*has 0: none); one that is not a number fails the call with msg. */
static int setting_num(Q *q, int d, RMS *g, int *has, double *v, const char *msg) {
    RMS *s;
    *has = 0;
    if (setting(q, d, g, &s) < 0) return -1;
    *has = s != NULL;
    int rc = s ? num(q, s, v, msg) : 0;
    sfree(q, s);
    return rc;
}

/* A group's limit (*has 0: none). */
static int limit_of(Q *q, RMS *g, int *has, double *lim) {
    return setting_num(q, D_LIMIT, g, has, lim, "ERR emq: a group limit is not a number");
}

/* A group's cap on its waiting jobs (*has 0: none). */
static int max_size_of(Q *q, RMS *g, int *has, double *cap) {
    return setting_num(q, D_MAX_SIZE, g, has, cap, "ERR emq: a group max_size is not a number");
}

static int weight_of(Q *q, RMS *g, double *w) {
    int has;
    *w = 1;
    return setting_num(q, D_WEIGHT, g, &has, w, "ERR emq: a group weight is not a number");
}

/* Digits from p[i] on: their count, *v their value (*ovf set past LLONG_MAX). */
static size_t digits_at(const char *p, size_t i, size_t len, long long *v, int *ovf) {
    size_t j = i;
    *v = 0;
    for (; j < len && p[j] >= '0' && p[j] <= '9'; j++) {
        if (*v > (LLONG_MAX - 9) / 10) *ovf = 1; else *v = *v * 10 + (p[j] - '0');
    }
    return j - i;
}

/* A group's rate "max_jobs:per_ms", parsed here alone (digits ':' digits and nothing else,
 * the scripts' '^(%d+):(%d+)$'): 1 a rate (*m, *per; *longest the longer side's digits, *ovf
 * a number past LLONG_MAX), 0 none or not that text, -1 error. */
static int rate_read(Q *q, RMS *g, long long *m, long long *per, size_t *longest, int *ovf) {
    RMS *s;
    if (setting(q, D_RATE, g, &s) < 0) return -1;
    if (!s) return 0;
    size_t len, a, b;
    const char *p = RedisModule_StringPtrLen(s, &len);
    long long x, y;
    int rated = 0;
    *ovf = 0;
    a = digits_at(p, 0, len, &x, ovf);
    if (a > 0 && a < len && p[a] == ':') {
        b = digits_at(p, a + 1, len, &y, ovf);
        if (b > 0 && a + 1 + b == len) {
            rated = 1;
            *m = x;
            *per = y;
            *longest = a > b ? a : b;
        }
    }
    sfree(q, s);
    return rated;
}

/* (max_jobs, per_ms), *has 0 when none (or not "digits:digits", as the script's match). */
static int rate_of(Q *q, RMS *g, int *has, long long *m, long long *per) {
    size_t longest;
    int ovf, rc = rate_read(q, g, m, per, &longest, &ovf);
    *has = rc == 1;
    if (rc < 0) return -1;
    if (rc == 1 && ovf) {
        *has = 0;
        return fail(q, "ERR emq: a group rate is out of range");
    }
    return 0;
}

/* A group's rate as the checks before a write read it (group_seat, enqueue_books): 1
 * readable (*has whether it is rated, *m, *per), 0 not (a number over 15 digits, past a
 * double's exact integers), -1 error. */
static int rate_checked(Q *q, RMS *g, int *has, long long *m, long long *per) {
    size_t longest;
    int ovf, rc = rate_read(q, g, m, per, &longest, &ovf);
    *has = 0;
    if (rc < 0) return -1;
    if (rc == 1 && longest > 15) return 0;
    *has = rc == 1;
    return 1;
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

/* A tenant's setting in book (tlimit, tweight): its own, else the default for every tenant
 * (field ''), as a number (*has 0: none, or no number); the scripts' tenant_limit. */
static int tenant_setting(Q *q, const char *book, RMS *t, int *has, double *v) {
    RMS *s;
    *has = 0;
    if (book_get(q, book, t, &s) < 0) return -1;
    if (!s && book_get(q, book, F_EMPTY, &s) < 0) return -1;
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

/* A tenant's rate "max_jobs:per_ms" in trate (its own, else the default, field ''), parsed
 * as rate_read parses a group's: *has 0 when none or not that text (lua TEN.rate_of). */
static int tenant_rate(Q *q, RMS *t, int *has, long long *m, long long *per) {
    RMS *s;
    *has = 0;
    if (book_get(q, "trate", t, &s) < 0) return -1;
    if (!s && book_get(q, "trate", F_EMPTY, &s) < 0) return -1;
    if (!s) return 0;
    size_t len, a, b;
    const char *p = RedisModule_StringPtrLen(s, &len);
    long long x, y;
    int ovf = 0;
    a = digits_at(p, 0, len, &x, &ovf);
    if (a > 0 && a < len && p[a] == ':') {
        b = digits_at(p, a + 1, len, &y, &ovf);
        if (b > 0 && a + 1 + b == len && !ovf) {
            *has = 1;
            *m = x;
            *per = y;
        }
    }
    sfree(q, s);
    return 0;
}

/* When a budget of m starts in any window of per ms allows the next start (*has 1, *at ms),
 * or *has 0 now, from the list of recent start times at key (freed here): a group's rate
 * (place.c rate_ready) and a tenant's (ring.c tenant_ready). */
static int window_ready(Q *q, RMS *key, long long m, long long per, int *has, double *at) {
    RMS *o;
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
