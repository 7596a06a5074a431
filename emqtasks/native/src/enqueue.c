/* src/enqueue.c: EMQ.ENQUEUE (enqueue.lua; enqueue_books twins lua/lib/enqueue.lua).
 * Included once by emq.c (a unity build), after the files before it there; never alone. */

/* A group whose lane a job of this call opens: what opening reads of its books (the
 * scripts' enqueue_books, as group_seat reads them). 1 readable, 0 not, -1 error. */
static int opening_ok(Q *q, RMS *g) {
    int paused, has_lim;
    double lim;
    RMS *v;
    if (group_paused(q, g, &paused) < 0 || book_get(q, "gbackoff", g, &v) < 0) return -1;
    sfree(q, v);
    int ok = setting_int(q, D_LIMIT, g, &has_lim, &lim);
    if (ok < 0) return -1;
    if (ok && has_lim) {
        RMK *ga = fx(q, K_GACTIVE, 0);
        if (q->err) return -1;
        v = hget(ga, g);
        ok = !v || int_ok(v);
        sfree(q, v);
    }
    if (!ok) return 0;
    long long m, per;
    int rated;
    if ((ok = rate_checked(q, g, &rated, &m, &per)) < 0) return -1;
    if (ok && rated) {
        RMS *sk = starts_key(q, g);
        ok = key_fits(q, sk, REDISMODULE_KEYTYPE_LIST);
        sfree(q, sk);
    }
    return ok;
}

/* enqueue_books (lua/lib/enqueue.lua): before the first write, what the call will write. refused[i]
 * 1 for a job refused (its lane not a zset, its cap unreadable, or the books its opening
 * reads unreadable). 1 fine, -2 a queue-wide key it writes of the wrong type (q->errbuf), -1
 * error. */
static int enqueue_books(Q *q, RMS **a, long long n, char *refused) {
    int later = 0, rc = 1, tf;
    long long nopen = 0;
    long long *opening = RedisModule_Alloc(sizeof(long long) * (size_t)(n ? n : 1));
    if (read_defaults(q) < 0) rc = -1;
    RMS *keys[6] = {rc == 1 ? hist_key(q) : NULL, NULL, NULL, NULL, NULL, NULL};
    int types[6] = {REDISMODULE_KEYTYPE_HASH};
    for (long long i = 0; rc == 1 && i < n; i++) {
        RMS **f = a + i * NJOB;
        double countdown, cap;
        refused[i] = 0;
        num(q, f[J_COUNTDOWN], &countdown, "ERR emq: countdown must be a number");   /* checked */
        if (countdown > 0) {
            later = 1;
            continue;
        }
        RMS *lk = lane_key(q, f[J_GROUP]);
        RMK *lane = RedisModule_OpenKey(q->ctx, lk, REDISMODULE_READ);
        int lane_ok = type_ok(lane, REDISMODULE_KEYTYPE_ZSET);
        size_t size = lane_ok ? vlen(lane) : 0;
        if (lane) RedisModule_CloseKey(lane);
        sfree(q, lk);
        int has_cap, cap_ok = setting_int(q, D_MAX_SIZE, f[J_GROUP], &has_cap, &cap);
        if (cap_ok < 0) rc = -1;
        else if (!lane_ok || !cap_ok) refused[i] = 1;
        else if (size == 0) opening[nopen++] = i;
    }
    int nk = 1;
    if (rc == 1 && later) {
        keys[nk] = q->k[K_DELAYED], types[nk++] = REDISMODULE_KEYTYPE_ZSET;
        keys[nk] = q->k[K_WAKE], types[nk++] = REDISMODULE_KEYTYPE_LIST;
    }
    RMS *gvt = NULL, *gvrun = NULL, *gwait = NULL;
    if (rc == 1 && nopen > 0) {
        if ((tf = time_fair(q)) < 0) rc = -1;
        else if (tf) {
            keys[nk] = gvt = book_key(q, "gvt"), types[nk++] = REDISMODULE_KEYTYPE_ZSET;
            keys[nk] = gvrun = book_key(q, "gvrun"), types[nk++] = REDISMODULE_KEYTYPE_HASH;
        } else {
            keys[nk] = q->k[K_RING], types[nk++] = REDISMODULE_KEYTYPE_LIST;
        }
    }
    if (rc == 1 && (rc = types_fit(q, keys, types, nk)) == 1 && nopen > 0) {
        RMS *more[3] = {q->k[K_GTURN], gwait = book_key(q, "gwait"), q->k[K_WAKE]};
        const int mt[3] = {REDISMODULE_KEYTYPE_HASH, REDISMODULE_KEYTYPE_ZSET,
                           REDISMODULE_KEYTYPE_LIST};
        rc = types_fit(q, more, mt, 3);
    }
    /* each group whose lane a job opens, once (its first job's verdict for all of them) */
    for (long long j = 0; rc == 1 && j < nopen; j++) {
        long long i = opening[j], first = i;
        for (long long k = 0; k < j; k++)
            if (eq(a[opening[k] * NJOB + J_GROUP], a[i * NJOB + J_GROUP])) {
                first = opening[k];
                break;
            }
        if (first != i) {
            refused[i] = refused[first];
            continue;
        }
        int ok = opening_ok(q, a[i * NJOB + J_GROUP]);
        if (ok < 0) rc = -1;
        else refused[i] = !ok;
    }
    sfree(q, keys[0]);
    sfree(q, gvt);
    sfree(q, gvrun);
    sfree(q, gwait);
    RedisModule_Free(opening);
    return rc;
}

