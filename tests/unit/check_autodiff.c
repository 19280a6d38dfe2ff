/*
 * check_autodiff.c — reverse-mode autodiff checked against central finite differences in f64
 * for every differentiable op and for composites (MLP with softmax-xent, a causal attention
 * block with layernorm/rmsnorm, rope, gelu/silu), plus fan-out, stop-gradient, the missing-VJP
 * error and a whole train step (forward + backward + SGD updates) run by the interpreter.
 *
 * Gradient check: loss = sum(f(params) * W) with W a fixed random cotangent; for every element
 * of every param, fd = (L(x+h) - L(x-h)) / 2h with h = 1e-5, and we require
 * |fd - grad| / max(1, |fd|, |grad|) < 1e-6 (the f64 truncation and rounding errors of the
 * difference are ~1e-10 here, so this catches any wrong rule).
 */
#include "tests/unit/testutil.h"
#include "autodiff/autodiff.h"
#include "graph/builder.h"
#include "graph/interp.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define MAXP 8
#define F64 JDT_DTYPE_F64

enum { INIT_NORMAL, INIT_POS, INIT_AWAY };

typedef jdt_tensor *(*build_fn)(jdt_graph *g, jdt_tensor **p);

typedef struct {
    const char *name;
    build_fn f;
    int n_params;
    int ndim[MAXP];
    int64_t dims[MAXP][JDT_MAX_DIMS];
    int init;
} gcase;

static void fill(double *x, int64_t n, uint64_t key, int init)
{
    float tmp[1024];
    ck_assert(n <= 1024);
    jdt_rng_normal(key, 0, (size_t)n, tmp);
    for (int64_t i = 0; i < n; i++) {
        double v = tmp[i];
        if (init == INIT_POS) v = fabs(v) + 0.5;
        if (init == INIT_AWAY) v += v >= 0 ? 0.2 : -0.2;
        x[i] = v;
    }
}

static double run_loss(jdt_interp *it, jdt_tensor *loss)
{
    jdt_err e;
    ck_assert_msg(jdt_interp_run(it, &e) == JDT_OK, "run: %s", e.msg);
    double l;
    ck_assert_int_eq(jdt_interp_read_f64(it, loss, &l, &e), JDT_OK);
    return l;
}

/* Builds f, differentiates sum(f * W) and compares every gradient element with central
 * differences. Returns the worst relative error seen. */
static double gradcheck(const gcase *c)
{
    jdt_graph *g = jdt_graph_new();
    jdt_tensor *p[MAXP];
    double *data[MAXP];
    char nm[32];
    for (int k = 0; k < c->n_params; k++) {
        snprintf(nm, sizeof nm, "p%d", k);
        p[k] = jdt_graph_param(g, nm, F64, c->ndim[k], c->dims[k], NULL);
        ck_assert_ptr_nonnull(p[k]);
        int64_t n = jdt_shape_numel(&p[k]->shape);
        data[k] = jdt_malloc((size_t)n * sizeof(double));
        fill(data[k], n, jdt_rng_key(1234, nm) + (uint64_t)c->init, c->init);
        p[k]->data = data[k];
    }
    jdt_tensor *y = c->f(g, p);
    jdt_err e;
    ck_assert_msg(jdt_graph_error(g, &e) == JDT_OK, "%s: builder: %s", c->name, e.msg);
    int64_t ny = jdt_shape_numel(&y->shape);
    double *w = jdt_malloc((size_t)ny * sizeof(double));
    fill(w, ny, jdt_rng_key(99, "cotangent"), INIT_NORMAL);
    jdt_tensor *W = jdt_graph_input(g, "w", F64, y->shape.ndim, y->shape.dims, NULL);
    W->data = w;
    jdt_tensor *yw = jdt_graph_mul(g, y, W);
    jdt_tensor *loss = jdt_graph_reduce_sum(g, yw, (1u << y->shape.ndim) - 1, false);
    jdt_tensor *gr[MAXP];
    jdt_status st = jdt_autodiff_grad(g, loss, c->n_params, p, gr, &e);
    ck_assert_msg(st == JDT_OK, "%s: autodiff: %s", c->name, e.msg);
    ck_assert_msg(jdt_graph_verify(g, &e) == JDT_OK, "%s: %s", c->name, e.msg);
    jdt_interp *it;
    ck_assert_int_eq(jdt_interp_new(g, &it, &e), JDT_OK);
    run_loss(it, loss);
    double worst = 0, *an_all[MAXP];
    for (int k = 0; k < c->n_params; k++) { /* read every gradient before perturbing anything */
        ck_assert(jdt_shape_eq(&gr[k]->shape, &p[k]->shape));
        an_all[k] = jdt_malloc((size_t)jdt_shape_numel(&p[k]->shape) * sizeof(double));
        ck_assert_int_eq(jdt_interp_read_f64(it, gr[k], an_all[k], &e), JDT_OK);
    }
    for (int k = 0; k < c->n_params; k++) {
        int64_t n = jdt_shape_numel(&p[k]->shape);
        double *an = an_all[k];
        for (int64_t j = 0; j < n; j++) {
            const double h = 1e-5;
            double x0 = data[k][j];
            data[k][j] = x0 + h;
            double lp = run_loss(it, loss);
            data[k][j] = x0 - h;
            double lm = run_loss(it, loss);
            data[k][j] = x0;
            double fd = (lp - lm) / (2 * h);
            double den = fmax(1.0, fmax(fabs(fd), fabs(an[j])));
            double rel = fabs(fd - an[j]) / den;
            worst = fmax(worst, rel);
            ck_assert_msg(rel < 1e-6, "%s: d/dp%d[%lld]: autodiff %.12g vs finite difference %.12g",
                          c->name, k, (long long)j, an[j], fd);
        }
        jdt_free(an);
    }
    jdt_interp_free(it);
    for (int k = 0; k < c->n_params; k++)
        jdt_free(data[k]);
    jdt_free(w);
    jdt_graph_free(g);
    return worst;
}

