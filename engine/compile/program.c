/*
 * program.c — jdt_program: drives the compiler pipeline (passes, fusion, plan) and hands the
 * planned program to its device's backend (engine/backend: emit, build, arena), then runs it
 * through the backend interface: begin (bind leaves), every step in schedule order, finish
 * (update copies that could not be donated). Profiling and tracing wrap the steps here, the
 * same for every backend.
 */
#include "backend/backend-impl.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/interp.h"

struct jdt_program {
    cprog c;
    jdt_graph *g;
    jdt_device *dev;
    void *state;           /* the backend's per-program state */
    jdt_interp *interp;    /* opts.no_jit: the reference interpreter runs the graph */
    double *step_s;        /* (n_steps + 1) accumulated seconds per step (profile), last:
                              update copies */
    char (*step_name)[40]; /* (n_steps) trace names, only with opts.trace */
    double *mark_s;        /* (n_steps + 1) one run's seconds per step by the device's marks
                              (vt->mark), when it has them and the run is timed */
    int n_runs;
    int n_trials; /* runs left out of the profile (vt->trial) */
};

void jdt_compile_opts_init(jdt_compile_opts *o)
{
    memset(o, 0, sizeof *o);
}

const char *jdt_compile_node_label(const cnode *n, char *buf, size_t len)
{
    if (n->src && n->src->name)
        snprintf(buf, len, "'%s'", n->src->name);
    else if (n->src)
        snprintf(buf, len, "node %d (%s)", n->src->id, jdt_op_name(n->op));
    else
        snprintf(buf, len, "%s", jdt_op_name(n->op));
    return buf;
}

/* Builtins compute in f32 (indices i32; a MATMUL operand may be bf16, an ALL_GATHER moves bf16
 * too; on a device with bf16_builtins the inputs and outputs fold_bf16_casts makes bf16, and
 * the attention backward's dO and the norm backwards' dy that fold_attention_dout16,
 * fold_norm_dy16 and fold_norm_dy_terms make bf16); anything else has no kernel. */