/* The optional expiries of EMQ.ENQUEUE (lua/enqueue.lua): at most ten years either way, so
 * now + one stays integer text of 15 digits (int_ok). */
#define MAX_EXPIRES_MS 315576000000LL

/* tenant_claim (lua/lib/enqueue.lua): a job of group g names tenant t (NULL or '': none, the
 * group is its own tenant). *ok 1 when g is t's (passed to t when it is empty: nothing in
 * its lane nor in flight), 0 when it is another tenant's and busy (the job is refused).
 * full: the job will be refused for its lane's cap of 0 (the group stays whose it is). */
static int set_op(Q *q, const char *op, RMS *t, RMS *g);
static int tenant_pass(Q *q, RMS *g, RMS *t, RMS *cur_t, int full, int *ok);
static int tenant_claim(Q *q, RMS *g, RMS *t, int full, int *ok) {
    size_t tl = 0;
    if (t) RedisModule_StringPtrLen(t, &tl);
    if (tl == 0) t = NULL;
    RMS *cur;
    *ok = 1;
    if (tenant_of(q, g, &cur) < 0) return -1;
    int same = (!cur && !t) || (cur && t && eq(cur, t));
    if (same) {
        sfree(q, cur);
        return 0;
    }
    int rc = tenant_pass(q, g, t, cur, full, ok);
    sfree(q, cur);
    return rc;
}

/* SADD/SREM BASE t:<tenant>:groups g, replicated as itself. */
static int set_op(Q *q, const char *op, RMS *t, RMS *g) {
    RMS *key = mkname(q, "t:", t, ":groups");
    RedisModuleCallReply *r = RedisModule_Call(q->ctx, op, "ss", key, g);
    int ok = r && RedisModule_CallReplyType(r) == REDISMODULE_REPLY_INTEGER;
    long long changed = ok ? RedisModule_CallReplyInteger(r) : 0;
    if (r) RedisModule_FreeCallReply(r);
    if (ok && changed) RedisModule_Replicate(q->ctx, op, "ss", key, g);
    sfree(q, key);
    return ok ? 0 : fail(q, WRONGTYPE);
}

