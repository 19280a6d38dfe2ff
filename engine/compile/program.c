/*
 * program.c — jdt_program: drives the compiler pipeline (passes, fusion, plan, codegen,
 * build/load) and runs the result: a pointer table with one slot per buffer (leaves refreshed
 * from the caller's tensors at every run, arena slots fixed at compile time), then every step
 * in schedule order, then the update copies that could not be donated.
 */
#include "compile/compile-impl.h"

#include <dlfcn.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "graph/interp.h"
#include "runtime/runtime.h"

typedef void (*kernel_fn)(void *const *);

struct jdt_program {
    cprog c;
    jdt_graph *g;
    void *so;
    const kernel_fn *kernels; /* (n_kernels) in the shared object */
    void **ptrs;              /* (n_bufs) */
    unsigned char *arena;     /* (arena_bytes) */
    char *src;
    jdt_interp *interp; /* opts.no_jit: the reference interpreter runs the graph */
    double *step_s;     /* (n_steps + 1) accumulated seconds per step (profile), last:
                           update copies */
    char (*step_name)[40]; /* (n_steps) trace names, only with opts.trace */
    int n_runs;
    float *coll_scratch;      /* (largest all-gather / reduce-scatter buffer) for their
                                 block permutation, so a run allocates nothing */
};

void jdt_compile_opts_init(jdt_compile_opts *o)
{
    memset(o, 0, sizeof *o);
}

static const char *node_label(const cnode *n, char *buf, size_t len)
{
    if (n->src && n->src->name)
        snprintf(buf, len, "'%s'", n->src->name);
    else if (n->src)
        snprintf(buf, len, "node %d (%s)", n->src->id, jdt_op_name(n->op));
    else
        snprintf(buf, len, "%s", jdt_op_name(n->op));
    return buf;
}

/* Builtins compute in f32 (indices i32); anything else has no CPU kernel. */
static jdt_status check_builtins(const cprog *c, jdt_err *e)
{
    for (int i = 0; i < c->n_nodes; i++) {
        const cnode *n = &c->nodes[i];
        if (n->kind != CK_BUILTIN || n->op == JDT_OP_CONCAT) continue;
        bool ok = n->dtype == JDT_DTYPE_F32;
        for (int k = 0; k < n->n_in; k++) {
            bool idx = (n->op == JDT_OP_GATHER || n->op == JDT_OP_SCATTER_ADD ||
                        n->op == JDT_OP_SOFTMAX_XENT || n->op == JDT_OP_SOFTMAX_XENT_BWD) &&
                       k == 1;
            ok = ok && c->nodes[n->in[k]].dtype == (idx ? JDT_DTYPE_I32 : JDT_DTYPE_F32);
        }
        if (n->op == JDT_OP_ROPE && (n->shape.ndim != 4 || n->shape.dims[3] % 2)) ok = false;
        if ((n->op == JDT_OP_ALL_REDUCE || n->op == JDT_OP_ALL_GATHER ||
             n->op == JDT_OP_REDUCE_SCATTER) && !c->opts.collective)
            return jdt_err_set(e, JDT_ERR_UNSUPPORTED,
                               "compile: %s needs a communicator (opts.collective)",
                               jdt_op_name(n->op));
        if (n->op == JDT_OP_ATTENTION || n->op == JDT_OP_ATTENTION_BWD)
            ok = ok && c->nodes[n->in[0]].shape.ndim == 4;
        if (!ok)
            return jdt_err_set(e, JDT_ERR_UNSUPPORTED,
                               "compile: %s (dtype %s, rank %d) has no CPU kernel for these "
                               "dtypes/shapes",
                               jdt_op_name(n->op), jdt_dtype_name(n->dtype), n->shape.ndim);
    }
    return JDT_OK;
}

