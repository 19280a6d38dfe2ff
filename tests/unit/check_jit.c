/*
 * check_jit.c — the CPU backend against the reference interpreter: every op of the IR (odd
 * shapes, several ops per compiled program to keep compiler calls few), random fused chains,
 * the fused attention, a whole train step with donated updates, and run-time errors.
 */
#include "tests/unit/testutil.h"
#include "jit-fixture.h"

#include "autodiff/autodiff.h"
#include "runtime/runtime.h"

#define RT 2e-5
#define AT 2e-5

static void out(fx *f, jdt_tensor *t)
{
    ck_assert_msg(t != NULL, "builder: %s", jdt_graph_error_msg(f->g));
    jdt_graph_add_output(f->g, t);
}

START_TEST(test_elementwise_ops)
{
    fx f;
    fx_init(&f);
    jdt_graph *g = f.g;
    jdt_tensor *x = FX_INPUT(&f, "x", JDT_DTYPE_F32, -3, 3, 7, 13);
    jdt_tensor *y = FX_INPUT(&f, "y", JDT_DTYPE_F32, -3, 3, 7, 13);
    jdt_tensor *pos = FX_INPUT(&f, "pos", JDT_DTYPE_F32, 0.1, 4, 7, 13);
    jdt_tensor *stp = jdt_graph_input(g, "stp", JDT_DTYPE_I32, 0, NULL, NULL);
    f.leaf[f.n] = stp, f.lo[f.n] = 3, f.hi[f.n] = 4, f.n++;
    out(&f, jdt_graph_neg(g, x));
    out(&f, jdt_graph_exp(g, x));
    out(&f, jdt_graph_log(g, pos));
    out(&f, jdt_graph_tanh(g, x));
    out(&f, jdt_graph_sqrt(g, pos));
    out(&f, jdt_graph_rsqrt(g, pos));
    out(&f, jdt_graph_relu(g, x));
    out(&f, jdt_graph_gelu(g, x));
    out(&f, jdt_graph_silu(g, x));
    out(&f, jdt_graph_sigmoid(g, x));
    out(&f, jdt_graph_abs(g, x));
    out(&f, jdt_graph_add(g, x, y));
    out(&f, jdt_graph_sub(g, x, y));
    out(&f, jdt_graph_mul(g, x, y));
    out(&f, jdt_graph_div(g, x, pos));
    out(&f, jdt_graph_max(g, x, y));
    out(&f, jdt_graph_min(g, x, y));
    out(&f, jdt_graph_gt(g, x, y));
    out(&f, jdt_graph_ge(g, x, x));
    out(&f, jdt_graph_add_scalar(g, x, 0.25));
    out(&f, jdt_graph_mul_scalar(g, x, -1.5));
    out(&f, jdt_graph_pow_scalar(g, pos, 2.0));
    out(&f, jdt_graph_pow_scalar(g, pos, 0.5));
    out(&f, jdt_graph_pow_scalar(g, pos, 1.7));
    out(&f, jdt_graph_pow_scalar(g, pos, -1.0));
    out(&f, jdt_graph_gelu_grad(g, x, y));
    out(&f, jdt_graph_silu_grad(g, x, y));
    out(&f, jdt_graph_select(g, jdt_graph_gt(g, x, y), x, pos));
    out(&f, jdt_graph_cast(g, jdt_graph_mul_scalar(g, x, 10.0), JDT_DTYPE_I32));
    out(&f, jdt_graph_cast(g, jdt_graph_cast(g, x, JDT_DTYPE_I32), JDT_DTYPE_F32));
    out(&f, jdt_graph_stop_gradient(g, x));
    out(&f, jdt_graph_dropout(g, x, stp, 0.3, 1234));
    { /* rows numbered from row0 (a micro-batch's), and a block's base (the partitioner's) */
        const double r0 = 5, base = 3;
        jdt_tensor *row0 = jdt_graph_constant(g, JDT_DTYPE_F64, 0, NULL, &r0);
        jdt_tensor *dr = jdt_graph_dropout_rows(g, x, stp, row0, 0.3, 1234);
        out(&f, dr);
        jdt_tensor *in4[4] = {x, stp, row0, jdt_graph_constant(g, JDT_DTYPE_F64, 0, NULL, &base)};
        out(&f, jdt_graph_op(g, JDT_OP_DROPOUT, 4, in4, &dr->attrs, JDT_DTYPE_F32, NULL));
        /* x as the columns 13..25 of a (7, 26) value: the rows' stride is not x's own */
        jdt_attrs wide = dr->attrs;
        wide.i[2] = 26;
        out(&f, jdt_graph_op(g, JDT_OP_DROPOUT, 4, in4, &wide, JDT_DTYPE_F32, NULL));
    }
    out(&f, jdt_graph_iota(g, JDT_DTYPE_F32, 3, (int64_t[]){3, 5, 7}, 1));
    out(&f, jdt_graph_iota(g, JDT_DTYPE_I32, 2, (int64_t[]){4, 9}, 1));
    out(&f, jdt_graph_causal_mask(g, JDT_DTYPE_F32, 11));
    out(&f, jdt_graph_full(g, JDT_DTYPE_F32, 2, (int64_t[]){2, 3}, 0.75));
    /* a data constant, f64 chains, an i32 condition */
    float cdata[7 * 13];
    for (int i = 0; i < 7 * 13; i++)
        cdata[i] = 0.25f * (float)(i % 9) - 1.0f;
    jdt_tensor *cst = jdt_graph_constant(g, JDT_DTYPE_F32, 2, (int64_t[]){7, 13}, cdata);
    out(&f, jdt_graph_mul(g, x, cst));
    jdt_tensor *xd = jdt_graph_cast(g, x, JDT_DTYPE_F64);
    out(&f, jdt_graph_tanh(g, jdt_graph_exp(g, jdt_graph_mul_scalar(g, xd, 0.5))));
    out(&f, jdt_graph_reduce_sum(g, jdt_graph_gelu(g, xd), 2u, false));
    jdt_tensor *xi = jdt_graph_cast(g, jdt_graph_mul_scalar(g, y, 7.0), JDT_DTYPE_I32);
    out(&f, jdt_graph_cast(g, jdt_graph_select(g, xi, xd, jdt_graph_neg(g, xd)), JDT_DTYPE_F32));
    /* a fused chain using several of the above at once */
    jdt_tensor *ch =
        jdt_graph_mul(g, jdt_graph_tanh(g, jdt_graph_add(g, x, y)), jdt_graph_sigmoid(g, y));
    out(&f, jdt_graph_add_scalar(g, jdt_graph_mul_scalar(g, ch, 2.0), 1.0));
    fx_fill(&f, 1);
    jdt_compile_opts o;
    fx_opts(&f, &o);
    jdt_program *p = fx_check_steps(&f, &o, 1, RT, AT, true);
    const jdt_compile_stats *s = jdt_program_stats(p);
    ck_assert_int_lt(s->n_kernels, s->n_ops_out);
    jdt_program_free(p);
    fx_free(&f);
}
END_TEST

START_TEST(test_shape_and_reduce_ops)
{
    fx f;
    fx_init(&f);
    jdt_graph *g = f.g;
    jdt_tensor *a = FX_INPUT(&f, "a", JDT_DTYPE_F32, -2, 2, 3, 1, 5);
    jdt_tensor *b = FX_INPUT(&f, "b", JDT_DTYPE_F32, -2, 2, 2, 3, 4, 5);
    jdt_tensor *c = FX_INPUT(&f, "c", JDT_DTYPE_F32, -2, 2, 6, 7);
    jdt_tensor *d = FX_INPUT(&f, "d", JDT_DTYPE_F32, -2, 2, 6, 3);
    out(&f, jdt_graph_broadcast(g, a, 4, (int64_t[]){2, 3, 4, 5}));
    out(&f, jdt_graph_add_bcast(g, b, a));
    out(&f, jdt_graph_mul_bcast(g, c, jdt_graph_reduce_max(g, c, 1u << 1, true)));
    out(&f, jdt_graph_transpose(g, b, (int[]){2, 0, 3, 1}));
    out(&f, jdt_graph_transpose(g, c, (int[]){1, 0}));
    out(&f, jdt_graph_exp(g, jdt_graph_transpose(g, c, (int[]){1, 0})));
    out(&f, jdt_graph_slice(g, b, 2, 1, 3));
    out(&f, jdt_graph_slice(g, c, 1, 2, 7));
    out(&f, jdt_graph_concat(g, 2, (jdt_tensor *[]){c, d}, 1));
    out(&f, jdt_graph_concat(g, 3, (jdt_tensor *[]){c, c, c}, 0));
    out(&f, jdt_graph_reshape(g, b, 2, (int64_t[]){6, 20}));
    out(&f, jdt_graph_exp(g, jdt_graph_reshape(g, c, 3, (int64_t[]){2, 3, 7})));
    for (uint32_t mask = 1; mask < 16; mask += 3) {
        out(&f, jdt_graph_reduce_sum(g, b, mask, false));
        out(&f, jdt_graph_reduce_max(g, b, mask, true));
        out(&f, jdt_graph_reduce_mean(g, b, mask, false));
    }
    /* chains fused into row and column reductions */
    out(&f, jdt_graph_reduce_sum(g, jdt_graph_exp(g, jdt_graph_add_scalar(g, c, -1.0)), 2u, false));
    out(&f, jdt_graph_reduce_sum(g, jdt_graph_mul(g, c, c), 1u, false));
    out(&f, jdt_graph_reduce_mean(g, jdt_graph_abs(g, b), 0xfu, false));
    out(&f, jdt_graph_reduce_max(g, jdt_graph_neg(g, b), 1u << 2, false));
    /* big enough (>= 32768 elements) for the parallel loop nests: rows, column tiles of a
     * leading-axis reduction (bias gradients), full reductions and plain chains */
    jdt_tensor *big = FX_INPUT(&f, "big", JDT_DTYPE_F32, -2, 2, 301, 131);
    jdt_tensor *big3 = FX_INPUT(&f, "big3", JDT_DTYPE_F32, -2, 2, 7, 53, 97);
    jdt_tensor *eb = jdt_graph_tanh(g, jdt_graph_mul_scalar(g, big, 0.7));
    out(&f, eb);
    out(&f, jdt_graph_reduce_sum(g, eb, 1u, false));
    out(&f, jdt_graph_reduce_max(g, big, 1u, true));
    out(&f, jdt_graph_reduce_mean(g, big, 2u, false));
    out(&f, jdt_graph_reduce_sum(g, big, 3u, false));
    out(&f, jdt_graph_reduce_sum(g, jdt_graph_exp(g, big3), 3u, false));
    out(&f, jdt_graph_reduce_max(g, big3, 5u, false));
    out(&f, jdt_graph_transpose(g, big3, (int[]){2, 0, 1}));
    fx_fill(&f, 2);
    jdt_compile_opts o;
    fx_opts(&f, &o);
    fx_check_steps(&f, &o, 1, 1e-5, 1e-4, false);
    fx_free(&f);
}
END_TEST

/* Compiles f's graph with 1, 2 and 3 threads into p[0..2], each checked against the
 * interpreter over one step (rtol, atol), and asserts their outputs are the same bits. */
static void check_thread_counts(fx *f, double rtol, double atol, jdt_program *p[3])
{
    for (int t = 0; t < 3; t++) {
        jdt_compile_opts o;
        fx_opts(f, &o);
        o.threads = t + 1;
        p[t] = fx_check_steps(f, &o, 1, rtol, atol, true);
    }
    for (int i = 0; i < jdt_graph_n_outputs(f->g); i++) {
        size_t n = (size_t)jdt_shape_numel(&jdt_graph_output(f->g, i)->shape) * sizeof(float);
        for (int t = 1; t < 3; t++)
            ck_assert_msg(memcmp(jdt_program_output(p[0], i), jdt_program_output(p[t], i), n) == 0,
                          "output %d: %d threads differ from 1", i, t + 1);
    }
}

