/*
 * check_graph.c — the builder: every op's shape rule (result shapes and dtypes for valid input,
 * one clear sticky error naming the op and the shapes for invalid input), leaves, constants,
 * broadcasting helpers, logical axis names, the op registry and allocation failure.
 */
#include "tests/unit/testutil.h"
#include "graph/builder.h"
#include "graph/interp.h"
#include "graph/ops-impl.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define F32 JDT_DTYPE_F32
#define F64 JDT_DTYPE_F64
#define I32 JDT_DTYPE_I32
#define DIMS(...)                                                                                  \
    (sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[])                              \
    {                                                                                              \
        __VA_ARGS__                                                                                \
    }

static jdt_tensor *inp(jdt_graph *g, const char *name, jdt_dtype dt, int ndim, const int64_t *dims)
{
    return jdt_graph_input(g, name, dt, ndim, dims, NULL);
}

static void expect_shape(jdt_tensor *t, int ndim, const int64_t *dims)
{
    ck_assert_ptr_nonnull(t);
    jdt_shape want = jdt_shape_make(ndim, dims);
    char a[128], b[128];
    ck_assert_msg(jdt_shape_eq(&t->shape, &want), "%s: got %s want %s", jdt_op_name(t->op),
                  jdt_shape_str(&t->shape, a, sizeof a), jdt_shape_str(&want, b, sizeof b));
}

/* The graph holds an error whose message contains both substrings (s2 may be NULL). */
static void expect_err(jdt_graph *g, jdt_status code, const char *s1, const char *s2)
{
    jdt_err e;
    ck_assert_int_eq(jdt_graph_error(g, &e), code);
    ck_assert_msg(strstr(e.msg, s1) != NULL, "'%s' not in: %s", s1, e.msg);
    if (s2) ck_assert_msg(strstr(e.msg, s2) != NULL, "'%s' not in: %s", s2, e.msg);
}

/* bf16 nodes: CAST to and from f32/f64, elementwise and shape ops keep bf16, a mixed
 * bf16/f32 elementwise op is promoted to f32 by a CAST, MATMUL takes bf16 operands (bf16
 * compute, f32 output); reductions, row ops, concat and collectives refuse bf16. */
START_TEST(test_bf16_rules)
{
    const jdt_dtype BF = JDT_DTYPE_BF16;
    jdt_graph *g = jdt_graph_new();
    jdt_tensor *x = inp(g, "x", F32, DIMS(2, 3)), *w = inp(g, "w", F32, DIMS(3, 4));
    jdt_tensor *xb = jdt_graph_cast(g, x, BF), *wb = jdt_graph_cast(g, w, BF);
    ck_assert_int_eq(xb->dtype, BF);
    ck_assert_int_eq(jdt_graph_cast(g, xb, F64)->dtype, F64);
    ck_assert_int_eq(jdt_graph_exp(g, xb)->dtype, BF);
    ck_assert_int_eq(jdt_graph_mul(g, xb, xb)->dtype, BF);
    ck_assert_int_eq(jdt_graph_gt(g, xb, xb)->dtype, BF);
    ck_assert_int_eq(jdt_graph_select(g, x, xb, xb)->dtype, BF);
    ck_assert_int_eq(jdt_graph_transpose(g, xb, (int[]){1, 0})->dtype, BF);
    ck_assert_int_eq(jdt_graph_reshape(g, xb, DIMS(6))->dtype, BF);
    ck_assert_int_eq(jdt_graph_slice(g, xb, 1, 0, 2)->dtype, BF);
    ck_assert_int_eq(jdt_graph_broadcast(g, xb, DIMS(5, 2, 3))->dtype, BF);
    /* promotion: bf16 * f32 is f32, through a CAST of the bf16 side */
    int n0 = jdt_graph_n_nodes(g);
    jdt_tensor *m = jdt_graph_mul(g, xb, x);
    ck_assert_int_eq(m->dtype, F32);
    ck_assert_int_eq(jdt_graph_n_nodes(g), n0 + 2);
    ck_assert_int_eq(m->inputs[0]->op, JDT_OP_CAST);
    ck_assert_ptr_eq(m->inputs[0]->inputs[0], xb);
    /* matmul: any bf16 operand means bf16 compute and an f32 product */
    jdt_tensor *mm = jdt_graph_matmul(g, xb, wb, false, false);
    ck_assert_int_eq(mm->dtype, F32);
    ck_assert_int_eq(mm->attrs.i[2], 1);
    ck_assert_int_eq(jdt_graph_matmul(g, x, wb, false, false)->attrs.i[2], 1);
    ck_assert_int_eq(jdt_graph_matmul(g, x, w, false, false)->attrs.i[2], 0);
    jdt_err e;
    ck_assert_msg(jdt_graph_verify(g, &e) == JDT_OK, "%s", e.msg);
    /* a bf16 operand without the bf16-compute flag is refused by the rule */
    jdt_tensor *in2[2] = {xb, wb};
    jdt_shape s = jdt_shape_make(DIMS(2, 4));
    ck_assert_ptr_nonnull(jdt_graph_new_node(g, JDT_OP_MATMUL, F32, &s, 2, in2, NULL));
    ck_assert_int_eq(jdt_graph_verify(g, &e), JDT_ERR_SHAPE);
    ck_assert_msg(strstr(e.msg, "bf16 compute"), "%s", e.msg);
    jdt_graph_free(g);
    g = jdt_graph_new();
    x = inp(g, "x", F64, DIMS(2, 3));
    ck_assert_ptr_null(jdt_graph_matmul(g, jdt_graph_cast(g, x, BF), x, false, true));
    expect_err(g, JDT_ERR_SHAPE, "op 'matmul'", "bf16 or f32");
    jdt_graph_free(g);
    /* what stays f32: reductions, row ops, concat, index ops, the summing collectives (an
     * all-gather moves bf16: FSDP's bf16 weight copies) */
    jdt_tensor *(*refuse[])(jdt_graph *, jdt_tensor *) = {jdt_graph_softmax, jdt_graph_log_softmax};
    for (size_t k = 0; k < 2; k++) {
        g = jdt_graph_new();
        ck_assert_ptr_null(refuse[k](g, jdt_graph_cast(g, inp(g, "x", F32, DIMS(2, 3)), BF)));
        expect_err(g, JDT_ERR_SHAPE, "bf16", NULL);
        jdt_graph_free(g);
    }
    g = jdt_graph_new();
    xb = jdt_graph_cast(g, inp(g, "x", F32, DIMS(2, 3)), BF);
    ck_assert_ptr_null(jdt_graph_reduce_sum(g, xb, 1u, false));
    expect_err(g, JDT_ERR_SHAPE, "op 'reduce_sum'", "bf16");
    jdt_graph_free(g);
    g = jdt_graph_new();
    xb = jdt_graph_cast(g, inp(g, "x", F32, DIMS(2, 3)), BF);
    ck_assert_ptr_null(jdt_graph_concat(g, 2, (jdt_tensor *[]){xb, xb}, 0));
    expect_err(g, JDT_ERR_SHAPE, "op 'concat'", "bf16");
    jdt_graph_free(g);
    g = jdt_graph_new();
    xb = jdt_graph_cast(g, inp(g, "x", F32, DIMS(2, 4)), BF);
    ck_assert_ptr_null(jdt_graph_reduce_scatter(g, xb, 1, 2, 0, 1.0));
    expect_err(g, JDT_ERR_SHAPE, "op 'reduce_scatter'", "bf16");
    jdt_graph_free(g);
    g = jdt_graph_new();
    xb = jdt_graph_cast(g, inp(g, "x", F32, DIMS(2, 4)), BF);
    jdt_tensor *xg = jdt_graph_all_gather(g, xb, 1, 2, 0);
    ck_assert_ptr_nonnull(xg);
    ck_assert_int_eq(xg->dtype, BF);
    ck_assert_int_eq(xg->shape.dims[0], 4);
    ck_assert_msg(jdt_graph_verify(g, &e) == JDT_OK, "%s", e.msg);
    jdt_graph_free(g);
}
END_TEST

