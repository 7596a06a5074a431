/* src/claim.c: lease the next job of the ring (claim_one; twin of lua/lib/claim.lua).
 * Included once by emq.c (a unity build), after the files before it there; never alone. */

typedef struct {
    RMS *id, *task, *payload, *nonce, *group;
    long long attempts, lease, more, fence;
} Job;

static void job_free(Q *q, Job *j) {
    sfree(q, j->id);
    sfree(q, j->task);
    sfree(q, j->payload);
    sfree(q, j->nonce);
    sfree(q, j->group);
    memset(j, 0, sizeof *j);
}

static void reply_job(RedisModuleCtx *ctx, Job *j) {
    RedisModule_ReplyWithArray(ctx, 9);
    RedisModule_ReplyWithString(ctx, j->id);
    if (j->task) RedisModule_ReplyWithString(ctx, j->task); else RedisModule_ReplyWithNull(ctx);
    if (j->payload) RedisModule_ReplyWithString(ctx, j->payload);
    else RedisModule_ReplyWithNull(ctx);
    RedisModule_ReplyWithLongLong(ctx, j->attempts);
    RedisModule_ReplyWithString(ctx, j->nonce);
    RedisModule_ReplyWithString(ctx, j->group);
    RedisModule_ReplyWithLongLong(ctx, j->lease);
    RedisModule_ReplyWithLongLong(ctx, j->more);
    RedisModule_ReplyWithLongLong(ctx, j->fence);
}

/* The head of the ring without moving it (LINDEX ring 0): popped and pushed straight back,
 * the only way to read a list element with 6.2's key API. */
static RMS *ring_head(Q *q) {
    if (vlen(fx(q, K_RING, 0)) == 0) return NULL;
    RMK *r = fx(q, K_RING, 1);
    if (!r) return NULL;
    RMS *g = RedisModule_ListPop(r, REDISMODULE_LIST_HEAD);
    if (g) RedisModule_ListPush(r, REDISMODULE_LIST_HEAD, g);
    return g;
}

/* As lua/lib/claim.lua: a row a claim cannot read goes to `dead` with the reason
 * (bury), a group whose books it cannot read leaves the ring (group_seat), and only a
 * queue-wide key of the wrong type fails the call, before its first write (claim_books). */

/* Once per call, before the first write: the queue-wide keys a claim may write half-way
 * through a lease (gturn, this minute's history hash, in time mode gvrun; `active` and
 * `dead` are checked right before a lease or a burial, where the scripts' write meets
 * them). 1 fine, -2 one is of the wrong type (q->errbuf names it; q->err is left to the
 * caller), -1 error. */
static int claim_books(Q *q) {
    if (q->books) return q->books;
    if (read_defaults(q) < 0) return -1;         /* the scripts' hist(now) reads them first */
    int tf = time_fair(q);
    if (tf < 0) return -1;
    RMS *keys[3] = {q->k[K_GTURN], hist_key(q), tf ? book_key(q, "gvrun") : NULL};
    const int types[3] = {REDISMODULE_KEYTYPE_HASH, REDISMODULE_KEYTYPE_HASH,
                          REDISMODULE_KEYTYPE_HASH};
    q->books = types_fit(q, keys, types, 3);
    sfree(q, keys[1]);
    sfree(q, keys[2]);
    return q->books;
}

/* expire (lua/lib/claim.lua): a popped job past its deadline (its row's `expires`) is never
 * run: it ends `expired` (no attempt, no retry, not dead), the clients blocked in get() are
 * woken, and the row lives its ttl (ttl: the row's, int_ok or NULL). h: the row's handle,
 * open for writing. 0, or -1 (q->err). */