/* Reductions over a leading dim (bias and norm-affine gradients) sum chunks of its rows in
 * parallel into partials on the stack, then add the partials in chunk order: against the
 * interpreter, the same bits compiled for 1, 2 and 3 threads (the chunks are fixed by the
 * shapes), and the partial form where it fits (PART_STACK_BYTES), column tiles where not. */
START_TEST(test_leading_reductions)
{
    fx f;
    fx_init(&f);
    jdt_graph *g = f.g;
    jdt_tensor *x = FX_INPUT(&f, "x", JDT_DTYPE_F32, -2, 2, 2000, 37);
    jdt_tensor *y = FX_INPUT(&f, "y", JDT_DTYPE_F32, -2, 2, 300, 7, 40);
    jdt_tensor *wide = FX_INPUT(&f, "wide", JDT_DTYPE_F32, -2, 2, 3, 20000);
    out(&f, jdt_graph_reduce_sum(g, jdt_graph_mul(g, x, x), 1u, false)); /* (37): 64 chunks */
    out(&f, jdt_graph_reduce_max(g, x, 1u, false));
    out(&f, jdt_graph_reduce_mean(g, y, 1u, false));   /* (7, 40) */
    out(&f, jdt_graph_reduce_sum(g, y, 3u, false));    /* (40) */
    out(&f, jdt_graph_reduce_sum(g, y, 5u, false));    /* (7): the middle dim kept */
    out(&f, jdt_graph_reduce_sum(g, wide, 1u, false)); /* 20000 outputs: column tiles */
    fx_fill(&f, 5);
    jdt_program *p[3];
    check_thread_counts(&f, 1e-5, 1e-4, p);
    /* the partial form in the kernels of the five that fit, not in the wide one's */
    const char *src = jdt_program_source(p[1]);
    int n_part = 0;
    for (const char *q = strstr(src, "part + ch * "); q; q = strstr(q + 1, "part + ch * "))
        n_part++;
    ck_assert_msg(n_part == 5, "%d kernels with partials in\n%.3000s", n_part, src);
    ck_assert_msg(!strstr(src, "part + ch * 20000LL"), "partials of 20000 outputs");
    for (int t = 0; t < 3; t++)
        jdt_program_free(p[t]);
    fx_free(&f);
}
END_TEST

/* A reduction whose input an elementwise kernel computes (a bias gradient of a bf16 GEMM's
 * operand): the reduction's kernel computes it, stores its bf16 copy for the GEMM and sums it
 * (fuse.c fuse_reduce_producers; the CPU's reductions store their members). Also through a
 * reshape of a transpose (attention's dQ/dK/dV: the sum runs over the (B, T) rows of the
 * (B, T, H, D) value, chunked over the flattened rows). Equal to the interpreter, and the same
 * bits for 1, 2 and 3 threads. */
START_TEST(test_reduce_producers)
{
    fx f;
    fx_init(&f);
    jdt_graph *g = f.g;
    jdt_graph_set_matmul_bf16(g, true);
    jdt_tensor *x = FX_INPUT(&f, "x", JDT_DTYPE_F32, -2, 2, 256, 600);
    jdt_tensor *y = FX_INPUT(&f, "y", JDT_DTYPE_F32, -2, 2, 256, 600);
    jdt_tensor *z = jdt_graph_mul(g, jdt_graph_gelu(g, x), y);
    out(&f, jdt_graph_reduce_sum(g, z, 1u, false));
    out(&f, jdt_graph_matmul(g, z, FX_PARAM(&f, "w", -0.5, 0.5, 600, 16), false, false));
    jdt_tensor *a = FX_INPUT(&f, "a", JDT_DTYPE_F32, -2, 2, 4, 3, 128, 32); /* (B, H, T, D) */
    jdt_tensor *at = jdt_graph_transpose(g, a, (int[]){0, 2, 1, 3});
    out(&f, jdt_graph_reduce_sum(g, jdt_graph_reshape(g, at, 2, (int64_t[]){512, 96}), 1u, false));
    jdt_tensor *at16 = jdt_graph_cast(g, at, JDT_DTYPE_BF16); /* as ops.c vjp_MATMUL casts */
    out(&f, jdt_graph_matmul(g, jdt_graph_reshape(g, at16, 2, (int64_t[]){512, 96}),
                             FX_PARAM(&f, "u", -0.5, 0.5, 96, 40), false, false));
    fx_fill(&f, 11);
    jdt_program *p[3];
    check_thread_counts(&f, 1e-4, 1e-5, p);
    for (int t = 0; t < 3; t++)
        ck_assert_int_eq(jdt_program_stats(p[t])->n_reduce_merged, 2);
    const char *src = jdt_program_source(p[1]);
    ck_assert_msg(strstr(src, "for (int64_t r = ch * "), "no chunks of flattened rows in\n%s",
                  strstr(src, "/* group") ? strstr(src, "/* group") : src);
    for (int t = 0; t < 3; t++)
        jdt_program_free(p[t]);
    fx_free(&f);
}
END_TEST

START_TEST(test_matmul_gather_scatter)
{
    fx f;
    fx_init(&f);
    jdt_graph *g = f.g;
    jdt_tensor *a = FX_INPUT(&f, "a", JDT_DTYPE_F32, -1, 1, 5, 7);
    jdt_tensor *at = FX_INPUT(&f, "at", JDT_DTYPE_F32, -1, 1, 7, 5);
    jdt_tensor *b = FX_INPUT(&f, "b", JDT_DTYPE_F32, -1, 1, 7, 9);
    jdt_tensor *bt = FX_INPUT(&f, "bt", JDT_DTYPE_F32, -1, 1, 9, 7);
    jdt_tensor *ba = FX_INPUT(&f, "ba", JDT_DTYPE_F32, -1, 1, 2, 3, 5, 7);
    jdt_tensor *bb = FX_INPUT(&f, "bb", JDT_DTYPE_F32, -1, 1, 2, 3, 7, 9);
    jdt_tensor *table = FX_INPUT(&f, "table", JDT_DTYPE_F32, -1, 1, 11, 6);
    jdt_tensor *idx = FX_INPUT(&f, "idx", JDT_DTYPE_I32, 0, 11, 3, 5);
    jdt_tensor *src = FX_INPUT(&f, "src", JDT_DTYPE_F32, -1, 1, 3, 5, 6);
    out(&f, jdt_graph_matmul(g, a, b, false, false));
    out(&f, jdt_graph_matmul(g, at, b, true, false));
    out(&f, jdt_graph_matmul(g, a, bt, false, true));
    out(&f, jdt_graph_matmul(g, at, bt, true, true));
    out(&f, jdt_graph_matmul(g, ba, bb, false, false));
    out(&f, jdt_graph_matmul(g, ba, b, false, false));
    out(&f, jdt_graph_matmul(g, ba, bt, false, true));
    out(&f, jdt_graph_gather(g, table, idx));
    out(&f, jdt_graph_scatter_add(g, src, idx, 11));
    fx_fill(&f, 3);
    jdt_compile_opts o;
    fx_opts(&f, &o);
    fx_check_steps(&f, &o, 1, 1e-5, 1e-5, false);
    fx_free(&f);
}
END_TEST

START_TEST(test_row_primitives)
{
    fx f;
    fx_init(&f);
    jdt_graph *g = f.g;
    jdt_tensor *x = FX_INPUT(&f, "x", JDT_DTYPE_F32, -4, 4, 9, 37);
    jdt_tensor *dy = FX_INPUT(&f, "dy", JDT_DTYPE_F32, -1, 1, 9, 37);
    jdt_tensor *tg = FX_INPUT(&f, "tg", JDT_DTYPE_I32, -1, 37, 9);
    jdt_tensor *dl = FX_INPUT(&f, "dl", JDT_DTYPE_F32, 0.5, 1, 9);
    jdt_tensor *r = FX_INPUT(&f, "r", JDT_DTYPE_F32, -1, 1, 2, 5, 3, 8);
    jdt_tensor *sm = jdt_graph_softmax(g, x), *lsm = jdt_graph_log_softmax(g, x);
    out(&f, sm);
    out(&f, jdt_graph_softmax_bwd(g, sm, dy));
    out(&f, lsm);
    out(&f, jdt_graph_log_softmax_bwd(g, lsm, dy));
    jdt_tensor *xe = jdt_graph_softmax_xent(g, x, tg);
    out(&f, xe);
    out(&f, jdt_graph_softmax_xent_bwd(g, x, tg, dl, xe));
    out(&f, jdt_graph_normalize(g, x, 1e-5));
    out(&f, jdt_graph_normalize_bwd(g, x, dy, 1e-5));
    out(&f, jdt_graph_rms_normalize(g, x, 1e-6));
    out(&f, jdt_graph_rms_normalize_bwd(g, x, dy, 1e-6));
    out(&f, jdt_graph_rope(g, r, 10000.0, false));
    out(&f, jdt_graph_rope(g, r, 500.0, true));
    fx_fill(&f, 4);
    jdt_compile_opts o;
    fx_opts(&f, &o);
    fx_check_steps(&f, &o, 1, 1e-4, 1e-5, false);
    fx_free(&f);
}
END_TEST

START_TEST(test_attention)
{
    fx f;
    fx_init(&f);
    jdt_graph *g = f.g;
    /* T = 67 crosses the 64-key block boundary; D = 12 is not a vector width */
    jdt_tensor *q = FX_INPUT(&f, "q", JDT_DTYPE_F32, -2, 2, 2, 3, 67, 12);
    jdt_tensor *k = FX_INPUT(&f, "k", JDT_DTYPE_F32, -2, 2, 2, 3, 67, 12);
    jdt_tensor *v = FX_INPUT(&f, "v", JDT_DTYPE_F32, -1, 1, 2, 3, 67, 12);
    jdt_tensor *d = FX_INPUT(&f, "do", JDT_DTYPE_F32, -1, 1, 2, 3, 67, 12);
    jdt_tensor *o = jdt_graph_attention(g, q, k, v, 0.3);
    out(&f, o);
    out(&f, jdt_graph_attention_bwd(g, q, k, v, o, d, 0.3));
    fx_fill(&f, 5);
    jdt_compile_opts opts;
    fx_opts(&f, &opts);
    /* the backward takes the log-sum-exp the forward stored after o (passes.c
     * fold_attention_lse): o, read as an output, is a view of that packed output */
    jdt_program *p = fx_check_steps(&f, &opts, 1, 2e-4, 2e-5, true);
    ck_assert_int_eq(jdt_program_stats(p)->n_attention_lse, 1);
    jdt_program_free(p);
    opts.no_fuse = true; /* the softmax recomputed from the scores */
    p = fx_check_steps(&f, &opts, 1, 2e-4, 2e-5, true);
    ck_assert_int_eq(jdt_program_stats(p)->n_attention_lse, 0);
    jdt_program_free(p);
    fx_free(&f);
}
END_TEST

/* Attention in bf16 compute (precision.compute: bf16): both nodes carry the flag, the compiled
 * kernels (packed bf16 tiles) match the interpreter's bf16 semantics (the same rounding points)
 * to within a probability's rare neighbouring-bf16 flip (the kernel's f32 exp vs the
 * reference's double exp), and differ from f32 attention by bf16 rounding. */
