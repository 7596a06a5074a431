/* src/workflow.c: workflow steps: release, chord results, handover, failure (twin of
 * lua/lib/workflow.lua).
 * Included once by emq.c (a unity build), after the files before it there; never alone. */

/* A step's row names its waiting children in `next` and, when they collect results, its
 * `slot` in them; a collecting child may have a `shape` (nested lists: wf_gather). The
 * ack releases them (wf_handover), a dead step fails its workflow (wf_fail).
 * Keys formed here: the child rows, BASE.."chord:"..callback_id and BASE.."wf:"..wf_id.
 * Tracing: the ack's span (tp, a traceparent, or NULL) goes on the step it releases
 * (`tparent`) or, a chord member before the last, on its callback's `tlinks` (wf_tlink). */

/* Bytes of `tlinks` past which a callback's row takes no more (the SDK keeps 128 links). */
#define TLINKS_BYTES 7168

static void del_key(Q *q, RMK *h, RMS *key) {
    if (!h || RedisModule_KeyType(h) == REDISMODULE_KEYTYPE_EMPTY) return;
    RedisModule_DeleteKey(h);
    RedisModule_Replicate(q->ctx, "DEL", "s", key);
}

/* A waiting step goes to its lane (or `delayed` for a countdown), with arg (JSON text of
 * alen bytes, or NULL) spliced in as its first argument; tp (or NULL): the span of the run
 * that released it, kept as `tparent`. */
static int wf_release(Q *q, RMS *id, const char *arg, size_t alen, RMS *tp) {
    RMS *jk = job_key(q, id), *g = NULL, *prio = NULL, *splice = NULL, *comma = NULL;
    RMS *cd_s = NULL, *payload = NULL;
    RMK *h;
    int rc = dk(q, jk, 1, REDISMODULE_KEYTYPE_HASH, &h);
    if (rc == 0 && RedisModule_KeyType(h) != REDISMODULE_KEYTYPE_EMPTY)
        RedisModule_HashGet(h, REDISMODULE_HASH_NONE, F_GROUP, &g, F_PRIO, &prio, F_SPLICE,
                            &splice, F_COMMA, &comma, F_CD, &cd_s, F_PAYLOAD, &payload, NULL);
    if (rc == 0 && tp) hset1(q, h, jk, F_TPARENT, tp);
    if (rc == 0 && arg) {
        double off_d;
        if (!splice || !payload)
            rc = fail(q, "ERR emq: a waiting step has no splice or payload");
        else if (num(q, splice, &off_d, "ERR emq: a waiting step's splice is not a number") < 0)
            rc = -1;
        else {
            size_t pl;
            const char *pp = RedisModule_StringPtrLen(payload, &pl);
            size_t off = off_d <= 0 ? 0 : off_d >= (double)pl ? pl : (size_t)off_d;
            size_t sep = comma && eqc(comma, "1") ? 1 : 0, total = pl + alen + sep;
            char *buf = RedisModule_Alloc(total ? total : 1);
            memcpy(buf, pp, off);
            memcpy(buf + off, arg, alen);
            if (sep) buf[off + alen] = ',';
            memcpy(buf + off + alen + sep, pp + off, pl - off);
            RMS *np = RedisModule_CreateString(q->ctx, buf, total);
            RedisModule_Free(buf);
            hset1(q, h, jk, F_PAYLOAD, np);
            sfree(q, np);
        }
    }
    double cd = 0;
    if (cd_s && (RedisModule_StringToDouble(cd_s, &cd) != REDISMODULE_OK || !isfinite(cd))) cd = 0;
    if (rc == 0 && cd > 0) {
        hset1(q, h, jk, F_STATE, S_DELAYED);
        rc = delay_push(q, id, (double)q->now + cd);
    } else if (rc == 0 && !g) {
        rc = fail(q, "ERR emq: a waiting step has no group");
    } else if (rc == 0) {
        hset1(q, h, jk, F_STATE, S_PENDING);
        rc = lane_push(q, g, id, lane_score(prio, (double)q->now));
    }
    if (h) RedisModule_CloseKey(h);
    sfree(q, jk); sfree(q, g); sfree(q, prio); sfree(q, splice); sfree(q, comma);
    sfree(q, cd_s); sfree(q, payload);
    return rc;
}