/* ---- per-op builders ---------------------------------------------------------------------- */

/* clang-format off */
#define U_(fn) static jdt_tensor *b_##fn(jdt_graph *g, jdt_tensor **p) { return jdt_graph_##fn(g, p[0]); }
U_(neg); U_(exp); U_(log); U_(tanh); U_(sqrt); U_(rsqrt); U_(relu); U_(gelu); U_(silu);
U_(sigmoid); U_(abs); U_(softmax); U_(log_softmax);
#undef U_
#define B_(fn) static jdt_tensor *b_##fn(jdt_graph *g, jdt_tensor **p) { return jdt_graph_##fn(g, p[0], p[1]); }
B_(add); B_(sub); B_(mul); B_(div); B_(max); B_(min);
B_(add_bcast); B_(mul_bcast); B_(sub_bcast); B_(div_bcast);
#undef B_
/* clang-format on */

static jdt_tensor *b_add_scalar(jdt_graph *g, jdt_tensor **p)
{
    return jdt_graph_add_scalar(g, p[0], 1.5);
}
static jdt_tensor *b_mul_scalar(jdt_graph *g, jdt_tensor **p)
{
    return jdt_graph_mul_scalar(g, p[0], -0.7);
}
static jdt_tensor *b_pow_scalar(jdt_graph *g, jdt_tensor **p)
{
    return jdt_graph_pow_scalar(g, p[0], 2.5);
}
static jdt_tensor *b_select(jdt_graph *g, jdt_tensor **p)
{
    return jdt_graph_select(g, jdt_graph_gt(g, p[0], p[1]), jdt_graph_mul(g, p[0], p[0]), p[1]);
}
static jdt_tensor *b_cast(jdt_graph *g, jdt_tensor **p)
{
    return jdt_graph_exp(g, jdt_graph_cast(g, jdt_graph_cast(g, p[0], F64), p[0]->dtype));
}
static jdt_tensor *b_dropout_rows(jdt_graph *g, jdt_tensor **p)
{
    return jdt_graph_dropout_rows(g, p[0], jdt_graph_scalar(g, JDT_DTYPE_I32, 5),
                                  jdt_graph_scalar(g, JDT_DTYPE_F64, 3), 0.3, 77);
}
static jdt_tensor *b_dropout(jdt_graph *g, jdt_tensor **p)
{
    return jdt_graph_dropout(g, p[0], jdt_graph_scalar(g, JDT_DTYPE_I32, 5), 0.3, 77);
}
static jdt_tensor *b_broadcast(jdt_graph *g, jdt_tensor **p)
{
    return jdt_graph_broadcast(g, p[0], 3, (int64_t[]){2, 3, 4});
}
static jdt_tensor *b_reduce_sum(jdt_graph *g, jdt_tensor **p)
{
    return jdt_graph_reduce_sum(g, p[0], 5, false);
}
static jdt_tensor *b_reduce_sum_kd(jdt_graph *g, jdt_tensor **p)
{
    return jdt_graph_reduce_sum(g, p[0], 2, true);
}
static jdt_tensor *b_reduce_max(jdt_graph *g, jdt_tensor **p)
{
    return jdt_graph_reduce_max(g, p[0], 2, false);
}
static jdt_tensor *b_reduce_mean(jdt_graph *g, jdt_tensor **p)
{
    return jdt_graph_reduce_mean(g, p[0], 6, true);
}
static jdt_tensor *b_reshape(jdt_graph *g, jdt_tensor **p)
{
    return jdt_graph_mul(g, jdt_graph_reshape(g, p[0], 2, (int64_t[]){4, 6}),
                         jdt_graph_reshape(g, p[0], 2, (int64_t[]){4, 6}));
}
static jdt_tensor *b_transpose(jdt_graph *g, jdt_tensor **p)
{
    return jdt_graph_transpose(g, p[0], (int[]){2, 0, 1});
}
static jdt_tensor *b_slice(jdt_graph *g, jdt_tensor **p)
{
    return jdt_graph_slice(g, p[0], 1, 1, 3);
}
static jdt_tensor *b_concat(jdt_graph *g, jdt_tensor **p)
{
    return jdt_graph_concat(g, 3, (jdt_tensor *[]){p[0], p[1], p[0]}, 1);
}
static jdt_tensor *b_mm00(jdt_graph *g, jdt_tensor **p)
{
    return jdt_graph_matmul(g, p[0], p[1], false, false);
}
static jdt_tensor *b_mm10(jdt_graph *g, jdt_tensor **p)
{
    return jdt_graph_matmul(g, p[0], p[1], true, false);
}
static jdt_tensor *b_mm01(jdt_graph *g, jdt_tensor **p)
{
    return jdt_graph_matmul(g, p[0], p[1], false, true);
}
static jdt_tensor *b_mm11(jdt_graph *g, jdt_tensor **p)
{
    return jdt_graph_matmul(g, p[0], p[1], true, true);
}
static jdt_tensor *b_gather(jdt_graph *g, jdt_tensor **p)
{
    int32_t idx[5] = {3, 0, 3, 1, 3};
    return jdt_graph_gather(g, p[0], jdt_graph_constant(g, JDT_DTYPE_I32, 1, (int64_t[]){5}, idx));
}
static jdt_tensor *b_scatter(jdt_graph *g, jdt_tensor **p)
{
    int32_t idx[6] = {2, 0, 2, 1, 2, 0};
    return jdt_graph_scatter_add(
        g, p[0], jdt_graph_constant(g, JDT_DTYPE_I32, 2, (int64_t[]){2, 3}, idx), 4);
}
static jdt_tensor *b_xent(jdt_graph *g, jdt_tensor **p)
{
    int32_t t[4] = {2, -1, 0, 4};
    return jdt_graph_softmax_xent(g, p[0],
                                  jdt_graph_constant(g, JDT_DTYPE_I32, 1, (int64_t[]){4}, t));
}
/* rows over two leading dims, (B, T, V) with targets (B, T): sequence parallelism's loss */
static jdt_tensor *b_xent3(jdt_graph *g, jdt_tensor **p)
{
    int32_t t[4] = {2, -1, 0, 4};
    return jdt_graph_softmax_xent(g, p[0],
                                  jdt_graph_constant(g, JDT_DTYPE_I32, 2, (int64_t[]){2, 2}, t));
}
static jdt_tensor *b_normalize(jdt_graph *g, jdt_tensor **p)
{
    return jdt_graph_normalize(g, p[0], 1e-5);
}
static jdt_tensor *b_rms(jdt_graph *g, jdt_tensor **p)
{
    return jdt_graph_rms_normalize(g, p[0], 1e-5);
}
static jdt_tensor *b_rope(jdt_graph *g, jdt_tensor **p)
{
    return jdt_graph_rope(g, p[0], 100.0, false);
}

