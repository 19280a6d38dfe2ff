/*
 * cpu.c — the CPU backend: generated C (emit.c) built by the system compiler into a cached
 * shared object (engine/compile/cache.c), one host arena, a pointer table with one slot per
 * buffer (leaves refreshed from the caller's tensors at every run, arena slots fixed at
 * prepare time), the hand-written kernels of engine/runtime for the builtins, and the update
 * copies that could not be donated.
 *
 * Threads: every run uses p->nt threads — the generated kernels read it from the shared
 * object's `jdt_nt`, the builtins get it as `nt`, OpenBLAS is set to it at begin. It is the
 * budget c->nt, or, with opts.adaptive_threads, what the run-time tuner (jdt_rt_tuner) picks
 * from the wall times of the previous runs, timed from begin to finish.
 */
#include "backend/cpu/cpu-impl.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"

typedef void (*kernel_fn)(void *const *);

typedef struct {
    const cprog *c;
    void *so;
    const kernel_fn *kernels; /* (n_kernels) in the shared object */
    void **ptrs;              /* (n_bufs) */
    unsigned char *arena;     /* (arena_bytes) */
    bool arena_borrowed;      /* arena is the lender's (c->arena_lender): not freed here */
    float *coll_scratch; /* (largest all-gather / reduce-scatter tensor) their permuting copy */
    void **handles;      /* (n_colls) started asynchronous collectives, NULL when not pending */
    char *src;
    int *so_nt;         /* the shared object's jdt_nt */
    int nt;             /* threads of the current run */
    bool adaptive;      /* opts.adaptive_threads with a budget above 1 */
    jdt_rt_tuner tuner; /* picks nt when adaptive */
    double t_begin;     /* jdt_now_s() at begin */
} cpu_prog;

static void *ptr_of(const cpu_prog *p, int node)
{
    int b = p->c->nodes[node].buf;
    return b >= 0 ? p->ptrs[b] : NULL;
}

static int64_t last_dim(const jdt_shape *s)
{
    return s->ndim ? s->dims[s->ndim - 1] : 1;
}