/* Append n bytes at p to the growing buffer *buf (len used of cap). */
static void buf_put(char **buf, size_t *len, size_t *cap, const char *p, size_t n) {
    if (*len + n > *cap) {
        while (*len + n > *cap) *cap *= 2;
        *buf = RedisModule_Realloc(*buf, *cap);
    }
    memcpy(*buf + *len, p, n);
    *len += n;
}

/* Append slot i's result of a chord's results hash (null when missing or past its n). */
static void put_slot(Q *q, RMK *rh, long long i, long long n, char **buf, size_t *len,
                     size_t *cap) {
    RMS *f = i < n ? RedisModule_CreateStringFromLongLong(q->ctx, i) : NULL;
    RMS *v = f ? hget(rh, f) : NULL;
    size_t vl = 4;
    const char *vp = v ? RedisModule_StringPtrLen(v, &vl) : "null";
    buf_put(buf, len, cap, vp, vl);
    sfree(q, f);
    sfree(q, v);
}

/* The collected results of a chord, in slot order: one JSON array, or shape (the value's
 * JSON with a '#' for each slot) with each '#' replaced by the next slot's result. */
static RMS *wf_gather(Q *q, RMK *rh, long long n, RMS *shape) {
    size_t cap = 256, len = 0;
    char *buf = RedisModule_Alloc(cap);
    if (shape) {
        size_t sl;
        const char *sp = RedisModule_StringPtrLen(shape, &sl);
        long long i = 0;
        for (size_t k = 0; k < sl; k++) {
            if (sp[k] == '#') put_slot(q, rh, i++, n, &buf, &len, &cap);
            else buf_put(&buf, &len, &cap, sp + k, 1);
        }
    } else {
        buf_put(&buf, &len, &cap, "[", 1);
        for (long long i = 0; i < n; i++) {
            if (i) buf_put(&buf, &len, &cap, ",", 1);
            put_slot(q, rh, i, n, &buf, &len, &cap);
        }
        buf_put(&buf, &len, &cap, "]", 1);
    }
    RMS *out = RedisModule_CreateString(q->ctx, buf, len);
    RedisModule_Free(buf);
    return out;
}

/* A chord member's span tp on its callback's row (h, key ck), for the callback's span to
 * link to: appended to `tlinks` (space-separated) while it is under TLINKS_BYTES. */
static void wf_tlink(Q *q, RMK *h, RMS *ck, RMS *tp) {
    RMS *have = hget(h, F_TLINKS);
    size_t hl = 0, tl;
    const char *hp = have ? RedisModule_StringPtrLen(have, &hl) : NULL;
    const char *tpp = RedisModule_StringPtrLen(tp, &tl);
    if (!have) {
        hset1(q, h, ck, F_TLINKS, tp);
    } else if (hl < TLINKS_BYTES) {
        char *buf = RedisModule_Alloc(hl + 1 + tl);
        memcpy(buf, hp, hl);
        buf[hl] = ' ';
        memcpy(buf + hl + 1, tpp, tl);
        RMS *v = RedisModule_CreateString(q->ctx, buf, hl + 1 + tl);
        RedisModule_Free(buf);
        hset1(q, h, ck, F_TLINKS, v);
        sfree(q, v);
    }
    sfree(q, have);
}

/* One child c of a finished step: released if it waits for this step alone, else (a
 * chord's callback) the result goes in its slot, once, and the last one releases it (the
 * ones before keep their span tp on it, wf_tlink). */
