/* src/sweep.c: the sweeps of due entries: EMQ.REAP (reap.lua) and EMQ.PROMOTE (promote.lua).
 * Included once by emq.c (a unity build), after the files before it there; never alone. */

/* ZRANGEBYSCORE key -inf now LIMIT 0 limit, copied out before anything is changed. */
static RMS **due_in(RMK *h, double now, long long limit, long long *count);
static RMS **due_ids(Q *q, int fixed, long long limit, long long *count) {
    return due_in(fx(q, fixed, 0), (double)q->now, limit, count);
}

static RMS **due_in(RMK *h, double now, long long limit, long long *count) {
    RMS **ids = NULL;
    long long n = 0, cap = 0;
    if (limit > 0 && h &&
        RedisModule_ZsetFirstInScoreRange(h, -INFINITY, now, 0, 0) == REDISMODULE_OK) {
        while (n < limit && !RedisModule_ZsetRangeEndReached(h)) {
            double s;
            if (n == cap) {
                cap = cap ? cap * 2 : 16;
                ids = RedisModule_Realloc(ids, sizeof(RMS *) * (size_t)cap);
            }
            ids[n++] = RedisModule_ZsetRangeCurrentElement(h, &s);
            if (!RedisModule_ZsetRangeNext(h)) break;
        }
        RedisModule_ZsetRangeStop(h);
    }
    *count = n;
    return ids;
}

static void free_ids(Q *q, RMS **ids, long long n) {
    for (long long i = 0; i < n; i++) sfree(q, ids[i]);
    RedisModule_Free(ids);
}

/* One expired lease: 1 returned to its lane, 2 dead (or ended aborted), 0 a ghost, -1
 * error. As reap.lua: an attempt whose abort was asked (the row's `abort` is its nonce) ends
 * `aborted` as abort's end (abort_end, its error S_REAP_ABORTED), never handed back; a job
 * key that is not a hash, a row without a group or one whose attempts, max or created (or,
 * ending aborted, ttl) is not an integer is buried, a job bound for a lane of the wrong type
 * goes to `dead` naming it, other books its group cannot read are left as they are
 * (group_books). */