static double node_flops(const cprog *c, const cnode *n)
{
    double numel = (double)jdt_shape_numel(&n->shape);
    switch (n->op) {
    case JDT_OP_MATMUL: {
        const cnode *a = &c->nodes[n->in[0]];
        int nd = a->shape.ndim;
        double K = (double)(n->attrs.i[0] ? a->shape.dims[nd - 2] : a->shape.dims[nd - 1]);
        return 2.0 * numel * K;
    }
    case JDT_OP_ATTENTION:
    case JDT_OP_ATTENTION_BWD: {
        const jdt_shape *q = &c->nodes[n->in[0]].shape;
        double pairs = (double)q->dims[2] * (double)(q->dims[2] + 1) / 2.0;
        double f = 4.0 * (double)(q->dims[0] * q->dims[1] * q->dims[3]) * pairs;
        return n->op == JDT_OP_ATTENTION ? f : 2.5 * f;
    }
    default:
        break;
    }
    if (n->kind == CK_LEAF || n->kind == CK_SPLAT || n->kind == CK_VIEW) return 0.0;
    if (n->kind == CK_REDUCE) return (double)jdt_shape_numel(&c->nodes[n->in[0]].shape);
    if (n->kind == CK_BUILTIN) return 5.0 * numel;
    return numel;
}

jdt_status jdt_program_compile(jdt_graph *g, const jdt_compile_opts *opts, jdt_program **out,
                               jdt_err *e)
{
    double t0 = jdt_now_s();
    jdt_status st;
    *out = NULL;
    if (!g) return jdt_err_set(e, JDT_ERR_INVALID, "compile: NULL graph");
    jdt_program *p = jdt_calloc(1, sizeof *p);
    if (!p) return jdt_err_set(e, JDT_ERR_NOMEM, "compile: program");
    cprog *c = &p->c;
    p->g = g;
    if (opts) c->opts = *opts;
    c->nt = c->opts.threads > 0 ? c->opts.threads : omp_get_max_threads();
    if (c->nt < 1) c->nt = 1;

    if (c->opts.no_jit) {
        if ((st = jdt_interp_new(g, &p->interp, e)) != JDT_OK) goto fail;
        jdt_interp_set_collective(p->interp, c->opts.collective, c->opts.collective_ctx);
        c->stats.n_ops_in = c->stats.n_ops_out = jdt_graph_n_nodes(g);
        c->stats.compile_s = jdt_now_s() - t0;
        snprintf(c->stats.so_path, sizeof c->stats.so_path, "(interpreter)");
        *out = p;
        return JDT_OK;
    }
    if ((st = jdt_compile_lower(c, g, e)) != JDT_OK) goto fail;
    if ((st = check_builtins(c, e)) != JDT_OK) goto fail;
    if (!c->opts.plan_only) {
        int64_t need = 0;
        for (int i = 0; i < c->n_nodes; i++) {
            const cnode *n = &c->nodes[i];
            const int64_t full = n->op == JDT_OP_ALL_GATHER      ? jdt_shape_numel(&n->shape)
                                 : n->op == JDT_OP_REDUCE_SCATTER ? jdt_shape_numel(&c->nodes[n->in[0]].shape)
                                                                  : 0;
            if (full > need) need = full;
        }
        if (need > 0 && !(p->coll_scratch = jdt_malloc((size_t)need * sizeof(float)))) {
            st = jdt_err_set(e, JDT_ERR_NOMEM, "compile: collective scratch");
            goto fail;
        }
    }
    if ((st = jdt_compile_fuse(c, e)) != JDT_OK) goto fail;
    if ((st = jdt_compile_plan(c, e)) != JDT_OK) goto fail;
    for (int i = 0; i < c->n_nodes; i++)
        c->stats.flops_per_step += node_flops(c, &c->nodes[i]);
    if (c->opts.plan_only) { /* shapes and sizes only: no code, no compiler, no arena */
        c->stats.compile_s = jdt_now_s() - t0;
        snprintf(c->stats.so_path, sizeof c->stats.so_path, "(planned only)");
        *out = p;
        return JDT_OK;
    }
    if ((st = jdt_compile_codegen(c, &p->src, e)) != JDT_OK) goto fail;
    if ((st = jdt_compile_build(&c->opts, p->src, &p->so, &c->stats, e)) != JDT_OK) goto fail;
    p->kernels = dlsym(p->so, "jdt_kernels");
    const int *nk = dlsym(p->so, "jdt_n_kernels");
    if (!p->kernels || !nk || *nk != c->stats.n_kernels) {
        st = jdt_err_set(e, JDT_ERR_COMPILE, "compile: %s lacks the expected kernel table",
                         c->stats.so_path);
        goto fail;
    }
    if (c->opts.profile && !(p->step_s = jdt_calloc((size_t)c->n_steps + 1, sizeof(double)))) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "compile: profile counters");
        goto fail;
    }
    if (c->opts.trace) {
        if (!(p->step_name = jdt_calloc((size_t)c->n_steps + 1, sizeof *p->step_name))) {
            st = jdt_err_set(e, JDT_ERR_NOMEM, "compile: trace names");
            goto fail;
        }
        for (int s = 0; s < c->n_steps; s++) {
            const cstep *sp = &c->steps[s];
            if (sp->kind == STEP_KERNEL)
                snprintf(p->step_name[s], sizeof p->step_name[s], "fused:%s",
                         jdt_op_name(c->nodes[c->groups[sp->group].root].op));
            else
                snprintf(p->step_name[s], sizeof p->step_name[s], "%s",
                         jdt_op_name(c->nodes[sp->node].op));
        }
    }
    /* the exact plan, checked before allocating it: a clear refusal, not a failed malloc or
     * the OOM killer later */
    if ((st = jdt_compile_check_arena(c->arena_bytes, e)) != JDT_OK) goto fail;
    p->arena = jdt_malloc_aligned((size_t)(c->arena_bytes ? c->arena_bytes : 64));
    p->ptrs = jdt_calloc((size_t)c->n_bufs + 1, sizeof(void *));
    if (!p->arena || !p->ptrs) {
        st = jdt_err_set(e, JDT_ERR_NOMEM,
                         "compile: out of memory allocating the %.1f MiB arena for intermediates",
                         (double)c->arena_bytes / 1048576.0);
        goto fail;
    }
    for (int b = 0; b < c->n_bufs; b++)
        if (c->bufs[b].info.kind == JDT_BUF_ARENA && c->bufs[b].info.offset >= 0)
            p->ptrs[b] = p->arena + c->bufs[b].info.offset;
    jdt_rt_set_threads(c->nt);
    c->stats.compile_s = jdt_now_s() - t0;
    *out = p;
    return JDT_OK;
