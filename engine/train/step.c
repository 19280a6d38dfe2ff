/*
 * step.c — builds and runs the compiled train step (see train.h): model + autodiff + global
 * norm clipping + AdamW/SGD as one graph, or accumulate/apply graphs for gradient
 * accumulation, plus a forward-only eval graph. Host buffers for parameters and optimizer
 * state are allocated once here and bound to every graph's leaves by name.
 */
#include "train/train.h"

#include "autodiff/autodiff.h"
#include "backend/backend.h"
#include "graph/builder.h"
#include "graph/interp.h"
#include "runtime/runtime.h"
#include "shard/shard.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* One executable graph: compiled program or reference interpreter. */
typedef struct {
    jdt_graph *g;
    jdt_program *p;
    jdt_interp *it;
} exec;

typedef struct {
    char name[256];      /* checkpoint name: params/..., opt/m/..., opt/v/..., opt/buf/... */
    float *data;         /* (numel of shape) 64-byte aligned, owned: this rank's block */
    jdt_shape shape;     /* local (this rank's block) */
    jdt_shape global;    /* the whole tensor */
    jdt_placement place; /* how the tensor is split over the mesh (its parameter's storage) */
} host_tensor;

struct jdt_step {
    const jdt_config *cfg;
    jdt_step_opts o;
    exec main, apply, eval; /* apply.g is NULL without accumulation */
    jdt_model m_main, m_eval;
    jdt_mesh mesh;         /* 1 x 1 x 1 without a mesh */
    jdt_placement *pplace; /* (n_params) storage placement of each parameter */
    jdt_shape *pglobal;    /* (n_params) global shape of each parameter */
    jdt_placement loss_place, eval_loss_place;
    int n_params;
    host_tensor *tensors; /* params, then moments: (n_tensors) */
    int n_tensors;
    float **acc; /* (n_params) accumulators, accumulation only */
    /* bound scalars */
    float lr, bc1, bc2, inv_accum;
    int32_t dropout_step;
    double dropout_row0;    /* the step-batch row of this run's first row (models.h row0) */
    int64_t rank_row0;      /* this rank's first row of each step's batch */
    int out_loss, out_norm; /* output indices in main (norm in apply when accumulating) */
};

/* Compiles (or plans) x->g; lender: the program whose arena x reuses when it fits (the eval
 * and apply programs never run during the train step, so one arena serves all three). */
static jdt_status exec_init(exec *x, const jdt_step_opts *o, const jdt_program *lender, jdt_err *e)
{
    jdt_status st = jdt_graph_error(x->g, e);
    if (st != JDT_OK) return st;
    if (o->use_jit || o->plan_only) {
        jdt_compile_opts co = o->copts;
        co.share_arena = lender;
        return jdt_program_compile(x->g, &co, &x->p, e);
    }
    st = jdt_interp_new(x->g, &x->it, e);
    if (st == JDT_OK)
        jdt_interp_set_collective(x->it, o->copts.collective, o->copts.collective_ctx);
    return st;
}

static jdt_status exec_run(exec *x, jdt_err *e)
{
    if (!x->p && !x->it) return jdt_err_set(e, JDT_ERR_INVALID, "train: the step was planned only");
    return x->p ? jdt_program_run(x->p, e) : jdt_interp_run(x->it, e);
}

/* Output i's first element, copied out of the program's memory (host or device). */
static jdt_status exec_scalar(const exec *x, int i, float *v, jdt_err *e)
{
    if (x->p) return jdt_program_read_output(x->p, i, v, sizeof *v, e);
    const float *h = jdt_interp_value(x->it, jdt_graph_output(x->g, i));
    *v = h ? h[0] : NAN;
    return JDT_OK;
}

static void exec_free(exec *x)
{
    jdt_program_free(x->p);
    jdt_interp_free(x->it);
    jdt_graph_free(x->g);
}

static jdt_tensor *scalar_input(jdt_graph *g, const char *name, float *bound)
{
    jdt_tensor *t = jdt_graph_input(g, name, JDT_DTYPE_F32, 0, NULL, NULL);
    if (t) t->data = bound;
    return t;
}

/* The host tensor called name, a state of parameter i: tensors k * n_params + i (alloc_host's
 * layout) are looked at first, so building a deep model's update stays linear. */
static host_tensor *find_host(jdt_step *s, const char *name, int i)
{
    for (int k = 1; s->n_params > 0 && k * s->n_params + i < s->n_tensors; k++)
        if (strcmp(s->tensors[k * s->n_params + i].name, name) == 0)
            return &s->tensors[k * s->n_params + i];
    for (int j = 0; j < s->n_tensors; j++)
        if (strcmp(s->tensors[j].name, name) == 0) return &s->tensors[j];
    return NULL;
}