static jdt_tensor *b_rope_llama3(jdt_graph *g, jdt_tensor **p)
{
    const double sc[4] = {4, 1, 10, 100}; /* wavelengths 6.3 (kept) and 63 (blended) */
    return jdt_graph_rope_scaled(g, p[0], 100.0, false, sc);
}
static jdt_tensor *b_attention(jdt_graph *g, jdt_tensor **p)
{
    return jdt_graph_attention(g, p[0], p[1], p[2], 0.6);
}

/* fan-out: x feeds three consumers */
static jdt_tensor *b_fanout(jdt_graph *g, jdt_tensor **p)
{
    jdt_tensor *x = p[0];
    return jdt_graph_add(g, jdt_graph_mul(g, x, jdt_graph_tanh(g, x)), jdt_graph_exp(g, x));
}

/* 2-layer MLP with softmax cross-entropy: x (N=4, 3) -> 5 hidden (gelu) -> V=3 logits */
static jdt_tensor *b_mlp(jdt_graph *g, jdt_tensor **p)
{
    double xin[12];
    fill(xin, 12, 5, INIT_NORMAL);
    jdt_tensor *x =
        jdt_graph_cast(g, jdt_graph_constant(g, F64, 2, (int64_t[]){4, 3}, xin), p[0]->dtype);
    jdt_tensor *h =
        jdt_graph_gelu(g, jdt_graph_add_bcast(g, jdt_graph_matmul(g, x, p[0], false, false), p[1]));
    jdt_tensor *logits = jdt_graph_add_bcast(g, jdt_graph_matmul(g, h, p[2], false, false), p[3]);
    int32_t t[4] = {0, 2, 1, 2};
    jdt_tensor *tg = jdt_graph_constant(g, JDT_DTYPE_I32, 1, (int64_t[]){4}, t);
    return jdt_graph_reduce_mean(g, jdt_graph_softmax_xent(g, logits, tg), 1, false);
}

/* A pre-norm causal attention block. x (B=1, T=3, C=4), H=2 heads of D=2. */
static jdt_tensor *b_block(jdt_graph *g, jdt_tensor **p)
{
    enum { B = 1, T = 3, C = 4, H = 2, D = 2 };
    jdt_tensor *x = p[0], *wqkv = p[1], *wo = p[2], *ln_g = p[3], *w1 = p[4], *w2 = p[5];
    jdt_tensor *xn = jdt_graph_mul_bcast(g, jdt_graph_normalize(g, x, 1e-5), ln_g);
    jdt_tensor *qkv = jdt_graph_matmul(g, xn, wqkv, false, false); /* (B, T, 3C) */
    jdt_tensor *heads[3];
    for (int i = 0; i < 3; i++) {
        jdt_tensor *s = jdt_graph_slice(g, qkv, 2, i * C, (i + 1) * C);
        s = jdt_graph_reshape(g, s, 4, (int64_t[]){B, T, H, D});
        if (i < 2) s = jdt_graph_rope(g, s, 10000.0, false);
        heads[i] = jdt_graph_transpose(g, s, (int[]){0, 2, 1, 3}); /* (B, H, T, D) */
    }
    jdt_tensor *a = jdt_graph_attention(g, heads[0], heads[1], heads[2], 1.0 / sqrt((double)D));
    a = jdt_graph_reshape(g, jdt_graph_transpose(g, a, (int[]){0, 2, 1, 3}), 3,
                          (int64_t[]){B, T, C});
    jdt_tensor *x1 = jdt_graph_add(g, x, jdt_graph_matmul(g, a, wo, false, false));
    jdt_tensor *hn = jdt_graph_rms_normalize(g, x1, 1e-6);
    jdt_tensor *m = jdt_graph_matmul(
        g, jdt_graph_silu(g, jdt_graph_matmul(g, hn, w1, false, false)), w2, false, false);
    return jdt_graph_add(g, x1, m);
}

#define P1(a)                                                                                      \
    1,                                                                                             \
    {                                                                                              \
        a                                                                                          \
    }
#define S(...) __VA_ARGS__

