/* src/timefair.c: the time-fair mode ("Fair share of worker time"): virtual times, charges and
 * busy minutes (twin of lua/lib/timefair.lua).
 * Included once by emq.c (a unity build), after the files before it there; never alone. */

#define DEFAULT_COST 10000.0   /* us: the first guess of a queue that has run nothing */

/* Tenants' names (ring.c uses them too): a tenant's ring (turns), its zset of open groups
 * (time: lua/lib/timefair.lua's two levels), its mark (0xff then its name: no group name
 * starts so, they are UTF-8) and its own floor's field of gvrun (the mark, then 0xff). */
static RMS *tring_key(Q *q, RMS *t) { return mkname(q, "t:", t, ":ring"); }
static RMS *tgvt_key(Q *q, RMS *t) { return mkname(q, "t:", t, ":gvt"); }

static RMS *mark_of(Q *q, RMS *t, int tail) {
    size_t l;
    const char *p = RedisModule_StringPtrLen(t, &l);
    char stackbuf[300];
    char *buf = l + 2 <= sizeof stackbuf ? stackbuf : RedisModule_Alloc(l + 2);
    buf[0] = (char)0xff;
    memcpy(buf + 1, p, l);
    if (tail) buf[l + 1] = (char)0xff;
    RMS *m = RedisModule_CreateString(q->ctx, buf, l + 1 + (tail ? 1 : 0));
    if (buf != stackbuf) RedisModule_Free(buf);
    return m;
}
static RMS *tenant_mark(Q *q, RMS *t) { return mark_of(q, t, 0); }
static RMS *tenant_floor(Q *q, RMS *t) { return mark_of(q, t, 1); }

/* The group's tenant (HGET gtenant g), NULL for none; *t the caller's to free. */
static int tenant_of(Q *q, RMS *g, RMS **t) { return book_get(q, "gtenant", g, t); }

static int tenant_weight(Q *q, RMS *t, long long *w) {
    int has;
    double v;
    if (tenant_setting(q, "tweight", t, &has, &v) < 0) return -1;
    *w = has ? (long long)v : 1;
    return 0;
}

/* ZADD key [XX] v m; ZREM key m (key: gvt or a tenant's zset, the caller's). */
static int zkey_add(Q *q, RMS *key, double v, RMS *m, int xx) {
    RMK *h;
    int rc = dk(q, key, 1, REDISMODULE_KEYTYPE_ZSET, &h);
    if (rc == 0 && !(xx && RedisModule_KeyType(h) == REDISMODULE_KEYTYPE_EMPTY))
        rc = zadd(q, h, key, v, m, xx);
    if (h) RedisModule_CloseKey(h);
    return rc;
}

static int zkey_rem(Q *q, RMS *key, RMS *m) {
    RMK *h;
    int rc = dk(q, key, 0, REDISMODULE_KEYTYPE_ZSET, &h);
    if (rc == 0 && h) {
        double s;
        if (RedisModule_ZsetScore(h, m, &s) == REDISMODULE_OK) {
            RedisModule_CloseKey(h);
            rc = dk(q, key, 1, REDISMODULE_KEYTYPE_ZSET, &h);
            if (rc == 0) rc = zrem(q, h, key, m) < 0 ? -1 : 0;
        }
    }
    if (h) RedisModule_CloseKey(h);
    return rc;
}

static int gvt_add(Q *q, RMS *g, double v, int xx) {
    RMS *key = book_key(q, "gvt");
    int rc = zkey_add(q, key, v, g, xx);
    sfree(q, key);
    return rc;
}

static int gvt_rem(Q *q, RMS *g) {
    RMS *key = book_key(q, "gvt");
    int rc = zkey_rem(q, key, g);
    sfree(q, key);
    return rc;
}

/* vpay: member m (a group or a tenant's mark) of zset key pays delta; a refund stops just
 * past the floor gvrun[fl] and never raises it (timefair.lua's vpay). */
static int vpay(Q *q, RMS *m, RMS *key, RMS *fl, double delta) {
    if (delta == 0) return 0;
    int has;
    double own = 0, floor_v = 0;
    if (book_num(q, "gvrun", m, &has, &own) < 0) return -1;
    if (!has) own = 0;
    double v = own + delta;
    if (delta < 0) {
        if (book_num(q, "gvrun", fl, &has, &floor_v) < 0) return -1;
        if (!has) floor_v = 0;
        double least = own < floor_v + 1 ? own : floor_v + 1;
        if (v < least) v = least;
    }
    long long vi = to_ll(v);
    if (book_set_ll(q, "gvrun", m, vi) < 0 || zkey_add(q, key, (double)vi, m, 1) < 0) return -1;
    return 0;
}

/* vfloor: raise the floor gvrun[fl] to v. */
static int vfloor(Q *q, RMS *fl, double v) {
    int has;
    double floor_v = 0;
    if (book_num(q, "gvrun", fl, &has, &floor_v) < 0) return -1;
    if (!has) floor_v = 0;
    if (v > floor_v && book_set_ll(q, "gvrun", fl, (long long)v) < 0) return -1;
    return 0;
}

/* busy_add: HINCRBY key slot ms; a new slot clears those six to eleven slots back and sets
 * PEXPIRE key 70000. */
