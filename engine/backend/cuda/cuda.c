/*
 * cuda.c — the CUDA backend (built with `make CUDA=1`): the run-time half of engine/backend for
 * one NVIDIA GPU per process.
 *
 *   device   jdt_cuk (cuk.h: device selection, the compute stream, cuBLASLt, the builtin
 *            kernels), the registry of device-resident leaves, the NCCL communicator.
 *   prepare  emit.c's CUDA C -> NVRTC for the device's sm_XX (cached on disk: key = source +
 *            NVRTC version + arch) -> cudaLibraryLoadData -> one cudaKernel_t per group; ONE
 *            cudaMalloc per program holding the device pointer table, the INPUT leaves' slots
 *            and the planned arena (never managed memory).
 *   run      begin: INPUT leaves are copied in (the batch, the step's scalars), PARAM/STATE/
 *            data-CONSTANT leaves are mirrored on the device (uploaded once, updated there);
 *            steps: generated kernels through cudaLaunchKernel, builtins through jdt_cuk_*;
 *            finish: update copies device-to-device, then one error check. Everything is
 *            queued on the one stream; reads (the loss) synchronise.
 *
 * Every CUDA/NVRTC status is checked and turned into one message naming the call and the
 * CUDA error string.
 */
#include "backend/backend-impl.h"
#include "backend/cuda/cuda-emit.h"
#include "backend/cuda/cuda.h"
#include "backend/cuda/cuk.h"
#include "comm/comm.h"

#include <cuda_runtime.h>
#include <nvrtc.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CU_FORMAT "jdt-cuda-cubin-1"

/* A leaf mirrored in device memory, shared by every program that binds the same host memory
 * (the train, apply and eval programs share parameters). Freed when its last program goes. */
typedef struct {
    void *host;
    void *dev;
    size_t n_bytes;
    bool stale; /* the host copy is newer: upload before the next use */
    int refs;   /* programs using it */
} mirror;

/* The communicator of one collective group id (engine/shard: a mask of mesh axes). Groups with
 * the same ranks share one communicator (the first entry owns it); a group of one rank has
 * none (its collectives are local). */
#define MAX_GROUPS 16
typedef struct {
    int group, n_ranks;
    uint64_t ranks_hash;
    jdt_cuk_comm *comm;
    bool owner;
} group_comm;

typedef struct {
    jdt_cuk *k;
    cudaStream_t stream;
    mirror **m; /* (n_m) */
    int n_m, cap_m;
    char name[256];
    int arch;
    jdt_dist *dist; /* set by jdt_device_set_dist: NCCL for the collectives */
    jdt_device_group_fn
        group_ranks; /* set by jdt_device_set_groups; NULL: every group is the world */
    void *group_ctx;
    group_comm groups[MAX_GROUPS]; /* made on each group's first collective */
    int n_groups;
    /* memory accounting: our cudaMallocs (programs, leaf mirrors) + the cuBLASLt workspace */
    int64_t bytes_now, bytes_peak;
    /* NCCL time (cudaEvent timing, jdt_cuk_coll_times), summed over the programs' runs: the
     * collectives' run time on their streams, the compute stream's stalls waiting for them */
    double comm_moving_s, comm_waited_s;
    void **promised; /* host leaves counted by a prepare, mirrored at a later begin */
    int n_promised, cap_promised;
    int64_t reserve_env; /* JDT_CUDA_RESERVE_MB in bytes, read at open; -1 unset */
} cuda_dev;

typedef struct {
    const cprog *c;
    jdt_device *d;
    cuda_dev *cd;
    char *src;
    jdt_cuda_launch *launch; /* (n_kernels) */
    cudaLibrary_t lib;
    cudaKernel_t *kern;      /* (n_kernels) */
    cudaKernel_t scale_kern; /* the module's jdt_scale (all-reduce scaling) */
    void *dmem;              /* the one allocation: table | inputs | collective scratch | arena */
    void *dcoll; /* a started lone all-gather's input set aside when it overlaps its slot (the
                    largest such shard; blocking collectives have planned scratch) */
    int64_t dmem_bytes;
    void **dtable; /* (n_bufs) device pointer table */
    unsigned char *dinputs, *darena;
    int64_t *input_off; /* (n_bufs) offset of an INPUT leaf's slot, else -1 */
    mirror **bmir;      /* (n_bufs) a persistent leaf's mirror, else NULL */
    void **ptrs;        /* (n_bufs) host copy of the table */
    bool table_dirty;
    /* NCCL events: [k < n_colls] started collective k (STEP_COLL_*), [n_colls + s] the blocking
     * collective of step s; made at the first use (NULL: none yet, or a one-rank group) */
    jdt_cuk_coll **tk;
    jdt_cuk_comm **ccomm; /* (n_colls) the communicator collective k was started on, or NULL */
    cudaEvent_t *marks;   /* (n_steps + 2) the step timing's marks (cuda_mark), made at the first */
} cuda_prog;

