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