fail:
    jdt_program_free(p);
    return st;
}

static void *ptr_of(const jdt_program *p, int node)
{
    int b = p->c.nodes[node].buf;
    return b >= 0 ? p->ptrs[b] : NULL;
}

static int64_t last_dim(const jdt_shape *s)
{
    return s->ndim ? s->dims[s->ndim - 1] : 1;
}


/* Moves k blocks between the layouts (k, outer, blk) and (outer, k, blk): to_outer true:
 * (k, outer, blk) -> (outer, k, blk), else the inverse. dst != src. */
static void shard_permute(const float *src, float *dst, int64_t k, int64_t outer, int64_t blk,
                          bool to_outer)
{
    for (int64_t j = 0; j < k; j++)
        for (int64_t o = 0; o < outer; o++) {
            const float *a = to_outer ? src + (j * outer + o) * blk : src + (o * k + j) * blk;
            float *b = to_outer ? dst + (o * k + j) * blk : dst + (j * outer + o) * blk;
            memcpy(b, a, (size_t)blk * sizeof *a);
        }
}

static jdt_status run_builtin(jdt_program *p, const cstep *sp, jdt_err *e)
{
    const cprog *c = &p->c;
    const cnode *n = &c->nodes[sp->node];
    int nt = c->nt;
    void *o = ptr_of(p, sp->node);
    void *in[JDT_MAX_INPUTS] = {0};
    for (int k = 0; k < n->n_in; k++)
        in[k] = ptr_of(p, n->in[k]);
    const jdt_shape *s0 = n->n_in ? &c->nodes[n->in[0]].shape : &n->shape;
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
        jdt_rt_matmul(in[0], in[1], n->n_in > 2 ? in[2] : NULL, o, batch, M, Nn, K,
                      n->attrs.i[0] != 0, n->attrs.i[1] != 0, b->ndim == 2);
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
        bad = jdt_rt_scatter_add(in[0], in[1], o, jdt_shape_numel(&c->nodes[n->in[1]].shape), V,
                                 last_dim(&n->shape));
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
    case JDT_OP_SOFTMAX_XENT:
        bad = jdt_rt_softmax_xent(in[0], in[1], o, N, C, nt);
        if (bad)
            return jdt_err_set(e, JDT_ERR_INVALID, "softmax_xent: %lld targets >= vocab %lld",
                               (long long)bad, (long long)C);
        break;
    case JDT_OP_SOFTMAX_XENT_BWD:
        jdt_rt_softmax_xent_bwd(in[0], in[1], in[2], o, N, C, nt);
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
    case JDT_OP_ROPE:
        jdt_rt_rope(in[0], o, s0->dims[0], s0->dims[1], s0->dims[2], s0->dims[3], n->attrs.f[0],
                    n->attrs.i[0] != 0, nt);
        break;
    case JDT_OP_ATTENTION:
    case JDT_OP_ATTENTION_BWD: {
        /* inputs that are transposes folded into views (passes.c) are read (B, T, H, D) */
        unsigned bthd = 0;
        for (int k = 0; k < n->n_in; k++)
            if (c->nodes[n->in[k]].kind == CK_VIEW && c->nodes[n->in[k]].op == JDT_OP_TRANSPOSE)
                bthd |= 1u << k;
        if (n->op == JDT_OP_ATTENTION)
            jdt_rt_attention(in[0], in[1], in[2], o, s0->dims[0], s0->dims[1], s0->dims[2],
                             s0->dims[3], (float)n->attrs.f[0], bthd, scratch, nt);
        else
            jdt_rt_attention_bwd(in[0], in[1], in[2], in[3], in[4], o, s0->dims[0], s0->dims[1],
                                 s0->dims[2], s0->dims[3], (float)n->attrs.f[0], bthd, scratch,
                                 nt);
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
            for (int64_t i = 0; i < n_el; i++) of[i] *= sc;
        }
        break;
    }
    case JDT_OP_ALL_GATHER:
    case JDT_OP_REDUCE_SCATTER: {
        /* the full tensor viewed as (outer, k, blk) along the axis; the wire wants (k, outer,
         * blk): one permuting copy unless everything before the axis has size 1 */
        const bool gather = n->op == JDT_OP_ALL_GATHER;
        const jdt_shape *full = gather ? &n->shape : s0;
        const int ax = (int)n->attrs.i[1];
        const int64_t k = n->attrs.i[2], nf = jdt_shape_numel(full), nl = nf / k;
        int64_t outer = 1;
        for (int d = 0; d < ax; d++) outer *= full->dims[d];
        const int64_t blk = outer ? nl / outer : 0;
        float *tmp = p->coll_scratch, *of = o;
        const float *xf = in[0];
        jdt_status cst;
        if (gather) {
            memmove(of, xf, (size_t)nl * sizeof *of);
            cst = c->opts.collective(c->opts.collective_ctx, (int)n->attrs.i[0], JDT_COLL_ALLGATHER,
                                     JDT_DTYPE_F32, of, (size_t)nf, e);
            if (cst == JDT_OK && outer > 1) {
                memcpy(tmp, of, (size_t)nf * sizeof *tmp);
                shard_permute(tmp, of, k, outer, blk, true);
            }
        } else {
            if (outer > 1) shard_permute(xf, tmp, k, outer, blk, false);
            else memcpy(tmp, xf, (size_t)nf * sizeof *tmp);
            cst = c->opts.collective(c->opts.collective_ctx, (int)n->attrs.i[0],
                                     JDT_COLL_REDUCE_SCATTER, JDT_DTYPE_F32, tmp, (size_t)nf, e);
            const float sc = (float)n->attrs.f[0];
            for (int64_t i = 0; i < nl && cst == JDT_OK; i++) of[i] = tmp[i] * sc;
        }
        if (cst != JDT_OK) return cst;
        break;
    }
    default:
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "run: no CPU kernel for %s",
                           node_label(n, lbl, sizeof lbl));
    }
    return JDT_OK;
}