#define CU(call, what)                                                                             \
    do {                                                                                           \
        cudaError_t ce_ = (call);                                                                  \
        if (ce_ != cudaSuccess) {                                                                  \
            st =                                                                                   \
                jdt_err_set(e, JDT_ERR_INTERNAL, "cuda: %s: %s", (what), cudaGetErrorString(ce_)); \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

/* ---- NVRTC and the kernel cache ------------------------------------------------------------ */

int jdt_cuda_nvrtc_compile(void *prog, const char *target)
{
    char arch[64], split[48];
    snprintf(arch, sizeof arch, "--gpu-architecture=%s", target);
    const char *opts[] = {arch, "--std=c++17", split};
    /* NVRTC 13.0 with --split-compile crashed (SIGSEGV in nvrtcCompileProgram's own thread while
     * its workers ran) in 2 of 13 runs of check_cuda's step compiles on a 2-core box with the
     * other core busy, once in CI; 0 of 25 without it. So a single-threaded compile is the
     * default and the split an opt-in (JDT_NVRTC_SPLIT=N threads, 0 = every core): a cold cache
     * only, the cubins are cached */
    const char *env = getenv("JDT_NVRTC_SPLIT");
    int n_opts = 2;
    if (env && *env) {
        char *end;
        long n = strtol(env, &end, 10);
        if (*end == 0 && n >= 0 && n <= 4096) {
            snprintf(split, sizeof split, "--split-compile=%ld", n);
            n_opts = 3;
        } else {
            static atomic_flag warned = ATOMIC_FLAG_INIT;
            if (!atomic_flag_test_and_set(&warned))
                JDT_WARN("JDT_NVRTC_SPLIT=%s is not a thread count (0-4096): NVRTC compiles "
                         "single-threaded",
                         env);
        }
    }
    nvrtcResult r = nvrtcCompileProgram((nvrtcProgram)prog, n_opts, opts);
    if (r == NVRTC_ERROR_INVALID_OPTION && n_opts == 3) /* an NVRTC older than the option */
        r = nvrtcCompileProgram((nvrtcProgram)prog, 2, opts);
    return (int)r;
}

jdt_status jdt_cuda_nvrtc(const char *src, const char *name, int arch, void **image,
                          size_t *n_bytes, jdt_err *e)
{
    *image = NULL;
    *n_bytes = 0;
    nvrtcProgram prog;
    nvrtcResult r = nvrtcCreateProgram(&prog, src, name, 0, NULL, NULL);
    if (r != NVRTC_SUCCESS)
        return jdt_err_set(e, JDT_ERR_COMPILE, "nvrtc: create %s: %s", name,
                           nvrtcGetErrorString(r));
    char target[32];
    snprintf(target, sizeof target, "sm_%d", arch);
    r = (nvrtcResult)jdt_cuda_nvrtc_compile(prog, target);
    jdt_status st = JDT_OK;
    if (r != NVRTC_SUCCESS) {
        size_t log_n = 0;
        nvrtcGetProgramLogSize(prog, &log_n);
        char *log = jdt_malloc(log_n + 1);
        if (log) {
            nvrtcGetProgramLog(prog, log);
            log[log_n] = 0;
        }
        st = jdt_err_set(e, JDT_ERR_COMPILE, "nvrtc: %s for sm_%d: %s: %.1500s", name, arch,
                         nvrtcGetErrorString(r), log ? log : "(no log)");
        jdt_free(log);
        nvrtcDestroyProgram(&prog);
        return st;
    }
    size_t n = 0;
    if ((r = nvrtcGetCUBINSize(prog, &n)) != NVRTC_SUCCESS || !(*image = jdt_malloc(n)) ||
        (r = nvrtcGetCUBIN(prog, *image)) != NVRTC_SUCCESS) {
        st = jdt_err_set(e, *image ? JDT_ERR_COMPILE : JDT_ERR_NOMEM, "nvrtc: cubin of %s: %s",
                         name, nvrtcGetErrorString(r));
        jdt_free(*image);
        *image = NULL;
    } else {
        *n_bytes = n;
    }
    nvrtcDestroyProgram(&prog);
    return st;
}

static uint64_t cubin_key(const char *src, int arch)
{
    int major = 0, minor = 0;
    nvrtcVersion(&major, &minor);
    uint64_t h = jdt_hash_str(JDT_HASH_INIT, CU_FORMAT);
    h = jdt_hash_str(h, src);
    h = jdt_hash_u64(h, (uint64_t)major * 1000 + (uint64_t)minor);
    return jdt_hash_u64(h, (uint64_t)arch);
}

/* How long a process waits for another's NVRTC compile of the same kernels before compiling
 * them itself (the builtins' attention takes about a minute on 2 cores). */
#define NVRTC_LOCK_WAIT_S 900.0

typedef struct {
    const char *src;
    int arch;
    double *cc_s;
} cubin_build;

static jdt_status build_cubin(void *ctx, unsigned char **bytes, size_t *n_bytes, jdt_err *e)
{
    cubin_build *b = ctx;
    const double t0 = jdt_now_s();
    void *image = NULL;
    jdt_status st = jdt_cuda_nvrtc(b->src, "jdt-program.cu", b->arch, &image, n_bytes, e);
    *b->cc_s = jdt_now_s() - t0;
    *bytes = image;
    return st;
}

/* The cubin of src for arch, from the compile cache under dir or compiled by NVRTC (and
 * stored): the ranks of a node compile the same program at once, one runs NVRTC (on every
 * core) while the others wait for its entry. */
static jdt_status cubin_get(const char *dir, const char *src, int arch, int64_t max_bytes,
                            unsigned char **image, size_t *n_bytes, jdt_compile_stats *stats,
                            jdt_err *e)
{
    const uint64_t key = cubin_key(src, arch);
    char kind[32];
    snprintf(kind, sizeof kind, "sm_%d.cubin", arch);
    jdt_compile_cache_path(dir, key, kind, stats->so_path, sizeof stats->so_path);
    cubin_build b = {src, arch, &stats->cc_s};
    jdt_cache_how how;
    jdt_status st = jdt_compile_cache_fetch(dir, key, kind, NVRTC_LOCK_WAIT_S, max_bytes,
                                            build_cubin, &b, image, n_bytes, &how, e);
    stats->cache_hit = how != JDT_CACHE_BUILT;
    stats->cache_waited = how == JDT_CACHE_WAITED;
    return st;
}

/* ---- device --------------------------------------------------------------------------------- */

/* Before a host-side wait on the compute stream: with a communicator, wait for its collectives
 * while polling NCCL's asynchronous errors and the rendezvous, so a dead peer ends the job with
 * the rank named instead of a stream synchronisation that never returns. */
#define COLLECTIVE_WAIT_S 600.0
static jdt_status settle(cuda_dev *cd, jdt_err *e)
{
    for (int i = 0; i < cd->n_groups; i++) {
        if (!cd->groups[i].owner) continue;
        jdt_status st = jdt_cuk_comm_sync(cd->groups[i].comm, COLLECTIVE_WAIT_S, e);
        if (st != JDT_OK) return st;
    }
    return JDT_OK;
}

/* The communicator of collective group `group`, made on the group's first collective (every
 * member reaches it in the same program order); *comm NULL when the group is this rank alone
 * (or the job has one process). *size: the group's rank count. JDT_CUDA_NCCL_SINGLE=1 (tests
 * on one GPU) gives a group of one rank a communicator too, so its collectives take the NCCL
 * path (streams, events, timing) instead of local copies. */
static jdt_status group_comm_get(cuda_dev *cd, int group, jdt_cuk_comm **comm, int *size,
                                 jdt_err *e)
{
    *comm = NULL;
    *size = 1;
    if (!cd->dist) return JDT_OK;
    for (int i = 0; i < cd->n_groups; i++)
        if (cd->groups[i].group == group) {
            *comm = cd->groups[i].comm;
            *size = cd->groups[i].n_ranks;
            return JDT_OK;
        }
    if (cd->n_groups == MAX_GROUPS)
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "cuda: more than %d collective groups",
                           MAX_GROUPS);
    const int W = jdt_dist_world_size(cd->dist);
    int *ranks = jdt_calloc((size_t)W + 1, sizeof *ranks);
    if (!ranks) return jdt_err_set(e, JDT_ERR_NOMEM, "cuda: group ranks");
    int n = W;
    if (cd->group_ranks) {
        n = cd->group_ranks(cd->group_ctx, group, ranks, W);
    } else {
        for (int r = 0; r < W; r++)
            ranks[r] = r;
    }
    jdt_status st = JDT_OK;
    if (n < 1) {
        st = jdt_err_set(e, JDT_ERR_INTERNAL, "cuda: collective on unknown group %d", group);
        goto out;
    }
    group_comm *g = &cd->groups[cd->n_groups];
    memset(g, 0, sizeof *g);
    g->group = group;
    g->n_ranks = n;
    g->ranks_hash = jdt_hash_bytes(JDT_HASH_INIT, ranks, (size_t)n * sizeof *ranks);
    const char *single = getenv("JDT_CUDA_NCCL_SINGLE");
    const bool want_comm = n > 1 || (single && strcmp(single, "1") == 0);
    for (int i = 0; i < cd->n_groups && want_comm; i++)
        if (cd->groups[i].owner && cd->groups[i].n_ranks == n &&
            cd->groups[i].ranks_hash == g->ranks_hash)
            g->comm = cd->groups[i].comm; /* the same ranks under another mask */
    if (want_comm && !g->comm) {
        char key[96]; /* unique per rank set: disjoint groups of one mask differ in ranks[0] */
        snprintf(key, sizeof key, "jdt/nccl/n%d-r%d-%016llx", n, ranks[0],
                 (unsigned long long)g->ranks_hash);
        if ((st = jdt_cuk_comm_init(cd->k, cd->dist, ranks, n, key, &g->comm, e)) != JDT_OK)
            goto out;
        g->owner = true;
    }
    cd->n_groups++;
    *comm = g->comm;
    *size = n;
out:
    jdt_free(ranks);
    return st;
}

static jdt_status mirror_get(cuda_dev *cd, void *host, size_t n_bytes, mirror **out, jdt_err *e)
{
    jdt_status st = JDT_OK;
    for (int i = 0; i < cd->n_m; i++) {
        mirror *m = cd->m[i];
        if (m->host == host && m->n_bytes == n_bytes) {
            m->refs++;
            *out = m;
            return JDT_OK;
        }
    }
    if (!jdt_compile_grow((void **)&cd->m, &cd->cap_m, cd->n_m + 1, sizeof *cd->m))
        return jdt_err_set(e, JDT_ERR_NOMEM, "cuda: leaf registry");
    mirror *m = jdt_calloc(1, sizeof *m);
    if (!m) return jdt_err_set(e, JDT_ERR_NOMEM, "cuda: leaf registry");
    m->host = host;
    m->n_bytes = n_bytes;
    m->stale = true;
    m->refs = 1;
    CU(cudaMalloc(&m->dev, n_bytes ? n_bytes : 4), "cudaMalloc of a leaf");
    cd->m[cd->n_m++] = m;
    cd->bytes_now += (int64_t)n_bytes;
    if (cd->bytes_now > cd->bytes_peak) cd->bytes_peak = cd->bytes_now;
    *out = m;
    return JDT_OK;
fail:
    jdt_free(m);
    return st;
}

static void mirror_put(cuda_dev *cd, mirror *m)
{
    if (!m || --m->refs > 0) return;
    for (int i = 0; i < cd->n_m; i++)
        if (cd->m[i] == m) {
            cd->m[i] = cd->m[--cd->n_m];
            break;
        }
    cudaFree(m->dev);
    cd->bytes_now -= (int64_t)m->n_bytes;
    jdt_free(m);
}

static jdt_status cuda_pull(jdt_device *d, jdt_err *e)
{
    cuda_dev *cd = d->impl;
    jdt_status st = settle(cd, e);
    if (st != JDT_OK) return st;
    CU(cudaStreamSynchronize(cd->stream), "synchronising before copying leaves out");
    for (int i = 0; i < cd->n_m; i++) {
        mirror *m = cd->m[i];
        if (m->stale) continue; /* the host copy is the newer one */
        CU(cudaMemcpy(m->host, m->dev, m->n_bytes, cudaMemcpyDeviceToHost),
           "copying a leaf to the host");
    }
    return JDT_OK;
fail:
    return st;
}

static void cuda_push(jdt_device *d)
{
    cuda_dev *cd = d->impl;
    for (int i = 0; i < cd->n_m; i++)
        cd->m[i]->stale = true;
}

static void cuda_close(jdt_device *d)
{
    cuda_dev *cd = d->impl;
    if (!cd) return;
    for (int i = 0; i < cd->n_groups; i++)
        if (cd->groups[i].owner) jdt_cuk_comm_free(cd->groups[i].comm);
    for (int i = 0; i < cd->n_m; i++) {
        cudaFree(cd->m[i]->dev);
        jdt_free(cd->m[i]);
    }
    jdt_free(cd->m);
    jdt_free(cd->promised);
    jdt_cuk_free(cd->k);
    jdt_free(cd);
    d->impl = NULL;
}

static bool cuda_memory(const jdt_device *d, jdt_device_mem *m)
{
    const cuda_dev *cd = d->impl;
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) free_b = total_b = 0;
    m->peak_bytes = cd->bytes_peak;
    m->now_bytes = cd->bytes_now;
    m->used_bytes = (int64_t)(total_b - free_b);
    m->total_bytes = (int64_t)total_b;
    return true;
}

static bool cuda_comm_times(const jdt_device *d, double *waited_s, double *moving_s)
{
    const cuda_dev *cd = d->impl;
    if (!cd->dist) return false;
    *waited_s = cd->comm_waited_s;
    *moving_s = cd->comm_moving_s;
    return true;
}

static char *cuda_describe(const jdt_device *d, char *buf, size_t n)
{
    const cuda_dev *cd = d->impl;
    snprintf(buf, n, "cuda:%d %s (sm_%d)", d->index, cd->name, cd->arch);
    return buf;
}

static const jdt_backend_vt cuda_vt; /* defined below */
static void coll_dims(const cprog *c, const cnode *n, int64_t *k, int64_t *nf, int64_t *nl,
                      int64_t *outer, int64_t *blk);

void jdt_device_set_dist(jdt_device *d, jdt_dist *dist)
{
    if (d && d->vt == &cuda_vt && d->impl) ((cuda_dev *)d->impl)->dist = dist;
}

void jdt_device_set_groups(jdt_device *d, jdt_device_group_fn fn, void *ctx)
{
    if (!d || d->vt != &cuda_vt || !d->impl) return;
    ((cuda_dev *)d->impl)->group_ranks = fn;
    ((cuda_dev *)d->impl)->group_ctx = ctx;
}

/* ---- program -------------------------------------------------------------------------------- */

/* The planned scratch of a builtin: a bf16 MATMUL's rounded copies of its inputs
 * (jdt_cuk_matmul_bf16_scratch_bytes), the attention backward's (row statistics, dO's bf16 copy,
 * the dK/dV split's sums: jdt_cuk_attention_scratch_bytes), a blocking all-gather's or
 * reduce-scatter's staging (gather_scatter: NCCL's wire order permuted through it, or an input
 * that overlaps the output copied aside; planned for its step only, not held for the program). */
static int64_t cuda_scratch_bytes(const cprog *c, const cnode *n)
{
    if (n->op == JDT_OP_ALL_GATHER || n->op == JDT_OP_REDUCE_SCATTER) {
        int64_t k, nf, nl, outer, blk;
        coll_dims(c, n, &k, &nf, &nl, &outer, &blk);
        const int64_t esz = (int64_t)jdt_dtype_size(n->dtype);
        /* a gather in NCCL's order needs the full tensor only when it must be permuted */
        return n->op == JDT_OP_ALL_GATHER && outer == 1 ? nl * esz : nf * esz;
    }
    if (n->op == JDT_OP_MATMUL) {
        const jdt_shape *a = &c->nodes[n->in[0]].shape, *b = &c->nodes[n->in[1]].shape;
        int nd = n->shape.ndim;
        int64_t M = cnode_mm_rows(n), N = n->shape.dims[nd - 1];
        int64_t K = n->attrs.i[0] ? a->dims[a->ndim - 2] : a->dims[a->ndim - 1];
        int64_t mn = M * N, batch = mn > 0 ? jdt_shape_numel(&n->shape) / mn : 0;
        if (n->attrs.i[4]) batch /= 2; /* GELU(y) and y packed */
        if (!n->attrs.i[2]) return 0;
        /* the f32 operands' bf16 copies; the TF32 fallback (where cuBLASLt has no bf16
         * algorithm: meant to be rare) allocates its own copies when it runs. Planning them
         * cost GPT-2's lm-head weight gradient 6.2 GiB, Llama's at tensor: 8 0.55 GiB */
        return jdt_cuk_matmul_bf16_need_bytes(batch, M, N, K, b->ndim == 2, c->nodes[n->in[0]].bf16,
                                              c->nodes[n->in[1]].bf16);
    }
    const jdt_shape *q = &c->nodes[n->in[0]].shape;
    if (q->ndim != 4 || n->op != JDT_OP_ATTENTION_BWD) return 0; /* the forward needs none */
    const int64_t Hk = c->nodes[n->in[1]].shape.dims[1]; /* grouped-query: fewer k/v heads */
    return jdt_cuk_attention_scratch_bytes(q->dims[0], q->dims[1], q->dims[2], q->dims[3],
                                           Hk > 0 && q->dims[1] % Hk == 0 ? q->dims[1] / Hk : 1);
}