START_TEST(test_registry)
{
    for (int op = 0; op < JDT_OP_COUNT; op++) {
        const jdt_op_info *info = jdt_op_info_get((jdt_op)op);
        ck_assert_str_eq(info->name, jdt_op_name((jdt_op)op));
        ck_assert_int_eq(info->arity, jdt_op_arity((jdt_op)op));
        ck_assert_ptr_nonnull(info->shape);
        /* every op has a class; leaves and generators take no inputs, elementwise ops 1..3
         * (DROPOUT: 2 to 4, variadic) */
        jdt_op_class c = jdt_op_class_of((jdt_op)op);
        ck_assert_int_lt((int)c, JDT_OPC_COUNT);
        ck_assert_str_ne(jdt_op_class_name(c), "?");
        if (c == JDT_OPC_LEAF || c == JDT_OPC_GENERATOR) ck_assert_int_eq(info->arity, 0);
        if (c == JDT_OPC_ELEMENTWISE)
            ck_assert(op == JDT_OP_DROPOUT ? info->arity == -1
                                           : info->arity >= 1 && info->arity <= 3);
    }
    ck_assert_int_eq(jdt_op_class_of(JDT_OP_MATMUL), JDT_OPC_MATMUL);
    ck_assert_int_eq(jdt_op_class_of(JDT_OP_DROPOUT), JDT_OPC_ELEMENTWISE);
    ck_assert_int_eq(jdt_op_class_of(JDT_OP_ALL_REDUCE), JDT_OPC_COLLECTIVE);
    ck_assert_int_eq((int)jdt_op_class_of((jdt_op)JDT_OP_COUNT), JDT_OPC_COUNT);
    ck_assert_str_eq(jdt_op_class_name(JDT_OPC_FUSED), "fused");
    /* differentiable ops have rules; the documented non-differentiable ones do not */
    jdt_op with[] = {JDT_OP_ADD,         JDT_OP_MATMUL,        JDT_OP_SOFTMAX_XENT,
                     JDT_OP_ATTENTION,   JDT_OP_ROPE,          JDT_OP_GATHER,
                     JDT_OP_SCATTER_ADD, JDT_OP_STOP_GRADIENT, JDT_OP_DROPOUT};
    jdt_op without[] = {JDT_OP_GT,    JDT_OP_GE,          JDT_OP_IOTA,         JDT_OP_CAUSAL_MASK,
                        JDT_OP_PARAM, JDT_OP_SOFTMAX_BWD, JDT_OP_ATTENTION_BWD};
    for (size_t i = 0; i < JDT_ARRAY_LEN(with); i++)
        ck_assert_ptr_nonnull(jdt_op_info_get(with[i])->vjp);
    for (size_t i = 0; i < JDT_ARRAY_LEN(without); i++)
        ck_assert_ptr_null(jdt_op_info_get(without[i])->vjp);
}
END_TEST

