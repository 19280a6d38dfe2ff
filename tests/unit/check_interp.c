/*
 * check_interp.c — the reference interpreter against hand-computed tiny cases for every op,
 * plus its contract: leaves from caller memory, updates applied after all nodes, f32 rounding,
 * clear errors for unbound leaves, bad indices and graphs with a builder error.
 */
#include "tests/unit/testutil.h"
#include "graph/builder.h"
#include "graph/interp.h"

#include <check.h>
#include <math.h>
#include <string.h>

#define TOL 1e-12

/* An f64 INPUT bound to caller memory. */
static jdt_tensor *in64(jdt_graph *g, const char *name, int ndim, const int64_t *dims, double *data)
{
    jdt_tensor *t = jdt_graph_input(g, name, JDT_DTYPE_F64, ndim, dims, NULL);
    if (t) t->data = data;
    return t;
}

static jdt_tensor *in_i32(jdt_graph *g, const char *name, int ndim, const int64_t *dims,
                          int32_t *data)
{
    jdt_tensor *t = jdt_graph_input(g, name, JDT_DTYPE_I32, ndim, dims, NULL);
    if (t) t->data = data;
    return t;
}

static jdt_interp *run_ok(jdt_graph *g)
{
    jdt_err e;
    jdt_err_clear(&e);
    ck_assert_msg(jdt_graph_error(g, &e) == JDT_OK, "builder: %s", e.msg);
    jdt_interp *it = NULL;
    ck_assert_int_eq(jdt_interp_new(g, &it, &e), JDT_OK);
    jdt_status st = jdt_interp_run(it, &e);
    ck_assert_msg(st == JDT_OK, "run: %s", e.msg);
    return it;
}

static double v(jdt_interp *it, jdt_tensor *t, int64_t i)
{
    const void *p = jdt_interp_value(it, t);
    ck_assert_ptr_nonnull(p);
    switch (t->dtype) {
    case JDT_DTYPE_F64:
        return ((const double *)p)[i];
    case JDT_DTYPE_F32:
        return ((const float *)p)[i];
    case JDT_DTYPE_I32:
        return ((const int32_t *)p)[i];
    case JDT_DTYPE_BF16: {
        uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
        float x;
        memcpy(&x, &u, 4);
        return x;
    }
    case JDT_DTYPE_U16: /* the interpreter keeps only f32, f64, i32 and bf16 values */
    case JDT_DTYPE_U32:
    case JDT_DTYPE_U8:
    case JDT_DTYPE_COUNT:
        break;
    }
    ck_abort_msg("unexpected dtype %d", (int)t->dtype);
    return 0;
}

#define NEAR(a, b) near_((double)(a), (double)(b))
static void near_(double a, double b)
{
    ck_assert_msg(fabs(a - b) <= TOL * (1 + fabs(b)), "%.17g vs %.17g", a, b);
}

START_TEST(test_unary)
{
    jdt_graph *g = jdt_graph_new();
    int64_t d[1] = {4};
    double x[4] = {-1.0, 0.25, 0.5, 2.0};
    jdt_tensor *X = in64(g, "x", 1, d, x);
    jdt_tensor *ax = jdt_graph_abs(g, X);
    jdt_tensor *ys[] = {
        jdt_graph_neg(g, X),  jdt_graph_exp(g, X),     jdt_graph_log(g, ax),
        jdt_graph_tanh(g, X), jdt_graph_sqrt(g, ax),   jdt_graph_rsqrt(g, ax),
        jdt_graph_relu(g, X), jdt_graph_sigmoid(g, X), jdt_graph_abs(g, X),
        jdt_graph_silu(g, X), jdt_graph_gelu(g, X),    jdt_graph_stop_gradient(g, X)};
    jdt_interp *it = run_ok(g);
    for (int i = 0; i < 4; i++) {
        double a = fabs(x[i]), s = 1 / (1 + exp(-x[i]));
        NEAR(v(it, ys[0], i), -x[i]);
        NEAR(v(it, ys[1], i), exp(x[i]));
        NEAR(v(it, ys[2], i), log(a));
        NEAR(v(it, ys[3], i), tanh(x[i]));
        NEAR(v(it, ys[4], i), sqrt(a));
        NEAR(v(it, ys[5], i), 1 / sqrt(a));
        NEAR(v(it, ys[6], i), x[i] > 0 ? x[i] : 0);
        NEAR(v(it, ys[7], i), s);
        NEAR(v(it, ys[8], i), a);
        NEAR(v(it, ys[9], i), x[i] * s);
        NEAR(v(it, ys[11], i), x[i]);
    }
    /* gelu (tanh form) at 2.0 and -1.0: 1.9545976940, -0.1588080094 (published values) */
    ck_assert(fabs(v(it, ys[10], 3) - 1.9545977) < 1e-6);
    ck_assert(fabs(v(it, ys[10], 0) + 0.1588080) < 1e-6);
    jdt_interp_free(it);
    jdt_graph_free(g);
}
END_TEST

