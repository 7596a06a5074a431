/* src/rows.c: what a verb cannot read of a job row (row_fault), and the burial in `dead` of a
 * row that cannot be read (twin of lua/lib/rows.lua bury).
 * Included once by emq.c (a unity build), after the files before it there; never alone. */

/* The fields a claim reads of a row, and the integer ones each verb of the job's life reads
 * (the scripts' ROW and ROW_INTS). */
enum { R_TASK, R_PAYLOAD, R_LEASE, R_STATE, R_ATTEMPTS, R_FENCE, R_GROUP, R_MAX, R_TTL,
       R_DELAY, R_CREATED, R_EXPIRES, NROW };
static const struct { int at; const char *name; int required; } ROW_INTS[] = {
    {R_ATTEMPTS, "attempts", 1}, {R_LEASE, "lease", 1}, {R_FENCE, "fence", 0},
    {R_MAX, "max", 1}, {R_TTL, "ttl", 0}, {R_DELAY, "delay", 0}, {R_CREATED, "created", 1},
    {R_EXPIRES, "expires", 0},
};

/* Why a row popped from g's lane cannot be leased, written into buf; 0 when it can. */
static int row_fault(RMS **row, RMS *g, char *buf, size_t size) {
    if (!row[R_GROUP]) return snprintf(buf, size, "no group"), 1;
    if (!eq(row[R_GROUP], g)) return snprintf(buf, size, "its group is not the lane it was in"), 1;
    for (size_t i = 0; i < sizeof ROW_INTS / sizeof ROW_INTS[0]; i++) {
        RMS *v = row[ROW_INTS[i].at];
        if (!v) {
            if (ROW_INTS[i].required) return snprintf(buf, size, "no %s", ROW_INTS[i].name), 1;
        } else if (!int_ok(v)) {
            return snprintf(buf, size, "%s is not an integer", ROW_INTS[i].name), 1;
        }
    }
    return 0;
}

/* bury (lua/lib/rows.lua): job id, popped from g's lane, goes to `dead` with the reason; a key
 * of another type than a hash (keytype its TYPE) is replaced by a dead row; a row without
 * a group gets g. job: the row's handle, open for writing (closed here). */
static int bury(Q *q, RMS *id, RMS *g, const char *reason, const char *keytype, RMK *job,
                RMS *jkey, const char *whole) {
    char text[400];
    RMS *group = NULL, *task = NULL, *waiters = NULL, *wf = NULL;
    int rc = zadd(q, fx(q, K_DEAD, 1), q->k[K_DEAD], (double)q->now, id, 0);
    if (rc < 0) {
        RedisModule_CloseKey(job);
        return -1;
    }
    if (keytype) {
        RedisModule_DeleteKey(job);
        RedisModule_Replicate(q->ctx, "DEL", "s", jkey);
        snprintf(text, sizeof text, "unreadable job row: the key holds a %s, not a hash", keytype);
    } else if (whole) {                          /* a job buried for its lane (group_books) */
        snprintf(text, sizeof text, "%s", whole);
    } else {
        snprintf(text, sizeof text, "unreadable job row: %s", reason);
    }
    RMS *err = mk_tmp(q, text), *now_s = RedisModule_CreateStringFromLongLong(q->ctx, q->now);
    RedisModule_HashSet(job, REDISMODULE_HASH_NONE, F_STATE, S_DEAD, F_ERROR, err, F_FINISHED,
                        now_s, NULL);
    RedisModule_Replicate(q->ctx, "HSET", "sssssss", jkey, F_STATE, S_DEAD, F_ERROR, err,
                          F_FINISHED, now_s);
    sfree(q, err);
    sfree(q, now_s);
    RedisModule_HashGet(job, REDISMODULE_HASH_NONE, F_GROUP, &group, F_TASK, &task, F_WAITERS,
                        &waiters, F_WF, &wf, NULL);
    if (!group && g) hset1(q, job, jkey, F_GROUP, g);
    RedisModule_CloseKey(job);
    rc = g ? hist_failed(q, task, g, 1) : 0;
    if (rc == 0) rc = notify(q, id, waiters);
    if (rc == 0 && wf) rc = wf_fail(q, wf, id);
    sfree(q, group); sfree(q, task); sfree(q, waiters); sfree(q, wf);
    return rc < 0 ? -1 : 0;
}

/* bury for the verbs past the claim (release, reap, promote): `dead` checked first as the
 * scripts' bury does (its ZADD), refused with q->err naming it; jt: the job key's type (not a
 * hash: replaced by a dead row); whole: the row's whole error text (group_books's reason).
 * job: open for writing, closed here. 0 buried, -1 error. */
static int bury_as(Q *q, RMS *id, RMS *g, const char *reason, const char *whole, RMK *job,
                   RMS *jkey, int jt) {
    const int type = REDISMODULE_KEYTYPE_ZSET;
    if (types_fit(q, &q->k[K_DEAD], &type, 1) == -2) {
        RedisModule_CloseKey(job);
        return fail(q, q->errbuf);
    }
    char t[64];
    if (jt != REDISMODULE_KEYTYPE_HASH) type_name(q, jkey, t, sizeof t);
    return bury(q, id, g, reason, jt != REDISMODULE_KEYTYPE_HASH ? t : NULL, job, jkey, whole);
}
