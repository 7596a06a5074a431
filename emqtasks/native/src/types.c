/* src/types.c: keys of the wrong type, named as the scripts' TYPE names them (twin of
 * lua/lib/types.lua).
 * Included once by emq.c (a unity build), after the files before it there; never alone. */

/* Whether key is missing or of the type; a read that fails nothing. */
static int key_fits(Q *q, RMS *key, int type) {
    RMK *h = RedisModule_OpenKey(q->ctx, key, REDISMODULE_READ);
    int ok = type_ok(h, type);
    if (h) RedisModule_CloseKey(h);
    return ok;
}

/* The key's TYPE, as the scripts name it (a module type by its own name). */
static void type_name(Q *q, RMS *key, char *out, size_t size) {
    RedisModuleCallReply *r = RedisModule_Call(q->ctx, "TYPE", "s", key);
    RMS *t = r && RedisModule_CallReplyType(r) == REDISMODULE_REPLY_STRING
                 ? RedisModule_CreateStringFromCallReply(r) : NULL;
    size_t len = 0;
    const char *p = t ? RedisModule_StringPtrLen(t, &len) : "";
    snprintf(out, size, "%.*s", (int)len, p);
    sfree(q, t);
    if (r) RedisModule_FreeCallReply(r);
}

static const char *const TYPE_NAMES[6] = {"", "string", "list", "hash", "set", "zset"};

/* The first of n keys (NULL ones skipped) that is neither missing nor of its type: -2 with
 * q->errbuf naming it as the scripts do ("WRONGTYPE emq: <key> holds a <t>, not a <want>";
 * q->err is left to the caller), else 1. */
static int types_fit(Q *q, RMS **keys, const int *types, int n) {
    for (int i = 0; i < n; i++) {
        if (!keys[i] || key_fits(q, keys[i], types[i])) continue;
        size_t kl;
        const char *kp = RedisModule_StringPtrLen(keys[i], &kl);
        char t[64];
        type_name(q, keys[i], t, sizeof t);
        snprintf(q->errbuf, sizeof q->errbuf, "WRONGTYPE emq: %.*s holds a %s, not a %s",
                 (int)kl, kp, t, TYPE_NAMES[types[i]]);
        return -2;
    }
    return 1;
}
