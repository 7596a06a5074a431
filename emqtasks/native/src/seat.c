/* src/seat.c: what a claim reads of a group's books, each checked before it writes (twin of
 * lua/lib/seat.lua group_seat).
 * Included once by emq.c (a unity build), after the files before it there; never alone. */

/* What a claim of g reads of its group's books, each checked before the claim writes. */
typedef struct {
    double act, lim, w, est;
    int has_lim, rated;
    long long m, per;
} Seat;

/* A setting's value (fixed key i or a book, else the default): 1 absent or int_ok (*v its
 * value, *has whether present), 0 unreadable, -1 error. */
static int seat_int(Q *q, int fixed, const char *book, RMS *g, int d, int *has, double *v) {
    RMS *s;
    if (setting(q, fixed, book, g, d, &s) < 0) return -1;
    int ok = !s || int_ok(s);
    *has = s != NULL;
    *v = ok ? int_val(s) : 0;
    sfree(q, s);
    return ok;
}

/* "digits:digits" with at most 15 digits on each side; 0 when not so. */
static int rate_text(RMS *s, long long *m, long long *per, int *too_long) {
    size_t len, i = 0, a, b;
    const char *p = RedisModule_StringPtrLen(s, &len);
    *too_long = 0;
    while (i < len && p[i] >= '0' && p[i] <= '9') i++;
    a = i;
    if (a == 0 || i >= len || p[i] != ':') return 0;
    b = ++i;
    while (i < len && p[i] >= '0' && p[i] <= '9') i++;
    if (i == b || i != len) return 0;
    if (a > 15 || len - b > 15) {
        *too_long = 1;
        return 0;
    }
    *m = 0;
    *per = 0;
    for (size_t k = 0; k < a; k++) *m = *m * 10 + (p[k] - '0');
    for (size_t k = b; k < len; k++) *per = *per * 10 + (p[k] - '0');
    return 1;
}

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
    if ((rc = seat_int(q, K_GLIMIT, NULL, g, D_LIMIT, &s->has_lim, &s->lim)) <= 0) return rc;
    if ((rc = seat_int(q, K_GWEIGHT, NULL, g, D_WEIGHT, &has, &s->w)) <= 0) return rc;
    if (!has) s->w = 1;
    if (s->w < 1) return 0;
    if (setting(q, -1, "grate", g, D_RATE, &v) < 0) return -1;
    if (v) {
        int too_long;
        s->rated = rate_text(v, &s->m, &s->per, &too_long);
        sfree(q, v);
        if (too_long) return 0;
    }
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
