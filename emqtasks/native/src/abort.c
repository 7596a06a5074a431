/* src/abort.c: EMQ.ABORT, the twin of abort.lua: ask the masters to stop a running job (ask),
 * or end the attempt that was stopped (end).
 * Included once by emq.c (a unity build), after the files before it there; never alone. */

/* ask: 1 asked, 0 no such job, -1 not running (pending, delayed, waiting), -2 finished;
 * -9 error. The row's `abort` takes the running attempt's nonce; "<id> <nonce>" goes on the
 * abort list of every master in the `workers` index (abort.lua). */
static int abort_ask(Q *q, RMS *id) {
    RMS *key = job_key(q, id), *state = NULL, *nonce = NULL;
    RMK *h;
    int rc = -9;
    if (dk(q, key, 1, REDISMODULE_KEYTYPE_HASH, &h) < 0) goto out;
    if (RedisModule_KeyType(h) != REDISMODULE_KEYTYPE_EMPTY)
        RedisModule_HashGet(h, REDISMODULE_HASH_NONE, F_STATE, &state, F_NONCE, &nonce, NULL);
    if (!state) rc = 0;
    else if (eqc(state, "pending") || eqc(state, "delayed") || eqc(state, "waiting")) rc = -1;
    else if (!eqc(state, "active")) rc = -2;
    if (rc != -9) goto out;
    RMS *n = nonce ? nonce : F_EMPTY;
    hset1(q, h, key, F_ABORT, n);
    size_t il, nl;
    const char *ip = RedisModule_StringPtrLen(id, &il), *np = RedisModule_StringPtrLen(n, &nl);
    char *buf = RedisModule_Alloc(il + 1 + nl);
    memcpy(buf, ip, il);
    buf[il] = ' ';
    memcpy(buf + il + 1, np, nl);
    RMS *token = RedisModule_CreateString(q->ctx, buf, il + 1 + nl);
    RedisModule_Free(buf);
    RMS *wkey = book_key(q, "workers");
    RedisModuleCallReply *r = RedisModule_Call(q->ctx, "HKEYS", "s", wkey);
    sfree(q, wkey);
    if (!r || RedisModule_CallReplyType(r) != REDISMODULE_REPLY_ARRAY) {
        if (r) RedisModule_FreeCallReply(r);
        sfree(q, token);
        fail(q, WRONGTYPE);
        goto out;
    }
    rc = 1;
    size_t count = RedisModule_CallReplyLength(r);
    for (size_t i = 0; i < count && rc == 1; i++) {
        RMS *wid = RedisModule_CreateStringFromCallReply(RedisModule_CallReplyArrayElement(r, i));
        RMS *lk = mkname(q, "aborts:", wid, "");
        RMK *l;
        if (dk(q, lk, 1, REDISMODULE_KEYTYPE_LIST, &l) < 0) rc = -9;
        else if (vlen(l) < ABORT_CAP &&
                 (rpush(q, l, lk, token) < 0 ||
                  expire_at(q, l, lk, q->now + ABORT_TTL_MS) < 0))
            rc = -9;
        if (l) RedisModule_CloseKey(l);
        sfree(q, lk);
        sfree(q, wid);
    }
    RedisModule_FreeCallReply(r);
    sfree(q, token);
out:
    if (h) RedisModule_CloseKey(h);
    sfree(q, key);
    sfree(q, state);
    sfree(q, nonce);
    return rc;
}

/* end: the fenced attempt ends `aborted`, as retry's dead path but not into `dead`. a: id,
 * attempts, nonce, error. 1 aborted, 0 stale, -1 error. */
static int abort_end(Q *q, RMS **a) {
    Row r;
    long long ttl;
    int f = fenced_end(q, a, &r, &ttl);
    if (f <= 0) return f;
    RMS *into[1] = {q->k[K_ACTIVE]};
    const int types[1] = {REDISMODULE_KEYTYPE_ZSET};
    int books = end_books(q, &r, a[0], into, types, 1);
    if (books < 0) return -1;
    zrem(q, fx(q, K_ACTIVE, 1), q->k[K_ACTIVE], a[0]);
    row_ended(q, &r, ttl, S_ABORTED, F_ERROR, a[3], NULL);
    int rc = books ? 0 : active_drop(q, r.group);
    if (rc == 0) rc = hist_failed(q, r.task, r.group, 1);
    if (rc == 0) rc = notify(q, a[0], r.waiters);
    if (rc == 0 && r.wf) rc = wf_fail(q, r.wf, a[0]);
    row_free(q, &r);
    return rc < 0 ? -1 : 1;
}

static int cmd_abort(RedisModuleCtx *ctx, RMS **argv, int argc) {
    if (argc < ARGV0 + 2) return RedisModule_WrongArity(ctx);
    Q q;
    int verdict = 0;
    RMS *mode = argv[ARGV0];
    if (eqc(mode, "ask")) {
        if (argc != ARGV0 + 2) return RedisModule_WrongArity(ctx);
        if (q_init(&q, ctx, argv, 0, 0) < 0) return finish(&q);
        verdict = abort_ask(&q, argv[ARGV0 + 1]);
    } else if (eqc(mode, "end")) {
        if (argc != ARGV0 + 5) return RedisModule_WrongArity(ctx);
        /* `active` checked in abort_end(), after the row, as abort.lua */
        if (q_init(&q, ctx, argv, B(K_GACTIVE), B(K_GLIMIT)) < 0) return finish(&q);
        verdict = abort_end(&q, argv + ARGV0 + 1);
    } else {
        if (q_init(&q, ctx, argv, 0, 0) < 0) return finish(&q);
        fail(&q, "ERR emq: abort mode must be ask or end");
    }
    if (!q.err) RedisModule_ReplyWithLongLong(ctx, verdict);
    return finish(&q);
}