jdt_status jdt_compile_check_arena(int64_t n_bytes, jdt_err *e)
{
    const char *mem_src;
    int64_t mem_avail = jdt_mem_available(&mem_src);
    if (mem_avail < 0 || n_bytes <= mem_avail) return JDT_OK;
    return jdt_err_set(e, JDT_ERR_NOMEM,
                       "compile: the plan needs %.1f MiB for intermediates but %.1f MiB is "
                       "available (%s): use a smaller data.micro_batch_size or model.seq_len, "
                       "or runtime.remat: block",
                       (double)n_bytes / 1048576.0, (double)mem_avail / 1048576.0, mem_src);
}

jdt_status jdt_program_run(jdt_program *p, jdt_err *e)
{
    cprog *c = &p->c;
    char lbl[128];
    if (p->interp) return jdt_interp_run(p->interp, e);
    if (!p->so)
        return jdt_err_set(e, JDT_ERR_INVALID, "run: the program was planned only (opts.plan_only)");
    for (int b = 0; b < c->n_bufs; b++) {
        if (c->bufs[b].info.kind != JDT_BUF_LEAF) continue;
        const cnode *n = &c->nodes[c->bufs[b].leaf_node];
        p->ptrs[b] = n->src->data;
        if (!p->ptrs[b])
            return jdt_err_set(e, JDT_ERR_INVALID, "run: leaf %s is not bound (data is NULL)",
                               node_label(n, lbl, sizeof lbl));
    }
    /* OpenBLAS's thread count is process-wide: another program may have changed it */
    jdt_rt_set_threads(c->nt);
    bool timed = p->step_s || c->opts.trace;
    for (int s = 0; s < c->n_steps; s++) {
        const cstep *sp = &c->steps[s];
        double t0 = timed ? jdt_now_s() : 0.0;
        if (sp->kind == STEP_KERNEL) {
            p->kernels[sp->kernel]((void *const *)p->ptrs);
        } else {
            jdt_status st = run_builtin(p, sp, e);
            if (st != JDT_OK) return jdt_err_prefix(e, "step %d", s);
        }
        if (timed) {
            double t1 = jdt_now_s();
            if (p->step_s) p->step_s[s] += t1 - t0;
            if (c->opts.trace) c->opts.trace(c->opts.trace_ctx, p->step_name[s], t0, t1);
        }
    }
    double tc = timed ? jdt_now_s() : 0.0;
    bool copied = false;
    /* updates not donated: leaf-sourced values first (they read old leaf memory) */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < c->n_updates; i++) {
            const cupdate *u = &c->updates[i];
            if (u->donated || u->value == u->target) continue;
            int vb = c->nodes[u->value].buf;
            bool leaf_src = c->bufs[vb].info.kind == JDT_BUF_LEAF;
            if (leaf_src != (pass == 0)) continue;
            const cnode *t = &c->nodes[u->target];
            copied = true;
            memmove(ptr_of(p, u->target), p->ptrs[vb],
                    (size_t)jdt_shape_numel(&t->shape) * jdt_dtype_size(t->dtype));
        }
    }
    if (timed) {
        double t1 = jdt_now_s();
        if (p->step_s) {
            p->step_s[c->n_steps] += t1 - tc;
            p->n_runs++;
        }
        if (c->opts.trace && copied) c->opts.trace(c->opts.trace_ctx, "update", tc, t1);
    }
    return JDT_OK;
}