static const gcase CASES[] = {
    {"neg", b_neg, 1, {2}, {{2, 3}}, INIT_NORMAL},
    {"exp", b_exp, 1, {2}, {{2, 3}}, INIT_NORMAL},
    {"log", b_log, 1, {2}, {{2, 3}}, INIT_POS},
    {"tanh", b_tanh, 1, {2}, {{2, 3}}, INIT_NORMAL},
    {"sqrt", b_sqrt, 1, {2}, {{2, 3}}, INIT_POS},
    {"rsqrt", b_rsqrt, 1, {2}, {{2, 3}}, INIT_POS},
    {"relu", b_relu, 1, {2}, {{2, 3}}, INIT_AWAY},
    {"gelu", b_gelu, 1, {2}, {{2, 3}}, INIT_NORMAL},
    {"silu", b_silu, 1, {2}, {{2, 3}}, INIT_NORMAL},
    {"sigmoid", b_sigmoid, 1, {2}, {{2, 3}}, INIT_NORMAL},
    {"abs", b_abs, 1, {2}, {{2, 3}}, INIT_AWAY},
    {"add", b_add, 2, {2, 2}, {{2, 3}, {2, 3}}, INIT_NORMAL},
    {"sub", b_sub, 2, {2, 2}, {{2, 3}, {2, 3}}, INIT_NORMAL},
    {"mul", b_mul, 2, {2, 2}, {{2, 3}, {2, 3}}, INIT_NORMAL},
    {"div", b_div, 2, {2, 2}, {{2, 3}, {2, 3}}, INIT_POS},
    {"max", b_max, 2, {2, 2}, {{2, 3}, {2, 3}}, INIT_NORMAL},
    {"min", b_min, 2, {2, 2}, {{2, 3}, {2, 3}}, INIT_NORMAL},
    {"add_bcast", b_add_bcast, 2, {3, 1}, {{2, 3, 4}, {4}}, INIT_NORMAL},
    {"mul_bcast", b_mul_bcast, 2, {3, 2}, {{2, 3, 4}, {3, 1}}, INIT_NORMAL},
    {"sub_bcast", b_sub_bcast, 2, {2, 3}, {{3, 1}, {2, 1, 4}}, INIT_NORMAL},
    {"div_bcast", b_div_bcast, 2, {2, 1}, {{2, 3}, {1}}, INIT_POS},
    {"add_scalar", b_add_scalar, 1, {2}, {{2, 3}}, INIT_NORMAL},
    {"mul_scalar", b_mul_scalar, 1, {2}, {{2, 3}}, INIT_NORMAL},
    {"pow_scalar", b_pow_scalar, 1, {2}, {{2, 3}}, INIT_POS},
    {"select", b_select, 2, {2, 2}, {{2, 3}, {2, 3}}, INIT_NORMAL},
    {"cast", b_cast, 1, {2}, {{2, 3}}, INIT_NORMAL},
    {"dropout", b_dropout, 1, {2}, {{4, 5}}, INIT_NORMAL},
    {"dropout (rows from row0)", b_dropout_rows, 1, {3}, {{2, 4, 5}}, INIT_NORMAL},
    {"broadcast", b_broadcast, 1, {2}, {{3, 1}}, INIT_NORMAL},
    {"reduce_sum", b_reduce_sum, 1, {3}, {{2, 3, 4}}, INIT_NORMAL},
    {"reduce_sum_keepdims", b_reduce_sum_kd, 1, {3}, {{2, 3, 4}}, INIT_NORMAL},
    {"reduce_max", b_reduce_max, 1, {3}, {{2, 3, 4}}, INIT_NORMAL},
    {"reduce_mean", b_reduce_mean, 1, {3}, {{2, 3, 4}}, INIT_NORMAL},
    {"reshape", b_reshape, 1, {3}, {{2, 3, 4}}, INIT_NORMAL},
    {"transpose", b_transpose, 1, {3}, {{2, 3, 4}}, INIT_NORMAL},
    {"slice", b_slice, 1, {2}, {{2, 4}}, INIT_NORMAL},
    {"concat", b_concat, 2, {2, 2}, {{2, 2}, {2, 3}}, INIT_NORMAL},
    {"matmul", b_mm00, 2, {2, 2}, {{3, 4}, {4, 2}}, INIT_NORMAL},
    {"matmul_ta", b_mm10, 2, {2, 2}, {{4, 3}, {4, 2}}, INIT_NORMAL},
    {"matmul_tb", b_mm01, 2, {2, 2}, {{3, 4}, {2, 4}}, INIT_NORMAL},
    {"matmul_ta_tb", b_mm11, 2, {2, 2}, {{4, 3}, {2, 4}}, INIT_NORMAL},
    {"matmul_batched", b_mm00, 2, {3, 3}, {{2, 3, 4}, {2, 4, 2}}, INIT_NORMAL},
    {"matmul_shared_b", b_mm00, 2, {3, 2}, {{2, 3, 4}, {4, 2}}, INIT_NORMAL},
    {"matmul_shared_b_tb", b_mm01, 2, {3, 2}, {{2, 3, 4}, {5, 4}}, INIT_NORMAL},
    {"matmul_shared_b_4d", b_mm00, 2, {4, 2}, {{2, 2, 3, 4}, {4, 2}}, INIT_NORMAL},
    {"matmul_shared_b_ta_tb", b_mm11, 2, {3, 2}, {{2, 4, 3}, {2, 4}}, INIT_NORMAL},
    {"matmul_shared_b_ta", b_mm10, 2, {3, 2}, {{2, 4, 3}, {4, 2}}, INIT_NORMAL},
    {"gather", b_gather, 1, {2}, {{4, 3}}, INIT_NORMAL},
    {"scatter_add", b_scatter, 1, {3}, {{2, 3, 2}}, INIT_NORMAL},
    {"softmax", b_softmax, 1, {2}, {{3, 4}}, INIT_NORMAL},
    {"log_softmax", b_log_softmax, 1, {2}, {{3, 4}}, INIT_NORMAL},
    {"softmax_xent", b_xent, 1, {2}, {{4, 5}}, INIT_NORMAL},
    {"softmax_xent (B, T, V)", b_xent3, 1, {3}, {{2, 2, 5}}, INIT_NORMAL},
    {"normalize", b_normalize, 1, {2}, {{3, 5}}, INIT_NORMAL},
    {"rms_normalize", b_rms, 1, {2}, {{3, 5}}, INIT_NORMAL},
    {"rope", b_rope, 1, {4}, {{1, 3, 2, 4}}, INIT_NORMAL},
    {"rope (llama3 scaling)", b_rope_llama3, 1, {4}, {{1, 3, 2, 4}}, INIT_NORMAL},
    {"attention",
     b_attention,
     3,
     {4, 4, 4},
     {{1, 2, 3, 2}, {1, 2, 3, 2}, {1, 2, 3, 2}},
     INIT_NORMAL},
    {"fanout", b_fanout, 1, {2}, {{2, 3}}, INIT_NORMAL},
    {"mlp_softmax_xent", b_mlp, 4, {2, 1, 2, 1}, {{3, 5}, {5}, {5, 3}, {3}}, INIT_NORMAL},
    {"attention_block",
     b_block,
     6,
     {3, 2, 2, 1, 2, 2},
     {{1, 3, 4}, {4, 12}, {4, 4}, {4}, {4, 6}, {6, 4}},
     INIT_NORMAL},
};