static void fmt_gib(char *buf, size_t n, double bytes)
{
    if (bytes >= 1073741824.0)
        snprintf(buf, n, "%.2f GiB", bytes / 1073741824.0);
    else
        snprintf(buf, n, "%.0f MiB", bytes / 1048576.0);
}

/* Headroom kept free for what is allocated outside the plan: the CUDA context's growth,
 * cuBLASLt's plans; with more than one process, NCCL's buffers too, made at a group's first
 * collective, after the program's allocation: hundreds of MB a communicator, over 2 GB with
 * NVLink SHARP on an NVSwitch node (NCCL_NVLS_ENABLE=0 turns that off). JDT_CUDA_RESERVE_MB
 * sets it. */
#define DEVICE_RESERVE_BYTES (256ll << 20)
#define NCCL_RESERVE_BYTES (2048ll << 20)

static int64_t device_reserve(const cuda_dev *cd)
{
    if (cd->reserve_env >= 0) return cd->reserve_env;
    return DEVICE_RESERVE_BYTES +
           (cd->dist && jdt_dist_world_size(cd->dist) > 1 ? NCCL_RESERVE_BYTES : 0);
}

/* JDT_CUDA_RESERVE_MB as bytes, -1 when unset; a value that is not a count of MiB is said once
 * and ignored. */
static int64_t reserve_from_env(void)
{
    const char *env = getenv("JDT_CUDA_RESERVE_MB");
    if (!env || !*env) return -1;
    char *end = NULL;
    const long long mb = strtoll(env, &end, 10);
    if (*end == 0 && mb >= 0 && mb < (1ll << 40)) return (int64_t)mb << 20;
    JDT_WARN("JDT_CUDA_RESERVE_MB=%s is not a number of MiB: ignored", env);
    return -1;
}

/* Before a program's one cudaMalloc: the program (program_bytes) plus the leaves it will mirror
 * that no earlier program mirrors or has counted (parameters, optimizer state), plus
 * device_reserve's headroom, must fit in the device's free memory (cudaMemGetInfo); else one line
 * with the figures and what to change (ERR_NOMEM, exit 1) instead of a CUDA OOM mid-step. The
 * leaves counted here are remembered (cd->promised) so the eval/apply programs that share them
 * do not count them again. */
static jdt_status check_fits(cuda_dev *cd, const cprog *c, int64_t program_bytes, jdt_err *e)
{
    int64_t leaf_bytes = 0;
    for (int b = 0; b < c->n_bufs; b++) {
        if (c->bufs[b].info.kind != JDT_BUF_LEAF) continue;
        const cnode *n = &c->nodes[c->bufs[b].leaf_node];
        if (n->op == JDT_OP_INPUT) continue; /* in the program's allocation */
        void *host = n->src ? n->src->data : NULL;
        bool known = false;
        for (int i = 0; host && i < cd->n_m && !known; i++)
            known = cd->m[i]->host == host;
        for (int i = 0; host && i < cd->n_promised && !known; i++)
            known = cd->promised[i] == host;
        if (known) continue;
        leaf_bytes += jdt_shape_numel(&n->shape) * (int64_t)jdt_dtype_size(n->dtype);
        if (host && jdt_compile_grow((void **)&cd->promised, &cd->cap_promised, cd->n_promised + 1,
                                     sizeof *cd->promised))
            cd->promised[cd->n_promised++] = host;
    }
    size_t free_b = 0, total_b = 0;
    cudaError_t ce = cudaMemGetInfo(&free_b, &total_b);
    if (ce != cudaSuccess)
        return jdt_err_set(e, JDT_ERR_INTERNAL, "cuda: cudaMemGetInfo: %s", cudaGetErrorString(ce));
    const int64_t reserve = device_reserve(cd), need = program_bytes + leaf_bytes + reserve;
    if (need <= (int64_t)free_b) return JDT_OK;
    char s_need[32], s_prog[32], s_arena[32], s_leaf[32], s_free[32], s_total[32];
    fmt_gib(s_need, sizeof s_need, (double)need);
    fmt_gib(s_prog, sizeof s_prog, (double)program_bytes);
    fmt_gib(s_arena, sizeof s_arena, c->arena_lender ? 0.0 : (double)c->arena_bytes);
    fmt_gib(s_leaf, sizeof s_leaf, (double)leaf_bytes);
    fmt_gib(s_free, sizeof s_free, (double)free_b);
    fmt_gib(s_total, sizeof s_total, (double)total_b);
    return jdt_err_set(e, JDT_ERR_NOMEM,
                       "cuda: the compiled step needs %s of GPU memory but %s of %s is free on "
                       "%s (program %s, of which %s activations/intermediates; parameters and "
                       "optimizer state %s; %lld MiB reserve, JDT_CUDA_RESERVE_MB): use a smaller "
                       "data.micro_batch_size (gradient accumulation keeps data.batch_size)%s",
                       s_need, s_free, s_total, cd->name, s_prog, s_arena, s_leaf,
                       (long long)(reserve >> 20),
                       c->opts.remat == JDT_COMPILE_REMAT_BLOCK ? ", or more fsdp ranks (mesh.fsdp)"
                                                                : ", or runtime.remat: block");
}

static void cuda_release(void *state)
{
    cuda_prog *p = state;
    if (!p) return;
    if (p->tk) { /* a failed run may leave a started collective on a buffer freed below */
        jdt_err ignored;
        settle(p->cd, &ignored);
    }
    if (p->dmem || p->lib) cudaStreamSynchronize(p->cd->stream);
    for (int i = 0; p->tk && i < p->c->n_colls + p->c->n_steps; i++)
        jdt_cuk_coll_free(p->tk[i]);
    for (int i = 0; p->marks && i < p->c->n_steps + 2; i++)
        if (p->marks[i]) cudaEventDestroy(p->marks[i]);
    jdt_free(p->marks);
    jdt_free(p->tk);
    jdt_free(p->ccomm);
    if (p->bmir)
        for (int b = 0; b < p->c->n_bufs; b++)
            mirror_put(p->cd, p->bmir[b]);
    if (p->lib) cudaLibraryUnload(p->lib);
    if (p->dmem) p->cd->bytes_now -= p->dmem_bytes;
    cudaFree(p->dmem);
    jdt_free(p->kern);
    jdt_free(p->launch);
    jdt_free(p->src);
    jdt_free(p->input_off);
    jdt_free(p->bmir);
    jdt_free(p->ptrs);
    jdt_free(p);
}

static jdt_status cuda_prepare(jdt_device *d, const cprog *c, void **state, jdt_err *e)
{
    jdt_status st;
    cuda_dev *cd = d->impl;
    *state = NULL;
    cuda_prog *p = jdt_calloc(1, sizeof *p);
    if (!p) return jdt_err_set(e, JDT_ERR_NOMEM, "compile: program");
    p->c = c;
    p->d = d;
    p->cd = cd;
    jdt_compile_stats *stats = (jdt_compile_stats *)&c->stats;
    unsigned char *image = NULL;
    size_t n_image = 0;
    if ((st = jdt_cuda_codegen(c, &p->src, &p->launch, e)) != JDT_OK) goto fail;
    char dir[1024];
    jdt_compile_opts co = c->opts;
    if (d->cache_dir[0]) co.cache_dir = d->cache_dir;
    if ((st = jdt_compile_cache_dir(&co, dir, sizeof dir, e)) != JDT_OK) goto fail;
    if ((st = cubin_get(dir, p->src, cd->arch, co.cache_max_bytes, &image, &n_image, stats, e)) !=
        JDT_OK)
        goto fail;
    CU(cudaLibraryLoadData(&p->lib, image, NULL, NULL, 0, NULL, NULL, 0),
       "loading the compiled kernels");
    int nk = c->stats.n_kernels;
    p->kern = jdt_calloc((size_t)nk + 1, sizeof *p->kern);
    p->input_off = jdt_calloc((size_t)c->n_bufs + 1, sizeof *p->input_off);
    p->bmir = jdt_calloc((size_t)c->n_bufs + 1, sizeof *p->bmir);
    p->ptrs = jdt_calloc((size_t)c->n_bufs + 1, sizeof *p->ptrs);
    p->ccomm = jdt_calloc((size_t)c->n_colls + 1, sizeof *p->ccomm);
    if (!p->kern || !p->input_off || !p->bmir || !p->ptrs || !p->ccomm) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "compile: program tables");
        goto fail;
    }
    for (int s = 0; s < c->n_steps; s++) { /* the kernels launched (merge.c: not members) */
        const cstep *sp = &c->steps[s];
        if (sp->kind != STEP_KERNEL || sp->merged < 0) continue;
        char name[32];
        snprintf(name, sizeof name, "k%d", sp->kernel);
        CU(cudaLibraryGetKernel(&p->kern[sp->kernel], p->lib, name), "finding a generated kernel");
    }
    CU(cudaLibraryGetKernel(&p->scale_kern, p->lib, "jdt_scale"), "finding jdt_scale");
    /* one allocation: pointer table | INPUT slots | arena, each 256-byte aligned */
    int64_t table_bytes = ((int64_t)(c->n_bufs + 1) * 8 + 255) / 256 * 256, in_bytes = 0;
    for (int b = 0; b < c->n_bufs; b++) {
        p->input_off[b] = -1;
        if (c->bufs[b].info.kind != JDT_BUF_LEAF) continue;
        const cnode *n = &c->nodes[c->bufs[b].leaf_node];
        /* a STATE leaf (optimizer moments, accumulated gradients) is an INPUT node flagged
         * JDT_TENSOR_STATE: mirrored like a parameter, so its device updates persist */
        if (n->op != JDT_OP_INPUT || (n->src->flags & JDT_TENSOR_STATE)) continue;
        p->input_off[b] = in_bytes;
        in_bytes +=
            ((int64_t)jdt_shape_numel(&n->shape) * (int64_t)jdt_dtype_size(n->dtype) + 255) / 256 *
            256;
    }
    int64_t coll_bytes = 0; /* coll_pack's staging: the largest shard of a lone all-gather
                               that runs in its own output (a wire-less started one) */
    for (int i = 0; i < c->n_colls; i++) {
        const ccoll *cl = &c->colls[i];
        const cnode *n = &c->nodes[cl->members[0]];
        if (n->op != JDT_OP_ALL_GATHER || cl->scratch_buf >= 0) continue;
        int64_t k, nf, nl, outer, blk;
        coll_dims(c, n, &k, &nf, &nl, &outer, &blk);
        const int64_t b = (nl * cl->esz + 255) / 256 * 256;
        if (b > coll_bytes) coll_bytes = b;
    }
    /* a borrower (eval, apply: program.c checked the lender's size) runs in the lender's arena */
    const cuda_prog *lender = c->arena_lender;
    int64_t total = table_bytes + in_bytes + coll_bytes +
                    (lender           ? 0
                     : c->arena_bytes ? c->arena_bytes
                                      : 256);
    if ((st = check_fits(cd, c, total, e)) != JDT_OK) goto fail;
    CU(cudaMalloc(&p->dmem, (size_t)total), "cudaMalloc of the program's arena");
    p->dmem_bytes = total;
    cd->bytes_now += total;
    if (cd->bytes_now > cd->bytes_peak) cd->bytes_peak = cd->bytes_now;
    p->dtable = p->dmem;
    p->dinputs = (unsigned char *)p->dmem + table_bytes;
    p->dcoll = coll_bytes ? p->dinputs + in_bytes : NULL;
    p->darena = lender ? lender->darena : p->dinputs + in_bytes + coll_bytes;
    for (int b = 0; b < c->n_bufs; b++) {
        if (c->bufs[b].info.kind == JDT_BUF_ARENA && c->bufs[b].info.offset >= 0)
            p->ptrs[b] = p->darena + c->bufs[b].info.offset;
        else if (p->input_off[b] >= 0)
            p->ptrs[b] = p->dinputs + p->input_off[b];
    }
    p->table_dirty = true;
    stats->arena_bytes = total;
    jdt_free(image);
    *state = p;
    return JDT_OK;