/* The state leaf prefix + name of parameter i (p) in g, bound to its host buffer. */
static jdt_tensor *state_leaf(jdt_step *s, jdt_graph *g, const char *prefix, int i,
                              const jdt_tensor *p)
{
    char name[256];
    snprintf(name, sizeof name, "%s%s", prefix, p->name);
    jdt_tensor *t = jdt_graph_state(g, name, JDT_DTYPE_F32, p->shape.ndim, p->shape.dims, p->axes);
    host_tensor *h = find_host(s, name, i);
    if (t && h) t->data = h->data;
    return t;
}

/*
 * Appends clipping and the optimizer update for params P with gradients G (both n long) to g.
 * meta gives each parameter's weight-decay flag. Returns the pre-clip global norm tensor ().
 */
static jdt_tensor *build_update(jdt_step *s, jdt_graph *g, int n, jdt_tensor **P, jdt_tensor **G,
                                const jdt_model_param *meta)
{
    const jdt_config *cfg = s->cfg;
    jdt_tensor *lr = scalar_input(g, "lr", &s->lr);
    /* squared norm: each parameter's local sum, summed per set of axes the parameters are
     * split over, each set all-reduced over its axes (every element counted once) */
    jdt_tensor *by_axes[8] = {NULL};
    for (int i = 0; i < n; i++) {
        uint32_t all = (1u << G[i]->shape.ndim) - 1;
        jdt_tensor *ss = jdt_graph_reduce_sum(g, jdt_graph_mul(g, G[i], G[i]), all, false);
        unsigned split =
            jdt_mesh_live(&s->mesh, 7u & ~jdt_shard_grad_axes(&s->mesh, &s->pplace[i]));
        by_axes[split] = by_axes[split] ? jdt_graph_add(g, by_axes[split], ss) : ss;
    }
    jdt_tensor *sumsq = NULL;
    for (unsigned k = 0; k < 8; k++) {
        if (!by_axes[k]) continue;
        jdt_tensor *ss = k ? jdt_graph_all_reduce(g, by_axes[k], (int)k, 0, 1.0) : by_axes[k];
        sumsq = sumsq ? jdt_graph_add(g, sumsq, ss) : ss;
    }
    jdt_tensor *norm = jdt_graph_sqrt(g, sumsq);
    if (cfg->optimizer.grad_clip > 0) {
        /* scale = min(1, clip / (norm + 1e-6)) */
        jdt_tensor *scale = jdt_graph_min(
            g, jdt_graph_scalar(g, JDT_DTYPE_F32, 1.0),
            jdt_graph_div(g, jdt_graph_scalar(g, JDT_DTYPE_F32, cfg->optimizer.grad_clip),
                          jdt_graph_add_scalar(g, norm, 1e-6)));
        for (int i = 0; i < n; i++)
            G[i] = jdt_graph_mul_bcast(g, G[i], scale);
    }
    /* ok = 1 when the squared norm is finite (NaN and +inf compare false) */
    jdt_tensor *ok = cfg->optimizer.nan_policy == JDT_NAN_SKIP
                         ? jdt_graph_ge(g, jdt_graph_scalar(g, JDT_DTYPE_F32, FLT_MAX), sumsq)
                         : NULL;
    jdt_tensor *bc1 = NULL, *bc2 = NULL;
    if (cfg->optimizer.type == JDT_OPTIM_ADAMW) {
        bc1 = scalar_input(g, "bc1", &s->bc1);
        bc2 = scalar_input(g, "bc2", &s->bc2);
    }
    const double wd = cfg->optimizer.weight_decay;
    for (int i = 0; i < n; i++) {
        jdt_tensor *p = P[i], *gr = G[i], *upd, *pn;
        const int nd = p->shape.ndim;
        const int64_t *dims = p->shape.dims;
        jdt_tensor *okb = ok ? jdt_graph_broadcast(g, ok, nd, dims) : NULL;
#define GATED(newv, oldv) (okb ? jdt_graph_select(g, okb, (newv), (oldv)) : (newv))
        if (cfg->optimizer.type == JDT_OPTIM_ADAMW) {
            const double b1 = cfg->optimizer.beta1, b2 = cfg->optimizer.beta2;
            jdt_tensor *m = state_leaf(s, g, "opt/m/", i, p), *v = state_leaf(s, g, "opt/v/", i, p);
            jdt_tensor *mn = jdt_graph_add(g, jdt_graph_mul_scalar(g, m, b1),
                                           jdt_graph_mul_scalar(g, gr, 1 - b1));
            jdt_tensor *vn =
                jdt_graph_add(g, jdt_graph_mul_scalar(g, v, b2),
                              jdt_graph_mul_scalar(g, jdt_graph_mul(g, gr, gr), 1 - b2));
            jdt_tensor *den = jdt_graph_add_scalar(
                g, jdt_graph_sqrt(g, jdt_graph_mul_bcast(g, vn, bc2)), cfg->optimizer.eps);
            upd = jdt_graph_div(g, jdt_graph_mul_bcast(g, mn, bc1), den);
            if (meta[i].decay && wd > 0)
                upd = jdt_graph_add(g, upd, jdt_graph_mul_scalar(g, p, wd));
            jdt_graph_add_update(g, m, GATED(mn, m));
            jdt_graph_add_update(g, v, GATED(vn, v));
        } else {
            const double mu = cfg->optimizer.momentum;
            if (meta[i].decay && wd > 0) gr = jdt_graph_add(g, gr, jdt_graph_mul_scalar(g, p, wd));
            upd = gr;
            if (mu > 0) {
                jdt_tensor *buf = state_leaf(s, g, "opt/buf/", i, p);
                jdt_tensor *bn = jdt_graph_add(g, jdt_graph_mul_scalar(g, buf, mu), gr);
                upd = cfg->optimizer.nesterov
                          ? jdt_graph_add(g, gr, jdt_graph_mul_scalar(g, bn, mu))
                          : bn;
                jdt_graph_add_update(g, buf, GATED(bn, buf));
            }
        }
        pn = jdt_graph_sub(g, p, jdt_graph_mul_bcast(g, upd, lr));
        jdt_graph_add_update(g, p, GATED(pn, p));
#undef GATED
    }
    return norm;
}