START_TEST(test_gradcheck)
{
    const gcase *c = &CASES[_i];
    double worst = gradcheck(c);
    ck_assert(worst < 1e-6);
}
END_TEST

/* Builds case c with params of dtype dt (values = the f32-rounded random data in both dtypes),
 * runs forward + backward, and returns loss and all gradient elements (as doubles) in out. */
static int64_t eval_case(const gcase *c, jdt_dtype dt, double *out, int64_t cap)
{
    jdt_graph *g = jdt_graph_new();
    jdt_tensor *p[MAXP];
    void *data[MAXP];
    char nm[32];
    for (int k = 0; k < c->n_params; k++) {
        snprintf(nm, sizeof nm, "p%d", k);
        p[k] = jdt_graph_param(g, nm, dt, c->ndim[k], c->dims[k], NULL);
        int64_t n = jdt_shape_numel(&p[k]->shape);
        double tmp[1024];
        fill(tmp, n, jdt_rng_key(1234, nm) + (uint64_t)c->init, c->init);
        data[k] = jdt_malloc((size_t)n * 8);
        for (int64_t j = 0; j < n; j++) {
            if (dt == F64)
                ((double *)data[k])[j] = (float)tmp[j];
            else
                ((float *)data[k])[j] = (float)tmp[j];
        }
        p[k]->data = data[k];
    }
    jdt_tensor *y = c->f(g, p);
    jdt_err e;
    ck_assert_msg(jdt_graph_error(g, &e) == JDT_OK, "%s: builder: %s", c->name, e.msg);
    int64_t ny = jdt_shape_numel(&y->shape);
    double w[1024];
    fill(w, ny, jdt_rng_key(99, "cotangent"), INIT_NORMAL);
    jdt_tensor *W =
        jdt_graph_cast(g, jdt_graph_constant(g, F64, y->shape.ndim, y->shape.dims, w), dt);
    jdt_tensor *loss =
        jdt_graph_reduce_sum(g, jdt_graph_mul(g, y, W), (1u << y->shape.ndim) - 1, false);
    jdt_tensor *gr[MAXP];
    ck_assert_msg(jdt_autodiff_grad(g, loss, c->n_params, p, gr, &e) == JDT_OK, "%s", e.msg);
    jdt_interp *it;
    ck_assert_int_eq(jdt_interp_new(g, &it, &e), JDT_OK);
    ck_assert_msg(jdt_interp_run(it, &e) == JDT_OK, "%s", e.msg);
    int64_t m = 0;
    ck_assert_int_eq(jdt_interp_read_f64(it, loss, out + m++, &e), JDT_OK);
    for (int k = 0; k < c->n_params; k++) {
        ck_assert_int_eq(gr[k]->dtype, dt);
        ck_assert(m + jdt_shape_numel(&gr[k]->shape) <= cap);
        ck_assert_int_eq(jdt_interp_read_f64(it, gr[k], out + m, &e), JDT_OK);
        m += jdt_shape_numel(&gr[k]->shape);
    }
    jdt_interp_free(it);
    for (int k = 0; k < c->n_params; k++)
        jdt_free(data[k]);
    jdt_graph_free(g);
    return m;
}

/* The same case in f32 and f64 agrees to f32 precision: the f32 paths of the interpreter and
 * of autodiff (dtypes of every backward node) are consistent with the checked f64 ones. */
START_TEST(test_f32_matches_f64)
{
    const gcase *c = &CASES[_i];
    static double a[4096], b[4096];
    int64_t na = eval_case(c, JDT_DTYPE_F32, a, 4096), nb = eval_case(c, F64, b, 4096);
    ck_assert_int_eq(na, nb);
    for (int64_t i = 0; i < na; i++)
        ck_assert_msg(fabs(a[i] - b[i]) <= 2e-4 * (1 + fabs(b[i])),
                      "%s: value %lld: f32 %.9g vs f64 %.9g", c->name, (long long)i, a[i], b[i]);
}
END_TEST

/* Gradients through bf16 nodes. A CAST to bf16 is piecewise constant, so its own derivative is
 * 0 almost everywhere; the mixed-precision recipe differentiates it as the identity (its VJP
 * passes the f32 cotangent through). Checked that way: at params already on the bf16 grid, the
 * gradient of sum(W * f(bf16 casts of p)) must equal the central difference of the same f in
 * f64 without the casts (f's bf16 nodes compute exact products here, so the two fs agree at
 * these points). tol: 1e-6 when only the cotangent's f32 rounding differs; GEMMs on bf16
 * operands round the cotangent itself to bf16 (as the flag-based bf16 compute does). */
typedef jdt_tensor *(*bf16_fn)(jdt_graph *g, jdt_tensor **p, bool bf16);

