/*
 * ncclemu.c — a host stand-in for NCCL (the calls engine/backend/cuda/cuk_comm.c makes) for the
 * host CUDA emulator (cudaemu.c): the processes of a job on one machine, whose "device" memory
 * is host memory, exchange it through one POSIX shared-memory segment per communicator. The
 * emulator's runtime points JDT_NCCL_LIBRARY at this library, which cuk_comm.c dlopens in place
 * of libnccl.so.2. A test fixture, not a product.
 *
 * A collective runs when its stream reaches it: queued by the emulated runtime (cudaemu.c
 * jdt_cudaemu_defer) until the program waits for it, or at once without that runtime or with
 * JDT_CUDAEMU_DEFER=0. Each rank copies
 * its data into its slot of the segment, a barrier, each rank combines the slots in rank order
 * (the same bits on every rank), a barrier. Messages larger than a slot go in chunks. The
 * barrier spins with sched_yield; while it waits it checks that every peer's process is alive
 * and gives up after JDT_NCCLEMU_TIMEOUT_S (default 120) seconds: the communicator then holds
 * ncclRemoteError (a peer died) or ncclSystemError (timeout), returned by the call and by
 * ncclCommGetAsyncError, as NCCL reports a dead peer.
 */
#define _GNU_SOURCE
#include <nccl.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_RANKS 64
#define SLOT_BYTES ((size_t)16 << 20) /* per rank; tmpfs pages appear only when touched */
#define ID_MAGIC "jdt-ncclemu:"

typedef struct {
    _Atomic unsigned arrived, gen;
    _Atomic int joined;
    _Atomic int pids[MAX_RANKS];
} shm_head;

struct ncclComm {
    char name[64];
    int n, rank;
    shm_head *h;
    char *slots;
    size_t map_bytes;
    ncclResult_t async; /* the first failure: every later call returns it */
    char why[256];
    int refs;   /* deferred collectives still queued on a stream, each holding the comm */
    bool freed; /* destroyed or aborted: released when the last of them has run */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess:
        return "no error";
    case ncclSystemError:
        return "unhandled system error (ncclemu: timeout)";
    case ncclRemoteError:
        return "remote process exited or there was a network error";
    case ncclInvalidArgument:
        return "invalid argument";
    case ncclInProgress:
        return "NCCL operation in progress";
    default:
        return "ncclemu error";
    }
}

const char *ncclGetLastError(ncclComm_t c)
{
    return c ? c->why : "";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    unsigned char r[12];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) return ncclSystemError;
    memset(id, 0, sizeof *id);
    int o = snprintf(id->internal, sizeof id->internal, "%s", ID_MAGIC);
    for (size_t i = 0; i < sizeof r; i++)
        o += snprintf(id->internal + o, sizeof id->internal - (size_t)o, "%02x", r[i]);
    return ncclSuccess;
}

static ncclResult_t fail(ncclComm_t c, ncclResult_t r, const char *fmt, int arg)
{
    if (c->async == ncclSuccess) {
        c->async = r;
        snprintf(c->why, sizeof c->why, fmt, arg);
    }
    return c->async;
}

