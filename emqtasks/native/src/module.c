/* src/module.c: RedisModule_OnLoad: the API, the strings made once, the commands.
 * Included once by emq.c (a unity build), after the files before it there; never alone. */

static RMS *mk(RedisModuleCtx *ctx, const char *s) {
    return RedisModule_CreateString(ctx, s, strlen(s));
}

__attribute__((visibility("default"))) int RedisModule_OnLoad(RedisModuleCtx *ctx, RMS **argv,
                                                          int argc) {
    (void)argv;
    (void)argc;
    if (EMQ_InitApi(ctx, "emq", 1, REDISMODULE_APIVER_1) != REDISMODULE_OK)
        return REDISMODULE_ERR;
    F_TASK = mk(ctx, "task"); F_PAYLOAD = mk(ctx, "payload"); F_GROUP = mk(ctx, "group");
    F_STATE = mk(ctx, "state"); F_ATTEMPTS = mk(ctx, "attempts"); F_MAX = mk(ctx, "max");
    F_LEASE = mk(ctx, "lease"); F_DELAY = mk(ctx, "delay"); F_TTL = mk(ctx, "ttl");
    F_CREATED = mk(ctx, "created"); F_NONCE = mk(ctx, "nonce"); F_STARTED = mk(ctx, "started");
    F_FINISHED = mk(ctx, "finished"); F_RESULT = mk(ctx, "result"); F_ERROR = mk(ctx, "error");
    F_TLINK = mk(ctx, "tlink"); F_TPARENT = mk(ctx, "tparent"); F_TLINKS = mk(ctx, "tlinks");
    F_WAITERS = mk(ctx, "waiters"); F_FENCE = mk(ctx, "fence"); F_PRIO = mk(ctx, "prio");
    F_VCHARGE = mk(ctx, "vcharge"); F_EMPTY = mk(ctx, "");
    S_ACTIVE = mk(ctx, "active"); S_PENDING = mk(ctx, "pending"); S_DELAYED = mk(ctx, "delayed");
    S_DONE = mk(ctx, "done"); S_DEAD = mk(ctx, "dead"); S_ZERO = mk(ctx, "0");
    S_ONE = mk(ctx, "1"); S_D = mk(ctx, "d"); S_LEASE_EXPIRED = mk(ctx, "lease expired");
    S_XX = mk(ctx, "XX"); S_MINUS1 = mk(ctx, "-1"); S_LEFT = mk(ctx, "LEFT");
    S_RIGHT = mk(ctx, "RIGHT"); S_WAITING = mk(ctx, "waiting");
    S_CANCELLED = mk(ctx, "cancelled"); S_FAILED = mk(ctx, "failed");
    F_WF = mk(ctx, "wf"); F_NEXT = mk(ctx, "next"); F_SLOT = mk(ctx, "slot");
    F_NPEND = mk(ctx, "npend"); F_IMM = mk(ctx, "imm"); F_NSLOTS = mk(ctx, "nslots");
    F_SHAPE = mk(ctx, "shape");
    F_SPLICE = mk(ctx, "splice"); F_COMMA = mk(ctx, "comma"); F_CD = mk(ctx, "cd");
    F_FAILED = mk(ctx, "failed"); F_WAITING = mk(ctx, "waiting"); F_LERR = mk(ctx, "lerr");
    F_RAN = mk(ctx, "ran"); F_UNRUN = mk(ctx, "unrun"); F_SEEN = mk(ctx, "seen");
    F_STALE_ACKS = mk(ctx, "stale_acks"); F_EXPIRES = mk(ctx, "expires");
    S_EXPIRED = mk(ctx, "expired");
    F_ABORT = mk(ctx, "abort"); F_UNIQUE = mk(ctx, "unique"); F_DFIRST = mk(ctx, "dfirst"); S_ABORTED = mk(ctx, "aborted");
    S_EXPIRED_WHY = mk(ctx, "expired: not started before its expiry");
    S_UNRUN = mk(ctx, "lease expired before the job was seen running (attempt not counted)");
    S_REAP_ABORTED = mk(ctx, "Aborted: asked, and its lease expired");   /* reap.lua ABORTED */
    static const struct { const char *name; RedisModuleCmdFunc fn; } cmds[] = {
        {"emq.enqueue", cmd_enqueue}, {"emq.claim", cmd_claim}, {"emq.ack", cmd_ack},
        {"emq.retry", cmd_retry}, {"emq.extend", cmd_extend}, {"emq.release", cmd_release},
        {"emq.reap", cmd_reap}, {"emq.promote", cmd_promote}, {"emq.abort", cmd_abort},
    };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        /* Keys 1..12 so that Cluster routes the call and refuses it while the slot moves
         * (the guard key is never written, as with the scripts). */
        if (RedisModule_CreateCommand(ctx, cmds[i].name, cmds[i].fn, "write", 1,
                                      NFIXED, 1) != REDISMODULE_OK)
            return REDISMODULE_ERR;
    return REDISMODULE_OK;
}