/* Runs g in the interpreter and copies t's value into out (numel(t) doubles). */
static void interp_value(jdt_graph *g, jdt_tensor *t, double *out)
{
    jdt_interp *it = NULL;
    jdt_err e;
    ck_assert_msg(jdt_interp_new(g, &it, &e) == JDT_OK, "%s", e.msg);
    ck_assert_msg(jdt_interp_run(it, &e) == JDT_OK, "%s", e.msg);
    ck_assert_int_eq(jdt_interp_read_f64(it, t, out, &e), JDT_OK);
    jdt_interp_free(it);
}

/* Op flags (flags_<OP>, ops.c) against what they promise: the accessor reads the registry
 * row; an EXACT_BF16 op takes bf16 (leaf, elementwise or shape class) and its elementwise ones,
 * applied to bf16 values held in f32, give values bf16 holds exactly (an arithmetic op such as
 * ADD or MUL would not: the values below are chosen so); an ID_IF_SAME_TYPE op built with its
 * input's dtype and shape gives its input back. */
START_TEST(test_op_flags)
{
    const uint32_t known = JDT_OPF_EXACT_BF16 | JDT_OPF_ID_IF_SAME_TYPE;
    enum { N = 8 };
    const float raw[3][N] = {{1.7f, -3.14159f, 0.3f, 1e-3f, 250.7f, -0.0f, 0.0f, 7.1f},
                             {0.3f, 2.2f, -0.3f, 1.1f, 250.7f, 0.0f, -5.9f, 0.7f},
                             {1.0f, 0.0f, -2.0f, 0.0f, 3.0f, 1.0f, 0.0f, 0.5f}};
    float v[3][N];
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < N; j++)
            v[k][j] = jdt_bf16_round(raw[k][j]);
    int n_exact = 0, n_id = 0;
    for (int op = 0; op < JDT_OP_COUNT; op++) {
        const char *name = jdt_op_name((jdt_op)op);
        const uint32_t f = jdt_op_flags((jdt_op)op);
        const jdt_op_class c = jdt_op_class_of((jdt_op)op);
        const int arity = jdt_op_arity((jdt_op)op);
        ck_assert_uint_eq(f, jdt_op_info_get((jdt_op)op)->flags);
        ck_assert_msg(!(f & ~known), "%s: unknown flag bits 0x%x", name, (unsigned)f);
        if (f & JDT_OPF_EXACT_BF16) {
            n_exact++;
            ck_assert_msg(c == JDT_OPC_LEAF || c == JDT_OPC_ELEMENTWISE || c == JDT_OPC_SHAPE,
                          "%s is EXACT_BF16 but its class (%s) takes no bf16", name,
                          jdt_op_class_name(c));
        }
        if ((f & JDT_OPF_EXACT_BF16) && c == JDT_OPC_ELEMENTWISE) {
            jdt_graph *g = jdt_graph_new();
            jdt_tensor *in[3];
            for (int k = 0; k < arity; k++)
                in[k] = jdt_graph_constant(g, F32, DIMS(N), v[k]);
            jdt_tensor *t = jdt_graph_op(g, (jdt_op)op, arity, in, &(jdt_attrs){0}, F32, NULL);
            ck_assert_msg(t != NULL, "%s: not built", name);
            double out[N];
            interp_value(g, t, out);
            for (int j = 0; j < N; j++)
                ck_assert_msg((float)out[j] == jdt_bf16_round((float)out[j]),
                              "%s: element %d = %.9g is not a bf16 value", name, j, out[j]);
            jdt_graph_free(g);
        }
        if (f & JDT_OPF_ID_IF_SAME_TYPE) {
            n_id++;
            ck_assert_msg(arity == 1, "%s: ID_IF_SAME_TYPE on an op of arity %d", name, arity);
            jdt_graph *g = jdt_graph_new();
            jdt_tensor *x = jdt_graph_constant(g, F32, DIMS(2, 4), v[0]);
            jdt_tensor *t = jdt_graph_op(g, (jdt_op)op, 1, &x, &(jdt_attrs){0}, F32, &x->shape);
            ck_assert_msg(t != NULL, "%s: not built with its input's dtype and shape", name);
            ck_assert(t->dtype == x->dtype && jdt_shape_eq(&t->shape, &x->shape));
            double out[N];
            interp_value(g, t, out);
            for (int j = 0; j < N; j++)
                ck_assert_msg(out[j] == (double)v[0][j], "%s: element %d changed", name, j);
            jdt_graph_free(g);
        }
    }
    /* both flags are in use, so the checks above ran; values outside the enum have none */
    ck_assert_int_gt(n_exact, 0);
    ck_assert_int_gt(n_id, 0);
    ck_assert_uint_eq(jdt_op_flags((jdt_op)JDT_OP_COUNT), 0);
    ck_assert_uint_eq(jdt_op_flags((jdt_op)-1), 0);
}
END_TEST