static int reap_one(Q *q, RMS *id) {
    RMS *jk = job_key(q, id);
    RMS *g = NULL, *att_s = NULL, *max_s = NULL, *created_s = NULL, *waiters = NULL;
    RMS *prio = NULL, *started = NULL, *vcharge = NULL, *wf = NULL, *task = NULL;
    RMS *nonce = NULL, *ran = NULL, *unrun_s = NULL, *state = NULL, *asked_s = NULL;
    RMS *ttl_s = NULL;
    RMK *job = RedisModule_OpenKey(q->ctx, jk, REDISMODULE_READ | REDISMODULE_WRITE);
    double unrun = 0;
    int rc = 0, jt = RedisModule_KeyType(job), books = 0;
    char fault[400] = "", why[320];
    const char *whole = NULL;
    if (jt == REDISMODULE_KEYTYPE_HASH)
        RedisModule_HashGet(job, REDISMODULE_HASH_NONE, F_GROUP, &g, F_ATTEMPTS, &att_s, F_MAX,
                            &max_s, F_CREATED, &created_s, F_WAITERS, &waiters, F_PRIO, &prio,
                            F_STARTED, &started, F_VCHARGE, &vcharge, F_WF, &wf, F_TASK, &task,
                            F_NONCE, &nonce, F_RAN, &ran, F_UNRUN, &unrun_s, F_STATE, &state,
                            F_ABORT, &asked_s, F_TTL, &ttl_s, NULL);
    if (!g) {                                    /* not a hash, no group, or a ghost */
        if (jt != REDISMODULE_KEYTYPE_EMPTY) {
            rc = bury_as(q, id, NULL, "no group", NULL, job, jk, jt);
            job = NULL;
        }
        if (rc == 0) zrem(q, fx(q, K_ACTIVE, 1), q->k[K_ACTIVE], id);
        if (rc == 0 && jt != REDISMODULE_KEYTYPE_EMPTY) rc = 2;
        goto out;
    }
    /* read before the job's first write: its row, then its group's books; an attempt whose
     * abort was asked ends aborted (abort_end), its ttl read with the row */
    int asked = nonce && asked_s && eq(asked_s, nonce) && state && eqc(state, "active");
    const struct { RMS *v; const char *name; int required; } ints[4] = {
        {att_s, "attempts", 1}, {max_s, "max", 1}, {created_s, "created", 1},
        {ttl_s, "ttl", 0}};
    for (int i = 0; i < (asked ? 4 : 3) && !fault[0]; i++) {
        if (!ints[i].v) {
            if (ints[i].required) snprintf(fault, sizeof fault, "no %s", ints[i].name);
        } else if (!int_ok(ints[i].v)) {
            snprintf(fault, sizeof fault, "%s is not an integer", ints[i].name);
        }
    }
    if (asked && !fault[0]) {
        RedisModule_CloseKey(job);               /* abort_end opens the row itself */
        job = NULL;
        RMS *args[4] = {id, att_s, nonce, S_REAP_ABORTED};
        rc = abort_end(q, args) < 0 ? -1 : 2;    /* fenced: the row was read just now */
        goto out;
    }
    double att = int_val(att_s), max = int_val(max_s), created = int_val(created_s);
    /* never seen running (`ran` is not this claim's nonce): given back, `max` times at most;
     * an unreadable count of them counts as none, as the script's tonumber */
    if (unrun_s && (RedisModule_StringToDouble(unrun_s, &unrun) != REDISMODULE_OK || isnan(unrun)))
        unrun = 0;
    int give_back = !fault[0] && !((!ran && !nonce) || (ran && nonce && eq(ran, nonce))) &&
                    unrun < max;
    int to_dead = fault[0] || (!give_back && att >= max);
    books = group_books(q, g, 1, !to_dead, vcharge, why, sizeof why);
    if (books < 0) { rc = -1; goto out; }
    if (books == 2) {
        whole = why;
        to_dead = 1;
    }
    if (fault[0] || whole) {
        rc = bury_as(q, id, g, fault, whole, job, jk, REDISMODULE_KEYTYPE_HASH);
        job = NULL;
        if (rc < 0) goto out;
        job = RedisModule_OpenKey(q->ctx, jk, REDISMODULE_READ | REDISMODULE_WRITE);
    } else if (to_dead) {                        /* of the wrong type: this job stays as it is */
        const int type = REDISMODULE_KEYTYPE_ZSET;
        if (types_fit(q, &q->k[K_DEAD], &type, 1) == -2) {
            rc = fail(q, q->errbuf);
            goto out;
        }
    }
    if (!books && (rc = time_settle(q, g, id, job, jk, started, vcharge, 0)) < 0) goto out;
    zrem(q, fx(q, K_ACTIVE, 1), q->k[K_ACTIVE], id);
    if (!books && (rc = active_drop(q, g)) < 0) goto out;
    if (fault[0] || whole) {
        rc = 2;
    } else if (give_back) {
        long long v;
        rc = hincrby(q, job, jk, F_ATTEMPTS, -1, &v);
        if (rc == 0) rc = hincrby(q, job, jk, F_UNRUN, 1, &v);
        if (rc == 0) {
            RedisModule_HashSet(job, REDISMODULE_HASH_NONE, F_STATE, S_PENDING, F_ERROR, S_UNRUN,
                                NULL);
            RedisModule_Replicate(q->ctx, "HSET", "sssss", jk, F_STATE, S_PENDING, F_ERROR,
                                  S_UNRUN);
            rc = lane_in(q, g, id, lane_score(prio, created), books);
        }
        if (rc == 0) rc = hist_failed(q, task, g, 0);
        if (rc == 0) rc = 1;
    } else if (to_dead) {
        RMS *now_s = RedisModule_CreateStringFromLongLong(q->ctx, q->now);
        RedisModule_HashSet(job, REDISMODULE_HASH_NONE, F_STATE, S_DEAD, F_ERROR,
                            S_LEASE_EXPIRED, F_FINISHED, now_s, NULL);
        RedisModule_Replicate(q->ctx, "HSET", "sssssss", jk, F_STATE, S_DEAD, F_ERROR,
                              S_LEASE_EXPIRED, F_FINISHED, now_s);
        sfree(q, now_s);
        rc = zadd(q, fx(q, K_DEAD, 1), q->k[K_DEAD], (double)q->now, id, 0);
        if (rc == 0) rc = hist_failed(q, task, g, 1);
        if (rc == 0) rc = notify(q, id, waiters);
        if (rc == 0 && wf) rc = wf_fail(q, wf, id);
        if (rc == 0) rc = 2;
    } else {
        RedisModule_HashSet(job, REDISMODULE_HASH_NONE, F_STATE, S_PENDING, F_ERROR,
                            S_LEASE_EXPIRED, NULL);
        RedisModule_Replicate(q->ctx, "HSET", "sssss", jk, F_STATE, S_PENDING, F_ERROR,
                              S_LEASE_EXPIRED);
        rc = lane_in(q, g, id, lane_score(prio, created), books);
        if (rc == 0) rc = hist_failed(q, task, g, 0);
        if (rc == 0) rc = 1;
    }
out:
    if (job) RedisModule_CloseKey(job);
    sfree(q, jk); sfree(q, g); sfree(q, att_s); sfree(q, max_s);
    sfree(q, created_s); sfree(q, waiters); sfree(q, prio); sfree(q, wf); sfree(q, task);
    sfree(q, started); sfree(q, vcharge); sfree(q, nonce); sfree(q, ran); sfree(q, unrun_s);
    sfree(q, state); sfree(q, asked_s); sfree(q, ttl_s);
    return rc;
}