static jdt_status check_builtins(const cprog *c, jdt_err *e)
{
    for (int i = 0; i < c->n_nodes; i++) {
        const cnode *n = &c->nodes[i];
        if (n->kind != CK_BUILTIN || n->op == JDT_OP_CONCAT) continue;
        const bool bf16_gather = n->op == JDT_OP_ALL_GATHER && n->dtype == JDT_DTYPE_BF16;
        bool ok = n->dtype == JDT_DTYPE_F32 || bf16_gather ||
                  (c->bf16_builtins && n->op == JDT_OP_ROPE && n->dtype == JDT_DTYPE_BF16) ||
                  (c->gemm_bf16_out && n->op == JDT_OP_MATMUL && n->dtype == JDT_DTYPE_BF16);
        for (int k = 0; k < n->n_in; k++) {
            bool idx = (n->op == JDT_OP_GATHER || n->op == JDT_OP_SCATTER_ADD ||
                        n->op == JDT_OP_SOFTMAX_XENT || n->op == JDT_OP_SOFTMAX_XENT_BWD) &&
                       k == 1;
            jdt_dtype want = idx ? JDT_DTYPE_I32 : bf16_gather ? JDT_DTYPE_BF16 : JDT_DTYPE_F32;
            if (n->op == JDT_OP_MATMUL && k < 2 && c->nodes[n->in[k]].dtype == JDT_DTYPE_BF16)
                want = JDT_DTYPE_BF16; /* a bf16 operand (bf16 compute, read as stored) */
            if (c->bf16_builtins && c->nodes[n->in[k]].dtype == JDT_DTYPE_BF16 &&
                ((n->op == JDT_OP_MATMUL && (k == 2 || n->in[k] == cnode_mm_aux(n))) ||
                 (n->op == JDT_OP_ROPE && k == 0) ||
                 (n->op == JDT_OP_ATTENTION_BWD && k == 4 && c->attention_dout16_d > 0 &&
                  c->nodes[n->in[0]].dtype == JDT_DTYPE_BF16) ||
                 ((n->op == JDT_OP_NORMALIZE_BWD || n->op == JDT_OP_RMS_NORMALIZE_BWD) &&
                  c->norm_dy16 && n->attrs.i[0] > 0 && (k == 1 || k >= n->n_in - n->attrs.i[2]))))
                want = JDT_DTYPE_BF16; /* passes.c fold_bf16_casts, fold_attention_dout16 */
            if (c->gemm_bf16_out && !c->bf16_builtins && n->op == JDT_OP_MATMUL && k == 2 &&
                n->dtype == JDT_DTYPE_BF16)
                want = JDT_DTYPE_BF16; /* the CPU: a bf16 output's bias (fold_bf16_casts) */
            if (c->attention_bf16_qkv && c->nodes[n->in[k]].dtype == JDT_DTYPE_BF16 &&
                (n->op == JDT_OP_ATTENTION || n->op == JDT_OP_ATTENTION_BWD) && k < 3)
                want = JDT_DTYPE_BF16; /* bf16 q, k, v (fold_bf16_casts; bf16_builtins too) */
            if (c->xent_bf16_logits && c->nodes[n->in[k]].dtype == JDT_DTYPE_BF16 &&
                (n->op == JDT_OP_SOFTMAX_XENT || n->op == JDT_OP_SOFTMAX_XENT_BWD) && k == 0)
                want = JDT_DTYPE_BF16; /* bf16 logits (fold_bf16_casts; bf16_builtins implies it) */
            ok = ok && c->nodes[n->in[k]].dtype == want;
        }
        if (n->op == JDT_OP_ROPE && (n->shape.ndim != 4 || n->shape.dims[3] % 2)) ok = false;
        if ((n->op == JDT_OP_ATTENTION || n->op == JDT_OP_ATTENTION_BWD) &&
            (c->nodes[n->in[1]].dtype != c->nodes[n->in[0]].dtype ||
             c->nodes[n->in[2]].dtype != c->nodes[n->in[0]].dtype))
            ok = false; /* the kernels take one type for q, k and v */
        if (jdt_op_class_of(n->op) == JDT_OPC_COLLECTIVE && !c->opts.collective)
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
        return 2.0 * numel * K / (n->attrs.i[4] ? 2.0 : 1.0); /* a packed GELU epilogue */
    }
    case JDT_OP_ATTENTION:
    case JDT_OP_ATTENTION_BWD: {
        const jdt_shape *q = &c->nodes[n->in[0]].shape;
        double pairs = (double)q->dims[2] * (double)(q->dims[2] + 1) / 2.0;
        double f = 4.0 * (double)(q->dims[0] * q->dims[1] * q->dims[3]) * pairs;
        return n->op == JDT_OP_ATTENTION ? f : 2.5 * f;
    }
    case JDT_OP_PARAM:
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
    case JDT_OP_CONCAT:
    case JDT_OP_GATHER:
    case JDT_OP_SCATTER_ADD:
    case JDT_OP_IOTA:
    case JDT_OP_CAUSAL_MASK:
    case JDT_OP_SOFTMAX:
    case JDT_OP_SOFTMAX_BWD:
    case JDT_OP_LOG_SOFTMAX:
    case JDT_OP_LOG_SOFTMAX_BWD:
    case JDT_OP_SOFTMAX_XENT:
    case JDT_OP_SOFTMAX_XENT_BWD:
    case JDT_OP_NORMALIZE:
    case JDT_OP_NORMALIZE_BWD:
    case JDT_OP_RMS_NORMALIZE:
    case JDT_OP_RMS_NORMALIZE_BWD:
    case JDT_OP_ROPE:
    case JDT_OP_ALL_REDUCE:
    case JDT_OP_ALL_GATHER:
    case JDT_OP_REDUCE_SCATTER:
        break;
    }
    if (n->kind == CK_LEAF || n->kind == CK_SPLAT || n->kind == CK_VIEW) return 0.0;
    if (n->kind == CK_REDUCE) return (double)jdt_shape_numel(&c->nodes[n->in[0]].shape);
    if (n->kind == CK_BUILTIN || (n->kind == CK_COOUT && jdt_op_class_of(n->op) == JDT_OPC_FUSED))
        return 5.0 * numel;
    return numel;
}

/* What step sp moves and computes at least: every element of every buffer it reads or writes
 * once (a kernel's accesses from its loop nest, so a broadcast or a weight read by every row
 * counts its own elements; a builtin's inputs and output), and node_flops of its nodes.
 * Collectives count neither (their time is the network's). The profile divides them by the
 * measured time: an elementwise kind far below the memory's bandwidth, or a GEMM far below the
 * device's FLOP rate, is where the step loses time. */
static void step_cost(const cprog *c, const cstep *sp, double *bytes, double *flops)
{
    *bytes = *flops = 0.0;
    if (sp->kind == STEP_KERNEL) {
        const cgroup *g = &c->groups[sp->group];
        for (int m = 0; m < g->n_members; m++)
            *flops += node_flops(c, &c->nodes[g->members[m]]);
        jdt_nest N;
        jdt_err e;
        jdt_err_clear(&e);
        if (jdt_nest_build(c, sp->group, &N, &e) != JDT_OK) return;
        for (int a = 0; a < N.n_acc; a++) {
            if (a == N.flat) continue; /* an index, not memory */
            double elems = 1.0;
            for (int k = 0; k < N.n; k++)
                if (N.acc[a].stride[k] != 0) elems *= (double)N.dims[k];
            *bytes += elems * (double)cnode_elem_size(&c->nodes[N.acc[a].node]);
        }
    } else if (sp->kind == STEP_BUILTIN) {
        const cnode *n = &c->nodes[sp->node];
        *flops = node_flops(c, n);
        *bytes = (double)(jdt_shape_numel(&n->shape) * cnode_elem_size(n));
        for (int q = n->co; q; q = c->nodes[q].co) { /* its other outputs (make_co_output) */
            const cnode *co = &c->nodes[q];
            *flops += node_flops(c, co);
            *bytes += (double)(jdt_shape_numel(&co->shape) * cnode_elem_size(co));
        }
        if (n->op == JDT_OP_ROPE && n->attrs.i[1]) { /* a slot of its input (passes.c) */
            *bytes += (double)(jdt_shape_numel(&n->shape) * cnode_elem_size(&c->nodes[n->in[0]]));
            return;
        }
        for (int k = 0; k < n->n_in; k++) /* a GELU backward's aux: its second half */
            *bytes += (double)(jdt_shape_numel(&c->nodes[n->in[k]].shape) *
                               cnode_elem_size(&c->nodes[n->in[k]])) /
                      (n->op == JDT_OP_MATMUL && n->in[k] == cnode_mm_aux(n) ? 2.0 : 1.0);
    }
}