START_TEST(test_elementwise_rules)
{
    jdt_graph *g = jdt_graph_new();
    jdt_tensor *a = inp(g, "a", F32, DIMS(2, 3)), *b = inp(g, "b", F32, DIMS(2, 3));
    jdt_tensor *outs[] = {jdt_graph_neg(g, a),
                          jdt_graph_exp(g, a),
                          jdt_graph_log(g, a),
                          jdt_graph_tanh(g, a),
                          jdt_graph_sqrt(g, a),
                          jdt_graph_rsqrt(g, a),
                          jdt_graph_relu(g, a),
                          jdt_graph_gelu(g, a),
                          jdt_graph_silu(g, a),
                          jdt_graph_sigmoid(g, a),
                          jdt_graph_abs(g, a),
                          jdt_graph_add(g, a, b),
                          jdt_graph_sub(g, a, b),
                          jdt_graph_mul(g, a, b),
                          jdt_graph_div(g, a, b),
                          jdt_graph_max(g, a, b),
                          jdt_graph_min(g, a, b),
                          jdt_graph_gt(g, a, b),
                          jdt_graph_ge(g, a, b),
                          jdt_graph_add_scalar(g, a, 1),
                          jdt_graph_mul_scalar(g, a, 2),
                          jdt_graph_pow_scalar(g, a, 2),
                          jdt_graph_gelu_grad(g, a, b),
                          jdt_graph_silu_grad(g, a, b),
                          jdt_graph_select(g, a, a, b),
                          jdt_graph_stop_gradient(g, a),
                          jdt_graph_softmax(g, a),
                          jdt_graph_log_softmax(g, a),
                          jdt_graph_softmax_bwd(g, a, b),
                          jdt_graph_log_softmax_bwd(g, a, b),
                          jdt_graph_normalize(g, a, 1e-5),
                          jdt_graph_normalize_bwd(g, a, b, 1e-5),
                          jdt_graph_rms_normalize(g, a, 1e-5),
                          jdt_graph_rms_normalize_bwd(g, a, b, 1e-5)};
    for (size_t i = 0; i < JDT_ARRAY_LEN(outs); i++) {
        expect_shape(outs[i], DIMS(2, 3));
        ck_assert_int_eq(outs[i]->dtype, F32);
    }
    ck_assert_int_eq(jdt_graph_cast(g, a, I32)->dtype, I32);
    ck_assert_int_eq(jdt_graph_error(g, NULL), JDT_OK);
    jdt_graph_free(g);

    /* mismatched shapes name the op and both shapes */
    g = jdt_graph_new();
    a = inp(g, "a", F32, DIMS(2, 3));
    b = inp(g, "b", F32, DIMS(3, 2));
    ck_assert_ptr_null(jdt_graph_mul(g, a, b));
    expect_err(g, JDT_ERR_SHAPE, "op 'mul'", "(2, 3) f32, (3, 2) f32");
    jdt_graph_free(g);
    /* mixed dtypes */
    g = jdt_graph_new();
    ck_assert_ptr_null(jdt_graph_add(g, inp(g, "a", F32, DIMS(2)), inp(g, "b", F64, DIMS(2))));
    expect_err(g, JDT_ERR_SHAPE, "op 'add'", "different dtypes");
    jdt_graph_free(g);
    /* integer input to a float op */
    g = jdt_graph_new();
    ck_assert_ptr_null(jdt_graph_exp(g, inp(g, "i", I32, DIMS(2))));
    expect_err(g, JDT_ERR_SHAPE, "op 'exp'", "i32");
    jdt_graph_free(g);
    /* row ops need rank >= 1 */
    g = jdt_graph_new();
    ck_assert_ptr_null(jdt_graph_softmax(g, inp(g, "s", F32, 0, NULL)));
    expect_err(g, JDT_ERR_SHAPE, "op 'softmax'", "rank");
    jdt_graph_free(g);
    /* cast to an unsupported dtype: bf16 converts only to and from f32 and f64 */
    g = jdt_graph_new();
    ck_assert_ptr_null(jdt_graph_cast(g, inp(g, "a", I32, DIMS(2)), JDT_DTYPE_BF16));
    expect_err(g, JDT_ERR_SHAPE, "op 'cast'", "i32 -> bf16");
    jdt_graph_free(g);
    g = jdt_graph_new();
    ck_assert_ptr_null(jdt_graph_cast(g, inp(g, "a", F32, DIMS(2)), JDT_DTYPE_U16));
    expect_err(g, JDT_ERR_SHAPE, "op 'cast'", "u16");
    jdt_graph_free(g);
    /* dropout: step must be an i32 scalar, rate in [0, 1) */
    g = jdt_graph_new();
    a = inp(g, "a", F32, DIMS(4));
    jdt_tensor *st = inp(g, "step", I32, 0, NULL);
    expect_shape(jdt_graph_dropout(g, a, st, 0.1, 7), DIMS(4));
    ck_assert_ptr_null(jdt_graph_dropout(g, a, st, 1.0, 7));
    expect_err(g, JDT_ERR_SHAPE, "op 'dropout'", "rate");
    jdt_graph_free(g);
    g = jdt_graph_new();
    a = inp(g, "a", F32, DIMS(4));
    ck_assert_ptr_null(jdt_graph_dropout(g, a, a, 0.1, 7));
    expect_err(g, JDT_ERR_SHAPE, "op 'dropout'", "step");
    jdt_graph_free(g);
}
END_TEST