static int cmd_reap(RedisModuleCtx *ctx, RMS **argv, int argc) {
    if (argc != ARGV0 + 1) return RedisModule_WrongArity(ctx);
    Q q;
    if (q_init(&q, ctx, argv, B(K_ACTIVE), 0) < 0) return finish(&q);
    long long limit, n, returned = 0, dead = 0, seen = 0;
    if (count_arg(&q, argv[ARGV0], &limit, "ERR emq: limit must be an integer >= 0") < 0)
        return finish(&q);
    /* The clock mark: the latest server time a reap saw, raised to now, never lowered
     * (an unreadable one counts as none, as the script's tonumber). */
    RMS *ckey = book_key(&q, "clock");
    RMK *ch;
    if (dk(&q, ckey, 1, REDISMODULE_KEYTYPE_HASH, &ch) == 0) {
        RMS *s = hget(ch, F_SEEN);
        double d = 0;
        int readable = s && RedisModule_StringToDouble(s, &d) == REDISMODULE_OK &&
                       d > -1e15 && d < 1e15;
        if (readable) seen = to_ll(d);
        if (!readable || (double)q.now > d) {
            RMS *now_s = RedisModule_CreateStringFromLongLong(ctx, q.now);
            RedisModule_HashSet(ch, REDISMODULE_HASH_NONE, F_SEEN, now_s, NULL);
            RedisModule_Replicate(ctx, "HSET", "sss", ckey, F_SEEN, now_s);
            sfree(&q, now_s);
        }
        sfree(&q, s);
    }
    if (ch) RedisModule_CloseKey(ch);
    sfree(&q, ckey);
    if (q.err) return finish(&q);
    RMS **ids = due_ids(&q, K_ACTIVE, limit, &n);
    for (long long i = 0; i < n; i++) {
        int rc = reap_one(&q, ids[i]);
        if (rc < 0) break;
        returned += rc == 1;
        dead += rc == 2;
    }
    free_ids(&q, ids, n);
    if (!q.err) {
        RedisModule_ReplyWithArray(ctx, 4);
        RedisModule_ReplyWithLongLong(ctx, returned);
        RedisModule_ReplyWithLongLong(ctx, dead);
        RedisModule_ReplyWithLongLong(ctx, q.now);
        RedisModule_ReplyWithLongLong(ctx, seen);
    }
    return finish(&q);
}