fail:
    jdt_free(image);
    cuda_release(p);
    return st;
}

static const char *cuda_source(const void *state)
{
    return ((const cuda_prog *)state)->src;
}

static jdt_status cuda_begin(void *state, jdt_err *e)
{
    cuda_prog *p = state;
    const cprog *c = p->c;
    cudaStream_t s = p->cd->stream;
    jdt_status st = JDT_OK;
    char lbl[128];
    for (int b = 0; b < c->n_bufs; b++) {
        if (c->bufs[b].info.kind != JDT_BUF_LEAF) continue;
        const cnode *n = &c->nodes[c->bufs[b].leaf_node];
        void *host = n->src->data;
        if (!host)
            return jdt_err_set(e, JDT_ERR_INVALID, "run: leaf %s is not bound (data is NULL)",
                               jdt_compile_node_label(n, lbl, sizeof lbl));
        size_t bytes = (size_t)jdt_shape_numel(&n->shape) * jdt_dtype_size(n->dtype);
        if (p->input_off[b] >= 0) {
            CU(cudaMemcpyAsync(p->ptrs[b], host, bytes, cudaMemcpyHostToDevice, s),
               "copying an input in");
            continue;
        }
        mirror *m = p->bmir[b];
        if (!m || m->host != host) {
            mirror_put(p->cd, m);
            p->bmir[b] = NULL;
            if ((st = mirror_get(p->cd, host, bytes, &p->bmir[b], e)) != JDT_OK) return st;
            m = p->bmir[b];
        }
        if (m->stale) {
            CU(cudaMemcpyAsync(m->dev, host, bytes, cudaMemcpyHostToDevice, s),
               "copying a leaf in");
            m->stale = false;
        }
        if (p->ptrs[b] != m->dev) {
            p->ptrs[b] = m->dev;
            p->table_dirty = true;
        }
    }
    if (p->table_dirty) {
        CU(cudaMemcpyAsync(p->dtable, p->ptrs, (size_t)c->n_bufs * sizeof(void *),
                           cudaMemcpyHostToDevice, s),
           "copying the pointer table in");
        p->table_dirty = false;
    }
    return JDT_OK;
fail:
    return st;
}

static void *dptr(const cuda_prog *p, int node)
{
    int b = p->c->nodes[node].buf;
    return b >= 0 ? p->ptrs[b] : NULL;
}

static int64_t last_dim(const jdt_shape *s)
{
    return s->ndim ? s->dims[s->ndim - 1] : 1;
}

/* o (n floats) *= sc on the compute stream (the module's jdt_scale kernel). */
static jdt_status scale(cuda_prog *p, float *o, int64_t n, double sc, jdt_err *e)
{
    jdt_status st = JDT_OK;
    if (sc == 1.0 || n <= 0) return JDT_OK;
    float scf = (float)sc;
    long long cnt = n;
    void *args[] = {&o, &cnt, &scf};
    int grid =
        (int)((cnt + 255) / 256 < JDT_CUDA_MAX_GRID ? (cnt + 255) / 256 + 1 : JDT_CUDA_MAX_GRID);
    CU(cudaLaunchKernel((const void *)p->scale_kern, (dim3){(unsigned)grid, 1, 1},
                        (dim3){256, 1, 1}, args, 0, p->cd->stream),
       "collective scale");
    return JDT_OK;
fail:
    return st;
}

static jdt_status copy_bytes(cuda_prog *p, void *dst, const void *src, int64_t n_bytes,
                             const char *what, jdt_err *e)
{
    jdt_status st = JDT_OK;
    if (dst == src || n_bytes <= 0) return JDT_OK;
    CU(cudaMemcpyAsync(dst, src, (size_t)n_bytes, cudaMemcpyDeviceToDevice, p->cd->stream), what);
    return JDT_OK;
fail:
    return st;
}

static jdt_status copy_d2d(cuda_prog *p, void *dst, const void *src, int64_t n_floats,
                           const char *what, jdt_err *e)
{
    return copy_bytes(p, dst, src, n_floats * (int64_t)sizeof(float), what, e);
}

static bool overlaps_bytes(const void *a, int64_t na_bytes, const void *b, int64_t nb_bytes)
{
    const char *pa = a, *pb = b;
    return pa < pb + nb_bytes && pb < pa + na_bytes;
}

static bool overlaps(const void *a, int64_t na_floats, const void *b, int64_t nb_floats)
{
    return overlaps_bytes(a, na_floats * 4, b, nb_floats * 4);
}

/* An all-gather's NCCL kind and element size: f32, or bf16 (FSDP's bf16 weight copies). */
static jdt_cuk_coll_kind gather_kind(const cnode *n, int64_t *esz)
{
    *esz = (int64_t)jdt_dtype_size(n->dtype);
    return n->dtype == JDT_DTYPE_BF16 ? JDT_CUK_ALLGATHER_BF16 : JDT_CUK_ALLGATHER;
}

/* A scale of 1/size is NCCL's average (one pass instead of sum + scale). */
static bool is_mean(double sc, int size)
{
    return sc * size > 0.999999 && sc * size < 1.000001;
}

/* ---- collectives ----------------------------------------------------------------------------
 * Blocking (a STEP_BUILTIN collective node: runtime.overlap_comm false, or a program compiled
 * without start/wait) or started and waited (STEP_COLL_PACK / _START / _WAIT, scheduled by
 * fuse.c when the compile options carry collective_start/_wait: the CUDA backend runs them
 * with NCCL itself and uses those hooks only as the request to overlap). Both paths make the
 * same NCCL calls on the same data, then the same scale kernels: the results are identical. */

/* The events of slot i of p->tk (made on first use): the NCCL time of the collective that ran
 * there last is counted first, if finished (never waits). */
static jdt_status ticket(cuda_prog *p, int i, jdt_cuk_coll **out, jdt_err *e)
{
    const int n = p->c->n_colls + p->c->n_steps;
    if (!p->tk && !(p->tk = jdt_calloc((size_t)n + 1, sizeof *p->tk)))
        return jdt_err_set(e, JDT_ERR_NOMEM, "cuda: collective events");
    if (!p->tk[i]) {
        jdt_status st = jdt_cuk_coll_new(p->cd->k, &p->tk[i], e);
        if (st != JDT_OK) return st;
    }
    jdt_cuk_coll_times(p->tk[i], &p->cd->comm_waited_s, &p->cd->comm_moving_s);
    *out = p->tk[i];
    return JDT_OK;
}

/* Counts the NCCL time of every finished collective of p (after a synchronisation: all). */
static void harvest(cuda_prog *p)
{
    for (int i = 0; p->tk && i < p->c->n_colls + p->c->n_steps; i++)
        jdt_cuk_coll_times(p->tk[i], &p->cd->comm_waited_s, &p->cd->comm_moving_s);
}

/* A collective at once: started and waited on the events of step s. */
static jdt_status blocking(cuda_prog *p, int s, jdt_cuk_comm *cm, jdt_cuk_coll_kind kind,
                           jdt_cuk_redop op, const void *send, void *recv, int64_t n, jdt_err *e)
{
    jdt_cuk_coll *t;
    jdt_status st = ticket(p, p->c->n_colls + s, &t, e);
    if (st == JDT_OK) st = jdt_cuk_coll_start(cm, t, kind, op, send, recv, n, e);
    return st == JDT_OK ? jdt_cuk_coll_wait(cm, t, e) : st;
}

static jdt_status all_reduce(cuda_prog *p, int s, const cnode *n, void *o, void *in, jdt_err *e)
{
    cuda_dev *cd = p->cd;
    jdt_status st;
    int64_t n_el = jdt_shape_numel(&n->shape);
    const double sc = n->attrs.f[0];
    if (n->attrs.i[1] != 0 && n->attrs.i[1] != 1)
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "all_reduce on cuda: reduction op %lld",
                           (long long)n->attrs.i[1]);
    if ((st = copy_d2d(p, o, in, n_el, "all_reduce copy", e)) != JDT_OK) return st;
    jdt_cuk_comm *cm;
    int size;
    if ((st = group_comm_get(cd, (int)n->attrs.i[0], &cm, &size, e)) != JDT_OK) return st;
    if (cm) { /* one rank alone: the reduction is the identity, only the scale applies */
        const bool avg = n->attrs.i[1] == 0 && is_mean(sc, size);
        st = blocking(p, s, cm, JDT_CUK_ALLREDUCE,
                      n->attrs.i[1] == 1 ? JDT_CUK_MAX
                      : avg              ? JDT_CUK_AVG
                                         : JDT_CUK_SUM,
                      o, o, n_el, e);
        if (st != JDT_OK || avg) return st;
    }
    return scale(p, o, n_el, sc, e);
}

/* The (outer, k, blk) view of an all-gather / reduce-scatter's full tensor along axis i[1]
 * (the CPU backend's block order, engine/backend/cpu/cpu.c); nl = nf / k, one member's part. */
static void coll_dims(const cprog *c, const cnode *n, int64_t *k, int64_t *nf, int64_t *nl,
                      int64_t *outer, int64_t *blk)
{
    *k = n->attrs.i[2];
    *nf = jdt_shape_numel(jdt_coll_full(c, n));
    *nl = *k ? *nf / *k : 0;
    *outer = jdt_coll_outer(c, n);
    *blk = *outer ? *nl / *outer : 0;
}

/* The communicator of collective node n's group, checked against the node's member count. */
static jdt_status coll_comm(cuda_prog *p, const cnode *n, jdt_cuk_comm **cm, int *size, jdt_err *e)
{
    jdt_status st = group_comm_get(p->cd, (int)n->attrs.i[0], cm, size, e);
    if (st != JDT_OK || n->op == JDT_OP_ALL_REDUCE || *size == n->attrs.i[2]) return st;
    return jdt_err_set(e, JDT_ERR_INTERNAL, "%s over %lld members, but group %lld has %d rank(s)",
                       jdt_op_name(n->op), (long long)n->attrs.i[2], (long long)n->attrs.i[0],
                       *size);
}

/* ALL_GATHER / REDUCE_SCATTER, blocking: NCCL's wire order is (k, outer, blk), so a permuting
 * copy through the step's planned scratch (cuda_scratch_bytes) unless everything before the
 * axis has size 1. A gather moves f32 or bf16 (bytes of esz), a scatter sums f32. */