static jdt_status run_builtin(cpu_prog *p, const cstep *sp, jdt_err *e)
{
    const cprog *c = p->c;
    const cnode *n = &c->nodes[sp->node];
    int nt = p->nt;
    void *o = ptr_of(p, sp->node);
    void *in[JDT_MAX_INPUTS] = {0};
    for (int k = 0; k < n->n_in; k++)
        in[k] = ptr_of(p, n->in[k]);
    const jdt_shape *s0 = n->n_in ? &c->nodes[n->in[0]].shape : &n->shape;
    const bool in0_bf16 = n->n_in && c->nodes[n->in[0]].dtype == JDT_DTYPE_BF16; /* as stored */
    int64_t C = last_dim(s0), N = C ? jdt_shape_numel(s0) / C : 0;
    float eps = (float)n->attrs.f[0];
    float *scratch = sp->scratch_buf >= 0 ? p->ptrs[sp->scratch_buf] : NULL;
    int64_t bad = 0;
    char lbl[128];
    switch (n->op) {
    case JDT_OP_MATMUL: {
        const jdt_shape *a = s0, *b = &c->nodes[n->in[1]].shape;
        int nd = n->shape.ndim;
        int64_t M = n->shape.dims[nd - 2], Nn = n->shape.dims[nd - 1];
        int64_t K = n->attrs.i[0] ? a->dims[a->ndim - 2] : a->dims[a->ndim - 1];
        int64_t mn = M * Nn, batch = mn > 0 ? jdt_shape_numel(&n->shape) / mn : 0;
        if (n->attrs.i[2]) /* bf16 compute: scratch holds the converted inputs; a bf16 output
                              (and its bias) from passes.c fold_bf16_casts */
            jdt_rt_matmul_bf16_ex(in[0], in[1], n->n_in > 2 ? in[2] : NULL, o, batch, M, Nn, K,
                                  n->attrs.i[0] != 0, n->attrs.i[1] != 0, b->ndim == 2,
                                  c->nodes[n->in[0]].bf16, c->nodes[n->in[1]].bf16,
                                  n->dtype == JDT_DTYPE_BF16, scratch, nt);
        else
            jdt_rt_matmul(in[0], in[1], n->n_in > 2 ? in[2] : NULL, o, batch, M, Nn, K,
                          n->attrs.i[0] != 0, n->attrs.i[1] != 0, b->ndim == 2, nt);
        break;
    }
    case JDT_OP_GATHER: {
        int64_t V = s0->dims[0];
        bad = jdt_rt_gather(in[0], in[1], o, jdt_shape_numel(&c->nodes[n->in[1]].shape), V,
                            last_dim(&n->shape), nt);
        if (bad)
            return jdt_err_set(e, JDT_ERR_INVALID, "gather: %lld indices outside [0, %lld)",
                               (long long)bad, (long long)V);
        break;
    }
    case JDT_OP_SCATTER_ADD: {
        int64_t V = n->shape.dims[0];
        int64_t n_idx = jdt_shape_numel(&c->nodes[n->in[1]].shape);
        bad = n->n_in > 2 /* onto an initial value (passes.c fold_addends, scatter_takes) */
                  ? jdt_rt_scatter_add_into(in[0], in[1], in[2], o, n_idx, V, last_dim(&n->shape))
                  : jdt_rt_scatter_add(in[0], in[1], o, n_idx, V, last_dim(&n->shape));
        if (bad)
            return jdt_err_set(e, JDT_ERR_INVALID, "scatter_add: %lld indices outside [0, %lld)",
                               (long long)bad, (long long)V);
        break;
    }
    case JDT_OP_SOFTMAX:
        jdt_rt_softmax(in[0], o, N, C, nt);
        break;
    case JDT_OP_SOFTMAX_BWD:
        jdt_rt_softmax_bwd(in[0], in[1], o, N, C, nt);
        break;
    case JDT_OP_LOG_SOFTMAX:
        jdt_rt_log_softmax(in[0], o, N, C, nt);
        break;
    case JDT_OP_LOG_SOFTMAX_BWD:
        jdt_rt_log_softmax_bwd(in[0], in[1], o, N, C, nt);
        break;
    case JDT_OP_SOFTMAX_XENT: /* bf16 logits: passes.c fold_bf16_casts */
        if (n->co)            /* and the backward (passes.c fold_xent_backwards) */
            bad = jdt_rt_softmax_xent_fused(in[0], in0_bf16, in[1], (float)n->attrs.f[0], o,
                                            ptr_of(p, n->co), c->nodes[n->co].bf16, N, C, nt);
        else
            bad = jdt_rt_softmax_xent_ex(in[0], in0_bf16, in[1], o, N, C, nt);
        if (bad)
            return jdt_err_set(e, JDT_ERR_INVALID, "softmax_xent: %lld targets >= vocab %lld",
                               (long long)bad, (long long)C);
        break;
    case JDT_OP_SOFTMAX_XENT_BWD:
        /* dlogits read only by bf16 GEMMs (fuse.c mark_bf16_storage) */
        jdt_rt_softmax_xent_bwd_ex(in[0], in0_bf16, in[1], in[2], in[3], o, n->bf16, N, C, nt);
        break;
    case JDT_OP_NORMALIZE:
        jdt_rt_normalize(in[0], o, N, C, eps, nt);
        break;
    case JDT_OP_NORMALIZE_BWD:
        jdt_rt_normalize_bwd(in[0], in[1], o, N, C, eps, nt);
        break;
    case JDT_OP_RMS_NORMALIZE:
        jdt_rt_rms_normalize(in[0], o, N, C, eps, nt);
        break;
    case JDT_OP_RMS_NORMALIZE_BWD:
        jdt_rt_rms_normalize_bwd(in[0], in[1], o, N, C, eps, nt);
        break;
    case JDT_OP_ROPE: {
        double sc[4];
        jdt_rope_scaling_of(&n->attrs, sc);
        jdt_rt_rope(in[0], o, s0->dims[0], s0->dims[1], s0->dims[2], s0->dims[3], n->attrs.f[0], sc,
                    n->attrs.i[0] != 0, nt);
        break;
    }
    case JDT_OP_ATTENTION:
    case JDT_OP_ATTENTION_BWD: {
        /* inputs that are transposes folded into views (passes.c) are read (B, T, H, D) */
        unsigned bthd = 0;
        for (int k = 0; k < n->n_in; k++)
            if (c->nodes[n->in[k]].kind == CK_VIEW && c->nodes[n->in[k]].op == JDT_OP_TRANSPOSE)
                bthd |= 1u << k;
        /* bf16 q, k, v (passes.c fold_bf16_casts; all three or none: check_builtins) */
        if (in0_bf16) bthd |= JDT_RT_ATT_QKV_BF16;
        /* the forward's log-sum-exp packed after o (passes.c fold_attention_lse): stored by
         * the forward (attrs i[1]), read by the backward (attrs i[2]) */
        const int64_t no = jdt_shape_numel(s0);
        if (n->op == JDT_OP_ATTENTION)
            jdt_rt_attention(in[0], in[1], in[2], o, n->attrs.i[1] ? (float *)o + no : NULL,
                             s0->dims[0], s0->dims[1], s0->dims[2], s0->dims[3],
                             (float)n->attrs.f[0], bthd, n->attrs.i[0] != 0, scratch, nt);
        else
            jdt_rt_attention_bwd(in[0], in[1], in[2], in[3],
                                 n->attrs.i[2] ? (const float *)in[3] + no : NULL, in[4], o,
                                 s0->dims[0], s0->dims[1], s0->dims[2], s0->dims[3],
                                 (float)n->attrs.f[0], bthd, n->attrs.i[0] != 0, scratch, nt);
        break;
    }
    case JDT_OP_CONCAT: {
        int ax = (int)n->attrs.i[0];
        int64_t outer = 1, inner = 1, len[JDT_MAX_INPUTS];
        for (int k = 0; k < ax; k++)
            outer *= n->shape.dims[k];
        for (int k = ax + 1; k < n->shape.ndim; k++)
            inner *= n->shape.dims[k];
        for (int k = 0; k < n->n_in; k++)
            len[k] = c->nodes[n->in[k]].shape.dims[ax];
        jdt_rt_concat((const float *const *)in, len, n->n_in, o, outer, inner,
                      jdt_dtype_size(n->dtype));
        break;
    }
    case JDT_OP_ALL_REDUCE: {
        int64_t n_el = jdt_shape_numel(&n->shape);
        if (o != in[0]) memcpy(o, in[0], (size_t)n_el * sizeof(float));
        jdt_status cst = c->opts.collective(c->opts.collective_ctx, (int)n->attrs.i[0],
                                            (int)n->attrs.i[1], JDT_DTYPE_F32, o, (size_t)n_el, e);
        if (cst != JDT_OK) return cst;
        if (n->attrs.f[0] != 1.0) {
            float sc = (float)n->attrs.f[0], *of = o;
            for (int64_t i = 0; i < n_el; i++)
                of[i] *= sc;
        }
        break;
    }
    case JDT_OP_ALL_GATHER:
    case JDT_OP_REDUCE_SCATTER: {
        /* the full tensor viewed as (outer, k, blk) along the axis; the wire wants (k, outer,
         * blk): one permuting copy unless everything before the axis has size 1. A gather is a
         * byte copy of any element size (bf16: FSDP's weight copies); a scatter sums f32 */
        const bool gather = n->op == JDT_OP_ALL_GATHER;
        const jdt_shape *full = gather ? &n->shape : s0;
        const int ax = (int)n->attrs.i[1];
        const int64_t k = n->attrs.i[2], nf = jdt_shape_numel(full), nl = nf / k;
        int64_t outer = 1;
        for (int d = 0; d < ax; d++)
            outer *= full->dims[d];
        const int64_t blk = outer ? nl / outer : 0;
        float *tmp = p->coll_scratch, *of = o;
        const float *xf = in[0];
        jdt_status cst;
        if (gather) {
            const size_t esz = jdt_dtype_size(n->dtype);
            memmove(o, in[0], (size_t)nl * esz);
            cst = c->opts.collective(c->opts.collective_ctx, (int)n->attrs.i[0], JDT_COLL_ALLGATHER,
                                     n->dtype, o, (size_t)nf, e);
            if (cst == JDT_OK && outer > 1) {
                memcpy(tmp, o, (size_t)nf * esz);
                jdt_permute_blocks_bytes(tmp, o, k, outer, blk * (int64_t)esz, true);
            }
        } else {
            if (outer > 1)
                jdt_permute_blocks_f32(xf, tmp, k, outer, blk, false);
            else
                memcpy(tmp, xf, (size_t)nf * sizeof *tmp);
            cst = c->opts.collective(c->opts.collective_ctx, (int)n->attrs.i[0],
                                     JDT_COLL_REDUCE_SCATTER, JDT_DTYPE_F32, tmp, (size_t)nf, e);
            const float sc = (float)n->attrs.f[0];
            for (int64_t i = 0; i < nl && cst == JDT_OK; i++)
                of[i] = tmp[i] * sc;
        }
        if (cst != JDT_OK) return cst;
        break;
    }
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
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "run: no CPU kernel for %s",
                           jdt_compile_node_label(n, lbl, sizeof lbl));
    }
    return JDT_OK;
}