static int expire(Q *q, RMS *id, RMK *h, RMS *jkey, RMS *ttl) {
    RMS *now_s = RedisModule_CreateStringFromLongLong(q->ctx, q->now), *waiters = NULL;
    RedisModule_HashSet(h, REDISMODULE_HASH_NONE, F_STATE, S_EXPIRED, F_FINISHED, now_s,
                        F_ERROR, S_EXPIRED_WHY, NULL);
    RedisModule_Replicate(q->ctx, "HSET", "sssssss", jkey, F_STATE, S_EXPIRED, F_FINISHED,
                          now_s, F_ERROR, S_EXPIRED_WHY);
    sfree(q, now_s);
    hdel(q, h, jkey, F_PAYLOAD);
    RedisModule_HashGet(h, REDISMODULE_HASH_NONE, F_WAITERS, &waiters, NULL);
    int rc = notify(q, id, waiters);
    sfree(q, waiters);
    long long secs = ttl ? (long long)int_val(ttl) : 0;
    if (rc == 0 && secs > 0) {
        rc = expire_at(q, h, jkey, q->now + secs * 1000);
    } else if (rc == 0) {
        RedisModule_DeleteKey(h);
        RedisModule_Replicate(q->ctx, "DEL", "s", jkey);
    }
    return rc;
}

/* One turn at the ring's head group g: 1 claimed into *out, 0 look again (the group's
 * books unreadable, its lane empty or not a zset, its head a ghost or a buried row), -1
 * error. */
