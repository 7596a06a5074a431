/* src/jobrow.c: the one writer of a new job's row (new_job; twin of lua/lib/jobrow.lua).
 * Included once by emq.c (a unity build), after the files before it there; never alone. */

/* A job's arguments, f[J_*]: EMQ.ENQUEUE takes ten per job (emqtasks/store/protocol.py
 * JOB_ARGS; the scripts' J_* in lua/lib/jobrow.lua). */
enum { J_ID, J_TASK, J_PAYLOAD, J_GROUP, J_MAX, J_LEASE, J_DELAY, J_TTL, J_COUNTDOWN,
       J_PRIORITY, NJOB };

/* new_job (lua/lib/jobrow.lua): the row of the job whose arguments are f, written on job
 * (open for writing and empty: the row's existence is the caller's check) at now_s, and the
 * job put where its state says: pending in its lane, or delayed for its countdown.
 *   prio     its priority (0: no `prio` field, the lane score is its time)
 *   cap      the lane cap it is held to (NULL: none): a job due now whose lane holds that
 *            many is refused before anything is written (*verdict 2)
 *   counted  1: the minute's history counts it as enqueued to its group
 *   expires  NULL, or the job's deadline (server ms, integer text): the row's `expires`, the
 *            one field of its own an EMQ.ENQUEUE job may carry (the scripts' `extra`)
 * The scripts' `ready` is not here: only EMQ.ENQUEUE creates a job in the module (schedule's
 * fire and workflow, which pass it, have no twin), and its jobs are ready. *verdict 1 written, 2 refused; returns 0, or -1
 * (q->err: a full server refuses the first write, as it refuses a script's). */
static int new_job(Q *q, RMK *job, RMS *jk, RMS **f, RMS *now_s, double prio,
                   const double *cap, int counted, RMS *expires, long long *verdict) {
    RMS *id = f[J_ID], *g = f[J_GROUP], *lk = NULL;
    RMK *lane = NULL;
    double countdown;
    int rc = num(q, f[J_COUNTDOWN], &countdown, "ERR emq: countdown must be a number");
    if (rc == 0 && countdown <= 0) {
        lk = lane_key(q, g);
        rc = dk(q, lk, 1, REDISMODULE_KEYTYPE_ZSET, &lane);
    }
    if (rc == 0 && cap && (double)vlen(lane) >= *cap) {
        *verdict = 2;
    } else if (rc == 0 && q->full) {
        rc = fail(q, OOM_REFUSED);
    } else if (rc == 0) {
        RMS *state = countdown > 0 ? S_DELAYED : S_PENDING;
        RedisModule_HashSet(job, REDISMODULE_HASH_NONE, F_TASK, f[J_TASK], F_PAYLOAD,
                            f[J_PAYLOAD], F_GROUP, g, F_STATE, state, F_ATTEMPTS, S_ZERO,
                            F_MAX, f[J_MAX], F_LEASE, f[J_LEASE], F_DELAY, f[J_DELAY],
                            F_TTL, f[J_TTL], F_CREATED, now_s, NULL);
        RedisModule_Replicate(q->ctx, "HSET", "sssssssssssssssssssss", jk, F_TASK, f[J_TASK],
                              F_PAYLOAD, f[J_PAYLOAD], F_GROUP, g, F_STATE, state,
                              F_ATTEMPTS, S_ZERO, F_MAX, f[J_MAX], F_LEASE, f[J_LEASE],
                              F_DELAY, f[J_DELAY], F_TTL, f[J_TTL], F_CREATED, now_s);
        if (prio != 0) {
            char buf[40];
            RMS *p = mk_tmp(q, fmt_num(prio, buf));
            RedisModule_HashSet(job, REDISMODULE_HASH_NONE, F_PRIO, p, NULL);
            RedisModule_Replicate(q->ctx, "HSET", "sss", jk, F_PRIO, p);
            sfree(q, p);
        }
        if (expires) {
            RedisModule_HashSet(job, REDISMODULE_HASH_NONE, F_EXPIRES, expires, NULL);
            RedisModule_Replicate(q->ctx, "HSET", "sss", jk, F_EXPIRES, expires);
        }
        rc = countdown > 0 ? delay_push(q, id, (double)q->now + countdown)
                           : lane_push_into(q, lane, lk, g, id,
                                            prio * PRIO_SPAN + (double)q->now);
        if (rc == 0 && counted) rc = hist_enqueued(q, g);
        *verdict = 1;
    }
    if (lane) RedisModule_CloseKey(lane);
    sfree(q, lk);
    return rc;
}