static void attention_graph(fx *f, bool bf16)
{
    jdt_graph *g = f->g;
    jdt_graph_set_matmul_bf16(g, bf16);
    jdt_tensor *q = FX_INPUT(f, "q", JDT_DTYPE_F32, -2, 2, 2, 3, 67, 12);
    jdt_tensor *k = FX_INPUT(f, "k", JDT_DTYPE_F32, -2, 2, 2, 3, 67, 12);
    jdt_tensor *v = FX_INPUT(f, "v", JDT_DTYPE_F32, -1, 1, 2, 3, 67, 12);
    jdt_tensor *d = FX_INPUT(f, "do", JDT_DTYPE_F32, -1, 1, 2, 3, 67, 12);
    jdt_tensor *o = jdt_graph_attention(g, q, k, v, 0.3);
    out(f, o);
    out(f, jdt_graph_attention_bwd(g, q, k, v, o, d, 0.3));
}

START_TEST(test_attention_bf16)
{
    fx a, b;
    fx_init(&a);
    fx_init(&b);
    attention_graph(&a, false);
    attention_graph(&b, true);
    for (int i = 0; i < jdt_graph_n_outputs(b.g); i++)
        ck_assert_int_eq(jdt_graph_output(b.g, i)->attrs.i[0], 1);
    ck_assert_int_eq(jdt_graph_output(a.g, 0)->attrs.i[0], 0);
    fx_fill(&a, 5);
    fx_fill(&b, 5);
    jdt_compile_opts o;
    fx_opts(&b, &o);
    jdt_program *p = fx_check_steps(&b, &o, 1, 2e-3, 2e-4, true);
    ck_assert_int_eq(jdt_program_stats(p)->n_attention_lse, 1);
    jdt_compile_opts oa;
    fx_opts(&a, &oa);
    jdt_program *pa = fx_check_steps(&a, &oa, 1, 2e-4, 2e-5, true);
    double max_diff = 0;
    for (int i = 0; i < jdt_graph_n_outputs(a.g); i++) {
        const float *x = jdt_program_output(p, i), *y = jdt_program_output(pa, i);
        for (int64_t j = 0; j < jdt_shape_numel(&jdt_graph_output(a.g, i)->shape); j++)
            max_diff = tu_worse(max_diff, fabs(x[j] - y[j]));
    }
    ck_assert_msg(max_diff > 1e-4 && max_diff < 0.1, "bf16 vs f32 attention: max diff %g",
                  max_diff);
    jdt_program_free(p);
    jdt_program_free(pa);
    fx_free(&a);
    fx_free(&b);
}
END_TEST

/* Random chains: elementwise ops on broadcasts of smaller inputs, ending in reductions over
 * random axes; several chains per program. */
START_TEST(test_random_fused_chains)
{
    fx f;
    fx_init(&f);
    jdt_graph *g = f.g;
    uint64_t key = jdt_rng_key(77, "chains");
    jdt_tensor *full = FX_INPUT(&f, "full", JDT_DTYPE_F32, -1, 1, 4, 6, 10);
    jdt_tensor *row = FX_INPUT(&f, "row", JDT_DTYPE_F32, -1, 1, 10);
    jdt_tensor *col = FX_INPUT(&f, "col", JDT_DTYPE_F32, -1, 1, 6, 1);
    jdt_tensor *pos = FX_INPUT(&f, "pos", JDT_DTYPE_F32, 0.5, 2, 4, 6, 10);
    int64_t dims[3] = {4, 6, 10};
    for (int chain = 0; chain < 8; chain++) {
        jdt_tensor *cur = full;
        for (int step = 0; step < 7; step++) {
            jdt_philox_ctr r = jdt_philox(key, (uint64_t)chain, (uint64_t)step);
            jdt_tensor *other = r.v[1] % 3 == 0   ? jdt_graph_broadcast(g, row, 3, dims)
                                : r.v[1] % 3 == 1 ? jdt_graph_broadcast(g, col, 3, dims)
                                                  : pos;
            switch (r.v[0] % 8) {
            case 0:
                cur = jdt_graph_add(g, cur, other);
                break;
            case 1:
                cur = jdt_graph_mul(g, cur, other);
                break;
            case 2:
                cur = jdt_graph_tanh(g, cur);
                break;
            case 3:
                cur = jdt_graph_sub(g, cur, other);
                break;
            case 4:
                cur = jdt_graph_div(g, cur, pos);
                break;
            case 5:
                cur = jdt_graph_gelu(g, cur);
                break;
            case 6:
                cur = jdt_graph_mul_scalar(g, jdt_graph_sigmoid(g, cur), 1.5);
                break;
            default:
                cur = jdt_graph_max(g, cur, other);
                break;
            }
        }
        jdt_philox_ctr r = jdt_philox(key, 99, (uint64_t)chain);
        uint32_t mask = r.v[0] % 8;
        if (chain % 2) out(&f, cur);
        if (mask) out(&f, jdt_graph_reduce_sum(g, cur, mask, r.v[1] % 2));
    }
    fx_fill(&f, 6);
    jdt_compile_opts o;
    fx_opts(&f, &o);
    jdt_program *p = fx_check_steps(&f, &o, 1, 1e-4, 1e-5, true);
    ck_assert_int_lt(jdt_program_stats(p)->n_kernels, jdt_program_stats(p)->n_ops_out / 2);
    jdt_program_free(p);
    /* the same graph without fusion gives the same numbers */
    o.no_fuse = true;
    fx_fill(&f, 6);
    fx_check_steps(&f, &o, 1, 1e-4, 1e-5, false);
    fx_free(&f);
}
END_TEST

/* A two-layer MLP train step with SGD + momentum-like state: forward, autodiff backward and
 * updates in one program, three steps; parameters must track the interpreter. */
START_TEST(test_train_step_updates)
{
    fx f;
    fx_init(&f);
    jdt_graph *g = f.g;
    jdt_tensor *x = FX_INPUT(&f, "x", JDT_DTYPE_F32, -1, 1, 8, 12);
    jdt_tensor *tg = FX_INPUT(&f, "tg", JDT_DTYPE_I32, 0, 5, 8);
    jdt_tensor *w1 = FX_PARAM(&f, "w1", -0.3, 0.3, 12, 16);
    jdt_tensor *b1 = FX_PARAM(&f, "b1", -0.1, 0.1, 16);
    jdt_tensor *w2 = FX_PARAM(&f, "w2", -0.3, 0.3, 16, 5);
    jdt_tensor *m1 = fx_leaf(&f, 2, "m1", JDT_DTYPE_F32, 2, (int64_t[]){12, 16}, 0, 0);
    jdt_tensor *h =
        jdt_graph_gelu(g, jdt_graph_add_bcast(g, jdt_graph_matmul(g, x, w1, false, false), b1));
    jdt_tensor *logits = jdt_graph_matmul(g, h, w2, false, false);
    jdt_tensor *loss = jdt_graph_reduce_mean(g, jdt_graph_softmax_xent(g, logits, tg), 1u, false);
    jdt_tensor *params[3] = {w1, b1, w2}, *grads[3];
    jdt_err e;
    ck_assert_msg(jdt_autodiff_grad(g, loss, 3, params, grads, &e) == JDT_OK, "%s", e.msg);
    out(&f, loss);
    /* w1 with momentum state, the others plain SGD */
    jdt_tensor *m1n = jdt_graph_add(g, jdt_graph_mul_scalar(g, m1, 0.9), grads[0]);
    jdt_graph_add_update(g, m1, m1n);
    jdt_graph_add_update(g, w1, jdt_graph_sub(g, w1, jdt_graph_mul_scalar(g, m1n, 0.1)));
    jdt_graph_add_update(g, b1, jdt_graph_sub(g, b1, jdt_graph_mul_scalar(g, grads[1], 0.1)));
    jdt_graph_add_update(g, w2, jdt_graph_sub(g, w2, jdt_graph_mul_scalar(g, grads[2], 0.1)));
    fx_fill(&f, 7);
    jdt_compile_opts o;
    fx_opts(&f, &o);
    o.profile = true;
    jdt_program *p = fx_check_steps(&f, &o, 3, 1e-4, 1e-5, true);
    ck_assert_int_ge(jdt_program_stats(p)->n_donated, 2);
    char prof[8192];
    jdt_program_profile(p, prof, sizeof prof);
    ck_assert_msg(strstr(prof, "3 runs") && strstr(prof, "matmul") && strstr(prof, "fused:"), "%s",
                  prof);
    /* each kind's bandwidth and FLOP rate from the bytes and FLOPs it does at least: the
     * matmuls move their operands and products, and multiply */
    const char *mm = strstr(prof, "matmul");
    const char *line = mm;
    while (line > prof && line[-1] != '\n')
        line--;
    double pct, ms, gbs, tfs;
    int cnt;
    ck_assert_msg(
        sscanf(line, " %lf%% %lf ms %d x %lf GB/s %lf TFLOP/s", &pct, &ms, &cnt, &gbs, &tfs) == 5,
        "%s", prof);
    ck_assert_msg(gbs > 0 && tfs > 0 && cnt > 0, "%s", prof);
    /* the GEMM table: every matmul step once, under its shape (M x N x K) and transposes */
    const char *gt = strstr(prof, "GEMMs by shape");
    ck_assert_msg(gt, "%s", prof);
    static const char *const shapes[] = {"8 x 16 x 12 nn", "8 x 5 x 16 nn", "8 x 16 x 5 nt",
                                         "16 x 5 x 8 tn", "12 x 16 x 8 tn"};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        ck_assert_msg(strstr(gt, shapes[i]), "no GEMM row '%s' in\n%s", shapes[i], gt);
    int gemms = 0, rows = 0;
    for (const char *l = strchr(gt, '\n'); l && l[1]; l = strchr(l + 1, '\n')) {
        double gp, gms, gtf;
        int gc;
        if (sscanf(l + 1, " %lf%% %lf ms %d x %lf TFLOP/s", &gp, &gms, &gc, &gtf) != 4) break;
        ck_assert_msg(gtf > 0 && gc > 0, "%s", gt);
        gemms += gc;
        rows++;
    }
    ck_assert_msg(rows == 5 && gemms == cnt, "%d rows, %d GEMMs of %d:\n%s", rows, gemms, cnt, gt);
    /* the kernel table: the longest fused kernels, slowest first, each by its group number,
     * member ops and loop domain (the GELU's forward among them: a kernel of its own) */
    const int nk = jdt_program_stats(p)->n_kernels, want = nk < 8 ? nk : 8;
    char head[64];
    snprintf(head, sizeof head, "fused kernels (%d; the %d that take longest", nk, want);
    const char *kt = strstr(prof, head);
    ck_assert_msg(nk > 0 && kt, "no '%s' in\n%s", head, prof);
    int krows = 0, gelu = 0;
    double last_ms = 1e30;
    for (const char *l = strchr(kt, '\n'); l && l[1]; l = strchr(l + 1, '\n')) {
        double kp, kms, kgb;
        int grp;
        if (sscanf(l + 1, " %lf%% %lf ms %lf GB/s group %d:", &kp, &kms, &kgb, &grp) != 4) break;
        ck_assert_msg(kms <= last_ms && grp >= 0, "%s", kt);
        const char *end = strchr(l + 1, '\n'), *ge = strstr(l + 1, ": gelu; ");
        gelu += ge && (!end || ge < end);
        last_ms = kms;
        krows++;
    }
    ck_assert_msg(krows == want && gelu == 1, "%d kernel rows of %d, gelu %d:\n%s", krows, want,
                  gelu, kt);
    /* the reset (the trainer's, after its warm-up step): the runs before it count no more */
    jdt_program_profile_reset(p);
    jdt_program_profile(p, prof, sizeof prof);
    ck_assert_msg(strstr(prof, "no profile"), "%s", prof);
    ck_assert_msg(jdt_program_run(p, &e) == JDT_OK, "%s", e.msg);
    jdt_program_profile(p, prof, sizeof prof);
    ck_assert_msg(strstr(prof, "1 runs") && strstr(prof, "matmul"), "%s", prof);
    jdt_program_free(p);
    /* adaptive threads, probing every 2 runs: the tuner's runs on the other thread count are
     * left out of the profile and counted in its header, the others all in */
    setenv("JDT_THREAD_PROBE_EVERY", "2", 1);
    o.adaptive_threads = true;
    ck_assert_msg(jdt_program_compile(f.g, &o, &p, &e) == JDT_OK, "%s", e.msg);
    unsetenv("JDT_THREAD_PROBE_EVERY");
    enum { RUNS = 16 };
    for (int r = 0; r < RUNS; r++)
        ck_assert_msg(jdt_program_run(p, &e) == JDT_OK, "%s", e.msg);
    jdt_program_profile(p, prof, sizeof prof);
    int kept = 0, trials = 0;
    ck_assert_msg(sscanf(prof, "%d runs (and %d trial run", &kept, &trials) == 2, "%s", prof);
    ck_assert_msg(trials >= 1 && kept >= 1 && kept + trials == RUNS, "%s", prof);
    jdt_program_free(p);
    fx_free(&f);
}
END_TEST