START_TEST(test_shape_rules)
{
    jdt_graph *g = jdt_graph_new();
    jdt_tensor *x = inp(g, "x", F32, DIMS(2, 3, 4));
    expect_shape(jdt_graph_broadcast(g, inp(g, "r", F32, DIMS(3, 1)), DIMS(2, 3, 4)),
                 DIMS(2, 3, 4));
    expect_shape(jdt_graph_reduce_sum(g, x, 5, false), DIMS(3));
    expect_shape(jdt_graph_reduce_max(g, x, 2, true), DIMS(2, 1, 4));
    expect_shape(jdt_graph_reduce_mean(g, x, 7, false), 0, NULL);
    expect_shape(jdt_graph_reshape(g, x, DIMS(6, 4)), DIMS(6, 4));
    expect_shape(jdt_graph_transpose(g, x, (int[]){2, 0, 1}), DIMS(4, 2, 3));
    expect_shape(jdt_graph_slice(g, x, 2, 1, 3), DIMS(2, 3, 2));
    expect_shape(jdt_graph_concat(g, 2, (jdt_tensor *[]){x, x}, 1), DIMS(2, 6, 4));
    jdt_tensor *w = inp(g, "w", F32, DIMS(4, 5)), *wt = inp(g, "wt", F32, DIMS(5, 4));
    expect_shape(jdt_graph_matmul(g, x, w, false, false), DIMS(2, 3, 5));
    expect_shape(jdt_graph_matmul(g, x, wt, false, true), DIMS(2, 3, 5));
    expect_shape(jdt_graph_matmul(g, inp(g, "xt", F32, DIMS(2, 4, 3)), w, true, false),
                 DIMS(2, 3, 5));
    expect_shape(jdt_graph_matmul(g, x, inp(g, "bw", F32, DIMS(2, 4, 7)), false, false),
                 DIMS(2, 3, 7));
    jdt_tensor *tab = inp(g, "tab", F32, DIMS(10, 8)), *idx = inp(g, "idx", I32, DIMS(2, 3));
    jdt_tensor *ga = jdt_graph_gather(g, tab, idx);
    expect_shape(ga, DIMS(2, 3, 8));
    expect_shape(jdt_graph_scatter_add(g, ga, idx, 10), DIMS(10, 8));
    expect_shape(jdt_graph_iota(g, I32, DIMS(3, 4), 1), DIMS(3, 4));
    expect_shape(jdt_graph_causal_mask(g, F32, 5), DIMS(5, 5));
    jdt_tensor *lg = inp(g, "lg", F32, DIMS(6, 10)), *tg = inp(g, "tg", I32, DIMS(6));
    jdt_tensor *xe = jdt_graph_softmax_xent(g, lg, tg);
    expect_shape(xe, DIMS(6));
    expect_shape(jdt_graph_softmax_xent_bwd(g, lg, tg, xe, xe), DIMS(6, 10));
    jdt_tensor *q = inp(g, "q", F32, DIMS(2, 4, 8, 16));
    expect_shape(jdt_graph_rope(g, q, 10000, false), DIMS(2, 4, 8, 16));
    jdt_tensor *o = jdt_graph_attention(g, q, q, q, 0.25);
    expect_shape(o, DIMS(2, 4, 8, 16));
    expect_shape(jdt_graph_attention_bwd(g, q, q, q, o, o, 0.25), DIMS(3, 2, 4, 8, 16));
    expect_shape(jdt_graph_scalar(g, F32, 2.0), 0, NULL);
    expect_shape(jdt_graph_full(g, F64, DIMS(2, 2), 1.0), DIMS(2, 2));
    ck_assert_int_eq(jdt_graph_error(g, NULL), JDT_OK);
    jdt_graph_free(g);
}
END_TEST

