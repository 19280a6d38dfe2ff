/*
 * shm.c — the shared-memory all-reduce for groups whose members all run on one host.
 *
 * Loopback TCP costs two kernel copies per byte plus protocol work (here about 1 GB/s one
 * way); a shared segment costs about 1.5 user-space copies per byte and no system calls on
 * the data path. Set-up is lazy, on a group's first all-reduce, over the group's TCP links:
 * members swap a host identity (kernel boot id + hostname); if all match, member 0 creates a
 * POSIX shared-memory segment, broadcasts its random name, everyone maps it and reports back,
 * then member 0 unlinks the name (nothing is left in /dev/shm once the group is set up).
 *
 * Algorithm, per chunk of the buffer (chunk = JDT_SHM_CHUNK bytes, split into k parts):
 *   1. member j copies the chunk, except its own part j, into its slot;
 *   2. member j reduces part j: its own data plus every other slot's part j, in place in its
 *      buffer, and publishes the result in the shared result area;
 *   3. member j copies every other part of the result into its buffer.
 * Reduce-scatter and all-gather use the same slots (see shm_segments below).
 * Per member counters (in, red, out) count chunks, monotone over the group's life, so no reset
 * between calls; slots and result areas are double-buffered by chunk parity, and a member
 * waits before reusing one until everyone is done with it. Waiting spins briefly, then sleeps
 * on a futex in 50 ms slices, checking the job's abort flag and the op deadline: a lost member
 * ends in ERR_PEER_LOST from the coordinator's broadcast, never a hang.
 */
#include "comm/comm-impl.h"

#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define JDT_SHM_CHUNK (1u << 19)
#define SHM_MAGIC 0x4d485344u /* "DSHM" */

typedef struct {
    _Atomic uint32_t in, red, out;
    uint8_t pad[64 - 3 * sizeof(uint32_t)];
} shm_ctr;

typedef struct {
    uint32_t magic, k, chunk;
    uint8_t pad[64 - 3 * sizeof(uint32_t)];
} shm_head;

struct jdt_shm {
    uint8_t *base;
    size_t bytes;
    int k, me;
    const int *ranks; /* (k) the group's ranks, for messages */
    uint32_t done; /* chunks processed on this group so far (same on every member) */
    shm_ctr *ctr;  /* (k) */
    uint8_t *slots; /* (2, k, chunk) */
    uint8_t *res;   /* (2, chunk) */
};

static size_t shm_size(int k)
{
    return sizeof(shm_head) + (size_t)k * sizeof(shm_ctr) + (size_t)(2 * k + 2) * JDT_SHM_CHUNK;
}

static void shm_layout(jdt_shm *s)
{
    s->ctr = (shm_ctr *)(s->base + sizeof(shm_head));
    s->slots = s->base + sizeof(shm_head) + (size_t)s->k * sizeof(shm_ctr);
    s->res = s->slots + (size_t)(2 * s->k) * JDT_SHM_CHUNK;
}

void jdt_shm_free(jdt_shm *s)
{
    if (!s) return;
    if (s->base) munmap(s->base, s->bytes);
    jdt_free(s);
}

/* Fills id with this host's identity: boot id and hostname. */
static void host_identity(char id[128])
{
    memset(id, 0, 128);
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    ssize_t n = 0;
    if (fd >= 0) {
        n = read(fd, id, 48);
        close(fd);
    }
    if (n < 0) n = 0;
    gethostname(id + 48, 128 - 48 - 1);
}