/* The kernel of source src whose body contains needle: [*b, *e) spans from its "static void"
 * line to the next blank line after it. False when there is none after from. */
static bool kernel_with(const char *src, const char *from, const char *needle, const char **b,
                        const char **e)
{
    const char *n = strstr(from, needle);
    if (!n) return false;
    const char *k = n;
    while (k > src && strncmp(k, "static void k", 13) != 0)
        k--;
    const char *end = strstr(n, "\n\n");
    *b = k, *e = end ? end : n + strlen(n);
    return true;
}

/* AdamW as the trainer builds it (engine/train/step.c build_update: a clip scale computed in
 * the step, lr and bias corrections fed per step, moments and parameter updated in place), on a
 * small parameter (serial loop) and a large one (parallel loop): against the interpreter, and
 * the emitted update loops vectorisable. Scalars are loaded once before the loop, not in it
 * (loaded in it, GCC cannot prove the stores leave them alone and vectorised none of the
 * trainer's AdamW loops: "no vectype for stmt"), and a moment read and written in place goes
 * through one pointer (as two, the parallel loop needed 15 run-time overlap tests, over GCC's
 * limit of 10). */
START_TEST(test_adamw_loops_vectorisable)
{
    fx f;
    fx_init(&f);
    jdt_graph *g = f.g;
    /* 0-d inputs, as the trainer's scalar_input */
    jdt_tensor *lr = fx_leaf(&f, 1, "lr", JDT_DTYPE_F32, 0, NULL, 1e-3, 2e-3);
    jdt_tensor *bc1 = fx_leaf(&f, 1, "bc1", JDT_DTYPE_F32, 0, NULL, 1.0, 2.0);
    jdt_tensor *bc2 = fx_leaf(&f, 1, "bc2", JDT_DTYPE_F32, 0, NULL, 1.0, 2.0);
    int64_t shapes[2][2] = {{40, 24}, {256, 160}}; /* 960 and 40960 elements (>= 32768: parallel) */
    jdt_tensor *P[2], *G[2], *M[2], *Vs[2], *sumsq = NULL;
    for (int i = 0; i < 2; i++) {
        char nm[16];
        snprintf(nm, sizeof nm, "p%d", i);
        P[i] = fx_leaf(&f, 0, nm, JDT_DTYPE_F32, 2, shapes[i], -0.5, 0.5);
        snprintf(nm, sizeof nm, "g%d", i);
        G[i] = fx_leaf(&f, 1, nm, JDT_DTYPE_F32, 2, shapes[i], -1.0, 1.0);
        snprintf(nm, sizeof nm, "m%d", i);
        M[i] = fx_leaf(&f, 2, nm, JDT_DTYPE_F32, 2, shapes[i], -0.1, 0.1);
        snprintf(nm, sizeof nm, "v%d", i);
        Vs[i] = fx_leaf(&f, 2, nm, JDT_DTYPE_F32, 2, shapes[i], 0.0, 0.1);
        jdt_tensor *ss = jdt_graph_reduce_sum(g, jdt_graph_mul(g, G[i], G[i]), 3u, false);
        sumsq = sumsq ? jdt_graph_add(g, sumsq, ss) : ss;
    }
    jdt_tensor *norm = jdt_graph_sqrt(g, sumsq);
    jdt_tensor *scale = jdt_graph_min(g, jdt_graph_scalar(g, JDT_DTYPE_F32, 1.0),
                                      jdt_graph_div(g, jdt_graph_scalar(g, JDT_DTYPE_F32, 1.0),
                                                    jdt_graph_add_scalar(g, norm, 1e-6)));
    out(&f, norm);
    for (int i = 0; i < 2; i++) {
        jdt_tensor *gr = jdt_graph_mul_bcast(g, G[i], scale);
        jdt_tensor *mn =
            jdt_graph_add(g, jdt_graph_mul_scalar(g, M[i], 0.9), jdt_graph_mul_scalar(g, gr, 0.1));
        jdt_tensor *vn = jdt_graph_add(g, jdt_graph_mul_scalar(g, Vs[i], 0.95),
                                       jdt_graph_mul_scalar(g, jdt_graph_mul(g, gr, gr), 0.05));
        jdt_tensor *den =
            jdt_graph_add_scalar(g, jdt_graph_sqrt(g, jdt_graph_mul_bcast(g, vn, bc2)), 1e-8);
        jdt_tensor *upd = jdt_graph_div(g, jdt_graph_mul_bcast(g, mn, bc1), den);
        upd = jdt_graph_add(g, upd, jdt_graph_mul_scalar(g, P[i], 0.1));
        jdt_graph_add_update(g, M[i], mn);
        jdt_graph_add_update(g, Vs[i], vn);
        jdt_graph_add_update(g, P[i], jdt_graph_sub(g, P[i], jdt_graph_mul_bcast(g, upd, lr)));
    }
    fx_fill(&f, 11);
    jdt_compile_opts o;
    fx_opts(&f, &o);
    jdt_program *p = fx_check_steps(&f, &o, 3, 1e-5, 1e-7, true);
    const char *src = jdt_program_source(p);
    ck_assert_ptr_nonnull(src);
    int n_loops = 0, n_par = 0;
    const char *b, *e, *from = src;
    while (kernel_with(src, from, "sqrt(", &b, &e)) {
        from = e;
        const char *loop = strstr(b, "    for (");
        ck_assert_msg(loop && loop < e, "no loop in\n%.*s", (int)(e - b), b);
        int n_w = 0; /* the update kernels store m, v and p; the global norm's, one scalar */
        for (const char *w = strstr(b, "float *w"); w && w < loop; w = strstr(w + 1, "float *w"))
            n_w++;
        if (n_w < 3) continue;
        n_loops++;
        const char *pragma = strstr(b, "#pragma omp parallel");
        n_par += pragma && pragma < e;
        /* no load at a fixed offset inside the loop: "= r<k>[<digits>];" */
        for (const char *q = strstr(loop, "= r"); q && q < e; q = strstr(q + 1, "= r")) {
            size_t k = strspn(q + 3, "0123456789"), d = k ? strspn(q + 4 + k, "0123456789") : 0;
            ck_assert_msg(!(k && d && q[3 + k] == '[' && strncmp(q + 4 + k + d, "];", 2) == 0),
                          "a scalar load inside the update loop:\n%.*s", (int)(e - b), b);
        }
        /* every buffer behind one pointer: no read pointer on a slot a write pointer has */
        for (const char *w = strstr(b, "float *w"); w && w < loop; w = strstr(w + 1, "float *w")) {
            const char *slot = strstr(w, "p[");
            char decl[64];
            int len = (int)strcspn(slot, ";");
            snprintf(decl, sizeof decl, "(const float *)%.*s;", len, slot);
            const char *dup = strstr(b, decl);
            ck_assert_msg(!dup || dup > loop, "a read and a write pointer on %.*s:\n%.*s", len,
                          slot, (int)(e - b), b);
        }
    }
    ck_assert_msg(n_loops == 2 && n_par == 1, "%d update kernels, %d parallel, in\n%.3000s",
                  n_loops, n_par, src);
    jdt_program_free(p);
    fx_free(&f);
}
END_TEST

/* One pre-norm transformer block (rmsnorm, qkv projections, rope, causal attention, swiglu-ish
 * MLP, tied vocab head, cross-entropy) differentiated by autodiff and updated with Adam: the
 * whole-step graph the trainer compiles, two steps against the interpreter. */
START_TEST(test_transformer_block_adam)
{
    fx f;
    fx_init(&f);
    jdt_graph *g = f.g;
    enum { B = 2, T = 9, C = 16, H = 2, D = 8, V = 11 };
    jdt_tensor *tok = FX_INPUT(&f, "tok", JDT_DTYPE_I32, 0, V, B, T);
    jdt_tensor *tgt = FX_INPUT(&f, "tgt", JDT_DTYPE_I32, -1, V, B * T);
    jdt_tensor *step = jdt_graph_input(g, "step", JDT_DTYPE_I32, 0, NULL, NULL);
    f.leaf[f.n] = step, f.lo[f.n] = 1, f.hi[f.n] = 2, f.n++;
    jdt_tensor *wte = FX_PARAM(&f, "wte", -0.5, 0.5, V, C);
    jdt_tensor *wq = FX_PARAM(&f, "wq", -0.3, 0.3, C, C);
    jdt_tensor *wk = FX_PARAM(&f, "wk", -0.3, 0.3, C, C);
    jdt_tensor *wv = FX_PARAM(&f, "wv", -0.3, 0.3, C, C);
    jdt_tensor *wo = FX_PARAM(&f, "wo", -0.3, 0.3, C, C);
    jdt_tensor *w1 = FX_PARAM(&f, "w1", -0.3, 0.3, C, 2 * C);
    jdt_tensor *w2 = FX_PARAM(&f, "w2", -0.3, 0.3, 2 * C, C);
    jdt_tensor *ln = FX_PARAM(&f, "ln", 0.8, 1.2, C);
    jdt_tensor *params[] = {wte, wq, wk, wv, wo, w1, w2, ln};
    enum { NP = 8 };
    int64_t btc[3] = {B, T, C}, bthd[4] = {B, T, H, D}, nc[2] = {B * T, C};
    jdt_tensor *x = jdt_graph_gather(g, wte, tok); /* (B, T, C) */
    jdt_tensor *xn = jdt_graph_mul_bcast(g, jdt_graph_rms_normalize(g, x, 1e-5), ln);
    jdt_tensor *x2 = jdt_graph_reshape(g, xn, 2, nc);
    jdt_tensor *qkv[3];
    jdt_tensor *wqkv[3] = {wq, wk, wv};
    for (int i = 0; i < 3; i++) {
        jdt_tensor *p =
            jdt_graph_reshape(g, jdt_graph_matmul(g, x2, wqkv[i], false, false), 4, bthd);
        if (i < 2) p = jdt_graph_rope(g, p, 100.0, false);
        qkv[i] = jdt_graph_transpose(g, p, (int[]){0, 2, 1, 3}); /* (B, H, T, D) */
    }
    jdt_tensor *att = jdt_graph_attention(g, qkv[0], qkv[1], qkv[2], 0.35);
    att = jdt_graph_reshape(g, jdt_graph_transpose(g, att, (int[]){0, 2, 1, 3}), 2, nc);
    jdt_tensor *h = jdt_graph_add(g, jdt_graph_reshape(g, x, 2, nc),
                                  jdt_graph_matmul(g, att, wo, false, false));
    jdt_tensor *m =
        jdt_graph_silu(g, jdt_graph_matmul(g, jdt_graph_normalize(g, h, 1e-5), w1, false, false));
    m = jdt_graph_dropout(g, m, step, 0.1, 42);
    h = jdt_graph_add(g, h, jdt_graph_matmul(g, m, w2, false, false));
    jdt_tensor *logits = jdt_graph_matmul(g, h, wte, false, true); /* (B*T, V) tied head */
    jdt_tensor *loss = jdt_graph_reduce_mean(g, jdt_graph_softmax_xent(g, logits, tgt), 1u, false);
    (void)btc;
    jdt_tensor *grads[NP];
    jdt_err e;
    ck_assert_msg(jdt_autodiff_grad(g, loss, NP, params, grads, &e) == JDT_OK, "%s", e.msg);
    out(&f, loss);
    /* Adam with bias correction folded into the learning rate */
    for (int i = 0; i < NP; i++) {
        char nm[32], nv[32];
        snprintf(nm, sizeof nm, "m%d", i);
        snprintf(nv, sizeof nv, "v%d", i);
        jdt_tensor *mi =
            fx_leaf(&f, 2, nm, JDT_DTYPE_F32, params[i]->shape.ndim, params[i]->shape.dims, 0, 0);
        jdt_tensor *vi =
            fx_leaf(&f, 2, nv, JDT_DTYPE_F32, params[i]->shape.ndim, params[i]->shape.dims, 0, 0);
        jdt_tensor *mn = jdt_graph_add(g, jdt_graph_mul_scalar(g, mi, 0.9),
                                       jdt_graph_mul_scalar(g, grads[i], 0.1));
        jdt_tensor *vn =
            jdt_graph_add(g, jdt_graph_mul_scalar(g, vi, 0.999),
                          jdt_graph_mul_scalar(g, jdt_graph_mul(g, grads[i], grads[i]), 0.001));
        jdt_tensor *upd =
            jdt_graph_div(g, mn, jdt_graph_add_scalar(g, jdt_graph_sqrt(g, vn), 1e-8));
        jdt_graph_add_update(g, mi, mn);
        jdt_graph_add_update(g, vi, vn);
        jdt_graph_add_update(g, params[i],
                             jdt_graph_sub(g, params[i], jdt_graph_mul_scalar(g, upd, 0.01)));
    }
    fx_fill(&f, 9);
    jdt_compile_opts o;
    fx_opts(&f, &o);
    jdt_program *p = fx_check_steps(&f, &o, 2, 2e-3, 1e-4, true);
    const jdt_compile_stats *s = jdt_program_stats(p);
    ck_assert_int_ge(s->n_donated, 2 * NP); /* Adam moments at least */
    ck_assert_int_lt(s->n_kernels, s->n_ops_out / 2);
    jdt_program_free(p);
    fx_free(&f);
}
END_TEST