START_TEST(test_binary_scalar_select_cast)
{
    jdt_graph *g = jdt_graph_new();
    int64_t d[1] = {3};
    double a[3] = {1, 2, 3}, b[3] = {3, 2, 0.5};
    jdt_tensor *A = in64(g, "a", 1, d, a), *B = in64(g, "b", 1, d, b);
    jdt_tensor *add = jdt_graph_add(g, A, B), *sub = jdt_graph_sub(g, A, B),
               *mul = jdt_graph_mul(g, A, B);
    jdt_tensor *dv = jdt_graph_div(g, A, B), *mx = jdt_graph_max(g, A, B),
               *mn = jdt_graph_min(g, A, B);
    jdt_tensor *gt = jdt_graph_gt(g, A, B), *ge = jdt_graph_ge(g, A, B);
    jdt_tensor *as = jdt_graph_add_scalar(g, A, 0.5), *ms = jdt_graph_mul_scalar(g, A, -2);
    jdt_tensor *ps = jdt_graph_pow_scalar(g, A, 3);
    jdt_tensor *sel = jdt_graph_select(g, gt, A, B);
    double c[3] = {2.7, -2.7, 0.2};
    jdt_tensor *C = in64(g, "c", 1, d, c);
    jdt_tensor *ci = jdt_graph_cast(g, C, JDT_DTYPE_I32);
    jdt_tensor *cf = jdt_graph_cast(g, ci, JDT_DTYPE_F32);
    jdt_interp *it = run_ok(g);
    for (int i = 0; i < 3; i++) {
        NEAR(v(it, add, i), a[i] + b[i]);
        NEAR(v(it, sub, i), a[i] - b[i]);
        NEAR(v(it, mul, i), a[i] * b[i]);
        NEAR(v(it, dv, i), a[i] / b[i]);
        NEAR(v(it, mx, i), fmax(a[i], b[i]));
        NEAR(v(it, mn, i), fmin(a[i], b[i]));
        NEAR(v(it, gt, i), a[i] > b[i] ? 1 : 0);
        NEAR(v(it, ge, i), a[i] >= b[i] ? 1 : 0);
        NEAR(v(it, as, i), a[i] + 0.5);
        NEAR(v(it, ms, i), -2 * a[i]);
        NEAR(v(it, ps, i), a[i] * a[i] * a[i]);
        NEAR(v(it, sel, i), a[i] > b[i] ? a[i] : b[i]);
    }
    ck_assert_int_eq(((const int32_t *)jdt_interp_value(it, ci))[0], 2);
    ck_assert_int_eq(((const int32_t *)jdt_interp_value(it, ci))[1], -2);
    ck_assert_int_eq(((const int32_t *)jdt_interp_value(it, ci))[2], 0);
    ck_assert(((const float *)jdt_interp_value(it, cf))[1] == -2.0f);
    jdt_interp_free(it);
    jdt_graph_free(g);
}
END_TEST

/* bf16 nodes: values rounded to bf16 (nearest even, through f32) exactly where a bf16 node is,
 * stored as 16 bits; a bf16 leaf is read from 16-bit caller memory; a MATMUL on bf16 operands
 * sums the products unrounded into an f32 result. */
START_TEST(test_bf16)
{
    const jdt_dtype BF = JDT_DTYPE_BF16;
    jdt_graph *g = jdt_graph_new();
    int64_t d[1] = {6};
    const double u = 1.0 / 256; /* half a bf16 ulp at 1 */
    /* tie to even (down), tie to even (up), above the tie, below it, NaN, overflow to Inf */
    double x[6] = {1 + u, 1 + 3 * u, 1 + u + 1e-6, 1 + u - 1e-6, NAN, 3.4e38};
    double want[6] = {1, 1 + 4 * u, 1 + 2 * u, 1, NAN, INFINITY};
    jdt_tensor *X = in64(g, "x", 1, d, x);
    jdt_tensor *xb = jdt_graph_cast(g, X, BF), *back = jdt_graph_cast(g, xb, JDT_DTYPE_F64);
    /* 1 + u is exact in f32 and a tie in bf16: the bf16 sum rounds, the f32 sum does not */
    double one[6] = {1, 1, 1, 1, 1, 1}, us[6] = {u, u, u, u, u, u};
    jdt_tensor *O = in64(g, "one", 1, d, one), *U = in64(g, "u", 1, d, us);
    jdt_tensor *sum16 = jdt_graph_add(g, jdt_graph_cast(g, O, BF), jdt_graph_cast(g, U, BF));
    jdt_tensor *sum32 =
        jdt_graph_add(g, jdt_graph_cast(g, O, JDT_DTYPE_F32), jdt_graph_cast(g, U, JDT_DTYPE_F32));
    /* a bf16 leaf: 16-bit memory holding 1.5, -2, 0.25 */
    uint16_t lb[3] = {0x3fc0, 0xc000, 0x3e80};
    jdt_tensor *L = jdt_graph_input(g, "lb", BF, 1, (int64_t[]){3}, NULL);
    L->data = lb;
    jdt_tensor *neg = jdt_graph_neg(g, L);
    /* matmul (1, 3) bf16 x (3, 1) f32 -> f32: products of rounded inputs, unrounded sum */
    double w[3] = {1 + u, 1, 1.0 / 3};
    jdt_tensor *W = jdt_graph_cast(g, in64(g, "w", 1, (int64_t[]){3}, w), JDT_DTYPE_F32);
    jdt_tensor *mm = jdt_graph_matmul(g, jdt_graph_reshape(g, L, 2, (int64_t[]){1, 3}),
                                      jdt_graph_reshape(g, W, 2, (int64_t[]){3, 1}), false, false);
    jdt_interp *it = run_ok(g);
    for (int i = 0; i < 6; i++) {
        if (isnan(want[i]))
            ck_assert(isnan(v(it, back, i)) && isnan(v(it, xb, i)));
        else
            ck_assert_msg(v(it, back, i) == want[i] && v(it, xb, i) == want[i],
                          "x[%d] = %.17g: bf16 %.17g, want %.17g", i, x[i], v(it, back, i),
                          want[i]);
        ck_assert(v(it, sum16, i) == 1.0);
        ck_assert(v(it, sum32, i) == 1 + u);
    }
    ck_assert_uint_eq(((const uint16_t *)jdt_interp_value(it, xb))[0], 0x3f80); /* 1.0 */
    ck_assert(v(it, neg, 0) == -1.5 && v(it, neg, 1) == 2.0 && v(it, neg, 2) == -0.25);
    ck_assert_uint_eq(((const uint16_t *)jdt_interp_value(it, neg))[0], 0xbfc0);
    ck_assert_int_eq(mm->dtype, JDT_DTYPE_F32);
    double third16 = jdt_bf16_round((float)(1.0 / 3)); /* the f32 1/3, then rounded */
    NEAR(v(it, mm, 0), (float)(1.5 * 1.0 - 2.0 * 1.0 + 0.25 * third16));
    jdt_interp_free(it);
    jdt_graph_free(g);
}
END_TEST

