/* src/ring.c: the ring of serviceable groups (turns) or gvt (time), and gwait (twin of
 * lua/lib/ring.lua).
 * Included once by emq.c (a unity build), after the files before it there; never alone. */

/* vstart: the later of the virtual time of g (a group or a tenant's mark) and the floor
 * gvrun[fl] (NULL: the queue's, gvrun['']). */
static int vstart(Q *q, RMS *g, RMS *fl, double *v) {
    int hf, ho;
    double floor_v = 0, own = 0;
    if (book_num(q, "gvrun", fl ? fl : F_EMPTY, &hf, &floor_v) < 0) return -1;
    if (!hf) floor_v = 0;
    if (book_num(q, "gvrun", g, &ho, &own) < 0) return -1;
    *v = ho && own > floor_v ? own : floor_v;
    return 0;
}

/* Tenants (lua/lib/ring.lua): a tenant's mark stands on the ring (time: in gvt at the
 * tenant's virtual time) exactly while its own ring (BASE t:<tenant>:ring; time: its zset
 * t:<tenant>:gvt) holds a group and it is open. Names: timefair.c. */

/* Not paused and under its limit (tlimit, tactive). */
static int tenant_open(Q *q, RMS *t, int *open) {
    RMS *key = book_key(q, "tpaused");
    RedisModuleCallReply *r = RedisModule_Call(q->ctx, "SISMEMBER", "ss", key, t);
    sfree(q, key);
    if (!r || RedisModule_CallReplyType(r) != REDISMODULE_REPLY_INTEGER) {
        if (r) RedisModule_FreeCallReply(r);
        return fail(q, WRONGTYPE);
    }
    int paused = RedisModule_CallReplyInteger(r) != 0;
    RedisModule_FreeCallReply(r);
    *open = !paused;
    if (paused) return 0;
    int has, hact;
    double lim, act;
    if (tenant_setting(q, "tlimit", t, &has, &lim) < 0) return -1;
    if (!has) return 0;
    if (book_num(q, "tactive", t, &hact, &act) < 0) return -1;
    *open = (hact ? act : 0) < lim;
    return 0;
}

/* LREM key count m on an open list (count 1: the first from the head, -1: the first from
 * the tail, 0: every one), in one step when m stands at that end (a claim's case), else by
 * one pass round the list; replicated as LREM. */
static long long list_rem(Q *q, RMK *h, RMS *key, long long count, RMS *m) {
    size_t n = vlen(h);
    long long removed = 0;
    if (n == 0) return 0;
    int end = count < 0 ? REDISMODULE_LIST_TAIL : REDISMODULE_LIST_HEAD;
    int other = count < 0 ? REDISMODULE_LIST_HEAD : REDISMODULE_LIST_TAIL;
    RMS *e = RedisModule_ListPop(h, end);
    if (e && count != 0 && eq(e, m)) {
        removed = 1;
        sfree(q, e);
    } else {
        if (e) {
            RedisModule_ListPush(h, end, e);
            sfree(q, e);
        }
        for (size_t i = 0; i < n; i++) {
            e = RedisModule_ListPop(h, end);
            if (!e) break;
            if ((count == 0 || removed == 0) && eq(e, m)) removed++;
            else RedisModule_ListPush(h, other, e);
            sfree(q, e);
        }
    }
    if (removed) RedisModule_Replicate(q->ctx, "LREM", "sls", key, count, m);
    return removed;
}

/* A tenant's recent start times (BASE t:<tenant>:starts), kept while it has a rate. */
static RMS *tstarts_key(Q *q, RMS *t) { return mkname(q, "t:", t, ":starts"); }

/* When the tenant's rate budget allows its next start (*has 1, *at ms), or *has 0 now: at
 * most max_jobs starts over all its groups in any window of per_ms (lua TEN.ready). */
static int tenant_ready(Q *q, RMS *t, int *has, double *at) {
    int rated;
    long long m, per;
    *has = 0;
    if (tenant_rate(q, t, &rated, &m, &per) < 0) return -1;
    if (!rated) return 0;
    return window_ready(q, tstarts_key(q, t), m, per, has, at);
}