/* stats.kernel_bytes, builtin_bytes: step_cost summed over the steps; stats.traffic_top: the
 * kinds (fused kernels by root op, builtins by op) that move the most. */
static void count_bytes(cprog *c)
{
    double by[2 * JDT_OP_COUNT] = {0};
    int count[2 * JDT_OP_COUNT] = {0};
    for (int s = 0; s < c->n_steps; s++) {
        const cstep *sp = &c->steps[s];
        double b, f;
        step_cost(c, sp, &b, &f);
        if (sp->kind == STEP_KERNEL)
            c->stats.kernel_bytes += b;
        else
            c->stats.builtin_bytes += b;
        int k = sp->kind == STEP_KERNEL    ? (int)c->nodes[c->groups[sp->group].root].op
                : sp->kind == STEP_BUILTIN ? JDT_OP_COUNT + (int)c->nodes[sp->node].op
                                           : -1;
        if (k >= 0) by[k] += b, count[k]++;
    }
    const int n_top = (int)(sizeof c->stats.traffic_top / sizeof c->stats.traffic_top[0]);
    for (int t = 0; t < n_top; t++) {
        int best = -1;
        for (int k = 0; k < 2 * JDT_OP_COUNT; k++)
            if (count[k] > 0 && (best < 0 || by[k] > by[best])) best = k;
        if (best < 0) break;
        snprintf(c->stats.traffic_top[t].name, sizeof c->stats.traffic_top[t].name, "%s%s",
                 best < JDT_OP_COUNT ? "fused:" : "", jdt_op_name((jdt_op)(best % JDT_OP_COUNT)));
        c->stats.traffic_top[t].count = count[best];
        c->stats.traffic_top[t].bytes = by[best];
        count[best] = 0;
    }
}