/* precision.compute: bf16 (a two-layer MLP with a cross-entropy loss): every GEMM, forward and
 * the VJP's, is flagged bf16; the compiled step matches the interpreter's bf16 semantics (inputs
 * rounded at the same points) to f32 accumulation-order tolerance, and its loss and gradients
 * match the f32 interpreter (whose gradients check_autodiff checks by finite differences)
 * within bf16 tolerance, while differing from them (the rounding happened). */
static void bf16_mlp(fx *f, bool bf16)
{
    jdt_graph *g = f->g;
    jdt_graph_set_matmul_bf16(g, bf16);
    jdt_tensor *x = FX_INPUT(f, "x", JDT_DTYPE_F32, -1, 1, 48, 48);
    jdt_tensor *tg = FX_INPUT(f, "tg", JDT_DTYPE_I32, 0, 40, 48);
    jdt_tensor *w1 = FX_PARAM(f, "w1", -0.3, 0.3, 48, 64);
    jdt_tensor *b1 = FX_PARAM(f, "b1", -0.1, 0.1, 64);
    jdt_tensor *w2 = FX_PARAM(f, "w2", -0.3, 0.3, 40, 64);
    jdt_tensor *h =
        jdt_graph_gelu(g, jdt_graph_add_bcast(g, jdt_graph_matmul(g, x, w1, false, false), b1));
    jdt_tensor *logits = jdt_graph_matmul(g, h, w2, false, true);
    jdt_tensor *loss = jdt_graph_reduce_mean(g, jdt_graph_softmax_xent(g, logits, tg), 1u, false);
    jdt_tensor *params[3] = {w1, b1, w2}, *grads[3];
    jdt_err e;
    ck_assert_msg(loss, "builder: %s", jdt_graph_error_msg(g));
    ck_assert_msg(jdt_autodiff_grad(g, loss, 3, params, grads, &e) == JDT_OK, "%s", e.msg);
    out(f, loss);
    for (int i = 0; i < 3; i++)
        out(f, grads[i]);
}

/* The rows of a profile's GEMM table (jdt_program_profile) that contain `what`. */
static int gemm_rows_with(const char *prof, const char *what)
{
    int n = 0;
    const char *t = strstr(prof, "GEMMs by shape");
    const char *l = t ? strchr(t, '\n') : NULL;
    while (l && l[1]) {
        const char *row = l + 1, *m = strstr(row, what);
        l = strchr(row, '\n');
        n += m && (!l || m < l);
    }
    return n;
}

START_TEST(test_bf16_compute)
{
    fx a, b;
    fx_init(&a);
    fx_init(&b);
    bf16_mlp(&a, false);
    bf16_mlp(&b, true);
    int n_mm = 0;
    for (int i = 0; i < jdt_graph_n_nodes(b.g); i++) {
        const jdt_tensor *t = jdt_graph_node(b.g, i);
        if (t->op != JDT_OP_MATMUL) continue;
        n_mm++;
        ck_assert_msg(t->attrs.i[2] == 1, "matmul node %d is not bf16", t->id);
    }
    ck_assert_int_ge(n_mm, 5); /* 2 forward, 3 in the backward */
    fx_fill(&a, 5);
    fx_fill(&b, 5);
    jdt_compile_opts o;
    fx_opts(&b, &o);
    o.profile = true;
    jdt_program *p = fx_check_steps(&b, &o, 1, 1e-4, 1e-6, true);
    jdt_err e;
    jdt_interp *it = NULL;
    ck_assert_int_eq(jdt_interp_new(a.g, &it, &e), JDT_OK);
    fx_bind(&a, false);
    ck_assert_msg(jdt_interp_run(it, &e) == JDT_OK, "interp: %s", e.msg);
    double max_rel = 0;
    for (int i = 0; i < jdt_graph_n_outputs(a.g); i++) {
        jdt_tensor *t = jdt_graph_output(a.g, i);
        const float *got = jdt_program_output(p, i);
        const float *want = jdt_interp_value(it, t);
        double scale = 0;
        for (int64_t j = 0; j < jdt_shape_numel(&t->shape); j++)
            scale = fmax(scale, fabs(want[j]));
        for (int64_t j = 0; j < jdt_shape_numel(&t->shape); j++) {
            double rel = fabs(got[j] - want[j]) / (scale + 1e-30);
            ck_assert_msg(rel < 2e-2, "output %d element %lld: bf16 %.7g vs f32 %.7g", i,
                          (long long)j, got[j], want[j]);
            max_rel = fmax(max_rel, rel);
        }
    }
    ck_assert_msg(max_rel > 1e-5, "bf16 outputs equal the f32 ones (%g): nothing was rounded",
                  max_rel);
    /* bf16 storage: the GELU output and the cross-entropy's dlogits (48 x 40) are stored as
     * bf16; the step equals the one with f32 storage */
    bool dlogits16 = false;
    for (int i = 0; i < jdt_program_n_buffers(p); i++) {
        jdt_buf_info bi;
        ck_assert(jdt_program_buffer(p, i, &bi));
        dlogits16 = dlogits16 || (bi.bf16 && bi.n_bytes == 48 * 40 * 2);
    }
    ck_assert_msg(dlogits16, "dlogits not stored as bf16");
    ck_assert_int_ge(jdt_program_stats(p)->n_bf16_stored, 2);
    jdt_compile_opts o32 = o;
    o32.no_bf16_storage = true; /* (profiled too, as o) */
    jdt_program *p32 = fx_check_steps(&b, &o32, 1, 1e-4, 1e-6, true);
    for (int i = 0; i < jdt_graph_n_outputs(b.g); i++) {
        const jdt_tensor *t = jdt_graph_output(b.g, i);
        const float *x = jdt_program_output(p, i), *y = jdt_program_output(p32, i);
        for (int64_t j = 0; j < jdt_shape_numel(&t->shape); j++)
            ck_assert_msg(fabsf(x[j] - y[j]) <= 1e-6f * (1.0f + fabsf(y[j])),
                          "output %d element %lld: %.9g (bf16 storage) vs %.9g", i, (long long)j,
                          x[j], y[j]);
    }
    /* the profile's GEMM rows say which operands were rounded from f32 storage per call: all
     * of them without bf16 storage, fewer with it (the GELU output is stored as bf16) */
    char prof[4096], prof32[4096];
    jdt_program_profile(p, prof, sizeof prof);
    jdt_program_profile(p32, prof32, sizeof prof32);
    const int rows = gemm_rows_with(prof32, " TFLOP/s ");
    const int both = gemm_rows_with(prof, "(a, b from f32)");
    const int both32 = gemm_rows_with(prof32, "(a, b from f32)");
    ck_assert_msg(rows >= 3 && both32 == rows, "%d of %d rows from f32:\n%s", both32, rows, prof32);
    ck_assert_msg(both < both32, "bf16 storage: %d rows from f32:\n%s", both, prof);
    jdt_program_free(p32);
    jdt_interp_free(it);
    jdt_program_free(p);
    fx_free(&a);
    fx_free(&b);
}
END_TEST

/* A tied embedding's gradient: matmul product + scatter_add of the lookup's rows. The add is
 * folded into the scatter, which adds into the product's buffer in place (the product dies
 * there); a leaf initial value is copied, not modified; both equal the interpreter. */
START_TEST(test_scatter_add_fold)
{
    fx f;
    fx_init(&f);
    jdt_graph *g = f.g;
    jdt_tensor *h = FX_INPUT(&f, "h", JDT_DTYPE_F32, -1, 1, 15, 6);
    jdt_tensor *d = FX_INPUT(&f, "d", JDT_DTYPE_F32, -1, 1, 15, 11);
    jdt_tensor *idx = FX_INPUT(&f, "idx", JDT_DTYPE_I32, 0, 11, 15); /* repeats rows */
    jdt_tensor *src = FX_INPUT(&f, "src", JDT_DTYPE_F32, -1, 1, 15, 6);
    jdt_tensor *lf = FX_INPUT(&f, "leaf", JDT_DTYPE_F32, -1, 1, 11, 6);
    jdt_tensor *dw = jdt_graph_matmul(g, d, h, true, false); /* (11, 6) */
    out(&f,
        jdt_graph_mul_scalar(g, jdt_graph_add(g, dw, jdt_graph_scatter_add(g, src, idx, 11)), 2.0));
    out(&f, jdt_graph_add(g, jdt_graph_scatter_add(g, src, idx, 11), lf));
    fx_fill(&f, 8);
    jdt_compile_opts o;
    fx_opts(&f, &o);
    jdt_program *p = fx_check_steps(&f, &o, 2, 1e-5, 1e-5, true);
    int n_inplace = 0; /* the scatter over the product, the mul over the scatter */
    for (int b = 0; b < jdt_program_n_buffers(p); b++) {
        jdt_buf_info bi;
        ck_assert(jdt_program_buffer(p, b, &bi));
        n_inplace += bi.inplace_of >= 0 && bi.n_bytes == 11 * 6 * 4;
    }
    ck_assert_int_ge(n_inplace, 2);
    jdt_program_free(p);
    fx_free(&f);
}
END_TEST

