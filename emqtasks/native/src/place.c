/* src/place.c: where a group stands: open or not, under its limit and rate, on the ring or in
 * gwait; lanes (twin of lua/lib/place.lua).
 * Included once by emq.c (a unity build), after the files before it there; never alone. */

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

/* When the group's rate budget allows its next start (*has 1, *at ms), or *has 0 now. */
static int rate_ready(Q *q, RMS *g, int *has, double *at) {
    int rated;
    long long m, per;
    *has = 0;
    if (rate_of(q, g, &rated, &m, &per) < 0) return -1;
    if (!rated) return 0;
    return window_ready(q, starts_key(q, g), m, per, has, at);
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

/* An open group goes on the ring, or in gwait while it may not start yet. */
static int admit(Q *q, RMS *g) {
    int has;
    double at;
    if (ready_at(q, g, &has, &at) < 0) return -1;
    return has ? wait_push(q, g, at) : ring_enter(q, g);
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

/* One job of tenant t left flight: its books drop, and a tenant held back only by its
 * limit returns to the ring with a wake (turns mode). */
static int tenant_drop(Q *q, RMS *t) {
    RMS *key = book_key(q, "tactive");
    RMK *h;
    long long act;
    int rc = dk(q, key, 1, REDISMODULE_KEYTYPE_HASH, &h);
    if (rc == 0) rc = hincrby(q, h, key, t, -1, &act);
    if (rc == 0 && act <= 0) hdel(q, h, key, t);
    if (h) RedisModule_CloseKey(h);
    sfree(q, key);
    if (rc < 0) return -1;
    int has, tf;
    double lim;
    if (tenant_setting(q, "tlimit", t, &has, &lim) < 0) return -1;
    if (!has || !((double)act + 1 >= lim && (double)act < lim)) return 0;
    if ((tf = time_fair(q)) < 0) return -1;
    RMS *rk = tf ? tgvt_key(q, t) : tring_key(q, t);
    RMK *rh;
    rc = dk(q, rk, 0, tf ? REDISMODULE_KEYTYPE_ZSET : REDISMODULE_KEYTYPE_LIST, &rh);
    size_t n = vlen(rh);
    if (rh) RedisModule_CloseKey(rh);
    sfree(q, rk);
    if (rc < 0 || n == 0) return rc;
    RMS *pk = book_key(q, "tpaused");
    RedisModuleCallReply *r = RedisModule_Call(q->ctx, "SISMEMBER", "ss", pk, t);
    sfree(q, pk);
    if (!r || RedisModule_CallReplyType(r) != REDISMODULE_REPLY_INTEGER) {
        if (r) RedisModule_FreeCallReply(r);
        return fail(q, WRONGTYPE);
    }
    int paused = RedisModule_CallReplyInteger(r) != 0;
    RedisModule_FreeCallReply(r);
    if (paused) return 0;
    if (tenant_enter(q, t) < 0) return -1;
    return wake(q, 0);
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
    RMS *t;
    if (tenant_of(q, g, &t) < 0) return -1;
    if (t) {
        int rc = tenant_drop(q, t);
        sfree(q, t);
        if (rc < 0) return -1;
    }
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