static int busy_add(Q *q, RMS *key, long long ms) {
    RMK *h;
    long long slot = (long long)floor((double)q->now / 10000.0), v;
    int rc = dk(q, key, 1, REDISMODULE_KEYTYPE_HASH, &h);
    RMS *f = RedisModule_CreateStringFromLongLong(q->ctx, slot);
    if (rc == 0) rc = hincrby(q, h, key, f, ms, &v);
    sfree(q, f);
    if (rc == 0 && v == ms) {
        for (long long back = 6; back <= 11; back++) {
            RMS *old = RedisModule_CreateStringFromLongLong(q->ctx, slot - back);
            hdel(q, h, key, old);
            sfree(q, old);
        }
        rc = expire_at(q, h, key, q->now + 70000);
    }
    if (h) RedisModule_CloseKey(h);
    return rc;
}

/* time_settle: a job charged in time mode (vcharge on its row) leaves flight; call before
 * the row changes, with the id still in `active`. */
static int time_settle(Q *q, RMS *g, RMS *id, RMK *row, RMS *row_key, RMS *started,
                       RMS *vcharge, int sample) {
    if (!vcharge) return 0;
    double deadline = (double)q->now, st = (double)q->now, w = 1, vc;
    RMK *a = fx(q, K_ACTIVE, 0);
    if (q->err) return -1;
    if (a) {
        double s;
        if (RedisModule_ZsetScore(a, id, &s) == REDISMODULE_OK) deadline = s;
    }
    if (started && (RedisModule_StringToDouble(started, &st) != REDISMODULE_OK || isnan(st)))
        st = (double)q->now;
    double end = (double)q->now < deadline ? (double)q->now : deadline;
    double used = end - st > 0 ? end - st : 0;
    if (num(q, vcharge, &vc, "ERR emq: a job row's vcharge is not a number") < 0) return -1;
    if (weight_of(q, g, &w) < 0) return -1;
    RMS *t = NULL;
    if (tenant_of(q, g, &t) < 0) return -1;
    hdel(q, row, row_key, F_VCHARGE);
    double paid = floor(used * 1000 / w);
    double delta = (paid > 1 ? paid : 1) - vc;      /* every job costs at least 1 us */
    RMS *gk = book_key(q, "gvt");
    int rc;
    if (!t) {
        rc = vpay(q, g, gk, F_EMPTY, delta);
    } else {                                        /* its tenant pays too, as timefair.lua */
        RMS *tz = tgvt_key(q, t), *fl = tenant_floor(q, t), *m = tenant_mark(q, t);
        long long tw;
        rc = vpay(q, g, tz, fl, delta);
        if (rc == 0) rc = tenant_weight(q, t, &tw);
        if (rc == 0) {
            double tp = floor(used * 1000 / (double)tw), tc = floor(vc * w / (double)tw);
            rc = vpay(q, m, gk, F_EMPTY, (tp > 1 ? tp : 1) - (tc > 1 ? tc : 1));
        }
        sfree(q, tz); sfree(q, fl); sfree(q, m); sfree(q, t);
    }
    sfree(q, gk);
    if (rc < 0) return -1;
    if (sample) {
        RMS *who[2] = {g, F_EMPTY};
        for (int i = 0; i < 2; i++) {
            int has;
            double est, nv = used * 1000;
            if (book_num(q, "gcost", who[i], &has, &est) < 0) return -1;
            if (has) nv = floor((3 * est + used * 1000) / 4);
            if (book_set_ll(q, "gcost", who[i], to_ll(nv)) < 0) return -1;
        }
    }
    if (used > 0) {
        RMS *bk = mkname(q, "g:", g, ":busy"), *qk = book_key(q, "busy");
        int rc = busy_add(q, bk, to_ll(used));
        if (rc == 0) rc = busy_add(q, qk, to_ll(used));
        sfree(q, bk);
        sfree(q, qk);
        if (rc < 0) return -1;
    }
    return 0;
}

/* time_charge: a claim in time mode from g (virtual time vs) is charged its estimated cost
 * over the group's weight; the floor rises to vs. t: its tenant (NULL: none), whose mark
 * stood first in gvt at tvs, pays too (timefair.lua's time_charge). */
static int time_charge(Q *q, RMS *g, double vs, double w, double est, RMK *job, RMS *jkey,
                       RMS *t, double tvs) {
    double charge = floor(est / w);
    if (!(charge > 1)) charge = 1;                  /* math.max(1, ...): at least 1 us */
    long long v = (long long)(vs + charge);
    int rc;
    if (t) {
        RMS *tz = tgvt_key(q, t), *fl = tenant_floor(q, t), *m = tenant_mark(q, t);
        long long tw;
        rc = zkey_add(q, tz, (double)v, g, 0);
        if (rc == 0) rc = vfloor(q, fl, vs);
        if (rc == 0) rc = tenant_weight(q, t, &tw);
        if (rc == 0) {
            double tc = floor(charge * w / (double)tw);
            long long tv = (long long)(tvs + (tc > 1 ? tc : 1));
            rc = gvt_add(q, m, (double)tv, 0);
            if (rc == 0) rc = book_set_ll(q, "gvrun", m, tv);
            if (rc == 0) rc = vfloor(q, F_EMPTY, tvs);
        }
        sfree(q, tz); sfree(q, fl); sfree(q, m);
    } else {
        rc = gvt_add(q, g, (double)v, 0);
        if (rc == 0) rc = vfloor(q, F_EMPTY, vs);
    }
    if (rc < 0 || book_set_ll(q, "gvrun", g, v) < 0) return -1;
    RMS *c = RedisModule_CreateStringFromLongLong(q->ctx, (long long)charge);
    RedisModule_HashSet(job, REDISMODULE_HASH_NONE, F_VCHARGE, c, NULL);
    RedisModule_Replicate(q->ctx, "HSET", "sss", jkey, F_VCHARGE, c);
    sfree(q, c);
    return 0;
}