static jdt_status gather_scatter(cuda_prog *p, int s, const cnode *n, float *o, float *in,
                                 jdt_err *e)
{
    const bool gather = n->op == JDT_OP_ALL_GATHER;
    int64_t k, nf, nl, outer, blk, esz;
    const jdt_cuk_coll_kind gk = gather_kind(n, &esz);
    coll_dims(p->c, n, &k, &nf, &nl, &outer, &blk);
    jdt_cuk_comm *cm;
    int size;
    jdt_status st = coll_comm(p, n, &cm, &size, e);
    if (st != JDT_OK) return st;
    if (!cm) { /* k = 1: a copy (times the scale for the scatter) */
        if ((st = copy_bytes(p, o, in, nl * esz, "collective copy", e)) != JDT_OK) return st;
        return gather ? JDT_OK : scale(p, o, nl, n->attrs.f[0], e);
    }
    const int sb = p->c->steps[s].scratch_buf;
    float *tmp = sb >= 0 ? p->ptrs[sb] : NULL;
    if (!tmp) return jdt_err_set(e, JDT_ERR_INTERNAL, "%s: no staging buffer", jdt_op_name(n->op));
    if (gather) {
        if (outer > 1) {
            st = blocking(p, s, cm, gk, JDT_CUK_SUM, in, tmp, nl, e);
            if (st != JDT_OK) return st;
            jdt_cuk_permute_blocks_bytes(p->cd->k, tmp, o, k, outer, blk * esz, true);
            return JDT_OK;
        }
        const void *send = in;
        if (overlaps_bytes(in, nl * esz, o, nf * esz)) { /* NCCL's in-place form: slot `index` */
            if ((st = copy_bytes(p, tmp, in, nl * esz, "all_gather staging", e)) != JDT_OK)
                return st;
            send = tmp;
        }
        return blocking(p, s, cm, gk, JDT_CUK_SUM, send, o, nl, e);
    }
    const float *send = in;
    if (outer > 1) {
        jdt_cuk_permute_blocks(p->cd->k, in, tmp, k, outer, blk, false);
        send = tmp;
    } else if (overlaps(in, nf, o, nl)) {
        if ((st = copy_d2d(p, tmp, in, nf, "reduce_scatter staging", e)) != JDT_OK) return st;
        send = tmp;
    }
    const bool mean = is_mean(n->attrs.f[0], size);
    st = blocking(p, s, cm, JDT_CUK_REDUCE_SCATTER, mean ? JDT_CUK_AVG : JDT_CUK_SUM, send, o, nl,
                  e);
    if (st != JDT_OK) return st;
    return mean ? JDT_OK : scale(p, o, nl, n->attrs.f[0], e);
}

/* Started collective cl: whether its all-reduce averages in NCCL (every member's scale is
 * 1/size; otherwise a sum, each member scaled at the wait). */
static bool coll_avg(const cprog *c, const ccoll *cl, int size)
{
    const cnode *n0 = &c->nodes[cl->members[0]];
    if (n0->op == JDT_OP_ALL_REDUCE && n0->attrs.i[1] != 0) return false;
    for (int m = 0; m < cl->n_members; m++)
        if (!is_mean(c->nodes[cl->members[m]].attrs.f[0], size)) return false;
    return true;
}

/* STEP_COLL_PACK, on the compute stream: a member's input into the buffer NCCL will use — an
 * all-reduce's own buffer (or its bucket slot); a lone all-gather's slot `index` of its output
 * (NCCL's in-place form); else the collective's wire (compile-impl.h, ccoll): a bucketed
 * all-gather's part at its place in segment `index`, a reduce-scatter's k parts one per
 * segment. */
static jdt_status coll_pack(cuda_prog *p, const cstep *sp, jdt_err *e)
{
    const cprog *c = p->c;
    const ccoll *cl = &c->colls[sp->coll];
    const cnode *n = &c->nodes[sp->node];
    float *x = dptr(p, n->in[0]), *o = dptr(p, sp->node);
    if (n->op == JDT_OP_ALL_REDUCE)
        return copy_d2d(p, o, x, jdt_shape_numel(&n->shape), "all_reduce pack", e);
    int64_t k, nf, nl, outer, blk;
    coll_dims(c, n, &k, &nf, &nl, &outer, &blk);
    const int64_t esz = cl->esz;
    if (n->op == JDT_OP_ALL_GATHER) {
        jdt_cuk_comm *cm;
        int size;
        jdt_status st = coll_comm(p, n, &cm, &size, e);
        if (st != JDT_OK) return st;
        const int64_t index = cm ? jdt_cuk_comm_index(cm) : 0;
        if (cl->scratch_buf >= 0) { /* a bucket */
            char *wire = p->ptrs[cl->scratch_buf];
            const int64_t at =
                index * jdt_ccoll_seg(cl, k) + cl->part_off[jdt_ccoll_member(cl, sp->node)];
            return copy_bytes(p, wire + at * esz, x, nl * esz, "all_gather pack", e);
        }
        char *dst = (char *)o + index * nl * esz;
        if ((void *)dst != x && overlaps_bytes(x, nl * esz, dst, nl * esz)) { /* via staging */
            if (!p->dcoll) return jdt_err_set(e, JDT_ERR_INTERNAL, "all_gather: no staging");
            if ((st = copy_bytes(p, p->dcoll, x, nl * esz, "all_gather pack", e)) != JDT_OK)
                return st;
            x = p->dcoll;
        }
        return copy_bytes(p, dst, x, nl * esz, "all_gather pack", e);
    }
    jdt_cuk_wire_bytes(p->cd->k, x, p->ptrs[cl->scratch_buf], k, outer, blk * esz,
                       jdt_ccoll_seg(cl, k) * esz,
                       cl->part_off[jdt_ccoll_member(cl, sp->node)] * esz, false);
    return JDT_OK;
}

/* STEP_COLL_START: the collective on its communicator's stream, behind an event of the compute
 * stream (jdt_cuk_coll_start); the compute queued until the wait runs alongside it. */
static jdt_status coll_start(cuda_prog *p, const cstep *sp, jdt_err *e)
{
    const cprog *c = p->c;
    const ccoll *cl = &c->colls[sp->coll];
    const cnode *n = &c->nodes[cl->members[0]];
    jdt_cuk_comm *cm;
    int size;
    jdt_status st = coll_comm(p, n, &cm, &size, e);
    if (st != JDT_OK) return st;
    p->ccomm[sp->coll] = NULL; /* set once started: coll_wait and coll_drain wait only those */
    float *o = dptr(p, cl->members[0]);
    int64_t k, nf, nl, outer, blk;
    if (n->op != JDT_OP_ALL_REDUCE) coll_dims(c, n, &k, &nf, &nl, &outer, &blk);
    if (!cm) return JDT_OK; /* a group of one: the identity (a scatter's copy is at the wait) */
    jdt_cuk_coll *t;
    if ((st = ticket(p, sp->coll, &t, e)) != JDT_OK) return st;
    const jdt_cuk_redop op = n->op == JDT_OP_ALL_REDUCE && n->attrs.i[1] == 1 ? JDT_CUK_MAX
                             : coll_avg(c, cl, size)                          ? JDT_CUK_AVG
                                                                              : JDT_CUK_SUM;
    const int64_t index = jdt_cuk_comm_index(cm);
    if (n->op == JDT_OP_ALL_GATHER) { /* in place: segment `index` of the wire or output */
        int64_t esz;
        const jdt_cuk_coll_kind gk = gather_kind(n, &esz);
        const int64_t seg = cl->scratch_buf >= 0 ? jdt_ccoll_seg(cl, k) : nl;
        char *buf = cl->scratch_buf >= 0 ? p->ptrs[cl->scratch_buf] : (void *)o;
        st = jdt_cuk_coll_start(cm, t, gk, op, buf + index * seg * esz, buf, seg, e);
    } else if (n->op == JDT_OP_REDUCE_SCATTER) { /* in place: this rank's segment of the wire
                                                  * (the memory plan gives the outputs their
                                                  * places only at the wait: they may hold live
                                                  * data until then) */
        float *wire = p->ptrs[cl->scratch_buf];
        const int64_t seg = jdt_ccoll_seg(cl, k);
        st =
            jdt_cuk_coll_start(cm, t, JDT_CUK_REDUCE_SCATTER, op, wire, wire + index * seg, seg, e);
    } else {
        float *buf = cl->buf >= 0 ? p->ptrs[cl->buf] : o; /* a bucket: all its slots at once */
        st = jdt_cuk_coll_start(cm, t, JDT_CUK_ALLREDUCE, op, buf, buf, cl->n_elems, e);
    }
    if (st == JDT_OK) p->ccomm[sp->coll] = cm;
    return st;
}

/* STEP_COLL_WAIT: the compute stream waits for the collective (the host does not), then each
 * member's finish on the compute stream: its scale, an all-gather's block order. */
static jdt_status coll_wait(cuda_prog *p, const cstep *sp, jdt_err *e)
{
    const cprog *c = p->c;
    const ccoll *cl = &c->colls[sp->coll];
    jdt_cuk_comm *cm = p->ccomm[sp->coll];
    p->ccomm[sp->coll] = NULL;
    jdt_status st = cm ? jdt_cuk_coll_wait(cm, p->tk[sp->coll], e) : JDT_OK;
    if (st != JDT_OK) return st;
    const bool avg = cm && coll_avg(c, cl, jdt_cuk_comm_size(cm));
    for (int m = 0; m < cl->n_members; m++) {
        const cnode *n = &c->nodes[cl->members[m]];
        float *o = dptr(p, cl->members[m]);
        if (n->op == JDT_OP_ALL_REDUCE) {
            st = avg ? JDT_OK : scale(p, o, jdt_shape_numel(&n->shape), n->attrs.f[0], e);
        } else {
            int64_t k, nf, nl, outer, blk;
            coll_dims(c, n, &k, &nf, &nl, &outer, &blk);
            const int64_t index = cm ? jdt_cuk_comm_index(cm) : 0, seg = jdt_ccoll_seg(cl, k);
            void *wire = cl->scratch_buf >= 0 ? p->ptrs[cl->scratch_buf] : NULL;
            if (n->op == JDT_OP_REDUCE_SCATTER) { /* this rank's part out of its segment */
                const float *part = (const float *)wire + index * seg + cl->part_off[m];
                st = copy_d2d(p, o, part, nl, "reduce_scatter result", e);
                if (st == JDT_OK && !avg) st = scale(p, o, nl, n->attrs.f[0], e);
            } else if (wire) { /* a bucket: every part r out of segment r */
                jdt_cuk_wire_bytes(p->cd->k, o, wire, k, outer, blk * cl->esz, seg * cl->esz,
                                   cl->part_off[m] * cl->esz, true);
            } else if (outer > 1 && k > 1) { /* fuse.c gives these a wire (wire_gathers) */
                st = jdt_err_set(e, JDT_ERR_INTERNAL,
                                 "all_gather: a lone gather past axis 0 "
                                 "without a wire buffer");
            }
        }
        if (st != JDT_OK) return st;
    }
    return JDT_OK;
}

/* After a failed step: every collective still started is waited (the compute stream ordered
 * after it), as the CPU backend waits its handles, so the next run can start them again. */
static void coll_drain(cuda_prog *p)
{
    for (int k = 0; k < p->c->n_colls; k++) {
        if (!p->ccomm[k]) continue;
        jdt_err ignored;
        jdt_cuk_coll_wait(p->ccomm[k], p->tk[k], &ignored);
        p->ccomm[k] = NULL;
    }
}

