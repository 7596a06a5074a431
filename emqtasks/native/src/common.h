/* src/common.h: what every file of the module shares: the server API, the fixed keys,
 * the strings made at load, a call's state (Q), and the functions called from a file
 * included before the one that defines them. Included once, by emq.c, first. */
#ifndef EMQ_COMMON_H
#define EMQ_COMMON_H

#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "emq_api.h"

typedef RedisModuleString RMS;
typedef RedisModuleKey RMK;

#define WAKE_CAP 16
#define WAKE_TTL_MS 60000
#define ABORT_CAP 64
#define ABORT_TTL_MS 60000
#define NOTIFY_MAX 100
#define CLAIM_SKIP_MAX 64

enum {
    K_RING, K_ACTIVE, K_GACTIVE, K_GLIMIT, K_GWEIGHT, K_GTURN, K_GPAUSED, K_PAUSED,
    K_DELAYED, K_DEAD, K_WAKE, K_GUARD, NFIXED
};
static const char *FIXED[NFIXED] = {
    "ring", "active", "gactive", "glimit", "gweight", "gturn", "gpaused", "paused",
    "delayed", "dead", "wake", "guard",
};
/* The type each fixed key must have when it exists; EMPTY: any (never read as a value). */
static const int FIXED_TYPE[NFIXED] = {
    REDISMODULE_KEYTYPE_LIST, REDISMODULE_KEYTYPE_ZSET, REDISMODULE_KEYTYPE_HASH,
    REDISMODULE_KEYTYPE_HASH, REDISMODULE_KEYTYPE_HASH, REDISMODULE_KEYTYPE_HASH,
    REDISMODULE_KEYTYPE_SET, REDISMODULE_KEYTYPE_EMPTY, REDISMODULE_KEYTYPE_ZSET,
    REDISMODULE_KEYTYPE_ZSET, REDISMODULE_KEYTYPE_LIST, REDISMODULE_KEYTYPE_EMPTY,
};

static const char WRONGTYPE[] = "WRONGTYPE Operation against a key holding the wrong kind of value";

/* Strings made once at load: field names and constant values. */
static RMS *F_TASK, *F_PAYLOAD, *F_GROUP, *F_STATE, *F_ATTEMPTS, *F_MAX, *F_LEASE, *F_DELAY,
    *F_TTL, *F_CREATED, *F_NONCE, *F_STARTED, *F_FINISHED, *F_RESULT, *F_ERROR, *F_WAITERS,
    *F_FENCE, *F_PRIO, *F_VCHARGE, *F_WF, *F_NEXT, *F_SLOT, *F_NPEND, *F_IMM, *F_NSLOTS,
    *F_SHAPE, *F_SPLICE, *F_COMMA, *F_CD, *F_FAILED, *F_WAITING, *F_LERR, *F_EMPTY, *F_RAN,
    *F_UNRUN, *F_SEEN, *F_STALE_ACKS, *F_EXPIRES, *F_TLINK, *F_ABORT, *F_UNIQUE, *F_DFIRST,
    *F_TPARENT, *F_TLINKS;
static RMS *S_ACTIVE, *S_PENDING, *S_DELAYED, *S_DONE, *S_DEAD, *S_ZERO, *S_ONE, *S_D,
    *S_LEASE_EXPIRED, *S_XX, *S_MINUS1, *S_LEFT, *S_RIGHT, *S_WAITING, *S_CANCELLED,
    *S_FAILED, *S_UNRUN, *S_EXPIRED, *S_EXPIRED_WHY, *S_ABORTED, *S_REAP_ABORTED;

/* One command call: its context, the fixed keys and the handles open on them. */
typedef struct {
    RedisModuleCtx *ctx;
    RMS **k;               /* the 12 fixed key names */
    RMK *h[NFIXED];        /* open handle (NULL: not open, or opened READ and missing) */
    int mode[NFIXED];      /* 0 not open, READ, or READ|WRITE */
    char bad[NFIXED];      /* found of the wrong type */
    const char *base;
    size_t blen;
    long long now;
    const char *err;       /* the error reply, set by the first failure */
    int dread;             /* gdefaults read (once per call, as the scripts' DEFAULTS) */
    int tmode;             /* the fairness mode, read once per call: 0 unread, 1 turns, 2 time */
    RMS *dflt[6];          /* limit rate max_size weight history hgroups */
    int hstate;            /* history: 0 not read yet, 1 on (hkey, hh open), -1 off */
    RMS *hkey;             /* this minute's history hash, BASE.."h:"..minute */
    RMK *hh;
    long long httl;        /* its expiry, seconds */
    double hcap;           /* groups tracked a minute */
    RMS *hpend[2 * 32];    /* its writes not yet replicated: field, new value */
    int hn;
    long long hexp;        /* its expiry set in this call, not yet replicated (0: none) */
    int full;              /* enqueue on a full server: its first write is refused (OOM) */
    int books;             /* claim_books: 0 unchecked, 1 fine, -2 a key of the wrong type */
    char errbuf[320];      /* an error text of this call that names a key */
} Q;

/* Defined in a file included later: history.c (close_all flushes the history),
 * workflow.c (a burial fails the workflow). */
static void hist_flush(Q *q);
static int wf_fail(Q *q, RMS *wf, RMS *id);

#endif