/* ---- asynchronous collectives (STEP_COLL_*, see compile-impl.h) ---------------------------- */

/* The (outer, k, blk) view of an all-gather / reduce-scatter's full tensor along its axis. */
static void coll_dims(const cprog *c, const cnode *n, int64_t *k, int64_t *nf, int64_t *outer,
                      int64_t *blk)
{
    *k = n->attrs.i[2];
    *nf = jdt_shape_numel(jdt_coll_full(c, n));
    *outer = jdt_coll_outer(c, n);
    *blk = *outer ? *nf / *k / *outer : 0;
}

/* The parts of an (outer, k, blk) tensor x to or from a wire buffer of k segments of seg values:
 * part r (x's blocks (o, r, :) for every o) at part_off in segment r (compile-impl.h, ccoll).
 * Sizes count elements of esz bytes (4; a bf16 gather's 2). */
static void wire_put(const void *x, void *wire, int64_t k, int64_t outer, int64_t blk, int64_t seg,
                     int64_t part_off, int64_t esz)
{
    const char *xs = x;
    char *ws = wire;
    for (int64_t r = 0; r < k; r++)
        for (int64_t o = 0; o < outer; o++)
            memcpy(ws + (r * seg + part_off + o * blk) * esz, xs + ((o * k + r) * blk) * esz,
                   (size_t)(blk * esz));
}

