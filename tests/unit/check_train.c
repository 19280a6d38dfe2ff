/*
 * check_train.c — unit tests for models/ and engine/train: parameter counts agree with the
 * config's formula for every model option, the compiled train step matches the reference
 * interpreter step for step, gradient accumulation matches one big batch, and the LR schedule.
 */
#include "tests/unit/testutil.h"
#include "autodiff/autodiff.h"
#include "config/config.h"
#include "graph/builder.h"
#include "models/models.h"
#include "runtime/runtime.h"
#include "train/train.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *BASE = "run: {seed: 7, steps: 10}\n"
                          "model: {type: gpt, vocab_size: 64, seq_len: 16, n_layer: 2, n_embd: 32, "
                          "n_head: 4}\n"
                          "data: {format: synthetic, batch_size: 4, micro_batch_size: 4}\n"
                          "optimizer: {lr: 0.003, warmup_steps: 2}\n";

static void load(jdt_config *c, int n_over, char **over)
{
    jdt_err e;
    jdt_err_clear(&e);
    jdt_status st = jdt_config_load_string(BASE, "test", n_over, over, NULL, c, &e);
    ck_assert_msg(st == JDT_OK, "config: %s", e.msg);
}

/* load with the n overrides `over` and one more, `extra`, last. */
static void load_plus(jdt_config *c, char **over, int n, const char *extra)
{
    char *args[12];
    ck_assert_int_le(n, 11);
    for (int i = 0; i < n; i++)
        args[i] = over[i];
    args[n] = (char *)extra;
    load(c, n + 1, args);
}

/* The compiler's remat for c's runtime.remat, as training maps it (jdt_train_compile_opts). */
static jdt_compile_remat copts_remat(const jdt_config *c)
{
    jdt_compile_opts o;
    jdt_train_compile_opts(c, &o);
    return o.remat;
}

START_TEST(test_param_count_matches_config)
{
    char *variants[][4] = {
        {"model.norm=layernorm", "model.bias=true", NULL, NULL},
        {"model.norm=rmsnorm", "model.pos=rope", "model.activation=swiglu", "model.bias=false"},
        {"model.tie_embeddings=false", "model.n_kv_head=2", NULL, NULL},
        {"model.activation=relu", "model.n_kv_head=1", "model.pos=rope", NULL},
        {"model.type=mlp", "model.in_dim=12", "model.n_classes=5", "model.n_hidden=2"},
        {"model.activation=swiglu", "model.mlp_dim=88", "model.bias=false", NULL},
        {"model.qkv_bias=true", "model.bias=false", "model.head_dim=24", "model.qk_norm=true"},
        {"model.qk_norm=true", "model.norm=layernorm", "model.bias=true", "model.head_dim=6"},
        {"model.activation=geglu", "model.embed_scale=true", "model.bias=false", "model.mlp_dim=72"},
    };
    for (size_t v = 0; v < JDT_ARRAY_LEN(variants); v++) {
        int n = 0;
        while (n < 4 && variants[v][n]) n++;
        jdt_config c;
        load(&c, n, variants[v]);
        jdt_graph *g = jdt_graph_new();
        jdt_model m;
        jdt_err e;
        jdt_status st = jdt_model_build(g, &c, 2, true, &m, &e);
        ck_assert_msg(st == JDT_OK, "variant %zu: %s", v, e.msg);
        ck_assert_msg(jdt_model_param_count(&m) == jdt_config_param_count(&c),
                      "variant %zu: model %lld vs config %lld", v,
                      (long long)jdt_model_param_count(&m), (long long)jdt_config_param_count(&c));
        for (int i = 0; i < m.n_params; i++) /* every parameter dim carries a logical axis name */
            for (int d = 0; d < m.params[i].t->shape.ndim; d++)
                if (strcmp(m.params[i].t->name, "wpe") != 0 || d == 1)
                    ck_assert_msg(m.params[i].t->axes[d] != NULL, "%s dim %d has no axis name",
                                  m.params[i].t->name, d);
        jdt_graph_free(g);
        jdt_config_free(&c);
    }
}
END_TEST

/* Deterministic pseudo-data: tokens of a fixed pattern. */
static void fill_batch(int32_t *x, int32_t *y, int rows, int T, int V, int k)
{
    for (int r = 0; r < rows; r++)
        for (int t = 0; t < T; t++) {
            x[r * T + t] = (r * 7 + t * 3 + k * 5) % V;
            y[r * T + t] = (r * 7 + (t + 1) * 3 + k * 5) % V;
        }
}

static int64_t g_last_arena; /* planned arena of the last run_steps program */
static int g_last_slices;    /* its cross-entropy slices run next to their forward */