/* Is environment variable `name` set to "0" (a fold or device feature turned off)? */
static bool env_off(const char *name)
{
    const char *v = getenv(name);
    return v && strcmp(v, "0") == 0;
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
    p->dev = c->opts.device ? c->opts.device : jdt_device_cpu_default();
    c->scratch_bytes = p->dev->vt->scratch_bytes;
    c->wire_gathers = p->dev->vt->wire_gathers;
    c->reduce_stores = p->dev->vt->reduce_stores;
    c->bf16_builtins = p->dev->vt->bf16_builtins;
    c->gemm_bf16_out =
        (c->bf16_builtins || p->dev->vt->gemm_bf16_out) && !env_off("JDT_GEMM_BF16_OUT");
    c->attention_bf16_qkv =
        c->bf16_builtins || (p->dev->vt->attention_bf16_qkv && !env_off("JDT_ATTENTION_BF16_QKV"));
    c->xent_bf16_logits =
        c->bf16_builtins || (p->dev->vt->xent_bf16_logits && !env_off("JDT_XENT_BF16_LOGITS"));
    c->norm_bwd_scale = p->dev->vt->norm_bwd_scale;
    c->gemm_accumulate = p->dev->vt->gemm_accumulate;
    c->gemm_pitch = p->dev->vt->gemm_pitch && !env_off("JDT_GEMM_PITCH");
    /* "0": measuring (or ruling out) what a fold gives; the CPU sets none of these flags */
    c->norm_bwd_partials = env_off("JDT_NORM_FOLDS") ? 0 : p->dev->vt->norm_bwd_partials;
    c->gemm_gelu = p->dev->vt->gemm_gelu && !env_off("JDT_GELU_EPILOGUE");
    c->xent_fused = p->dev->vt->xent_fused && !env_off("JDT_FUSED_XENT");
    c->xent_inplace = p->dev->vt->xent_inplace;
    c->attention_copy = p->dev->vt->attention_copy && !env_off("JDT_ATTENTION_COPY");
    c->attention_groups = p->dev->vt->attention_groups && !env_off("JDT_ATTENTION_GROUPS");
    c->attention_part_rows = env_off("JDT_ATTENTION_GRADS") ? 0 : p->dev->vt->attention_part_rows;
    c->attention_lse = p->dev->vt->attention_lse && !env_off("JDT_ATTENTION_LSE");
    c->attention_dout16_d = p->dev->vt->attention_dout16_d && !env_off("JDT_ATTENTION_DOUT16")
                                ? p->dev->vt->attention_dout16_d(p->dev)
                                : 0;
    c->attention_o16 = c->attention_dout16_d > 0 && !env_off("JDT_ATTENTION_O16");
    c->norm_dy16 = c->bf16_builtins && c->norm_bwd_partials > 0 && !env_off("JDT_NORM_DY16");
    c->norm_dy_terms = c->norm_dy16 && !env_off("JDT_NORM_DY_TERMS");
    c->rope_bhtd = p->dev->vt->rope_bhtd;
    c->residual_gemm = c->gemm_accumulate && c->bf16_builtins && !env_off("JDT_RESIDUAL_GEMM");
    c->merge_launches =
        p->dev->vt->merge_launches && !c->opts.no_merge_launches && !env_off("JDT_MERGE_LAUNCHES");
    /* start/wait collectives: the CPU backends call the hooks; the CUDA backend runs its own
     * (NCCL on a stream of its own) and takes the hooks as the request to overlap them */
    c->nt = c->opts.threads > 0 ? c->opts.threads : omp_get_max_threads();
    if (c->nt > omp_get_thread_limit()) c->nt = omp_get_thread_limit(); /* OMP_THREAD_LIMIT */
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
    c->host_builtins = p->dev == jdt_device_cpu_default();
    c->bf16_storage = (c->host_builtins || p->dev->vt->bf16_storage) && !c->opts.no_bf16_storage;
    if ((st = jdt_compile_lower(c, g, e)) != JDT_OK) goto fail;
    if ((st = check_builtins(c, e)) != JDT_OK) goto fail;
    if ((st = jdt_compile_fuse(c, e)) != JDT_OK) goto fail;
    if ((st = jdt_compile_plan(c, e)) != JDT_OK) goto fail;
    if (c->merge_launches && (st = jdt_compile_merge_launches(c, e)) != JDT_OK) goto fail;
    /* one arena for programs that never run at once (train step, eval, apply): borrow the
     * lender's when it is on the same device, whose backend can, and large enough */
    const jdt_program *lend = c->opts.share_arena;
    if (lend && !lend->interp && lend->dev == p->dev && p->dev->vt->arena_borrow &&
        lend->c.arena_bytes >= c->arena_bytes && (lend->state || c->opts.plan_only)) {
        c->arena_lender = lend->state ? lend->state : lend;
        c->stats.arena_shared = true;
    }
    if (c->opts.plan_only) { /* shapes and sizes only: no code, no compiler, no arena */
        for (int i = 0; i < c->n_nodes; i++)
            c->stats.flops_per_step += node_flops(c, &c->nodes[i]);
        count_bytes(c);
        c->stats.compile_s = jdt_now_s() - t0;
        snprintf(c->stats.so_path, sizeof c->stats.so_path, "(planned only)");
        *out = p;
        return JDT_OK;
    }
    if ((st = p->dev->vt->prepare(p->dev, c, &p->state, e)) != JDT_OK) goto fail;
    if (c->opts.profile && !(p->step_s = jdt_calloc((size_t)c->n_steps + 1, sizeof(double)))) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "compile: profile counters");
        goto fail;
    }
    if ((c->opts.profile || c->opts.trace) && p->dev->vt->mark && p->dev->vt->mark_times &&
        !(p->mark_s = jdt_calloc((size_t)c->n_steps + 1, sizeof(double)))) {
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
            if (sp->kind == STEP_KERNEL && sp->merged != 0) /* merge.c: the launch, then none */
                snprintf(p->step_name[s], sizeof p->step_name[s], "fused:merged launch");
            else if (sp->kind == STEP_KERNEL)
                snprintf(p->step_name[s], sizeof p->step_name[s], "fused:%s",
                         jdt_op_name(c->nodes[c->groups[sp->group].root].op));
            else if (sp->kind != STEP_BUILTIN) /* a bucket is named by its first member */
                snprintf(p->step_name[s], sizeof p->step_name[s], "%s:%s",
                         jdt_op_name(c->nodes[sp->node].op),
                         sp->kind == STEP_COLL_PACK    ? "pack"
                         : sp->kind == STEP_COLL_START ? "start"
                                                       : "wait");
            else
                snprintf(p->step_name[s], sizeof p->step_name[s], "%s",
                         jdt_op_name(c->nodes[sp->node].op));
        }
    }
    for (int i = 0; i < c->n_nodes; i++)
        c->stats.flops_per_step += node_flops(c, &c->nodes[i]);
    count_bytes(c);
    c->stats.compile_s = jdt_now_s() - t0;
    *out = p;
    return JDT_OK;
fail:
    jdt_program_free(p);
    return st;
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

/* A timed run on a device with its own clock (vt->mark): a mark behind each step, one wait
 * at the start (the trace's origin) and one at the end, then each step's seconds from the
 * marks. The device's queue stays full, as in an untimed run, so the steps' times add up to
 * the run's and are the device's, not the host's launch-and-wait round trips. */
