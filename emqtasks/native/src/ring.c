/* src/ring.c: the ring of serviceable groups (turns) or gvt (time), and gwait (twin of
 * lua/lib/ring.lua).
 * Included once by emq.c (a unity build), after the files before it there; never alone. */

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