START_TEST(test_grad_helpers)
{
    jdt_graph *g = jdt_graph_new();
    int64_t d[1] = {3};
    double x[3] = {-1.5, 0.3, 2.0}, dy[3] = {0.7, -1.1, 2.0};
    jdt_tensor *X = in64(g, "x", 1, d, x), *DY = in64(g, "dy", 1, d, dy);
    jdt_tensor *gg = jdt_graph_gelu_grad(g, X, DY), *sg = jdt_graph_silu_grad(g, X, DY);
    jdt_interp *it = run_ok(g);
    for (int i = 0; i < 3; i++) {
        /* central differences of the closed forms */
        double h = 1e-5, c = sqrt(2 / M_PI);
#define GELU_(z) (0.5 * (z) * (1 + tanh(c * ((z) + 0.044715 * (z) * (z) * (z)))))
#define SILU_(z) ((z) / (1 + exp(-(z))))
        double dg = (GELU_(x[i] + h) - GELU_(x[i] - h)) / (2 * h);
        double ds = (SILU_(x[i] + h) - SILU_(x[i] - h)) / (2 * h);
        ck_assert(fabs(v(it, gg, i) - dy[i] * dg) < 1e-8);
        ck_assert(fabs(v(it, sg, i) - dy[i] * ds) < 1e-8);
    }
    jdt_interp_free(it);
    jdt_graph_free(g);
}
END_TEST

START_TEST(test_shape_ops)
{
    jdt_graph *g = jdt_graph_new();
    int64_t d23[2] = {2, 3}, d3[1] = {3}, d21[2] = {2, 1};
    double x[6] = {1, 2, 3, 4, 5, 6}, r[3] = {10, 20, 30}, c[2] = {100, 200};
    jdt_tensor *X = in64(g, "x", 2, d23, x), *R = in64(g, "r", 1, d3, r),
               *C = in64(g, "c", 2, d21, c);
    jdt_tensor *br = jdt_graph_broadcast(g, R, 2, d23), *bc = jdt_graph_broadcast(g, C, 2, d23);
    jdt_tensor *s0 = jdt_graph_reduce_sum(g, X, 1, false),
               *s1 = jdt_graph_reduce_sum(g, X, 2, true);
    jdt_tensor *sall = jdt_graph_reduce_sum(g, X, 3, false);
    jdt_tensor *mx1 = jdt_graph_reduce_max(g, X, 2, false),
               *mn0 = jdt_graph_reduce_mean(g, X, 1, false);
    int64_t d32[2] = {3, 2};
    jdt_tensor *rs = jdt_graph_reshape(g, X, 2, d32);
    int perm[2] = {1, 0};
    jdt_tensor *tr = jdt_graph_transpose(g, X, perm);
    jdt_tensor *sl = jdt_graph_slice(g, X, 1, 1, 3);
    jdt_tensor *parts[2] = {X, sl};
    jdt_tensor *cat = jdt_graph_concat(g, 2, parts, 1);
    jdt_tensor *cat0 = jdt_graph_concat(g, 2, (jdt_tensor *[]){X, X}, 0);
    jdt_interp *it = run_ok(g);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) {
            NEAR(v(it, br, i * 3 + j), r[j]);
            NEAR(v(it, bc, i * 3 + j), c[i]);
            NEAR(v(it, rs, i * 3 + j), x[i * 3 + j]);
            NEAR(v(it, tr, j * 2 + i), x[i * 3 + j]);
            NEAR(v(it, cat0, i * 3 + j), x[i * 3 + j]);
            NEAR(v(it, cat0, 6 + i * 3 + j), x[i * 3 + j]);
        }
    for (int j = 0; j < 3; j++) {
        NEAR(v(it, s0, j), x[j] + x[3 + j]);
        NEAR(v(it, mn0, j), (x[j] + x[3 + j]) / 2);
    }
    ck_assert_int_eq(s1->shape.ndim, 2);
    ck_assert_int_eq(s1->shape.dims[1], 1);
    NEAR(v(it, s1, 0), 6);
    NEAR(v(it, s1, 1), 15);
    NEAR(v(it, sall, 0), 21);
    NEAR(v(it, mx1, 0), 3);
    NEAR(v(it, mx1, 1), 6);
    /* slice [:, 1:3] = {2,3},{5,6}; concat along axis 1 -> rows of 5 */
    NEAR(v(it, sl, 0), 2);
    NEAR(v(it, sl, 3), 6);
    double want[10] = {1, 2, 3, 2, 3, 4, 5, 6, 5, 6};
    for (int i = 0; i < 10; i++)
        NEAR(v(it, cat, i), want[i]);
    jdt_interp_free(it);
    jdt_graph_free(g);
}
END_TEST