static void run_steps(jdt_config *c, bool jit, int micro, int n_steps, double *losses)
{
    char cache[] = "/tmp/jdt-check-train-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(cache));
    jdt_step_opts o;
    memset(&o, 0, sizeof o);
    o.micro_batch = micro;
    o.n_accum = c->data.batch_size / micro;
    o.use_jit = jit;
    jdt_compile_opts_init(&o.copts);
    o.copts.cache_dir = cache;
    o.copts.threads = 1;
    o.copts.remat = copts_remat(c);
    jdt_step *s = NULL;
    jdt_err e;
    jdt_status st = jdt_step_new(c, &o, &s, &e);
    ck_assert_msg(st == JDT_OK, "step_new: %s", e.msg);
    g_last_arena = jit ? jdt_step_stats(s)->arena_bytes : 0;
    g_last_slices = jit ? jdt_step_stats(s)->n_loss_slices : 0;
    int B = c->data.batch_size, T = c->model.seq_len;
    int32_t *x = malloc(sizeof(int32_t) * (size_t)(B * T)), *y = malloc(sizeof(int32_t) * (size_t)(B * T));
    for (int k = 0; k < n_steps; k++) {
        fill_batch(x, y, B, T, c->model.vocab_size, k);
        double gn;
        st = jdt_step_run(s, k, jdt_train_lr(c, k), x, y, &losses[k], &gn, &e);
        ck_assert_msg(st == JDT_OK, "step %d: %s", k, e.msg);
    }
    free(x);
    free(y);
    jdt_step_free(s);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", cache);
    ck_assert_int_eq(system(cmd), 0);
}

START_TEST(test_jit_matches_interpreter)
{
    /* every model option on, AdamW with clipping and weight decay */
    char *over[] = {"model.norm=rmsnorm",      "model.pos=rope",         "model.activation=swiglu",
                    "model.n_kv_head=2",       "optimizer.grad_clip=0.5", "model.tie_embeddings=false",
                    "model.qk_norm=true",      "model.head_dim=12"};
    jdt_config c;
    load(&c, JDT_ARRAY_LEN(over), over);
    double a[4], b[4];
    run_steps(&c, false, 4, 4, a);
    run_steps(&c, true, 4, 4, b);
    for (int k = 0; k < 4; k++)
        ck_assert_msg(fabs(a[k] - b[k]) <= 1e-4 * fabs(a[k]), "step %d: interp %.8f jit %.8f", k, a[k], b[k]);
    ck_assert(a[3] < a[0]); /* and it learns */
    jdt_config_free(&c);

    char *over2[] = {"optimizer.type=sgd", "optimizer.momentum=0.9", "optimizer.nesterov=true",
                     "model.activation=gelu", "optimizer.lr=0.1"};
    load(&c, JDT_ARRAY_LEN(over2), over2);
    run_steps(&c, false, 4, 3, a);
    run_steps(&c, true, 4, 3, b);
    for (int k = 0; k < 3; k++)
        ck_assert_msg(fabs(a[k] - b[k]) <= 1e-4 * fabs(a[k]), "sgd step %d: interp %.8f jit %.8f", k, a[k], b[k]);
    jdt_config_free(&c);
}
END_TEST

START_TEST(test_accumulation_matches_big_batch)
{
    jdt_config c;
    load(&c, 0, NULL);
    double a[4], b[4];
    run_steps(&c, true, 4, 4, a); /* one micro-batch of 4 */
    run_steps(&c, true, 2, 4, b); /* two of 2, accumulated */
    for (int k = 0; k < 4; k++)
        ck_assert_msg(fabs(a[k] - b[k]) <= 1e-5 * fabs(a[k]), "step %d: %.9f vs %.9f", k, a[k], b[k]);
    jdt_config_free(&c);
}
END_TEST

START_TEST(test_lr_schedule)
{
    char *over[] = {"optimizer.schedule=cosine", "optimizer.warmup_steps=10", "run.steps=110",
                    "optimizer.min_lr_ratio=0.1", "optimizer.lr=1.0"};
    jdt_config c;
    load(&c, JDT_ARRAY_LEN(over), over);
    ck_assert(fabs(jdt_train_lr(&c, 0) - 0.1) < 1e-12);   /* warmup: (t+1)/warmup */
    ck_assert(fabs(jdt_train_lr(&c, 9) - 1.0) < 1e-12);
    ck_assert(fabs(jdt_train_lr(&c, 10) - 1.0) < 1e-12);  /* cosine starts at lr */
    ck_assert(fabs(jdt_train_lr(&c, 60) - 0.55) < 1e-12); /* halfway: (lr + min) / 2 */
    ck_assert(fabs(jdt_train_lr(&c, 110) - 0.1) < 1e-12); /* decayed to min */
    ck_assert(fabs(jdt_train_lr(&c, 500) - 0.1) < 1e-12);
    jdt_config_free(&c);
    char *lin[] = {"optimizer.schedule=linear", "optimizer.warmup_steps=0", "run.steps=100",
                   "optimizer.min_lr_ratio=0", "optimizer.lr=2.0"};
    load(&c, JDT_ARRAY_LEN(lin), lin);
    ck_assert(fabs(jdt_train_lr(&c, 50) - 1.0) < 1e-12);
    jdt_config_free(&c);
}
END_TEST

START_TEST(test_init_is_deterministic_by_name)
{
    jdt_config c;
    load(&c, 0, NULL);
    jdt_graph *g1 = jdt_graph_new(), *g2 = jdt_graph_new();
    jdt_model m1, m2;
    jdt_err e;
    ck_assert_int_eq(jdt_model_build(g1, &c, 2, true, &m1, &e), JDT_OK);
    ck_assert_int_eq(jdt_model_build(g2, &c, 8, false, &m2, &e), JDT_OK); /* other batch size */
    ck_assert_int_eq(m1.n_params, m2.n_params);
    for (int i = 0; i < m1.n_params; i++) {
        ck_assert_str_eq(m1.params[i].t->name, m2.params[i].t->name);
        size_t n = (size_t)jdt_shape_numel(&m1.params[i].t->shape);
        float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
        jdt_model_init_param(&m1.params[i], 42, a);
        jdt_model_init_param(&m2.params[i], 42, b);
        ck_assert(memcmp(a, b, n * sizeof *a) == 0);
        if (m1.params[i].init == JDT_INIT_NORMAL) {
            double ss = 0;
            for (size_t j = 0; j < n; j++) ss += (double)a[j] * a[j];
            double sd = sqrt(ss / (double)n);
            ck_assert_msg(n < 256 || fabs(sd - m1.params[i].std) < 0.2 * m1.params[i].std,
                          "%s: std %g, want %g", m1.params[i].t->name, sd, m1.params[i].std);
        }
        free(a);
        free(b);
    }
    jdt_graph_free(g1);
    jdt_graph_free(g2);
    jdt_config_free(&c);
}
END_TEST

