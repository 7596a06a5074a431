/* src/lease.c: the verbs of a lease: EMQ.CLAIM, EMQ.ACK, EMQ.RETRY, EMQ.EXTEND, EMQ.RELEASE
 * (claim.lua, ack.lua, retry.lua, extend.lua, release.lua).
 * Included once by emq.c (a unity build), after the files before it there; never alone. */

static RMS *claim_nonce(Q *q, RMS *prefix, long long i) {
    size_t pl;
    const char *p = RedisModule_StringPtrLen(prefix, &pl);
    char digits[24], stackbuf[128];
    int tl = 0;
    do digits[tl++] = (char)('0' + i % 10); while ((i /= 10) > 0);   /* i >= 1 */
    size_t total = pl + 1 + (size_t)tl;
    char *buf = total <= sizeof stackbuf ? stackbuf : RedisModule_Alloc(total);
    memcpy(buf, p, pl);
    buf[pl] = ':';
    for (int d = 0; d < tl; d++) buf[pl + 1 + d] = digits[tl - 1 - d];
    RMS *s = RedisModule_CreateString(q->ctx, buf, total);
    if (buf != stackbuf) RedisModule_Free(buf);
    return s;
}

static int cmd_claim(RedisModuleCtx *ctx, RMS **argv, int argc) {
    if (argc != ARGV0 + 2) return RedisModule_WrongArity(ctx);
    Q q;
    /* The keys are type-checked where the script meets them: a claim that finds nothing to
     * take answers [] whatever its books, and claim_books checks those it writes. */
    if (q_init(&q, ctx, argv, 0, 0) < 0) return finish(&q);
    long long n;
    if (count_arg(&q, argv[ARGV0], &n, "ERR emq: n must be an integer >= 0") < 0)
        return finish(&q);
    Job *jobs = NULL;
    long long got = 0, cap = 0;
    if (!paused(&q)) {
        for (long long i = 1; i <= n; i++) {
            if (got == cap) {
                cap = cap ? cap * 2 : 4;
                jobs = RedisModule_Realloc(jobs, sizeof(Job) * (size_t)cap);
            }
            RMS *nonce = claim_nonce(&q, argv[ARGV0 + 1], i);
            int rc = claim_one(&q, nonce, &jobs[got]);
            if (rc <= 0) {
                sfree(&q, nonce);
                if (rc == -2) fail(&q, q.errbuf);
                break;
            }
            got++;
        }
    }
    if (!q.err) {
        RedisModule_ReplyWithArray(ctx, (long)got);
        for (long long i = 0; i < got; i++) reply_job(ctx, &jobs[i]);
    }
    for (long long i = 0; i < got; i++) job_free(&q, &jobs[i]);
    RedisModule_Free(jobs);
    return finish(&q);
}

/* The same holder's ack again (its reply was lost: a cut connection, a timeout; the worker
 * sends it again): the row is done with this holder's attempts and nonce. 1 yes, 0 no (a
 * row gone with ttl 0 cannot tell), -1 error. As ack.lua. */
static int acked_before(Q *q, RMS **a) {
    Row r;
    memset(&r, 0, sizeof r);
    r.key = job_key(q, a[0]);
    if (dk(q, r.key, 0, REDISMODULE_KEYTYPE_HASH, &r.h) < 0) {
        row_free(q, &r);
        return -1;
    }
    if (RedisModule_KeyType(r.h) != REDISMODULE_KEYTYPE_EMPTY)
        RedisModule_HashGet(r.h, REDISMODULE_HASH_NONE, F_STATE, &r.state, F_ATTEMPTS,
                            &r.attempts, F_NONCE, &r.nonce, NULL);
    int same = r.state && eqc(r.state, "done") && r.attempts && eq(r.attempts, a[1]) &&
               r.nonce && eq(r.nonce, a[2]);
    row_free(q, &r);
    return same;
}

/* ack's first half: the fenced job is done. 1 done (or done before by this holder), 0
 * stale, -1 error. `tp` (a[5], optional, NULL when absent or ''): the run's span, kept on
 * the steps it releases (ack.lua). */
static int ack_done(Q *q, RMS **a, RMS *tp) {
    Row r;
    long long ttl;
    int f = fenced_end(q, a, &r, &ttl);
    if (f == 0) return acked_before(q, a);
    if (f < 0) return f;
    int books = end_books(q, &r, a[0], NULL, NULL, 0);
    if (books < 0) return -1;
    zrem(q, fx(q, K_ACTIVE, 1), q->k[K_ACTIVE], a[0]);
    row_ended(q, &r, ttl, S_DONE, F_RESULT, a[3], F_PAYLOAD);
    int rc = books ? 0 : active_drop(q, r.group);
    if (rc == 0) rc = hist_succeeded(q, r.task, r.group, r.started);
    if (rc == 0) rc = notify(q, a[0], r.waiters);
    if (rc == 0 && r.next) rc = wf_handover(q, r.next, r.slot, a[3], tp);
    row_free(q, &r);
    return rc < 0 ? -1 : 1;
}