static void wire_get(void *x, const void *wire, int64_t k, int64_t outer, int64_t blk, int64_t seg,
                     int64_t part_off, int64_t esz)
{
    char *xs = x;
    const char *ws = wire;
    for (int64_t r = 0; r < k; r++)
        for (int64_t o = 0; o < outer; o++)
            memcpy(xs + ((o * k + r) * blk) * esz, ws + (r * seg + part_off + o * blk) * esz,
                   (size_t)(blk * esz));
}

/* PACK: the member's input into the buffer the collective runs on. */
static void coll_pack(cpu_prog *p, const cstep *sp)
{
    const cprog *c = p->c;
    const ccoll *cl = &c->colls[sp->coll];
    const cnode *n = &c->nodes[sp->node];
    const float *x = ptr_of(p, n->in[0]);
    float *o = ptr_of(p, sp->node);
    if (n->op == JDT_OP_ALL_REDUCE) {
        if (o != x) memcpy(o, x, (size_t)jdt_shape_numel(&n->shape) * sizeof(float));
        return;
    }
    int64_t k, nf, outer, blk;
    coll_dims(c, n, &k, &nf, &outer, &blk);
    const int64_t esz = cl->esz;
    if (cl->scratch_buf < 0) { /* a lone all-gather: its part first in its own output */
        memmove(o, x, (size_t)(nf / k * esz));
        return;
    }
    char *wire = p->ptrs[cl->scratch_buf];
    const int64_t off = cl->part_off[jdt_ccoll_member(cl, sp->node)];
    if (n->op == JDT_OP_ALL_GATHER) /* this member's part of the call comes first */
        memcpy(wire + off * esz, x, (size_t)(nf / k * esz));
    else
        wire_put(x, wire, k, outer, blk, jdt_ccoll_seg(cl, k), off, esz);
}