/* Waits until every rank has arrived. A dead peer or the timeout fails the communicator. */
static ncclResult_t barrier(ncclComm_t c)
{
    if (c->async != ncclSuccess) return c->async;
    shm_head *h = c->h;
    unsigned g = atomic_load(&h->gen);
    if (atomic_fetch_add(&h->arrived, 1) + 1 == (unsigned)c->n) {
        atomic_store(&h->arrived, 0);
        atomic_fetch_add(&h->gen, 1);
        return ncclSuccess;
    }
    const char *t = getenv("JDT_NCCLEMU_TIMEOUT_S");
    double limit = t && *t ? atof(t) : 120.0, t0 = now_s(), next_check = t0 + 0.05;
    while (atomic_load(&h->gen) == g) {
        sched_yield();
        double now = now_s();
        if (now < next_check) continue;
        next_check = now + 0.05;
        for (int r = 0; r < c->n; r++) {
            int pid = atomic_load(&h->pids[r]);
            if (r != c->rank && pid > 0 && kill(pid, 0) != 0 && errno == ESRCH)
                return fail(c, ncclRemoteError, "ncclemu: rank %d's process has exited", r);
        }
        if (now - t0 > limit)
            return fail(c, ncclSystemError, "ncclemu: peers did not arrive within %d s",
                        (int)limit);
    }
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int n, ncclUniqueId id, int rank,
                                    ncclConfig_t *cfg)
{
    *out = NULL;
    if (n < 1 || n > MAX_RANKS || rank < 0 || rank >= n ||
        strncmp(id.internal, ID_MAGIC, strlen(ID_MAGIC)) != 0)
        return ncclInvalidArgument;
    ncclComm_t c = calloc(1, sizeof *c);
    if (!c) return ncclSystemError;
    snprintf(c->name, sizeof c->name, "/%.40s-%d", id.internal, n);
    for (char *p = c->name + 1; *p; p++)
        if (*p == ':') *p = '-';
    c->n = n;
    c->rank = rank;
    c->map_bytes = 4096 + (size_t)n * SLOT_BYTES;
    int fd = shm_open(c->name, O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)c->map_bytes) != 0) {
        if (fd >= 0) close(fd);
        free(c);
        return ncclSystemError;
    }
    void *m = mmap(NULL, c->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        free(c);
        return ncclSystemError;
    }
    c->h = m;
    c->slots = (char *)m + 4096;
    atomic_store(&c->h->pids[rank], (int)getpid());
    atomic_fetch_add(&c->h->joined, 1);
    ncclResult_t r = barrier(c);                            /* everyone has mapped the segment */
    if (r == ncclSuccess && rank == 0) shm_unlink(c->name); /* gone with the last mapping */
    *out = c;
    return r;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *r)
{
    *r = c->async;
    return ncclSuccess;
}

static void release(ncclComm_t c)
{
    if (!c) return;
    if (c->refs > 0) { /* queued collectives still name it: the last one releases it */
        c->freed = true;
        if (c->async == ncclSuccess) c->async = ncclInvalidUsage;
        return;
    }
    munmap(c->h, c->map_bytes);
    free(c);
}

ncclResult_t ncclCommFinalize(ncclComm_t c)
{
    return c->async;
}
ncclResult_t ncclCommDestroy(ncclComm_t c)
{
    release(c);
    return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t c)
{
    release(c);
    return ncclSuccess;
}

static size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclFloat32:
        return 4;
    case ncclBfloat16:
        return 2;
    default:
        return 0;
    }
}

static float load(const char *p, ncclDataType_t t, size_t i)
{
    float f;
    if (t == ncclFloat32) {
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    uint32_t u = (uint32_t)h << 16;
    memcpy(&f, &u, 4);
    return f;
}

static void store(char *p, ncclDataType_t t, size_t i, float v)
{
    if (t == ncclFloat32) {
        memcpy(p + 4 * i, &v, 4);
        return;
    }
    uint32_t u;
    memcpy(&u, &v, 4);
    u += 0x7fffu + ((u >> 16) & 1u); /* nearest even (no NaN inputs here) */
    uint16_t h = (uint16_t)(u >> 16);
    memcpy(p + 2 * i, &h, 2);
}

/* This rank's chunk into its slot, then the barrier after which every slot is readable. */
static ncclResult_t post(ncclComm_t c, const void *src, size_t bytes)
{
    memcpy(c->slots + (size_t)c->rank * SLOT_BYTES, src, bytes);
    return barrier(c);
}

/* dst[i] = op over ranks r of slot r at element off + i (rank order: the same on every rank). */
static void combine(ncclComm_t c, char *dst, size_t off, size_t cnt, ncclDataType_t t,
                    ncclRedOp_t op)
{
    for (size_t i = 0; i < cnt; i++) {
        float a = load(c->slots, t, off + i);
        for (int r = 1; r < c->n; r++) {
            float b = load(c->slots + (size_t)r * SLOT_BYTES, t, off + i);
            a = op == ncclMax ? (b > a ? b : a) : a + b;
        }
        if (op == ncclAvg) a /= (float)c->n;
        store(dst, t, i, a);
    }
}

static ncclResult_t run_all_reduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                                   ncclRedOp_t op, ncclComm_t c)
{
    if (getenv("JDT_CUDAEMU_TRACE"))
        fprintf(stderr, "ncclemu trace: all_reduce %p -> %p count %zu op %d\n", send, recv, count,
                (int)op);
    size_t es = type_size(t);
    if (!es || (op != ncclSum && op != ncclMax && op != ncclAvg)) return ncclInvalidArgument;
    if (c->async != ncclSuccess) return c->async;
    size_t chunk = SLOT_BYTES / es;
    for (size_t o = 0; o < count || (o == 0 && count == 0); o += chunk) {
        size_t n = count - o < chunk ? count - o : chunk;
        ncclResult_t r = post(c, (const char *)send + o * es, n * es);
        if (r == ncclSuccess) combine(c, (char *)recv + o * es, 0, n, t, op);
        if (r == ncclSuccess) r = barrier(c);
        if (r != ncclSuccess) return r;
        if (count == 0) break;
    }
    return ncclSuccess;
}