/* A packed norm backward's (passes.c fold_norm_partials) optional P rows of its output's
 * column sums after dw's and db's (attrs i[1], fold_norm_cotangents); NULL when it has none.
 * Its bf16 copy of its output is its co-output (co_ptr). */
static float *norm_out_sums(const cnode *n, void *o, int64_t N, int64_t C)
{
    return n->attrs.i[1] ? (float *)o + (N + 2 * n->attrs.i[0]) * C : NULL;
}

/* A packed norm backward's inputs: x, dy, w, then the residual's cotangent acc when it took
 * it (fold_norm_partials), then attrs i[2] more bf16 terms of dy (fold_norm_dy_terms). acc, or
 * NULL; term j of those, or NULL. */
static void *norm_acc(const cnode *n, void *const *in)
{
    return n->n_in - n->attrs.i[2] > 3 ? in[3] : NULL;
}

static void *norm_dy_term(const cnode *n, void *const *in, int j)
{
    return j < n->attrs.i[2] ? in[n->n_in - n->attrs.i[2] + j] : NULL;
}

/* The buffer of builtin n's first co-output (passes.c make_co_output), or NULL. */
static void *co_ptr(cuda_prog *p, const cnode *n)
{
    return n->co ? dptr(p, n->co) : NULL;
}

static jdt_status run_builtin(cuda_prog *p, const cstep *sp, jdt_err *e)
{
    const cprog *c = p->c;
    const cnode *n = &c->nodes[sp->node];
    jdt_cuk *k = p->cd->k;
    void *o = dptr(p, sp->node);
    void *in[JDT_MAX_INPUTS] = {0};
    for (int j = 0; j < n->n_in; j++)
        in[j] = dptr(p, n->in[j]);
    const jdt_shape *s0 = n->n_in ? &c->nodes[n->in[0]].shape : &n->shape;
    int64_t C = last_dim(s0), N = C ? jdt_shape_numel(s0) / C : 0;
    float eps = (float)n->attrs.f[0];
    void *scratch = sp->scratch_buf >= 0 ? p->ptrs[sp->scratch_buf] : NULL;
    char lbl[128];
    switch (n->op) {
    case JDT_OP_MATMUL: {
        const jdt_shape *a = s0, *b = &c->nodes[n->in[1]].shape;
        int nd = n->shape.ndim;
        int64_t M = cnode_mm_rows(n), Nn = n->shape.dims[nd - 1];
        int64_t K = n->attrs.i[0] ? a->dims[a->ndim - 2] : a->dims[a->ndim - 1];
        int64_t mn = M * Nn, batch = mn > 0 ? jdt_shape_numel(&n->shape) / mn : 0;
        const int64_t scratch_n = sp->scratch_buf >= 0 ? c->bufs[sp->scratch_buf].info.n_bytes : 0;
        const int bi = cnode_mm_bias(n), ai = cnode_mm_acc(n);
        void *bias = bi >= 0 ? dptr(p, bi) : NULL, *acc = ai >= 0 ? dptr(p, ai) : NULL;
        const int64_t lda = cnode_pitch(c, n->in[0]), ldb = cnode_pitch(c, n->in[1]);
        if (lda || ldb || n->pitch) /* padded rows: this GEMM's call takes them */
            jdt_cuk_gemm_pitch(k, lda, ldb, n->pitch);
        if (n->attrs.i[5]) { /* y GELU'(u), u the second half of the aux (fold_dgelu_epilogues),
                                and its column sums when they are its co-output */
            const cnode *x = &c->nodes[cnode_mm_aux(n)];
            const uint16_t *u =
                (const uint16_t *)dptr(p, cnode_mm_aux(n)) + cnode_mm_rows(x) * last_dim(&x->shape);
            return jdt_cuk_matmul_bf16_dgelu(k, in[0], in[1], u, o, co_ptr(p, n), batch, M, Nn, K,
                                             n->attrs.i[0] != 0, n->attrs.i[1] != 0, b->ndim == 2,
                                             c->nodes[n->in[0]].bf16, c->nodes[n->in[1]].bf16,
                                             scratch, scratch_n, e);
        }
        if (n->attrs.i[4]) /* GELU(y), then y, both bf16 (passes.c fold_gelu_epilogues) */
            return jdt_cuk_matmul_bf16_gelu(k, in[0], in[1], bias, o, (uint16_t *)o + mn, batch / 2,
                                            M, Nn, K, n->attrs.i[0] != 0, n->attrs.i[1] != 0,
                                            b->ndim == 2, c->nodes[n->in[0]].bf16,
                                            c->nodes[n->in[1]].bf16, scratch, scratch_n, e);
        if (n->dtype == JDT_DTYPE_BF16) /* a bf16 output, bias bf16 too (fold_bf16_casts) */
            return jdt_cuk_matmul_bf16_out(k, in[0], in[1], bias, o, batch, M, Nn, K,
                                           n->attrs.i[0] != 0, n->attrs.i[1] != 0, b->ndim == 2,
                                           c->nodes[n->in[0]].bf16, c->nodes[n->in[1]].bf16,
                                           scratch, scratch_n, e);
        if (n->attrs.i[2]) /* bf16 compute: bf16-stored operands are read as they are, the
                              planned scratch takes the bf16 copies of the others */
            return jdt_cuk_matmul_bf16_ex(k, in[0], in[1], bias, acc, o, batch, M, Nn, K,
                                          n->attrs.i[0] != 0, n->attrs.i[1] != 0, b->ndim == 2,
                                          c->nodes[n->in[0]].bf16, c->nodes[n->in[1]].bf16, scratch,
                                          scratch_n, e);
        return jdt_cuk_matmul(k, in[0], in[1], bias, acc, o, batch, M, Nn, K, n->attrs.i[0] != 0,
                              n->attrs.i[1] != 0, b->ndim == 2, e);
    }
    case JDT_OP_GATHER:
        jdt_cuk_gather(k, in[0], in[1], o, jdt_shape_numel(&c->nodes[n->in[1]].shape), s0->dims[0],
                       last_dim(&n->shape));
        return JDT_OK;
    case JDT_OP_SCATTER_ADD:
        jdt_cuk_scatter_add(k, in[0], in[1], o, jdt_shape_numel(&c->nodes[n->in[1]].shape),
                            n->shape.dims[0], last_dim(&n->shape));
        return JDT_OK;
    case JDT_OP_SOFTMAX:
        jdt_cuk_softmax(k, in[0], o, N, C);
        return JDT_OK;
    case JDT_OP_SOFTMAX_BWD:
        jdt_cuk_softmax_bwd(k, in[0], in[1], o, N, C);
        return JDT_OK;
    case JDT_OP_LOG_SOFTMAX:
        jdt_cuk_log_softmax(k, in[0], o, N, C);
        return JDT_OK;
    case JDT_OP_LOG_SOFTMAX_BWD:
        jdt_cuk_log_softmax_bwd(k, in[0], in[1], o, N, C);
        return JDT_OK;
    case JDT_OP_SOFTMAX_XENT: /* bf16 logits: passes.c fold_bf16_casts */
        if (n->co)            /* and the backward (passes.c fold_xent_backwards) */
            jdt_cuk_softmax_xent_fused(k, in[0], c->nodes[n->in[0]].dtype == JDT_DTYPE_BF16, in[1],
                                       (float)n->attrs.f[0], o, dptr(p, n->co),
                                       c->nodes[n->co].bf16, N, C, cnode_pitch(c, n->in[0]),
                                       c->nodes[n->co].pitch);
        else
            jdt_cuk_softmax_xent(k, in[0], c->nodes[n->in[0]].dtype == JDT_DTYPE_BF16, in[1], o, N,
                                 C, cnode_pitch(c, n->in[0]));
        return JDT_OK;
    case JDT_OP_SOFTMAX_XENT_BWD: {
        bool lb = c->nodes[n->in[0]].dtype == JDT_DTYPE_BF16;
        const int64_t ldx = cnode_pitch(c, n->in[0]);
        if (n->bf16) /* read only by bf16 GEMMs (fuse.c mark_bf16_storage) */
            jdt_cuk_softmax_xent_bwd_bf16(k, in[0], lb, in[1], in[2], in[3], o, N, C, ldx,
                                          n->pitch);
        else
            jdt_cuk_softmax_xent_bwd(k, in[0], lb, in[1], in[2], in[3], o, N, C, ldx, n->pitch);
        return JDT_OK;
    }
    case JDT_OP_NORMALIZE:
        if (n->n_in > 1) /* with its affine (passes.c fold_norm_affines) */
            jdt_cuk_normalize_affine(k, false, in[0], in[1], n->n_in > 2 ? in[2] : NULL, o, n->bf16,
                                     N, C, eps);
        else
            jdt_cuk_normalize(k, in[0], o, N, C, eps);
        return JDT_OK;
    case JDT_OP_NORMALIZE_BWD:
        if (n->attrs.i[0] > 0) /* dx, then P rows of dw's and db's partials (passes.c) */
            jdt_cuk_normalize_bwd_part(
                k, in[0], in[1], c->nodes[n->in[1]].dtype == JDT_DTYPE_BF16, norm_dy_term(n, in, 0),
                norm_dy_term(n, in, 1), in[2], norm_acc(n, in), o, (float *)o + N * C,
                (float *)o + (N + n->attrs.i[0]) * C, norm_out_sums(n, o, N, C), co_ptr(p, n), N, C,
                n->attrs.i[0], eps);
        else
            jdt_cuk_normalize_bwd(k, in[0], in[1], n->n_in > 2 ? in[2] : NULL, o, N, C, eps);
        return JDT_OK;
    case JDT_OP_RMS_NORMALIZE:
        if (n->n_in > 1)
            jdt_cuk_normalize_affine(k, true, in[0], in[1], n->n_in > 2 ? in[2] : NULL, o, n->bf16,
                                     N, C, eps);
        else
            jdt_cuk_rms_normalize(k, in[0], o, N, C, eps);
        return JDT_OK;
    case JDT_OP_RMS_NORMALIZE_BWD:
        if (n->attrs.i[0] > 0)
            jdt_cuk_rms_normalize_bwd_part(
                k, in[0], in[1], c->nodes[n->in[1]].dtype == JDT_DTYPE_BF16, norm_dy_term(n, in, 0),
                norm_dy_term(n, in, 1), in[2], norm_acc(n, in), o, (float *)o + N * C,
                (float *)o + (N + n->attrs.i[0]) * C, norm_out_sums(n, o, N, C), co_ptr(p, n), N, C,
                n->attrs.i[0], eps);
        else
            jdt_cuk_rms_normalize_bwd(k, in[0], in[1], n->n_in > 2 ? in[2] : NULL, o, N, C, eps);
        return JDT_OK;
    case JDT_OP_ROPE: {
        /* bf16 in and out where fold_bf16_casts put them; i[1]: x is (B, H, T, D) at element
         * i[2] of its input (fold_rope_transposes) */
        const cnode *x = &c->nodes[n->in[0]];
        const bool x16 = x->dtype == JDT_DTYPE_BF16;
        const char *xp = (const char *)in[0] + n->attrs.i[2] * (x16 ? 2 : 4);
        double sc[4];
        jdt_rope_scaling_of(&n->attrs, sc);
        jdt_cuk_rope(k, xp, o, x16, n->bf16, n->attrs.i[1] != 0, n->shape.dims[0], n->shape.dims[1],
                     n->shape.dims[2], n->shape.dims[3], n->attrs.f[0], sc, n->attrs.i[0] != 0);
        return JDT_OK;
    }
    case JDT_OP_ATTENTION:
    case JDT_OP_ATTENTION_BWD: {
        unsigned bthd = 0;
        for (int j = 0; j < n->n_in; j++)
            if (c->nodes[n->in[j]].kind == CK_VIEW && c->nodes[n->in[j]].op == JDT_OP_TRANSPOSE)
                bthd |= 1u << j;
        /* grouped-query: k and v with fewer heads than q (passes.c fold_attention_groups) */
        const int64_t Hk = c->nodes[n->in[1]].shape.dims[1];
        if (Hk != s0->dims[1]) bthd |= (unsigned)(s0->dims[1] / Hk) << 8;
        /* q, k, v bf16 (fold_bf16_casts: all three or none) */
        const bool qkv16 = c->nodes[n->in[0]].dtype == JDT_DTYPE_BF16;
        /* the backward's dO stored as bf16 (passes.c fold_attention_dout16) */
        const bool dout16 =
            n->op == JDT_OP_ATTENTION_BWD && c->nodes[n->in[4]].dtype == JDT_DTYPE_BF16;
        /* ... and o as bf16 (its forward's copy, fold_attention_o16) */
        const bool o16 = n->op == JDT_OP_ATTENTION_BWD && c->nodes[n->in[3]].bf16;
        /* the forward's log-sum-exp after o in its packed output (passes.c fold_attention_lse):
         * stored by the forward (attrs i[1] 1), read by the backward (attrs i[2] 1); or (2) the
         * forward's output is the log-sum-exp alone, o not stored (its copy is), and the
         * backward reads it as in[5] (fold_attention_o16) */
        const int64_t no = jdt_shape_numel(s0);
        const float *lse = n->op != JDT_OP_ATTENTION_BWD ? NULL
                           : n->attrs.i[2] == 2          ? (const float *)in[5]
                           : n->attrs.i[2]               ? (const float *)in[3] + no
                                                         : NULL;
        if (n->op == JDT_OP_ATTENTION)
            jdt_cuk_attention(k, in[0], in[1], in[2], qkv16, n->attrs.i[1] == 2 ? NULL : o,
                              co_ptr(p, n), n->co && c->nodes[n->co].bf16,
                              n->attrs.i[1] == 2 ? (float *)o
                              : n->attrs.i[1]    ? (float *)o + no
                                                 : NULL,
                              s0->dims[0], s0->dims[1], s0->dims[2], s0->dims[3],
                              (float)n->attrs.f[0], bthd, n->attrs.i[0] != 0, scratch);
        else if (!n->attrs.i[1])
            jdt_cuk_attention_bwd(k, in[0], in[1], in[2], qkv16, in[3], o16, in[4], dout16, lse, o,
                                  NULL, s0->dims[0], s0->dims[1], s0->dims[2], s0->dims[3],
                                  (float)n->attrs.f[0], bthd, n->attrs.i[0] != 0, scratch);
        else { /* the cotangent form (passes.c fold_attention_cotangents): the output is the
                  partials (none when no bias reads them: attrs i[3]); the co-outputs, in
                  order, the copies of dq, dk, dv (or the RoPE backward of one) */
            jdt_cuk_att_grads g = {.part = n->attrs.i[3] ? NULL : o};
            int q = n->co;
            for (int j = 0; j < 3 && q; j++, q = c->nodes[q].co) {
                g.copy[j] = dptr(p, q);
                g.copy_bf16[j] = c->nodes[q].bf16;
                if (c->nodes[q].op == JDT_OP_ROPE) { /* the RoPE backward the copy went to */
                    g.rope_theta[j] = c->nodes[q].attrs.f[0];
                    g.rope_inverse[j] = c->nodes[q].attrs.i[0] != 0;
                }
            }
            jdt_cuk_attention_bwd(k, in[0], in[1], in[2], qkv16, in[3], o16, in[4], dout16, lse,
                                  NULL, &g, s0->dims[0], s0->dims[1], s0->dims[2], s0->dims[3],
                                  (float)n->attrs.f[0], bthd, n->attrs.i[0] != 0, scratch);
        }
        return JDT_OK;
    }
    case JDT_OP_CONCAT: {
        int ax = (int)n->attrs.i[0];
        int64_t outer = 1, inner = 1, len[JDT_MAX_INPUTS];
        for (int j = 0; j < ax; j++)
            outer *= n->shape.dims[j];
        for (int j = ax + 1; j < n->shape.ndim; j++)
            inner *= n->shape.dims[j];
        for (int j = 0; j < n->n_in; j++)
            len[j] = c->nodes[n->in[j]].shape.dims[ax];
        jdt_cuk_concat(k, (const float *const *)in, len, n->n_in, o, outer, inner,
                       jdt_dtype_size(n->dtype));
        return JDT_OK;
    }
    case JDT_OP_ALL_REDUCE:
        return all_reduce(p, (int)(sp - c->steps), n, o, in[0], e);
    case JDT_OP_ALL_GATHER:
    case JDT_OP_REDUCE_SCATTER:
        return gather_scatter(p, (int)(sp - c->steps), n, o, in[0], e);
    case JDT_OP_PARAM: /* not builtins: leaves, views and fused work never get here */
    case JDT_OP_INPUT:
    case JDT_OP_CONSTANT:
    case JDT_OP_NEG:
    case JDT_OP_EXP:
    case JDT_OP_LOG:
    case JDT_OP_TANH:
    case JDT_OP_SQRT:
    case JDT_OP_RSQRT:
    case JDT_OP_RELU:
    case JDT_OP_GELU:
    case JDT_OP_SILU:
    case JDT_OP_SIGMOID:
    case JDT_OP_ABS:
    case JDT_OP_ADD:
    case JDT_OP_SUB:
    case JDT_OP_MUL:
    case JDT_OP_DIV:
    case JDT_OP_MAX:
    case JDT_OP_MIN:
    case JDT_OP_GT:
    case JDT_OP_GE:
    case JDT_OP_ADD_SCALAR:
    case JDT_OP_MUL_SCALAR:
    case JDT_OP_POW_SCALAR:
    case JDT_OP_GELU_GRAD:
    case JDT_OP_SILU_GRAD:
    case JDT_OP_SELECT:
    case JDT_OP_CAST:
    case JDT_OP_STOP_GRADIENT:
    case JDT_OP_DROPOUT:
    case JDT_OP_BROADCAST:
    case JDT_OP_REDUCE_SUM:
    case JDT_OP_REDUCE_MAX:
    case JDT_OP_REDUCE_MEAN:
    case JDT_OP_RESHAPE:
    case JDT_OP_TRANSPOSE:
    case JDT_OP_SLICE:
    case JDT_OP_IOTA:
    case JDT_OP_CAUSAL_MASK:
        break;
    }
    return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "run: no CUDA kernel for %s",
                       jdt_compile_node_label(n, lbl, sizeof lbl));
}