/* Trains the 4-block model with overrides over[0..n) plus runtime.remat none, block and dots
 * (each compiled, and dots and block also interpreted): the same losses, within 1e-6 compiled
 * and 1e-4 interpreted, and smaller planned arenas; the arenas in arena[3] (none, dots, block). */
static void remat_case(const char *what, char **over, int n, int64_t arena[3])
{
    static const char *const modes[3] = {"runtime.remat=none", "runtime.remat=dots",
                                         "runtime.remat=block"};
    double l0[3] = {0, 0, 0};
    for (int m = 0; m < 3; m++) {
        jdt_config c;
        load_plus(&c, over, n, modes[m]);
        double l[3] = {0, 0, 0}, li[3] = {0, 0, 0};
        run_steps(&c, true, 4, 3, l);
        arena[m] = g_last_arena;
        if (m == 0) {
            memcpy(l0, l, sizeof l0);
        } else {
            run_steps(&c, false, 4, 3, li);
            for (int k = 0; k < 3; k++) {
                ck_assert_msg(fabs(l0[k] - l[k]) <= 1e-6 * fabs(l0[k]),
                              "%s, %s step %d: %.9f vs %.9f", what, modes[m], k, l0[k], l[k]);
                ck_assert_msg(fabs(li[k] - l[k]) <= 1e-4 * fabs(li[k]),
                              "%s, %s step %d: interp %.9f vs %.9f", what, modes[m], k, li[k],
                              l[k]);
            }
        }
        jdt_config_free(&c);
    }
    printf("remat, %s: planned arena none %lld, dots %lld, block %lld bytes\n", what,
           (long long)arena[0], (long long)arena[1], (long long)arena[2]);
    /* block keeps only each block's input; dots more, and less than none */
    ck_assert_msg(arena[2] < arena[1] && arena[1] < arena[0], "%s: arenas not in order", what);
}

START_TEST(test_remat_same_losses_less_memory)
{
    /* 4 blocks, T=32, dropout: per-block recompute, and recompute of all but the GEMMs' and
     * attentions' outputs (dots), give the losses of no remat (same kernels, same order of
     * float operations per value) with smaller planned arenas. GPT-2's layer under AdamW, then
     * Llama's (RMSNorm, RoPE, SwiGLU, grouped-query attention, no biases) under plain SGD
     * without clipping, whose steps follow the gradients' scale too */
    char *gpt[] = {"model.n_layer=4", "model.seq_len=32", "model.dropout=0.1"};
    char *llama[] = {"model.n_layer=4", "model.seq_len=32", "model.dropout=0.1",
                     "model.norm=rmsnorm", "model.pos=rope", "model.activation=swiglu",
                     "model.bias=false", "model.n_kv_head=2", "optimizer.type=sgd",
                     "optimizer.grad_clip=0", "optimizer.lr=0.05"};
    int64_t a[3], b[3];
    remat_case("GPT-2's layer", gpt, JDT_ARRAY_LEN(gpt), a);
    remat_case("Llama's layer", llama, JDT_ARRAY_LEN(llama), b);
    /* dots must drop the norms' outputs, the mid-block residual and the MLP's activation:
     * GPT-2's arena 0.68 of none's when written; kept GEMMs reading the forward's copies of
     * their inputs instead of the recomputed ones (a planted fault) left 0.93 */
    ck_assert_msg((double)a[1] < 0.8 * (double)a[0], "GPT-2's layer: dots' arena %lld not under 0.8 of %lld",
                  (long long)a[1], (long long)a[0]);
}
END_TEST

/* The losses of 3 steps and the planned arena with the head in `chunks` sequence slices. */
static int64_t chunks_run(char **over, int n, int chunks, bool jit, double l[3])
{
    char arg[64];
    snprintf(arg, sizeof arg, "runtime.loss_chunks=%d", chunks);
    jdt_config c;
    load_plus(&c, over, n, arg);
    run_steps(&c, jit, 4, 3, l);
    jdt_config_free(&c);
    if (jit) ck_assert_int_eq(g_last_slices, chunks > 1 ? chunks : 0);
    return g_last_arena;
}