/* A broadcast read by several groups (a norm weight in the forward and the backward, a scalar
 * over many tensors, a row statistic along the last dim) is read through stride 0 by each
 * (fuse.c broadcast_absorbable) instead of materialised: the same values as the interpreter
 * (also under a transpose and inside a reduction), and no kernel for any of the broadcasts. */
START_TEST(test_broadcast_shared)
{
    fx f;
    fx_init(&f);
    jdt_graph *g = f.g;
    jdt_tensor *x = FX_INPUT(&f, "x", JDT_DTYPE_F32, -1, 1, 6, 8, 12);
    jdt_tensor *w = FX_INPUT(&f, "w", JDT_DTYPE_F32, -1, 1, 12, 12);
    jdt_tensor *gain = FX_INPUT(&f, "gain", JDT_DTYPE_F32, 0.5, 1.5, 12);
    jdt_tensor *sc = FX_INPUT(&f, "sc", JDT_DTYPE_F32, 0.5, 1.5, 1);
    jdt_tensor *row = FX_INPUT(&f, "row", JDT_DTYPE_F32, -1, 1, 6, 8, 1);
    jdt_tensor *gb = jdt_graph_broadcast(g, gain, 3, (int64_t[]){6, 8, 12});
    jdt_tensor *sb = jdt_graph_broadcast(g, sc, 3, (int64_t[]){6, 8, 12});
    jdt_tensor *rb = jdt_graph_broadcast(g, row, 3, (int64_t[]){6, 8, 12});
    /* each broadcast read on both sides of a GEMM (a builtin: the groups cannot merge) */
    jdt_tensor *h = jdt_graph_mul(g, jdt_graph_mul(g, x, gb), jdt_graph_add(g, sb, rb));
    jdt_tensor *y = jdt_graph_matmul(g, h, w, false, false);
    out(&f, jdt_graph_add(g, jdt_graph_mul(g, y, gb), jdt_graph_mul(g, rb, sb)));
    out(&f, jdt_graph_reduce_sum(g, jdt_graph_mul(g, gb, y), 3u, false));
    out(&f, jdt_graph_exp(g, jdt_graph_transpose(g, jdt_graph_mul(g, y, rb), (int[]){2, 0, 1})));
    fx_fill(&f, 11);
    jdt_compile_opts o;
    fx_opts(&f, &o);
    jdt_program *p = fx_check_steps(&f, &o, 1, 1e-5, 1e-6, true);
    /* h's group, the output's (which also stores y * rb: both read y over one domain, fuse.c
     * fuse_ew_siblings), the reduction and the transpose's group (a strided read of a
     * buffer): 4 kernels; a kernel per materialised broadcast would make 7 */
    ck_assert_int_eq(jdt_program_stats(p)->n_kernels, 4);
    ck_assert_int_eq(jdt_program_stats(p)->n_ew_siblings, 1);
    jdt_program_free(p);
    fx_free(&f);
}
END_TEST

/* Elementwise siblings (fuse.c fuse_ew_siblings): the shape of Llama's SwiGLU backward, two
 * kernels over one domain reading dh and g, each read by a GEMM of its own, become one kernel
 * storing both; a third that reads the first GEMM's result (not ready when the merged kernel
 * runs) stays apart, and one over another domain too. The results are the interpreter's. */
START_TEST(test_elementwise_siblings)
{
    fx f;
    fx_init(&f);
    jdt_graph *g = f.g;
    jdt_tensor *dh = FX_INPUT(&f, "dh", JDT_DTYPE_F32, -1, 1, 16, 24);
    jdt_tensor *gt = FX_INPUT(&f, "g", JDT_DTYPE_F32, -1, 1, 16, 24);
    jdt_tensor *up = FX_INPUT(&f, "u", JDT_DTYPE_F32, -1, 1, 16, 24);
    jdt_tensor *w1 = FX_INPUT(&f, "w1", JDT_DTYPE_F32, -1, 1, 24, 8);
    jdt_tensor *w2 = FX_INPUT(&f, "w2", JDT_DTYPE_F32, -1, 1, 24, 8);
    jdt_tensor *du = jdt_graph_mul(g, dh, jdt_graph_sigmoid(g, gt));
    jdt_tensor *dg = jdt_graph_mul(g, jdt_graph_mul(g, dh, up), jdt_graph_tanh(g, gt));
    jdt_tensor *y1 = jdt_graph_matmul(g, du, w1, false, false);
    out(&f, y1);
    out(&f, jdt_graph_matmul(g, dg, w2, false, false));
    /* reads dh and y1 (16, 8): another domain; and one over dh's domain reading y1's product */
    jdt_tensor *back = jdt_graph_matmul(g, y1, w1, false, true);
    out(&f, jdt_graph_matmul(g, jdt_graph_mul(g, dh, back), w2, false, false));
    out(&f, jdt_graph_exp(g, y1));
    fx_fill(&f, 17);
    jdt_compile_opts o;
    fx_opts(&f, &o);
    jdt_program *p = fx_check_steps(&f, &o, 1, 1e-5, 1e-6, true);
    /* du and dg: one kernel; dh * back: its own (back is not ready); exp(y1): its own */
    ck_assert_int_eq(jdt_program_stats(p)->n_ew_siblings, 1);
    ck_assert_int_eq(jdt_program_stats(p)->n_kernels, 3);
    jdt_program_free(p);
    fx_free(&f);

    /* with bf16 GEMMs: the merged kernel stores both siblings as bf16 (each read only by a
     * bf16 GEMM): the later one, stored from the earlier one's kernel, too */
    fx_init(&f);
    g = f.g;
    jdt_graph_set_matmul_bf16(g, true);
    dh = FX_INPUT(&f, "dh", JDT_DTYPE_F32, -1, 1, 16, 24);
    gt = FX_INPUT(&f, "g", JDT_DTYPE_F32, -1, 1, 16, 24);
    w1 = FX_INPUT(&f, "w1", JDT_DTYPE_F32, -1, 1, 24, 8);
    w2 = FX_INPUT(&f, "w2", JDT_DTYPE_F32, -1, 1, 24, 8);
    out(&f, jdt_graph_matmul(g, jdt_graph_mul(g, dh, jdt_graph_sigmoid(g, gt)), w1, false, false));
    out(&f, jdt_graph_matmul(g, jdt_graph_mul(g, dh, jdt_graph_tanh(g, gt)), w2, false, false));
    fx_fill(&f, 18);
    fx_opts(&f, &o);
    p = fx_check_steps(&f, &o, 1, 1e-2, 5e-3, true);
    ck_assert_int_eq(jdt_program_stats(p)->n_ew_siblings, 1);
    ck_assert_int_eq(jdt_program_stats(p)->n_kernels, 1);
    ck_assert_int_eq(jdt_program_stats(p)->n_bf16_stored, 2);
    jdt_program_free(p);
    fx_free(&f);
}
END_TEST

/* opts.share_arena: a program runs in a larger program's arena (no allocation of its own),
 * both stay right when they run alternately; a lender too small is not used. */
START_TEST(test_shared_arena)
{
    fx a, b;
    fx_init(&a);
    fx_init(&b);
    bf16_mlp(&a, false);
    jdt_tensor *x = FX_INPUT(&b, "x", JDT_DTYPE_F32, -1, 1, 8, 16);
    out(&b, jdt_graph_add(b.g, jdt_graph_exp(b.g, jdt_graph_tanh(b.g, x)),
                          jdt_graph_transpose(b.g, jdt_graph_transpose(b.g, x, (int[]){1, 0}),
                                              (int[]){1, 0})));
    fx_fill(&a, 3);
    fx_fill(&b, 4);
    jdt_compile_opts o;
    fx_opts(&a, &o);
    jdt_program *pa = fx_check_steps(&a, &o, 1, 1e-4, 1e-6, true);
    ck_assert(!jdt_program_arena_shared(pa));
    const jdt_compile_stats *sa = jdt_program_stats(pa);
    /* the lender's outputs, to compare after the borrower has run in its arena */
    float *before[4];
    int n_out = jdt_graph_n_outputs(a.g);
    ck_assert_int_le(n_out, 4);
    for (int i = 0; i < n_out; i++) {
        size_t nb = (size_t)jdt_shape_numel(&jdt_graph_output(a.g, i)->shape) * sizeof(float);
        before[i] = malloc(nb);
        memcpy(before[i], jdt_program_output(pa, i), nb);
    }
    jdt_compile_opts ob;
    fx_opts(&b, &ob);
    ob.share_arena = pa;
    jdt_program *pb = fx_check_steps(&b, &ob, 2, 1e-5, 1e-6, true);
    ck_assert_msg(jdt_program_arena_shared(pb), "arena %lld <= lender's %lld but not shared",
                  (long long)jdt_program_stats(pb)->arena_bytes, (long long)sa->arena_bytes);
    ck_assert(jdt_program_stats(pb)->arena_shared);
    ck_assert_int_gt(jdt_program_stats(pb)->arena_bytes, 0);
    jdt_err e;
    fx_bind(&a, true);
    ck_assert_msg(jdt_program_run(pa, &e) == JDT_OK, "%s", e.msg);
    for (int i = 0; i < n_out; i++) {
        const jdt_tensor *t = jdt_graph_output(a.g, i);
        ck_assert_msg(memcmp(before[i], jdt_program_output(pa, i),
                             (size_t)jdt_shape_numel(&t->shape) * sizeof(float)) == 0,
                      "output %d changed after the borrower ran", i);
        free(before[i]);
    }
    /* a lender smaller than the plan: an arena of its own */
    jdt_program *pa2 = NULL;
    o.share_arena = pb;
    ck_assert_msg(jdt_program_compile(a.g, &o, &pa2, &e) == JDT_OK, "%s", e.msg);
    ck_assert(!jdt_program_arena_shared(pa2));
    jdt_program_free(pa2);
    jdt_program_free(pb); /* the borrower first */
    jdt_program_free(pa);
    fx_free(&a);
    fx_free(&b);
}
END_TEST

/* bf16 storage: every kind of fused producer (elementwise unary/binary, broadcast add, a
 * materialised transpose, slice and broadcast, a reshape view, the affine part of a norm) of a
 * value read only by bf16 GEMMs — as a, transposed a, b and transposed b — stores it as bf16
 * (2-byte buffer, rounded on store); the products equal the ones computed from f32 storage
 * (the GEMM rounds its inputs either way), match the interpreter's bf16 semantics, and the
 * f32 interpreter's products within bf16 tolerance. */
enum { BS_M = 32, BS_N = 40, BS_CASES = 14 };
/* the producers' width: the generated loops store bf16 in tiles of 256 values where the
 * innermost loop has at least 512 (emit.c BF16_TILE), so 48 tiles only the flat producers
 * (1536 values: 6 whole tiles), 522 every producer, with a partial last tile */
static int64_t bs_k;