jdt_status jdt_shm_setup(jdt_comm_group *g, jdt_shm **out, jdt_err *e)
{
    *out = NULL;
    int k = g->n, me = g->index;
    jdt_status st = JDT_OK;
    char *ids = jdt_calloc((size_t)k, 128);
    jdt_shm *s = jdt_calloc(1, sizeof *s);
    uint8_t *ok = jdt_calloc((size_t)k, 1);
    char name[64] = "";
    int fd = -1;
    if (!ids || !s || !ok) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "shared-memory set-up");
        goto out;
    }
    host_identity(ids + (size_t)me * 128);
    st = jdt_comm_raw_allgather(g, ids, 128, e);
    if (st) goto out;
    bool same = true;
    for (int i = 1; i < k; i++) same = same && memcmp(ids, ids + (size_t)i * 128, 128) == 0;
    if (!same) goto out; /* not one host: no shared memory, not an error */

    s->k = k;
    s->me = me;
    s->ranks = g->ranks;
    s->bytes = shm_size(k);
    if (me == 0) {
        uint8_t rnd[8] = {0};
        if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
            uint64_t t = (uint64_t)(jdt_now_s() * 1e9);
            memcpy(rnd, &t, sizeof rnd);
        }
        snprintf(name, sizeof name, "/jdt-%d-%02x%02x%02x%02x%02x%02x%02x%02x", (int)getpid(),
                 rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        /* reserve the pages now: a full /dev/shm must fail here, not SIGBUS later */
        if (fd < 0 || posix_fallocate(fd, 0, (off_t)s->bytes) != 0) {
            JDT_DEBUG("shared memory unavailable (%s): using TCP", strerror(errno));
            if (fd >= 0) shm_unlink(name);
            name[0] = 0;
        }
    }
    st = jdt_comm_raw_broadcast(g, name, sizeof name, e);
    if (st) goto out_unlink;
    if (!name[0]) goto out; /* member 0 could not create it */
    if (me != 0) fd = shm_open(name, O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0) {
        void *p = mmap(NULL, s->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p != MAP_FAILED) s->base = p;
    }
    ok[me] = s->base != NULL;
    st = jdt_comm_raw_allgather(g, ok, 1, e);
    if (st) goto out_unlink;
    bool all_ok = true;
    for (int i = 0; i < k; i++) all_ok = all_ok && ok[i];
    if (!all_ok) goto out_unlink;
    shm_layout(s);
    if (me == 0) {
        shm_head *h = (shm_head *)s->base;
        h->magic = SHM_MAGIC;
        h->k = (uint32_t)k;
        h->chunk = JDT_SHM_CHUNK;
    }
    /* the unlink below happens after everyone mapped (the all-gather above) */
    *out = s;
    s = NULL;
out_unlink:
    if (me == 0 && name[0]) shm_unlink(name);
out:
    if (fd >= 0) close(fd);
    jdt_shm_free(s);
    jdt_free(ids);
    jdt_free(ok);
    return st;
}

/* ---- waiting ---------------------------------------------------------------------------------- */

static bool reached(uint32_t v, uint32_t target) { return (int32_t)(v - target) >= 0; }