static int cmd_ack(RedisModuleCtx *ctx, RMS **argv, int argc) {
    if (argc != ARGV0 + 5 && argc != ARGV0 + 6) return RedisModule_WrongArity(ctx);
    Q q;
    if (q_init(&q, ctx, argv, B(K_ACTIVE) | B(K_GACTIVE), B(K_GLIMIT) | B(K_PAUSED)) < 0) return finish(&q);
    RMS **a = argv + ARGV0;
    RMS *tp = argc == ARGV0 + 6 && slen(a[5]) > 0 ? a[5] : NULL;
    int verdict = ack_done(&q, a, tp), got = 0;
    Job job;
    if (verdict == 0) {                          /* a stale ack, counted for stats() */
        RMS *key = book_key(&q, "tally");
        RMK *h;
        long long n;
        if (dk(&q, key, 1, REDISMODULE_KEYTYPE_HASH, &h) == 0)
            hincrby(&q, h, key, F_STALE_ACKS, 1, &n);
        if (h) RedisModule_CloseKey(h);
        sfree(&q, key);
        if (q.err) verdict = -1;
    }
    /* a queue-wide key a claim writes of the wrong type (-2): no next job, the ack stands */
    if (verdict >= 0 && slen(a[4]) > 0 && !paused(&q)) got = claim_one(&q, a[4], &job);
    if (!q.err) {
        RedisModule_ReplyWithArray(ctx, 2);
        RedisModule_ReplyWithLongLong(ctx, verdict);
        if (got == 1) reply_job(ctx, &job);
        else RedisModule_ReplyWithNull(ctx);
    }
    if (got == 1) {
        job.nonce = NULL;          /* the argument, not ours to free */
        job_free(&q, &job);
    }
    return finish(&q);
}

/* The row's fixed retry delay, for a retry that names none. */
static int row_delay(Q *q, RMK *h, double *delay) {
    RMS *d = hget(h, F_DELAY);
    *delay = 0;
    int rc = d ? num(q, d, delay, "ERR emq: a job row's delay is not a number") : 0;
    sfree(q, d);
    return rc;
}

/* 1 retry scheduled, 2 dead, 0 stale, -1 error. `link` (a[6], optional): the failed
 * attempt's traceparent, kept on the row for the next attempt's span (retry.lua). */
static int retry(Q *q, RMS **a, RMS *link) {
    double delay = 0, att, max;
    int has_delay = slen(a[4]) > 0;
    if (has_delay && num(q, a[4], &delay, "ERR emq: delay must be a number or ''") < 0)
        return -1;
    Row r;
    int f = fenced(q, a[0], a[1], a[2], &r);
    if (f <= 0) return f;
    if (need_group(q, &r) < 0) return -1;
    int dead = eqc(a[5], "1");
    if (!dead) {
        if (num(q, r.attempts, &att, "ERR emq: a job row's attempts is not a number") < 0 ||
            (r.max ? num(q, r.max, &max, "ERR emq: a job row's max is not a number")
                   : fail(q, "ERR emq: a job row has no max")) < 0 ||
            (!has_delay && row_delay(q, r.h, &delay) < 0)) {
            row_free(q, &r);
            return -1;
        }
        dead = att >= max;
    }
    /* the queue-wide keys the job leaves and goes into, as retry.lua */
    RMS *into[3] = {q->k[K_ACTIVE], dead ? q->k[K_DEAD] : q->k[K_DELAYED],
                    dead ? NULL : q->k[K_WAKE]};
    const int types[3] = {REDISMODULE_KEYTYPE_ZSET, REDISMODULE_KEYTYPE_ZSET,
                          REDISMODULE_KEYTYPE_LIST};
    int books = end_books(q, &r, a[0], into, types, 3);
    if (books < 0) return -1;
    if (link && slen(link) > 0) {
        RedisModule_HashSet(r.h, REDISMODULE_HASH_NONE, F_TLINK, link, NULL);
        RedisModule_Replicate(q->ctx, "HSET", "sss", r.key, F_TLINK, link);
    }
    zrem(q, fx(q, K_ACTIVE, 1), q->k[K_ACTIVE], a[0]);
    int rc = books ? 0 : active_drop(q, r.group);
    if (rc == 0 && dead) {
        RMS *now_s = RedisModule_CreateStringFromLongLong(q->ctx, q->now);
        RedisModule_HashSet(r.h, REDISMODULE_HASH_NONE, F_STATE, S_DEAD, F_ERROR, a[3],
                            F_FINISHED, now_s, NULL);
        RedisModule_Replicate(q->ctx, "HSET", "sssssss", r.key, F_STATE, S_DEAD, F_ERROR, a[3],
                              F_FINISHED, now_s);
        sfree(q, now_s);
        rc = zadd(q, fx(q, K_DEAD, 1), q->k[K_DEAD], (double)q->now, a[0], 0);
        if (rc == 0) rc = hist_failed(q, r.task, r.group, 1);
        if (rc == 0) rc = notify(q, a[0], r.waiters);
        if (rc == 0 && r.wf) rc = wf_fail(q, r.wf, a[0]);
    } else if (rc == 0 && (rc = hist_failed(q, r.task, r.group, 0)) == 0) {
        RedisModule_HashSet(r.h, REDISMODULE_HASH_NONE, F_STATE, S_DELAYED, F_ERROR, a[3], NULL);
        RedisModule_Replicate(q->ctx, "HSET", "sssss", r.key, F_STATE, S_DELAYED, F_ERROR, a[3]);
        rc = delay_push(q, a[0], (double)q->now + delay);
    }
    row_free(q, &r);
    return rc < 0 ? -1 : dead ? 2 : 1;
}