/* tenant_claim's second half: g passes from cur_t to t when it is empty. */
static int tenant_pass(Q *q, RMS *g, RMS *t, RMS *cur_t, int full, int *ok) {
    RMS *lk = lane_key(q, g);
    RMK *lane = RedisModule_OpenKey(q->ctx, lk, REDISMODULE_READ);
    int lane_ok = type_ok(lane, REDISMODULE_KEYTYPE_ZSET);   /* the wrong type: busy */
    size_t n = lane_ok ? vlen(lane) : 0;
    if (lane) RedisModule_CloseKey(lane);
    sfree(q, lk);
    RMK *ga = fx(q, K_GACTIVE, 0);
    if (q->err) return -1;
    RMS *a = hget(ga, g);
    double av = 0;
    int busy = !lane_ok || n > 0;
    if (a) busy = busy || RedisModule_StringToDouble(a, &av) != REDISMODULE_OK || av > 0;
    sfree(q, a);
    if (busy) {
        *ok = 0;
        return 0;
    }
    if (full) return 0;
    RMS *key = book_key(q, "gtenant");
    RMK *h;
    int rc = dk(q, key, 1, REDISMODULE_KEYTYPE_HASH, &h);
    if (rc == 0) {
        if (t) hset1(q, h, key, g, t);
        else hdel(q, h, key, g);
    }
    if (h) RedisModule_CloseKey(h);
    sfree(q, key);
    /* each tenant's set of its groups follows (a tenant's lane cap counts over it) */
    if (rc == 0 && t) rc = set_op(q, "SADD", t, g);
    if (rc == 0 && cur_t) rc = set_op(q, "SREM", cur_t, g);
    return rc;
}

/* A tenant's lane cap (tmax, its own else the default) over the jobs waiting in all its
 * groups' lanes (t:<tenant>:groups): *full 1 when a job due now would pass it (lua
 * TEN.full; O(its groups), only when it has a cap). t NULL or '': none. */
static int tenant_full(Q *q, RMS *t, int *full) {
    size_t tl = 0;
    *full = 0;
    if (t) RedisModule_StringPtrLen(t, &tl);
    if (tl == 0) return 0;
    int has;
    double cap;
    if (tenant_setting(q, "tmax", t, &has, &cap) < 0) return -1;
    if (!has) return 0;
    RMS *key = mkname(q, "t:", t, ":groups");
    RedisModuleCallReply *r = RedisModule_Call(q->ctx, "SMEMBERS", "s", key);
    sfree(q, key);
    if (!r || RedisModule_CallReplyType(r) != REDISMODULE_REPLY_ARRAY) {
        if (r) RedisModule_FreeCallReply(r);
        return fail(q, WRONGTYPE);
    }
    double count = 0;
    size_t n = RedisModule_CallReplyLength(r);
    for (size_t i = 0; i < n; i++) {
        RMS *g = RedisModule_CreateStringFromCallReply(RedisModule_CallReplyArrayElement(r, i));
        RMS *lk = lane_key(q, g);
        RMK *lane = RedisModule_OpenKey(q->ctx, lk, REDISMODULE_READ);
        if (type_ok(lane, REDISMODULE_KEYTYPE_ZSET)) count += (double)vlen(lane);
        if (lane) RedisModule_CloseKey(lane);
        sfree(q, lk);
        sfree(q, g);
    }
    RedisModule_FreeCallReply(r);
    *full = count >= cap;
    return 0;
}

/* Job id takes unique key uk for ms (SET uk id PX ms). */
static void unique_take(Q *q, RMS *uk, RMS *id, long long ms) {
    RMK *h = RedisModule_OpenKey(q->ctx, uk, REDISMODULE_READ | REDISMODULE_WRITE);
    RedisModule_DeleteKey(h);
    RedisModule_StringSet(h, id);
    RedisModule_SetExpire(h, ms);
    RedisModule_CloseKey(h);
    RedisModule_Replicate(q->ctx, "SET", "sscl", uk, id, "PX", ms);
}

/* A unique key of EMQ.ENQUEUE ('<ms>:<key>' or 'd<ms>:<debounce>:<max>:<key>', checked;
 * lua/lib/enqueue.lua unique_parts): the key's name, or NULL for ''; its ms in *ms, its
 * debounce and max ms in *deb and *max (0 when not debounced), the key itself in *key. */