static int wf_child(Q *q, RMS *c, RMS *slot, RMS *result, RMS *tp) {
    RMS *ck = job_key(q, c), *state = NULL, *npend = NULL, *imm = NULL, *nslots = NULL;
    RMS *shape = NULL;
    RMK *h;
    int rc = dk(q, ck, 1, REDISMODULE_KEYTYPE_HASH, &h);
    if (rc == 0 && RedisModule_KeyType(h) != REDISMODULE_KEYTYPE_EMPTY)
        RedisModule_HashGet(h, REDISMODULE_HASH_NONE, F_STATE, &state, F_NPEND, &npend, F_IMM,
                            &imm, F_NSLOTS, &nslots, F_SHAPE, &shape, NULL);
    if (rc == 0 && state && eq(state, S_WAITING)) {
        size_t rl;
        const char *rp = RedisModule_StringPtrLen(result, &rl);
        int mutable = !(imm && eqc(imm, "1"));
        if (!npend) {
            RedisModule_CloseKey(h);
            h = NULL;
            rc = wf_release(q, c, mutable ? rp : NULL, rl, tp);
        } else if (slot) {
            RMS *rk = mkname(q, "chord:", c, "");
            RMK *rh;
            int exists = 0;
            rc = dk(q, rk, 1, REDISMODULE_KEYTYPE_HASH, &rh);
            if (rc == 0 && RedisModule_KeyType(rh) != REDISMODULE_KEYTYPE_EMPTY)
                RedisModule_HashGet(rh, REDISMODULE_HASH_EXISTS, slot, &exists, NULL);
            long long left = 1;
            if (rc == 0 && !exists) {
                hset1(q, rh, rk, slot, result);
                rc = hincrby(q, h, ck, F_NPEND, -1, &left);
                if (rc == 0 && left > 0 && tp) wf_tlink(q, h, ck, tp);
            }
            if (rc == 0 && !exists && left <= 0) {
                RMS *list = NULL;
                double n = 0;
                if (mutable) {
                    if (!nslots) rc = fail(q, "ERR emq: a chord's callback has no nslots");
                    else if (num(q, nslots, &n, "ERR emq: nslots is not a number") == 0)
                        list = wf_gather(q, rh, to_ll(ceil(n)), shape);
                    else rc = -1;
                }
                if (rc == 0) del_key(q, rh, rk);
                if (rh) RedisModule_CloseKey(rh);
                rh = NULL;
                RedisModule_CloseKey(h);
                h = NULL;
                if (rc == 0) {
                    size_t ll = 0;
                    const char *lp = list ? RedisModule_StringPtrLen(list, &ll) : NULL;
                    rc = wf_release(q, c, lp, ll, tp);
                }
                sfree(q, list);
            }
            if (rh) RedisModule_CloseKey(rh);
            sfree(q, rk);
        }
    }
    if (h) RedisModule_CloseKey(h);
    sfree(q, ck); sfree(q, state); sfree(q, npend); sfree(q, imm); sfree(q, nslots);
    sfree(q, shape);
    return rc;
}

/* The next id of a space-separated list (Lua's %S+) from *i, or NULL at its end. */
static RMS *next_word(Q *q, const char *p, size_t len, size_t *i) {
    while (*i < len && isspace((unsigned char)p[*i])) (*i)++;
    size_t st = *i;
    while (*i < len && !isspace((unsigned char)p[*i])) (*i)++;
    return *i > st ? RedisModule_CreateString(q->ctx, p + st, *i - st) : NULL;
}

/* A step finished with `result` (its run's span tp, or NULL): each waiting child it names
 * is released (a chord's callback once its last member is in), in the same call as the
 * ack. */
static int wf_handover(Q *q, RMS *next, RMS *slot, RMS *result, RMS *tp) {
    size_t len, i = 0;
    const char *p = RedisModule_StringPtrLen(next, &len);
    RMS *c;
    int rc = 0;
    while (rc == 0 && (c = next_word(q, p, len, &i)) != NULL) {
        rc = wf_child(q, c, slot, result, tp);
        sfree(q, c);
    }
    return rc;
}

/* A waiting step of a failed workflow is cancelled (its chord results dropped). */
static int wf_cancel_waiting(Q *q, RMS *c, RMS *msg) {
    RMS *ck = job_key(q, c), *state = NULL, *waiters = NULL, *ttl_s = NULL;
    RMK *h;
    int rc = dk(q, ck, 1, REDISMODULE_KEYTYPE_HASH, &h);
    if (rc == 0 && RedisModule_KeyType(h) != REDISMODULE_KEYTYPE_EMPTY)
        RedisModule_HashGet(h, REDISMODULE_HASH_NONE, F_STATE, &state, F_WAITERS, &waiters,
                            F_TTL, &ttl_s, NULL);
    if (rc == 0 && state && eq(state, S_WAITING)) {
        RMS *now_s = RedisModule_CreateStringFromLongLong(q->ctx, q->now);
        RedisModule_HashSet(h, REDISMODULE_HASH_NONE, F_STATE, S_CANCELLED, F_ERROR, msg,
                            F_FINISHED, now_s, NULL);
        RedisModule_Replicate(q->ctx, "HSET", "sssssss", ck, F_STATE, S_CANCELLED, F_ERROR, msg,
                              F_FINISHED, now_s);
        sfree(q, now_s);
        RMS *rk = mkname(q, "chord:", c, "");
        RMK *rh;
        rc = dk(q, rk, 1, REDISMODULE_KEYTYPE_HASH, &rh);
        if (rc == 0) del_key(q, rh, rk);
        if (rh) RedisModule_CloseKey(rh);
        sfree(q, rk);
        if (rc == 0) rc = notify(q, c, waiters);
        double ttl = 0;
        if (ttl_s && (RedisModule_StringToDouble(ttl_s, &ttl) != REDISMODULE_OK || !isfinite(ttl)))
            ttl = 0;
        if (rc == 0 && ttl > 0) rc = expire_at(q, h, ck, q->now + to_ll(ttl) * 1000);
        else if (rc == 0) del_key(q, h, ck);
    }
    if (h) RedisModule_CloseKey(h);
    sfree(q, ck); sfree(q, state); sfree(q, waiters); sfree(q, ttl_s);
    return rc;
}