START_TEST(test_loss_chunks_same_losses_less_memory)
{
    /* runtime.loss_chunks: the head and the cross-entropy on slices of the sequence, each
     * slice's backward run right after its forward (passes.c hoist_loss_backwards), give the
     * losses of the whole head (its weight gradient summed slice by slice: f32 rounding) and
     * the interpreter's, with one slice's logits live at a time: a smaller planned arena where
     * the vocabulary is the widest dimension (V = 4096, C = 32, T = 32). GPT-2's layer (tied
     * head), then Llama's (untied head, SGD); 5 slices of 6 or 7 tokens, and 8 of 4 */
    char *gpt[] = {"model.seq_len=32", "model.vocab_size=4096", "runtime.remat=block"};
    char *llama[] = {"model.seq_len=32",         "model.vocab_size=4096",  "runtime.remat=block",
                     "model.norm=rmsnorm",       "model.pos=rope",         "model.activation=swiglu",
                     "model.bias=false",         "model.n_kv_head=2",      "model.tie_embeddings=false",
                     "optimizer.type=sgd",       "optimizer.lr=0.05"};
    struct {
        const char *what;
        char **over;
        int n;
    } cases[2] = {{"GPT-2's layer", gpt, JDT_ARRAY_LEN(gpt)}, {"Llama's layer", llama, JDT_ARRAY_LEN(llama)}};
    for (int m = 0; m < 2; m++) {
        double l1[3], lk[3], li[3];
        int64_t a1 = chunks_run(cases[m].over, cases[m].n, 1, true, l1);
        for (int chunks = 5; chunks <= 8; chunks += 3) {
            int64_t ak = chunks_run(cases[m].over, cases[m].n, chunks, true, lk);
            chunks_run(cases[m].over, cases[m].n, chunks, false, li);
            for (int k = 0; k < 3; k++) {
                ck_assert_msg(fabs(l1[k] - lk[k]) <= 1e-6 * fabs(l1[k]), "%s, %d slices, step %d: %.9f vs %.9f",
                              cases[m].what, chunks, k, l1[k], lk[k]);
                ck_assert_msg(fabs(li[k] - lk[k]) <= 1e-4 * fabs(li[k]),
                              "%s, %d slices, step %d: interp %.9f vs %.9f", cases[m].what, chunks, k,
                              li[k], lk[k]);
            }
            printf("loss chunks, %s: planned arena whole %lld, %d slices %lld bytes\n", cases[m].what,
                   (long long)a1, chunks, (long long)ak);
            ck_assert_msg((double)ak < 0.75 * (double)a1, "%s: %d slices' arena %lld not under 0.75 of %lld",
                          cases[m].what, chunks, (long long)ak, (long long)a1);
        }
    }
}
END_TEST

/* test_bf16_activations: the backward without jdt_graph_bf16_grads, for comparison */
static bool no_bf16_grads;
/* bf16_grads' last compiled program: its bf16 CASTs folded into builtins (compile stats) */
static int last_n_folded;

/* One forward + backward of model cfg on graph g with the bf16 compute flag on: outputs loss
 * and every parameter's gradient, computed by the compiled program (or the interpreter). */
static void bf16_grads(const jdt_config *cfg, bool cast_weights, bool jit, double *out,
                       int64_t cap, int64_t *n_out, int *n_casts)
{
    jdt_graph *g = jdt_graph_new();
    jdt_graph_set_matmul_bf16(g, true);
    jdt_graph_set_bf16_weights(g, cast_weights);
    jdt_graph_set_bf16_grads(g, cfg->precision.activations == JDT_DTYPE_BF16 && !no_bf16_grads);
    jdt_model m;
    jdt_err e;
    ck_assert_msg(jdt_model_build(g, cfg, 4, true, &m, &e) == JDT_OK, "%s", e.msg);
    jdt_tensor *params[64], *grads[64];
    ck_assert_int_le(m.n_params, 64);
    for (int i = 0; i < m.n_params; i++)
        params[i] = m.params[i].t;
    ck_assert_msg(jdt_autodiff_grad(g, m.loss, m.n_params, params, grads, &e) == JDT_OK, "%s",
                  e.msg);
    jdt_graph_add_output(g, m.loss);
    for (int i = 0; i < m.n_params; i++)
        jdt_graph_add_output(g, grads[i]);
    /* the casts: one per parameter at most, each of a parameter, read by GEMMs only; no GEMM
     * reads a parameter directly when there are casts. The backward's other casts are of the
     * cotangents the gradient GEMMs read (ops.c vjp_MATMUL): none without weight casts, at
     * least one per GEMM weight (here: a dy per GEMM but the cross-entropy's) with them */
    *n_casts = 0;
    int n_dy_casts = 0;
    for (int i = 0; i < jdt_graph_n_nodes(g); i++) {
        const jdt_tensor *t = jdt_graph_node(g, i);
        if (t->op == JDT_OP_CAST && t->dtype == JDT_DTYPE_BF16 &&
            t->inputs[0]->op != JDT_OP_PARAM) {
            ck_assert_int_eq(t->inputs[0]->dtype, JDT_DTYPE_F32);
            n_dy_casts++;
            continue;
        }
        if (t->op == JDT_OP_CAST && t->dtype == JDT_DTYPE_BF16) {
            for (int j = 0; j < i; j++) {
                const jdt_tensor *u = jdt_graph_node(g, j);
                ck_assert(!(u->op == JDT_OP_CAST && u->dtype == JDT_DTYPE_BF16 &&
                            u->inputs[0] == t->inputs[0]));
            }
            (*n_casts)++;
        }
    }
    if (!cast_weights) ck_assert_int_eq(n_dy_casts, 0);
    if (cast_weights) ck_assert_int_ge(n_dy_casts, *n_casts - 1);
    for (int i = 0; i < jdt_graph_n_nodes(g) && *n_casts; i++) {
        const jdt_tensor *t = jdt_graph_node(g, i);
        if (t->op == JDT_OP_MATMUL)
            ck_assert_msg(t->inputs[0]->op != JDT_OP_PARAM && t->inputs[1]->op != JDT_OP_PARAM,
                          "matmul node %d reads a parameter uncast", t->id);
    }
    float *pdata[64];
    for (int i = 0; i < m.n_params; i++) {
        pdata[i] = malloc(sizeof(float) * (size_t)jdt_shape_numel(&params[i]->shape));
        jdt_model_init_param(&m.params[i], 7, pdata[i]);
        params[i]->data = pdata[i];
    }
    int32_t x[4 * 64], y[4 * 64];
    float xf[4 * 64];
    if (cfg->model.type == JDT_MODEL_MLP) {
        ck_assert_int_le(cfg->model.in_dim, 64);
        for (int j = 0; j < 4 * cfg->model.in_dim; j++)
            xf[j] = (float)((j * 37) % 101) / 50.0f - 1.0f;
        for (int r = 0; r < 4; r++)
            y[r] = r % cfg->model.n_classes;
        m.x->data = xf;
    } else {
        ck_assert_int_le(cfg->model.seq_len, 64);
        fill_batch(x, y, 4, cfg->model.seq_len, cfg->model.vocab_size, 1);
        m.x->data = x;
    }
    m.y->data = y;
    char cache[] = "/tmp/jdt-check-train-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(cache));
    jdt_compile_opts o;
    jdt_compile_opts_init(&o);
    o.cache_dir = cache;
    o.threads = 1;
    o.no_jit = !jit;
    jdt_program *p = NULL;
    ck_assert_msg(jdt_program_compile(g, &o, &p, &e) == JDT_OK, "%s", e.msg);
    ck_assert_msg(jdt_program_run(p, &e) == JDT_OK, "%s", e.msg);
    last_n_folded = jdt_program_stats(p)->n_bf16_folded;
    *n_out = 0;
    for (int k = 0; k < jdt_graph_n_outputs(g); k++) {
        int64_t n = jdt_shape_numel(&jdt_graph_output(g, k)->shape);
        ck_assert_int_le(*n_out + n, cap);
        float *v = malloc(sizeof(float) * (size_t)n);
        ck_assert_msg(jdt_program_read_output(p, k, v, sizeof(float) * (size_t)n, &e) == JDT_OK,
                      "%s", e.msg);
        for (int64_t j = 0; j < n; j++)
            out[(*n_out)++] = v[j];
        free(v);
    }
    jdt_program_free(p);
    for (int i = 0; i < m.n_params; i++)
        free(pdata[i]);
    jdt_graph_free(g);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", cache);
    ck_assert_int_eq(system(cmd), 0);
}