static jdt_tensor *bf16_producer(fx *f, int k)
{
    jdt_graph *g = f->g;
    jdt_tensor *x = FX_INPUT(f, "x", JDT_DTYPE_F32, -2, 2, BS_M, bs_k);
    switch (k) {
    case 0:
        return jdt_graph_gelu(g, x);
    case 1:
        return jdt_graph_tanh(g, x);
    case 2:
        return jdt_graph_exp(g, jdt_graph_mul_scalar(g, x, 0.5));
    case 3:
        return jdt_graph_add(g, x, FX_INPUT(f, "x2", JDT_DTYPE_F32, -2, 2, BS_M, bs_k));
    case 4:
        return jdt_graph_mul(g, x, FX_INPUT(f, "x2", JDT_DTYPE_F32, -2, 2, BS_M, bs_k));
    case 5:
        return jdt_graph_add_bcast(g, x, FX_PARAM(f, "bias", -1, 1, bs_k));
    case 6:
        return jdt_graph_transpose(g, FX_INPUT(f, "z", JDT_DTYPE_F32, -2, 2, bs_k, BS_M),
                                   (int[]){1, 0});
    case 7:
        return jdt_graph_slice(g, FX_INPUT(f, "wide", JDT_DTYPE_F32, -2, 2, BS_M, 2 * bs_k), 1,
                               bs_k / 2, bs_k / 2 + bs_k);
    case 8:
        return jdt_graph_add(
            g, x,
            jdt_graph_broadcast(g, FX_PARAM(f, "row", -1, 1, bs_k), 2, (int64_t[]){BS_M, bs_k}));
    case 9:
        return jdt_graph_reshape(
            g, jdt_graph_silu(g, FX_INPUT(f, "flat", JDT_DTYPE_F32, -2, 2, BS_M * bs_k)), 2,
            (int64_t[]){BS_M, bs_k});
    case 10:
        return jdt_graph_add_bcast(g,
                                   jdt_graph_mul_bcast(g, jdt_graph_normalize(g, x, 1e-5),
                                                       FX_PARAM(f, "nw", 0.5, 1.5, bs_k)),
                                   FX_PARAM(f, "nb", -0.5, 0.5, bs_k));
    case 11:
        return jdt_graph_relu(g, jdt_graph_sub(g, x, jdt_graph_mul_scalar(g, x, 0.25)));
    case 12:
        return jdt_graph_div(g, x, jdt_graph_add_scalar(g, jdt_graph_abs(g, x), 1.0));
    default:
        return jdt_graph_sigmoid(g, jdt_graph_neg(g, x));
    }
}

static void bf16_storage_graph(fx *f, int k, bool bf16)
{
    jdt_graph *g = f->g;
    jdt_graph_set_matmul_bf16(g, bf16);
    jdt_tensor *y = bf16_producer(f, k); /* (M, K) */
    ck_assert_msg(y, "case %d: %s", k, jdt_graph_error_msg(g));
    jdt_tensor *w = FX_PARAM(f, "w", -0.5, 0.5, bs_k, BS_N);
    jdt_tensor *u = FX_PARAM(f, "u", -0.5, 0.5, BS_M, 16);
    jdt_tensor *q = FX_PARAM(f, "q", -0.5, 0.5, 16, BS_M);
    jdt_tensor *q2 = FX_PARAM(f, "q2", -0.5, 0.5, 16, bs_k);
    out(f, jdt_graph_matmul(g, y, w, false, false)); /* y as a */
    out(f, jdt_graph_matmul(g, y, u, true, false));  /* y as transposed a: (K, 16) */
    out(f, jdt_graph_matmul(g, q, y, false, false)); /* y as b: (16, K) */
    out(f, jdt_graph_matmul(g, q2, y, false, true)); /* y as transposed b: (16, M) */
}

static void bf16_storage_width(void)
{
    for (int k = 0; k < BS_CASES; k++) {
        fx f, r;
        fx_init(&f);
        fx_init(&r);
        bf16_storage_graph(&f, k, true);
        bf16_storage_graph(&r, k, false); /* the f32 reference: same leaves, same values */
        fx_fill(&f, 100 + (uint64_t)k);
        fx_fill(&r, 100 + (uint64_t)k);
        jdt_compile_opts o, o32;
        fx_opts(&f, &o);
        fx_opts(&f, &o32);
        o32.no_bf16_storage = true;
        /* against the interpreter: bf16 tolerance (a 1-ulp f32 difference in a producer,
         * e.g. gelu's approximation, can flip one operand's bf16 rounding) */
        jdt_program *p = fx_check_steps(&f, &o, 1, 1e-2, 5e-3, true);
        jdt_program *p32 = fx_check_steps(&f, &o32, 1, 1e-2, 5e-3, true);
        const jdt_compile_stats *s = jdt_program_stats(p);
        ck_assert_msg(s->n_bf16_stored >= 1, "case %d, width %lld: nothing stored as bf16", k,
                      (long long)bs_k);
        ck_assert_int_eq(jdt_program_stats(p32)->n_bf16_stored, 0);
        int n_half = 0;
        for (int b = 0; b < jdt_program_n_buffers(p); b++) {
            jdt_buf_info bi;
            ck_assert(jdt_program_buffer(p, b, &bi));
            if (bi.bf16) {
                ck_assert_int_eq(bi.n_bytes, 2 * BS_M * bs_k);
                n_half++;
            }
        }
        ck_assert_msg(n_half >= 1, "case %d: no 2-byte buffer in the plan", k);
        ck_assert_msg(s->arena_bytes < jdt_program_stats(p32)->arena_bytes || !jdt_rt_bf16_native(),
                      "case %d: arena %lld with bf16 storage, %lld without", k,
                      (long long)s->arena_bytes, (long long)jdt_program_stats(p32)->arena_bytes);
        ck_assert_msg(strstr(jdt_program_source(p), "jdt_bf16_st("), "case %d: no bf16 store", k);
        ck_assert_msg(bs_k < 512 || strstr(jdt_program_source(p), "t += 256"),
                      "case %d, width %lld: the bf16 stores are not tiled", k, (long long)bs_k);
        /* the f32 interpreter: within bf16 tolerance, and not equal (the rounding happened) */
        jdt_interp *it = NULL;
        jdt_err e;
        ck_assert_int_eq(jdt_interp_new(r.g, &it, &e), JDT_OK);
        fx_bind(&r, false);
        ck_assert_msg(jdt_interp_run(it, &e) == JDT_OK, "interp: %s", e.msg);
        double max_rel = 0;
        for (int i = 0; i < jdt_graph_n_outputs(r.g); i++) {
            const jdt_tensor *t = jdt_graph_output(r.g, i);
            const float *got = jdt_program_output(p, i), *want = jdt_interp_value(it, t);
            double scale = 0;
            for (int64_t j = 0; j < jdt_shape_numel(&t->shape); j++)
                scale = fmax(scale, fabs(want[j]));
            for (int64_t j = 0; j < jdt_shape_numel(&t->shape); j++) {
                double rel = fabs(got[j] - want[j]) / (scale + 1e-30);
                ck_assert_msg(rel < 2e-2, "case %d output %d element %lld: bf16 %.7g vs f32 %.7g",
                              k, i, (long long)j, got[j], want[j]);
                max_rel = fmax(max_rel, rel);
            }
        }
        ck_assert_msg(max_rel > 1e-6, "case %d: equal to f32 (%g): nothing was rounded", k,
                      max_rel);
        jdt_interp_free(it);
        /* same products as from f32 storage: the GEMM sees the same bf16 operands */
        for (int i = 0; i < jdt_graph_n_outputs(f.g); i++) {
            const jdt_tensor *t = jdt_graph_output(f.g, i);
            const float *a = jdt_program_output(p, i), *b = jdt_program_output(p32, i);
            for (int64_t j = 0; j < jdt_shape_numel(&t->shape); j++)
                ck_assert_msg(fabsf(a[j] - b[j]) <= 1e-6f * (1.0f + fabsf(b[j])),
                              "case %d output %d element %lld: %.9g (bf16 storage) vs %.9g", k, i,
                              (long long)j, a[j], b[j]);
        }
        jdt_program_free(p);
        jdt_program_free(p32);
        fx_free(&f);
        fx_free(&r);
    }
}

static void bf16_storage_cases(void)
{
    bs_k = 48;
    bf16_storage_width();
    bs_k = 522;
    bf16_storage_width();
}

START_TEST(test_bf16_storage)
{
    bf16_storage_cases();
}
END_TEST

/* the same on the portable path (SGEMM on widened operands): a fork of its own, so the path
 * choice (made once per process) sees the variable */
START_TEST(test_bf16_storage_portable)
{
    setenv("JDT_BF16_NO_DNNL", "1", 1);
    ck_assert(!jdt_rt_bf16_native());
    bf16_storage_cases();
}
END_TEST

/* bf16 IR nodes (CAST to bf16, elementwise and shape ops on bf16, bf16 leaves, a bf16 state
 * update, bf16 outputs, MATMUL on bf16 operands) compiled against the interpreter. kind 0: ops
 * whose f32 math is correctly rounded (+ - * / sqrt, selects, maps), so the compiled values
 * equal the reference bit for bit; kind 1: exp/tanh/gelu/silu/sigmoid/log, whose compiled f32
 * approximations may land on the other side of a bf16 rounding boundary (one bf16 ulp);
 * kind 2: GEMMs on bf16 operands (f32 summation order). Each runs fused (bf16 members rounded
 * in registers) and with no_fuse (every node stored, rounded on store). */
static void bf16_node_graph(fx *f, int kind)
{
    const jdt_dtype BF = JDT_DTYPE_BF16;
    jdt_graph *g = f->g;
    jdt_tensor *x = FX_INPUT(f, "x", JDT_DTYPE_F32, -2, 2, 9, 33);
    jdt_tensor *y = FX_INPUT(f, "y", JDT_DTYPE_F32, -2, 2, 9, 33);
    jdt_tensor *z = FX_INPUT(f, "z", BF, -2, 2, 9, 33);
    jdt_tensor *xb = jdt_graph_cast(g, x, BF), *yb = jdt_graph_cast(g, y, BF);
    jdt_tensor *pos = jdt_graph_add_scalar(g, jdt_graph_abs(g, yb), 0.5);
    if (kind == 0) {
        jdt_tensor *sum = jdt_graph_add(g, xb, yb);
        out(f, sum);                                                         /* a bf16 output */
        out(f, jdt_graph_cast(g, jdt_graph_mul(g, sum, xb), JDT_DTYPE_F32)); /* rounded twice */
        out(f, jdt_graph_sub(g, xb, z));
        out(f, jdt_graph_div(g, xb, pos));
        out(f, jdt_graph_sqrt(g, pos));
        out(f, jdt_graph_mul_scalar(g, jdt_graph_neg(g, jdt_graph_relu(g, xb)), 0.3));
        out(f, jdt_graph_select(g, jdt_graph_gt(g, xb, yb), jdt_graph_max(g, xb, z),
                                jdt_graph_min(g, yb, z)));
        out(f, jdt_graph_cast(g, jdt_graph_transpose(g, jdt_graph_mul(g, xb, yb), (int[]){1, 0}),
                              JDT_DTYPE_F64));
        out(f, jdt_graph_slice(g, jdt_graph_add(g, z, xb), 1, 3, 20));
        out(f, jdt_graph_broadcast(g, jdt_graph_reshape(g, pos, 3, (int64_t[]){1, 9, 33}), 3,
                                   (int64_t[]){2, 9, 33}));
        /* a reduction over bf16 values rounded inside the reduction's loop */
        out(f,
            jdt_graph_reduce_sum(
                g, jdt_graph_cast(g, jdt_graph_mul(g, jdt_graph_add(g, xb, z), yb), JDT_DTYPE_F32),
                2u, false));
        /* promotion: f32 * bf16 is an f32 product of the rounded value */
        out(f, jdt_graph_mul(g, x, xb));
        /* a bf16 state leaf updated by a bf16 value (the step's rounding) */
        jdt_tensor *acc = fx_leaf(f, 2, "acc", BF, 2, (int64_t[]){9, 33}, -1, 1);
        jdt_graph_add_update(g, acc, jdt_graph_add(g, acc, jdt_graph_mul_scalar(g, xb, 0.01)));
    } else if (kind == 1) {
        out(f, jdt_graph_exp(g, xb));
        out(f, jdt_graph_tanh(g, z));
        out(f, jdt_graph_cast(g, jdt_graph_gelu(g, jdt_graph_add(g, xb, z)), JDT_DTYPE_F32));
        out(f, jdt_graph_silu(g, xb));
        out(f, jdt_graph_sigmoid(g, yb));
        out(f, jdt_graph_log(g, pos));
    } else {
        jdt_tensor *w = FX_INPUT(f, "w", JDT_DTYPE_F32, -1, 1, 33, 17);
        jdt_tensor *wb = jdt_graph_cast(g, w, BF);
        out(f, jdt_graph_matmul(g, xb, wb, false, false));
        out(f, jdt_graph_matmul(g, jdt_graph_add(g, xb, z), w, false, false)); /* mixed */
        out(f, jdt_graph_matmul(g, wb, jdt_graph_mul(g, yb, z), true, true));
        out(f, jdt_graph_matmul(g, xb, z, true, false));
    }
}