static int cmd_retry(RedisModuleCtx *ctx, RMS **argv, int argc) {
    if (argc != ARGV0 + 6 && argc != ARGV0 + 7) return RedisModule_WrongArity(ctx);
    Q q;
    /* `active` checked in retry(), after the row, as retry.lua */
    if (q_init(&q, ctx, argv, B(K_GACTIVE), B(K_GLIMIT)) < 0) return finish(&q);
    int verdict = retry(&q, argv + ARGV0, argc == ARGV0 + 7 ? argv[ARGV0 + 6] : NULL);
    if (!q.err) RedisModule_ReplyWithLongLong(ctx, verdict);
    return finish(&q);
}

static int cmd_extend(RedisModuleCtx *ctx, RMS **argv, int argc) {
    if (argc < ARGV0 + 1 || (argc - ARGV0 - 1) % 3 != 0) return RedisModule_WrongArity(ctx);
    Q q;
    if (q_init(&q, ctx, argv, B(K_ACTIVE), 0) < 0) return finish(&q);
    double lease;
    if (num(&q, argv[ARGV0], &lease, "ERR emq: lease must be a number") < 0) return finish(&q);
    int n = (argc - ARGV0 - 1) / 3;
    long long *out = RedisModule_Alloc(sizeof(long long) * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) {
        RMS **t = argv + ARGV0 + 1 + 3 * i;
        Row r;
        int f = fenced_as(&q, t[0], t[1], t[2], &r, 2);
        if (f < 0) break;
        if (f == 1) {
            int rc = zadd(&q, fx(&q, K_ACTIVE, 1), q.k[K_ACTIVE], (double)q.now + lease, t[0], 1);
            if (rc == 0) {                       /* seen running: its expiry spends it */
                RedisModule_HashSet(r.h, REDISMODULE_HASH_NONE, F_RAN, t[2], NULL);
                RedisModule_Replicate(q.ctx, "HSET", "sss", r.key, F_RAN, t[2]);
            }
            row_free(&q, &r);
            if (rc < 0) break;
        }
        out[i] = f;
    }
    if (!q.err) {
        RedisModule_ReplyWithArray(ctx, n);
        for (int i = 0; i < n; i++) RedisModule_ReplyWithLongLong(ctx, out[i]);
    }
    RedisModule_Free(out);
    return finish(&q);
}

static int abort_end(Q *q, RMS **a);   /* abort.c */

/* A release of an attempt whose abort was asked ends it `aborted`, as abort's end, its error
 * "Aborted: asked before it was released; " and the reason (release.lua). 1, -1 error. */
static int release_aborted(Q *q, RMS **a) {
    static const char pre[] = "Aborted: asked before it was released; ";
    size_t rl;
    const char *rp = RedisModule_StringPtrLen(a[3], &rl);
    char *buf = RedisModule_Alloc(sizeof pre - 1 + rl);
    memcpy(buf, pre, sizeof pre - 1);
    memcpy(buf + sizeof pre - 1, rp, rl);
    RMS *err = RedisModule_CreateString(q->ctx, buf, sizeof pre - 1 + rl);
    RedisModule_Free(buf);
    RMS *args[4] = {a[0], a[1], a[2], err};
    int rc = abort_end(q, args);
    sfree(q, err);
    return rc;
}