/* Each invalid call: a fresh graph, NULL result, one error naming the op and the problem. */
START_TEST(test_shape_rule_errors)
{
    struct {
        const char *op, *detail;
    } want[] = {
        {"op 'broadcast'", "cannot expand"},
        {"op 'reduce_sum'", "axes mask"},
        {"op 'reshape'", "element count"},
        {"op 'transpose'", "perm"},
        {"op 'slice'", "range [2, 9)"},
        {"op 'concat'", "dim 0"},
        {"op 'matmul'", "contraction"},
        {"op 'matmul'", "batch"},
        {"op 'gather'", "i32"},
        {"op 'scatter_add'", "indices"},
        {"op 'iota'", "axis"},
        {"op 'softmax_xent'", "targets"},
        {"op 'rope'", "D even"},
        {"op 'attention'", "shape"},
        {"op 'causal_mask'", "f32"},
        {"op 'matmul'", "rank >= 2"},
    };
    for (size_t i = 0; i < JDT_ARRAY_LEN(want); i++) {
        jdt_graph *g = jdt_graph_new();
        jdt_tensor *x = inp(g, "x", F32, DIMS(2, 3, 4)), *r = NULL;
        jdt_tensor *i32 = inp(g, "i", I32, DIMS(2, 3));
        switch (i) {
        case 0:
            r = jdt_graph_broadcast(g, x, DIMS(2, 5, 4));
            break;
        case 1:
            r = jdt_graph_reduce_sum(g, x, 8, false);
            break;
        case 2:
            r = jdt_graph_reshape(g, x, DIMS(5, 5));
            break;
        case 3:
            r = jdt_graph_transpose(g, x, (int[]){0, 0, 1});
            break;
        case 4:
            r = jdt_graph_slice(g, x, 2, 2, 9);
            break;
        case 5:
            r = jdt_graph_concat(g, 2, (jdt_tensor *[]){x, inp(g, "y", F32, DIMS(3, 3, 4))}, 1);
            break;
        case 6:
            r = jdt_graph_matmul(g, x, inp(g, "w", F32, DIMS(5, 6)), false, false);
            break;
        case 7:
            r = jdt_graph_matmul(g, x, inp(g, "w", F32, DIMS(3, 4, 6)), false, false);
            break;
        case 8:
            r = jdt_graph_gather(g, inp(g, "t", F32, DIMS(5, 4)), inp(g, "f", F32, DIMS(3)));
            break;
        case 9:
            r = jdt_graph_scatter_add(g, x, i32, 0);
            break;
        case 10:
            r = jdt_graph_iota(g, I32, DIMS(3), 2);
            break;
        case 11:
            r = jdt_graph_softmax_xent(g, inp(g, "l", F32, DIMS(4, 5)), i32);
            break;
        case 12:
            r = jdt_graph_rope(g, inp(g, "q", F32, DIMS(1, 2, 3, 5)), 10000, false);
            break;
        case 13:
            r = jdt_graph_attention(g, x, x, inp(g, "v", F32, DIMS(2, 3, 5)), 1.0);
            break;
        case 14:
            r = jdt_graph_causal_mask(g, I32, 4);
            break;
        case 15:
            r = jdt_graph_matmul(g, inp(g, "v", F32, DIMS(4)), x, false, false);
            break;
        }
        ck_assert_ptr_null(r);
        if (i == 9) { /* scatter_add: indices (2, 3) fit src (2, 3, 4), the row count does not */
            expect_err(g, JDT_ERR_SHAPE, "op 'scatter_add'", "row count");
        } else {
            expect_err(g, JDT_ERR_SHAPE, want[i].op, want[i].detail);
        }
        jdt_graph_free(g);
    }
}
END_TEST

START_TEST(test_sticky_errors)
{
    jdt_graph *g = jdt_graph_new();
    jdt_tensor *a = inp(g, "a", F32, DIMS(2, 3)), *b = inp(g, "b", F32, DIMS(4));
    ck_assert_int_eq(jdt_graph_error(g, NULL), JDT_OK);
    ck_assert_ptr_null(jdt_graph_error_msg(g));
    jdt_tensor *bad = jdt_graph_matmul(g, a, b, false, false); /* first error */
    ck_assert_ptr_null(bad);
    int n = jdt_graph_n_nodes(g);
    /* NULL flows through, later (valid or invalid) calls return NULL and add nothing */
    jdt_tensor *c = jdt_graph_exp(g, bad);
    ck_assert_ptr_null(c);
    ck_assert_ptr_null(jdt_graph_add(g, a, b));
    ck_assert_ptr_null(jdt_graph_neg(g, a));
    ck_assert_ptr_null(jdt_graph_param(g, "w", F32, DIMS(2), NULL));
    ck_assert_int_eq(jdt_graph_n_nodes(g), n);
    expect_err(g, JDT_ERR_SHAPE, "op 'matmul'", "(2, 3) f32, (4) f32");
    jdt_graph_free(g);
    /* a NULL input without a prior error is itself the error */
    g = jdt_graph_new();
    ck_assert_ptr_null(jdt_graph_add(g, inp(g, "a", F32, DIMS(2)), NULL));
    expect_err(g, JDT_ERR_INVALID, "op 'add'", "input 1 is NULL");
    jdt_graph_free(g);
    /* a tensor of another graph */
    g = jdt_graph_new();
    jdt_graph *h = jdt_graph_new();
    jdt_tensor *x = inp(h, "x", F32, DIMS(2));
    for (int i = 0; i < 3; i++)
        inp(g, i == 0 ? "p" : i == 1 ? "q" : "r", F32, DIMS(2));
    ck_assert_ptr_null(jdt_graph_neg(g, x));
    expect_err(g, JDT_ERR_INVALID, "op 'neg'", "another graph");
    jdt_graph_free(h);
    jdt_graph_free(g);
}
END_TEST