static jdt_tensor *to16(jdt_graph *g, jdt_tensor *x, bool bf16)
{
    return bf16 ? jdt_graph_cast(g, x, JDT_DTYPE_BF16) : x;
}
static jdt_tensor *back64(jdt_graph *g, jdt_tensor *x, bool bf16)
{
    return bf16 ? jdt_graph_cast(g, x, F64) : x;
}
static jdt_tensor *bf_chain(jdt_graph *g, jdt_tensor **p, bool bf16)
{
    /* exp(-max(p0, p1) / 4) with the max and the scaling bf16 nodes (exact on bf16 values) */
    jdt_tensor *m = jdt_graph_max(g, to16(g, p[0], bf16), to16(g, p[1], bf16));
    m = jdt_graph_mul_scalar(g, jdt_graph_neg(g, m), 0.25);
    return jdt_graph_exp(g, back64(g, m, bf16));
}
static jdt_tensor *bf_views(jdt_graph *g, jdt_tensor **p, bool bf16)
{
    jdt_tensor *t = jdt_graph_transpose(g, to16(g, p[0], bf16), (int[]){1, 0});
    jdt_tensor *r = jdt_graph_relu(g, jdt_graph_slice(g, t, 0, 1, 3));
    return jdt_graph_tanh(g, back64(g, jdt_graph_reshape(g, r, 1, (int64_t[]){4}), bf16));
}
static jdt_tensor *bf_mixed(jdt_graph *g, jdt_tensor **p, bool bf16)
{
    /* f64 * bf16 promotes the bf16 side: a CAST in the graph, its VJP on the way back */
    return jdt_graph_mul(g, jdt_graph_mul(g, p[1], p[1]), to16(g, p[0], bf16));
}
static jdt_tensor *bf_matmul(jdt_graph *g, jdt_tensor **p, bool bf16)
{
    jdt_tensor *a = to16(g, p[0], bf16), *b = to16(g, p[1], bf16);
    return jdt_graph_tanh(g, back64(g, jdt_graph_matmul(g, a, b, false, true), bf16)); /* f32 */
}

static void gradcheck_bf16(const char *name, bf16_fn f, const int64_t (*dims)[2], double tol)
{
    jdt_graph *g16 = jdt_graph_new(), *g64 = jdt_graph_new();
    jdt_tensor *p16[2], *p64[2];
    double *data[2];
    for (int k = 0; k < 2; k++) {
        char nm[16];
        snprintf(nm, sizeof nm, "p%d", k);
        p16[k] = jdt_graph_param(g16, nm, F64, 2, dims[k], NULL);
        p64[k] = jdt_graph_param(g64, nm, F64, 2, dims[k], NULL);
        int64_t n = dims[k][0] * dims[k][1];
        data[k] = jdt_malloc((size_t)n * sizeof(double));
        fill(data[k], n, jdt_rng_key(77, nm), INIT_AWAY);
        for (int64_t j = 0; j < n; j++) /* on the bf16 grid */
            data[k][j] = jdt_bf16_round((float)data[k][j]);
        p16[k]->data = p64[k]->data = data[k];
    }
    jdt_graph *gs[2] = {g16, g64};
    jdt_tensor *loss[2], *gr[2][2];
    double w[64];
    jdt_err e;
    for (int v = 0; v < 2; v++) {
        jdt_tensor *y = f(gs[v], v ? p64 : p16, v == 0);
        ck_assert_msg(jdt_graph_error(gs[v], &e) == JDT_OK, "%s: builder: %s", name, e.msg);
        int64_t ny = jdt_shape_numel(&y->shape);
        ck_assert(ny <= 64);
        fill(w, ny, jdt_rng_key(99, "cotangent"), INIT_NORMAL);
        jdt_tensor *W = jdt_graph_constant(gs[v], F64, y->shape.ndim, y->shape.dims, w);
        loss[v] = jdt_graph_reduce_sum(gs[v], jdt_graph_mul(gs[v], y, W), (1u << y->shape.ndim) - 1,
                                       false);
        ck_assert_msg(jdt_autodiff_grad(gs[v], loss[v], 2, v ? p64 : p16, gr[v], &e) == JDT_OK,
                      "%s: %s", name, e.msg);
        ck_assert_msg(jdt_graph_verify(gs[v], &e) == JDT_OK, "%s: %s", name, e.msg);
    }
    bool has_bf16 = false;
    for (int i = 0; i < jdt_graph_n_nodes(g16); i++)
        has_bf16 = has_bf16 || jdt_graph_node(g16, i)->dtype == JDT_DTYPE_BF16;
    ck_assert(has_bf16);
    jdt_interp *it16, *it64;
    ck_assert_int_eq(jdt_interp_new(g16, &it16, &e), JDT_OK);
    ck_assert_int_eq(jdt_interp_new(g64, &it64, &e), JDT_OK);
    double l16 = run_loss(it16, loss[0]), l64 = run_loss(it64, loss[1]);
    ck_assert_msg(fabs(l16 - l64) <= tol * fmax(1, fabs(l64)), "%s: loss %.12g vs %.12g", name, l16,
                  l64);
    for (int k = 0; k < 2; k++) {
        int64_t n = dims[k][0] * dims[k][1];
        double an[64];
        ck_assert_int_eq(gr[0][k]->dtype, F64);
        ck_assert_int_eq(jdt_interp_read_f64(it16, gr[0][k], an, &e), JDT_OK);
        for (int64_t j = 0; j < n; j++) {
            const double h = 1e-5;
            double x0 = data[k][j];
            data[k][j] = x0 + h;
            double lp = run_loss(it64, loss[1]);
            data[k][j] = x0 - h;
            double lm = run_loss(it64, loss[1]);
            data[k][j] = x0;
            double fd = (lp - lm) / (2 * h);
            double rel = fabs(fd - an[j]) / fmax(1.0, fmax(fabs(fd), fabs(an[j])));
            ck_assert_msg(rel < tol,
                          "%s: d/dp%d[%lld]: through bf16 %.12g vs finite difference "
                          "%.12g",
                          name, k, (long long)j, an[j], fd);
        }
    }
    jdt_interp_free(it16);
    jdt_interp_free(it64);
    for (int k = 0; k < 2; k++)
        jdt_free(data[k]);
    jdt_graph_free(g16);
    jdt_graph_free(g64);
}