static jdt_status coll_start(cpu_prog *p, const cstep *sp, jdt_err *e)
{
    const cprog *c = p->c;
    const ccoll *cl = &c->colls[sp->coll];
    const cnode *n = &c->nodes[cl->members[0]];
    void *buf = cl->buf >= 0           ? p->ptrs[cl->buf]
                : cl->scratch_buf >= 0 ? p->ptrs[cl->scratch_buf]
                                       : ptr_of(p, cl->members[0]);
    const int kind = n->op == JDT_OP_ALL_REDUCE   ? (int)n->attrs.i[1]
                     : n->op == JDT_OP_ALL_GATHER ? JDT_COLL_ALLGATHER
                                                  : JDT_COLL_REDUCE_SCATTER;
    if (cl->inline_run) /* waited for right away: blocking saves the thread hand-offs */
        return c->opts.collective(c->opts.collective_ctx, (int)n->attrs.i[0], kind, n->dtype, buf,
                                  (size_t)cl->n_elems, e);
    return c->opts.collective_start(c->opts.collective_ctx, (int)n->attrs.i[0], kind, n->dtype, buf,
                                    (size_t)cl->n_elems, &p->handles[sp->coll], e);
}

/* WAIT: the collective, then each member's finish (scale, unpermute, the scattered part). */
static jdt_status coll_wait(cpu_prog *p, const cstep *sp, jdt_err *e)
{
    const cprog *c = p->c;
    const ccoll *cl = &c->colls[sp->coll];
    void *h = p->handles[sp->coll];
    p->handles[sp->coll] = NULL;
    jdt_status st = cl->inline_run ? JDT_OK : c->opts.collective_wait(c->opts.collective_ctx, h, e);
    if (st != JDT_OK) return st;
    for (int m = 0; m < cl->n_members; m++) {
        const cnode *n = &c->nodes[cl->members[m]];
        float *o = ptr_of(p, cl->members[m]);
        const float sc = (float)n->attrs.f[0];
        int64_t k, nf, outer, blk;
        if (n->op == JDT_OP_ALL_REDUCE) {
            const int64_t n_el = jdt_shape_numel(&n->shape);
            for (int64_t i = 0; sc != 1.0f && i < n_el; i++)
                o[i] *= sc;
            continue;
        }
        coll_dims(c, n, &k, &nf, &outer, &blk);
        float *wire = cl->scratch_buf >= 0 ? p->ptrs[cl->scratch_buf] : NULL;
        const int64_t esz = cl->esz;
        if (n->op == JDT_OP_ALL_GATHER && wire) {
            wire_get(o, wire, k, outer, blk, jdt_ccoll_seg(cl, k), cl->part_off[m], esz);
        } else if (n->op == JDT_OP_ALL_GATHER) {
            if (outer > 1) {
                memcpy(p->coll_scratch, o, (size_t)(nf * esz));
                jdt_permute_blocks_bytes(p->coll_scratch, o, k, outer, blk * esz, true);
            }
        } else { /* this member's segment, moved to the front by collective_wait */
            const float *part = wire + cl->part_off[m];
            for (int64_t i = 0; i < nf / k; i++)
                o[i] = part[i] * sc;
        }
    }
    return JDT_OK;
}

/* Waits for every collective still pending (after a failed step: each started one must be
 * waited once); their statuses are dropped, the failure that stopped the run is reported. */
static void coll_drain(cpu_prog *p)
{
    for (int k = 0; k < p->c->n_colls && p->handles; k++) {
        if (!p->handles[k]) continue;
        jdt_err ignored;
        jdt_err_clear(&ignored);
        p->c->opts.collective_wait(p->c->opts.collective_ctx, p->handles[k], &ignored);
        p->handles[k] = NULL;
    }
}

static void cpu_release(void *state)
{
    cpu_prog *p = state;
    if (!p) return;
    coll_drain(p);
    jdt_free(p->handles);
    jdt_free(p->ptrs);
    if (!p->arena_borrowed) jdt_free_aligned(p->arena);
    jdt_free(p->coll_scratch);
    jdt_free(p->src);
    if (p->so) dlclose(p->so);
    jdt_free(p);
}