START_TEST(test_leaves)
{
    jdt_graph *g = jdt_graph_new();
    jdt_tensor *p = jdt_graph_param(g, "wte", F32, DIMS(10, 4), (const char *[]){"vocab", "embed"});
    ck_assert(p->flags & JDT_TENSOR_PARAM);
    ck_assert_str_eq(p->name, "wte");
    ck_assert_str_eq(p->axes[0], "vocab");
    ck_assert_ptr_eq(jdt_graph_find(g, "wte"), p);
    jdt_tensor *s = jdt_graph_state(g, "wte.m", F32, DIMS(10, 4), NULL);
    ck_assert(s->flags & JDT_TENSOR_STATE);
    ck_assert(!(s->flags & JDT_TENSOR_INPUT));
    ck_assert_int_ge(jdt_graph_add_update(g, s, jdt_graph_mul_scalar(g, s, 0.9)), 0);
    float data[3] = {1, 2, 3};
    jdt_tensor *c = jdt_graph_constant(g, F32, DIMS(3), data);
    data[0] = 9; /* copied, not aliased */
    ck_assert(((float *)c->data)[0] == 1.0f);
    ck_assert_int_eq(jdt_graph_error(g, NULL), JDT_OK);
    ck_assert_ptr_null(jdt_graph_input(g, "wte", F32, DIMS(2), NULL));
    expect_err(g, JDT_ERR_INVALID, "'wte'", "already used");
    jdt_graph_free(g);
    g = jdt_graph_new();
    ck_assert_ptr_null(jdt_graph_param(g, "z", F32, DIMS(3, 0), NULL));
    expect_err(g, JDT_ERR_SHAPE, "param 'z'", "dim 1 is 0");
    jdt_graph_free(g);
    g = jdt_graph_new();
    ck_assert_ptr_null(jdt_graph_param(g, "big", F32, 7, (int64_t[]){1, 1, 1, 1, 1, 1, 1}, NULL));
    expect_err(g, JDT_ERR_SHAPE, "rank 7", NULL);
    jdt_graph_free(g);
}
END_TEST

START_TEST(test_broadcast_helpers)
{
    jdt_shape a = jdt_shape_make(DIMS(2, 1, 4)), b = jdt_shape_make(DIMS(3, 1)), o;
    ck_assert(jdt_shape_broadcast(&a, &b, &o));
    jdt_shape want = jdt_shape_make(DIMS(2, 3, 4));
    ck_assert(jdt_shape_eq(&o, &want));
    jdt_shape c = jdt_shape_make(DIMS(5));
    ck_assert(!jdt_shape_broadcast(&a, &c, &o));

    jdt_graph *g = jdt_graph_new();
    jdt_tensor *x = inp(g, "x", F32, DIMS(2, 1, 4)), *y = inp(g, "y", F32, DIMS(3, 1));
    jdt_tensor *z = jdt_graph_add_bcast(g, x, y);
    expect_shape(z, DIMS(2, 3, 4));
    ck_assert_int_eq(z->inputs[0]->op, JDT_OP_BROADCAST);
    jdt_tensor *same = jdt_graph_mul_bcast(g, z, z);
    ck_assert_ptr_eq(same->inputs[0], z); /* no broadcast inserted when shapes agree */
    jdt_tensor *u = jdt_graph_unbroadcast(g, z, &y->shape);
    expect_shape(u, DIMS(3, 1));
    ck_assert_ptr_eq(jdt_graph_unbroadcast(g, z, &z->shape), z);
    ck_assert_ptr_null(jdt_graph_sub_bcast(g, x, inp(g, "w", F32, DIMS(5))));
    expect_err(g, JDT_ERR_SHAPE, "op 'sub'", "(2, 1, 4) and (5)");
    jdt_graph_free(g);
}
END_TEST

START_TEST(test_axis_names)
{
    jdt_graph *g = jdt_graph_new();
    jdt_tensor *x =
        jdt_graph_input(g, "x", F32, DIMS(2, 8, 16), (const char *[]){"batch", "seq", "embed"});
    jdt_tensor *w = jdt_graph_param(g, "w", F32, DIMS(16, 32), (const char *[]){"embed", "mlp"});
    jdt_tensor *b = jdt_graph_param(g, "b", F32, DIMS(32), (const char *[]){"mlp"});
    jdt_tensor *h =
        jdt_graph_gelu(g, jdt_graph_add_bcast(g, jdt_graph_matmul(g, x, w, false, false), b));
    ck_assert_str_eq(h->axes[0], "batch");
    ck_assert_str_eq(h->axes[1], "seq");
    ck_assert_str_eq(h->axes[2], "mlp");
    jdt_tensor *r = jdt_graph_reduce_sum(g, h, 2, false);
    ck_assert_str_eq(r->axes[0], "batch");
    ck_assert_str_eq(r->axes[1], "mlp");
    jdt_tensor *t = jdt_graph_transpose(g, h, (int[]){2, 0, 1});
    ck_assert_str_eq(t->axes[0], "mlp");
    jdt_tensor *rs = jdt_graph_reshape(g, x, DIMS(16, 16));
    ck_assert_ptr_null(rs->axes[0]);
    ck_assert_str_eq(rs->axes[1], "embed");
    jdt_tensor *tab =
        jdt_graph_param(g, "wte", F32, DIMS(50, 16), (const char *[]){"vocab", "embed"});
    jdt_tensor *ids = jdt_graph_input(g, "ids", I32, DIMS(2, 8), (const char *[]){"batch", "seq"});
    jdt_tensor *emb = jdt_graph_gather(g, tab, ids);
    ck_assert_str_eq(emb->axes[0], "batch");
    ck_assert_str_eq(emb->axes[2], "embed");
    jdt_tensor *lg = jdt_graph_matmul(g, x, tab, false, true);
    ck_assert_str_eq(lg->axes[2], "vocab");
    ck_assert_int_eq(jdt_graph_error(g, NULL), JDT_OK);
    jdt_graph_free(g);
}
END_TEST

