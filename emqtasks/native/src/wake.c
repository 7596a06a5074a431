/* src/wake.c: the readiness tokens, `delayed` and the get() waiters' tokens (twin of
 * lua/lib/wake.lua).
 * Included once by emq.c (a unity build), after the files before it there; never alone. */

/* A readiness token; 'd' tokens fill at most half the list, so a '1' always fits. */
static int wake(Q *q, int due) {
    size_t cap = due ? WAKE_CAP / 2 : WAKE_CAP;
    if (vlen(fx(q, K_WAKE, 0)) >= cap) return 0;
    RMK *w = fx(q, K_WAKE, 1);
    if (rpush(q, w, q->k[K_WAKE], due ? S_D : S_ONE) < 0) return -1;
    return expire_at(q, w, q->k[K_WAKE], q->now + WAKE_TTL_MS);
}

/* Schedule an id in `delayed`; if it is now the earliest entry, tell the parked masters. */
static int delay_push(Q *q, RMS *id, double due) {
    RMK *d = fx(q, K_DELAYED, 1);
    if (zadd(q, d, q->k[K_DELAYED], due, id, 0) < 0) return -1;
    double s;
    RMS *first = zfirst(d, &s);
    int is_first = first && eq(first, id);
    sfree(q, first);
    return is_first ? wake(q, 1) : 0;
}

/* A job reached an end: one token per client blocked in get() on it (at most 100). */
static int notify(Q *q, RMS *id, RMS *waiters) {
    long long n = waiters && int_ok(waiters) ? (long long)int_val(waiters) : 0;
    if (n > NOTIFY_MAX) n = NOTIFY_MAX;
    if (n <= 0) return 0;
    RMS *key = mkname(q, "done:", id, "");
    RMK *h;
    int rc = dk(q, key, 1, REDISMODULE_KEYTYPE_LIST, &h);
    for (long long i = 0; rc == 0 && i < n; i++) rc = rpush(q, h, key, S_ONE);
    if (rc == 0) rc = expire_at(q, h, key, q->now + 60000);
    RedisModule_CloseKey(h);
    sfree(q, key);
    return rc;
}