/* The global value of a local scalar loss with placement p (sum of its partial values). */
static jdt_tensor *global_loss(const jdt_step *s, jdt_graph *g, jdt_tensor *t,
                               const jdt_placement *p)
{
    unsigned axes = jdt_mesh_live(&s->mesh, p->partial);
    return axes ? jdt_graph_all_reduce(g, t, (int)axes, 0, 1.0) : t;
}

/* A parameter's gradient summed over the axes it is not stored split over (the data-parallel
 * all-reduce and its tensor/fsdp siblings, as the placements dictate). */
static jdt_tensor *grad_sum(const jdt_step *s, jdt_graph *g, int i, jdt_tensor *t)
{
    unsigned axes = jdt_shard_grad_axes(&s->mesh, &s->pplace[i]);
    return axes ? jdt_graph_all_reduce(g, t, (int)axes, 0, 1.0) : t;
}

/*
 * Builds the model on the global micro-batch and, on a mesh of several devices, partitions it
 * into this rank's local graph (engine/shard): *g and *m then hold the local graph and model,
 * place receives the loss's placement, pplace/pglobal (when not NULL) each parameter's storage
 * placement and global shape.
 */
static jdt_status build_model(jdt_step *s, bool training, jdt_graph **g, jdt_model *m,
                              jdt_placement *loss_place, jdt_err *e)
{
    jdt_graph *gg = jdt_graph_new();
    if (!gg) return jdt_err_set(e, JDT_ERR_NOMEM, "train: out of memory");
    /* precision.compute: bf16 = every GEMM on bf16-rounded inputs, f32 accumulation; the rest
     * (activations, norms, softmax, loss, optimizer, master weights) stays f32 */
    jdt_graph_set_matmul_bf16(gg, s->cfg->precision.compute == JDT_DTYPE_BF16);
    /* and each GEMM weight is cast to bf16 once per step (a CAST node) rather than rounded by
     * every GEMM that reads it (CUDA: cuBLASLt reads the bf16 copy as stored). Under FSDP the
     * partitioner keeps the CAST on the weight's shard and all-gathers the bf16 copy: half the
     * bytes of the f32 gather, the same numbers (round(shard) gathered = round(full)); the
     * gradient is reduce-scattered in f32 */
    jdt_graph_set_bf16_weights(gg, s->cfg->precision.compute == JDT_DTYPE_BF16);
    /* precision.activations: bf16 also rounds the cotangents of the bf16 activations GEMMs
     * read (the GELU output's), as autocast's backward does */
    jdt_graph_set_bf16_grads(gg, s->cfg->precision.activations == JDT_DTYPE_BF16);
    const int seq_ways =
        s->mesh.world_size > 1 ? jdt_shard_seq_ways(&s->mesh, &s->cfg->sharding.rules) : 1;
    jdt_status st = jdt_model_build_ex(gg, s->cfg, s->o.micro_batch, training,
                                       s->cfg->runtime.loss_chunks, seq_ways, m, e);
    memset(loss_place, 0, sizeof *loss_place);
    if (st != JDT_OK || s->mesh.world_size <= 1) {
        *g = gg;
        if (st == JDT_OK && training && !s->pplace) {
            s->pplace = jdt_calloc((size_t)(m->n_params ? m->n_params : 1), sizeof *s->pplace);
            s->pglobal = jdt_calloc((size_t)(m->n_params ? m->n_params : 1), sizeof *s->pglobal);
            if (!s->pplace || !s->pglobal)
                return jdt_err_set(e, JDT_ERR_NOMEM, "train: out of memory");
            for (int i = 0; i < m->n_params; i++)
                s->pglobal[i] = m->params[i].t->shape;
        }
        return st;
    }
    jdt_shard_result r;
    st = jdt_shard_partition(&s->mesh, &s->cfg->sharding.rules, gg, &r, e);
    if (st != JDT_OK) {
        jdt_graph_free(gg);
        return st;
    }
    if (training && !s->pplace) {
        s->pplace = jdt_calloc((size_t)(m->n_params ? m->n_params : 1), sizeof *s->pplace);
        s->pglobal = jdt_calloc((size_t)(m->n_params ? m->n_params : 1), sizeof *s->pglobal);
        if (!s->pplace || !s->pglobal) st = jdt_err_set(e, JDT_ERR_NOMEM, "train: out of memory");
        for (int i = 0; st == JDT_OK && i < m->n_params; i++) {
            s->pplace[i] = r.place[m->params[i].t->id];
            s->pglobal[i] = m->params[i].t->shape;
        }
    }
    /* the model's tensors now live in the local graph (the params array is in gg's arena) */
    jdt_model_param *params =
        jdt_graph_alloc(r.g, (size_t)(m->n_params ? m->n_params : 1) * sizeof *params);
    if (!params && st == JDT_OK) st = jdt_err_set(e, JDT_ERR_NOMEM, "train: out of memory");
    if (st == JDT_OK) {
        for (int i = 0; i < m->n_params; i++) {
            params[i] = m->params[i];
            params[i].t = r.map[m->params[i].t->id];
        }
        m->params = params;
        *loss_place = r.place[m->loss->id];
        m->loss = r.map[m->loss->id];
        if (m->logits) m->logits = r.map[m->logits->id];
        if (m->step) m->step = r.map[m->step->id];
        if (m->row0) m->row0 = r.map[m->row0->id];
        /* by name: the data inputs' leaves (r.map gives their slices under `[seq, tensor]`,
         * partition.c rule_leaf) */
        m->x = jdt_graph_find(r.g, m->x->name);
        m->y = jdt_graph_find(r.g, m->y->name);
        m->batch = m->x->shape.dims[0];
        *g = r.g;
    } else {
        jdt_graph_free(r.g);
    }
    jdt_shard_result_free(&r);
    jdt_graph_free(gg);
    return st;
}