/* Every allocation failure while building becomes the sticky NOMEM error, never a crash. */
START_TEST(test_alloc_failure)
{
    int n_nomem = 0;
    for (long k = 1; k < 40; k++) {
        jdt_graph *g = jdt_graph_new();
        ck_assert_ptr_nonnull(g);
        jdt_alloc_fail_after(k);
        jdt_tensor *x =
            jdt_graph_input(g, "x", F32, DIMS(4, 4), (const char *[]){"batch", "embed"});
        jdt_tensor *y = x;
        for (int i = 0; i < 200; i++)
            y = jdt_graph_tanh(g, y);
        jdt_alloc_fail_after(0);
        jdt_status st = jdt_graph_error(g, NULL);
        ck_assert(st == JDT_OK || st == JDT_ERR_NOMEM);
        if (st == JDT_OK)
            ck_assert_ptr_nonnull(y);
        else
            ck_assert_ptr_null(y);
        n_nomem += st == JDT_ERR_NOMEM;
        jdt_graph_free(g);
    }
    ck_assert_int_gt(n_nomem, 0);
}
END_TEST

START_TEST(test_verify)
{
    jdt_graph *g = jdt_graph_new();
    jdt_tensor *x = inp(g, "x", F32, DIMS(2, 3)), *w = inp(g, "w", F32, DIMS(3, 4));
    jdt_tensor *y = jdt_graph_softmax(g, jdt_graph_matmul(g, x, w, false, false));
    jdt_tensor *l = jdt_graph_reduce_sum(g, y, 3, false);
    ck_assert_ptr_nonnull(l);
    jdt_err e;
    ck_assert_int_eq(jdt_graph_verify(g, &e), JDT_OK);
    /* a pass that appends an unchecked node with a wrong shape is caught, naming the node */
    jdt_shape bad = jdt_shape_make(DIMS(2, 5));
    jdt_tensor *in[2] = {x, w};
    jdt_attrs at;
    memset(&at, 0, sizeof at);
    jdt_tensor *t = jdt_graph_new_node(g, JDT_OP_MATMUL, F32, &bad, 2, in, &at);
    ck_assert_int_eq(jdt_graph_verify(g, &e), JDT_ERR_SHAPE);
    ck_assert_msg(strstr(e.msg, "node 5 (matmul)") && strstr(e.msg, "(2, 5)") &&
                      strstr(e.msg, "(2, 4)"),
                  "%s", e.msg);
    t->shape = jdt_shape_make(DIMS(2, 4));
    ck_assert_int_eq(jdt_graph_verify(g, &e), JDT_OK);
    t->attrs.i[1] = 1; /* now claims b is transposed: contraction mismatch */
    ck_assert_int_eq(jdt_graph_verify(g, &e), JDT_ERR_SHAPE);
    ck_assert_msg(strstr(e.msg, "contraction"), "%s", e.msg);
    jdt_graph_free(g);
}
END_TEST

START_TEST(test_fprint)
{
    jdt_graph *g = jdt_graph_new();
    jdt_tensor *w = jdt_graph_param(g, "w", F32, DIMS(4, 8), (const char *[]){"embed", "mlp"});
    jdt_tensor *x = jdt_graph_input(g, "x", F32, DIMS(2, 4), (const char *[]){"batch", "embed"});
    jdt_tensor *y = jdt_graph_matmul(g, x, w, false, false);
    jdt_graph_add_output(g, y);
    jdt_graph_add_update(g, w, jdt_graph_mul_scalar(g, w, 0.5));
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    jdt_graph_fprint(g, f);
    fclose(f);
    ck_assert_msg(strstr(buf, "%2 = matmul(%1, %0) : (2, 8) f32 [batch, mlp]"), "%s", buf);
    ck_assert_msg(strstr(buf, "'w'") && strstr(buf, "output 0: %2") &&
                      strstr(buf, "update 'w' <- %3"),
                  "%s", buf);
    free(buf);
    jdt_graph_free(g);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("graph");
    TCase *tc = tcase_create("graph");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_registry);
    tcase_add_test(tc, test_op_flags);
    tcase_add_test(tc, test_bf16_rules);
    tcase_add_test(tc, test_elementwise_rules);
    tcase_add_test(tc, test_shape_rules);
    tcase_add_test(tc, test_shape_rule_errors);
    tcase_add_test(tc, test_sticky_errors);
    tcase_add_test(tc, test_leaves);
    tcase_add_test(tc, test_broadcast_helpers);
    tcase_add_test(tc, test_axis_names);
    tcase_add_test(tc, test_alloc_failure);
    tcase_add_test(tc, test_fprint);
    tcase_add_test(tc, test_verify);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