static jdt_status cuda_step(void *state, int s, jdt_err *e)
{
    cuda_prog *p = state;
    const cstep *sp = &p->c->steps[s];
    jdt_status st = JDT_OK;
    if (sp->kind == STEP_KERNEL) {
        if (sp->merged < 0) return JDT_OK; /* run by an earlier step's launch (merge.c) */
        const jdt_cuda_launch *L = &p->launch[sp->kernel];
        void *args[] = {&p->dtable};
        CU(cudaLaunchKernel((const void *)p->kern[sp->kernel],
                            (dim3){(unsigned)L->grid_x, (unsigned)L->grid_y, 1},
                            (dim3){(unsigned)L->block_x, (unsigned)L->block_y, 1}, args, 0,
                            p->cd->stream),
           "launching a generated kernel");
        return JDT_OK;
    }
    switch (sp->kind) {
    case STEP_COLL_PACK:
        st = coll_pack(p, sp, e);
        break;
    case STEP_COLL_START:
        st = coll_start(p, sp, e);
        break;
    case STEP_COLL_WAIT:
        st = coll_wait(p, sp, e);
        break;
    case STEP_KERNEL: /* above */
    case STEP_BUILTIN:
        st = run_builtin(p, sp, e);
        break;
    }
    if (st != JDT_OK) coll_drain(p);
    return st;
fail:
    return st;
}

static jdt_status cuda_finish(void *state, jdt_err *e)
{
    cuda_prog *p = state;
    const cprog *c = p->c;
    jdt_status st = JDT_OK;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < c->n_updates; i++) {
            const cupdate *u = &c->updates[i];
            if (u->donated || u->value == u->target) continue;
            int vb = c->nodes[u->value].buf;
            bool leaf_src = c->bufs[vb].info.kind == JDT_BUF_LEAF;
            if (leaf_src != (pass == 0)) continue;
            const cnode *t = &c->nodes[u->target];
            CU(cudaMemcpyAsync(dptr(p, u->target), p->ptrs[vb],
                               (size_t)jdt_shape_numel(&t->shape) * jdt_dtype_size(t->dtype),
                               cudaMemcpyDeviceToDevice, p->cd->stream),
               "update copy");
        }
    }
    return jdt_cuk_check(p->cd->k, "run", false, e);
fail:
    return st;
}

static jdt_status cuda_sync(void *state, jdt_err *e)
{
    cuda_prog *p = state;
    jdt_status st = settle(p->cd, e);
    if (st == JDT_OK) st = jdt_cuk_check(p->cd->k, "run", true, e);
    if (st == JDT_OK) harvest(p);
    return st;
}

/* Mark i of the step timing: an event recorded on the compute stream, behind the steps queued
 * so far (the collectives' streams join it at their waits). The events are made at the first
 * mark, n_steps + 2 of them, and timed (no cudaEventDisableTiming). */
static jdt_status cuda_mark(void *state, int i, jdt_err *e)
{
    cuda_prog *p = state;
    const int n = p->c->n_steps + 2;
    if (i < 0 || i >= n) return jdt_err_set(e, JDT_ERR_INTERNAL, "cuda: mark %d of %d", i, n);
    if (!p->marks && !(p->marks = jdt_calloc((size_t)n, sizeof *p->marks)))
        return jdt_err_set(e, JDT_ERR_NOMEM, "cuda: step timing events");
    cudaError_t rc = cudaSuccess;
    if (!p->marks[i]) rc = cudaEventCreate(&p->marks[i]);
    if (rc == cudaSuccess) rc = cudaEventRecord(p->marks[i], p->cd->stream);
    if (rc != cudaSuccess)
        return jdt_err_set(e, JDT_ERR_INTERNAL, "cuda: step timing event %d: %s", i,
                           cudaGetErrorString(rc));
    return JDT_OK;
}

static jdt_status cuda_mark_times(void *state, int n, double *sec, jdt_err *e)
{
    cuda_prog *p = state;
    if (!p->marks || n < 0 || n + 1 > p->c->n_steps + 2)
        return jdt_err_set(e, JDT_ERR_INTERNAL, "cuda: %d step times without their marks", n);
    for (int i = 0; i < n; i++) {
        float ms = 0.0f;
        cudaError_t rc = p->marks[i] && p->marks[i + 1]
                             ? cudaEventElapsedTime(&ms, p->marks[i], p->marks[i + 1])
                             : cudaErrorInvalidResourceHandle;
        if (rc != cudaSuccess)
            return jdt_err_set(e, JDT_ERR_INTERNAL, "cuda: time of step %d: %s", i,
                               cudaGetErrorString(rc));
        sec[i] = ms > 0.0f ? ms / 1e3 : 0.0;
    }
    return JDT_OK;
}