START_TEST(test_matmul)
{
    jdt_graph *g = jdt_graph_new();
    int64_t d23[2] = {2, 3}, d32[2] = {3, 2}, d223[3] = {2, 2, 3};
    double a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {7, 8, 9, 10, 11, 12};
    double ab[12];
    for (int i = 0; i < 12; i++)
        ab[i] = i < 6 ? a[i] : -a[i - 6];
    jdt_tensor *A = in64(g, "a", 2, d23, a), *B = in64(g, "b", 2, d32, b);
    jdt_tensor *C = jdt_graph_matmul(g, A, B, false, false);
    int perm[2] = {1, 0};
    jdt_tensor *At = jdt_graph_transpose(g, A, perm), *Bt = jdt_graph_transpose(g, B, perm);
    jdt_tensor *C2 = jdt_graph_matmul(g, At, B, true, false),
               *C3 = jdt_graph_matmul(g, A, Bt, false, true);
    jdt_tensor *C4 = jdt_graph_matmul(g, At, Bt, true, true);
    jdt_tensor *AB = in64(g, "ab", 3, d223, ab);
    jdt_tensor *Cb = jdt_graph_matmul(g, AB, B, false, false);
    jdt_tensor *BB = jdt_graph_broadcast(g, B, 3, (int64_t[]){2, 3, 2});
    jdt_tensor *Cbb = jdt_graph_matmul(g, AB, BB, false, false);
    jdt_interp *it = run_ok(g);
    /* [[1,2,3],[4,5,6]] x [[7,8],[9,10],[11,12]] = [[58,64],[139,154]] */
    double want[4] = {58, 64, 139, 154};
    for (int i = 0; i < 4; i++) {
        NEAR(v(it, C, i), want[i]);
        NEAR(v(it, C2, i), want[i]);
        NEAR(v(it, C3, i), want[i]);
        NEAR(v(it, C4, i), want[i]);
        NEAR(v(it, Cb, i), want[i]);
        NEAR(v(it, Cb, 4 + i), -want[i]);
        NEAR(v(it, Cbb, 4 + i), -want[i]);
    }
    jdt_interp_free(it);
    jdt_graph_free(g);
}
END_TEST

START_TEST(test_gather_scatter_iota_mask)
{
    jdt_graph *g = jdt_graph_new();
    int64_t d32[2] = {3, 2}, d4[1] = {4};
    double tab[6] = {1, 2, 3, 4, 5, 6};
    int32_t idx[4] = {2, 0, 2, 1};
    jdt_tensor *Tb = in64(g, "tab", 2, d32, tab), *I = in_i32(g, "idx", 1, d4, idx);
    jdt_tensor *ga = jdt_graph_gather(g, Tb, I);
    jdt_tensor *sc = jdt_graph_scatter_add(g, ga, I, 3);
    jdt_tensor *io = jdt_graph_iota(g, JDT_DTYPE_I32, 2, (int64_t[]){2, 3}, 1);
    jdt_tensor *cm = jdt_graph_causal_mask(g, JDT_DTYPE_F32, 3);
    jdt_interp *it = run_ok(g);
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 2; c++)
            NEAR(v(it, ga, r * 2 + c), tab[idx[r] * 2 + c]);
    /* row 2 gathered twice, row 0 and 1 once: scatter sums them back */
    for (int c = 0; c < 2; c++) {
        NEAR(v(it, sc, 0 * 2 + c), tab[0 * 2 + c]);
        NEAR(v(it, sc, 1 * 2 + c), tab[1 * 2 + c]);
        NEAR(v(it, sc, 2 * 2 + c), 2 * tab[2 * 2 + c]);
    }
    for (int i = 0; i < 6; i++)
        ck_assert_int_eq((int)v(it, io, i), i % 3);
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 3; c++) {
            double m = v(it, cm, r * 3 + c);
            if (c <= r)
                ck_assert(m == 0.0);
            else
                ck_assert(isinf(m) && m < 0);
        }
    jdt_interp_free(it);
    /* out-of-range index: one clear error naming the node, no crash */
    idx[1] = 7;
    jdt_err e;
    ck_assert_int_eq(jdt_interp_new(g, &it, &e), JDT_OK);
    ck_assert_int_eq(jdt_interp_run(it, &e), JDT_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "gather") && strstr(e.msg, "index 7"), "%s", e.msg);
    jdt_interp_free(it);
    jdt_graph_free(g);
}
END_TEST