static int claim_at(Q *q, RMS *g, double vs, RMS *nonce, Job *out, RMS *t, double tvs) {
    RMS *lkey = lane_key(q, g), *id = NULL, *jkey = NULL, *row[NROW] = {0};
    RMK *lane = NULL, *job = NULL;
    double score;
    long long act, more = 1;
    int rotated = 1, t_rotated = 1, rc, tf = time_fair(q);
    Seat s;
    if (tf < 0 || (rc = group_seat(q, g, tf, &s)) < 0) {
        sfree(q, lkey);
        return -1;
    }
    if (rc == 1) {                               /* ZPOPMIN, as the scripts' pcall */
        lane = RedisModule_OpenKey(q->ctx, lkey, REDISMODULE_READ | REDISMODULE_WRITE);
        if (!type_ok(lane, REDISMODULE_KEYTYPE_ZSET)) rc = 0;
        else if (!(id = zfirst(lane, &score))) rc = 0;
    }
    if (rc == 0) {                               /* nothing to take here: leave the ring */
        rc = ring_leave(q, g, 0, 0, t);
        goto out;
    }
    jkey = job_key(q, id);
    job = RedisModule_OpenKey(q->ctx, jkey, REDISMODULE_READ | REDISMODULE_WRITE);
    int jt = RedisModule_KeyType(job);
    if (jt == REDISMODULE_KEYTYPE_HASH)
        RedisModule_HashGet(job, REDISMODULE_HASH_NONE, F_TASK, &row[R_TASK], F_PAYLOAD,
                            &row[R_PAYLOAD], F_LEASE, &row[R_LEASE], F_STATE, &row[R_STATE],
                            F_ATTEMPTS, &row[R_ATTEMPTS], F_FENCE, &row[R_FENCE], F_GROUP,
                            &row[R_GROUP], F_MAX, &row[R_MAX], F_TTL, &row[R_TTL], F_DELAY,
                            &row[R_DELAY], F_CREATED, &row[R_CREATED], F_EXPIRES,
                            &row[R_EXPIRES], NULL);
    char why[64];
    int buried = jt != REDISMODULE_KEYTYPE_EMPTY && jt != REDISMODULE_KEYTYPE_HASH;
    if (!buried && row[R_STATE]) buried = row_fault(row, g, why, sizeof why);
    /* past its deadline (a row without one never expires): never run, look again */
    int expired = !buried && row[R_STATE] && row[R_EXPIRES]
                  && int_val(row[R_EXPIRES]) <= (double)q->now;
    /* `dead` for a burial, `active` for a lease: of the wrong type, the call changes nothing
     * (the scripts' write is refused and the job put back) */
    if (buried || (row[R_STATE] && !expired)) {
        int fixed = buried ? K_DEAD : K_ACTIVE;
        const int type = REDISMODULE_KEYTYPE_ZSET;
        if ((rc = types_fit(q, &q->k[fixed], &type, 1)) < 0) goto out;
    }
    if (buried || !row[R_STATE] || expired) {    /* buried, a ghost or expired: look again */
        zrem(q, lane, lkey, id);
        if (expired) {
            rc = expire(q, id, job, jkey, row[R_TTL]);
        } else if (buried) {
            char t[64];
            if (jt != REDISMODULE_KEYTYPE_HASH) type_name(q, jkey, t, sizeof t);
            rc = bury(q, id, g, why, jt != REDISMODULE_KEYTYPE_HASH ? t : NULL, job, jkey, NULL);
            job = NULL;
        }
        if (rc >= 0) rc = vlen(lane) == 0 ? ring_leave(q, g, 0, 0, t) : 0;
        if (rc > 0) rc = 0;
        goto out;
    }

    zrem(q, lane, lkey, id);
    if (tf) {                                    /* time mode: charge the estimate */
        if ((rc = time_charge(q, g, vs, s.w, s.est, job, jkey, t, tvs)) < 0) goto out;
    } else if (t) {                              /* a tenant's group: both rings turn */
        if ((rc = tenant_turn(q, g, (long long)s.w, t, &rotated, &t_rotated)) < 0) goto out;
    } else if (s.w > 1) {                        /* ring_turn: a weighted group keeps the head */
        RMK *turn = fx(q, K_GTURN, 1);
        long long t;
        if ((rc = hincrby(q, turn, q->k[K_GTURN], g, 1, &t)) < 0) goto out;
        if (t < s.w) rotated = 0;
        else hdel(q, turn, q->k[K_GTURN], g);
    }
    if (rotated && !tf && !t) {                  /* LMOVE ring ring LEFT RIGHT */
        RMK *r = fx(q, K_RING, 1);
        RMS *head = r ? RedisModule_ListPop(r, REDISMODULE_LIST_HEAD) : NULL;
        if (head) {
            RedisModule_ListPush(r, REDISMODULE_LIST_TAIL, head);
            sfree(q, head);
        }
        RedisModule_Replicate(q->ctx, "LMOVE", "ssss", q->k[K_RING], q->k[K_RING], S_LEFT,
                              S_RIGHT);
    }
    long long att = (long long)int_val(row[R_ATTEMPTS]) + 1;
    long long lease = (long long)int_val(row[R_LEASE]);
    /* fence: grows with every claim of the row, never rolled back (attempts is: by a
     * release, or a requeue of a dead job), so a task can guard writes elsewhere with it. */
    long long fence = (long long)int_val(row[R_FENCE]) + 1;
    RMS *att_new = RedisModule_CreateStringFromLongLong(q->ctx, att);
    RMS *now_s = RedisModule_CreateStringFromLongLong(q->ctx, q->now);
    RMS *fence_new = RedisModule_CreateStringFromLongLong(q->ctx, fence);
    RedisModule_HashSet(job, REDISMODULE_HASH_NONE, F_STATE, S_ACTIVE, F_ATTEMPTS, att_new,
                        F_NONCE, nonce, F_STARTED, now_s, F_FENCE, fence_new, NULL);
    RedisModule_Replicate(q->ctx, "HSET", "sssssssssss", jkey, F_STATE, S_ACTIVE, F_ATTEMPTS,
                          att_new, F_NONCE, nonce, F_STARTED, now_s, F_FENCE, fence_new);
    sfree(q, fence_new);
    sfree(q, att_new);
    sfree(q, now_s);
    if ((rc = zadd(q, fx(q, K_ACTIVE, 1), q->k[K_ACTIVE], (double)(q->now + lease), id, 0)) < 0)
        goto out;
    if ((rc = hincr_from(q, fx(q, K_GACTIVE, 1), q->k[K_GACTIVE], g, (long long)s.act, 1,
                         &act)) < 0)
        goto out;
    /* more: 1 when other work is serviceable right now, so the claimant's master wakes
     * another child (or another master) only when there is something to take. */
    if (s.rated) {                               /* LPUSH, LTRIM 0 m-1, PEXPIRE per */
        RMS *skey = starts_key(q, g);
        RMK *sh;
        if ((rc = dk(q, skey, 1, REDISMODULE_KEYTYPE_LIST, &sh)) == 0) {
            RMS *t = RedisModule_CreateStringFromLongLong(q->ctx, q->now);
            RedisModule_ListPush(sh, REDISMODULE_LIST_HEAD, t);
            RedisModule_Replicate(q->ctx, "LPUSH", "ss", skey, t);
            sfree(q, t);
            if (s.m >= 1 && (long long)vlen(sh) > s.m) {
                while ((long long)vlen(sh) > s.m)
                    sfree(q, RedisModule_ListPop(sh, REDISMODULE_LIST_TAIL));
                RedisModule_Replicate(q->ctx, "LTRIM", "sll", skey, 0LL, s.m - 1);
            }
            if (s.per > 0) {
                rc = expire_at(q, sh, skey, q->now + s.per);
            } else {                             /* PEXPIRE 0 deletes the key */
                RedisModule_DeleteKey(sh);
                RedisModule_Replicate(q->ctx, "DEL", "s", skey);
            }
        }
        if (sh) RedisModule_CloseKey(sh);
        sfree(q, skey);
        if (rc < 0) goto out;
    }
    int closed = (s.has_lim && (double)act >= s.lim) || vlen(lane) == 0, wait = 0;
    double at = 0;
    if (s.rated && !closed && (rc = rate_ready(q, g, &wait, &at)) < 0) goto out;
    if (closed || wait) {
        if ((rc = ring_leave(q, g, rotated, t_rotated, t)) < 0) goto out;
        if (wait && (rc = wait_push(q, g, at)) < 0) goto out;
    }
    if (t) {
        /* the tenant's jobs in flight; at its limit it leaves the ring (its groups stay in
         * its own ring) until a completion returns it (active_drop) */
        RMS *tk = book_key(q, "tactive");
        RMK *th;
        long long tact;
        int has;
        double tlim;
        if ((rc = dk(q, tk, 1, REDISMODULE_KEYTYPE_HASH, &th)) == 0)
            rc = hincrby(q, th, tk, t, 1, &tact);
        if (th) RedisModule_CloseKey(th);
        sfree(q, tk);
        if (rc < 0) goto out;
        /* and its rate: a spent budget takes it off the ring (time mode: out of gvt, its
         * virtual time kept in gvrun) into twait until its next start is due (promote
         * returns it; at its limit too, a completion does). A mark its last group took out
         * already (ring_leave above) stays out, and out of twait. */
        int twait;
        double tat = 0;
        if ((rc = tenant_charge(q, t, &twait, &tat)) < 0) goto out;
        if ((rc = tenant_setting(q, "tlimit", t, &has, &tlim)) < 0) goto out;
        int full = has && (double)tact >= tlim;
        if (tf && full) {
            if ((rc = tenant_leave(q, t, 0)) < 0) goto out;           /* gone already: no-op */
        } else if (full || twait) {
            RMS *rk = tf ? tgvt_key(q, t) : tring_key(q, t);
            RMK *rh;
            int standing = 0;
            if ((rc = dk(q, rk, 0, tf ? REDISMODULE_KEYTYPE_ZSET : REDISMODULE_KEYTYPE_LIST,
                         &rh)) == 0 && vlen(rh) > 0) {
                standing = 1;
                rc = tenant_leave(q, t, tf ? 0 : t_rotated ? -1 : 1);
            }
            if (rh) RedisModule_CloseKey(rh);
            sfree(q, rk);
            if (rc == 0 && standing && twait && !full) rc = twait_push(q, t, tat);
            if (rc < 0) goto out;
        }
    }
    if (closed || wait || t) {
        size_t left;
        if ((rc = ring_size(q, &left)) < 0) goto out;
        if (left == 0) more = 0;
    }
    /* last: a history counter that cannot be counted fails the call with the books whole */
    if ((rc = hist_started(q, row[R_TASK], g, score, t)) < 0) goto out;
    out->id = id;
    out->task = row[R_TASK];
    out->payload = row[R_PAYLOAD];
    out->nonce = nonce;
    out->attempts = att;
    out->lease = lease;
    out->more = more;
    out->fence = fence;
    id = row[R_TASK] = row[R_PAYLOAD] = NULL;
    rc = 1;
out:
    if (lane) RedisModule_CloseKey(lane);
    if (job) RedisModule_CloseKey(job);
    sfree(q, lkey); sfree(q, jkey); sfree(q, id);
    for (int i = 0; i < NROW; i++) sfree(q, row[i]);
    return rc;
}

