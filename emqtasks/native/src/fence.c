/* src/fence.c: the fence: the row is active and the caller holds its attempts and nonce (twin
 * of lua/lib/fence.lua).
 * Included once by emq.c (a unity build), after the files before it there; never alone. */

/* The fence's view of a row. */
typedef struct {
    RMK *h;
    RMS *key, *state, *attempts, *nonce, *group, *max, *ttl, *waiters, *started, *vcharge;
    RMS *task;
    RMS *wf, *next, *slot;  /* a workflow step's (see workflows below); NULL for a plain job */
} Row;

static void row_free(Q *q, Row *r) {
    if (r->h) RedisModule_CloseKey(r->h);
    sfree(q, r->key);
    sfree(q, r->state);
    sfree(q, r->attempts);
    sfree(q, r->nonce);
    sfree(q, r->group);
    sfree(q, r->max);
    sfree(q, r->ttl);
    sfree(q, r->waiters);
    sfree(q, r->started);
    sfree(q, r->vcharge);
    sfree(q, r->task);
    sfree(q, r->wf);
    sfree(q, r->next);
    sfree(q, r->slot);
    memset(r, 0, sizeof *r);
}

/* The fence: the row is active and the caller holds the current attempts and nonce.
 * 1 fenced (the row open in *r, for writing unless read_only is 1; the rest of the row read
 * unless read_only), 0 stale, -1 error. The fence's three fields come first: a stale call
 * and a heartbeat (extend, read_only 2: it writes `ran`) read no more. */
static int fenced_as(Q *q, RMS *id, RMS *attempts, RMS *nonce, Row *r, int read_only) {
    memset(r, 0, sizeof *r);
    r->key = job_key(q, id);
    if (dk(q, r->key, read_only != 1, REDISMODULE_KEYTYPE_HASH, &r->h) < 0) {
        row_free(q, r);
        return -1;
    }
    if (RedisModule_KeyType(r->h) != REDISMODULE_KEYTYPE_EMPTY)
        RedisModule_HashGet(r->h, REDISMODULE_HASH_NONE, F_STATE, &r->state, F_ATTEMPTS,
                            &r->attempts, F_NONCE, &r->nonce, NULL);
    if (!r->state || !eqc(r->state, "active") || !r->attempts || !eq(r->attempts, attempts) ||
        !r->nonce || !eq(r->nonce, nonce)) {
        row_free(q, r);
        return 0;
    }
    if (!read_only)
        RedisModule_HashGet(r->h, REDISMODULE_HASH_NONE, F_GROUP, &r->group, F_MAX, &r->max,
                            F_TTL, &r->ttl, F_WAITERS, &r->waiters, F_STARTED, &r->started,
                            F_VCHARGE, &r->vcharge, F_WF, &r->wf, F_NEXT, &r->next, F_SLOT,
                            &r->slot, F_TASK, &r->task, NULL);
    return 1;
}

static int fenced(Q *q, RMS *id, RMS *attempts, RMS *nonce, Row *r) {
    return fenced_as(q, id, attempts, nonce, r, 0);
}