/* One due id of `delayed`, as promote.lua: a job key that is not a hash or a row without a
 * group is buried, a job whose lane is of the wrong type goes to `dead` naming it, one whose
 * group's other books cannot be read goes into its lane only (group_books). */
static int promote_one(Q *q, RMS *id) {
    RMS *jk = job_key(q, id), *g = NULL, *prio = NULL;
    RMK *job = RedisModule_OpenKey(q->ctx, jk, REDISMODULE_READ | REDISMODULE_WRITE);
    int jt = RedisModule_KeyType(job), rc = 0, books = 0;
    char why[320];
    if (jt == REDISMODULE_KEYTYPE_HASH)
        RedisModule_HashGet(job, REDISMODULE_HASH_NONE, F_GROUP, &g, F_PRIO, &prio, NULL);
    if (!g && jt != REDISMODULE_KEYTYPE_EMPTY) {
        rc = bury_as(q, id, NULL, "no group", NULL, job, jk, jt);
        job = NULL;
    } else if (g) {
        books = group_books(q, g, 0, 1, NULL, why, sizeof why);
        if (books < 0) rc = -1;
        else if (books == 2) {
            rc = bury_as(q, id, g, NULL, why, job, jk, jt);
            job = NULL;
        }
    }
    if (rc == 0) zrem(q, fx(q, K_DELAYED, 1), q->k[K_DELAYED], id);
    if (rc == 0 && g && books != 2) {
        RedisModule_HashSet(job, REDISMODULE_HASH_NONE, F_STATE, S_PENDING, NULL);
        RedisModule_Replicate(q->ctx, "HSET", "sss", jk, F_STATE, S_PENDING);
        rc = lane_in(q, g, id, lane_score(prio, (double)q->now), books);
    }
    if (job) RedisModule_CloseKey(job);
    sfree(q, jk);
    sfree(q, g);
    sfree(q, prio);
    return rc;
}

/* Tenants whose wait in twait is over: out of it, their marks back on the ring if still
 * open and their own ring holds a group (time mode: into gvt at their virtual time or the
 * floor, tenant_enter, while their zset holds a group), with a wake (lua/promote.lua). */
static int promote_tenants(Q *q, long long limit) {
    RMS *key = book_key(q, "twait");
    RMK *h;
    long long n = 0;
    if (dk(q, key, 0, REDISMODULE_KEYTYPE_ZSET, &h) < 0) {
        sfree(q, key);
        return -1;
    }
    RMS **ts = due_in(h, (double)q->now, limit, &n);
    if (h) RedisModule_CloseKey(h);
    int rc = 0;
    for (long long i = 0; rc == 0 && i < n; i++) {
        if ((rc = dk(q, key, 1, REDISMODULE_KEYTYPE_ZSET, &h)) == 0)
            rc = zrem(q, h, key, ts[i]) < 0 ? -1 : 0;
        if (h) RedisModule_CloseKey(h);
        int tf = rc == 0 ? time_fair(q) : -1, open = 0;
        if (tf < 0) rc = -1;
        if (rc < 0) continue;
        RMS *rk = tf ? tgvt_key(q, ts[i]) : tring_key(q, ts[i]);
        RMK *rh;
        rc = dk(q, rk, 0, tf ? REDISMODULE_KEYTYPE_ZSET : REDISMODULE_KEYTYPE_LIST, &rh);
        size_t len = vlen(rh);
        if (rh) RedisModule_CloseKey(rh);
        sfree(q, rk);
        if (rc == 0 && len > 0) rc = tenant_open(q, ts[i], &open);
        if (rc == 0 && len > 0 && open) {
            rc = tenant_enter(q, ts[i]);
            if (rc == 0) rc = wake(q, 0);
        }
    }
    free_ids(q, ts, n);
    sfree(q, key);
    return rc;
}