START_TEST(test_gradcheck_bf16)
{
    gradcheck_bf16("chain", bf_chain, (const int64_t[][2]){{2, 3}, {2, 3}}, 1e-6);
    gradcheck_bf16("views", bf_views, (const int64_t[][2]){{2, 3}, {1, 1}}, 1e-6);
    gradcheck_bf16("mixed", bf_mixed, (const int64_t[][2]){{2, 3}, {2, 3}}, 1e-6);
    gradcheck_bf16("matmul", bf_matmul, (const int64_t[][2]){{3, 5}, {4, 5}}, 2e-2);
}
END_TEST

/* ---- behaviour tests ---------------------------------------------------------------------- */

/* loss = sum(x * stop_gradient(x)) has gradient x, not 2x; a param reached only through a
 * stop_gradient gets zeros. */
START_TEST(test_stop_gradient)
{
    jdt_graph *g = jdt_graph_new();
    int64_t d[1] = {3};
    double x[3] = {1, -2, 3}, z[3] = {4, 5, 6};
    jdt_tensor *X = jdt_graph_param(g, "x", F64, 1, d, NULL),
               *Z = jdt_graph_param(g, "z", F64, 1, d, NULL);
    X->data = x;
    Z->data = z;
    jdt_tensor *y = jdt_graph_add(g, jdt_graph_mul(g, X, jdt_graph_stop_gradient(g, X)),
                                  jdt_graph_stop_gradient(g, Z));
    jdt_tensor *loss = jdt_graph_reduce_sum(g, y, 1, false);
    jdt_tensor *gr[2];
    jdt_err e;
    ck_assert_int_eq(jdt_autodiff_grad(g, loss, 2, (jdt_tensor *[]){X, Z}, gr, &e), JDT_OK);
    jdt_interp *it;
    ck_assert_int_eq(jdt_interp_new(g, &it, &e), JDT_OK);
    ck_assert_int_eq(jdt_interp_run(it, &e), JDT_OK);
    const double *gx = jdt_interp_value(it, gr[0]), *gz = jdt_interp_value(it, gr[1]);
    for (int i = 0; i < 3; i++) {
        ck_assert(gx[i] == x[i]);
        ck_assert(gz[i] == 0.0);
    }
    jdt_interp_free(it);
    jdt_graph_free(g);
}
END_TEST

START_TEST(test_missing_vjp_and_bad_args)
{
    jdt_graph *g = jdt_graph_new();
    int64_t d[2] = {2, 3};
    jdt_tensor *X = jdt_graph_param(g, "x", F64, 2, d, NULL);
    jdt_tensor *y = jdt_graph_softmax(g, jdt_graph_input(g, "in", F64, 2, d, NULL));
    jdt_tensor *bad = jdt_graph_softmax_bwd(g, y, X); /* second order: no rule */
    jdt_tensor *loss = jdt_graph_reduce_sum(g, bad, 3, false);
    jdt_tensor *gr[1];
    jdt_err e;
    ck_assert_int_eq(jdt_autodiff_grad(g, loss, 1, &X, gr, &e), JDT_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(e.msg, "softmax_bwd") && strstr(e.msg, "no VJP rule"), "%s", e.msg);
    ck_assert_ptr_null(gr[0]);
    /* non-scalar loss */
    ck_assert_int_eq(jdt_autodiff_grad(g, bad, 1, &X, gr, &e), JDT_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "one-element"), "%s", e.msg);
    /* an input is not a param */
    jdt_tensor *in = jdt_graph_find(g, "in");
    ck_assert_int_eq(jdt_autodiff_grad(g, loss, 1, &in, gr, &e), JDT_ERR_INVALID);
    /* comparisons pass no gradient (not an error): loss = sum(gt(x, 0) * 2) */
    jdt_graph *g2 = jdt_graph_new();
    jdt_tensor *X2 = jdt_graph_param(g2, "x", F64, 2, d, NULL);
    jdt_tensor *m = jdt_graph_gt(g2, X2, jdt_graph_full(g2, F64, 2, d, 0.0));
    jdt_tensor *l2 = jdt_graph_reduce_sum(g2, jdt_graph_mul_scalar(g2, m, 2.0), 3, false);
    ck_assert_int_eq(jdt_autodiff_grad(g2, l2, 1, &X2, gr, &e), JDT_OK);
    ck_assert_int_eq(gr[0]->op, JDT_OP_CONSTANT);
    jdt_graph_free(g2);
    jdt_graph_free(g);
}
END_TEST

/* Only what reaches the loss is differentiated: a big side branch adds no backward nodes. */
START_TEST(test_only_reaching_nodes)
{
    jdt_graph *g = jdt_graph_new();
    int64_t d[1] = {4};
    jdt_tensor *X = jdt_graph_param(g, "x", F64, 1, d, NULL);
    jdt_tensor *side = X;
    for (int i = 0; i < 20; i++)
        side = jdt_graph_exp(g, side);
    jdt_graph_add_output(g, side);
    jdt_tensor *loss = jdt_graph_reduce_sum(g, jdt_graph_mul(g, X, X), 1, false);
    int before = jdt_graph_n_nodes(g);
    jdt_tensor *gr[1];
    ck_assert_int_eq(jdt_autodiff_grad(g, loss, 1, &X, gr, NULL), JDT_OK);
    ck_assert_int_lt(jdt_graph_n_nodes(g) - before, 10);
    jdt_graph_free(g);
}
END_TEST

/* A whole train step as one graph: MLP forward, autodiff, SGD updates registered with
 * jdt_graph_add_update; the interpreter runs it repeatedly and the loss falls. f32. */
