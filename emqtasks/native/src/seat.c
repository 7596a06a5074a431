/* src/seat.c: what a claim reads of a group's books, each checked before it writes (twin of
 * lua/lib/seat.lua group_seat).
 * Included once by emq.c (a unity build), after the files before it there; never alone. */

/* What a claim of g reads of its group's books, each checked before the claim writes. */
typedef struct {
    double act, lim, w, est;
    int has_lim, rated;
    long long m, per;
} Seat;

/* group_seat (lua/lib/seat.lua): 1 read into *s, 0 unreadable (the group leaves the ring), -1
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
    if ((rc = setting_int(q, D_LIMIT, g, &s->has_lim, &s->lim)) <= 0) return rc;
    if ((rc = setting_int(q, D_WEIGHT, g, &has, &s->w)) <= 0) return rc;
    if (!has) s->w = 1;
    if (s->w < 1) return 0;
    if ((rc = rate_checked(q, g, &s->rated, &s->m, &s->per)) <= 0) return rc;
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
