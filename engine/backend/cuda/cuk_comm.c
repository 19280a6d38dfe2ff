/*
 * cuk_comm.c — NCCL collectives for the CUDA backend (see cuk.h). libnccl.so.2 is opened with
 * dlopen on the first communicator, so the binary starts (and trains on one GPU) where NCCL is
 * not installed; only nccl.h's types are used at build time.
 *
 * A communicator is created non-blocking (ncclConfig_t.blocking = 0) and every wait on NCCL is
 * a polling loop over ncclCommGetAsyncError and the rendezvous's health (jdt_dist_check): a
 * dead peer then ends the wait with the rank named (the coordinator's heartbeat) and the
 * communicator aborted, instead of a hang inside NCCL. Collectives run on NCCL's stream (one
 * for every communicator of the process, so collectives of different communicators run in
 * issue order, the same on every rank: NCCL does not allow them to interleave differently on
 * different ranks); events order them after the compute stream's earlier work and the compute
 * stream's later work after them: at once for the blocking calls, or, for a started one
 * (jdt_cuk_coll_start / _wait, the backend's STEP_COLL_START / _WAIT), at its wait, so the
 * compute queued in between overlaps it. All-reduce (sum, mean, max), all-gather and
 * reduce-scatter (sum, mean) over f32 buffers.
 */
#include "backend/cuda/cuk-impl.h"
#include "comm/comm.h"

#include <dlfcn.h>
#include <stdlib.h>
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h> /* types and constants only: the functions are resolved with dlsym */
#pragma GCC diagnostic pop
#include <stdio.h>
#include <string.h>
#include <time.h>

#define NCCL_KV_TIMEOUT_S 600.0 /* waiting for the root's unique id */
#define NCCL_INIT_TIMEOUT_S 600.0
#define NCCL_FREE_TIMEOUT_S 60.0 /* a communicator's last collectives and finalize */

/* The NCCL entry points this file uses, resolved with dlsym. */
typedef struct {
    void *lib;
    __typeof__(ncclGetUniqueId) *get_unique_id;
    __typeof__(ncclCommInitRankConfig) *init_rank_config;
    __typeof__(ncclCommGetAsyncError) *get_async_error;
    __typeof__(ncclCommAbort) *abort;
    __typeof__(ncclCommFinalize) *finalize;
    __typeof__(ncclCommDestroy) *destroy;
    __typeof__(ncclAllReduce) *all_reduce;
    __typeof__(ncclAllGather) *all_gather;
    __typeof__(ncclReduceScatter) *reduce_scatter;
    __typeof__(ncclGetErrorString) *error_string;
    __typeof__(ncclGetLastError) *last_error;
} nccl_api;

struct jdt_cuk_comm {
    jdt_cuk *k;
    struct jdt_dist *d;
    nccl_api api;
    ncclComm_t comm;
    cudaStream_t stream;    /* k->comm_stream: NCCL's stream, shared by every communicator */
    cudaEvent_t ev_comm;    /* after the last collective queued: comm work done */
    jdt_cuk_coll *blocking; /* the events of the blocking calls (jdt_cuk_allreduce ...) */
    int n_ranks, index;
    bool failed;
    char key[128];
    jdt_cuk_comm *next; /* k->comms */
};

static jdt_status nccl_load(nccl_api *a, jdt_err *e)
{
    memset(a, 0, sizeof *a);
    /* JDT_NCCL_LIBRARY: another NCCL build (a path or a soname); the host CUDA emulator's
     * stand-in (tests/infra/cudaemu) is loaded this way */
    const char *lib = getenv("JDT_NCCL_LIBRARY");
    if (!lib || !*lib) lib = "libnccl.so.2";
    a->lib = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!a->lib)
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED,
                           "NCCL is needed for multi-GPU training but cannot be loaded: %s",
                           dlerror());
#define SYM(field, name)                                                                           \
    if (!(*(void **)&a->field = dlsym(a->lib, name))) {                                            \
        dlclose(a->lib);                                                                           \
        a->lib = NULL;                                                                             \
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "%s lacks %s (NCCL 2.14 or newer is needed)",   \
                           lib, name);                                                             \
    }
    SYM(get_unique_id, "ncclGetUniqueId")
    SYM(init_rank_config, "ncclCommInitRankConfig")
    SYM(get_async_error, "ncclCommGetAsyncError")
    SYM(abort, "ncclCommAbort")
    SYM(finalize, "ncclCommFinalize")
    SYM(destroy, "ncclCommDestroy")
    SYM(all_reduce, "ncclAllReduce")
    SYM(all_gather, "ncclAllGather")
    SYM(reduce_scatter, "ncclReduceScatter")
    SYM(error_string, "ncclGetErrorString")
    SYM(last_error, "ncclGetLastError")