static jdt_status cpu_prepare(jdt_device *d, const cprog *c, void **state, jdt_err *e)
{
    jdt_status st;
    *state = NULL;
    cpu_prog *p = jdt_calloc(1, sizeof *p);
    if (!p) return jdt_err_set(e, JDT_ERR_NOMEM, "compile: program");
    p->c = c;
    jdt_compile_stats *stats = (jdt_compile_stats *)&c->stats;
    if ((st = jdt_cpu_codegen(c, &p->src, e)) != JDT_OK) goto fail;
    if ((st = jdt_compile_build(&c->opts, p->src, &p->so, stats, e)) != JDT_OK) goto fail;
    p->kernels = dlsym(p->so, "jdt_kernels");
    const int *nk = dlsym(p->so, "jdt_n_kernels");
    if (!p->kernels || !nk || *nk != c->stats.n_kernels) {
        st = jdt_err_set(e, JDT_ERR_COMPILE, "compile: %s lacks the expected kernel table",
                         c->stats.so_path);
        goto fail;
    }
    /* the exact plan, checked before allocating it: a clear refusal, not a failed malloc or
     * the OOM killer later */
    if (!c->arena_lender && (st = jdt_compile_check_arena(c->arena_bytes, e)) != JDT_OK) goto fail;
    int64_t need = 0; /* the collectives' permuting scratch */
    for (int i = 0; i < c->n_nodes; i++) {
        const cnode *n = &c->nodes[i];
        const int64_t full = n->op == JDT_OP_ALL_GATHER ? jdt_shape_numel(&n->shape)
                             : n->op == JDT_OP_REDUCE_SCATTER
                                 ? jdt_shape_numel(&c->nodes[n->in[0]].shape)
                                 : 0;
        if (full > need) need = full;
    }
    if (need > 0 && !(p->coll_scratch = jdt_malloc((size_t)need * sizeof(float)))) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "compile: collective scratch");
        goto fail;
    }
    if (c->arena_lender) { /* program.c checked: same CPU device, large enough */
        p->arena = ((const cpu_prog *)c->arena_lender)->arena;
        p->arena_borrowed = true;
    } else {
        p->arena = jdt_malloc_aligned((size_t)(c->arena_bytes ? c->arena_bytes : 64));
    }
    p->ptrs = jdt_calloc((size_t)c->n_bufs + 1, sizeof(void *));
    p->handles = jdt_calloc((size_t)c->n_colls + 1, sizeof(void *));
    if (!p->arena || !p->ptrs || !p->handles) {
        st = jdt_err_set(e, JDT_ERR_NOMEM,
                         "compile: out of memory allocating the %.1f MiB arena for intermediates",
                         (double)c->arena_bytes / 1048576.0);
        goto fail;
    }
    for (int b = 0; b < c->n_bufs; b++)
        if (c->bufs[b].info.kind == JDT_BUF_ARENA && c->bufs[b].info.offset >= 0)
            p->ptrs[b] = p->arena + c->bufs[b].info.offset;
    if (!(p->so_nt = dlsym(p->so, "jdt_nt"))) {
        st = jdt_err_set(e, JDT_ERR_COMPILE, "compile: %s lacks jdt_nt", c->stats.so_path);
        goto fail;
    }
    p->nt = c->nt;
    p->adaptive = c->opts.adaptive_threads && c->nt > 1;
    /* JDT_THREAD_PROBE_EVERY=N: probe every N runs from the start (tests, debugging) */
    const char *pe = getenv("JDT_THREAD_PROBE_EVERY");
    long probe_every = pe && *pe ? strtol(pe, NULL, 10) : 0;
    jdt_rt_tuner_init(&p->tuner, c->nt,
                      probe_every > 0 && probe_every < INT_MAX ? (int)probe_every : 0);
    jdt_rt_set_threads(c->nt);
    *state = p;
    return JDT_OK;
fail:
    cpu_release(p);
    return st;
}

static const char *cpu_source(const void *state)
{
    return ((const cpu_prog *)state)->src;
}

static jdt_status cpu_begin(void *state, jdt_err *e)
{
    cpu_prog *p = state;
    const cprog *c = p->c;
    char lbl[128];
    for (int b = 0; b < c->n_bufs; b++) {
        if (c->bufs[b].info.kind != JDT_BUF_LEAF) continue;
        const cnode *n = &c->nodes[c->bufs[b].leaf_node];
        p->ptrs[b] = n->src->data;
        if (!p->ptrs[b])
            return jdt_err_set(e, JDT_ERR_INVALID, "run: leaf %s is not bound (data is NULL)",
                               jdt_compile_node_label(n, lbl, sizeof lbl));
    }
    p->nt = p->adaptive ? jdt_rt_tuner_threads(&p->tuner) : c->nt;
    *p->so_nt = p->nt;
    /* OpenBLAS's thread count is process-wide: another program may have changed it */
    jdt_rt_set_threads(p->nt);
    p->t_begin = jdt_now_s();
    return JDT_OK;
}

