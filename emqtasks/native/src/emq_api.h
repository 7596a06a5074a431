/* emq_api.h: our own declarations of the slice of the server module API that emq.c uses.
 *
 * The server hands a module its API as named function pointers: the first word of the
 * context passed to RedisModule_OnLoad is a lookup function, GetApi(name, &pointer), and a
 * module fills each pointer it needs by name before it calls anything else. This header
 * declares those pointers and the constants they take, written for this module from the
 * documented API (API version 1). Only functions that exist in Redis 6.2, 7.x and Valkey
 * (which still answers to the RedisModule_ names) are required; SetAbsExpire (6.2.2+) is
 * optional and looked up at load.
 *
 * Meant to be included by exactly one translation unit: the pointers are static.
 */
#ifndef EMQ_API_H
#define EMQ_API_H

#include <stddef.h>
#include <stdint.h>

#define REDISMODULE_OK 0
#define REDISMODULE_ERR 1
#define REDISMODULE_APIVER_1 1

#define REDISMODULE_READ (1 << 0)
#define REDISMODULE_WRITE (1 << 1)

#define REDISMODULE_LIST_HEAD 0
#define REDISMODULE_LIST_TAIL 1

#define REDISMODULE_KEYTYPE_EMPTY 0
#define REDISMODULE_KEYTYPE_STRING 1
#define REDISMODULE_KEYTYPE_LIST 2
#define REDISMODULE_KEYTYPE_HASH 3
#define REDISMODULE_KEYTYPE_SET 4
#define REDISMODULE_KEYTYPE_ZSET 5

#define REDISMODULE_REPLY_STRING 0
#define REDISMODULE_REPLY_INTEGER 2
#define REDISMODULE_REPLY_ARRAY 3
#define REDISMODULE_REPLY_NULL 4

#define REDISMODULE_ZADD_XX (1 << 0)
#define REDISMODULE_ZADD_ADDED (1 << 2)
#define REDISMODULE_ZADD_UPDATED (1 << 3)

#define REDISMODULE_HASH_NONE 0
#define REDISMODULE_HASH_EXISTS (1 << 3)
/* A HashSet value meaning "delete this field". */
#define REDISMODULE_HASH_DELETE ((RedisModuleString *)(long)1)
#define REDISMODULE_NO_EXPIRE -1
#define REDISMODULE_CTX_FLAGS_OOM (1 << 10)

typedef long long mstime_t;
typedef struct RedisModuleCtx RedisModuleCtx;
typedef struct RedisModuleKey RedisModuleKey;
typedef struct RedisModuleString RedisModuleString;
typedef struct RedisModuleCallReply RedisModuleCallReply;
typedef int (*RedisModuleCmdFunc)(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);