static double max_abs(const double *x, int64_t n)
{
    double m = 0;
    for (int64_t j = 0; j < n; j++)
        m = fmax(m, fabs(x[j]));
    return m;
}

/* max over j of |got - want| / (|want| + 1e-3 scale): relative, with values far below the
 * largest (scale) compared absolutely */
static double max_rel_diff(const double *got, const double *want, int64_t n, double scale)
{
    double w = 0;
    for (int64_t j = 0; j < n; j++)
        w = tu_worse(w, fabs(got[j] - want[j]) / (fabs(want[j]) + 1e-3 * scale));
    return w;
}

/* precision.compute: bf16 casts every GEMM weight to bf16 once (jdt_graph_bf16_weights: a
 * CAST node read by the forward GEMM and the backward's dX GEMM) instead of rounding it inside
 * each GEMM (the bf16 compute flag alone, as on CUDA and under FSDP): the same loss and
 * gradients up to f32 summation order, and the same as the interpreter. Tied and untied
 * embeddings, the llama variant and the MLP. */
START_TEST(test_bf16_cast_weights)
{
    char *variants[][5] = {
        {"precision.compute=bf16", NULL, NULL, NULL, NULL},
        {"precision.compute=bf16", "model.norm=rmsnorm", "model.pos=rope",
         "model.activation=swiglu", "model.tie_embeddings=false"},
        {"precision.compute=bf16", "model.type=mlp", "model.in_dim=64", "model.n_classes=5",
         "model.n_hidden=2"},
    };
    static double cast[200000], flag[200000], ref[200000];
    for (size_t v = 0; v < JDT_ARRAY_LEN(variants); v++) {
        int n = 0;
        while (n < 5 && variants[v][n]) n++;
        jdt_config c;
        load(&c, n, variants[v]);
        int64_t na, nb, nr;
        int casts, casts_flag, casts_ref;
        bf16_grads(&c, true, true, cast, 200000, &na, &casts);
        bf16_grads(&c, true, false, ref, 200000, &nr, &casts_ref);
        bf16_grads(&c, false, true, flag, 200000, &nb, &casts_flag); /* the flag form */
        ck_assert_int_eq(na, nb);
        ck_assert_int_eq(na, nr);
        ck_assert_int_eq(casts_flag, 0);
        ck_assert_msg(casts >= (c.model.type == JDT_MODEL_MLP ? 3 : 9), "variant %zu: %d casts", v,
                      casts);
        const double scale = max_abs(flag, na);
        const double worst = max_rel_diff(cast, flag, na, scale);
        const double worst_ref = max_rel_diff(cast, ref, na, scale);
        printf("bf16 cast weights, variant %zu: %d casts, %lld values, max rel diff vs the flag "
               "form %.3g, vs the interpreter %.3g (loss %.7f / %.7f)\n",
               v, casts, (long long)na, worst, worst_ref, cast[0], flag[0]);
        ck_assert_msg(worst < 1e-4, "variant %zu: cast vs flag %g", v, worst);
        /* the interpreter sums in another order, so an activation may round to the other
         * bf16 neighbour: a few 1e-3 on single gradient elements, the loss within 1e-4 */
        ck_assert_msg(worst_ref < 3e-2, "variant %zu: compiled vs interpreter %g", v, worst_ref);
        ck_assert_msg(fabs(cast[0] - ref[0]) <= 1e-4 * fabs(ref[0]), "variant %zu: loss %.9g vs "
                      "interpreter %.9g", v, cast[0], ref[0]);
        ck_assert_msg(fabs(cast[0] - flag[0]) <= 1e-6 * fabs(flag[0]), "variant %zu: loss %.9g vs %.9g",
                      v, cast[0], flag[0]);
        jdt_config_free(&c);
    }
}
END_TEST

