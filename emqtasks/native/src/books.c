/* src/books.c: a job into or out of its group's books (group_books, lane_in; twin of
 * lua/lib/books.lua).
 * Included once by emq.c (a unity build), after the files before it there; never alone. */

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
    if ((rc = setting_int(q, D_LIMIT, g, &has_lim, &lim)) <= 0) {
        rc = rc < 0 ? -1 : 1;
        goto out;
    }
    rc = 0;
    if (vcharge) {
        if (!int_ok(vcharge)) { rc = 1; goto out; }
        if ((rc = setting_int(q, D_WEIGHT, g, &has, &w)) <= 0) {
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