static jdt_status run_marked(jdt_program *p, double *prof, jdt_err *e)
{
    cprog *c = &p->c;
    const jdt_backend_vt *vt = p->dev->vt;
    jdt_status st;
    const int n = c->n_steps;
    if ((st = vt->sync(p->state, e)) != JDT_OK) return st;
    const double t0 = jdt_now_s();
    if ((st = vt->mark(p->state, 0, e)) != JDT_OK) return st;
    for (int s = 0; s < n; s++) {
        if ((st = vt->step(p->state, s, e)) != JDT_OK ||
            (st = vt->mark(p->state, s + 1, e)) != JDT_OK)
            return jdt_err_prefix(e, "program step %d", s);
    }
    if ((st = vt->finish(p->state, e)) != JDT_OK || (st = vt->mark(p->state, n + 1, e)) != JDT_OK ||
        (st = vt->sync(p->state, e)) != JDT_OK ||
        (st = vt->mark_times(p->state, n + 1, p->mark_s, e)) != JDT_OK)
        return st;
    double t = t0;
    for (int s = 0; s <= n; s++) {
        if (prof) prof[s] += p->mark_s[s];
        const bool show = s < n || c->stats.n_update_copies > 0;
        if (c->opts.trace && show)
            c->opts.trace(c->opts.trace_ctx, s < n ? p->step_name[s] : "update", t,
                          t + p->mark_s[s]);
        t += p->mark_s[s];
    }
    if (prof) p->n_runs++;
    return JDT_OK;
}

jdt_status jdt_program_run(jdt_program *p, jdt_err *e)
{
    cprog *c = &p->c;
    const jdt_backend_vt *vt = p->dev->vt;
    jdt_status st;
    if (p->interp) return jdt_interp_run(p->interp, e);
    if (!p->state)
        return jdt_err_set(e, JDT_ERR_INVALID,
                           "run: the program was planned only (opts.plan_only)");
    if ((st = vt->begin(p->state, e)) != JDT_OK) return st;
    /* the profile's accumulators, unless this run is a trial the profile leaves out */
    double *prof = p->step_s;
    if (prof && vt->trial && vt->trial(p->state)) {
        prof = NULL;
        p->n_trials++;
    }
    bool timed = prof || c->opts.trace;
    if (timed && p->mark_s) return run_marked(p, prof, e);
    for (int s = 0; s < c->n_steps; s++) {
        double t0 = timed ? jdt_now_s() : 0.0;
        if ((st = vt->step(p->state, s, e)) != JDT_OK)
            return jdt_err_prefix(e, "program step %d", s);
        if (timed) {
            if ((st = vt->sync(p->state, e)) != JDT_OK)
                return jdt_err_prefix(e, "program step %d", s);
            double t1 = jdt_now_s();
            if (prof) prof[s] += t1 - t0;
            if (c->opts.trace) c->opts.trace(c->opts.trace_ctx, p->step_name[s], t0, t1);
        }
    }
    double tc = timed ? jdt_now_s() : 0.0;
    if ((st = vt->finish(p->state, e)) != JDT_OK) return st;
    if (timed) {
        if ((st = vt->sync(p->state, e)) != JDT_OK) return st;
        double t1 = jdt_now_s();
        if (prof) {
            prof[c->n_steps] += t1 - tc;
            p->n_runs++;
        }
        if (c->opts.trace && c->stats.n_update_copies > 0)
            c->opts.trace(c->opts.trace_ctx, "update", tc, t1);
    }
    return JDT_OK;
}

/* One row of the profile's GEMM table: the MATMUL steps of one shape and form. */
typedef struct {
    int64_t batch, m, n, k;
    unsigned form; /* GEMM_* bits */
    int count;
    double t, flops;
} gemm_row;
enum {
    GEMM_TA = 1,      /* a transposed (attrs i[0]) */
    GEMM_TB = 2,      /* b transposed (i[1]) */
    GEMM_BF16 = 4,    /* bf16 compute (i[2]) */
    GEMM_OUT16 = 8,   /* the product stored as bf16 */
    GEMM_BIAS = 16,   /* a bias epilogue (cnode_mm_bias) */
    GEMM_ACC = 32,    /* added to a tensor (i[3], beta 1) */
    GEMM_GELU = 64,   /* GELU epilogue (i[4]) */
    GEMM_DGELU = 128, /* GELU backward epilogue (i[5]) */
    GEMM_SUMS = 256,  /* with its output's column sums (a co-output: the bias gradient, by an
                         epilogue or a kernel in the same step, whose time the row includes) */
    GEMM_A32 = 512,   /* bf16 compute on an a stored as f32 (rounded per call, in the row's time) */
    GEMM_B32 = 1024,  /* ... and on a b stored as f32 */
};