/* A wake at the end of a claim that skipped its fill: left out when `wake` is of the wrong
 * type (the scripts' wake_soft). */
static int wake_soft(Q *q) {
    return key_fits(q, q->k[K_WAKE], REDISMODULE_KEYTYPE_LIST) ? wake(q, 0) : 0;
}

/* Claim one job: turn the ring one step, pop the head of that lane, lease it.
 * 1 claimed into *out, 0 nothing serviceable, -1 error, -2 a queue-wide key a claim writes
 * is of the wrong type (claim_books: nothing written, q->errbuf says which). Ghosts,
 * stale ring entries, unreadable groups, buried rows and expired jobs are skipped, at most 64
 * per call;
 * past that a wake is pushed so a worker comes back. */
static int claim_one(Q *q, RMS *nonce, Job *out) {
    memset(out, 0, sizeof *out);
    int tf = time_fair(q);
    if (tf < 0) return -1;
    for (int iter = 0; iter < CLAIM_SKIP_MAX; iter++) {
        double vs = 0, tvs = 0;
        RMS *g = NULL;
        if (tf) {                                /* ZRANGE gvt 0 0 WITHSCORES */
            RMS *key = book_key(q, "gvt");
            RMK *h;
            int rc = dk(q, key, 0, REDISMODULE_KEYTYPE_ZSET, &h);
            if (rc == 0) g = zfirst(h, &vs);
            if (h) RedisModule_CloseKey(h);
            sfree(q, key);
            if (rc < 0) return -1;
        } else {
            g = ring_head(q);
        }
        if (!g) return q->err ? -1 : 0;
        /* a tenant's mark: its ring's head group (t: the tenant, NULL for none) */
        RMS *t = NULL;
        size_t hl;
        const char *hp = RedisModule_StringPtrLen(g, &hl);
        if (hl > 0 && (unsigned char)hp[0] == 0xff) {
            t = RedisModule_CreateString(q->ctx, hp + 1, hl - 1);
            sfree(q, g);
            g = NULL;
            int lr = 0;
            if (tf) {                            /* its zset's least-served group */
                RMS *tk = tgvt_key(q, t);
                RMK *h;
                tvs = vs;
                lr = dk(q, tk, 0, REDISMODULE_KEYTYPE_ZSET, &h);
                if (lr == 0 && h) g = zfirst(h, &vs);
                if (h) RedisModule_CloseKey(h);
                sfree(q, tk);
            } else {
                RMS *tk = tring_key(q, t);
                lr = lindex(q, tk, 0, &g);
                sfree(q, tk);
            }
            if (lr < 0) {
                sfree(q, t);
                return -1;
            }
        }
        int rc = claim_books(q);
        if (rc == 1 && !g) {                      /* a stale mark (its ring is empty) */
            rc = tenant_leave(q, t, 1);
        } else if (rc == 1) {
            rc = claim_at(q, g, vs, nonce, out, t, tvs);
        }
        sfree(q, t);
        if (rc == 1) {
            out->group = g;
            return 1;
        }
        sfree(q, g);
        if (rc < 0) return rc;
    }
    return wake_soft(q) < 0 ? -1 : 0;
}