/* precision.activations: bf16: the linear layers and the head store bf16 outputs
 * (bf16(x W + bf16(b)), models.c), and the cotangents of the bf16 activations GEMMs read are
 * rounded to bf16 (jdt_graph_bf16_grads). The CPU folds a GEMM's CAST to bf16 into the GEMM,
 * which stores bf16 itself (passes.c fold_bf16_casts; the CUDA backend too, check_cuda), and
 * the other CASTs are fused kernels: the compiled step agrees with the interpreter, and its
 * loss differs from the f32-activations one by the rounding, not more. GPT with biases and the
 * llama variant. */
START_TEST(test_bf16_activations)
{
    char *variants[][6] = {
        {"precision.compute=bf16", "precision.activations=bf16", NULL, NULL, NULL, NULL},
        {"precision.compute=bf16", "precision.activations=bf16", "model.norm=rmsnorm",
         "model.pos=rope", "model.activation=swiglu", "model.tie_embeddings=false"},
    };
    static double act[200000], ref[200000], f32a[200000], f32g[200000];
    for (size_t v = 0; v < JDT_ARRAY_LEN(variants); v++) {
        int n = 0;
        while (n < 6 && variants[v][n]) n++;
        jdt_config c;
        load(&c, n, variants[v]);
        int64_t na, nr, nf;
        int casts, casts_ref, casts_f;
        bf16_grads(&c, true, true, act, 200000, &na, &casts);
        ck_assert_msg(last_n_folded > 0, "variant %zu: no bf16 CAST folded into a GEMM", v);
        bf16_grads(&c, true, false, ref, 200000, &nr, &casts_ref);
        /* the GELU (SwiGLU) output's cotangent rounded to bf16 (jdt_graph_bf16_grads): the
         * same loss, other gradients than with it f32 */
        no_bf16_grads = true;
        int64_t ng;
        int casts_g;
        bf16_grads(&c, true, true, f32g, 200000, &ng, &casts_g);
        no_bf16_grads = false;
        ck_assert_int_eq(ng, na);
        ck_assert_msg(f32g[0] == act[0], "variant %zu: loss %.9g vs %.9g", v, f32g[0], act[0]);
        double gdiff = 0;
        for (int64_t j = 1; j < na; j++)
            gdiff = fmax(gdiff, fabs(f32g[j] - act[j]));
        ck_assert_msg(gdiff > 0, "variant %zu: rounding the activations' cotangents changed no "
                      "gradient", v);
        c.precision.activations = JDT_DTYPE_F32;
        bf16_grads(&c, true, true, f32a, 200000, &nf, &casts_f);
        ck_assert_int_eq(last_n_folded, 0);
        ck_assert_int_eq(na, nr);
        ck_assert_int_eq(na, nf);
        /* the bias casts (CAST to bf16 of a parameter) come on top of the weights' */
        if (v == 0) ck_assert_int_gt(casts, casts_f);
        const double worst_ref = max_rel_diff(act, ref, na, max_abs(ref, na));
        printf("bf16 activations, variant %zu: loss %.7f (interpreter %.7f, f32 activations "
               "%.7f), gradients vs the interpreter %.3g\n",
               v, act[0], ref[0], f32a[0], worst_ref);
        ck_assert_msg(worst_ref < 3e-2, "variant %zu: compiled vs interpreter %g", v, worst_ref);
        ck_assert_msg(fabs(act[0] - ref[0]) <= 1e-4 * fabs(ref[0]), "variant %zu: loss %.9g vs "
                      "interpreter %.9g", v, act[0], ref[0]);
        ck_assert_msg(act[0] != f32a[0] && fabs(act[0] - f32a[0]) <= 1e-2 * fabs(f32a[0]),
                      "variant %zu: loss %.9g, with f32 activations %.9g", v, act[0], f32a[0]);
        jdt_config_free(&c);
    }
}
END_TEST

/* The planned train step of a GPT (what `inspect` prints), f32 vs precision.compute: bf16,
 * with and without block remat: bf16 stores the values only bf16 GEMMs read as bf16, so its
 * arena is smaller (on the oneDNN path; the portable path's f32 GEMM scratch may outweigh
 * it), and with storage forced off it is no smaller. The eval program runs in the train
 * step's arena. Planner numbers only, nothing runs. */