static RMS *unique_name(Q *q, RMS *u, long long *ms, long long *deb, long long *max,
                        RMS **key) {
    size_t len = 0;
    const char *p = u ? RedisModule_StringPtrLen(u, &len) : NULL;
    *deb = *max = 0;
    *key = NULL;
    if (!len) return NULL;
    const char *at = p, *end = p + len;
    char *next;
    if (*p == 'd') {
        *ms = strtoll(p + 1, &next, 10);
        *deb = strtoll(next + 1, &next, 10);
        *max = strtoll(next + 1, &next, 10);
        at = next + 1;
    } else {
        *ms = strtoll(p, &next, 10);
        at = next + 1;
    }
    *key = RedisModule_CreateString(q->ctx, at, (size_t)(end - at));
    return unique_key(q, *key);
}

/* The id of the job holding unique key uk while it is not finished (its row exists with no
 * `finished`), else NULL (free, expired, or its holder ended: the key is taken over). A
 * debounced key (deb > 0) answers its holder only while it may be debounced (delayed, never
 * started, debounced itself: `dfirst`): then it takes payload and is due deb ms from now,
 * never later than dfirst + max, and the key is held ms again; else NULL (a new job). */
static RMS *unique_held(Q *q, RMS *uk, long long ms, long long deb, long long max,
                        RMS *payload) {
    RMK *h = RedisModule_OpenKey(q->ctx, uk, REDISMODULE_READ);
    RMS *holder = NULL;
    if (type_ok(h, REDISMODULE_KEYTYPE_STRING) && RedisModule_KeyType(h) != REDISMODULE_KEYTYPE_EMPTY) {
        size_t hl;
        const char *hp = RedisModule_StringDMA(h, &hl, REDISMODULE_READ);
        holder = RedisModule_CreateString(q->ctx, hp, hl);
    }
    if (h) RedisModule_CloseKey(h);
    if (!holder) return NULL;
    RMS *jk = job_key(q, holder);
    RMK *row = RedisModule_OpenKey(q->ctx, jk, REDISMODULE_READ | REDISMODULE_WRITE);
    RMS *state = NULL, *finished = NULL, *attempts = NULL, *first = NULL;
    if (row && RedisModule_KeyType(row) == REDISMODULE_KEYTYPE_HASH)
        RedisModule_HashGet(row, REDISMODULE_HASH_NONE, F_STATE, &state, F_FINISHED, &finished,
                            F_ATTEMPTS, &attempts, F_DFIRST, &first, NULL);
    int live = state && !finished;
    long long f0 = 0;
    if (live && deb > 0) {
        live = eq(state, S_DELAYED) && attempts && eq(attempts, S_ZERO) && first
               && RedisModule_StringToLongLong(first, &f0) == REDISMODULE_OK;
        if (live) {
            long long due = q->now + deb < f0 + max ? q->now + deb : f0 + max;
            hset1(q, row, jk, F_PAYLOAD, payload);
            zadd(q, fx(q, K_DELAYED, 1), q->k[K_DELAYED], (double)due, holder, 1);
        }
    }
    if (row) RedisModule_CloseKey(row);
    sfree(q, jk);
    sfree(q, state);
    sfree(q, finished);
    sfree(q, attempts);
    sfree(q, first);
    if (!live) {
        sfree(q, holder);
        return NULL;
    }
    if (deb > 0) unique_take(q, uk, holder, ms);
    return holder;
}