#undef SYM
    return JDT_OK;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void nap(void)
{
    struct timespec ts = {0, 100000}; /* 100 us */
    nanosleep(&ts, NULL);
}

/* Aborts o (once) and marks it failed. */
static void abort_one(jdt_cuk_comm *o)
{
    if (o->comm && !o->failed) o->api.abort(o->comm);
    o->comm = NULL;
    o->failed = true;
}

/* c has failed (an NCCL error, a lost peer, a timeout): c and every other communicator of its
 * context are aborted. They share one stream, where a collective of another communicator may
 * be spinning on the same dead peer; ncclCommAbort ends its kernels, so the stream, and the
 * compute stream's waits on it, drain instead of hanging the process. The job ends anyway. */
static void comm_failed(jdt_cuk_comm *c)
{
    for (jdt_cuk_comm *o = c->k ? c->k->comms : NULL; o; o = o->next)
        abort_one(o);
    abort_one(c); /* one not listed yet: failing its initialisation */
}

static jdt_status nccl_fail(jdt_cuk_comm *c, ncclResult_t r, const char *what, jdt_err *e)
{
    const char *detail = c->comm && c->api.last_error ? c->api.last_error(c->comm) : "";
    jdt_status s =
        jdt_err_set(e, JDT_ERR_NET, "NCCL %s (communicator %s, rank index %d of %d): %s%s%s", what,
                    c->key, c->index, c->n_ranks, c->api.error_string(r),
                    detail && *detail ? ": " : "", detail ? detail : "");
    comm_failed(c);
    return s;
}

jdt_status jdt_cuk_comm_poll(jdt_cuk_comm *c, jdt_err *e)
{
    if (c->failed || !c->comm)
        return jdt_err_set(e, JDT_ERR_NET, "NCCL communicator %s has failed earlier", c->key);
    ncclResult_t r = ncclSuccess;
    ncclResult_t q = c->api.get_async_error(c->comm, &r);
    if (q != ncclSuccess) return nccl_fail(c, q, "ncclCommGetAsyncError", e);
    if (r != ncclSuccess && r != ncclInProgress) return nccl_fail(c, r, "asynchronous error", e);
    if (c->d) {
        jdt_status s = jdt_dist_check(c->d, e);
        if (s != JDT_OK) {
            comm_failed(c);
            return jdt_err_prefix(e, "NCCL communicator %s aborted", c->key);
        }
    }
    return JDT_OK;
}

/* Polls until the communicator leaves ncclInProgress (non-blocking init or enqueue). */
static jdt_status wait_ready(jdt_cuk_comm *c, double timeout_s, const char *what, jdt_err *e)
{
    double t0 = now_s();
    for (;;) {
        ncclResult_t r = ncclSuccess;
        ncclResult_t q = c->api.get_async_error(c->comm, &r);
        if (q != ncclSuccess) return nccl_fail(c, q, what, e);
        if (r == ncclSuccess) return JDT_OK;
        if (r != ncclInProgress) return nccl_fail(c, r, what, e);
        jdt_status s = c->d ? jdt_dist_check(c->d, e) : JDT_OK;
        if (s != JDT_OK) {
            comm_failed(c);
            return jdt_err_prefix(e, "NCCL %s (communicator %s)", what, c->key);
        }
        if (now_s() - t0 > timeout_s) {
            comm_failed(c);
            return jdt_err_set(e, JDT_ERR_TIMEOUT,
                               "NCCL %s (communicator %s): no progress in %.0f s", what, c->key,
                               timeout_s);
        }
        nap();
    }
}