static int64_t planned_arena(const char *prec, const char *remat, bool no_storage,
                             int *n_bf16, int *n_conv, bool *eval_shared)
{
    char p[64], r[64];
    snprintf(p, sizeof p, "precision.compute=%s", prec);
    snprintf(r, sizeof r, "runtime.remat=%s", remat);
    char *over[] = {"model.n_layer=3", "model.seq_len=64", "model.n_embd=64", p, r};
    jdt_config c;
    load(&c, JDT_ARRAY_LEN(over), over);
    jdt_step_opts o;
    memset(&o, 0, sizeof o);
    o.micro_batch = c.data.micro_batch_size;
    o.n_accum = 1;
    o.use_jit = true;
    o.plan_only = true;
    jdt_compile_opts_init(&o.copts);
    o.copts.threads = 1;
    o.copts.remat = copts_remat(&c);
    o.copts.no_bf16_storage = no_storage;
    jdt_step *s = NULL;
    jdt_err e;
    ck_assert_msg(jdt_step_new(&c, &o, &s, &e) == JDT_OK, "%s", e.msg);
    const jdt_compile_stats *m = jdt_step_prog_stats(s, JDT_STEP_PROG_MAIN);
    int64_t a = m->arena_bytes;
    *n_bf16 = m->n_bf16_stored;
    *n_conv = m->n_bf16_converted;
    *eval_shared = jdt_step_prog_stats(s, JDT_STEP_PROG_EVAL)->arena_shared;
    jdt_step_free(s);
    jdt_config_free(&c);
    return a;
}

START_TEST(test_bf16_plan_smaller)
{
    const char *remats[2] = {"none", "block"};
    for (int k = 0; k < 2; k++) {
        int n32, n16, n16off, c32, c16, c16off;
        bool sh32, sh16, sh16off;
        int64_t a32 = planned_arena("f32", remats[k], false, &n32, &c32, &sh32);
        int64_t a16 = planned_arena("bf16", remats[k], false, &n16, &c16, &sh16);
        int64_t a16off = planned_arena("bf16", remats[k], true, &n16off, &c16off, &sh16off);
        printf("remat %s: planned train arena f32 %lld, bf16 %lld (%d values stored as bf16, "
               "%d GEMM operands converted per call), bf16 without bf16 storage %lld (%d "
               "converted)\n", remats[k], (long long)a32, (long long)a16, n16, c16,
               (long long)a16off, c16off);
        ck_assert_int_eq(n32, 0);
        ck_assert_int_eq(c32, 0);
        /* without the compiler's bf16 storage only the bf16 CASTs are: one per GEMM weight (q,
         * k, v, o, fc, proj in each of 3 blocks and the tied embedding; block remat recomputes
         * a block's with the rest of it for the backward) and one per cotangent the gradient
         * GEMMs read (the same six per block; the cross-entropy's dlogits is not cast) */
        ck_assert_int_eq(n16off, (k == 0 ? 6 * 3 + 1 : 2 * 6 * 3 + 1) + 6 * 3);
        /* with it, no bf16 GEMM converts an operand at every call: the forward's activations
         * are stored as bf16 and the backward's cotangents are cast once, in the kernel that
         * computes them; without it, the activations are converted */
        ck_assert_int_eq(c16, 0);
        ck_assert_int_gt(c16off, 0);
        ck_assert_int_ge(n16, n16off + 4); /* per block at least: ln1, ln2, attention out, gelu */
        ck_assert_msg(a16 < a16off, "remat %s: bf16 storage %lld not below %lld", remats[k],
                      (long long)a16, (long long)a16off);
        if (jdt_rt_bf16_native())
            ck_assert_msg(a16 < a32, "remat %s: bf16 arena %lld not below f32 %lld", remats[k],
                          (long long)a16, (long long)a32);
        ck_assert(sh32 && sh16 && sh16off);
    }
}
END_TEST

/* A step built with opts.plan_only (what `inspect` plans with) is the compiled step without
 * values or code: the same tensors and shapes, the same arenas, kernels and FLOPs per program,
 * but no buffer behind any tensor, and running it is a clear error. */