/* Step id of workflow wf went dead: the first such call fails the workflow, cancels every
 * step still waiting and releases the link_error step, once. */
static int wf_fail(Q *q, RMS *wf, RMS *id) {
    RMS *wk = mkname(q, "wf:", wf, ""), *waiting = NULL, *lerr = NULL;
    RMK *h;
    int exists = 0, rc = dk(q, wk, 1, REDISMODULE_KEYTYPE_HASH, &h);
    if (rc == 0 && RedisModule_KeyType(h) != REDISMODULE_KEYTYPE_EMPTY)
        RedisModule_HashGet(h, REDISMODULE_HASH_EXISTS, F_FAILED, &exists, NULL);
    if (rc == 0 && !exists) {
        hset1(q, h, wk, F_FAILED, id);
        hset1(q, h, wk, F_STATE, S_FAILED);
        RedisModule_HashGet(h, REDISMODULE_HASH_NONE, F_WAITING, &waiting, F_LERR, &lerr, NULL);
    }
    if (h) RedisModule_CloseKey(h);
    sfree(q, wk);
    if (rc == 0 && !exists && waiting) {
        size_t idl, len, i = 0;
        const char *ip = RedisModule_StringPtrLen(id, &idl);
        const char *p = RedisModule_StringPtrLen(waiting, &len);
        const char *pre = "workflow failed at step ";
        size_t prl = strlen(pre);
        char *m = RedisModule_Alloc(prl + idl);
        memcpy(m, pre, prl);
        memcpy(m + prl, ip, idl);
        RMS *msg = RedisModule_CreateString(q->ctx, m, prl + idl), *c;
        RedisModule_Free(m);
        while (rc == 0 && (c = next_word(q, p, len, &i)) != NULL) {
            rc = wf_cancel_waiting(q, c, msg);
            sfree(q, c);
        }
        sfree(q, msg);
    }
    if (rc == 0 && lerr) {
        RMS *lk = job_key(q, lerr), *state = NULL, *imm = NULL;
        RMK *lh;
        rc = dk(q, lk, 0, REDISMODULE_KEYTYPE_HASH, &lh);
        if (rc == 0 && lh)
            RedisModule_HashGet(lh, REDISMODULE_HASH_NONE, F_STATE, &state, F_IMM, &imm, NULL);
        if (lh) RedisModule_CloseKey(lh);
        if (rc == 0 && state && eq(state, S_WAITING)) {
            size_t idl;
            const char *ip = RedisModule_StringPtrLen(id, &idl);
            char *arg = RedisModule_Alloc(idl + 2);
            arg[0] = '"';
            memcpy(arg + 1, ip, idl);
            arg[idl + 1] = '"';
            rc = wf_release(q, lerr, imm && eqc(imm, "1") ? NULL : arg, idl + 2, NULL);
            RedisModule_Free(arg);
            /* released: it lives as a job now, no longer with its workflow's hash */
            if (rc == 0 && dk(q, lk, 1, REDISMODULE_KEYTYPE_HASH, &lh) == 0 && lh &&
                RedisModule_KeyType(lh) != REDISMODULE_KEYTYPE_EMPTY &&
                RedisModule_GetExpire(lh) != REDISMODULE_NO_EXPIRE) {
                RedisModule_SetExpire(lh, REDISMODULE_NO_EXPIRE);
                RedisModule_Replicate(q->ctx, "PERSIST", "s", lk);
            }
            if (lh) RedisModule_CloseKey(lh);
            if (q->err) rc = -1;
        }
        sfree(q, lk); sfree(q, state); sfree(q, imm);
    }
    sfree(q, waiting);
    sfree(q, lerr);
    return rc;
}