static void wake(_Atomic uint32_t *a)
{
    syscall(SYS_futex, (uint32_t *)a, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
}

static jdt_status wait_all(jdt_dist *d, jdt_shm *s, size_t field, uint32_t target,
                           double deadline, jdt_err *e)
{
    for (int i = 0; i < s->k; i++) {
        _Atomic uint32_t *a = (_Atomic uint32_t *)((uint8_t *)&s->ctr[i] + field);
        for (int spin = 0; !reached(atomic_load(a), target); spin++) {
            if (spin < 256) {
                __builtin_ia32_pause();
                continue;
            }
            if (atomic_load(&d->aborted)) return jdt_dist_check(d, e);
            if (jdt_now_s() > deadline)
                return jdt_err_set(e, JDT_ERR_TIMEOUT, "allreduce (shared memory): rank %d "
                                   "(host %s) made no progress within op_timeout_s = %.1f s",
                                   s->ranks[i], jdt_dist_host(d, s->ranks[i]), d->o.op_timeout_s);
            uint32_t v = atomic_load(a);
            if (reached(v, target)) break;
            struct timespec ts = {0, 50 * 1000 * 1000};
            syscall(SYS_futex, (uint32_t *)a, FUTEX_WAIT, v, &ts, NULL, 0);
        }
    }
    return JDT_OK;
}

static void post(_Atomic uint32_t *a, uint32_t v)
{
    atomic_store(a, v);
    wake(a);
}

/* dst[i] = pub[i] = dst[i] op src[i]: one pass instead of a reduce and a copy. */
static void reduce_publish(void *dst, void *pub, const void *src, size_t n, jdt_dtype dt,
                           jdt_reduce_op op)
{
    if (dt == JDT_DTYPE_F32) {
        float *restrict a = dst, *restrict p = pub;
        const float *restrict b = src;
        if (op == JDT_REDUCE_SUM) {
#pragma omp simd
            for (size_t i = 0; i < n; i++) p[i] = a[i] = a[i] + b[i];
        } else {
#pragma omp simd
            for (size_t i = 0; i < n; i++) p[i] = a[i] = b[i] > a[i] ? b[i] : a[i];
        }
    } else {
        double *restrict a = dst, *restrict p = pub;
        const double *restrict b = src;
        if (op == JDT_REDUCE_SUM) {
#pragma omp simd
            for (size_t i = 0; i < n; i++) p[i] = a[i] = a[i] + b[i];
        } else {
#pragma omp simd
            for (size_t i = 0; i < n; i++) p[i] = a[i] = b[i] > a[i] ? b[i] : a[i];
        }
    }
}

/* ---- the all-reduce --------------------------------------------------------------------------- */

jdt_status jdt_shm_allreduce(jdt_dist *d, jdt_shm *s, void *buf, size_t n_elems, jdt_dtype dt,
                             jdt_reduce_op op, jdt_err *e)
{
    size_t esize = jdt_dtype_size(dt), chunk_elems = JDT_SHM_CHUNK / esize;
    int k = s->k, me = s->me;
    double deadline = jdt_now_s() + d->o.op_timeout_s;
    shm_ctr *mine = &s->ctr[me];
    uint8_t *b = buf;
    for (size_t c0 = 0; c0 < n_elems; c0 += chunk_elems) {
        size_t m = n_elems - c0 < chunk_elems ? n_elems - c0 : chunk_elems;
        uint32_t g = s->done++;
        int set = (int)(g & 1);
        uint8_t *chunk = b + c0 * esize;
        uint8_t *slot_me = s->slots + ((size_t)set * (size_t)k + (size_t)me) * JDT_SHM_CHUNK;
        uint8_t *res = s->res + (size_t)set * JDT_SHM_CHUNK;
        size_t pf, pc;
        jdt_comm_segment(m, k, me, &pf, &pc);
        size_t pfb = pf * esize, pcb = pc * esize, mb = m * esize;

        /* 1. publish the chunk (all but my part) once everyone has reduced chunk g-2 */
        jdt_status st = wait_all(d, s, offsetof(shm_ctr, red), g - 1, deadline, e);
        if (st) return st;
        memcpy(slot_me, chunk, pfb);
        memcpy(slot_me + pfb + pcb, chunk + pfb + pcb, mb - pfb - pcb);
        post(&mine->in, g + 1);

        /* 2. reduce my part from every slot; publish it once chunk g-2's results are read */
        st = wait_all(d, s, offsetof(shm_ctr, in), g + 1, deadline, e);
        if (st) return st;
        st = wait_all(d, s, offsetof(shm_ctr, out), g - 1, deadline, e);
        if (st) return st;
        int last = me == k - 1 ? k - 2 : k - 1; /* the final peer's pass also writes res */
        for (int i = 0; i < k; i++) {
            if (i == me) continue;
            const uint8_t *slot = s->slots + ((size_t)set * (size_t)k + (size_t)i) * JDT_SHM_CHUNK;
            if (i == last) reduce_publish(chunk + pfb, res + pfb, slot + pfb, pc, dt, op);
            else jdt_comm_reduce(chunk + pfb, slot + pfb, pc, dt, op);
        }
        post(&mine->red, g + 1);

        /* 3. collect everyone's reduced parts */
        st = wait_all(d, s, offsetof(shm_ctr, red), g + 1, deadline, e);
        if (st) return st;
        memcpy(chunk, res, pfb);
        memcpy(chunk + pfb + pcb, res + pfb + pcb, mb - pfb - pcb);
        post(&mine->out, g + 1);
    }
    return JDT_OK;
}

/* ---- reduce-scatter and all-gather -------------------------------------------------------------
 * Both walk the k segments of the buffer (jdt_comm_segment) in lock-step: round r covers
 * elements [r*L, (r+1)*L) of every segment, L = chunk / k elements, so a member's slot holds k
 * sub-slices. Reduce-scatter: member j copies the round's slices of every other segment i into
 * sub-slice i of its slot, then reduces its own segment's slice from sub-slice j of every other
 * slot. All-gather: member j copies its own slice into its slot, then copies every other
 * member's slice out. The `red` counter guards reuse of a slot set (double-buffered). */

static jdt_status shm_segments(jdt_dist *d, jdt_shm *s, uint8_t *b, size_t n_elems, jdt_dtype dt,
                               jdt_reduce_op op, bool reduce, jdt_err *e)
{
    size_t esize = jdt_dtype_size(dt);
    int k = s->k, me = s->me;
    size_t sub = (JDT_SHM_CHUNK / esize / (size_t)k); /* elements per sub-slice */
    double deadline = jdt_now_s() + d->o.op_timeout_s;
    shm_ctr *mine = &s->ctr[me];
    size_t longest = n_elems / (size_t)k + (n_elems % (size_t)k ? 1 : 0);
    for (size_t o = 0; o < longest; o += sub) {
        uint32_t g = s->done++;
        int set = (int)(g & 1);
        uint8_t *slot_me = s->slots + ((size_t)set * (size_t)k + (size_t)me) * JDT_SHM_CHUNK;
        jdt_status st = wait_all(d, s, offsetof(shm_ctr, red), g - 1, deadline, e);
        if (st) return st;
        for (int i = 0; i < k; i++) {
            if (reduce == (i == me)) continue; /* RS: every other segment; AG: my own */
            size_t f, c;
            jdt_comm_segment(n_elems, k, i, &f, &c);
            if (o >= c) continue;
            size_t len = c - o < sub ? c - o : sub;
            uint8_t *dst = slot_me + (reduce ? (size_t)i * sub * esize : 0);
            memcpy(dst, b + (f + o) * esize, len * esize);
        }
        post(&mine->in, g + 1);
        st = wait_all(d, s, offsetof(shm_ctr, in), g + 1, deadline, e);
        if (st) return st;
        for (int i = 0; i < k; i++) {
            if (i == me) continue;
            const uint8_t *slot = s->slots + ((size_t)set * (size_t)k + (size_t)i) * JDT_SHM_CHUNK;
            size_t f, c;
            jdt_comm_segment(n_elems, k, reduce ? me : i, &f, &c);
            if (o >= c) continue;
            size_t len = c - o < sub ? c - o : sub;
            if (reduce)
                jdt_comm_reduce(b + (f + o) * esize, slot + (size_t)me * sub * esize, len, dt, op);
            else
                memcpy(b + (f + o) * esize, slot, len * esize);
        }
        post(&mine->red, g + 1);
        post(&mine->out, g + 1); /* no result area here; keep the counters in step */
    }
    return JDT_OK;
}

jdt_status jdt_shm_reduce_scatter(jdt_dist *d, jdt_shm *s, void *buf, size_t n_elems,
                                  jdt_dtype dt, jdt_reduce_op op, jdt_err *e)
{
    return shm_segments(d, s, buf, n_elems, dt, op, true, e);
}

jdt_status jdt_shm_allgather(jdt_dist *d, jdt_shm *s, void *buf, size_t n_elems, jdt_dtype dt,
                             jdt_err *e)
{
    return shm_segments(d, s, buf, n_elems, dt, JDT_REDUCE_SUM, false, e);
}
