/* src/commands.c: what every command shares: its end (finish), the gates on its arguments.
 * Included once by emq.c (a unity build), after the files before it there; never alone. */

#define ARGV0 (1 + NFIXED)     /* argv index of ARGV[1] */

/* The end of every command: close the keys; answer the error if one was met. A command
 * replies itself only when q->err is unset, and nothing after its reply can set it. */
static int finish(Q *q) {
    close_all(q);
    if (q->err) return RedisModule_ReplyWithError(q->ctx, q->err);
    return REDISMODULE_OK;
}

static int paused(Q *q) {
    return RedisModule_KeyType(fx(q, K_PAUSED, 0)) != REDISMODULE_KEYTYPE_EMPTY;
}

/* The scripts' gate: 1-128 of [A-Za-z0-9_.:-]. */
static int id_ok(RMS *id) {
    size_t len;
    const char *p = RedisModule_StringPtrLen(id, &len);
    if (len < 1 || len > 128) return 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)p[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == ':' || c == '-'))
            return 0;
    }
    return 1;
}

static int count_arg(Q *q, RMS *s, long long *n, const char *what) {
    if (RedisModule_StringToLongLong(s, n) != REDISMODULE_OK || *n < 0) return fail(q, what);
    return 0;
}

static int need_group(Q *q, Row *r) {
    if (r->group) return 0;
    row_free(q, r);
    return fail(q, "ERR emq: an active row has no group");
}

/* The fence of an attempt that ends (ack, abort's end; a: id, attempts, nonce): fenced(),
 * then the row's group and its ttl (0 when absent) read before the first write; a ttl that
 * is not an integer, or whose expiry would overflow, is an error. 1 fenced (the row open in
 * *r), 0 stale, -1 error (the row freed). */
static int fenced_end(Q *q, RMS **a, Row *r, long long *ttl) {
    *ttl = 0;
    int f = fenced(q, a[0], a[1], a[2], r);
    if (f <= 0) return f;
    if (need_group(q, r) < 0) return -1;
    if ((r->ttl && integer(q, r->ttl, ttl, "ERR emq: a job row's ttl is not an integer") < 0) ||
        (*ttl > 0 && *ttl > (LLONG_MAX - q->now) / 1000 &&
         fail(q, "ERR invalid expire time") < 0)) {
        row_free(q, r);
        return -1;
    }
    return 1;
}

/* The row of an attempt that ended (ack: done, abort: aborted): with a ttl, its state, its
 * outcome (`field`: result or error) and when it finished are set, `drop` (if any) deleted,
 * and it expires ttl s from now; without one, it is deleted. */
static void row_ended(Q *q, Row *r, long long ttl, RMS *state, RMS *field, RMS *value,
                      RMS *drop) {
    if (ttl <= 0) {
        RedisModule_DeleteKey(r->h);
        RedisModule_Replicate(q->ctx, "DEL", "s", r->key);
        return;
    }
    RMS *now_s = RedisModule_CreateStringFromLongLong(q->ctx, q->now);
    RedisModule_HashSet(r->h, REDISMODULE_HASH_NONE, F_STATE, state, field, value, F_FINISHED,
                        now_s, NULL);
    RedisModule_Replicate(q->ctx, "HSET", "sssssss", r->key, F_STATE, state, field, value,
                          F_FINISHED, now_s);
    sfree(q, now_s);
    if (drop) hdel(q, r->h, r->key, drop);
    expire_at(q, r->h, r->key, q->now + ttl * 1000);
}

/* The books of an attempt that ends (ack, retry, abort's end), before its first write: the
 * group's books read (1: they cannot be read, and are left as they are: the job's outcome is
 * written all the same), the `n` queue-wide keys it leaves and goes into checked (types_fit),
 * and the time it ran settled (time-fair). 0 or 1 the books; -1 error (the row freed). */
static int end_books(Q *q, Row *r, RMS *id, RMS **into, const int *types, int n) {
    char why[320];
    int books = group_books(q, r->group, 1, 0, r->vcharge, why, sizeof why);
    if (n > 0 && books >= 0 && types_fit(q, into, types, n) == -2) {
        row_free(q, r);
        return fail(q, q->errbuf);
    }
    if (books < 0 ||
        (!books && time_settle(q, r->group, id, r->h, r->key, r->started, r->vcharge, 1) < 0)) {
        row_free(q, r);
        return -1;
    }
    return books;
}