static gemm_row gemm_key(const cprog *c, const cnode *n)
{
    const cnode *a = &c->nodes[n->in[0]];
    const int nd = n->shape.ndim, na = a->shape.ndim;
    gemm_row r = {.batch = 1, .m = cnode_mm_rows(n), .n = n->shape.dims[nd - 1]};
    for (int d = 0; d < nd - 2; d++)
        r.batch *= n->shape.dims[d];
    r.k = n->attrs.i[0] ? a->shape.dims[na - 2] : a->shape.dims[na - 1];
    r.form = (n->attrs.i[0] ? GEMM_TA : 0u) | (n->attrs.i[1] ? GEMM_TB : 0u) |
             (n->attrs.i[2] ? GEMM_BF16 : 0u) |
             (n->bf16 || n->dtype == JDT_DTYPE_BF16 ? GEMM_OUT16 : 0u) |
             (cnode_mm_bias(n) >= 0 ? GEMM_BIAS : 0u) | (n->attrs.i[3] ? GEMM_ACC : 0u) |
             (n->attrs.i[4] ? GEMM_GELU : 0u) | (n->attrs.i[5] ? GEMM_DGELU : 0u) |
             (n->co ? GEMM_SUMS : 0u);
    if (cnode_mm_converts(c, n, 0)) r.form |= GEMM_A32;
    if (cnode_mm_converts(c, n, 1)) r.form |= GEMM_B32;
    return r;
}

/* The profile's GEMM table: the MATMUL builtin steps grouped by shape (batch, M x N x K) and
 * form (transposes, compute type, stored type, epilogue), the `most` that took longest, each
 * with its share of the run, time per run, count and FLOP rate. On a GPU, where the GEMMs are
 * the library's, a shape far below the others' rate is one its algorithm serves badly (or one
 * too small to fill the device). Appends to buf at *off. */
static void profile_gemms(const jdt_program *p, double total, int most, char *buf, size_t n,
                          size_t *off)
{
    const cprog *c = &p->c;
    gemm_row *rows = jdt_calloc((size_t)c->n_steps + 1, sizeof *rows);
    int nr = 0;
    if (!rows) return;
    for (int s = 0; s < c->n_steps; s++) {
        const cstep *sp = &c->steps[s];
        if (sp->kind != STEP_BUILTIN || c->nodes[sp->node].op != JDT_OP_MATMUL) continue;
        const cnode *nd = &c->nodes[sp->node];
        gemm_row key = gemm_key(c, nd);
        int r = 0;
        while (r < nr && !(rows[r].batch == key.batch && rows[r].m == key.m && rows[r].n == key.n &&
                           rows[r].k == key.k && rows[r].form == key.form))
            r++;
        if (r == nr) rows[nr++] = key;
        double sb, sf;
        step_cost(c, sp, &sb, &sf);
        rows[r].count++;
        rows[r].t += p->step_s[s];
        rows[r].flops += sf;
    }
    if (nr > 0 && *off < n)
        *off +=
            (size_t)snprintf(buf + *off, n - *off,
                             "GEMMs by shape (%d shapes; the %d that take longest: [batch x] M x "
                             "N x K, a/b transposed, compute (operands rounded from f32 "
                             "storage each call), epilogue):\n",
                             nr, nr < most ? nr : most);
    for (int shown = 0; shown < most && *off < n; shown++) {
        int best = -1;
        for (int r = 0; r < nr; r++)
            if (rows[r].count > 0 && (best < 0 || rows[r].t > rows[best].t)) best = r;
        if (best < 0) break;
        const gemm_row *g = &rows[best];
        const double per_s = g->t > 0 ? p->n_runs / g->t : 0.0;
        char bat[32] = "", dims[96];
        if (g->batch > 1) snprintf(bat, sizeof bat, "%lld x ", (long long)g->batch);
        snprintf(dims, sizeof dims, "%s%lld x %lld x %lld", bat, (long long)g->m, (long long)g->n,
                 (long long)g->k);
        *off += (size_t)snprintf(
            buf + *off, n - *off,
            "  %5.1f%%  %9.3f ms  %4d x  %9.3g TFLOP/s  %s %c%c %s%s%s%s%s%s%s%s\n",
            total > 0 ? 100.0 * g->t / total : 0.0, g->t * 1e3 / p->n_runs, g->count,
            g->flops * per_s / 1e12, dims, g->form & GEMM_TA ? 't' : 'n',
            g->form & GEMM_TB ? 't' : 'n', g->form & GEMM_BF16 ? "bf16" : "f32",
            (g->form & (GEMM_A32 | GEMM_B32)) == (GEMM_A32 | GEMM_B32) ? " (a, b from f32)"
            : g->form & GEMM_A32                                       ? " (a from f32)"
            : g->form & GEMM_B32                                       ? " (b from f32)"
                                                                       : "",
            g->form & GEMM_OUT16 ? " ->bf16" : "", g->form & GEMM_BIAS ? " +bias" : "",
            g->form & GEMM_ACC ? " +C" : "", g->form & GEMM_GELU ? " gelu" : "",
            g->form & GEMM_DGELU ? " dgelu" : "", g->form & GEMM_SUMS ? " +colsum" : "");
        rows[best].count = 0;
    }
    jdt_free(rows);
}

/* The profile's kernel table: the `most` fused-kernel steps that took longest (a kernel runs
 * once per step list, so each row is one group), each with its share, time per run, bandwidth,
 * group number (the generated source's `group N` comment), member ops in order and loop domain
 * ("(reduced)": a reduction's input domain). A kind's row above says how much all its kernels took;
 * this says which of them. Merged launches (one time for several roots) are left out. */