/* 1 released (or ended aborted: release_aborted), 0 stale, -1 error. */
static int release(Q *q, RMS **a) {
    Row r;
    int f = fenced(q, a[0], a[1], a[2], &r);
    if (f <= 0) return f;
    /* the attempt an abort was asked of (the row's `abort` is its nonce) is not handed back,
     * or the next claim would run it (release.lua) */
    RMS *asked = hget(r.h, F_ABORT);
    int named = asked && eq(asked, a[2]);
    sfree(q, asked);
    if (named) {
        row_free(q, &r);
        return release_aborted(q, a);
    }
    if (need_group(q, &r) < 0) return -1;
    long long att;
    double created = 0, off = 0;
    RMS *c = NULL, *prio = NULL;
    RedisModule_HashGet(r.h, REDISMODULE_HASH_NONE, F_CREATED, &c, F_PRIO, &prio, NULL);
    int rc = integer(q, r.attempts, &att, "ERR hash value is not an integer");
    if (rc == 0 && c) rc = num(q, c, &created, "ERR emq: a job row's created is not a number");
    /* back-off: tonumber(ARGV[5]) or 0 */
    if (RedisModule_StringToDouble(a[4], &off) != REDISMODULE_OK || isnan(off)) off = 0;
    sfree(q, c);
    /* read before the first write (group_books): a lane of the wrong type sends the job to
     * `dead` with the reason; other books that cannot be read are left as they are */
    char why[320];
    int books = rc == 0 ? group_books(q, r.group, 1, 1, r.vcharge, why, sizeof why) : 0;
    if (books < 0) rc = -1;
    if (rc == 0 && books == 2) {
        const int type = REDISMODULE_KEYTYPE_ZSET;   /* `active` first, as release.lua */
        if (types_fit(q, &q->k[K_ACTIVE], &type, 1) == -2) {
            sfree(q, prio);
            row_free(q, &r);
            return fail(q, q->errbuf);
        }
        rc = bury_as(q, a[0], r.group, NULL, why, r.h, r.key, REDISMODULE_KEYTYPE_HASH);
        r.h = NULL;
        if (rc == 0) zrem(q, fx(q, K_ACTIVE, 1), q->k[K_ACTIVE], a[0]);
        sfree(q, prio);
        row_free(q, &r);
        return rc < 0 ? -1 : 1;
    }
    if (rc == 0 && !books)
        rc = time_settle(q, r.group, a[0], r.h, r.key, r.started, r.vcharge, 0);
    if (rc == 0) {
        zrem(q, fx(q, K_ACTIVE, 1), q->k[K_ACTIVE], a[0]);
        rc = hincrby(q, r.h, r.key, F_ATTEMPTS, -1, &att);
    }
    if (rc == 0) {
        RedisModule_HashSet(r.h, REDISMODULE_HASH_NONE, F_STATE, S_PENDING, F_ERROR, a[3], NULL);
        RedisModule_Replicate(q->ctx, "HSET", "sssss", r.key, F_STATE, S_PENDING, F_ERROR, a[3]);
        rc = books ? 0 : active_drop(q, r.group);
    }
    if (rc == 0) rc = lane_in(q, r.group, a[0], lane_score(prio, created), books);
    sfree(q, prio);
    if (rc == 0 && off > 0 && !books) {
        int was;
        RMS *cur = NULL, *key = book_key(q, "gbackoff");
        double until = (double)q->now + off, prev = 0;
        RMK *h;
        rc = placed(q, r.group, &was);
        if (rc == 0) rc = dk(q, key, 1, REDISMODULE_KEYTYPE_HASH, &h);
        if (rc == 0) {
            cur = hget(h, r.group);
            if (cur) rc = num(q, cur, &prev, "ERR emq: a group back-off is not a number");
            if (rc == 0) {
                char buf[40];
                if (prev > until) until = prev;
                RMS *u = mk_tmp(q, fmt_num(until, buf));
                RedisModule_HashSet(h, REDISMODULE_HASH_NONE, r.group, u, NULL);
                RedisModule_Replicate(q->ctx, "HSET", "sss", key, r.group, u);
                sfree(q, u);
            }
        }
        if (h) RedisModule_CloseKey(h);
        sfree(q, cur);
        sfree(q, key);
        if (rc == 0) rc = settle(q, r.group, was);
    }
    row_free(q, &r);
    return rc < 0 ? -1 : 1;
}

static int cmd_release(RedisModuleCtx *ctx, RMS **argv, int argc) {
    if (argc != ARGV0 + 5) return RedisModule_WrongArity(ctx);
    Q q;
    /* `active` checked in release(), after the row and its group's books, as release.lua */
    if (q_init(&q, ctx, argv, B(K_GACTIVE), B(K_GLIMIT)) < 0) return finish(&q);
    int verdict = release(&q, argv + ARGV0);
    if (!q.err) RedisModule_ReplyWithLongLong(ctx, verdict);
    return finish(&q);
}
