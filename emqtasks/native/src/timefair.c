/* src/timefair.c: the time-fair mode ("Fair share of worker time"): virtual times, charges and
 * busy minutes (twin of lua/lib/timefair.lua).
 * Included once by emq.c (a unity build), after the files before it there; never alone. */

#define DEFAULT_COST 10000.0   /* us: the first guess of a queue that has run nothing */

/* ZADD BASE.."gvt" [XX] v g; ZREM BASE.."gvt" g. */
static int gvt_add(Q *q, RMS *g, double v, int xx) {
    RMS *key = book_key(q, "gvt");
    RMK *h;
    int rc = dk(q, key, 1, REDISMODULE_KEYTYPE_ZSET, &h);
    if (rc == 0 && !(xx && RedisModule_KeyType(h) == REDISMODULE_KEYTYPE_EMPTY))
        rc = zadd(q, h, key, v, g, xx);
    if (h) RedisModule_CloseKey(h);
    sfree(q, key);
    return rc;
}

static int gvt_rem(Q *q, RMS *g) {
    RMS *key = book_key(q, "gvt");
    RMK *h;
    int rc = dk(q, key, 0, REDISMODULE_KEYTYPE_ZSET, &h);
    if (rc == 0 && h) {
        double s;
        if (RedisModule_ZsetScore(h, g, &s) == REDISMODULE_OK) {
            RedisModule_CloseKey(h);
            rc = dk(q, key, 1, REDISMODULE_KEYTYPE_ZSET, &h);
            if (rc == 0) rc = zrem(q, h, key, g) < 0 ? -1 : 0;
        }
    }
    if (h) RedisModule_CloseKey(h);
    sfree(q, key);
    return rc;
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
    hdel(q, row, row_key, F_VCHARGE);
    double paid = floor(used * 1000 / w);
    double delta = (paid > 1 ? paid : 1) - vc;      /* every job costs at least 1 us */
    if (delta != 0) {
        int has;
        double own = 0, floor_v = 0;
        if (book_num(q, "gvrun", g, &has, &own) < 0) return -1;
        if (!has) own = 0;
        double v = own + delta;
        if (delta < 0) {
            /* a refund stops just past the floor and never raises a group: as timefair.lua */
            if (book_num(q, "gvrun", F_EMPTY, &has, &floor_v) < 0) return -1;
            if (!has) floor_v = 0;
            double least = own < floor_v + 1 ? own : floor_v + 1;
            if (v < least) v = least;
        }
        long long vi = to_ll(v);
        if (book_set_ll(q, "gvrun", g, vi) < 0 || gvt_add(q, g, (double)vi, 1) < 0) return -1;
    }
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
 * over the group's weight; the floor rises to vs. */
static int time_charge(Q *q, RMS *g, double vs, double w, double est, RMK *job, RMS *jkey) {
    double charge = floor(est / w);
    if (!(charge > 1)) charge = 1;                  /* math.max(1, ...): at least 1 us */
    long long v = (long long)(vs + charge);
    int hf;
    double floor_v = 0;
    if (gvt_add(q, g, (double)v, 0) < 0 || book_set_ll(q, "gvrun", g, v) < 0) return -1;
    if (book_num(q, "gvrun", F_EMPTY, &hf, &floor_v) < 0) return -1;
    if (!hf) floor_v = 0;
    if (vs > floor_v && book_set_ll(q, "gvrun", F_EMPTY, (long long)vs) < 0) return -1;
    RMS *c = RedisModule_CreateStringFromLongLong(q->ctx, (long long)charge);
    RedisModule_HashSet(job, REDISMODULE_HASH_NONE, F_VCHARGE, c, NULL);
    RedisModule_Replicate(q->ctx, "HSET", "sss", jkey, F_VCHARGE, c);
    sfree(q, c);
    return 0;
}