char *jdt_program_profile(const jdt_program *p, char *buf, size_t n)
{
    const cprog *c = &p->c;
    enum { MAX_KINDS = 2 * JDT_OP_COUNT + 1 };
    double t[MAX_KINDS] = {0}, total = 0.0;
    int count[MAX_KINDS] = {0};
    size_t off = 0;
    buf[0] = 0;
    if (!p->step_s || p->n_runs == 0) {
        snprintf(buf, n, "no profile (compile with opts.profile and run)\n");
        return buf;
    }
    /* kinds: 0..OP_COUNT-1 fused kernels by root op, OP_COUNT.. builtins, last: copies */
    for (int s = 0; s < c->n_steps; s++) {
        const cstep *sp = &c->steps[s];
        int k = sp->kind == STEP_KERNEL ? (int)c->nodes[c->groups[sp->group].root].op
                                        : JDT_OP_COUNT + (int)c->nodes[sp->node].op;
        t[k] += p->step_s[s];
        count[k]++;
        total += p->step_s[s];
    }
    t[MAX_KINDS - 1] = p->step_s[c->n_steps];
    count[MAX_KINDS - 1] = c->stats.n_update_copies;
    total += t[MAX_KINDS - 1];
    off += (size_t)snprintf(buf + off, n - off, "%d runs, %.3f ms per run\n", p->n_runs,
                            total * 1e3 / p->n_runs);
    for (;;) {
        int best = -1;
        for (int k = 0; k < MAX_KINDS; k++)
            if (count[k] > 0 && (best < 0 || t[k] > t[best])) best = k;
        if (best < 0 || off >= n) break;
        const char *what = best == MAX_KINDS - 1 ? "update copies"
                           : best < JDT_OP_COUNT ? jdt_op_name((jdt_op)best)
                                                 : jdt_op_name((jdt_op)(best - JDT_OP_COUNT));
        off +=
            (size_t)snprintf(buf + off, n - off, "  %5.1f%%  %9.3f ms  %4d x  %s%s\n",
                             total > 0 ? 100.0 * t[best] / total : 0.0, t[best] * 1e3 / p->n_runs,
                             count[best], best < JDT_OP_COUNT ? "fused:" : "", what);
        count[best] = 0;
    }
    return buf;
}