static jdt_status alloc_host(jdt_step *s, jdt_err *e)
{
    const jdt_model *m = &s->m_main;
    int per =
        s->cfg->optimizer.type == JDT_OPTIM_ADAMW ? 2 : (s->cfg->optimizer.momentum > 0 ? 1 : 0);
    s->n_params = m->n_params;
    s->n_tensors = m->n_params * (1 + per);
    s->tensors = jdt_calloc((size_t)s->n_tensors, sizeof *s->tensors);
    if (!s->tensors) return jdt_err_set(e, JDT_ERR_NOMEM, "train: out of memory");
    static const char *const prefixes[3][3] = {
        {"params/", NULL, NULL}, {"params/", "opt/buf/", NULL}, {"params/", "opt/m/", "opt/v/"}};
    for (int k = 0; k <= per; k++) {
        for (int i = 0; i < m->n_params; i++) {
            const jdt_tensor *p = m->params[i].t;
            host_tensor *h = &s->tensors[k * m->n_params + i];
            snprintf(h->name, sizeof h->name, "%s%s", prefixes[per][k], p->name);
            h->shape = p->shape;
            h->global = s->pglobal[i];
            h->place = s->pplace[i];
            size_t n = (size_t)jdt_shape_numel(&p->shape);
            if (s->o.plan_only) continue; /* shapes only: no buffer, no initial values */
            h->data = jdt_malloc_aligned(n * sizeof(float));
            if (!h->data)
                return jdt_err_set(e, JDT_ERR_NOMEM, "train: out of memory for %s", h->name);
            if (k > 0) {
                memset(h->data, 0, n * sizeof(float));
                continue;
            }
            /* a pure function of (seed, name, global index), drawn only for this rank's block */
            int64_t off[JDT_MAX_DIMS] = {0};
            for (int d = 0; d < h->global.ndim; d++)
                off[d] = jdt_shard_local_offset(&s->mesh, &h->global, &h->place, d);
            jdt_model_init_block(&m->params[i], (uint64_t)s->cfg->run.seed, &h->global, off,
                                 &h->shape, h->data);
        }
    }
    return JDT_OK;
}