/* X(return type, name, parameter list): one line per API function we use. */
#define EMQ_API_REQUIRED(X) \
    X(int, CreateCommand, (RedisModuleCtx *ctx, const char *name, RedisModuleCmdFunc fn, \
                           const char *flags, int firstkey, int lastkey, int keystep)) \
    X(void, SetModuleAttribs, (RedisModuleCtx *ctx, const char *name, int ver, int apiver)) \
    X(int, IsModuleNameBusy, (const char *name)) \
    X(int, WrongArity, (RedisModuleCtx *ctx)) \
    X(int, ReplyWithLongLong, (RedisModuleCtx *ctx, long long ll)) \
    X(int, ReplyWithError, (RedisModuleCtx *ctx, const char *err)) \
    X(int, ReplyWithArray, (RedisModuleCtx *ctx, long len)) \
    X(int, ReplyWithString, (RedisModuleCtx *ctx, RedisModuleString *str)) \
    X(int, ReplyWithNull, (RedisModuleCtx *ctx)) \
    X(const char *, StringPtrLen, (const RedisModuleString *str, size_t *len)) \
    X(RedisModuleString *, CreateString, (RedisModuleCtx *ctx, const char *ptr, size_t len)) \
    X(RedisModuleString *, CreateStringFromLongLong, (RedisModuleCtx *ctx, long long ll)) \
    X(RedisModuleString *, CreateStringFromString, (RedisModuleCtx *ctx, const RedisModuleString *str)) \
    X(void, FreeString, (RedisModuleCtx *ctx, RedisModuleString *str)) \
    X(int, StringToLongLong, (const RedisModuleString *str, long long *ll)) \
    X(int, StringToDouble, (const RedisModuleString *str, double *d)) \
    X(void *, OpenKey, (RedisModuleCtx *ctx, RedisModuleString *keyname, int mode)) \
    X(void, CloseKey, (RedisModuleKey *key)) \
    X(int, KeyType, (RedisModuleKey *key)) \
    X(size_t, ValueLength, (RedisModuleKey *key)) \
    X(int, DeleteKey, (RedisModuleKey *key)) \
    X(int, StringSet, (RedisModuleKey *key, RedisModuleString *str)) \
    X(char *, StringDMA, (RedisModuleKey *key, size_t *len, int mode)) \
    X(int, SetExpire, (RedisModuleKey *key, mstime_t expire)) \
    X(mstime_t, GetExpire, (RedisModuleKey *key)) \
    X(int, ZsetAdd, (RedisModuleKey *key, double score, RedisModuleString *ele, int *flagsptr)) \
    X(int, ZsetRem, (RedisModuleKey *key, RedisModuleString *ele, int *deleted)) \
    X(int, ZsetScore, (RedisModuleKey *key, RedisModuleString *ele, double *score)) \
    X(int, ZsetFirstInScoreRange, (RedisModuleKey *key, double min, double max, int minex, \
                                   int maxex)) \
    X(RedisModuleString *, ZsetRangeCurrentElement, (RedisModuleKey *key, double *score)) \
    X(int, ZsetRangeNext, (RedisModuleKey *key)) \
    X(void, ZsetRangeStop, (RedisModuleKey *key)) \
    X(int, ZsetRangeEndReached, (RedisModuleKey *key)) \
    X(int, HashSet, (RedisModuleKey *key, int flags, ...)) \
    X(int, HashGet, (RedisModuleKey *key, int flags, ...)) \
    X(int, ListPush, (RedisModuleKey *key, int where, RedisModuleString *ele)) \
    X(RedisModuleString *, ListPop, (RedisModuleKey *key, int where)) \
    X(RedisModuleCallReply *, Call, (RedisModuleCtx *ctx, const char *cmd, const char *fmt, ...)) \
    X(int, CallReplyType, (RedisModuleCallReply *reply)) \
    X(long long, CallReplyInteger, (RedisModuleCallReply *reply)) \
    X(void, FreeCallReply, (RedisModuleCallReply *reply)) \
    X(RedisModuleString *, CreateStringFromCallReply, (RedisModuleCallReply *reply)) \
    X(size_t, CallReplyLength, (RedisModuleCallReply *reply)) \
    X(RedisModuleCallReply *, CallReplyArrayElement, (RedisModuleCallReply *reply, size_t idx)) \
    X(int, Replicate, (RedisModuleCtx *ctx, const char *cmd, const char *fmt, ...)) \
    X(long long, Milliseconds, (void)) \
    X(int, GetContextFlags, (RedisModuleCtx *ctx)) \
    X(void *, Alloc, (size_t bytes)) \
    X(void *, Realloc, (void *ptr, size_t bytes)) \
    X(void, Free, (void *ptr))

/* Present from Redis 6.2.2 on; NULL on older servers (then SetExpire is used). */
#define EMQ_API_OPTIONAL(X) \
    X(int, SetAbsExpire, (RedisModuleKey *key, mstime_t expire))

#define EMQ_DECLARE(ret, name, params) static ret(*RedisModule_##name) params;
EMQ_API_REQUIRED(EMQ_DECLARE)
EMQ_API_OPTIONAL(EMQ_DECLARE)
#undef EMQ_DECLARE

/* Fill every pointer from the lookup function the server put in the context; fails (so
 * the module refuses to load) when a required one is missing or the name is taken. */
static int EMQ_InitApi(RedisModuleCtx *ctx, const char *name, int ver, int apiver) {
    int (*getapi)(const char *, void *) =
        (int (*)(const char *, void *))(uintptr_t)((void **)ctx)[0];
#define EMQ_GET_REQUIRED(ret, fn, params) \
    if (getapi("RedisModule_" #fn, (void *)&RedisModule_##fn) != REDISMODULE_OK) \
        return REDISMODULE_ERR;
#define EMQ_GET_OPTIONAL(ret, fn, params) \
    if (getapi("RedisModule_" #fn, (void *)&RedisModule_##fn) != REDISMODULE_OK) \
        RedisModule_##fn = NULL;
    EMQ_API_REQUIRED(EMQ_GET_REQUIRED)
    EMQ_API_OPTIONAL(EMQ_GET_OPTIONAL)
#undef EMQ_GET_REQUIRED
#undef EMQ_GET_OPTIONAL
    if (RedisModule_IsModuleNameBusy(name)) return REDISMODULE_ERR;
    RedisModule_SetModuleAttribs(ctx, name, ver, apiver);
    return REDISMODULE_OK;
}

#endif