START_TEST(test_softmax_family)
{
    jdt_graph *g = jdt_graph_new();
    int64_t d22[2] = {2, 2}, d2[1] = {2};
    double x[4] = {0, log(2.0), 1, 1};
    int32_t tg[2] = {1, -1};
    double dl[2] = {1, 1};
    jdt_tensor *X = in64(g, "x", 2, d22, x), *T = in_i32(g, "t", 1, d2, tg),
               *DL = in64(g, "dl", 1, d2, dl);
    jdt_tensor *sm = jdt_graph_softmax(g, X), *ls = jdt_graph_log_softmax(g, X);
    jdt_tensor *xe = jdt_graph_softmax_xent(g, X, T), *xb = jdt_graph_softmax_xent_bwd(g, X, T, DL, xe);
    double dy[4] = {1, 0, 0, 1};
    jdt_tensor *DY = in64(g, "dy", 2, d22, dy);
    jdt_tensor *smb = jdt_graph_softmax_bwd(g, sm, DY), *lsb = jdt_graph_log_softmax_bwd(g, ls, DY);
    jdt_interp *it = run_ok(g);
    NEAR(v(it, sm, 0), 1.0 / 3);
    NEAR(v(it, sm, 1), 2.0 / 3);
    NEAR(v(it, sm, 2), 0.5);
    NEAR(v(it, ls, 1), log(2.0 / 3));
    NEAR(v(it, xe, 0), -log(2.0 / 3));
    NEAR(v(it, xe, 1), 0.0); /* ignored target */
    NEAR(v(it, xb, 0), 1.0 / 3);
    NEAR(v(it, xb, 1), 2.0 / 3 - 1);
    NEAR(v(it, xb, 2), 0.0);
    NEAR(v(it, xb, 3), 0.0);
    /* softmax_bwd row 0: y*(dy - sum(dy*y)) = (1/3)(1 - 1/3), (2/3)(0 - 1/3) */
    NEAR(v(it, smb, 0), (1.0 / 3) * (2.0 / 3));
    NEAR(v(it, smb, 1), -(2.0 / 3) / 3);
    /* log_softmax_bwd row 0: dy - softmax * sum(dy) */
    NEAR(v(it, lsb, 0), 1 - 1.0 / 3);
    NEAR(v(it, lsb, 1), -2.0 / 3);
    jdt_interp_free(it);
    jdt_graph_free(g);
}
END_TEST

START_TEST(test_norms_rope_attention)
{
    jdt_graph *g = jdt_graph_new();
    int64_t d3[1] = {3};
    double x[3] = {1, 2, 3};
    jdt_tensor *X = in64(g, "x", 1, d3, x);
    jdt_tensor *ln = jdt_graph_normalize(g, X, 1e-5), *rn = jdt_graph_rms_normalize(g, X, 1e-5);
    /* rope: B=1, T=2, H=1, D=2; position 1 rotates (1, 0) by 1 radian */
    int64_t dr[4] = {1, 2, 1, 2};
    double xr[4] = {1, 0, 1, 0};
    jdt_tensor *XR = in64(g, "xr", 4, dr, xr);
    jdt_tensor *ro = jdt_graph_rope(g, XR, 10000.0, false);
    jdt_tensor *back = jdt_graph_rope(g, ro, 10000.0, true);
    /* attention: B=H=1, T=2, D=1 */
    int64_t da[4] = {1, 1, 2, 1};
    double q[2] = {1, 2}, k[2] = {0.5, -1}, vv[2] = {3, 7};
    jdt_tensor *Q = in64(g, "q", 4, da, q), *K = in64(g, "k", 4, da, k),
               *V = in64(g, "v", 4, da, vv);
    jdt_tensor *at = jdt_graph_attention(g, Q, K, V, 0.5);
    jdt_interp *it = run_ok(g);
    double var = 2.0 / 3, rstd = 1 / sqrt(var + 1e-5), rms = 1 / sqrt(14.0 / 3 + 1e-5);
    for (int i = 0; i < 3; i++) {
        NEAR(v(it, ln, i), (x[i] - 2) * rstd);
        NEAR(v(it, rn, i), x[i] * rms);
    }
    NEAR(v(it, ro, 0), 1);
    NEAR(v(it, ro, 1), 0);
    NEAR(v(it, ro, 2), cos(1.0));
    NEAR(v(it, ro, 3), sin(1.0));
    for (int i = 0; i < 4; i++)
        NEAR(v(it, back, i), xr[i]);
    /* row 0 sees only key 0; row 1: scores 0.5*2*0.5 = 0.5, 0.5*2*(-1) = -1 */
    NEAR(v(it, at, 0), 3);
    double p0 = exp(0.5) / (exp(0.5) + exp(-1.0));
    NEAR(v(it, at, 1), p0 * 3 + (1 - p0) * 7);
    jdt_interp_free(it);
    jdt_graph_free(g);
}
END_TEST