static ncclResult_t run_all_gather(const void *send, void *recv, size_t count, ncclDataType_t t,
                                   ncclRedOp_t op, ncclComm_t c)
{
    (void)op;
    if (getenv("JDT_CUDAEMU_TRACE"))
        fprintf(stderr, "ncclemu trace: all_gather %p -> %p count %zu\n", send, recv, count);
    size_t es = type_size(t);
    if (!es) return ncclInvalidArgument;
    if (c->async != ncclSuccess) return c->async;
    size_t chunk = SLOT_BYTES / es;
    for (size_t o = 0; o < count || (o == 0 && count == 0); o += chunk) {
        size_t n = count - o < chunk ? count - o : chunk;
        ncclResult_t r = post(c, (const char *)send + o * es, n * es);
        for (int q = 0; r == ncclSuccess && q < c->n; q++)
            memcpy((char *)recv + ((size_t)q * count + o) * es, c->slots + (size_t)q * SLOT_BYTES,
                   n * es);
        if (r == ncclSuccess) r = barrier(c);
        if (r != ncclSuccess) return r;
        if (count == 0) break;
    }
    return ncclSuccess;
}

static ncclResult_t run_reduce_scatter(const void *send, void *recv, size_t count, ncclDataType_t t,
                                       ncclRedOp_t op, ncclComm_t c)
{
    if (getenv("JDT_CUDAEMU_TRACE"))
        fprintf(stderr, "ncclemu trace: reduce_scatter %p -> %p count %zu op %d\n", send, recv,
                count, (int)op);
    size_t es = type_size(t);
    if (!es || (op != ncclSum && op != ncclMax && op != ncclAvg)) return ncclInvalidArgument;
    if (c->async != ncclSuccess) return c->async;
    size_t chunk = SLOT_BYTES / es / (size_t)c->n; /* a chunk of every destination's part */
    for (size_t o = 0; o < count || (o == 0 && count == 0); o += chunk) {
        size_t n = count - o < chunk ? count - o : chunk;
        char *mine = c->slots + (size_t)c->rank * SLOT_BYTES;
        for (int q = 0; q < c->n; q++)
            memcpy(mine + (size_t)q * n * es, (const char *)send + ((size_t)q * count + o) * es,
                   n * es);
        ncclResult_t r = barrier(c);
        if (r == ncclSuccess) combine(c, (char *)recv + o * es, (size_t)c->rank * n, n, t, op);
        if (r == ncclSuccess) r = barrier(c);
        if (r != ncclSuccess) return r;
        if (count == 0) break;
    }
    return ncclSuccess;
}

/* ---- issue: now, or deferred on the stream (cudaemu.c jdt_cudaemu_defer) ------------------ */

typedef ncclResult_t (*coll_fn)(const void *send, void *recv, size_t count, ncclDataType_t t,
                                ncclRedOp_t op, ncclComm_t c);