static const void *cuda_host_ptr(void *state, int node)
{
    return NULL;
}

static jdt_status cuda_read(void *state, int node, void *dst, size_t n_bytes, jdt_err *e)
{
    cuda_prog *p = state;
    jdt_status st = cuda_sync(state, e);
    if (st != JDT_OK) return st;
    const void *src = dptr(p, node);
    if (!src) return jdt_err_set(e, JDT_ERR_INVALID, "read: node %d has no value", node);
    CU(cudaMemcpy(dst, src, n_bytes, cudaMemcpyDeviceToHost), "copying an output out");
    return JDT_OK;
fail:
    return st;
}

/* vt attention_dout16_d: the tensor-core attention's head sizes on sm_80 and newer, unless
 * JDT_CUK_ATTENTION=fma (cuk.c decides as the launcher will). */
static int64_t cuda_attention_dout16_d(const jdt_device *d)
{
    return jdt_cuk_attention_dout16_d(((const cuda_dev *)d->impl)->arch);
}

static const jdt_backend_vt cuda_vt = {
    .name = "cuda",
    .arena_borrow = true,
    .bf16_storage = true,
    .wire_gathers = true,
    .reduce_stores = true,
    .bf16_builtins = true,
    .norm_bwd_scale = true,
    .gemm_accumulate = true,
    .norm_bwd_partials = JDT_CUK_NORM_PART_MAX_C,
    .gemm_gelu = true,
    .gemm_pitch = true,
    .xent_fused = true,
    .xent_inplace = true,
    .attention_copy = true,
    .attention_groups = true,
    .rope_bhtd = true,
    .attention_part_rows = JDT_CUK_ATT_PART,
    .attention_lse = true,
    .attention_dout16_d = cuda_attention_dout16_d,
    .merge_launches = true,
    .scratch_bytes = cuda_scratch_bytes,
    .prepare = cuda_prepare,
    .source = cuda_source,
    .begin = cuda_begin,
    .step = cuda_step,
    .finish = cuda_finish,
    .sync = cuda_sync,
    .mark = cuda_mark,
    .mark_times = cuda_mark_times,
    .read = cuda_read,
    .host_ptr = cuda_host_ptr,
    .release = cuda_release,
    .pull = cuda_pull,
    .push = cuda_push,
    .close = cuda_close,
    .describe = cuda_describe,
    .memory = cuda_memory,
    .comm_times = cuda_comm_times,
};

jdt_status jdt_cuda_device_open(jdt_device *d, jdt_err *e)
{
    jdt_status st = JDT_OK;
    int count = 0;
    cudaError_t ce = cudaGetDeviceCount(&count);
    if (ce != cudaSuccess || count == 0)
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED,
                           "cuda: no usable GPU: %s (nvidia-smi should list the GPU; without an "
                           "NVIDIA driver use runtime.backend: cpu)",
                           ce != cudaSuccess ? cudaGetErrorString(ce) : "no CUDA device found");
    /* SLURM's --gpus-per-task=1 (or a launcher) gives each process only its own GPU */
    if (d->index >= count && count == 1 && getenv("CUDA_VISIBLE_DEVICES")) d->index = 0;
    if (d->index < 0 || d->index >= count)
        return jdt_err_set(e, JDT_ERR_CONFIG,
                           "cuda: device %d asked (the local rank) but this host has %d GPU(s): "
                           "start at most %d process(es) per host",
                           d->index, count, count);
    cuda_dev *cd = jdt_calloc(1, sizeof *cd);
    if (!cd) return jdt_err_set(e, JDT_ERR_NOMEM, "cuda: device");
    d->impl = cd;
    d->vt = &cuda_vt;
    cd->reserve_env = reserve_from_env();
    struct cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, d->index), "cudaGetDeviceProperties");
    snprintf(cd->name, sizeof cd->name, "%s", prop.name);
    char dir[1024];
    jdt_compile_opts co;
    jdt_compile_opts_init(&co);
    if (d->cache_dir[0]) co.cache_dir = d->cache_dir;
    if ((st = jdt_compile_cache_dir(&co, dir, sizeof dir, e)) != JDT_OK) goto fail;
    if ((st = jdt_cuk_init(d->index, dir, &cd->k, e)) != JDT_OK) goto fail;
    cd->stream = (cudaStream_t)jdt_cuk_stream(cd->k);
    cd->arch = jdt_cuk_arch(cd->k);
    cd->bytes_now = cd->bytes_peak = JDT_CUK_WORKSPACE_BYTES;
    return JDT_OK;
fail:
    cuda_close(d);
    return st;
}

/* ---- ahead of time: NVRTC into the compile cache, no GPU ------------------------------------ */

/* The device of jdt_device_open_aot: what a GPU of compute capability `arch` would compile,
 * compiled now and stored under the keys its run looks up (cubin_key, the builtins' keys). */
typedef struct {
    int arch;
    unsigned cuk_done;     /* builtin sources (JDT_CUK_SRC_*) compiled or found */
    int n_built, n_cached; /* builtin sources: compiled by NVRTC, found in the cache */
    char dir[1024];        /* the compile cache */
} aot_dev;

static int64_t aot_attention_dout16_d(const jdt_device *d)
{
    return jdt_cuk_attention_dout16_d(((const aot_dev *)d->impl)->arch);
}

/* The builtin sources program c launches: the small ones always, each ATTENTION's as
 * jdt_cuk_attention picks it for this arch. */
static unsigned aot_sources(const cprog *c, int arch)
{
    unsigned src = JDT_CUK_SRC_BASE;
    for (int i = 0; i < c->n_nodes; i++) {
        const cnode *n = &c->nodes[i];
        if (n->op != JDT_OP_ATTENTION && n->op != JDT_OP_ATTENTION_BWD) continue;
        const jdt_shape *q = &c->nodes[n->in[0]].shape;
        if (q->ndim == 4) src |= jdt_cuk_attention_sources(arch, n->attrs.i[0] != 0, q->dims[3]);
    }
    return src;
}

const jdt_backend_vt *jdt_cuda_emit_only_vt(void)
{
    static jdt_backend_vt vt;
    if (!vt.prepare) {
        jdt_backend_vt v = jdt_backend_cuda_emit_only;
        v.scratch_bytes = cuda_scratch_bytes;
        vt = v;
    }
    return &vt;
}

/* The emit-only device's prepare (the program's CUDA source, the state every other call of
 * this device takes), then NVRTC into the cache as cuda_prepare would compile it. */
static jdt_status aot_prepare(jdt_device *d, const cprog *c, void **state, jdt_err *e)
{
    const jdt_backend_vt *eo = &jdt_backend_cuda_emit_only;
    aot_dev *ad = d->impl;
    jdt_status st = eo->prepare(d, c, state, e);
    if (st != JDT_OK) return st;
    const char *src = eo->source(*state);
    jdt_compile_stats *stats = (jdt_compile_stats *)&c->stats;
    unsigned char *image = NULL;
    size_t n_image = 0;
    char dir[1024]; /* the program's cache, chosen as cuda_prepare chooses it */
    jdt_compile_opts co = c->opts;
    if (d->cache_dir[0]) co.cache_dir = d->cache_dir;
    st = jdt_compile_cache_dir(&co, dir, sizeof dir, e);
    if (st == JDT_OK)
        st = cubin_get(dir, src, ad->arch, co.cache_max_bytes, &image, &n_image, stats, e);
    jdt_free(image);
    if (st == JDT_OK && !stats->cache_hit) { /* compiled now: it must have been stored */
        char kind[32];
        snprintf(kind, sizeof kind, "sm_%d.cubin", ad->arch);
        st = jdt_compile_cache_require(dir, cubin_key(src, ad->arch), kind, e);
    }
    const unsigned want = aot_sources(c, ad->arch) & ~ad->cuk_done;
    if (st == JDT_OK && want) {
        st = jdt_cuk_precompile(ad->arch, ad->dir, want, &ad->n_built, &ad->n_cached, e);
        if (st == JDT_OK) ad->cuk_done |= want;
    }
    if (st != JDT_OK) {
        eo->release(*state);
        *state = NULL;
    }
    return st;
}

static void aot_close(jdt_device *d)
{
    jdt_free(d->impl);
    d->impl = NULL;
}

static char *aot_describe(const jdt_device *d, char *buf, size_t n)
{
    const aot_dev *ad = d->impl;
    snprintf(buf, n,
             "cuda sm_%d, compiled ahead of time (no GPU used); builtin kernel sources: %d "
             "compiled, %d found in the cache %s",
             ad->arch, ad->n_built, ad->n_cached, ad->dir);
    return buf;
}

/* The emit-only device's vtable (source, and run calls that fail with ERR_UNSUPPORTED) with
 * the CUDA backend's memory plan and the compile above; filled at the first open. */
static jdt_backend_vt aot_vt;

jdt_status jdt_cuda_device_open_aot(jdt_device *d, int arch, jdt_err *e)
{
    int n_archs = 0, archs[128];
    nvrtcResult r = nvrtcGetNumSupportedArchs(&n_archs);
    if (r == NVRTC_SUCCESS && n_archs > 128) n_archs = 128;
    if (r == NVRTC_SUCCESS) r = nvrtcGetSupportedArchs(archs);
    if (r != NVRTC_SUCCESS)
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "nvrtc: supported architectures: %s",
                           nvrtcGetErrorString(r));
    bool known = false;
    char list[512] = "";
    for (int i = 0; i < n_archs; i++) {
        known |= archs[i] == arch;
        size_t at = strlen(list);
        snprintf(list + at, sizeof list - at, "%ssm_%d", i ? " " : "", archs[i]);
    }
    int major = 0, minor = 0;
    nvrtcVersion(&major, &minor);
    if (!known)
        return jdt_err_set(e, JDT_ERR_CONFIG,
                           "cuda: NVRTC %d.%d cannot compile for sm_%d; it compiles for: %s", major,
                           minor, arch, list);
    aot_dev *ad = jdt_calloc(1, sizeof *ad);
    if (!ad) return jdt_err_set(e, JDT_ERR_NOMEM, "cuda: device");
    ad->arch = arch;
    jdt_compile_opts co;
    jdt_compile_opts_init(&co);
    if (d->cache_dir[0]) co.cache_dir = d->cache_dir;
    jdt_status st = jdt_compile_cache_dir(&co, ad->dir, sizeof ad->dir, e);
    if (st != JDT_OK) {
        jdt_free(ad);
        return st;
    }
    if (!aot_vt.prepare) {
        jdt_backend_vt vt = *jdt_cuda_emit_only_vt(); /* the run's memory plan, exactly */
        vt.name = "cuda (ahead of time)";
        vt.prepare = aot_prepare;
        vt.close = aot_close;
        vt.describe = aot_describe;
        vt.attention_dout16_d = aot_attention_dout16_d; /* for the arch it compiles for */
        aot_vt = vt;
    }
    d->impl = ad;
    d->vt = &aot_vt;
    return JDT_OK;
}