static bool cpu_trial(const void *state)
{
    const cpu_prog *p = state;
    return p->adaptive && p->nt != p->tuner.chosen;
}

static jdt_status cpu_step(void *state, int s, jdt_err *e)
{
    cpu_prog *p = state;
    const cstep *sp = &p->c->steps[s];
    if (sp->kind == STEP_KERNEL) {
        p->kernels[sp->kernel]((void *const *)p->ptrs);
        return JDT_OK;
    }
    jdt_status st = JDT_OK;
    switch (sp->kind) {
    case STEP_COLL_PACK:
        coll_pack(p, sp);
        break;
    case STEP_COLL_START:
        st = coll_start(p, sp, e);
        break;
    case STEP_COLL_WAIT:
        st = coll_wait(p, sp, e);
        break;
    case STEP_KERNEL: /* handled above */
    case STEP_BUILTIN:
        st = run_builtin(p, sp, e);
        break;
    }
    if (st != JDT_OK) coll_drain(p);
    return st;
}

static jdt_status cpu_finish(void *state, jdt_err *e)
{
    cpu_prog *p = state;
    const cprog *c = p->c;
    /* updates not donated: leaf-sourced values first (they read old leaf memory) */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < c->n_updates; i++) {
            const cupdate *u = &c->updates[i];
            if (u->donated || u->value == u->target) continue;
            int vb = c->nodes[u->value].buf;
            bool leaf_src = c->bufs[vb].info.kind == JDT_BUF_LEAF;
            if (leaf_src != (pass == 0)) continue;
            const cnode *t = &c->nodes[u->target];
            memmove(ptr_of(p, u->target), p->ptrs[vb],
                    (size_t)jdt_shape_numel(&t->shape) * jdt_dtype_size(t->dtype));
        }
    }
    if (p->adaptive) {
        jdt_rt_tuner *t = &p->tuner;
        int probes = t->n_probes;
        bool was_probing = t->probing;
        if (jdt_rt_tuner_record(t, jdt_now_s() - p->t_begin))
            JDT_INFO("threads: %d instead of %d from run %d on (%.1f vs %.1f ms per run; "
                     "runtime.adaptive_threads: false keeps %d)",
                     t->chosen, t->chosen == 1 ? c->nt : 1, t->n_runs + 1, 1e3 * t->last_probe_s,
                     1e3 * t->last_base_s, c->nt);
        else if (was_probing && !t->probing)
            JDT_DEBUG("threads: keeping %d (%.1f vs %.1f ms per run with %d)", t->chosen,
                      1e3 * t->last_base_s, 1e3 * t->last_probe_s, t->chosen == 1 ? c->nt : 1);
        if (t->n_probes != probes)
            JDT_DEBUG("threads: run %d probes %d threads against %d", t->n_runs + 1,
                      jdt_rt_tuner_threads(t), t->chosen);
    }
    return JDT_OK;
}

static jdt_status cpu_sync(void *state, jdt_err *e)
{
    return JDT_OK;
}

static const void *cpu_host_ptr(void *state, int node)
{
    cpu_prog *p = state;
    if (p->c->nodes[node].kind == CK_LEAF) return p->c->nodes[node].src->data;
    return ptr_of(p, node);
}

static jdt_status cpu_read(void *state, int node, void *dst, size_t n_bytes, jdt_err *e)
{
    const void *src = cpu_host_ptr(state, node);
    if (!src) return jdt_err_set(e, JDT_ERR_INVALID, "read: node %d has no value", node);
    memcpy(dst, src, n_bytes);
    return JDT_OK;
}

const jdt_backend_vt jdt_backend_cpu = {
    .name = "cpu",
    .xent_inplace = true,
    .arena_borrow = true,
    .reduce_stores = true,
    .attention_lse = true,
    .gemm_bf16_out = true,
    .attention_bf16_qkv = true,
    .xent_bf16_logits = true,
    .xent_fused = true,
    .prepare = cpu_prepare,
    .source = cpu_source,
    .begin = cpu_begin,
    .trial = cpu_trial,
    .step = cpu_step,
    .finish = cpu_finish,
    .sync = cpu_sync,
    .read = cpu_read,
    .host_ptr = cpu_host_ptr,
    .release = cpu_release,
};