/* dropout_rows: rows numbered from row0 and a block's base give the masks of the whole tensor
 * (graph.h DROPOUT): rows 2-3 of a (4, 3, 5) tensor with row0 = 2, and its columns 1-2 of dim
 * 1 with base = 1 * 5, draw the full tensor's mask at those elements */
START_TEST(test_dropout_rows)
{
    jdt_graph *g = jdt_graph_new();
    static double x[60];
    for (int i = 0; i < 60; i++)
        x[i] = 1.0 + i;
    int32_t step = 7;
    double zero = 0, two = 2, five = 5;
    jdt_tensor *X = in64(g, "x", 3, (int64_t[]){4, 3, 5}, x), *S = in_i32(g, "step", 0, NULL, &step);
    jdt_tensor *R0 = in64(g, "r0", 0, NULL, &zero), *R2 = in64(g, "r2", 0, NULL, &two),
               *B5 = in64(g, "b5", 0, NULL, &five);
    jdt_tensor *full = jdt_graph_dropout_rows(g, X, S, R0, 0.5, 11);
    jdt_tensor *rows = jdt_graph_dropout_rows(g, jdt_graph_slice(g, X, 0, 2, 4), S, R2, 0.5, 11);
    /* the block: the full tensor's strides, base for dim 1's offset */
    jdt_tensor *in4[4] = {jdt_graph_slice(g, X, 1, 1, 3), S, R0, B5};
    jdt_tensor *blk = jdt_graph_op(g, JDT_OP_DROPOUT, 4, in4, &full->attrs, JDT_DTYPE_F64, NULL);
    jdt_interp *it = run_ok(g);
    int dropped = 0;
    for (int i = 0; i < 60; i++) {
        const int r = i / 15, c = i / 5 % 3, k = i % 5;
        dropped += v(it, full, i) == 0.0;
        if (r >= 2) ck_assert(v(it, rows, i - 30) == v(it, full, i));
        if (c >= 1) ck_assert(v(it, blk, (r * 2 + c - 1) * 5 + k) == v(it, full, i));
    }
    ck_assert(dropped > 15 && dropped < 45);
    jdt_interp_free(it);
    jdt_graph_free(g);
}
END_TEST

START_TEST(test_dropout)
{
    jdt_graph *g = jdt_graph_new();
    enum { N = 4000 };
    int64_t d[1] = {N};
    static double x[N];
    for (int i = 0; i < N; i++)
        x[i] = 1.0 + i % 7;
    int32_t step = 3;
    jdt_tensor *X = in64(g, "x", 1, d, x), *S = in_i32(g, "step", 0, NULL, &step);
    jdt_tensor *dr = jdt_graph_dropout(g, X, S, 0.25, 99),
               *dr2 = jdt_graph_dropout(g, X, S, 0.25, 99);
    jdt_tensor *d0 = jdt_graph_dropout(g, X, S, 0.0, 99);
    jdt_interp *it = run_ok(g);
    int kept = 0;
    for (int i = 0; i < N; i++) {
        double y = v(it, dr, i);
        ck_assert(y == 0.0 || fabs(y - x[i] / 0.75) < 1e-12);
        kept += y != 0.0;
        ck_assert(y == v(it, dr2, i)); /* same key and step: same mask */
        NEAR(v(it, d0, i), x[i]);
        /* the documented rule: kept iff unit(philox(key, step, j).v[0]) >= rate */
        bool keep = jdt_u32_to_unit_float(jdt_philox(99, 3, (uint64_t)i).v[0]) >= 0.25;
        ck_assert(keep == (y != 0.0));
    }
    ck_assert(kept > N * 0.70 && kept < N * 0.80);
    static bool mask3[N];
    for (int i = 0; i < N; i++)
        mask3[i] = v(it, dr, i) != 0.0;
    jdt_interp_free(it);
    step = 4; /* another step: another mask */
    it = run_ok(g);
    int same = 0;
    for (int i = 0; i < N; i++)
        same += (v(it, dr, i) != 0.0) == mask3[i];
    ck_assert(same < N * 0.8); /* independent masks agree on ~62.5% of elements */
    jdt_interp_free(it);
    jdt_graph_free(g);
}
END_TEST

START_TEST(test_updates_and_f32)
{
    jdt_graph *g = jdt_graph_new();
    int64_t d[1] = {2};
    float w[2] = {1.0f, 2.0f};
    jdt_tensor *W = jdt_graph_param(g, "w", JDT_DTYPE_F32, 1, d, NULL);
    W->data = w;
    jdt_tensor *w2 = jdt_graph_mul_scalar(g, W, 0.1); /* f32 rounding of 0.1 * 1 */
    jdt_tensor *nw = jdt_graph_add_scalar(g, W, 1.0);
    jdt_tensor *after = jdt_graph_mul_scalar(g, W, 3.0); /* computed before the update lands */
    ck_assert_int_eq(jdt_graph_add_update(g, W, nw), 0);
    jdt_graph_add_output(g, after);
    jdt_interp *it = run_ok(g);
    ck_assert(((const float *)jdt_interp_value(it, w2))[0] == (float)(0.1 * 1.0));
    ck_assert(w[0] == 2.0f && w[1] == 3.0f);
    float out[2];
    void *outs[1] = {out};
    ck_assert_int_eq(jdt_interp_copy_outputs(it, outs, NULL), JDT_OK);
    ck_assert(out[0] == 3.0f && out[1] == 6.0f);
    ck_assert(((const float *)jdt_interp_value(it, W))[0] == 1.0f); /* the run's snapshot */
    ck_assert_int_eq(jdt_interp_run(it, NULL), JDT_OK);
    ck_assert(w[0] == 3.0f);
    jdt_interp_free(it);
    jdt_graph_free(g);
}
END_TEST