START_TEST(test_bf16_nodes)
{
    const double rtol[3] = {0, 8e-3, 2e-6}, atol[3] = {0, 1e-6, 1e-6};
    for (int kind = 0; kind < 3; kind++)
        for (int no_fuse = 0; no_fuse < 2; no_fuse++) {
            fx f;
            fx_init(&f);
            bf16_node_graph(&f, kind);
            fx_fill(&f, 21 + (uint64_t)kind);
            jdt_compile_opts o;
            fx_opts(&f, &o);
            o.no_fuse = no_fuse;
            jdt_program *p = fx_check_steps(&f, &o, 2, rtol[kind], atol[kind], true);
            /* bf16 values are stored in 2 bytes: the bf16 leaves, and the stored nodes */
            int n16 = 0;
            for (int i = 0; i < jdt_program_n_buffers(p); i++) {
                jdt_buf_info bi;
                ck_assert(jdt_program_buffer(p, i, &bi));
                if (bi.bf16 && bi.kind == JDT_BUF_ARENA) {
                    ck_assert_int_eq(bi.n_bytes % 2, 0);
                    n16++;
                }
            }
            ck_assert_msg(n16 >= (kind == 2 ? 2 : 1), "kind %d: %d bf16 arena buffers", kind, n16);
            if (kind == 0) { /* the bf16 output's bytes are the reference's bits */
                const uint16_t *b16 = jdt_program_output(p, 0);
                jdt_interp *it = NULL;
                jdt_err e;
                ck_assert_int_eq(jdt_interp_new(f.g, &it, &e), JDT_OK);
                fx_bind(&f, false);
                ck_assert_int_eq(jdt_interp_run(it, &e), JDT_OK);
                const uint16_t *r16 = jdt_interp_value(it, jdt_graph_output(f.g, 0));
                ck_assert_int_eq(memcmp(b16, r16, 9 * 33 * 2), 0);
                jdt_interp_free(it);
            }
            jdt_program_free(p);
            fx_free(&f);
        }
}
END_TEST

/* Casts to the same dtype fold away, f32 -> bf16 -> f32 does not (it rounds); the compiled
 * program's graph of a bf16 round trip keeps one rounding. */
START_TEST(test_bf16_cast_passes)
{
    fx f;
    fx_init(&f);
    jdt_graph *g = f.g;
    jdt_tensor *x = FX_INPUT(&f, "x", JDT_DTYPE_F32, -2, 2, 5, 7);
    jdt_tensor *xb = jdt_graph_cast(g, x, JDT_DTYPE_BF16);
    jdt_tensor *same = jdt_graph_cast(g, xb, JDT_DTYPE_BF16);
    out(&f, jdt_graph_cast(g, same, JDT_DTYPE_F32));
    out(&f, jdt_graph_cast(g, jdt_graph_cast(g, x, JDT_DTYPE_BF16), JDT_DTYPE_F32)); /* CSE */
    fx_fill(&f, 3);
    jdt_compile_opts o;
    fx_opts(&f, &o);
    jdt_program *p = fx_check_steps(&f, &o, 1, 0, 0, true);
    /* x -> bf16 -> f32, once (CSE), the bf16 -> bf16 cast gone: 3 ops of 5 built after x */
    ck_assert_int_eq(jdt_program_stats(p)->n_ops_out, 3);
    const float *a = jdt_program_output(p, 0);
    bool rounded = false;
    for (int i = 0; i < 35; i++)
        rounded = rounded || a[i] != ((const float *)f.jit[0])[i];
    ck_assert_msg(rounded, "the round trip changed nothing: the cast was folded");
    jdt_program_free(p);
    fx_free(&f);
}
END_TEST

/* IEEE special values through every elementwise op and a few reductions: the generated code
 * (no fast-math, own exp/tanh) must give the interpreter's NaN, +-Inf and signed zeros. */
START_TEST(test_special_values)
{
    fx f;
    fx_init(&f);
    jdt_graph *g = f.g;
    jdt_tensor *x = FX_INPUT(&f, "x", JDT_DTYPE_F32, 0, 1, 12, 12);
    jdt_tensor *y = FX_INPUT(&f, "y", JDT_DTYPE_F32, 0, 1, 12, 12);
    jdt_tensor *(*un[])(jdt_graph *, jdt_tensor *) = {
        jdt_graph_neg,  jdt_graph_exp,     jdt_graph_log,  jdt_graph_tanh,
        jdt_graph_sqrt, jdt_graph_rsqrt,   jdt_graph_relu, jdt_graph_gelu,
        jdt_graph_silu, jdt_graph_sigmoid, jdt_graph_abs};
    jdt_tensor *(*bin[])(jdt_graph *, jdt_tensor *, jdt_tensor *) = {
        jdt_graph_add, jdt_graph_sub, jdt_graph_mul, jdt_graph_div,
        jdt_graph_max, jdt_graph_min, jdt_graph_gt,  jdt_graph_ge};
    for (size_t i = 0; i < sizeof un / sizeof un[0]; i++)
        out(&f, un[i](g, x));
    for (size_t i = 0; i < sizeof bin / sizeof bin[0]; i++)
        out(&f, bin[i](g, x, y));
    out(&f, jdt_graph_pow_scalar(g, x, 0.5));
    out(&f, jdt_graph_pow_scalar(g, x, 2.0));
    out(&f, jdt_graph_pow_scalar(g, x, -1.0));
    out(&f, jdt_graph_cast(g, x, JDT_DTYPE_I32));
    out(&f, jdt_graph_reduce_sum(g, x, 2u, false));
    out(&f, jdt_graph_reduce_max(g, y, 1u, false));
    /* masked rows (-inf above the diagonal) through the row kernels */
    jdt_tensor *z = FX_INPUT(&f, "z", JDT_DTYPE_F32, -3, 3, 12, 12);
    out(&f, jdt_graph_softmax(g, z));
    out(&f, jdt_graph_log_softmax(g, z));
    out(&f, jdt_graph_reduce_max(g, z, 2u, false));
    out(&f, jdt_graph_exp(g, z));
    fx_fill(&f, 10);
    for (int i = 0; i < 12; i++)
        for (int j = i + 1; j < 12; j++)
            ((float *)f.ref[2])[i * 12 + j] = ((float *)f.jit[2])[i * 12 + j] = -INFINITY;
    const float sv[12] = {NAN,    INFINITY, -INFINITY, 0.0f,   -0.0f, 1e-30f,
                          100.0f, -100.0f,  1e30f,     -1e30f, 88.9f, -104.5f};
    for (int i = 0; i < 144; i++) {
        ((float *)f.ref[0])[i] = ((float *)f.jit[0])[i] = sv[i % 12];
        ((float *)f.ref[1])[i] = ((float *)f.jit[1])[i] = sv[i / 12];
    }
    jdt_compile_opts o;
    fx_opts(&f, &o);
    fx_check_steps(&f, &o, 1, 1e-5, 1e-30, false);
    fx_free(&f);
}
END_TEST

START_TEST(test_run_errors)
{
    fx f;
    fx_init(&f);
    jdt_graph *g = f.g;
    jdt_tensor *table = FX_INPUT(&f, "table", JDT_DTYPE_F32, -1, 1, 4, 3);
    jdt_tensor *idx = FX_INPUT(&f, "idx", JDT_DTYPE_I32, 0, 9, 6);
    jdt_tensor *unbound = jdt_graph_input(g, "unbound", JDT_DTYPE_F32, 1, (int64_t[]){3}, NULL);
    out(&f, jdt_graph_gather(g, table, idx));
    out(&f, jdt_graph_exp(g, unbound));
    fx_fill(&f, 8);
    fx_bind(&f, true);
    jdt_compile_opts o;
    fx_opts(&f, &o);
    jdt_program *p = NULL;
    jdt_err e;
    ck_assert_int_eq(jdt_program_compile(g, &o, &p, &e), JDT_OK);
    ck_assert_int_eq(jdt_program_run(p, &e), JDT_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "unbound"), "%s", e.msg);
    float ub[3] = {0, 1, 2};
    unbound->data = ub;
    ((int32_t *)f.jit[1])[0] = 0;
    ((int32_t *)f.jit[1])[2] = 9; /* outside [0, 4) */
    ck_assert_int_eq(jdt_program_run(p, &e), JDT_ERR_INVALID);
    ck_assert_msg(strstr(e.msg, "gather"), "%s", e.msg);
    jdt_program_free(p);
    /* a u16 softmax has no CPU kernel: one clear error */
    jdt_graph *g2 = jdt_graph_new();
    jdt_tensor *ux = jdt_graph_input(g2, "ux", JDT_DTYPE_U16, 1, (int64_t[]){4}, NULL);
    jdt_graph_add_output(
        g2, ux ? jdt_graph_new_node(g2, JDT_OP_SOFTMAX, JDT_DTYPE_U16, &ux->shape, 1, &ux, NULL)
               : NULL);
    ck_assert_int_eq(jdt_program_compile(g2, &o, &p, &e), JDT_ERR_UNSUPPORTED);
    ck_assert_ptr_null(p);
    ck_assert_msg(strstr(e.msg, "u16"), "%s", e.msg);
    jdt_graph_free(g2);
    fx_free(&f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("jit");
    TCase *tc = tcase_create("jit");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_elementwise_ops);
    tcase_add_test(tc, test_shape_and_reduce_ops);
    tcase_add_test(tc, test_leading_reductions);
    tcase_add_test(tc, test_reduce_producers);
    tcase_add_test(tc, test_matmul_gather_scatter);
    tcase_add_test(tc, test_row_primitives);
    tcase_add_test(tc, test_attention);
    tcase_add_test(tc, test_attention_bf16);
    tcase_add_test(tc, test_random_fused_chains);
    tcase_add_test(tc, test_train_step_updates);
    tcase_add_test(tc, test_transformer_block_adam);
    tcase_add_test(tc, test_adamw_loops_vectorisable);
    tcase_add_test(tc, test_bf16_compute);
    tcase_add_test(tc, test_scatter_add_fold);
    tcase_add_test(tc, test_broadcast_shared);
    tcase_add_test(tc, test_elementwise_siblings);
    tcase_add_test(tc, test_shared_arena);
    tcase_add_test(tc, test_bf16_storage);
    tcase_add_test(tc, test_bf16_storage_portable);
    tcase_add_test(tc, test_bf16_nodes);
    tcase_add_test(tc, test_bf16_cast_passes);
    tcase_add_test(tc, test_special_values);
    tcase_add_test(tc, test_run_errors);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