jdt_status jdt_cuk_comm_init(jdt_cuk *k, struct jdt_dist *d, const int *ranks, int n_ranks,
                             const char *key, jdt_cuk_comm **out, jdt_err *e)
{
    *out = NULL;
    int me = jdt_dist_rank(d), index = -1;
    for (int i = 0; i < n_ranks; i++)
        if (ranks[i] == me) index = i;
    if (n_ranks < 1 || index < 0)
        return jdt_err_set(e, JDT_ERR_INVALID, "NCCL communicator %s: rank %d is not a member", key,
                           me);
    jdt_cuk_comm *c = jdt_calloc(1, sizeof *c);
    if (!c) return jdt_err_set(e, JDT_ERR_NOMEM, "NCCL communicator");
    c->k = k;
    c->d = d;
    c->n_ranks = n_ranks;
    c->index = index;
    snprintf(c->key, sizeof c->key, "%s", key);
    jdt_status s = nccl_load(&c->api, e);
    if (s != JDT_OK) goto fail;
    cudaError_t rc = cudaSetDevice(k->device);
    if (rc == cudaSuccess && !k->comm_stream)
        rc = cudaStreamCreateWithFlags(&k->comm_stream, cudaStreamNonBlocking);
    c->stream = k->comm_stream;
    if (rc == cudaSuccess) rc = cudaEventCreateWithFlags(&c->ev_comm, cudaEventDisableTiming);
    if (rc != cudaSuccess) {
        s = jdt_cuk_cuda_err(e, rc, "NCCL communicator stream");
        goto fail;
    }
    if ((s = jdt_cuk_coll_new(k, &c->blocking, e)) != JDT_OK) goto fail;
    /* the unique id: made by the first listed rank, passed through the rendezvous KV store */
    char kv_key[256];
    snprintf(kv_key, sizeof kv_key, "cuk/nccl/%s", key);
    ncclUniqueId id;
    if (index == 0) {
        ncclResult_t r = c->api.get_unique_id(&id);
        if (r != ncclSuccess) {
            s = nccl_fail(c, r, "ncclGetUniqueId", e);
            goto fail;
        }
        if ((s = jdt_dist_kv_set(d, kv_key, &id, sizeof id, e)) != JDT_OK) goto fail;
    } else {
        void *val = NULL;
        size_t n = 0;
        if ((s = jdt_dist_kv_get(d, kv_key, NCCL_KV_TIMEOUT_S, &val, &n, e)) != JDT_OK) {
            jdt_err_prefix(e, "NCCL communicator %s: waiting for rank %d's unique id", key,
                           ranks[0]);
            goto fail;
        }
        if (n != sizeof id) {
            jdt_free(val);
            s = jdt_err_set(e, JDT_ERR_PROTOCOL, "NCCL communicator %s: unique id of %zu bytes",
                            key, n);
            goto fail;
        }
        memcpy(&id, val, sizeof id);
        jdt_free(val);
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.commName = c->key;
    ncclResult_t r = c->api.init_rank_config(&c->comm, n_ranks, id, index, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        s = nccl_fail(c, r, "ncclCommInitRankConfig", e);
        goto fail;
    }
    if ((s = wait_ready(c, NCCL_INIT_TIMEOUT_S, "communicator init", e)) != JDT_OK) goto fail;
    c->next = k->comms;
    k->comms = c;
    *out = c;
    return JDT_OK;
fail:
    jdt_cuk_comm_free(c);
    return s;
}

void jdt_cuk_comm_free(jdt_cuk_comm *c)
{
    if (!c) return;
    for (jdt_cuk_comm **p = c->k ? &c->k->comms : NULL; p && *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    if (c->comm) {
        bool clean = false;
        jdt_err e;
        /* its collectives finish first: done already (the usual end), or polled (a lost peer
         * aborts, never a blind sync) */
        if (!c->failed && c->stream &&
            (cudaEventQuery(c->ev_comm) == cudaSuccess ||
             jdt_cuk_comm_sync(c, NCCL_FREE_TIMEOUT_S, &e) == JDT_OK)) {
            ncclResult_t r = c->api.finalize(c->comm);
            if (r == ncclSuccess || r == ncclInProgress)
                clean = wait_ready(c, NCCL_FREE_TIMEOUT_S, "finalize", &e) == JDT_OK;
        }
        if (c->comm) {
            if (clean)
                c->api.destroy(c->comm);
            else
                c->api.abort(c->comm);
        }
    }
    jdt_cuk_coll_free(c->blocking);
    if (c->ev_comm) cudaEventDestroy(c->ev_comm);
    /* the NCCL library stays loaded (no dlclose): after an abort its work may still be queued
     * on the stream, and unloading the code under it crashes (seen on the emulator, whose
     * collectives run when the stream reaches them) */
    jdt_free(c);
}

/* ---- started collectives -------------------------------------------------------------------- */

struct jdt_cuk_coll {
    jdt_cuk *k;
    cudaEvent_t ready;  /* compute stream, at start: the packed buffers are written */
    cudaEvent_t begin;  /* communicator stream, once it passed `ready` (timed) */
    cudaEvent_t done;   /* communicator stream, after the NCCL call (timed) */
    cudaEvent_t w0, w1; /* compute stream, around its wait for `done` (timed) */
    bool started;       /* started and not yet waited */
    bool timed;         /* waited; its times not yet counted (jdt_cuk_coll_times) */
};

jdt_status jdt_cuk_coll_new(jdt_cuk *k, jdt_cuk_coll **out, jdt_err *e)
{
    *out = NULL;
    jdt_cuk_coll *t = jdt_calloc(1, sizeof *t);
    if (!t) return jdt_err_set(e, JDT_ERR_NOMEM, "NCCL: collective events");
    t->k = k;
    cudaError_t rc = cudaEventCreateWithFlags(&t->ready, cudaEventDisableTiming);
    if (rc == cudaSuccess) rc = cudaEventCreate(&t->begin);
    if (rc == cudaSuccess) rc = cudaEventCreate(&t->done);
    if (rc == cudaSuccess) rc = cudaEventCreate(&t->w0);
    if (rc == cudaSuccess) rc = cudaEventCreate(&t->w1);
    if (rc != cudaSuccess) {
        jdt_cuk_coll_free(t);
        return jdt_cuk_cuda_err(e, rc, "NCCL: creating a collective's events");
    }
    *out = t;
    return JDT_OK;
}

void jdt_cuk_coll_free(jdt_cuk_coll *t)
{
    if (!t) return;
    cudaEvent_t ev[] = {t->ready, t->begin, t->done, t->w0, t->w1};
    for (size_t i = 0; i < sizeof ev / sizeof ev[0]; i++)
        if (ev[i]) cudaEventDestroy(ev[i]);
    jdt_free(t);
}

static const char *const COLL_NAME[] = {"all-reduce", "all-gather", "reduce-scatter",
                                        "all-gather (bf16)"};

jdt_status jdt_cuk_coll_start(jdt_cuk_comm *c, jdt_cuk_coll *t, jdt_cuk_coll_kind kind,
                              jdt_cuk_redop op, const void *send, void *recv, int64_t n, jdt_err *e)
{
    const char *what = COLL_NAME[kind];
    if (t->started)
        return jdt_err_set(e, JDT_ERR_INTERNAL, "NCCL %s started twice without a wait", what);
    if (c->failed || !c->comm)
        return jdt_err_set(e, JDT_ERR_NET, "NCCL communicator %s has failed earlier", c->key);
    if (op == JDT_CUK_MAX && kind != JDT_CUK_ALLREDUCE)
        return jdt_err_set(e, JDT_ERR_INTERNAL, "NCCL %s with max", what);
    const ncclRedOp_t rop = op == JDT_CUK_AVG ? ncclAvg : op == JDT_CUK_MAX ? ncclMax : ncclSum;
    t->timed = false; /* uncounted times of the previous pair are dropped */
    cudaError_t rc = cudaEventRecord(t->ready, c->k->stream);
    if (rc == cudaSuccess) rc = cudaStreamWaitEvent(c->stream, t->ready, 0);
    if (rc == cudaSuccess) rc = cudaEventRecord(t->begin, c->stream);
    if (rc != cudaSuccess) return jdt_cuk_cuda_err(e, rc, "NCCL: ordering after compute");
    if (n > 0) {
        ncclResult_t r = ncclSuccess;
        switch (kind) {
        case JDT_CUK_ALLREDUCE:
            r = c->api.all_reduce(send, recv, (size_t)n, ncclFloat32, rop, c->comm, c->stream);
            break;
        case JDT_CUK_ALLGATHER:
            r = c->api.all_gather(send, recv, (size_t)n, ncclFloat32, c->comm, c->stream);
            break;
        case JDT_CUK_ALLGATHER_BF16: /* a byte copy: FSDP's bf16 weight copies, half the bytes */
            r = c->api.all_gather(send, recv, (size_t)n, ncclBfloat16, c->comm, c->stream);
            break;
        case JDT_CUK_REDUCE_SCATTER:
            r = c->api.reduce_scatter(send, recv, (size_t)n, ncclFloat32, rop, c->comm, c->stream);
            break;
        }
        if (r == ncclInProgress) { /* non-blocking communicator: the enqueue completes later */
            char enq[64];
            snprintf(enq, sizeof enq, "%s enqueue", what);
            jdt_status s = wait_ready(c, NCCL_INIT_TIMEOUT_S, enq, e);
            if (s != JDT_OK) return s;
        } else if (r != ncclSuccess) {
            return nccl_fail(c, r, what, e);
        }
    }
    rc = cudaEventRecord(t->done, c->stream);
    if (rc == cudaSuccess) rc = cudaEventRecord(c->ev_comm, c->stream);
    if (rc != cudaSuccess) return jdt_cuk_cuda_err(e, rc, "NCCL: recording a collective's end");
    jdt_status s = jdt_cuk_comm_poll(c, e);
    t->started = s == JDT_OK; /* else the communicator is aborted: nothing left to wait for */
    return s;
}

jdt_status jdt_cuk_coll_wait(jdt_cuk_comm *c, jdt_cuk_coll *t, jdt_err *e)
{
    if (!t->started)
        return jdt_err_set(e, JDT_ERR_INTERNAL, "NCCL: a collective waited without a start");
    t->started = false;
    cudaError_t rc = cudaEventRecord(t->w0, c->k->stream);
    if (rc == cudaSuccess) rc = cudaStreamWaitEvent(c->k->stream, t->done, 0);
    if (rc == cudaSuccess) rc = cudaEventRecord(t->w1, c->k->stream);
    if (rc != cudaSuccess) return jdt_cuk_cuda_err(e, rc, "NCCL: ordering compute after it");
    t->timed = true;
    return jdt_cuk_comm_poll(c, e);
}

bool jdt_cuk_coll_times(jdt_cuk_coll *t, double *waited_s, double *moving_s)
{
    /* w1 follows the compute stream's wait for `done`, which follows `begin` */
    if (!t || !t->timed || cudaEventQuery(t->w1) != cudaSuccess) return false;
    float moving_ms = 0.0f, waited_ms = 0.0f;
    if (cudaEventElapsedTime(&moving_ms, t->begin, t->done) != cudaSuccess ||
        cudaEventElapsedTime(&waited_ms, t->w0, t->w1) != cudaSuccess)
        return false;
    t->timed = false;
    *moving_s += 1e-3 * (double)moving_ms;
    *waited_s += 1e-3 * (double)waited_ms;
    return true;
}

/* The blocking calls: a start and its wait at once, on the communicator's own events. */
static jdt_status coll(jdt_cuk_comm *c, jdt_cuk_coll_kind kind, const float *send, float *recv,
                       int64_t n, jdt_cuk_redop op, jdt_err *e)
{
    jdt_status s = jdt_cuk_coll_start(c, c->blocking, kind, op, send, recv, n, e);
    return s != JDT_OK ? s : jdt_cuk_coll_wait(c, c->blocking, e);
}

jdt_status jdt_cuk_allreduce(jdt_cuk_comm *c, float *buf, int64_t n, bool average, jdt_err *e)
{
    return coll(c, JDT_CUK_ALLREDUCE, buf, buf, n, average ? JDT_CUK_AVG : JDT_CUK_SUM, e);
}

jdt_status jdt_cuk_allreduce_max(jdt_cuk_comm *c, float *buf, int64_t n, jdt_err *e)
{
    return coll(c, JDT_CUK_ALLREDUCE, buf, buf, n, JDT_CUK_MAX, e);
}

jdt_status jdt_cuk_allgather(jdt_cuk_comm *c, const float *send, float *recv, int64_t n_per_rank,
                             jdt_err *e)
{
    return coll(c, JDT_CUK_ALLGATHER, send, recv, n_per_rank, JDT_CUK_SUM, e);
}

jdt_status jdt_cuk_reduce_scatter(jdt_cuk_comm *c, const float *send, float *recv,
                                  int64_t n_per_rank, bool average, jdt_err *e)
{
    return coll(c, JDT_CUK_REDUCE_SCATTER, send, recv, n_per_rank,
                average ? JDT_CUK_AVG : JDT_CUK_SUM, e);
}

int jdt_cuk_comm_index(const jdt_cuk_comm *c)
{
    return c->index;
}

int jdt_cuk_comm_size(const jdt_cuk_comm *c)
{
    return c->n_ranks;
}

jdt_status jdt_cuk_comm_sync(jdt_cuk_comm *c, double timeout_s, jdt_err *e)
{
    double t0 = now_s();
    for (;;) {
        cudaError_t rc = cudaEventQuery(c->ev_comm);
        if (rc == cudaSuccess) return jdt_cuk_comm_poll(c, e);
        if (rc != cudaErrorNotReady) return jdt_cuk_cuda_err(e, rc, "NCCL stream");
        jdt_status s = jdt_cuk_comm_poll(c, e);
        if (s != JDT_OK) return s;
        if (now_s() - t0 > timeout_s) {
            comm_failed(c);
            return jdt_err_set(e, JDT_ERR_TIMEOUT,
                               "NCCL communicator %s: collectives unfinished after %.0f s (a peer "
                               "stalled?)",
                               c->key, timeout_s);
        }
        nap();
    }
}