static void bind_params(jdt_step *s, const jdt_model *m)
{
    for (int i = 0; i < m->n_params; i++)
        m->params[i].t->data = s->tensors[i].data;
}

static jdt_status build_main(jdt_step *s, jdt_err *e)
{
    jdt_status st = build_model(s, true, &s->main.g, &s->m_main, &s->loss_place, e);
    if (st != JDT_OK) return st;
    if ((st = alloc_host(s, e)) != JDT_OK) return st;
    bind_params(s, &s->m_main);
    if (s->m_main.step) s->m_main.step->data = &s->dropout_step;
    if (s->m_main.row0) {
        s->m_main.row0->data = &s->dropout_row0;
        /* the first of the rows the loader gives this rank of each step (loop.c) */
        int64_t end;
        jdt_shard_batch_rows(&s->mesh, &s->cfg->sharding.rules, s->cfg->data.batch_size,
                             &s->rank_row0, &end);
    }

    jdt_graph *g = s->main.g;
    const int n = s->m_main.n_params;
    jdt_tensor **P = jdt_graph_alloc(g, (size_t)n * sizeof *P);
    jdt_tensor **G = jdt_graph_alloc(g, (size_t)n * sizeof *G);
    if (!P || !G) return jdt_err_set(e, JDT_ERR_NOMEM, "train: out of memory");
    for (int i = 0; i < n; i++)
        P[i] = s->m_main.params[i].t;
    /* the per-rank objectives sum to the global loss (see engine/shard/shard.h) */
    const double seed = jdt_shard_loss_seed(&s->mesh, &s->loss_place);
    jdt_tensor *objective =
        seed == 1.0 ? s->m_main.loss : jdt_graph_mul_scalar(g, s->m_main.loss, seed);
    st = jdt_autodiff_grad_ex(g, objective, n, P, G,
                              s->o.copts.remat == JDT_COMPILE_REMAT_DOTS    ? JDT_AD_REMAT_DOTS
                              : s->o.copts.remat == JDT_COMPILE_REMAT_BLOCK ? JDT_AD_REMAT_BLOCK
                                                                            : JDT_AD_REMAT_NONE,
                              e);
    if (st != JDT_OK) return jdt_err_prefix(e, "differentiating the model");
    s->out_loss = jdt_graph_add_output(g, global_loss(s, g, s->m_main.loss, &s->loss_place));

    if (s->o.n_accum == 1) {
        for (int i = 0; i < n; i++)
            G[i] = grad_sum(s, g, i, G[i]);
        s->out_norm = jdt_graph_add_output(g, build_update(s, g, n, P, G, s->m_main.params));
        return exec_init(&s->main, &s->o, NULL, e);
    }

    /* accumulate: acc += grad; apply: clip + optimizer on acc / n_accum, then acc = 0 */
    s->acc = jdt_calloc((size_t)n, sizeof *s->acc);
    if (!s->acc) return jdt_err_set(e, JDT_ERR_NOMEM, "train: out of memory");
    s->apply.g = jdt_graph_new();
    if (!s->apply.g) return jdt_err_set(e, JDT_ERR_NOMEM, "train: out of memory");
    jdt_graph *ga = s->apply.g;
    jdt_tensor **PA = jdt_graph_alloc(ga, (size_t)n * sizeof *PA);
    jdt_tensor **GA = jdt_graph_alloc(ga, (size_t)n * sizeof *GA);
    if (!PA || !GA) return jdt_err_set(e, JDT_ERR_NOMEM, "train: out of memory");
    jdt_tensor *inv = scalar_input(ga, "inv_accum", &s->inv_accum);
    for (int i = 0; i < n; i++) {
        const jdt_tensor *p = P[i];
        size_t bytes = (size_t)jdt_shape_numel(&p->shape) * sizeof(float);
        if (!s->o.plan_only) {
            s->acc[i] = jdt_malloc_aligned(bytes);
            if (!s->acc[i]) return jdt_err_set(e, JDT_ERR_NOMEM, "train: out of memory");
            memset(s->acc[i], 0, bytes);
        }
        char name[256];
        snprintf(name, sizeof name, "acc/%s", p->name);
        jdt_tensor *acc =
            jdt_graph_state(g, name, JDT_DTYPE_F32, p->shape.ndim, p->shape.dims, p->axes);
        jdt_tensor *acca =
            jdt_graph_state(ga, name, JDT_DTYPE_F32, p->shape.ndim, p->shape.dims, p->axes);
        PA[i] = jdt_graph_param(ga, p->name, JDT_DTYPE_F32, p->shape.ndim, p->shape.dims, p->axes);
        if (!acc || !acca || !PA[i]) break;
        acc->data = acca->data = s->acc[i];
        PA[i]->data = s->tensors[i].data;
        jdt_graph_add_update(g, acc, jdt_graph_add(g, acc, G[i]));
        GA[i] = grad_sum(s, ga, i, jdt_graph_mul_bcast(ga, acca, inv));
        jdt_graph_add_update(ga, acca,
                             jdt_graph_full(ga, JDT_DTYPE_F32, p->shape.ndim, p->shape.dims, 0.0));
    }
    s->out_norm = jdt_graph_add_output(ga, build_update(s, ga, n, PA, GA, s->m_main.params));
    if ((st = exec_init(&s->main, &s->o, NULL, e)) != JDT_OK) return st;
    return exec_init(&s->apply, &s->o, s->main.p, e);
}