static void profile_kernels(const jdt_program *p, double total, int most, char *buf, size_t n,
                            size_t *off)
{
    const cprog *c = &p->c;
    int n_k = 0;
    for (int s = 0; s < c->n_steps; s++)
        n_k += c->steps[s].kind == STEP_KERNEL && c->steps[s].merged == 0;
    if (n_k == 0 || *off >= n) return;
    unsigned char *shown = jdt_calloc((size_t)c->n_steps, 1);
    if (!shown) return;
    *off += (size_t)snprintf(buf + *off, n - *off,
                             "fused kernels (%d; the %d that take longest: group, its ops, loop "
                             "domain):\n",
                             n_k, n_k < most ? n_k : most);
    for (int row = 0; row < most && *off < n; row++) {
        int best = -1;
        for (int s = 0; s < c->n_steps; s++) {
            const cstep *sp = &c->steps[s];
            if (sp->kind != STEP_KERNEL || sp->merged != 0 || shown[s]) continue;
            if (best < 0 || p->step_s[s] > p->step_s[best]) best = s;
        }
        if (best < 0) break;
        shown[best] = 1;
        const cgroup *g = &c->groups[c->steps[best].group];
        double sb, sf;
        step_cost(c, &c->steps[best], &sb, &sf);
        const double t = p->step_s[best];
        char ops[160] = "", dom[96] = "";
        size_t o = 0;
        for (int m = 0; m < g->n_members && o < sizeof ops - 8; m++)
            o += (size_t)snprintf(ops + o, sizeof ops - o, "%s%s", m ? " " : "",
                                  jdt_op_name(c->nodes[g->members[m]].op));
        o = 0;
        for (int d = 0; d < g->domain.ndim && o < sizeof dom - 24; d++)
            o += (size_t)snprintf(dom + o, sizeof dom - o, "%s%lld", d ? " x " : "",
                                  (long long)g->domain.dims[d]);
        *off += (size_t)snprintf(buf + *off, n - *off,
                                 "  %5.1f%%  %9.3f ms  %9.3g GB/s  group %d: %s; %s%s\n",
                                 total > 0 ? 100.0 * t / total : 0.0, t * 1e3 / p->n_runs,
                                 t > 0 ? sb * p->n_runs / t / 1e9 : 0.0, c->steps[best].group, ops,
                                 dom[0] ? dom : "scalar", g->is_reduce ? " (reduced)" : "");
    }
    jdt_free(shown);
}

void jdt_program_profile_reset(jdt_program *p)
{
    if (!p || !p->step_s) return;
    memset(p->step_s, 0, ((size_t)p->c.n_steps + 1) * sizeof *p->step_s);
    p->n_runs = p->n_trials = 0;
}

char *jdt_program_profile(const jdt_program *p, char *buf, size_t n)
{
    const cprog *c = &p->c;
    /* kinds: fused kernels by root op, builtins by op, then collective pack / start / wait by
     * op, then the kernels of merged launches (merge.c: one time for several roots), last:
     * update copies */
    enum { MERGED = 5 * JDT_OP_COUNT, MAX_KINDS = 5 * JDT_OP_COUNT + 2 };
    double t[MAX_KINDS] = {0}, bytes[MAX_KINDS] = {0}, flops[MAX_KINDS] = {0}, total = 0.0;
    int count[MAX_KINDS] = {0};
    size_t off = 0;
    buf[0] = 0;
    if (!p->step_s || p->n_runs == 0) {
        snprintf(buf, n, "no profile (compile with opts.profile and run)\n");
        return buf;
    }
    for (int s = 0; s < c->n_steps; s++) {
        const cstep *sp = &c->steps[s];
        int k = sp->kind == STEP_KERNEL && sp->merged != 0 ? MERGED
                : sp->kind == STEP_KERNEL  ? (int)c->nodes[c->groups[sp->group].root].op
                : sp->kind == STEP_BUILTIN ? JDT_OP_COUNT + (int)c->nodes[sp->node].op
                                           : (sp->kind == STEP_COLL_PACK    ? 2
                                              : sp->kind == STEP_COLL_START ? 3
                                                                            : 4) *
                                                     JDT_OP_COUNT +
                                                 (int)c->nodes[sp->node].op;
        double sb, sf;
        step_cost(c, sp, &sb, &sf);
        t[k] += p->step_s[s];
        bytes[k] += sb;
        flops[k] += sf;
        count[k]++;
        total += p->step_s[s];
    }
    t[MAX_KINDS - 1] = p->step_s[c->n_steps];
    count[MAX_KINDS - 1] = c->stats.n_update_copies;
    total += t[MAX_KINDS - 1];
    char trials[96] = "";
    if (p->n_trials > 0)
        snprintf(trials, sizeof trials, " (and %d trial run%s of another thread count left out)",
                 p->n_trials, p->n_trials == 1 ? "" : "s");
    off += (size_t)snprintf(buf + off, n - off,
                            "%d runs%s, %.3f ms per run (GB/s, TFLOP/s: bytes each step moves and "
                            "FLOPs it does at least, over its time)\n",
                            p->n_runs, trials, total * 1e3 / p->n_runs);
    for (;;) {
        int best = -1;
        for (int k = 0; k < MAX_KINDS; k++)
            if (count[k] > 0 && (best < 0 || t[k] > t[best])) best = k;
        if (best < 0 || off >= n) break;
        static const char *const part[5] = {"", "", " pack", " start", " wait"};
        const int cls = best / JDT_OP_COUNT;
        const char *what = best == MAX_KINDS - 1 ? "update copies"
                           : best == MERGED      ? "kernels of merged launches"
                                                 : jdt_op_name((jdt_op)(best % JDT_OP_COUNT));
        const double per_s = t[best] > 0 ? p->n_runs / t[best] : 0.0; /* runs per second */
        off += (size_t)snprintf(
            buf + off, n - off, "  %5.1f%%  %9.3f ms  %4d x  %9.3g GB/s %9.3g TFLOP/s  %s%s%s\n",
            total > 0 ? 100.0 * t[best] / total : 0.0, t[best] * 1e3 / p->n_runs, count[best],
            bytes[best] * per_s / 1e9, flops[best] * per_s / 1e12,
            best < JDT_OP_COUNT || best == MERGED ? "fused:" : "", what,
            best >= MERGED ? "" : part[cls]);
        count[best] = 0;
    }
    profile_gemms(p, total, 16, buf, n, &off);
    profile_kernels(p, total, 8, buf, n, &off);
    return buf;
}

