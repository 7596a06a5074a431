/* src/writes.c: writes, each replicated as the plain command (ZADD, HINCRBY, HSET, HDEL, RPUSH,
 * PEXPIREAT). No Lua twin: a script's redis.call replicates itself.
 * Included once by emq.c (a unity build), after the files before it there; never alone. */

static int zadd(Q *q, RMK *h, RMS *key, double score, RMS *member, int xx) {
    int flags = xx ? REDISMODULE_ZADD_XX : 0;
    char buf[40];
    if (!h) return -1;
    if (RedisModule_ZsetAdd(h, score, member, &flags) != REDISMODULE_OK)
        return fail(q, "ERR emq: ZADD failed");
    if (flags & (REDISMODULE_ZADD_ADDED | REDISMODULE_ZADD_UPDATED)) {
        /* An integral score goes as 'l': no formatting, and the same text. */
        int integral = score == floor(score) && fabs(score) < 9007199254740992.0;
        if (xx && integral)
            RedisModule_Replicate(q->ctx, "ZADD", "ssls", key, S_XX, (long long)score, member);
        else if (xx)
            RedisModule_Replicate(q->ctx, "ZADD", "sscs", key, S_XX, fmt_num(score, buf), member);
        else if (integral)
            RedisModule_Replicate(q->ctx, "ZADD", "sls", key, (long long)score, member);
        else
            RedisModule_Replicate(q->ctx, "ZADD", "scs", key, fmt_num(score, buf), member);
    }
    return 0;
}

static int zrem(Q *q, RMK *h, RMS *key, RMS *member) {
    int deleted = 0;
    if (!h) return -1;
    if (RedisModule_ZsetRem(h, member, &deleted) != REDISMODULE_OK)
        return fail(q, "ERR emq: ZREM failed");
    if (deleted) RedisModule_Replicate(q->ctx, "ZREM", "ss", key, member);
    return deleted;
}

/* A hash field as HINCRBY reads it: absent is 0, anything but an integer refuses. */
static int hint(Q *q, RMK *h, RMS *field, long long *v) {
    if (q->err) return -1;               /* the handle is NULL for a key of the wrong type */
    RMS *cur = hget(h, field);
    *v = 0;
    int ok = !cur || RedisModule_StringToLongLong(cur, v) == REDISMODULE_OK;
    sfree(q, cur);
    return ok ? 0 : fail(q, "ERR hash value is not an integer");
}

static int hincr_from(Q *q, RMK *h, RMS *key, RMS *field, long long v, long long by,
                      long long *out);

/* HINCRBY: the current value must be an integer, as the server's own command insists. */
static int hincrby(Q *q, RMK *h, RMS *key, RMS *field, long long by, long long *out) {
    long long v;
    if (!h || hint(q, h, field, &v) < 0) return -1;
    return hincr_from(q, h, key, field, v, by, out);
}

/* The write half of HINCRBY, from a current value already read with hint(). */
static int hincr_from(Q *q, RMK *h, RMS *key, RMS *field, long long v, long long by,
                      long long *out) {
    if ((by > 0 && v > LLONG_MAX - by) || (by < 0 && v < LLONG_MIN - by))
        return fail(q, "ERR increment or decrement would overflow");
    v += by;
    RMS *nv = RedisModule_CreateStringFromLongLong(q->ctx, v);
    RedisModule_HashSet(h, REDISMODULE_HASH_NONE, field, nv, NULL);
    sfree(q, nv);
    RedisModule_Replicate(q->ctx, "HINCRBY", "ssl", key, field, by);
    *out = v;
    return 0;
}

static void hset1(Q *q, RMK *h, RMS *key, RMS *field, RMS *val) {
    RedisModule_HashSet(h, REDISMODULE_HASH_NONE, field, val, NULL);
    RedisModule_Replicate(q->ctx, "HSET", "sss", key, field, val);
}

static int hdel(Q *q, RMK *h, RMS *key, RMS *field) {
    if (!h || !RedisModule_KeyType(h)) return 0;
    if (RedisModule_HashSet(h, REDISMODULE_HASH_NONE, field, REDISMODULE_HASH_DELETE, NULL) > 0) {
        RedisModule_Replicate(q->ctx, "HDEL", "ss", key, field);
        return 1;
    }
    return 0;
}

/* HDEL on fixed key i, opened for writing only when the field is there. */
static int hdel_fx(Q *q, int i, RMS *field) {
    RMK *h = fx(q, i, 0);
    int exists = 0;
    if (!h || !RedisModule_ValueLength(h)) return 0;
    RedisModule_HashGet(h, REDISMODULE_HASH_EXISTS, field, &exists, NULL);
    return exists ? hdel(q, fx(q, i, 1), q->k[i], field) : 0;
}

static int rpush(Q *q, RMK *h, RMS *key, RMS *val) {
    if (!h) return -1;
    if (RedisModule_ListPush(h, REDISMODULE_LIST_TAIL, val) != REDISMODULE_OK)
        return fail(q, "ERR emq: RPUSH failed");
    RedisModule_Replicate(q->ctx, "RPUSH", "ss", key, val);
    return 0;
}

/* EXPIRE key secs, at an absolute time so that the replica's deadline is the primary's. */
static int expire_at(Q *q, RMK *h, RMS *key, long long at_ms) {
    if (!h) return -1;
    int rc = RedisModule_SetAbsExpire ? RedisModule_SetAbsExpire(h, at_ms)
                                      : RedisModule_SetExpire(h, at_ms - q->now);
    if (rc != REDISMODULE_OK) return fail(q, "ERR emq: EXPIRE failed");
    RedisModule_Replicate(q->ctx, "PEXPIREAT", "sl", key, at_ms);
    return 0;
}