static jdt_status build_eval(jdt_step *s, jdt_err *e)
{
    jdt_status st = build_model(s, false, &s->eval.g, &s->m_eval, &s->eval_loss_place, e);
    if (st != JDT_OK) return st;
    bind_params(s, &s->m_eval);
    jdt_graph_add_output(s->eval.g, global_loss(s, s->eval.g, s->m_eval.loss, &s->eval_loss_place));
    return exec_init(&s->eval, &s->o, s->main.p, e);
}

jdt_status jdt_step_new(const jdt_config *cfg, const jdt_step_opts *o, jdt_step **out, jdt_err *e)
{
    *out = NULL;
    /* before building anything: a plan that cannot fit is refused in microseconds */
    jdt_status mst =
        o->plan_only ? JDT_OK : jdt_train_check_memory(cfg, o->micro_batch, o->mesh, e);
    if (mst != JDT_OK) return mst;
    jdt_step *s = jdt_calloc(1, sizeof *s);
    if (!s) return jdt_err_set(e, JDT_ERR_NOMEM, "train: out of memory");
    s->cfg = cfg;
    s->o = *o;
    if (s->o.n_accum < 1) s->o.n_accum = 1;
    if (cfg->precision.compute == JDT_DTYPE_BF16 && o->copts.device &&
        jdt_device_get_kind(o->copts.device) == JDT_DEVICE_CUDA)
        JDT_INFO("precision.compute bf16: cuBLASLt bf16 x bf16 GEMMs, f32 accumulation and %s",
                 cfg->precision.activations == JDT_DTYPE_BF16
                     ? "bf16 outputs of the linear layers and the head (precision.activations)"
                     : "output");
    else if (cfg->precision.compute == JDT_DTYPE_BF16) /* which GEMM path, said once */
        jdt_log(jdt_rt_bf16_warn() ? JDT_LOG_WARN : JDT_LOG_INFO, "precision.compute bf16: %s",
                jdt_rt_bf16_describe());
    if (s->o.plan_only) s->o.copts.plan_only = true;
    static const int ones[JDT_MESH_AXIS_COUNT] = {1, 1, 1};
    jdt_status st = o->mesh ? (s->mesh = *o->mesh, JDT_OK) : jdt_mesh_init(&s->mesh, ones, 1, 0, e);
    if (st == JDT_OK) st = build_main(s, e);
    if (st == JDT_OK) st = build_eval(s, e);
    if (st != JDT_OK) {
        jdt_step_free(s);
        return st;
    }
    *out = s;
    return JDT_OK;
}

void jdt_step_free(jdt_step *s)
{
    if (!s) return;
    exec_free(&s->eval); /* the borrowers of main's arena first */
    exec_free(&s->apply);
    exec_free(&s->main);
    for (int i = 0; i < s->n_tensors; i++)
        jdt_free_aligned(s->tensors[i].data);
    jdt_free(s->tensors);
    if (s->acc)
        for (int i = 0; i < s->n_params; i++)
            jdt_free_aligned(s->acc[i]);
    jdt_free(s->acc);
    jdt_free(s->pplace);
    jdt_free(s->pglobal);
    jdt_free(s);
}

static size_t x_row_bytes(const jdt_model *m)
{
    return (size_t)jdt_shape_numel(&m->x->shape) / (size_t)m->batch * jdt_dtype_size(m->x->dtype);
}

static size_t y_row_elems(const jdt_model *m)
{
    return (size_t)jdt_shape_numel(&m->y->shape) / (size_t)m->batch;
}