static int enqueue_one(Q *q, RMS **f, RMS *now_s, int refused, RMS *ex, RMS *tenant,
                       RMS *u, RMS **held, long long *verdict) {
    RMS *id = f[J_ID], *g = f[J_GROUP];
    double countdown, prio = 0, cap = 0;
    num(q, f[J_COUNTDOWN], &countdown, "ERR emq: countdown must be a number");
    if (RedisModule_StringToDouble(f[J_PRIORITY], &prio) != REDISMODULE_OK || !isfinite(prio))
        prio = 0;
    if (!id_ok(id)) {
        *verdict = -1;
        return 0;
    }
    /* One open of the row (each open is a lookup): for EXISTS (any type counts) and the
     * write. */
    RMS *jk = job_key(q, id);
    RMK *job = RedisModule_OpenKey(q->ctx, jk, REDISMODULE_READ | REDISMODULE_WRITE);
    int rc = 0, has_cap = 0;
    *verdict = 0;
    if (refused) {                               /* enqueue_books: its lane or books unreadable */
        if (RedisModule_KeyType(job) == REDISMODULE_KEYTYPE_EMPTY) *verdict = 3;
        RedisModule_CloseKey(job);
        sfree(q, jk);
        return 0;
    }
    long long ums = 0, deb = 0, dmax = 0;
    RMS *ukey = NULL;
    RMS *uk = RedisModule_KeyType(job) == REDISMODULE_KEYTYPE_EMPTY
                  ? unique_name(q, u, &ums, &deb, &dmax, &ukey) : NULL;
    if (uk && (*held = unique_held(q, uk, ums, deb, dmax, f[J_PAYLOAD])) != NULL) {
        RedisModule_CloseKey(job);               /* its key's holder: not written */
        sfree(q, jk);
        sfree(q, uk);
        sfree(q, ukey);
        return 0;
    }
    if (countdown <= 0 && RedisModule_KeyType(job) == REDISMODULE_KEYTYPE_EMPTY) {
        int tfull;                               /* its tenant's cap over all its groups */
        if (tenant_full(q, tenant, &tfull) < 0) rc = -1;
        else if (tfull) {
            *verdict = 2;
            RedisModule_CloseKey(job);
            sfree(q, jk);
            sfree(q, uk);
            sfree(q, ukey);
            return 0;
        }
    }
    if (rc == 0 && countdown <= 0) rc = max_size_of(q, g, &has_cap, &cap);   /* the cap on waiting jobs */
    if (rc == 0 && RedisModule_KeyType(job) == REDISMODULE_KEYTYPE_EMPTY) {
        int ok;
        if (tenant_claim(q, g, tenant, has_cap && cap == 0, &ok) < 0) rc = -1;
        else if (!ok) {                          /* its group is another tenant's, busy */
            *verdict = 4;
            RedisModule_CloseKey(job);
            sfree(q, jk);
            sfree(q, uk);
            sfree(q, ukey);
            return 0;
        }
    }
    /* A producer's job: held to its lane's cap when due now (a countdown joins its lane when
     * due), and counted in the minute's history as enqueued (lua/enqueue.lua says the same). */
    RMS *expires = NULL;
    size_t exlen = 0;
    if (ex) RedisModule_StringPtrLen(ex, &exlen);
    if (exlen > 0)                               /* the deadline: now + ms (checked) */
        expires = RedisModule_CreateStringFromLongLong(q->ctx,
                                                       q->now + (long long)int_val(ex));
    if (rc == 0 && RedisModule_KeyType(job) == REDISMODULE_KEYTYPE_EMPTY)
        rc = new_job(q, job, jk, f, now_s, prio, has_cap ? &cap : NULL, 1, expires, verdict);
    if (rc == 0 && uk && *verdict == 1) {           /* the row keeps its key; the key, its id */
        hset1(q, job, jk, F_UNIQUE, ukey);
        if (deb > 0) hset1(q, job, jk, F_DFIRST, now_s);   /* a debounced job's first call */
        unique_take(q, uk, id, ums);
    }
    sfree(q, uk);
    sfree(q, ukey);
    sfree(q, expires);
    RedisModule_CloseKey(job);
    sfree(q, jk);
    return rc;
}