START_TEST(test_train_step_mlp)
{
    enum { N = 16, DIN = 4, HID = 16, V = 3 };
    jdt_graph *g = jdt_graph_new();
    jdt_tensor *x = jdt_graph_input(g, "x", JDT_DTYPE_F32, 2, (int64_t[]){N, DIN},
                                    (const char *[]){"batch", "embed"});
    jdt_tensor *y =
        jdt_graph_input(g, "y", JDT_DTYPE_I32, 1, (int64_t[]){N}, (const char *[]){"batch"});
    jdt_tensor *lr = jdt_graph_input(g, "lr", JDT_DTYPE_F32, 0, NULL, NULL);
    jdt_tensor *w1 = jdt_graph_param(g, "w1", JDT_DTYPE_F32, 2, (int64_t[]){DIN, HID},
                                     (const char *[]){"embed", "mlp"});
    jdt_tensor *b1 =
        jdt_graph_param(g, "b1", JDT_DTYPE_F32, 1, (int64_t[]){HID}, (const char *[]){"mlp"});
    jdt_tensor *w2 = jdt_graph_param(g, "w2", JDT_DTYPE_F32, 2, (int64_t[]){HID, V},
                                     (const char *[]){"mlp", "vocab"});
    jdt_tensor *h =
        jdt_graph_relu(g, jdt_graph_add_bcast(g, jdt_graph_matmul(g, x, w1, false, false), b1));
    jdt_tensor *logits = jdt_graph_matmul(g, h, w2, false, false);
    jdt_tensor *loss = jdt_graph_reduce_mean(g, jdt_graph_softmax_xent(g, logits, y), 1, false);
    jdt_graph_add_output(g, loss);
    jdt_tensor *params[3] = {w1, b1, w2}, *grads[3];
    jdt_err e;
    ck_assert_msg(jdt_autodiff_grad(g, loss, 3, params, grads, &e) == JDT_OK, "%s", e.msg);
    for (int i = 0; i < 3; i++) {
        jdt_tensor *step = jdt_graph_mul_bcast(g, grads[i], lr);
        ck_assert_int_ge(jdt_graph_add_update(g, params[i], jdt_graph_sub(g, params[i], step)), 0);
    }
    ck_assert_msg(jdt_graph_error(g, &e) == JDT_OK, "%s", e.msg);
    ck_assert_str_eq(logits->axes[0], "batch");
    ck_assert_str_eq(logits->axes[1], "vocab");
    ck_assert_str_eq(h->axes[1], "mlp");
    /* data: 3 gaussian blobs */
    static float xd[N * DIN], w1d[DIN * HID], b1d[HID], w2d[HID * V];
    static int32_t yd[N];
    float lrv = 0.5f;
    jdt_rng_normal(1, 0, N * DIN, xd);
    for (int i = 0; i < N; i++) {
        yd[i] = i % V;
        xd[i * DIN + yd[i]] += 3.0f;
    }
    jdt_rng_normal(2, 0, DIN * HID, w1d);
    jdt_rng_normal(3, 0, HID * V, w2d);
    for (int i = 0; i < DIN * HID; i++)
        w1d[i] *= 0.5f;
    for (int i = 0; i < HID * V; i++)
        w2d[i] *= 0.25f;
    x->data = xd;
    y->data = yd;
    lr->data = &lrv;
    w1->data = w1d;
    b1->data = b1d;
    w2->data = w2d;
    jdt_interp *it;
    ck_assert_int_eq(jdt_interp_new(g, &it, &e), JDT_OK);
    float first = 0, last = 0;
    for (int s = 0; s < 30; s++) {
        ck_assert_msg(jdt_interp_run(it, &e) == JDT_OK, "%s", e.msg);
        float l = *(const float *)jdt_interp_value(it, loss);
        if (s == 0) first = l;
        last = l;
    }
    ck_assert_msg(last < 0.3f * first, "loss %g -> %g", first, last);
    jdt_interp_free(it);
    jdt_graph_free(g);
}
END_TEST

/* Every allocation failure while differentiating is a clean ERR_NOMEM with NULL gradients. */
START_TEST(test_alloc_failure)
{
    int n_nomem = 0;
    for (long k = 1; k < 60; k++) {
        jdt_graph *g = jdt_graph_new();
        jdt_tensor *p[6];
        const gcase *c = &CASES[JDT_ARRAY_LEN(CASES) - 1]; /* the attention block */
        for (int i = 0; i < c->n_params; i++) {
            char nm[8] = {'p', (char)('0' + i), 0};
            p[i] = jdt_graph_param(g, nm, F64, c->ndim[i], c->dims[i], NULL);
        }
        jdt_tensor *loss = jdt_graph_reduce_sum(g, c->f(g, p), 7, false);
        ck_assert_int_eq(jdt_graph_error(g, NULL), JDT_OK);
        jdt_tensor *gr[6];
        jdt_err e;
        jdt_alloc_fail_after(k);
        jdt_status st = jdt_autodiff_grad(g, loss, c->n_params, p, gr, &e);
        jdt_alloc_fail_after(0);
        ck_assert_msg(st == JDT_OK || st == JDT_ERR_NOMEM, "%s", e.msg);
        if (st != JDT_OK) {
            n_nomem++;
            for (int i = 0; i < c->n_params; i++)
                ck_assert_ptr_null(gr[i]);
        }
        jdt_graph_free(g);
    }
    ck_assert_int_gt(n_nomem, 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("autodiff");
    TCase *tc = tcase_create("gradcheck");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_gradcheck, 0, (int)JDT_ARRAY_LEN(CASES));
    tcase_add_loop_test(tc, test_f32_matches_f64, 0, (int)JDT_ARRAY_LEN(CASES));
    suite_add_tcase(s, tc);
    TCase *tb = tcase_create("behaviour");
    tcase_set_timeout(tb, 120);
    tcase_add_test(tb, test_stop_gradient);
    tcase_add_test(tb, test_gradcheck_bf16);
    tcase_add_test(tb, test_missing_vjp_and_bad_args);
    tcase_add_test(tb, test_only_reaching_nodes);
    tcase_add_test(tb, test_train_step_mlp);
    tcase_add_test(tb, test_alloc_failure);
    suite_add_tcase(s, tb);
    return tu_run_suite(s);
}