jdt_status jdt_step_run(jdt_step *s, int64_t t, double lr, const void *x, const int32_t *y,
                        double *loss, double *grad_norm, jdt_err *e)
{
    const jdt_config *cfg = s->cfg;
    const jdt_model *m = &s->m_main;
    s->lr = (float)lr;
    s->bc1 = (float)(1.0 / (1.0 - pow(cfg->optimizer.beta1, (double)(t + 1))));
    s->bc2 = (float)(1.0 / (1.0 - pow(cfg->optimizer.beta2, (double)(t + 1))));
    s->inv_accum = 1.0f / (float)s->o.n_accum;
    s->dropout_step = (int32_t)t;
    const size_t xb = x_row_bytes(m) * (size_t)m->batch, yn = y_row_elems(m) * (size_t)m->batch;
    double sum = 0;
    jdt_status st;
    for (int k = 0; k < s->o.n_accum; k++) {
        m->x->data = (void *)((const char *)x + (size_t)k * xb);
        m->y->data = (void *)(y + (size_t)k * yn);
        s->dropout_row0 = (double)(s->rank_row0 + (int64_t)k * m->batch);
        if ((st = exec_run(&s->main, e)) != JDT_OK)
            return jdt_err_prefix(e, "step %lld", (long long)(t + 1));
        float l;
        if ((st = exec_scalar(&s->main, s->out_loss, &l, e)) != JDT_OK)
            return jdt_err_prefix(e, "step %lld", (long long)(t + 1));
        sum += l;
    }
    if (s->apply.g && (st = exec_run(&s->apply, e)) != JDT_OK)
        return jdt_err_prefix(e, "step %lld (optimizer)", (long long)(t + 1));
    *loss = sum / s->o.n_accum;
    float gn;
    if ((st = exec_scalar(s->apply.g ? &s->apply : &s->main, s->out_norm, &gn, e)) != JDT_OK)
        return jdt_err_prefix(e, "step %lld", (long long)(t + 1));
    *grad_norm = gn;
    if (!isfinite(*loss) || !isfinite(*grad_norm))
        return jdt_err_set(e, JDT_ERR_NUMERIC, "step %lld: loss %g, gradient norm %g is not finite",
                           (long long)(t + 1), *loss, *grad_norm);
    return JDT_OK;
}

jdt_status jdt_step_eval(jdt_step *s, const void *x, const int32_t *y, double *loss, jdt_err *e)
{
    s->m_eval.x->data = (void *)x;
    s->m_eval.y->data = (void *)y;
    jdt_status st = exec_run(&s->eval, e);
    if (st != JDT_OK) return jdt_err_prefix(e, "eval");
    float l;
    if ((st = exec_scalar(&s->eval, 0, &l, e)) != JDT_OK) return jdt_err_prefix(e, "eval");
    *loss = l;
    return JDT_OK;
}

jdt_status jdt_step_sync_host(jdt_step *s, jdt_err *e)
{
    return jdt_device_pull(s->o.copts.device, e);
}

void jdt_step_host_changed(jdt_step *s)
{
    jdt_device_push(s->o.copts.device);
}

const char *jdt_step_source(const jdt_step *s)
{
    return s->main.p ? jdt_program_source(s->main.p) : "";
}

int jdt_step_n_tensors(const jdt_step *s)
{
    return s->n_tensors;
}

void jdt_step_tensor(const jdt_step *s, int i, const char **name, float **data, jdt_shape *shape)
{
    *name = s->tensors[i].name;
    *data = s->tensors[i].data;
    *shape = s->tensors[i].shape;
}

bool jdt_step_tensor_block(const jdt_step *s, int i, jdt_shape *global, int64_t *offset)
{
    const host_tensor *h = &s->tensors[i];
    *global = h->global;
    for (int d = 0; d < h->global.ndim; d++)
        offset[d] = jdt_shard_local_offset(&s->mesh, &h->global, &h->place, d);
    /* the owner of a block is the rank at coordinate 0 of every axis the tensor is replicated
     * over, so exactly one rank writes each piece */
    unsigned repl = jdt_shard_grad_axes(&s->mesh, &h->place);
    return jdt_mesh_group_index(&s->mesh, repl) == 0;
}

const jdt_placement *jdt_step_tensor_placement(const jdt_step *s, int i)
{
    return &s->tensors[i].place;
}

int jdt_step_n_params(const jdt_step *s)
{
    return s->n_params;
}

const jdt_mesh *jdt_step_mesh(const jdt_step *s)
{
    return &s->mesh;
}

static const exec *step_exec(const jdt_step *s, jdt_step_prog which)
{
    switch (which) {
    case JDT_STEP_PROG_MAIN:
        return &s->main;
    case JDT_STEP_PROG_APPLY:
        return &s->apply;
    case JDT_STEP_PROG_EVAL:
        return &s->eval;
    }
    return NULL;
}

const jdt_graph *jdt_step_graph(const jdt_step *s, jdt_step_prog which)
{
    const exec *x = step_exec(s, which);
    return x ? x->g : NULL;
}