START_TEST(test_errors)
{
    jdt_err e;
    jdt_graph *g = jdt_graph_new();
    int64_t d[1] = {2};
    jdt_tensor *X = jdt_graph_input(g, "x", JDT_DTYPE_F64, 1, d, NULL);
    jdt_graph_exp(g, X);
    jdt_interp *it = NULL;
    ck_assert_int_eq(jdt_interp_new(g, &it, &e), JDT_OK);
    ck_assert_int_eq(jdt_interp_run(it, &e), JDT_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "'x'") && strstr(e.msg, "no bound data"), "%s", e.msg);
    ck_assert_ptr_null(jdt_interp_value(it, X));
    jdt_interp_free(it);
    /* a node of a dtype it does not keep (u16) is refused by name */
    jdt_tensor *U = jdt_graph_input(g, "u", JDT_DTYPE_U16, 1, d, NULL);
    ck_assert_ptr_nonnull(U);
    ck_assert_int_eq(jdt_interp_new(g, &it, &e), JDT_OK);
    ck_assert_int_eq(jdt_interp_run(it, &e), JDT_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(e.msg, "u16"), "%s", e.msg);
    jdt_interp_free(it);
    /* a graph with a builder error is refused */
    jdt_graph_add(g, X, jdt_graph_input(g, "y", JDT_DTYPE_F64, 1, (int64_t[]){3}, NULL));
    ck_assert_int_eq(jdt_interp_new(g, &it, &e), JDT_ERR_INVALID);
    ck_assert_ptr_null(it);
    ck_assert_msg(strstr(e.msg, "add"), "%s", e.msg);
    jdt_graph_free(g);
    /* an op value outside the op table (only the unchecked constructor can make one) is an
     * error naming it, never zeros */
    g = jdt_graph_new();
    jdt_shape s1 = jdt_shape_make(1, d);
    ck_assert_ptr_nonnull(jdt_graph_new_node(g, (jdt_op)(JDT_OP_COUNT + 7), JDT_DTYPE_F64, &s1, 0,
                                             NULL, NULL));
    ck_assert_int_eq(jdt_interp_new(g, &it, &e), JDT_OK);
    ck_assert_int_eq(jdt_interp_run(it, &e), JDT_ERR_UNSUPPORTED);
    char want[64];
    snprintf(want, sizeof want, "op %d is not in the op table", JDT_OP_COUNT + 7);
    ck_assert_msg(strstr(e.msg, want), "%s", e.msg);
    jdt_interp_free(it);
    jdt_graph_free(g);
}
END_TEST

/* NORMALIZE_BWD and RMS_NORMALIZE_BWD against the explicit Jacobians of the forward maps:
 * layernorm  d xhat_i / d x_j = rstd (delta_ij - 1/n - xhat_i xhat_j / n)
 * rmsnorm    d y_i / d x_j    = r (delta_ij - x_i x_j r^2 / n) */
START_TEST(test_norm_bwd)
{
    enum { N = 5 };
    jdt_graph *g = jdt_graph_new();
    int64_t d[2] = {1, N};
    double x[N] = {0.3, -1.2, 2.0, 0.7, -0.4}, gy[N] = {1.0, -0.5, 0.25, 2.0, -1.5}, eps = 1e-3;
    jdt_tensor *X = in64(g, "x", 2, d, x), *G = in64(g, "g", 2, d, gy);
    jdt_tensor *lb = jdt_graph_normalize_bwd(g, X, G, eps),
               *rb = jdt_graph_rms_normalize_bwd(g, X, G, eps);
    jdt_tensor *c = jdt_graph_constant(g, JDT_DTYPE_F64, 2, d, x),
               *f = jdt_graph_full(g, JDT_DTYPE_F32, 2, d, 0.1);
    jdt_interp *it = run_ok(g);
    double mean = 0, var = 0, ms = 0;
    for (int i = 0; i < N; i++)
        mean += x[i] / N;
    for (int i = 0; i < N; i++) {
        var += (x[i] - mean) * (x[i] - mean) / N;
        ms += x[i] * x[i] / N;
    }
    double rstd = 1 / sqrt(var + eps), r = 1 / sqrt(ms + eps);
    for (int j = 0; j < N; j++) {
        double wl = 0, wr = 0;
        for (int i = 0; i < N; i++) {
            double xi = (x[i] - mean) * rstd, xj = (x[j] - mean) * rstd;
            wl += gy[i] * rstd * ((i == j) - 1.0 / N - xi * xj / N);
            wr += gy[i] * r * ((i == j) - x[i] * x[j] * r * r / N);
        }
        NEAR(v(it, lb, j), wl);
        NEAR(v(it, rb, j), wr);
        NEAR(v(it, c, j), x[j]);
        ck_assert(v(it, f, j) == (double)0.1f);
    }
    jdt_interp_free(it);
    jdt_graph_free(g);
}
END_TEST