static int cmd_enqueue(RedisModuleCtx *ctx, RMS **argv, int argc) {
    if (argc < ARGV0 + 1) return RedisModule_WrongArity(ctx);
    long long n;
    if (RedisModule_StringToLongLong(argv[ARGV0], &n) != REDISMODULE_OK || n < 0)
        return RedisModule_ReplyWithError(ctx, "ERR emq: n must be an integer >= 0");
    /* n jobs, then optionally n expiries (sent when a job of the call has one) */
    if (n > argc) return RedisModule_WrongArity(ctx);
    long long given = argc - ARGV0 - 1;
    /* then optionally n tenants after the expiries, and n unique keys after them
     * (lua/enqueue.lua) */
    if (given != n * NJOB && (n == 0 || (given != n * NJOB + n && given != n * NJOB + 2 * n
                                         && given != n * NJOB + 3 * n)))
        return RedisModule_WrongArity(ctx);
    RMS **ex = given == n * NJOB ? NULL : argv + ARGV0 + 1 + n * NJOB;
    RMS **tn = given >= n * NJOB + 2 * n && n > 0 ? ex + n : NULL;
    RMS **un = given == n * NJOB + 3 * n && n > 0 ? ex + 2 * n : NULL;
    Q q;
    if (q_init(&q, ctx, argv, 0, 0) < 0) return finish(&q);
    RMS **a = argv + ARGV0 + 1;
    /* Every number of every job is checked before the first job is written. */
    for (long long i = 0; i < n; i++) {
        RMS **f = a + i * NJOB;
        double d;
        long long ll;
        if (num(&q, f[J_MAX], &d, "ERR emq: max must be a number") < 0 ||
            num(&q, f[J_LEASE], &d, "ERR emq: lease must be a number") < 0 ||
            num(&q, f[J_DELAY], &d, "ERR emq: delay must be a number") < 0 ||
            integer(&q, f[J_TTL], &ll, "ERR emq: ttl must be an integer") < 0 ||
            num(&q, f[J_COUNTDOWN], &d, "ERR emq: countdown must be a number") < 0)
            return finish(&q);
        size_t len = 0;
        if (ex) RedisModule_StringPtrLen(ex[i], &len);
        if (len > 0 && !(int_ok(ex[i]) && fabs(int_val(ex[i])) <= (double)MAX_EXPIRES_MS)) {
            fail(&q, "ERR emq: an expiry must be integer ms within 10 years");
            return finish(&q);
        }
        /* a unique key: '<ms>:<key>' or 'd<ms>:<debounce>:<max>:<key>', ms 1-12 digits not
         * all 0, the others digits, the key not empty */
        size_t ul = 0, dg = 0, lead;
        const char *up = un ? RedisModule_StringPtrLen(un[i], &ul) : NULL;
        int nonzero = 0, ok = 1;
        lead = dg = ul > 0 && up[0] == 'd';
        while (dg < ul && up[dg] >= '0' && up[dg] <= '9') nonzero |= up[dg++] != '0';
        ok = dg > lead && dg - lead <= 12 && nonzero && dg < ul && up[dg] == ':';
        for (int part = 0; ok && lead && part < 2; part++) {   /* debounce, max */
            size_t d0 = ++dg;
            while (dg < ul && up[dg] >= '0' && up[dg] <= '9') dg++;
            ok = dg > d0 && dg < ul && up[dg] == ':';
        }
        if (ul > 0 && !(ok && dg + 1 < ul)) {
            fail(&q, "ERR emq: a unique key is <ms>:<key>, ms a positive integer");
            return finish(&q);
        }
    }
    long long *out = RedisModule_Alloc(sizeof(long long) * (size_t)(n ? n : 1));
    char *refused = RedisModule_Alloc((size_t)(n ? n : 1));
    RMS **held = RedisModule_Alloc(sizeof(RMS *) * (size_t)(n ? n : 1));
    for (long long i = 0; i < n; i++) held[i] = NULL;
    int books = enqueue_books(&q, a, n, refused);
    if (books == -2) fail(&q, q.errbuf);
    RMS *now_s = RedisModule_CreateStringFromLongLong(ctx, q.now);
    q.full = full(ctx);
    for (long long i = 0; books == 1 && i < n; i++) {
        if (enqueue_one(&q, a + i * NJOB, now_s, refused[i], ex ? ex[i] : NULL,
                        tn ? tn[i] : NULL, un ? un[i] : NULL, &held[i], &out[i]) < 0)
            break;
        if (out[i] == 1) q.full = 0;   /* written: a script is not stopped half-way */
    }
    sfree(&q, now_s);
    RedisModule_Free(refused);
    if (!q.err) {
        RedisModule_ReplyWithArray(ctx, (long)n);
        for (long long i = 0; i < n; i++) {
            if (held[i]) RedisModule_ReplyWithString(ctx, held[i]);   /* its key's holder */
            else RedisModule_ReplyWithLongLong(ctx, out[i]);
        }
    }
    for (long long i = 0; i < n; i++) sfree(&q, held[i]);
    RedisModule_Free(held);
    RedisModule_Free(out);
    return finish(&q);
}