static int cmd_promote(RedisModuleCtx *ctx, RMS **argv, int argc) {
    if (argc != ARGV0 + 1) return RedisModule_WrongArity(ctx);
    Q q;
    if (q_init(&q, ctx, argv, B(K_DELAYED), B(K_PAUSED)) < 0) return finish(&q);
    long long limit, n;
    if (count_arg(&q, argv[ARGV0], &limit, "ERR emq: limit must be an integer >= 0") < 0)
        return finish(&q);
    RMS **ids = due_ids(&q, K_DELAYED, limit, &n);
    for (long long i = 0; i < n; i++)
        if (promote_one(&q, ids[i]) < 0) break;
    free_ids(&q, ids, n);
    if (q.err) return finish(&q);
    /* groups whose wait is over: out of gwait, back on the ring if still open */
    /* (no handle on gwait stays open across admit: one that emptied the zset, whose key
     * then went, would not see the zset admit makes again) */
    RMS *wkey = book_key(&q, "gwait");
    RMK *wh;
    long long ng = 0;
    RMS **groups = NULL;
    if (dk(&q, wkey, 0, REDISMODULE_KEYTYPE_ZSET, &wh) == 0) {
        groups = due_in(wh, (double)q.now, limit, &ng);
        if (wh) RedisModule_CloseKey(wh);
        for (long long i = 0; i < ng; i++) {
            int open, rc = dk(&q, wkey, 1, REDISMODULE_KEYTYPE_ZSET, &wh);
            if (rc == 0) rc = zrem(&q, wh, wkey, groups[i]) < 0 ? -1 : 0;
            if (wh) RedisModule_CloseKey(wh);
            if (rc < 0) break;
            /* a group whose books cannot be read stays out, as a claim leaves it */
            char why[320];
            int books = group_books(&q, groups[i], 0, 1, NULL, why, sizeof why);
            if (books < 0 || (!books && is_open(&q, groups[i], &open) < 0)) break;
            if (!books && open && admit(&q, groups[i]) < 0) break;
        }
    }
    free_ids(&q, groups, ng);
    if (q.err || promote_tenants(&q, limit) < 0 ||
        dk(&q, wkey, 0, REDISMODULE_KEYTYPE_ZSET, &wh) < 0) {
        sfree(&q, wkey);
        return finish(&q);
    }
    long long next_due = -1;
    RMS *tkey = book_key(&q, "twait");
    RMK *th;
    if (dk(&q, tkey, 0, REDISMODULE_KEYTYPE_ZSET, &th) < 0) {
        if (wh) RedisModule_CloseKey(wh);
        sfree(&q, wkey);
        sfree(&q, tkey);
        return finish(&q);
    }
    for (int k = 0; k < 3; k++) {
        double score;
        RMS *head = zfirst(k == 0 ? fx(&q, K_DELAYED, 0) : k == 1 ? wh : th, &score);
        if (head) {
            double d = score - (double)q.now;  /* the script's integer reply truncates */
            long long due = d <= 0 ? 0 : to_ll(d);
            if (next_due < 0 || due < next_due) next_due = due;
            sfree(&q, head);
        }
    }
    if (wh) RedisModule_CloseKey(wh);
    if (th) RedisModule_CloseKey(th);
    sfree(&q, wkey);
    sfree(&q, tkey);
    /* ring_any: EXISTS ring gvt, without reading the mode */
    RMS *gk = book_key(&q, "gvt");
    RMK *gh = RedisModule_OpenKey(ctx, gk, REDISMODULE_READ);   /* EXISTS: of any type */
    RMK *rh = RedisModule_OpenKey(ctx, q.k[K_RING], REDISMODULE_READ);
    long long ringed = (gh && RedisModule_KeyType(gh) != REDISMODULE_KEYTYPE_EMPTY) ||
                       (rh && RedisModule_KeyType(rh) != REDISMODULE_KEYTYPE_EMPTY);
    if (gh) RedisModule_CloseKey(gh);
    if (rh) RedisModule_CloseKey(rh);
    sfree(&q, gk);
    if (q.err) return finish(&q);
    long long claimable = ringed > 0 && !paused(&q);
    RedisModule_ReplyWithArray(ctx, 3);
    RedisModule_ReplyWithLongLong(ctx, n);
    RedisModule_ReplyWithLongLong(ctx, next_due);
    RedisModule_ReplyWithLongLong(ctx, claimable);
    return finish(&q);
}