/* Hold a tenant's mark off the ring until `at` (twait, promote returns it); a new earliest
 * return re-times the parked masters (lua TEN.wait_push). */
static int twait_push(Q *q, RMS *t, double at) {
    RMS *key = book_key(q, "twait");
    RMK *h;
    int rc = dk(q, key, 1, REDISMODULE_KEYTYPE_ZSET, &h);
    if (rc == 0) rc = zadd(q, h, key, at, t, 0);
    int first = 0;
    if (rc == 0) {
        double s;
        RMS *f = zfirst(h, &s);
        first = f && eq(f, t);
        sfree(q, f);
    }
    if (h) RedisModule_CloseKey(h);
    sfree(q, key);
    return rc < 0 ? -1 : first ? wake(q, 1) : 0;
}

/* The mark joins the ring, or twait while the tenant's rate budget is spent. */
static int tenant_enter(Q *q, RMS *t) {
    int tf = time_fair(q), rc;
    if (tf < 0) return -1;
    {   /* either mode: a spent rate budget holds the mark back (time mode: its virtual
         * time stays in gvrun, it returns at that or the floor) */
        int has;
        double at;
        if (tenant_ready(q, t, &has, &at) < 0) return -1;
        if (has) return twait_push(q, t, at);
    }
    RMS *m = tenant_mark(q, t);
    if (tf) {
        double v;
        rc = vstart(q, m, NULL, &v);
        if (rc == 0) rc = gvt_add(q, m, (double)(long long)v, 0);
        if (rc == 0) rc = book_set_ll(q, "gvrun", m, (long long)v);
    } else {
        rc = rpush(q, fx(q, K_RING, 1), q->k[K_RING], m);
    }
    if (rc == 0) hdel_fx(q, K_GTURN, m);
    sfree(q, m);
    return rc;
}

/* count as list_rem's: where the mark is known to stand, or 0 to scan. A mark waiting out
 * its rate leaves twait instead. */
static int tenant_leave(Q *q, RMS *t, long long count) {
    int tf = time_fair(q), rc = 0;
    if (tf < 0) return -1;
    RMS *m = tenant_mark(q, t);
    if (tf) {
        rc = gvt_rem(q, m);
    } else {
        RMK *r = fx(q, K_RING, 1);
        if (r) list_rem(q, r, q->k[K_RING], count, m);
        else rc = -1;
    }
    if (rc == 0) hdel_fx(q, K_GTURN, m);
    sfree(q, m);
    if (rc < 0) return -1;
    RMS *key = book_key(q, "twait");
    RMK *h;
    rc = dk(q, key, 0, REDISMODULE_KEYTYPE_ZSET, &h);
    if (rc == 0 && h) {
        RedisModule_CloseKey(h);
        rc = dk(q, key, 1, REDISMODULE_KEYTYPE_ZSET, &h);
        if (rc == 0) rc = zrem(q, h, key, t) < 0 ? -1 : 0;
    }
    if (h) RedisModule_CloseKey(h);
    sfree(q, key);
    return rc;
}

/* A claim of tenant t: its start counted when it has a rate (LPUSH, LTRIM, PEXPIRE); *has,
 * *at: when its budget lets it start again (lua TEN.charge). */
static int tenant_charge(Q *q, RMS *t, int *has, double *at) {
    int rated;
    long long m, per;
    *has = 0;
    if (tenant_rate(q, t, &rated, &m, &per) < 0) return -1;
    if (!rated) return 0;
    RMS *skey = tstarts_key(q, t);
    RMK *sh;
    int rc = dk(q, skey, 1, REDISMODULE_KEYTYPE_LIST, &sh);
    if (rc == 0) {
        RMS *v = RedisModule_CreateStringFromLongLong(q->ctx, q->now);
        RedisModule_ListPush(sh, REDISMODULE_LIST_HEAD, v);
        RedisModule_Replicate(q->ctx, "LPUSH", "ss", skey, v);
        sfree(q, v);
        if (m >= 1 && (long long)vlen(sh) > m) {
            while ((long long)vlen(sh) > m)
                sfree(q, RedisModule_ListPop(sh, REDISMODULE_LIST_TAIL));
            RedisModule_Replicate(q->ctx, "LTRIM", "sll", skey, 0LL, m - 1);
        }
        if (per > 0) {
            rc = expire_at(q, sh, skey, q->now + per);
        } else {                                 /* PEXPIRE 0 deletes the key */
            RedisModule_DeleteKey(sh);
            RedisModule_Replicate(q->ctx, "DEL", "s", skey);
        }
    }
    if (sh) RedisModule_CloseKey(sh);
    sfree(q, skey);
    if (rc < 0) return -1;
    return tenant_ready(q, t, has, at);
}