typedef struct {
    coll_fn fn;
    const void *send;
    void *recv;
    size_t count;
    ncclDataType_t t;
    ncclRedOp_t op;
    ncclComm_t c;
    const char *name;
    void *snap; /* the send buffer when issued */
    size_t send_bytes;
} deferred;

/* A deferred collective's turn. Its send buffer must hold what it held when the collective
 * was issued: a change means the program wrote it while the collective was in flight (or
 * before its inputs were ready), a race on a GPU; that, and any failure, becomes the
 * communicator's asynchronous error, as NCCL reports a failure of work already enqueued. */
static void run_deferred(void *ctx)
{
    deferred *d = ctx;
    ncclComm_t c = d->c;
    if (c->async == ncclSuccess && d->snap && memcmp(d->snap, d->send, d->send_bytes) != 0) {
        fprintf(stderr,
                "ncclemu: rank %d: the send buffer of %s (%p, %zu bytes) changed between the "
                "call and its turn on the stream: a race with other work on a GPU\n",
                c->rank, d->name, d->send, d->send_bytes);
        fail(c, ncclInvalidUsage, "ncclemu: rank %d: a collective's send buffer changed in flight",
             c->rank);
    }
    if (c->async == ncclSuccess) {
        ncclResult_t r = d->fn(d->send, d->recv, d->count, d->t, d->op, c);
        if (r != ncclSuccess && c->async == ncclSuccess) c->async = r;
    }
    free(d->snap);
    free(d);
    if (--c->refs == 0 && c->freed) release(c);
}

static ncclResult_t issue(const char *name, coll_fn fn, const void *send, size_t send_count,
                          void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                          cudaStream_t s)
{
    if (c->async != ncclSuccess) return c->async;
    static int (*defer)(cudaStream_t, void (*)(void *), void *);
    static int (*ordered)(cudaStream_t, const char **);
    static bool looked;
    if (!looked) { /* the emulated runtime, when this process has it */
        *(void **)&defer = dlsym(RTLD_DEFAULT, "jdt_cudaemu_defer");
        *(void **)&ordered = dlsym(RTLD_DEFAULT, "jdt_cudaemu_ordered");
        looked = true;
    }
    const char *who = NULL, *off = getenv("JDT_CUDAEMU_DEFER");
    if (ordered && !(off && strcmp(off, "0") == 0) && !ordered(s, &who)) {
        fprintf(stderr,
                "ncclemu: rank %d: %s issued on a stream that has not waited for %s: on a GPU "
                "it may run before its inputs are written\n",
                c->rank, name, who);
        return fail(c, ncclInvalidUsage,
                    "ncclemu: rank %d: a collective not ordered after its "
                    "inputs",
                    c->rank);
    }
    deferred *d = defer ? malloc(sizeof *d) : NULL;
    if (d) {
        const size_t nb = send_count * type_size(t);
        *d = (deferred){fn, send, recv, count, t, op, c, name, malloc(nb ? nb : 1), nb};
        if (d->snap) memcpy(d->snap, send, nb);
        c->refs++;
        if (defer(s, run_deferred, d)) return ncclSuccess;
        c->refs--;
        free(d->snap);
        free(d);
    }
    return fn(send, recv, count, t, op, c);
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclRedOp_t op, ncclComm_t c, cudaStream_t s)
{
    if (!type_size(t) || (op != ncclSum && op != ncclMax && op != ncclAvg))
        return ncclInvalidArgument;
    return issue("all_reduce", run_all_reduce, send, count, recv, count, t, op, c, s);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclComm_t c, cudaStream_t s)
{
    if (!type_size(t)) return ncclInvalidArgument;
    return issue("all_gather", run_all_gather, send, count, recv, count, t, ncclSum, c, s);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t t,
                               ncclRedOp_t op, ncclComm_t c, cudaStream_t s)
{
    if (!type_size(t) || (op != ncclSum && op != ncclMax && op != ncclAvg))
        return ncclInvalidArgument;
    return issue("reduce_scatter", run_reduce_scatter, send, count * (size_t)c->n, recv, count, t,
                 op, c, s);
}