START_TEST(test_plan_only_matches_compiled)
{
    char *over[] = {"data.micro_batch_size=2", "model.activation=swiglu", "model.mlp_dim=40"};
    jdt_config c;
    load(&c, JDT_ARRAY_LEN(over), over);
    char cache[] = "/tmp/jdt-check-plan-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(cache));
    jdt_step *s[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        jdt_step_opts o;
        memset(&o, 0, sizeof o);
        o.micro_batch = 2;
        o.n_accum = 2;
        o.use_jit = true;
        o.plan_only = k == 1;
        jdt_compile_opts_init(&o.copts);
        o.copts.cache_dir = cache;
        o.copts.threads = 1;
        jdt_err e;
        ck_assert_msg(jdt_step_new(&c, &o, &s[k], &e) == JDT_OK, "step %d: %s", k, e.msg);
    }
    ck_assert_int_eq(jdt_step_n_tensors(s[0]), jdt_step_n_tensors(s[1]));
    ck_assert_int_eq(jdt_step_n_params(s[0]), jdt_step_n_params(s[1]));
    ck_assert(jdt_step_state_bytes(s[0]) == jdt_step_state_bytes(s[1]));
    for (int i = 0; i < jdt_step_n_tensors(s[0]); i++) {
        const char *n0, *n1;
        float *d0, *d1;
        jdt_shape s0, s1;
        jdt_step_tensor(s[0], i, &n0, &d0, &s0);
        jdt_step_tensor(s[1], i, &n1, &d1, &s1);
        ck_assert_str_eq(n0, n1);
        ck_assert(jdt_shape_eq(&s0, &s1));
        ck_assert_ptr_nonnull(d0);
        ck_assert_ptr_null(d1);
    }
    const jdt_step_prog progs[3] = {JDT_STEP_PROG_MAIN, JDT_STEP_PROG_APPLY, JDT_STEP_PROG_EVAL};
    for (int k = 0; k < 3; k++) {
        const jdt_compile_stats *a = jdt_step_prog_stats(s[0], progs[k]);
        const jdt_compile_stats *b = jdt_step_prog_stats(s[1], progs[k]);
        ck_assert_msg(a && b, "program %d missing", k);
        ck_assert(a->arena_bytes > 0 && a->arena_bytes == b->arena_bytes);
        ck_assert(a->arena_shared == b->arena_shared); /* inspect says what train allocates */
        ck_assert_int_eq(a->n_kernels, b->n_kernels);
        ck_assert_int_eq(a->n_builtin, b->n_builtin);
        ck_assert(a->flops_per_step == b->flops_per_step);
        ck_assert_str_eq(b->so_path, "(planned only)");
    }
    int32_t x[4 * 16] = {0}, y[4 * 16] = {0};
    double loss, gn;
    jdt_err e;
    ck_assert_int_eq(jdt_step_run(s[1], 0, 1e-3, x, y, &loss, &gn, &e), JDT_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "planned only") != NULL, "%s", e.msg);
    jdt_step_free(s[0]);
    jdt_step_free(s[1]);
    jdt_config_free(&c);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", cache);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* A stand-in communicator: three identical ranks, so a sum multiplies by 3. */
static int g_fake_calls;
static jdt_status fake_collective(void *ctx, int group, int reduce_op, jdt_dtype dt, void *buf,
                                  size_t n, jdt_err *e)
{
    ck_assert_int_eq(group, 0);
    ck_assert_int_eq(dt, JDT_DTYPE_F32);
    float *f = buf;
    for (size_t i = 0; i < n; i++) f[i] *= reduce_op == 0 ? 3.0f : 1.0f;
    g_fake_calls++;
    return JDT_OK;
}

START_TEST(test_all_reduce_op)
{
    /* loss = sum(all_reduce(p * x, mean over 3)) ; the VJP is the same mean all-reduce */
    jdt_graph *g = jdt_graph_new();
    const int64_t d[1] = {5};
    jdt_tensor *p = jdt_graph_param(g, "p", JDT_DTYPE_F32, 1, d, NULL);
    jdt_tensor *x = jdt_graph_input(g, "x", JDT_DTYPE_F32, 1, d, NULL);
    jdt_tensor *y = jdt_graph_all_reduce(g, jdt_graph_mul(g, p, x), 0, 0, 1.0 / 3.0);
    jdt_tensor *loss = jdt_graph_reduce_sum(g, y, 1u, false);
    jdt_tensor *grad = NULL;
    jdt_err e;
    ck_assert_int_eq(jdt_autodiff_grad(g, loss, 1, &p, &grad, &e), JDT_OK);
    jdt_graph_add_output(g, y);
    jdt_graph_add_output(g, grad);
    float pv[5] = {1, 2, 3, 4, 5}, xv[5] = {0.5f, -1, 2, 0, 3};
    p->data = pv;
    x->data = xv;
    /* without a communicator: a clear error, not a crash */
    jdt_program *prog = NULL;
    ck_assert_int_eq(jdt_program_compile(g, NULL, &prog, &e), JDT_ERR_UNSUPPORTED);
    ck_assert(strstr(e.msg, "communicator") != NULL);
    char cache[] = "/tmp/jdt-check-ar-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(cache));
    jdt_compile_opts o;
    jdt_compile_opts_init(&o);
    o.cache_dir = cache;
    o.collective = fake_collective;
    ck_assert_msg(jdt_program_compile(g, &o, &prog, &e) == JDT_OK, "%s", e.msg);
    g_fake_calls = 0;
    ck_assert_msg(jdt_program_run(prog, &e) == JDT_OK, "%s", e.msg);
    ck_assert_int_eq(g_fake_calls, 2); /* forward and backward */
    const float *yv = jdt_program_output(prog, 0), *gv = jdt_program_output(prog, 1);
    for (int i = 0; i < 5; i++) {
        ck_assert(fabsf(yv[i] - pv[i] * xv[i]) < 1e-6f); /* mean of 3 equal shards */
        ck_assert(fabsf(gv[i] - xv[i]) < 1e-6f);
    }
    jdt_program_free(prog);
    jdt_graph_free(g);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", cache);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("train");
    TCase *tc = tcase_create("train");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_param_count_matches_config);
    tcase_add_test(tc, test_lr_schedule);
    tcase_add_test(tc, test_init_is_deterministic_by_name);
    tcase_add_test(tc, test_jit_matches_interpreter);
    tcase_add_test(tc, test_bf16_activations);
    tcase_add_test(tc, test_accumulation_matches_big_batch);
    tcase_add_test(tc, test_all_reduce_op);
    tcase_add_test(tc, test_remat_same_losses_less_memory);
    tcase_add_test(tc, test_loss_chunks_same_losses_less_memory);
    tcase_add_test(tc, test_plan_only_matches_compiled);
    tcase_add_test(tc, test_bf16_plan_smaller);
    tcase_add_test(tc, test_bf16_cast_weights);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