/* Time mode: a tenant's group g leaves its tenant's zset; the tenant's mark leaves gvt with
 * its last group (check_open: only if the tenant is open, as a scan's; a claim knows). */
static int tgvt_leave(Q *q, RMS *g, RMS *t, int check_open) {
    RMS *key = tgvt_key(q, t);
    int rc = zkey_rem(q, key, g), open = 1;
    RMK *h;
    size_t n = 0;
    if (rc == 0) {
        rc = dk(q, key, 0, REDISMODULE_KEYTYPE_ZSET, &h);
        n = vlen(h);
        if (h) RedisModule_CloseKey(h);
    }
    sfree(q, key);
    if (rc == 0 && n == 0) {
        if (check_open) rc = tenant_open(q, t, &open);
        if (rc == 0 && open) rc = tenant_leave(q, t, 0);
    }
    if (rc == 0) hdel_fx(q, K_GTURN, g);
    return rc;
}

/* An entering group: on the ring or its tenant's (turns), or in gvt at vstart (time). */
static int ring_push(Q *q, RMS *g) {
    int tf = time_fair(q);
    if (tf < 0) return -1;
    if (!tf) {
        RMS *t;
        if (tenant_of(q, g, &t) < 0) return -1;
        if (!t) return rpush(q, fx(q, K_RING, 1), q->k[K_RING], g);
        RMS *key = tring_key(q, t);
        RMK *h;
        int rc = dk(q, key, 1, REDISMODULE_KEYTYPE_LIST, &h), open = 0;
        if (rc == 0) rc = rpush(q, h, key, g);
        size_t n = vlen(h);
        if (h) RedisModule_CloseKey(h);
        sfree(q, key);
        if (rc == 0 && n == 1 && (rc = tenant_open(q, t, &open)) == 0 && open)
            rc = tenant_enter(q, t);
        sfree(q, t);
        return rc;
    }
    RMS *t;
    double v;
    if (tenant_of(q, g, &t) < 0) return -1;
    if (!t) {
        if (vstart(q, g, NULL, &v) < 0) return -1;
        long long vi = (long long)v;
        if (gvt_add(q, g, (double)vi, 0) < 0) return -1;
        return book_set_ll(q, "gvrun", g, vi);
    }
    RMS *fl = tenant_floor(q, t), *key = tgvt_key(q, t);
    RMK *h = NULL;
    size_t n0 = 0;
    int rc = vstart(q, g, fl, &v), open = 0;
    long long vi = (long long)v;
    if (rc == 0) rc = book_set_ll(q, "gvrun", g, vi);
    if (rc == 0) rc = dk(q, key, 1, REDISMODULE_KEYTYPE_ZSET, &h);
    if (rc == 0) {
        n0 = vlen(h);
        double s;
        int had = RedisModule_ZsetScore(h, g, &s) == REDISMODULE_OK;
        rc = zadd(q, h, key, (double)vi, g, 0);
        if (had) n0 = 1;                            /* ZADD replied 0: no entry */
    }
    if (h) RedisModule_CloseKey(h);
    if (rc == 0 && n0 == 0 && (rc = tenant_open(q, t, &open)) == 0 && open)
        rc = tenant_enter(q, t);
    sfree(q, fl); sfree(q, key); sfree(q, t);
    return rc;
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

/* A tenant's group g leaves its tenant's ring (count as list_rem's); the tenant's mark
 * leaves the ring with its last group (t_count: where the mark stands, known to a claim,
 * which just served the tenant, so the mark goes unread; 0: scan, if the tenant is open). */
static int tring_leave(Q *q, RMS *g, RMS *t, long long count, long long t_count) {
    RMS *key = tring_key(q, t);
    RMK *h;
    int rc = dk(q, key, 1, REDISMODULE_KEYTYPE_LIST, &h), open;
    if (rc == 0) list_rem(q, h, key, count, g);
    size_t n = vlen(h);
    if (h) RedisModule_CloseKey(h);
    sfree(q, key);
    if (rc == 0 && n == 0) {
        open = 1;
        if (t_count == 0) rc = tenant_open(q, t, &open);
        if (rc == 0 && open) rc = tenant_leave(q, t, t_count);
    }
    if (rc == 0) hdel_fx(q, K_GTURN, g);
    return rc;
}

/* ring_leave for a group known to stand at the head (from_tail false) or the tail: LREM
 * with count 1 / -1 finds it in one step, so here it is a pop from that end. t: its tenant
 * (NULL: none), whose mark stands at the head (t_tail false) or the tail. */
static int ring_leave(Q *q, RMS *g, int from_tail, int t_tail, RMS *t) {
    int tf = time_fair(q);
    if (tf < 0) return -1;
    if (tf) {
        if (t) return tgvt_leave(q, g, t, 0);
        if (gvt_rem(q, g) < 0) return -1;
        hdel_fx(q, K_GTURN, g);
        return 0;
    }
    if (t) return tring_leave(q, g, t, from_tail ? -1 : 1, t_tail ? -1 : 1);
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
    RMS *t;
    if (tenant_of(q, g, &t) < 0) return -1;
    if (tf && !t) return ring_leave(q, g, 0, 0, NULL);
    if (t) {
        int rc = tf ? tgvt_leave(q, g, t, 1) : tring_leave(q, g, t, 0, 0);
        sfree(q, t);
        return rc;
    }
    RMK *r = fx(q, K_RING, 0);
    if (q->err) return -1;
    if (vlen(r) > 0) {
        r = fx(q, K_RING, 1);
        if (!r) return -1;
        list_rem(q, r, q->k[K_RING], 0, g);
    }
    hdel_fx(q, K_GTURN, g);
    return 0;
}

/* One turn of a ring (handle r, name rkey) for m at its head, of weight w: a weighted member
 * keeps the head for w consecutive claims (deficit round robin). *moved: m went to the
 * tail. */
static int turn(Q *q, RMK *r, RMS *rkey, RMS *m, long long w, int *moved) {
    *moved = 1;
    if (w > 1) {
        RMK *tk = fx(q, K_GTURN, 1);
        long long t;
        if (hincrby(q, tk, q->k[K_GTURN], m, 1, &t) < 0) return -1;
        if (t < w) {
            *moved = 0;
            return 0;
        }
        hdel(q, tk, q->k[K_GTURN], m);
    }
    if (!r) return -1;
    RMS *head = RedisModule_ListPop(r, REDISMODULE_LIST_HEAD);
    if (head) {
        RedisModule_ListPush(r, REDISMODULE_LIST_TAIL, head);
        sfree(q, head);
    }
    RedisModule_Replicate(q->ctx, "LMOVE", "ssss", rkey, rkey, S_LEFT, S_RIGHT);
    return 0;
}

/* The turns of a claim of a tenant's group g (weight w) at the head of its tenant's ring:
 * one of that ring, then one of the queue's ring for the tenant's mark by its weight. */
static int tenant_turn(Q *q, RMS *g, long long w, RMS *t, int *moved, int *t_moved) {
    RMS *key = tring_key(q, t);
    RMK *h;
    int rc = dk(q, key, 1, REDISMODULE_KEYTYPE_LIST, &h);
    if (rc == 0) rc = turn(q, h, key, g, w, moved);
    if (h) RedisModule_CloseKey(h);
    sfree(q, key);
    long long tw;
    if (rc == 0) rc = tenant_weight(q, t, &tw);
    if (rc == 0) {
        RMS *m = tenant_mark(q, t);
        rc = turn(q, fx(q, K_RING, 1), q->k[K_RING], m, tw, t_moved);
        sfree(q, m);
    }
    return rc;
}