const jdt_compile_stats *jdt_step_prog_stats(const jdt_step *s, jdt_step_prog which)
{
    const exec *x = step_exec(s, which);
    return x && x->p ? jdt_program_stats(x->p) : NULL;
}

int64_t jdt_step_state_bytes(const jdt_step *s)
{
    int64_t n = 0;
    for (int i = 0; i < s->n_tensors; i++)
        n += jdt_shape_numel(&s->tensors[i].shape) * (int64_t)sizeof(float);
    return n;
}

const jdt_model *jdt_step_model(const jdt_step *s)
{
    return &s->m_main;
}

const jdt_compile_stats *jdt_step_stats(const jdt_step *s)
{
    return s->main.p ? jdt_program_stats(s->main.p) : NULL;
}

double jdt_step_model_flops(const jdt_step *s)
{
    const jdt_config *c = s->cfg;
    /* the whole model's count: m_main holds this rank's blocks on a sharded mesh */
    double n = (double)jdt_config_param_count(c);
    if (c->model.type == JDT_MODEL_MLP) return 6.0 * n * (double)c->data.batch_size;
    /* nanoGPT/PaLM convention: 6 N per token (position embeddings excluded) + 12 L T C for
     * attention scores and mixing, times tokens per step */
    const double T = c->model.seq_len, C = c->model.n_embd, L = c->model.n_layer;
    if (c->model.pos == JDT_POS_LEARNED) n -= T * C;
    return (6.0 * n + 12.0 * L * T * C) * T * (double)c->data.batch_size;
}

double jdt_train_lr(const jdt_config *cfg, int64_t t)
{
    const double lr = cfg->optimizer.lr, min_lr = lr * cfg->optimizer.min_lr_ratio;
    const int64_t warm = cfg->optimizer.warmup_steps, decay = jdt_config_decay_steps(cfg);
    if (t < warm) return lr * (double)(t + 1) / (double)warm;
    if (cfg->optimizer.schedule == JDT_SCHED_CONSTANT) return lr;
    if (t >= decay) return min_lr;
    double frac = decay > warm ? (double)(t - warm) / (double)(decay - warm) : 1.0;
    if (cfg->optimizer.schedule == JDT_SCHED_LINEAR) return lr + (min_lr - lr) * frac;
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + cos(3.141592653589793 * frac));
}

char *jdt_step_profile(const jdt_step *s, char *buf, size_t n)
{
    size_t off = 0;
    const exec *xs[2] = {&s->main, &s->apply};
    buf[0] = '\0';
    for (int k = 0; k < 2; k++) {
        if (!xs[k]->p || off + 2 >= n) continue;
        jdt_program_profile(xs[k]->p, buf + off, n - off);
        off += strlen(buf + off);
    }
    return buf;
}

void jdt_step_profile_reset(jdt_step *s)
{
    jdt_program_profile_reset(s->main.p);
    jdt_program_profile_reset(s->apply.p);
}

jdt_status jdt_train_check_mesh(const jdt_config *cfg, int world_size, jdt_err *e)
{
    const int sizes[JDT_MESH_AXIS_COUNT] = {cfg->mesh.data, cfg->mesh.fsdp, cfg->mesh.tensor};
    jdt_mesh m;
    jdt_status st = jdt_mesh_init(&m, sizes, world_size, 0, e);
    if (st != JDT_OK || world_size <= 1) return st;
    const int ways = jdt_mesh_group_size(&m, jdt_shard_batch_axes(&m, &cfg->sharding.rules));
    if (cfg->data.batch_size % ways || cfg->data.micro_batch_size % ways)
        return jdt_err_set(e, JDT_ERR_CONFIG,
                           "data.batch_size %d and data.micro_batch_size %d must be multiples of "
                           "the %d ways the batch is split",
                           cfg->data.batch_size, cfg->data.micro_batch_size, ways);
    /* every leaf of the model against the rules: shapes only, no values */
    jdt_graph *g = jdt_graph_new();
    if (!g) return jdt_err_set(e, JDT_ERR_NOMEM, "train: out of memory");
    jdt_model md;
    st = jdt_model_build(g, cfg, cfg->data.micro_batch_size, true, &md, e);
    for (int i = 0; st == JDT_OK && i < jdt_graph_n_nodes(g); i++) {
        const jdt_tensor *t = jdt_graph_node(g, i);
        jdt_placement p;
        if (t->op == JDT_OP_PARAM || t->op == JDT_OP_INPUT)
            st = jdt_shard_leaf_placement(&m, &cfg->sharding.rules, t, &p, e);
    }
    jdt_graph_free(g);
    return st;
}