/* ATTENTION_BWD against central differences of ATTENTION's forward, both in the interpreter:
 * with L = sum(attention(q, k, v) * dout), dq/dk/dv are dL/dq, dL/dk, dL/dv. */
START_TEST(test_attention_bwd)
{
    enum { B = 1, H = 2, T = 3, D = 2, NE = B * H * T * D };
    jdt_graph *g = jdt_graph_new();
    int64_t d[4] = {B, H, T, D};
    static double qkv[3][NE], dout[NE];
    float tmp[4 * NE];
    jdt_rng_normal(7, 0, 4 * NE, tmp);
    for (int i = 0; i < NE; i++) {
        for (int m = 0; m < 3; m++)
            qkv[m][i] = tmp[m * NE + i];
        dout[i] = tmp[3 * NE + i];
    }
    jdt_tensor *Q = in64(g, "q", 4, d, qkv[0]), *K = in64(g, "k", 4, d, qkv[1]),
               *V = in64(g, "v", 4, d, qkv[2]);
    jdt_tensor *DO = in64(g, "do", 4, d, dout);
    jdt_tensor *O = jdt_graph_attention(g, Q, K, V, 0.7);
    jdt_tensor *bwd = jdt_graph_attention_bwd(g, Q, K, V, O, DO, 0.7);
    jdt_tensor *L = jdt_graph_reduce_sum(g, jdt_graph_mul(g, O, DO), 15, false);
    jdt_interp *it = run_ok(g);
    static double grad[3 * NE];
    ck_assert_int_eq(jdt_interp_read_f64(it, bwd, grad, NULL), JDT_OK);
    for (int m = 0; m < 3; m++)
        for (int i = 0; i < NE; i++) {
            double x0 = qkv[m][i], h = 1e-5;
            qkv[m][i] = x0 + h;
            ck_assert_int_eq(jdt_interp_run(it, NULL), JDT_OK);
            double lp = v(it, L, 0);
            qkv[m][i] = x0 - h;
            ck_assert_int_eq(jdt_interp_run(it, NULL), JDT_OK);
            double lm = v(it, L, 0);
            qkv[m][i] = x0;
            double fd = (lp - lm) / (2 * h);
            ck_assert_msg(fabs(fd - grad[m * NE + i]) < 1e-8 * (1 + fabs(fd)),
                          "d%c[%d]: %.12g vs fd %.12g", "qkv"[m], i, grad[m * NE + i], fd);
        }
    jdt_interp_free(it);
    jdt_graph_free(g);
}
END_TEST

/* An allocation failure inside a run is ERR_NOMEM, never a crash, and a later run succeeds. */
START_TEST(test_alloc_failure)
{
    jdt_graph *g = jdt_graph_new();
    int64_t d[2] = {3, 4};
    double x[12];
    for (int i = 0; i < 12; i++)
        x[i] = i * 0.1;
    jdt_tensor *X = in64(g, "x", 2, d, x);
    jdt_tensor *y = jdt_graph_reduce_sum(g, jdt_graph_softmax(g, jdt_graph_tanh(g, X)), 3, false);
    int n_nomem = 0;
    for (long k = 1; k < 20; k++) {
        jdt_interp *it = NULL;
        jdt_err e;
        jdt_alloc_fail_after(k);
        jdt_status st = jdt_interp_new(g, &it, &e);
        if (st == JDT_OK) st = jdt_interp_run(it, &e);
        jdt_alloc_fail_after(0);
        ck_assert(st == JDT_OK || st == JDT_ERR_NOMEM);
        n_nomem += st == JDT_ERR_NOMEM;
        if (it) {
            ck_assert_int_eq(jdt_interp_run(it, &e), JDT_OK);
            NEAR(v(it, y, 0), 3.0); /* three softmax rows sum to 1 each */
        }
        jdt_interp_free(it);
    }
    ck_assert_int_gt(n_nomem, 0);
    jdt_graph_free(g);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("interp");
    TCase *tc = tcase_create("interp");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_unary);
    tcase_add_test(tc, test_binary_scalar_select_cast);
    tcase_add_test(tc, test_bf16);
    tcase_add_test(tc, test_grad_helpers);
    tcase_add_test(tc, test_shape_ops);
    tcase_add_test(tc, test_matmul);
    tcase_add_test(tc, test_gather_scatter_iota_mask);
    tcase_add_test(tc, test_softmax_family);
    tcase_add_test(tc, test_norms_rope_attention);
    tcase_add_test(tc, test_dropout);
    tcase_add_test(tc, test_dropout_rows);
    tcase_add_test(tc, test_updates_and_f32);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_alloc_failure);
    tcase_add_test(tc, test_norm_bwd);
    tcase_add_test(tc, test_attention_bwd);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