const void *jdt_program_output(const jdt_program *p, int i)
{
    if (p && p->interp) return jdt_interp_value(p->interp, jdt_graph_output(p->g, i));
    if (!p || !p->ptrs || i < 0 || i >= p->c.n_outputs) return NULL;
    int node = p->c.outputs[i];
    if (p->c.nodes[node].kind == CK_LEAF) return p->c.nodes[node].src->data;
    return ptr_of(p, node);
}

const jdt_compile_stats *jdt_program_stats(const jdt_program *p)
{
    return &p->c.stats;
}

const char *jdt_program_source(const jdt_program *p)
{
    return p->src ? p->src : "";
}

char *jdt_program_summary(const jdt_program *p, char *buf, size_t n)
{
    const jdt_compile_stats *s = &p->c.stats;
    snprintf(buf, n,
             "ops %d -> %d; steps %d (%d fused kernels, %d builtin); in-place %d, donated "
             "updates %d, copied updates %d; arena %.2f MiB; %.3g GFLOP/step; compile %.2fs "
             "(cc %.2fs, cache %s: %s)",
             s->n_ops_in, s->n_ops_out, s->n_steps, s->n_kernels, s->n_builtin, s->n_inplace,
             s->n_donated, s->n_update_copies, (double)s->arena_bytes / 1048576.0,
             s->flops_per_step / 1e9, s->compile_s, s->cc_s, s->cache_hit ? "hit" : "miss",
             s->so_path);
    return buf;
}

void jdt_program_free(jdt_program *p)
{
    if (!p) return;
    jdt_free(p->coll_scratch);
    cprog *c = &p->c;
    for (int g = 0; g < c->n_groups; g++)
        jdt_free(c->groups[g].members);
    jdt_free(c->groups);
    jdt_free(c->nodes);
    jdt_free(c->outputs);
    jdt_free(c->updates);
    jdt_free(c->steps);
    jdt_free(c->bufs);
    jdt_free(p->ptrs);
    jdt_free_aligned(p->arena);
    jdt_free(p->src);
    jdt_free(p->step_s);
    jdt_free(p->step_name);
    jdt_interp_free(p->interp);
    if (p->so) dlclose(p->so);
    jdt_free(p);
}

int jdt_program_n_buffers(const jdt_program *p)
{
    return p->c.n_bufs;
}

bool jdt_program_buffer(const jdt_program *p, int i, jdt_buf_info *info)
{
    if (i < 0 || i >= p->c.n_bufs) return false;
    *info = p->c.bufs[i].info;
    return true;
}