const void *jdt_program_output(const jdt_program *p, int i)
{
    if (p && p->interp) return jdt_interp_value(p->interp, jdt_graph_output(p->g, i));
    if (!p || !p->state || i < 0 || i >= p->c.n_outputs) return NULL;
    return p->dev->vt->host_ptr(p->state, p->c.outputs[i]);
}

jdt_status jdt_program_read_output(const jdt_program *p, int i, void *dst, size_t n_bytes,
                                   jdt_err *e)
{
    if (p->interp) {
        const void *v = jdt_interp_value(p->interp, jdt_graph_output(p->g, i));
        if (!v) return jdt_err_set(e, JDT_ERR_INVALID, "read: no output %d", i);
        memcpy(dst, v, n_bytes);
        return JDT_OK;
    }
    if (i < 0 || i >= p->c.n_outputs)
        return jdt_err_set(e, JDT_ERR_INVALID, "read: no output %d (the program has %d)", i,
                           p->c.n_outputs);
    if (!p->state)
        return jdt_err_set(e, JDT_ERR_INVALID,
                           "read: the program was planned only (opts.plan_only)");
    const cnode *n = &p->c.nodes[p->c.outputs[i]];
    size_t have = (size_t)jdt_shape_numel(&n->shape) * jdt_dtype_size(n->dtype);
    if (n_bytes > have)
        return jdt_err_set(e, JDT_ERR_INVALID, "read: output %d has %zu bytes, %zu asked", i, have,
                           n_bytes);
    return p->dev->vt->read(p->state, p->c.outputs[i], dst, n_bytes, e);
}

bool jdt_program_arena_shared(const jdt_program *p)
{
    return p && p->c.stats.arena_shared;
}

const jdt_compile_stats *jdt_program_stats(const jdt_program *p)
{
    return &p->c.stats;
}

const char *jdt_program_source(const jdt_program *p)
{
    return p->state ? p->dev->vt->source(p->state) : "";
}

char *jdt_program_summary(const jdt_program *p, char *buf, size_t n)
{
    const jdt_compile_stats *s = &p->c.stats;
    snprintf(buf, n,
             "ops %d -> %d; steps %d (%d fused kernels, %d builtin); in-place %d, donated "
             "updates %d, copied updates %d; bf16-stored %d, bf16 GEMM operands converted per "
             "call %d; arena %.2f MiB; %.3g GFLOP/step; "
             "compile %.2fs (cc %.2fs, cache %s: %s)",
             s->n_ops_in, s->n_ops_out, s->n_steps, s->n_kernels, s->n_builtin, s->n_inplace,
             s->n_donated, s->n_update_copies, s->n_bf16_stored, s->n_bf16_converted,
             (double)s->arena_bytes / 1048576.0, s->flops_per_step / 1e9, s->compile_s, s->cc_s,
             s->cache_hit ? "hit" : "miss", s->so_path);
    return buf;
}

void jdt_program_free(jdt_program *p)
{
    if (!p) return;
    cprog *c = &p->c;
    for (int g = 0; g < c->n_groups; g++)
        jdt_free(c->groups[g].members);
    jdt_free(c->groups);
    jdt_free(c->nodes);
    jdt_free(c->outputs);
    jdt_free(c->updates);
    jdt_free(c->steps);
    jdt_free(c->bufs);
    for (int k = 0; k < c->n_colls; k++) {
        jdt_free(c->colls[k].members);
        jdt_free(c->colls[k].part_off);
    }
    jdt_free(c->colls);
    if (p->state) p->dev->vt->release(p->state);
    jdt_free(p->step_s);
    jdt_free(p->mark_s);
    jdt_free(p->step_name);
    jdt_interp_free(p->interp);
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
