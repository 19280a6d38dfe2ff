/*
 * check_cuda.c — the CUDA backend. Without a GPU (CI): every kernel the CUDA emitter produces
 * for the test graphs (every IR op, shape/reduction patterns, the row primitives, attention, the
 * tiny GPT train step in its GPT-2 and Llama variants, with dropout and with gradient
 * accumulation, the MLP) is compiled by NVRTC for sm_90 (`make CUDA=1`; the default build checks
 * the emitted source's kernel table only); the builtin kernels' NVRTC compiles are check_cuk's.
 * With a GPU: each of those graphs runs on the CUDA backend and on the CPU backend from the same
 * leaves and every output and updated leaf must agree within TF32 tolerances; the train steps'
 * loss curves must agree. GPU tests print why they skip when there is no usable GPU. Without
 * one, `make test` runs the "gpu" case on the host CUDA emulator (build-cuda/tests/
 * check_cuda-emu, tests/infra/cudaemu): the same comparisons through cuda.c, its kernels and
 * its builtins.
 */
#include "jit-fixture.h"

#include "autodiff/autodiff.h"
#include "backend/backend.h"
#include "config/config.h"
#include "train/train.h"
#ifdef JDT_CUDA
#include "backend/cuda/cuda.h"
#include "backend/cuda/cuk.h"
#include "comm/comm.h"
#include "tests/unit/testutil.h"
#include <cuda_runtime.h>
#include <dlfcn.h>
#endif

#define SM 90

static void out(fx *f, jdt_tensor *t)
{
    ck_assert_msg(t != NULL, "builder: %s", jdt_graph_error_msg(f->g));
    jdt_graph_add_output(f->g, t);
}

/* ---- the graphs ------------------------------------------------------------------------------ */

static void build_elementwise(fx *f)
{
    jdt_graph *g = f->g;
    jdt_tensor *x = FX_INPUT(f, "x", JDT_DTYPE_F32, -3, 3, 7, 13);
    jdt_tensor *y = FX_INPUT(f, "y", JDT_DTYPE_F32, -3, 3, 7, 13);
    jdt_tensor *pos = FX_INPUT(f, "pos", JDT_DTYPE_F32, 0.1, 4, 7, 13);
    jdt_tensor *stp = jdt_graph_input(g, "stp", JDT_DTYPE_I32, 0, NULL, NULL);
    f->leaf[f->n] = stp, f->lo[f->n] = 3, f->hi[f->n] = 4, f->n++;
    out(f, jdt_graph_neg(g, x));
    out(f, jdt_graph_exp(g, x));
    out(f, jdt_graph_log(g, pos));
    out(f, jdt_graph_tanh(g, x));
    out(f, jdt_graph_sqrt(g, pos));
    out(f, jdt_graph_rsqrt(g, pos));
    out(f, jdt_graph_relu(g, x));
    out(f, jdt_graph_gelu(g, x));
    out(f, jdt_graph_silu(g, x));
    out(f, jdt_graph_sigmoid(g, x));
    out(f, jdt_graph_abs(g, x));
    out(f, jdt_graph_add(g, x, y));
    out(f, jdt_graph_sub(g, x, y));
    out(f, jdt_graph_mul(g, x, y));
    out(f, jdt_graph_div(g, x, pos));
    out(f, jdt_graph_max(g, x, y));
    out(f, jdt_graph_min(g, x, y));
    out(f, jdt_graph_gt(g, x, y));
    out(f, jdt_graph_ge(g, x, x));
    out(f, jdt_graph_add_scalar(g, x, 0.25));
    out(f, jdt_graph_mul_scalar(g, x, -1.5));
    out(f, jdt_graph_pow_scalar(g, pos, 2.0));
    out(f, jdt_graph_pow_scalar(g, pos, 0.5));
    out(f, jdt_graph_pow_scalar(g, pos, 1.7));
    out(f, jdt_graph_pow_scalar(g, pos, -1.0));
    out(f, jdt_graph_gelu_grad(g, x, y));
    out(f, jdt_graph_silu_grad(g, x, y));
    out(f, jdt_graph_select(g, jdt_graph_gt(g, x, y), x, pos));
    out(f, jdt_graph_cast(g, jdt_graph_mul_scalar(g, x, 10.0), JDT_DTYPE_I32));
    out(f, jdt_graph_cast(g, jdt_graph_cast(g, x, JDT_DTYPE_I32), JDT_DTYPE_F32));
    out(f, jdt_graph_stop_gradient(g, x));
    out(f, jdt_graph_dropout(g, x, stp, 0.3, 1234));
    out(f, jdt_graph_iota(g, JDT_DTYPE_F32, 3, (int64_t[]){3, 5, 7}, 1));
    out(f, jdt_graph_iota(g, JDT_DTYPE_I32, 2, (int64_t[]){4, 9}, 1));
    out(f, jdt_graph_causal_mask(g, JDT_DTYPE_F32, 11));
    out(f, jdt_graph_full(g, JDT_DTYPE_F32, 2, (int64_t[]){2, 3}, 0.75));
    static float cdata[7 * 13];
    for (int i = 0; i < 7 * 13; i++)
        cdata[i] = 0.25f * (float)(i % 9) - 1.0f;
    jdt_tensor *cst = jdt_graph_constant(g, JDT_DTYPE_F32, 2, (int64_t[]){7, 13}, cdata);
    out(f, jdt_graph_mul(g, x, cst));
    jdt_tensor *xd = jdt_graph_cast(g, x, JDT_DTYPE_F64);
    out(f, jdt_graph_tanh(g, jdt_graph_exp(g, jdt_graph_mul_scalar(g, xd, 0.5))));
    out(f, jdt_graph_reduce_sum(g, jdt_graph_gelu(g, xd), 2u, false));
    jdt_tensor *xi = jdt_graph_cast(g, jdt_graph_mul_scalar(g, y, 7.0), JDT_DTYPE_I32);
    out(f, jdt_graph_cast(g, jdt_graph_select(g, xi, xd, jdt_graph_neg(g, xd)), JDT_DTYPE_F32));
}

/* Elementwise kernels whose innermost extent is a multiple of 4 (emit.c's vectorised form: a
 * thread owns 4 consecutive elements): contiguous reads and writes as float4, a broadcast
 * innermost dim (one load per thread), a transposed and a slice-offset read (per element,
 * beside vector writes), the ops that read the flat index (dropout, iota, the causal mask), an
 * i32 store, fused and unfused. */
static void build_vector(fx *f)
{
    jdt_graph *g = f->g;
    jdt_tensor *x = FX_INPUT(f, "x", JDT_DTYPE_F32, -3, 3, 6, 8, 12);
    jdt_tensor *y = FX_INPUT(f, "y", JDT_DTYPE_F32, -3, 3, 6, 8, 12);
    jdt_tensor *row = FX_INPUT(f, "row", JDT_DTYPE_F32, -1, 1, 6, 1, 12);
    jdt_tensor *col = FX_INPUT(f, "col", JDT_DTYPE_F32, -1, 1, 6, 8, 1);
    jdt_tensor *sq = FX_INPUT(f, "sq", JDT_DTYPE_F32, -1, 1, 6, 12, 8);
    jdt_tensor *stp = jdt_graph_input(g, "stp", JDT_DTYPE_I32, 0, NULL, NULL);
    f->leaf[f->n] = stp, f->lo[f->n] = 3, f->hi[f->n] = 4, f->n++;
    out(f, jdt_graph_gelu(g, jdt_graph_add(g, x, y)));
    out(f, jdt_graph_mul_bcast(g, x, row));
    out(f, jdt_graph_add_bcast(g, jdt_graph_tanh(g, y), col));
    out(f, jdt_graph_sub(g, x, jdt_graph_transpose(g, sq, (int[]){0, 2, 1})));
    out(f, jdt_graph_exp(g, jdt_graph_slice(g, x, 2, 1, 9)));
    out(f, jdt_graph_dropout(g, jdt_graph_mul(g, x, y), stp, 0.3, 99));
    out(f, jdt_graph_iota(g, JDT_DTYPE_F32, 2, (int64_t[]){6, 16}, 1));
    out(f, jdt_graph_causal_mask(g, JDT_DTYPE_F32, 12));
    out(f, jdt_graph_select(g, jdt_graph_gt(g, x, y), x, jdt_graph_mul_scalar(g, y, 2.0)));
    out(f, jdt_graph_cast(g, jdt_graph_mul_scalar(g, x, 10.0), JDT_DTYPE_I32));
}

/* One elementwise group reading 25 f32 tensors: 100 registers of float4 loads, past emit.c's
 * VEC_MAX_REGS, so its kernel stays one element per thread (no spills). */
static void build_vector_wide(fx *f)
{
    static char names[25][16];
    jdt_tensor *sum = NULL;
    for (int i = 0; i < 25; i++) {
        snprintf(names[i], sizeof names[i], "x%d", i);
        jdt_tensor *x = FX_INPUT(f, names[i], JDT_DTYPE_F32, -1, 1, 8, 12);
        sum = sum ? jdt_graph_add(f->g, sum, jdt_graph_mul_scalar(f->g, x, 1.0 + i)) : x;
    }
    out(f, sum);
}

/* Column reductions (the innermost dim kept) whose innermost extent is a multiple of 4: a thread
 * sums 4 adjacent outputs (emit.c red_vec_width) through float4 loads, broadcast loads (x * col)
 * and strided ones (a transpose), split over blocks (4500 rows) or not, with a reduced middle
 * dim, several tiles, sum / max / mean. */
static void build_vector_reduce(fx *f)
{
    jdt_graph *g = f->g;
    jdt_tensor *x = FX_INPUT(f, "x", JDT_DTYPE_F32, -2, 2, 4500, 36);
    jdt_tensor *w = FX_INPUT(f, "w", JDT_DTYPE_F32, -1, 1, 36);
    jdt_tensor *col = FX_INPUT(f, "col", JDT_DTYPE_F32, -1, 1, 4500, 1);
    jdt_tensor *xt = FX_INPUT(f, "xt", JDT_DTYPE_F32, -1, 1, 36, 4500);
    jdt_tensor *y = FX_INPUT(f, "y", JDT_DTYPE_F32, -2, 2, 6, 50, 16);
    jdt_tensor *z = FX_INPUT(f, "z", JDT_DTYPE_F32, -2, 2, 300, 260);
    jdt_tensor *u = FX_INPUT(f, "u", JDT_DTYPE_F32, -2, 2, 8, 20, 12);
    out(f, jdt_graph_reduce_sum(g, jdt_graph_mul_bcast(g, x, w), 1u, false));
    out(f, jdt_graph_reduce_max(g, x, 1u, true));
    out(f, jdt_graph_reduce_mean(g, jdt_graph_exp(g, x), 1u, false));
    out(f, jdt_graph_reduce_sum(g, jdt_graph_mul_bcast(g, x, col), 1u, false));
    out(f, jdt_graph_reduce_sum(g, jdt_graph_add(g, x, jdt_graph_transpose(g, xt, (int[]){1, 0})),
                                1u, false));
    out(f, jdt_graph_reduce_sum(g, y, 3u, false));
    out(f, jdt_graph_reduce_sum(g, jdt_graph_tanh(g, z), 1u, false));
    out(f, jdt_graph_reduce_max(g, u, 2u, false));
    out(f, jdt_graph_reduce_mean(g, u, 2u, true));
}

static void build_shape_reduce(fx *f)
{
    jdt_graph *g = f->g;
    jdt_tensor *a = FX_INPUT(f, "a", JDT_DTYPE_F32, -2, 2, 3, 1, 5);
    jdt_tensor *b = FX_INPUT(f, "b", JDT_DTYPE_F32, -2, 2, 2, 3, 4, 5);
    jdt_tensor *c = FX_INPUT(f, "c", JDT_DTYPE_F32, -2, 2, 6, 7);
    out(f, jdt_graph_broadcast(g, a, 4, (int64_t[]){2, 3, 4, 5}));
    out(f, jdt_graph_add_bcast(g, b, a));
    out(f, jdt_graph_mul_bcast(g, c, jdt_graph_reduce_max(g, c, 1u << 1, true)));
    out(f, jdt_graph_transpose(g, b, (int[]){2, 0, 3, 1}));
    out(f, jdt_graph_exp(g, jdt_graph_transpose(g, c, (int[]){1, 0})));
    out(f, jdt_graph_slice(g, b, 2, 1, 3));
    out(f, jdt_graph_exp(g, jdt_graph_reshape(g, c, 3, (int64_t[]){2, 3, 7})));
    for (uint32_t mask = 1; mask < 16; mask += 3) {
        out(f, jdt_graph_reduce_sum(g, b, mask, false));
        out(f, jdt_graph_reduce_max(g, b, mask, true));
        out(f, jdt_graph_reduce_mean(g, b, mask, false));
    }
    out(f, jdt_graph_reduce_sum(g, jdt_graph_exp(g, jdt_graph_add_scalar(g, c, -1.0)), 2u, false));
    out(f, jdt_graph_reduce_mean(g, jdt_graph_abs(g, b), 0xfu, false));
    jdt_tensor *big = FX_INPUT(f, "big", JDT_DTYPE_F32, -2, 2, 301, 131);
    jdt_tensor *big3 = FX_INPUT(f, "big3", JDT_DTYPE_F32, -2, 2, 7, 53, 97);
    jdt_tensor *eb = jdt_graph_tanh(g, jdt_graph_mul_scalar(g, big, 0.7));
    out(f, eb);
    out(f, jdt_graph_reduce_sum(g, eb, 1u, false));
    out(f, jdt_graph_reduce_max(g, big, 1u, true));
    out(f, jdt_graph_reduce_mean(g, big, 2u, false));
    out(f, jdt_graph_reduce_sum(g, big, 3u, false));
    out(f, jdt_graph_reduce_sum(g, jdt_graph_exp(g, big3), 3u, false));
    out(f, jdt_graph_reduce_max(g, big3, 5u, false));
    /* long reductions with few outputs: the CUDA kernels split the reduced range over blocks */
    jdt_tensor *tall = FX_INPUT(f, "tall", JDT_DTYPE_F32, -2, 2, 4500, 37);
    out(f, jdt_graph_reduce_sum(g, tall, 1u, false));
    out(f, jdt_graph_reduce_max(g, tall, 1u, true));
    out(f, jdt_graph_reduce_mean(g, jdt_graph_exp(g, tall), 1u, false));
    out(f, jdt_graph_reduce_sum(g, jdt_graph_mul(g, tall, tall), 3u, false));
    out(f, jdt_graph_reduce_max(g, big, 3u, false));
    /* one sum of a long range (a gradient norm's squares): split over more than 128 blocks */
    jdt_tensor *lng = FX_INPUT(f, "long", JDT_DTYPE_F32, -1, 1, 300000);
    out(f, jdt_graph_reduce_sum(g, jdt_graph_mul(g, lng, lng), 1u, false));
}

/* An optimizer's shape (merge.c): a sum of squares per gradient, short ones in one block, long
 * ones split over blocks, a column sum split too, then a total and a clip coefficient that
 * depend on them, then an update per parameter reading the coefficient, and bf16 copies. The
 * independent neighbours share launches; the dependent ones must not. */
static void build_optimizer(fx *f)
{
    jdt_graph *g = f->g;
    static const int64_t n[6] = {768, 3072, 20000, 768, 9000, 40};
    static const char *gn[6] = {"g0", "g1", "g2", "g3", "g4", "g5"},
                      *pn[6] = {"p0", "p1", "p2", "p3", "p4", "p5"};
    jdt_tensor *sq[6], *gr[6], *pr[6];
    for (int i = 0; i < 6; i++) {
        gr[i] = fx_leaf(f, 1, gn[i], JDT_DTYPE_F32, 1, &n[i], -1, 1);
        pr[i] = fx_leaf(f, 1, pn[i], JDT_DTYPE_F32, 1, &n[i], -1, 1);
        sq[i] = jdt_graph_reduce_sum(g, jdt_graph_mul(g, gr[i], gr[i]), 1u, false);
    }
    jdt_tensor *cols = FX_INPUT(f, "cols", JDT_DTYPE_F32, -1, 1, 5000, 40);
    out(f, jdt_graph_reduce_sum(g, cols, 1u, false)); /* (40): a split column sum */
    jdt_tensor *total = sq[0];
    for (int i = 1; i < 6; i++)
        total = jdt_graph_add(g, total, sq[i]);
    jdt_tensor *coef =
        jdt_graph_min(g,
                      jdt_graph_div(g, jdt_graph_full(g, JDT_DTYPE_F32, 0, NULL, 1.0),
                                    jdt_graph_add_scalar(g, jdt_graph_sqrt(g, total), 1e-6)),
                      jdt_graph_full(g, JDT_DTYPE_F32, 0, NULL, 1.0));
    out(f, coef);
    for (int i = 0; i < 6; i++) {
        jdt_tensor *c = jdt_graph_broadcast(g, coef, 1, &n[i]);
        jdt_tensor *upd =
            jdt_graph_sub(g, pr[i], jdt_graph_mul(g, c, jdt_graph_mul_scalar(g, gr[i], 0.1)));
        out(f, upd);
        out(f, jdt_graph_cast(g, jdt_graph_cast(g, pr[i], JDT_DTYPE_BF16), JDT_DTYPE_F32));
    }
}

/* Two kernels independent in the graph but not in memory (merge.c): t = exp(x), read by two
 * reductions (stored by the first, which computes it: fuse_reduce_producers), dies at the
 * second; u = tanh(y), of t's size, comes next and the plan places it in t's bytes. u must not
 * share the second reduction's launch: in one grid its blocks could overwrite t before the
 * reduction reads it (the emulator runs u's blocks first, so the outputs would be wrong). */
static void build_reuse(fx *f)
{
    jdt_graph *g = f->g;
    jdt_tensor *x = FX_INPUT(f, "x", JDT_DTYPE_F32, -2, 2, 64, 96);
    jdt_tensor *y = FX_INPUT(f, "y", JDT_DTYPE_F32, -2, 2, 64, 96);
    jdt_tensor *t = jdt_graph_exp(g, x);
    out(f, jdt_graph_reduce_sum(g, t, 2u, false));
    out(f, jdt_graph_reduce_max(g, t, 2u, false));
    out(f, jdt_graph_tanh(g, y));
}

static void build_builtins(fx *f)
{
    jdt_graph *g = f->g;
    jdt_tensor *a = FX_INPUT(f, "a", JDT_DTYPE_F32, -1, 1, 5, 7);
    jdt_tensor *at = FX_INPUT(f, "at", JDT_DTYPE_F32, -1, 1, 7, 5);
    jdt_tensor *b = FX_INPUT(f, "b", JDT_DTYPE_F32, -1, 1, 7, 9);
    jdt_tensor *bt = FX_INPUT(f, "bt", JDT_DTYPE_F32, -1, 1, 9, 7);
    jdt_tensor *ba = FX_INPUT(f, "ba", JDT_DTYPE_F32, -1, 1, 2, 3, 5, 7);
    jdt_tensor *bb = FX_INPUT(f, "bb", JDT_DTYPE_F32, -1, 1, 2, 3, 7, 9);
    jdt_tensor *table = FX_INPUT(f, "table", JDT_DTYPE_F32, -1, 1, 11, 6);
    jdt_tensor *idx = FX_INPUT(f, "idx", JDT_DTYPE_I32, 0, 11, 3, 5);
    jdt_tensor *src = FX_INPUT(f, "src", JDT_DTYPE_F32, -1, 1, 3, 5, 6);
    jdt_tensor *c = FX_INPUT(f, "c", JDT_DTYPE_F32, -2, 2, 6, 7);
    jdt_tensor *d = FX_INPUT(f, "d", JDT_DTYPE_F32, -2, 2, 6, 3);
    out(f, jdt_graph_matmul(g, a, b, false, false));
    out(f, jdt_graph_matmul(g, at, b, true, false));
    out(f, jdt_graph_matmul(g, a, bt, false, true));
    out(f, jdt_graph_matmul(g, at, bt, true, true));
    out(f, jdt_graph_matmul(g, ba, bb, false, false));
    out(f, jdt_graph_matmul(g, ba, b, false, false));
    out(f, jdt_graph_gather(g, table, idx));
    out(f, jdt_graph_scatter_add(g, src, idx, 11));
    out(f, jdt_graph_concat(g, 2, (jdt_tensor *[]){c, d}, 1));
    jdt_tensor *x = FX_INPUT(f, "x", JDT_DTYPE_F32, -4, 4, 9, 37);
    jdt_tensor *dy = FX_INPUT(f, "dy", JDT_DTYPE_F32, -1, 1, 9, 37);
    jdt_tensor *tg = FX_INPUT(f, "tg", JDT_DTYPE_I32, -1, 37, 9);
    jdt_tensor *dl = FX_INPUT(f, "dl", JDT_DTYPE_F32, 0.5, 1, 9);
    jdt_tensor *r = FX_INPUT(f, "r", JDT_DTYPE_F32, -1, 1, 2, 5, 3, 8);
    jdt_tensor *sm = jdt_graph_softmax(g, x), *lsm = jdt_graph_log_softmax(g, x);
    out(f, sm);
    out(f, jdt_graph_softmax_bwd(g, sm, dy));
    out(f, lsm);
    out(f, jdt_graph_log_softmax_bwd(g, lsm, dy));
    jdt_tensor *xe = jdt_graph_softmax_xent(g, x, tg);
    out(f, xe);
    out(f, jdt_graph_softmax_xent_bwd(g, x, tg, dl, xe));
    out(f, jdt_graph_normalize(g, x, 1e-5));
    out(f, jdt_graph_normalize_bwd(g, x, dy, 1e-5));
    out(f, jdt_graph_rms_normalize(g, x, 1e-6));
    out(f, jdt_graph_rms_normalize_bwd(g, x, dy, 1e-6));
    out(f, jdt_graph_rope(g, r, 10000.0, false));
    out(f, jdt_graph_rope(g, r, 500.0, true));
    jdt_tensor *q = FX_INPUT(f, "q", JDT_DTYPE_F32, -2, 2, 2, 3, 67, 16);
    jdt_tensor *k = FX_INPUT(f, "k", JDT_DTYPE_F32, -2, 2, 2, 3, 67, 16);
    jdt_tensor *v = FX_INPUT(f, "v", JDT_DTYPE_F32, -1, 1, 2, 3, 67, 16);
    jdt_tensor *dout = FX_INPUT(f, "do", JDT_DTYPE_F32, -1, 1, 2, 3, 67, 16);
    jdt_tensor *o = jdt_graph_attention(g, q, k, v, 0.25);
    out(f, o);
    out(f, jdt_graph_attention_bwd(g, q, k, v, o, dout, 0.25));
}

/* Grouped-query attention as models.c builds it (each of 2 key/value heads repeated for its 2
 * query heads) and its backward as vjp_ATTENTION and the broadcast's gradient read it (thirds of
 * the packed output, each group summed), twice: one backward whose packed output is also a
 * graph output, so passes.c fold_attention_groups must leave it whole (the kernels write only
 * a quarter of its dk and dv thirds when grouped), and one read only through the sums, which it
 * folds (with the forward: 2). */
static void build_grouped_attention(fx *f)
{
    jdt_graph *g = f->g;
    const int64_t B = 2, H = 4, Hk = 2, T = 33, D = 16, G = H / Hk;
    jdt_tensor *q = FX_INPUT(f, "q", JDT_DTYPE_F32, -2, 2, B, H, T, D);
    jdt_tensor *kv[2] = {FX_INPUT(f, "k", JDT_DTYPE_F32, -2, 2, B, Hk, T, D),
                         FX_INPUT(f, "v", JDT_DTYPE_F32, -1, 1, B, Hk, T, D)};
    jdt_tensor *dout[2] = {FX_INPUT(f, "do", JDT_DTYPE_F32, -1, 1, B, H, T, D),
                           FX_INPUT(f, "do2", JDT_DTYPE_F32, -1, 1, B, H, T, D)};
    const int64_t b1[5] = {B, Hk, 1, T, D}, bg[5] = {B, Hk, G, T, D}, bh[4] = {B, H, T, D},
                  flat[4] = {3 * B, H, T, D};
    jdt_tensor *rep[2];
    for (int i = 0; i < 2; i++)
        rep[i] = jdt_graph_reshape(
            g, jdt_graph_broadcast(g, jdt_graph_reshape(g, kv[i], 5, b1), 5, bg), 4, bh);
    jdt_tensor *o = jdt_graph_attention(g, q, rep[0], rep[1], 0.25);
    out(f, o);
    for (int r = 0; r < 2; r++) {
        jdt_tensor *packed = jdt_graph_attention_bwd(g, q, rep[0], rep[1], o, dout[r], 0.25);
        if (r == 0) out(f, packed);
        jdt_tensor *pf = jdt_graph_reshape(g, packed, 4, flat);
        out(f, jdt_graph_slice(g, pf, 0, 0, B));
        for (int s = 1; s < 3; s++) /* dk, dv: each group's sum */
            out(f,
                jdt_graph_reduce_sum(
                    g, jdt_graph_reshape(g, jdt_graph_slice(g, pf, 0, s * B, (s + 1) * B), 5, bg),
                    1u << 2, false));
    }
}

/* bf16 compute (precision.compute: bf16): the same GEMM shapes with MATMUL attrs i[2] set, odd
 * and aligned sizes, a bias the compiler folds into the GEMM. On a GPU: cuBLASLt bf16 x bf16 ->
 * f32 against the CPU's jdt_rt_matmul_bf16 (same rounded inputs: summation order only). */
/* bf16 IR nodes in the generated kernels: casts, elementwise ops computed in f32 and rounded,
 * strided reads of bf16 values, a bf16 output and a bf16 state update (loads widen, stores
 * round). No GEMM reads a bf16 value here (bf16_cast_matmul does). */
static void build_bf16_nodes(fx *f)
{
    const jdt_dtype BF = JDT_DTYPE_BF16;
    jdt_graph *g = f->g;
    jdt_tensor *x = FX_INPUT(f, "x", JDT_DTYPE_F32, -2, 2, 9, 33);
    jdt_tensor *y = FX_INPUT(f, "y", JDT_DTYPE_F32, -2, 2, 9, 33);
    jdt_tensor *z = FX_INPUT(f, "z", BF, -2, 2, 9, 33);
    jdt_tensor *xb = jdt_graph_cast(g, x, BF), *yb = jdt_graph_cast(g, y, BF);
    jdt_tensor *sum = jdt_graph_add(g, xb, yb);
    out(f, sum);
    out(f, jdt_graph_cast(g, jdt_graph_mul(g, sum, z), JDT_DTYPE_F32));
    out(f, jdt_graph_div(g, xb, jdt_graph_add_scalar(g, jdt_graph_abs(g, yb), 0.5)));
    out(f, jdt_graph_exp(g, jdt_graph_transpose(g, xb, (int[]){1, 0})));
    out(f, jdt_graph_select(g, jdt_graph_gt(g, xb, z), jdt_graph_slice(g, xb, 1, 0, 33), z));
    out(f, jdt_graph_reduce_sum(g, jdt_graph_cast(g, jdt_graph_mul(g, xb, z), JDT_DTYPE_F32), 2u,
                                false));
    jdt_tensor *acc = fx_leaf(f, 2, "acc", BF, 2, (int64_t[]){9, 33}, -1, 1);
    jdt_graph_add_update(g, acc, jdt_graph_add(g, acc, jdt_graph_mul_scalar(g, xb, 0.01)));
}

static void build_bf16_matmul(fx *f)
{
    jdt_graph *g = f->g;
    jdt_graph_set_matmul_bf16(g, true);
    jdt_tensor *a = FX_INPUT(f, "a", JDT_DTYPE_F32, -1, 1, 5, 7);
    jdt_tensor *at = FX_INPUT(f, "at", JDT_DTYPE_F32, -1, 1, 7, 5);
    jdt_tensor *b = FX_INPUT(f, "b", JDT_DTYPE_F32, -1, 1, 7, 9);
    jdt_tensor *bt = FX_INPUT(f, "bt", JDT_DTYPE_F32, -1, 1, 9, 7);
    jdt_tensor *ba = FX_INPUT(f, "ba", JDT_DTYPE_F32, -1, 1, 2, 3, 5, 7);
    jdt_tensor *bb = FX_INPUT(f, "bb", JDT_DTYPE_F32, -1, 1, 2, 3, 7, 9);
    jdt_tensor *x = FX_INPUT(f, "x", JDT_DTYPE_F32, -2, 2, 3, 64, 128);
    jdt_tensor *w = FX_INPUT(f, "w", JDT_DTYPE_F32, -1, 1, 128, 96);
    jdt_tensor *bias = FX_INPUT(f, "bias", JDT_DTYPE_F32, -1, 1, 96);
    out(f, jdt_graph_matmul(g, a, b, false, false));
    out(f, jdt_graph_matmul(g, at, b, true, false));
    out(f, jdt_graph_matmul(g, a, bt, false, true));
    out(f, jdt_graph_matmul(g, at, bt, true, true));
    out(f, jdt_graph_matmul(g, ba, bb, false, false));
    out(f, jdt_graph_matmul(g, ba, b, false, false));
    jdt_tensor *y = jdt_graph_matmul(g, x, w, false, false);
    out(f, jdt_graph_add(g, y, jdt_graph_broadcast(g, bias, 3, (int64_t[]){3, 64, 96})));
    /* a weight-gradient shape (3, 128, 96), on a leaf: a GEMM output fed to another bf16 GEMM
     * would round differently wherever the two backends' sums straddle a bf16 boundary */
    jdt_tensor *dy = FX_INPUT(f, "dy", JDT_DTYPE_F32, -1, 1, 3, 64, 96);
    out(f, jdt_graph_matmul(g, x, dy, true, false));
    jdt_graph_set_matmul_bf16(g, false);
}

/* A norm backward whose dy sums three bf16 GEMMs' products, GPT-2's ln1 before its q, k and v
 * projections: y = NORMALIZE(x) * w + b, loss = sum(y Wq * Gq) + sum(y Wk * Gk) + sum(y Wv *
 * Gv), bf16 compute, and its gradients for x, w and b. The device folds the norm's affine
 * gradients into its backward and reads dy as the three GEMMs' bf16 products (passes.c
 * fold_norm_dy_terms); the CPU sums them in f32. dy's terms are of one size here (Gq, Gk, Gv
 * random), so a term dropped or read twice moves dx by about a third of its size. */
static void build_norm_dy_terms(fx *f)
{
    jdt_graph *g = f->g;
    jdt_tensor *P[3] = {FX_PARAM(f, "x", -2, 2, 2, 32, 128), FX_PARAM(f, "w", 0.5, 1.5, 128),
                        FX_PARAM(f, "b", -0.5, 0.5, 128)};
    jdt_graph_set_matmul_bf16(g, true);
    jdt_tensor *y = jdt_graph_add_bcast(
        g, jdt_graph_mul_bcast(g, jdt_graph_normalize(g, P[0], 1e-5), P[1]), P[2]);
    jdt_tensor *a = jdt_graph_reshape(g, y, 2, (int64_t[]){64, 128}), *loss = NULL;
    for (int k = 0; k < 3; k++) {
        char nm[8];
        snprintf(nm, sizeof nm, "W%d", k);
        jdt_tensor *W = FX_INPUT(f, nm, JDT_DTYPE_F32, -0.1, 0.1, 128, 128);
        snprintf(nm, sizeof nm, "G%d", k);
        jdt_tensor *G = FX_INPUT(f, nm, JDT_DTYPE_F32, -1, 1, 64, 128);
        jdt_tensor *l = jdt_graph_reduce_sum(
            g, jdt_graph_mul(g, jdt_graph_matmul(g, a, W, false, false), G), 3u, false);
        loss = loss ? jdt_graph_add(g, loss, l) : l;
    }
    jdt_tensor *D[3];
    jdt_err e;
    jdt_err_clear(&e);
    ck_assert_msg(jdt_autodiff_grad(g, loss, 3, P, D, &e) == JDT_OK, "autodiff: %s", e.msg);
    jdt_graph_set_matmul_bf16(g, false);
    out(f, loss);
    for (int k = 0; k < 3; k++)
        out(f, D[k]);
}

/* The train step's cast form of bf16 compute (jdt_graph_set_bf16_weights): weights cast to bf16
 * by CAST nodes (a fused kernel storing uint16_t) that bf16 GEMMs read as stored bf16 operands
 * (jdt_cuk_matmul_bf16_ex's a_bf16/b_bf16: no conversion pass), beside f32 operands the GEMM
 * rounds itself: the forward shape with a shared weight and a bias, the dX shape (the same
 * cast weight transposed), a transposed bf16 left operand, both operands cast, and odd sizes
 * (cuBLASLt's TF32 fallback widens a stored bf16 operand). */
static void build_bf16_cast_matmul(fx *f)
{
    const jdt_dtype BF = JDT_DTYPE_BF16;
    jdt_graph *g = f->g;
    jdt_graph_set_matmul_bf16(g, true);
    jdt_tensor *x = FX_INPUT(f, "x", JDT_DTYPE_F32, -2, 2, 3, 64, 128);
    jdt_tensor *w = FX_INPUT(f, "w", JDT_DTYPE_F32, -1, 1, 128, 96);
    jdt_tensor *bias = FX_INPUT(f, "bias", JDT_DTYPE_F32, -1, 1, 96);
    jdt_tensor *dy = FX_INPUT(f, "dy", JDT_DTYPE_F32, -1, 1, 3, 64, 96);
    jdt_tensor *a = FX_INPUT(f, "a", JDT_DTYPE_F32, -1, 1, 5, 7);
    jdt_tensor *at = FX_INPUT(f, "at", JDT_DTYPE_F32, -1, 1, 7, 5);
    jdt_tensor *b = FX_INPUT(f, "b", JDT_DTYPE_F32, -1, 1, 7, 9);
    jdt_tensor *bt = FX_INPUT(f, "bt", JDT_DTYPE_F32, -1, 1, 9, 7);
    jdt_tensor *wb = jdt_graph_cast(g, w, BF);
    jdt_tensor *y = jdt_graph_matmul(g, x, wb, false, false);
    out(f, jdt_graph_add(g, y, jdt_graph_broadcast(g, bias, 3, (int64_t[]){3, 64, 96})));
    out(f, jdt_graph_matmul(g, dy, wb, false, true));
    out(f, jdt_graph_matmul(g, jdt_graph_cast(g, at, BF), b, true, false));
    out(f, jdt_graph_matmul(g, jdt_graph_cast(g, a, BF), jdt_graph_cast(g, bt, BF), false, true));
    jdt_graph_set_matmul_bf16(g, false);
}

/* The bias-gradient pattern of a bf16 backward: h = (x + y) * y (an elementwise group: GELU's
 * backward in GPT-2, here without transcendentals so both sides round h to the same bf16), its
 * bf16 copy for two GEMMs (dX, dW) and its sum over the rows (the bias gradient). On CUDA the
 * group merges into the reduction (fuse.c fuse_reduce_producers): one kernel computes h, stores
 * the copy and sums h. Once with h read by nothing else (not stored at all), once with h also an
 * output (stored from the reduction's loop), once with a 4-output column reduction and once a
 * scalar one (a row length of 30); and a transpose summed through a reshape (q/k/v bias
 * gradients). The sums come before the GEMMs that read the copies, as autodiff orders a bias
 * gradient: the merged kernel runs where the sum did. */
static void build_reduce_producer(fx *f)
{
    const jdt_dtype BF = JDT_DTYPE_BF16;
    jdt_graph *g = f->g;
    jdt_graph_set_matmul_bf16(g, true);
    for (int v = 0; v < 2; v++) {
        const int64_t C = v ? 30 : 48;
        jdt_tensor *x = FX_INPUT(f, v ? "x1" : "x0", JDT_DTYPE_F32, -2, 2, 4, 64, C);
        jdt_tensor *y = FX_INPUT(f, v ? "y1" : "y0", JDT_DTYPE_F32, -1, 1, 4, 64, C);
        jdt_tensor *w = FX_INPUT(f, v ? "w1" : "w0", JDT_DTYPE_F32, -1, 1, C, 24);
        jdt_tensor *h = jdt_graph_mul(g, jdt_graph_add(g, x, y), y); /* exact on both sides */
        out(f, jdt_graph_reduce_sum(g, h, 3u, false)); /* bias, before the GEMMs as in autodiff */
        jdt_tensor *hb = jdt_graph_reshape(g, jdt_graph_cast(g, h, BF), 2, (int64_t[]){256, C});
        out(f, jdt_graph_matmul(g, hb, jdt_graph_cast(g, w, BF), false, false)); /* dX-like */
        out(f, jdt_graph_matmul(g, hb, hb, true, false));                        /* dW-like */
        if (v) out(f, h);
    }
    /* attention's dq: a (B, H, T, D) value transposed to (B, T, H, D), summed over (B, T) through
     * its (B, T, C) view (the reduction then runs over the transpose's dims) */
    jdt_tensor *a = FX_INPUT(f, "a", JDT_DTYPE_F32, -1, 1, 2, 3, 16, 8);
    jdt_tensor *wq = FX_INPUT(f, "wq", JDT_DTYPE_F32, -1, 1, 24, 24);
    jdt_tensor *x = jdt_graph_transpose(g, a, (int[]){0, 2, 1, 3});
    out(f, jdt_graph_reduce_sum(g, jdt_graph_reshape(g, x, 3, (int64_t[]){2, 16, 24}), 3u, false));
    jdt_tensor *xb = jdt_graph_reshape(g, jdt_graph_cast(g, x, BF), 2, (int64_t[]){32, 24});
    out(f, jdt_graph_matmul(g, xb, jdt_graph_cast(g, wq, BF), false, false));
    jdt_graph_set_matmul_bf16(g, false);
}

/* An Adam-like update of a parameter and a moment: donated and copied updates on the device. */
static void build_update(fx *f)
{
    jdt_graph *g = f->g;
    jdt_tensor *w = FX_PARAM(f, "w", -1, 1, 33, 65);
    jdt_tensor *m = fx_leaf(f, 2, "m", JDT_DTYPE_F32, 2, (int64_t[]){33, 65}, -0.1, 0.1);
    jdt_tensor *x = FX_INPUT(f, "x", JDT_DTYPE_F32, -1, 1, 33, 65);
    jdt_tensor *gr = jdt_graph_mul(g, jdt_graph_tanh(g, w), x);
    jdt_tensor *mn =
        jdt_graph_add(g, jdt_graph_mul_scalar(g, m, 0.9), jdt_graph_mul_scalar(g, gr, 0.1));
    jdt_graph_add_update(g, m, mn);
    jdt_graph_add_update(g, w, jdt_graph_sub(g, w, jdt_graph_mul_scalar(g, mn, 0.01)));
    out(f, jdt_graph_reduce_sum(g, jdt_graph_mul(g, gr, gr), 3u, false));
}

typedef void (*builder_fn)(fx *f);
static const struct {
    const char *name;
    builder_fn build;
    double rtol, atol;
} GRAPHS[] = {
    {"elementwise", build_elementwise, 1e-5, 1e-5},
    {"shape_reduce", build_shape_reduce, 1e-4, 1e-4},
    {"vector_reduce", build_vector_reduce, 1e-4, 1e-4},
    /* bf16 GEMM products of bf16 copies: summation order only */
    {"reduce_producer", build_reduce_producer, 3e-4, 3e-4},
    {"vector", build_vector, 1e-5, 1e-5},
    {"vector_wide", build_vector_wide, 1e-5, 1e-5},
    /* TF32 GEMMs (10-bit mantissa): ~1e-3 relative on these small K */
    {"builtins", build_builtins, 5e-3, 5e-3},
    /* f32 attention (FMA kernels) on both sides: summation order only */
    {"grouped_attention", build_grouped_attention, 1e-4, 1e-4},
    {"update", build_update, 1e-5, 1e-5},
    /* sums of up to 20000 values: summation order only */
    {"optimizer", build_optimizer, 1e-4, 1e-4},
    {"reuse", build_reuse, 1e-5, 1e-5},
    /* bf16-rounded inputs on both sides, f32 accumulation: summation order only (an input not
     * rounded would be ~1e-2 off) */
    {"bf16_matmul", build_bf16_matmul, 3e-4, 3e-4},
    /* the same products with the weights' bf16 rounding done by CAST kernels: summation order
     * only */
    {"bf16_cast_matmul", build_bf16_cast_matmul, 3e-4, 3e-4},
    /* bf16 values: one bf16 ulp (2^-8) where the device's f32 math (expf, division) lands on
     * the other side of a rounding boundary */
    {"bf16_nodes", build_bf16_nodes, 8e-3, 1e-6},
    /* dy's three terms (about 0.38 each) rounded to bf16 on the device, 2^-9 relative, not on
     * the CPU: about 1e-3 per dy, 1e-2 on w's and b's gradients, sums of 64 rows (about 5) */
    {"norm_dy_terms", build_norm_dy_terms, 1e-2, 5e-2},
};
#define N_GRAPHS ((int)(sizeof GRAPHS / sizeof GRAPHS[0]))

/* Model configs of the train-step tests (the tiny GPT and its variants, the MLP). */
static const char *GPT = "run: {seed: 7, steps: 10}\n"
                         "model: {type: gpt, vocab_size: 64, seq_len: 16, n_layer: 2, n_embd: 32, "
                         "n_head: 4}\n"
                         "data: {format: synthetic, batch_size: 4, micro_batch_size: 4}\n"
                         "optimizer: {lr: 0.003, warmup_steps: 2}\n";
static const char *MLP =
    "run: {seed: 7, steps: 10}\n"
    "model: {type: mlp, in_dim: 20, hidden_dim: 32, n_hidden: 2, n_classes: 5}\n"
    "data: {format: synthetic, batch_size: 8}\n"
    "optimizer: {type: sgd, lr: 0.05, momentum: 0.9, nesterov: true}\n";
static const struct {
    const char *name, *base;
    const char *over[8];
} MODELS[] = {
    {"gpt2", NULL, {NULL}},
    {"llama",
     NULL,
     {"model.norm=rmsnorm", "model.pos=rope", "model.activation=swiglu", "model.bias=false"}},
    {"dropout+accum", NULL, {"model.dropout=0.1", "data.micro_batch_size=2", NULL}},
    {"mlp", NULL, {NULL}},
    /* precision.compute: bf16 (GPU: cuBLASLt bf16 GEMMs vs the CPU's bf16 path). No biases: the
     * key bias's gradient is zero in exact arithmetic (softmax ignores a per-query constant),
     * so what AdamW makes of it is the backends' rounding noise, which bf16 attention products
     * raise far above f32's; the bias epilogue of bf16 GEMMs is in the bf16_matmul graph */
    {"gpt2-bf16", NULL, {"precision.compute=bf16", "model.bias=false", NULL}},
    /* precision.activations: bf16: the device's GEMMs store the linear layers' and the head's
     * outputs as bf16 and its cross-entropy reads the bf16 logits (passes.c fold_bf16_casts);
     * with biases (bf16 in the GEMM epilogue) the parameters are not compared (above) */
    {"gpt2-bf16act",
     NULL,
     {"precision.compute=bf16", "precision.activations=bf16", "model.bias=false"}},
    {"gpt2-bf16act-bias", NULL, {"precision.compute=bf16", "precision.activations=bf16", NULL}},
    /* and the Llama variant: RoPE reads the bf16 q and k and its backward stores their bf16
     * cotangents itself (fold_bf16_casts) */
    {"llama-bf16act",
     NULL,
     {"model.norm=rmsnorm", "model.pos=rope", "model.activation=swiglu", "model.bias=false",
      "precision.compute=bf16", "precision.activations=bf16", NULL}},
    /* grouped-query attention (2 key/value heads for 4 query heads): each key/value head
     * repeated for its group by a broadcast the attention reads through (models.c), in bf16
     * like the heads' transposes (passes.c qkv_carrier) */
    {"llama-gqa",
     NULL,
     {"model.norm=rmsnorm", "model.pos=rope", "model.activation=swiglu", "model.bias=false",
      "model.n_kv_head=2", NULL}},
    /* and in bf16 (losses and gradient norms compared; the parameters above, in f32) */
    {"llama-gqa-bf16act",
     NULL,
     {"model.norm=rmsnorm", "model.pos=rope", "model.activation=swiglu", "model.bias=false",
      "model.n_kv_head=2", "precision.compute=bf16", "precision.activations=bf16"}},
    /* grouped-query attention with biases on q, k and v (GPT-2's layer with 2 key/value heads,
     * Qwen2's biases): the backward's partial sums of dk and dv have H / G heads' columns
     * (passes.c fold_attention_cotangents, sum_flat_partials); f32, the parameters compared */
    {"gpt2-gqa", NULL, {"model.n_kv_head=2", NULL}},
    /* Qwen2's attention: biases on q, k, v before the RoPE, grouped-query (GPT-2's MLP, whose
     * SwiGLU with biases Qwen2 does not have): the bias gradients of q and k sum the rotated
     * cotangents, which the attention's kernels sum as they rotate them (passes.c
     * rotated_sums); f32 (the parameters compared), and in bf16, where the copies the GEMMs
     * read are the rotated values' bf16 rounding (losses and gradient norms compared: the key
     * bias, as in gpt2-bf16act-bias) */
    {"qwen2", NULL, {"model.norm=rmsnorm", "model.pos=rope", "model.n_kv_head=2", NULL}},
    {"qwen2-bf16act-bias",
     NULL,
     {"model.norm=rmsnorm", "model.pos=rope", "model.n_kv_head=2", "precision.compute=bf16",
      "precision.activations=bf16", NULL}},
};
#define N_MODELS ((int)(sizeof MODELS / sizeof MODELS[0]))

static void load_model(int i, jdt_config *c)
{
    char *over[8];
    int n = 0;
    for (int k = 0; k < 8 && MODELS[i].over[k]; k++)
        over[n++] = (char *)MODELS[i].over[k];
    jdt_err e;
    jdt_err_clear(&e);
    const char *base = strcmp(MODELS[i].name, "mlp") == 0 ? MLP : GPT;
    jdt_status st = jdt_config_load_string(base, "test", n, over, NULL, c, &e);
    ck_assert_msg(st == JDT_OK, "config %s: %s", MODELS[i].name, e.msg);
}

/* The emit-only CUDA device (no GPU: plans and CUDA source). */
static jdt_device *emit_only_device(void)
{
    jdt_device *d = NULL;
    jdt_err e;
    jdt_err_clear(&e);
    ck_assert_msg(jdt_device_open_emit_only(&d, &e) == JDT_OK, "%s", e.msg);
    return d;
}

static jdt_step *make_step(const jdt_config *c, jdt_device *d, const char *cache)
{
    jdt_step_opts o;
    memset(&o, 0, sizeof o);
    o.micro_batch = c->data.micro_batch_size;
    o.n_accum = c->data.batch_size / c->data.micro_batch_size;
    o.use_jit = true;
    jdt_compile_opts_init(&o.copts);
    o.copts.cache_dir = cache;
    o.copts.threads = 1;
    o.copts.device = d;
    jdt_step *s = NULL;
    jdt_err e;
    jdt_err_clear(&e);
    jdt_status st = jdt_step_new(c, &o, &s, &e);
    ck_assert_msg(st == JDT_OK, "step_new: %s", e.msg);
    return s;
}

/* The CASTs to bf16 in s's train graph: > 0 when the step reads its GEMM weights through bf16
 * copies (the cast form of precision.compute: bf16, engine/train/step.c). */
static int n_bf16_casts(const jdt_step *s)
{
    const jdt_graph *g = jdt_step_graph(s, JDT_STEP_PROG_MAIN);
    int n = 0;
    for (int i = 0; g && i < jdt_graph_n_nodes(g); i++) {
        const jdt_tensor *t = jdt_graph_node(g, i);
        n += t->op == JDT_OP_CAST && t->dtype == JDT_DTYPE_BF16;
    }
    return n;
}

/* ---- NVRTC (no GPU needed) ------------------------------------------------------------------ */

static int count_of(const char *src, const char *what)
{
    int n = 0;
    for (const char *p = src; (p = strstr(p, what)); p++)
        n++;
    return n;
}

/* The emitted source has one kernel per launch, and a device function per kernel that runs in
 * a merged launch (merge.c); with CUDA=1 NVRTC compiles it. */
static void check_source(const char *what, const char *src, const jdt_compile_stats *cs)
{
    const int n_global = count_of(src, "__global__ void __launch_bounds__"),
              n_member = count_of(src, "__device__ __noinline__ void k");
    ck_assert_msg(n_global == cs->n_kernels - cs->n_launch_merged,
                  "%s: %d kernels in the source, %d launches expected", what, n_global,
                  cs->n_kernels - cs->n_launch_merged);
    ck_assert_msg(n_global + n_member >= cs->n_kernels && n_member <= 2 * cs->n_launch_merged,
                  "%s: %d merged members in the source for %d merged kernels", what, n_member,
                  cs->n_launch_merged);
#ifdef JDT_CUDA
    void *image = NULL;
    size_t n = 0;
    jdt_err e;
    jdt_err_clear(&e);
    jdt_status st = jdt_cuda_nvrtc(src, what, SM, &image, &n, &e);
    ck_assert_msg(st == JDT_OK, "%s: %s", what, e.msg);
    ck_assert_msg(n > 0, "%s: empty cubin", what);
    jdt_free(image);
#endif
}

START_TEST(test_nvrtc_op_graphs)
{
    int i = _i;
    fx f;
    fx_init(&f);
    GRAPHS[i].build(&f);
    jdt_device *d = NULL;
    jdt_err e;
    jdt_err_clear(&e);
    ck_assert_int_eq(jdt_device_open_emit_only(&d, &e), JDT_OK);
    for (int mode = 0; mode < 3; mode++) { /* fused; one launch per kernel; one kernel per op */
        const bool nf = mode == 2;
        jdt_compile_opts o;
        fx_opts(&f, &o);
        o.device = d;
        o.no_fuse = nf;
        o.no_merge_launches = mode == 1;
        jdt_program *p = NULL;
        jdt_status st = jdt_program_compile(f.g, &o, &p, &e);
        ck_assert_msg(st == JDT_OK, "compile %s: %s", GRAPHS[i].name, e.msg);
        /* an emit-only program cannot run: one clear error */
        ck_assert_int_eq(jdt_program_run(p, &e), JDT_ERR_UNSUPPORTED);
        check_source(GRAPHS[i].name, jdt_program_source(p), jdt_program_stats(p));
        if (strcmp(GRAPHS[i].name, "shape_reduce") == 0) /* the long reductions are split */
            ck_assert_ptr_nonnull(strstr(jdt_program_source(p), "_done[tile]"));
        if (strcmp(GRAPHS[i].name, "vector") == 0) { /* 4 elements per thread */
            ck_assert_ptr_nonnull(strstr(jdt_program_source(p), "= jdt_ld4(r"));
            ck_assert_ptr_nonnull(strstr(jdt_program_source(p), "jdt_st4(w"));
        }
        if (strcmp(GRAPHS[i].name, "vector_reduce") == 0) { /* 4 outputs per thread */
            ck_assert_ptr_nonnull(strstr(jdt_program_source(p), "acc3 += x"));
            ck_assert_ptr_nonnull(strstr(jdt_program_source(p), "_done[tile]"));
        }
        if (strcmp(GRAPHS[i].name, "grouped_attention") == 0) /* the forward, one backward */
            ck_assert_int_eq(jdt_program_stats(p)->n_attention_groups, nf ? 0 : 2);
        if (strcmp(GRAPHS[i].name, "reduce_producer") == 0) /* both producers merged */
            ck_assert_int_eq(jdt_program_stats(p)->n_reduce_merged, nf ? 0 : 3);
        if (strcmp(GRAPHS[i].name, "vector_wide") == 0 && !nf) /* too many loads to hold */
            ck_assert_ptr_null(strstr(jdt_program_source(p), "= jdt_ld4(r"));
        if (mode == 1) ck_assert_int_eq(jdt_program_stats(p)->n_launch_merged, 0);
        if (strcmp(GRAPHS[i].name, "optimizer") == 0 && mode == 0) {
            /* the sums of squares share a launch, split ones with their partials side by side;
             * the total, the coefficient and the updates reading it come later */
            ck_assert_int_ge(jdt_program_stats(p)->n_launch_merged, 10);
            ck_assert_int_ge(
                jdt_program_stats(p)->n_kernels - jdt_program_stats(p)->n_launch_merged, 3);
            ck_assert_ptr_nonnull(strstr(jdt_program_source(p), "(jdt_red_part + "));
        }
        if (strcmp(GRAPHS[i].name, "reuse") == 0 && mode == 0) {
            /* the plan put tanh's output in exp's bytes: no two of the 3 kernels share a
             * launch (the first writes what the second reads, the third writes where the
             * second reads) */
            bool reused = false;
            for (int a = 0; a < jdt_program_n_buffers(p); a++)
                for (int b = a + 1; b < jdt_program_n_buffers(p); b++) {
                    jdt_buf_info ia, ib;
                    jdt_program_buffer(p, a, &ia);
                    jdt_program_buffer(p, b, &ib);
                    reused |= ia.kind == JDT_BUF_ARENA && ib.kind == JDT_BUF_ARENA &&
                              ia.n_bytes == 64 * 96 * 4 && ib.n_bytes == ia.n_bytes &&
                              ia.offset == ib.offset;
                }
            ck_assert_msg(reused,
                          "reuse: the plan did not reuse exp's bytes; the test tests nothing");
            ck_assert_int_eq(jdt_program_stats(p)->n_kernels, 3);
            ck_assert_int_eq(jdt_program_stats(p)->n_launch_merged, 0);
        }
        jdt_program_free(p);
    }
    jdt_device_close(d);
    fx_free(&f);
}
END_TEST

START_TEST(test_nvrtc_train_steps)
{
    int i = _i;
    jdt_config c;
    load_model(i, &c);
    jdt_device *d = NULL;
    jdt_err e;
    jdt_err_clear(&e);
    ck_assert_int_eq(jdt_device_open_emit_only(&d, &e), JDT_OK);
    jdt_step *s = make_step(&c, d, "/tmp/jdt-check-cuda-unused");
    check_source(MODELS[i].name, jdt_step_source(s), jdt_step_stats(s));
    /* bf16 storage: fused kernels store bf16 (compiled by NVRTC above); only GEMMs read it.
     * The weights' bf16 copies are CAST kernels among them (the cast form, as on the CPU). */
    if (strstr(MODELS[i].name, "bf16")) {
        ck_assert_int_gt(jdt_step_stats(s)->n_bf16_stored, 0);
        ck_assert_int_gt(n_bf16_casts(s), 0);
        ck_assert_ptr_nonnull(strstr(jdt_step_source(s), "= jdt_bf16_st(v"));
    }
    /* the backward's sum of the q, k, v GEMMs' input cotangents: in f32, done by two of the
     * GEMMs (2 per layer); with bf16 compute, read by ln1's backward from the three GEMMs'
     * bf16 products instead (passes.c fold_norm_dy_terms, one per layer). With no dropout the
     * residual adds are GEMMs' too (2 more per layer), with bf16 activations from the
     * unrounded branch output (passes.c fold_residual_gemms). Llama's ln2 sums the gate's and
     * the up projection's likewise. */
    printf("check_cuda: %s: %d adds folded into GEMMs (%d residual adds unrounded), %d norm "
           "backwards summing dy terms\n",
           MODELS[i].name, jdt_step_stats(s)->n_gemm_acc_folded,
           jdt_step_stats(s)->n_residual_gemms, jdt_step_stats(s)->n_norm_dy_terms);
    const bool bf16act = c.precision.activations == JDT_DTYPE_BF16;
    const bool terms = c.precision.compute == JDT_DTYPE_BF16 && c.model.type == JDT_MODEL_GPT;
    const int terms_per_layer = c.model.activation == JDT_ACT_SWIGLU ? 2 : 1; /* ln2's too */
    ck_assert_int_eq(jdt_step_stats(s)->n_norm_dy_terms,
                     terms ? terms_per_layer * c.model.n_layer : 0);
    if (c.model.type == JDT_MODEL_GPT)
        ck_assert_int_ge(jdt_step_stats(s)->n_gemm_acc_folded,
                         (terms ? 0 : 2 * c.model.n_layer) +
                             (c.model.dropout == 0 ? 2 * c.model.n_layer : 0));
    else
        ck_assert_int_eq(jdt_step_stats(s)->n_gemm_acc_folded, 0);
    const int residual_folds =
        c.model.type == JDT_MODEL_GPT && bf16act && c.model.dropout == 0 ? 2 * c.model.n_layer : 0;
    ck_assert_int_eq(jdt_step_stats(s)->n_residual_gemms, residual_folds);
    /* the loss's mean gives every row the same cotangent: the cross-entropy's backward is done
     * by its forward's pass over the logits (passes.c fold_xent_backwards) */
    ck_assert_int_eq(jdt_step_stats(s)->n_xent_fused, 1);
    /* every attention stores the (B, T, H, D) copy of o its projection's GEMM reads (passes.c
     * fold_attention_copies) */
    ck_assert_int_eq(jdt_step_stats(s)->n_attention_copies,
                     c.model.type == JDT_MODEL_MLP ? 0 : c.model.n_layer);
    /* every attention backward stores the (B, T, H, D) copies of dq, dk and dv that the
     * projections' backward reads, and their bias gradients' partial sums (passes.c
     * fold_attention_cotangents); with RoPE its backward reads those copies, so no transpose
     * is left for fold_rope_transposes, which takes the packed output's slices in place when
     * the fold is off (JDT_ATTENTION_GRADS=0) */
    ck_assert_int_eq(jdt_step_stats(s)->n_attention_cotangents,
                     c.model.type == JDT_MODEL_MLP ? 0 : c.model.n_layer);
    /* grouped-query attention: the forward and the backward read k and v (B, Hk, T, D) without
     * their repetition per query head, and the backward writes each group's sums (passes.c
     * fold_attention_groups), so the copies above are of those; without the fold
     * (JDT_ATTENTION_GROUPS=0) the broadcast and the sums are kernels, and the backward keeps
     * its packed output (no copies: dk and dv reach the projections through the sums) */
    const bool gqa = c.model.n_kv_head && c.model.n_kv_head != c.model.n_head;
    ck_assert_int_eq(jdt_step_stats(s)->n_attention_groups, gqa ? 2 * c.model.n_layer : 0);
    if (gqa) {
        setenv("JDT_ATTENTION_GROUPS", "0", 1);
        jdt_step *s0 = make_step(&c, d, "/tmp/jdt-check-cuda-unused");
        unsetenv("JDT_ATTENTION_GROUPS");
        ck_assert_int_eq(jdt_step_stats(s0)->n_attention_groups, 0);
        ck_assert_int_eq(jdt_step_stats(s0)->n_attention_cotangents, 0);
        ck_assert_int_gt(jdt_step_stats(s0)->n_kernels, jdt_step_stats(s)->n_kernels);
        jdt_step_free(s0);
    }
    /* the partial sums only where a bias gradient reads them (GPT-2's q, k, v biases; none
     * without biases, as in Llama: the kernels write none, and cuDNN's backward may serve) */
    ck_assert_int_eq(jdt_step_stats(s)->n_attention_partials,
                     c.model.type == JDT_MODEL_MLP || !c.model.bias ? 0 : c.model.n_layer);
    /* SwiGLU's backward: the up and gate projections' cotangents in one kernel reading dh once
     * (fuse.c fuse_ew_siblings) */
    if (c.model.activation == JDT_ACT_SWIGLU)
        ck_assert_int_eq(jdt_step_stats(s)->n_ew_siblings, c.model.n_layer);
    /* and its silu(g) recomputed by each reader (the forward's product, the backward's up
     * cotangent) from the gate GEMM's stored output (passes.c split_widenings) */
    ck_assert_int_eq(jdt_step_stats(s)->n_recomputes_split,
                     c.model.activation == JDT_ACT_SWIGLU ? c.model.n_layer : 0);
    /* and takes the row log-sum-exp its forward stored (passes.c fold_attention_lse) */
    ck_assert_int_eq(jdt_step_stats(s)->n_attention_lse,
                     c.model.type == JDT_MODEL_MLP ? 0 : c.model.n_layer);
    ck_assert_int_eq(jdt_step_stats(s)->n_rope_transposes_folded, 0);
    /* with RoPE its kernels also rotate dq's and dk's copies as the RoPE backward would, whose
     * kernels go */
    ck_assert_int_eq(jdt_step_stats(s)->n_ropes_in_attention,
                     c.model.pos == JDT_POS_ROPE ? 2 * c.model.n_layer : 0);
    /* and, with biases before the RoPE (Qwen2), sum the rotated values for the q and k bias
     * gradients, no kernel reading the copies for them (passes.c rotated_sums) */
    ck_assert_int_eq(jdt_step_stats(s)->n_rotated_partials,
                     c.model.pos == JDT_POS_ROPE && c.model.bias ? 2 * c.model.n_layer : 0);
    if (c.model.pos == JDT_POS_ROPE) {
        setenv("JDT_ATTENTION_GRADS", "0", 1);
        jdt_step *s0 = make_step(&c, d, "/tmp/jdt-check-cuda-unused");
        unsetenv("JDT_ATTENTION_GRADS");
        ck_assert_int_eq(jdt_step_stats(s0)->n_attention_cotangents, 0);
        ck_assert_int_eq(jdt_step_stats(s0)->n_rope_transposes_folded, 2 * c.model.n_layer);
        jdt_step_free(s0);
    }
    /* SwiGLU with bf16 activations: the backward's two kernels each widen the bf16 cotangent of
     * the gated product themselves (passes.c split_widenings), one copy per layer */
    ck_assert_int_eq(jdt_step_stats(s)->n_widenings_split,
                     c.model.activation == JDT_ACT_SWIGLU && bf16act ? c.model.n_layer : 0);
    /* every norm backward forms dy * w itself (ln1, ln2 per layer and the final norm) */
    ck_assert_int_eq(jdt_step_stats(s)->n_norm_scales_folded,
                     c.model.type == JDT_MODEL_MLP ? 0 : 2 * c.model.n_layer + 1);
    /* and sums its affine's weight (and bias) gradients over blocks of rows: no reduction
     * reads xhat or a full dy for them (passes.c fold_norm_partials) */
    ck_assert_int_eq(jdt_step_stats(s)->n_norm_partials_folded,
                     c.model.type == JDT_MODEL_MLP ? 0 : 2 * c.model.n_layer + 1);
    /* and those that add it also sum their output's columns (the projection's bias gradient)
     * and store its bf16 copy (the projection's bf16 GEMMs' operand): passes.c
     * fold_norm_cotangents; a model with neither bias nor bf16 compute has neither to fold,
     * and with dropout the projection's cotangent is the dropout's backward of g, not g */
    printf("check_cuda: %s: %d norm backwards sum or copy their output, %d reduce siblings\n",
           MODELS[i].name, jdt_step_stats(s)->n_norm_cotangents_folded,
           jdt_step_stats(s)->n_reduce_siblings);
    ck_assert_int_eq(jdt_step_stats(s)->n_norm_cotangents_folded,
                     c.model.type != JDT_MODEL_MLP && c.model.dropout == 0 &&
                             (c.model.bias || c.precision.compute == JDT_DTYPE_BF16)
                         ? 2 * c.model.n_layer
                         : 0);
    /* the residual's cotangent: every norm but the last adds it to its dx (2 per layer) */
    ck_assert_int_eq(jdt_step_stats(s)->n_norm_acc_folded,
                     c.model.type == JDT_MODEL_MLP ? 0 : 2 * c.model.n_layer);
    /* with biases and bf16 compute, no reduction of the projections' bias gradients stores
     * the GEMMs' bf16 copy (fuse.c fuse_reduce_siblings) any more: the norm backward does */
    if (c.model.type == JDT_MODEL_GPT && c.model.bias && c.precision.compute == JDT_DTYPE_BF16)
        ck_assert_int_eq(jdt_step_stats(s)->n_reduce_siblings,
                         c.model.dropout == 0 ? 0 : 2 * c.model.n_layer);
    /* bf16 activations: the MLP's GELU by its GEMM (cuBLASLt's GELU_AUX_BIAS), one per layer */
    const int gelu_folds = c.model.type == JDT_MODEL_GPT && c.model.activation == JDT_ACT_GELU &&
                                   c.precision.activations == JDT_DTYPE_BF16
                               ? c.model.n_layer
                               : 0;
    ck_assert_int_eq(jdt_step_stats(s)->n_gelu_epilogues, gelu_folds);
    /* and its backward by the GEMM computing its cotangent (cuBLASLt's DGELU) */
    ck_assert_int_eq(jdt_step_stats(s)->n_dgelu_epilogues, gelu_folds);
    /* which, with the fc bias, also sums it into the bias gradient (DGELU_BGRAD) */
    ck_assert_int_eq(jdt_step_stats(s)->n_dgelu_bgrads, c.model.bias ? gelu_folds : 0);
    /* so xhat has no reader but the forward's affine, which the norm then applies itself */
    ck_assert_int_eq(jdt_step_stats(s)->n_norm_affines_folded,
                     c.model.type == JDT_MODEL_MLP ? 0 : 2 * c.model.n_layer + 1);
    /* bf16 activations: every linear and the head store bf16 outputs from the GEMM (6 per
     * layer: q, k, v, o, fc, proj; SwiGLU's 7: gate and up for fc; o and proj not when the
     * residual add takes them unrounded), the attention forward and backward read q, k, v (with
     * RoPE: RoPE stores bf16 q and k for them, passes.c fold_rope_attention) and the
     * cross-entropy forward and backward the logits as bf16, the GEMM computing the MLP
     * product's cotangent stores it as bf16 (one per layer), and RoPE reads bf16 q and k and its
     * backward stores their cotangents as bf16 (4; with q and k biases, Qwen2's, the attention
     * stores them rotated, the bias gradients reading its partial sums: passes.c rotated_sums) */
    const bool rope = c.model.pos == JDT_POS_ROPE;
    const int per_layer = (c.model.activation == JDT_ACT_SWIGLU ? 7 : 6) + (rope ? 6 : 2) + 1;
    if (strstr(MODELS[i].name, "bf16act"))
        ck_assert_int_eq(jdt_step_stats(s)->n_bf16_folded,
                         per_layer * c.model.n_layer + 3 - residual_folds);
    else
        ck_assert_int_eq(jdt_step_stats(s)->n_bf16_folded, 0);
    jdt_step_free(s);
    jdt_device_close(d);
    jdt_config_free(&c);
}
END_TEST

/* Padded rows (fuse.c mark_pitched_rows): the logits and dlogits of a vocabulary whose rows are
 * not a multiple of 16 bytes (250 values: 500 bytes in bf16, 1000 in f32) are padded, both, in
 * f32, bf16 compute and bf16 activations; rows that are such a multiple (256 in bf16, 252 in
 * f32) are not, nor anything with JDT_GEMM_PITCH=0. The numbers are cuda_emu.sh's. */
/* The elementwise kernels' index width (emit.c needs_wide): 32-bit indices up to one
 * grid-stride step (4096 blocks of 256 threads, 2^20) below 2^31 elements, 64-bit from there:
 * 2^31 - 2^19 - 1 elements fit an int32_t, but the last step of t += 2^20 past them does not
 * (it wrapped to a negative index, which passed the loop's test). Emit only: nothing this size
 * is allocated. */
START_TEST(test_nvrtc_index_width)
{
    static const struct {
        int64_t n;
        const char *loop;
    } CASES[] = {
        {((int64_t)1 << 31) - ((int64_t)1 << 21) - 1, "for (int32_t t = "},
        {((int64_t)1 << 31) - ((int64_t)1 << 19) - 1, "for (int64_t t = "},
        {((int64_t)1 << 31) + 1, "for (int64_t t = "},
    };
    jdt_device *d = NULL;
    jdt_err e;
    jdt_err_clear(&e);
    ck_assert_int_eq(jdt_device_open_emit_only(&d, &e), JDT_OK);
    for (int i = 0; i < (int)(sizeof CASES / sizeof CASES[0]); i++) {
        fx f;
        fx_init(&f);
        jdt_tensor *x = jdt_graph_input(f.g, "x", JDT_DTYPE_F32, 1, &CASES[i].n, NULL);
        out(&f, jdt_graph_add_scalar(f.g, jdt_graph_mul_scalar(f.g, x, 2.0), 1.0));
        jdt_compile_opts o;
        fx_opts(&f, &o);
        o.device = d;
        jdt_program *p = NULL;
        ck_assert_msg(jdt_program_compile(f.g, &o, &p, &e) == JDT_OK, "compile: %s", e.msg);
        const char *src = jdt_program_source(p);
        ck_assert_msg(strstr(src, CASES[i].loop) != NULL, "%lld elements: no '%s' in\n%s",
                      (long long)CASES[i].n, CASES[i].loop, src);
        jdt_program_free(p);
        fx_free(&f);
    }
    jdt_device_close(d);
}
END_TEST

START_TEST(test_nvrtc_pitched_logits)
{
    static const struct {
        const char *over[3];
        int want;
    } CASES[] = {
        {{"precision.compute=bf16", "precision.activations=bf16", "model.vocab_size=250"}, 2},
        {{"model.vocab_size=250", NULL}, 2},
        {{"precision.compute=bf16", "model.vocab_size=250", NULL}, 2},
        {{"precision.compute=bf16", "precision.activations=bf16", "model.vocab_size=256"}, 0},
        {{"model.vocab_size=252", NULL}, 0},
    };
    jdt_device *d = NULL;
    jdt_err e;
    jdt_err_clear(&e);
    ck_assert_int_eq(jdt_device_open_emit_only(&d, &e), JDT_OK);
    for (int i = 0; i < (int)(sizeof CASES / sizeof CASES[0]); i++)
        for (int off = 0; off < 2; off++) {
            char *over[3];
            int n = 0;
            for (int k = 0; k < 3 && CASES[i].over[k]; k++)
                over[n++] = (char *)CASES[i].over[k];
            jdt_config c;
            ck_assert_msg(jdt_config_load_string(GPT, "test", n, over, NULL, &c, &e) == JDT_OK,
                          "%s", e.msg);
            if (off) setenv("JDT_GEMM_PITCH", "0", 1);
            jdt_step *s = make_step(&c, d, "/tmp/jdt-check-cuda-unused");
            unsetenv("JDT_GEMM_PITCH");
            ck_assert_msg(jdt_step_stats(s)->n_pitched == (off ? 0 : CASES[i].want),
                          "case %d%s: %d values with padded rows", i,
                          off ? " (JDT_GEMM_PITCH=0)" : "", jdt_step_stats(s)->n_pitched);
            jdt_step_free(s);
            jdt_config_free(&c);
        }
    jdt_device_close(d);
}
END_TEST

/* The step of GPT (with overrides over, NULL-terminated, at most 8) planned for the emit-only
 * CUDA device d, with environment variable env ("VAR=value", or NULL) set while it compiles. */
static jdt_step *plan_gpt(jdt_device *d, const char *const *over, const char *env)
{
    char *ov[8], var[64] = "";
    int n = 0;
    for (int k = 0; k < 8 && over[k]; k++)
        ov[n++] = (char *)over[k];
    jdt_config c;
    jdt_err e;
    jdt_err_clear(&e);
    ck_assert_msg(jdt_config_load_string(GPT, "test", n, ov, NULL, &c, &e) == JDT_OK, "%s", e.msg);
    if (env) {
        snprintf(var, sizeof var, "%s", env);
        char *eq = strchr(var, '=');
        *eq = '\0';
        setenv(var, eq + 1, 1);
    }
    jdt_step *s = make_step(&c, d, "/tmp/jdt-check-cuda-unused");
    if (var[0]) unsetenv(var);
    jdt_config_free(&c);
    return s;
}

#define BF16_ACT "precision.compute=bf16", "precision.activations=bf16"
#define LLAMA "model.norm=rmsnorm", "model.pos=rope", "model.activation=swiglu", "model.bias=false"

/* bf16 cotangents where autocast has them. dO (passes.c fold_attention_dout16): the output
 * projection's backward GEMM stores it as bf16 for each layer's attention backward (here 2)
 * exactly where the tensor-core kernels read it so: bf16 compute with bf16 q, k, v (bf16
 * activations; Llama's q and k through RoPE too), a head size up to 128; not in f32, not with
 * f32 activations, not for heads of 136, not with JDT_ATTENTION_DOUT16=0 or the FMA attention
 * (JDT_CUK_ATTENTION=fma). With it, the backward reads o's bf16 copy and the forward stores no
 * f32 o (fold_attention_o16), unless JDT_ATTENTION_O16=0 or the copy or the saved
 * log-sum-exp it builds on is off. dy (fold_norm_dy16): a norm backward in its partial-sums
 * form reads it as bf16 where one bf16-compute GEMM with nothing added computed it for it
 * alone: GPT's ln2 of each layer (the fc's dX) and the final norm (the lm head's dX), 3 here,
 * with bf16 or f32 activations; Llama's final norm only. dy terms (fold_norm_dy_terms): a norm
 * backward whose dy sums several such GEMMs' products reads each as bf16: GPT's ln1 of each
 * layer (the q, k and v projections' dX), 2 here; Llama's ln1 and ln2 (the gate's and the up
 * projection's dX), 4. None in f32, with JDT_NORM_DY16=0, JDT_NORM_DY_TERMS=0 (terms only) or
 * without the partial-sums form (JDT_NORM_FOLDS=0). */
START_TEST(test_nvrtc_bf16_cotangents)
{
    static const struct {
        const char *over[8];
        const char *env;        /* "VAR=value" set for this case, or NULL */
        int dout, o, dy, terms; /* the counts wanted */
    } CASES[] = {
        {{BF16_ACT, NULL}, NULL, 2, 2, 3, 2},
        {{BF16_ACT, LLAMA, NULL}, NULL, 2, 2, 1, 4},
        /* grouped-query: k reaches the attention through RoPE and the broadcast repeating it */
        {{BF16_ACT, LLAMA, "model.n_kv_head=2", NULL}, NULL, 2, 2, 1, 4},
        {{BF16_ACT, NULL}, "JDT_ATTENTION_DOUT16=0", 0, 0, 3, 2},
        {{BF16_ACT, NULL}, "JDT_ATTENTION_O16=0", 2, 0, 3, 2},
        {{BF16_ACT, NULL}, "JDT_ATTENTION_LSE=0", 2, 0, 3, 2},
        {{BF16_ACT, NULL}, "JDT_ATTENTION_COPY=0", 2, 0, 3, 2},
        {{BF16_ACT, NULL}, "JDT_CUK_ATTENTION=fma", 0, 0, 3, 2},
        {{BF16_ACT, NULL}, "JDT_NORM_DY16=0", 2, 2, 0, 0},
        {{BF16_ACT, NULL}, "JDT_NORM_DY_TERMS=0", 2, 2, 3, 0},
        {{BF16_ACT, LLAMA, NULL}, "JDT_NORM_DY_TERMS=0", 2, 2, 1, 0},
        {{BF16_ACT, NULL}, "JDT_NORM_FOLDS=0", 2, 2, 0, 0},
        {{BF16_ACT, "model.n_embd=272", "model.n_head=2", NULL}, NULL, 0, 0, 3, 2},
        {{"precision.compute=bf16", NULL}, NULL, 0, 0, 3, 2},
        {{NULL}, NULL, 0, 0, 0, 0},
    };
    jdt_device *d = emit_only_device();
    for (int i = 0; i < (int)(sizeof CASES / sizeof CASES[0]); i++) {
        jdt_step *s = plan_gpt(d, CASES[i].over, CASES[i].env);
        const jdt_compile_stats *st = jdt_step_stats(s);
        ck_assert_msg(st->n_attention_dout16 == CASES[i].dout &&
                          st->n_attention_o16 == CASES[i].o && st->n_norm_dy16 == CASES[i].dy &&
                          st->n_norm_dy_terms == CASES[i].terms,
                      "case %d: bf16 dO %d (want %d), o %d (want %d), norm dy %d (want %d), dy "
                      "terms %d (want %d)",
                      i, st->n_attention_dout16, CASES[i].dout, st->n_attention_o16, CASES[i].o,
                      st->n_norm_dy16, CASES[i].dy, st->n_norm_dy_terms, CASES[i].terms);
        jdt_step_free(s);
    }
    jdt_device_close(d);
}
END_TEST

/* ---- on a GPU ---------------------------------------------------------------------------------
 */

/* Opens GPU 0, or prints why not and returns NULL. */
/* fx_check_steps (the interpreter comparison) is not used here */
__attribute__((unused)) static void (*const unused_fx_check)(void) = (void (*)(void))fx_check_steps;

static jdt_device *gpu_or_skip(const char *test)
{
#ifdef JDT_CUDA
    int n = 0;
    cudaError_t ce = cudaGetDeviceCount(&n);
    if (ce != cudaSuccess || n == 0) {
        printf("SKIP check_cuda: %s: no GPU (%s)\n", test,
               ce != cudaSuccess ? cudaGetErrorString(ce) : "no CUDA device");
        return NULL;
    }
    jdt_device *d = NULL;
    jdt_err e;
    jdt_err_clear(&e);
    jdt_status st = jdt_device_open(JDT_DEVICE_CUDA, 0, NULL, &d, &e);
    ck_assert_msg(st == JDT_OK, "open cuda:0: %s", e.msg);
    return d;
#else
    printf("SKIP check_cuda: %s: this build has no CUDA (make CUDA=1)\n", test);
    return NULL;
#endif
}

/* Runs graph i on device d and on the CPU backend from the same leaves (2 runs), comparing
 * every output and, after a pull, every leaf. Closes d. */
static void graph_vs_cpu(int i, jdt_device *d)
{
    fx f;
    fx_init(&f);
    GRAPHS[i].build(&f);
    fx_fill(&f, 11);
    jdt_err e;
    jdt_err_clear(&e);
    jdt_compile_opts oc, og;
    fx_opts(&f, &oc);
    fx_opts(&f, &og);
    og.device = d;
    jdt_program *pc = NULL, *pg = NULL;
    ck_assert_msg(jdt_program_compile(f.g, &oc, &pc, &e) == JDT_OK, "cpu: %s", e.msg);
    ck_assert_msg(jdt_program_compile(f.g, &og, &pg, &e) == JDT_OK, "cuda: %s", e.msg);
    if (GRAPHS[i].build == build_norm_dy_terms) /* the fold the graph is there for */
        ck_assert_int_eq(jdt_program_stats(pg)->n_norm_dy_terms, 1);
    for (int step = 0; step < 2; step++) {
        fx_bind(&f, false);
        ck_assert_msg(jdt_program_run(pc, &e) == JDT_OK, "cpu run: %s", e.msg);
        fx_bind(&f, true);
        ck_assert_msg(jdt_program_run(pg, &e) == JDT_OK, "cuda run %s: %s", GRAPHS[i].name, e.msg);
        for (int k = 0; k < jdt_graph_n_outputs(f.g); k++) {
            jdt_tensor *t = jdt_graph_output(f.g, k);
            size_t nb = (size_t)jdt_shape_numel(&t->shape) * jdt_dtype_size(t->dtype);
            void *got = malloc(nb + 8);
            ck_assert_msg(jdt_program_read_output(pg, k, got, nb, &e) == JDT_OK, "read: %s", e.msg);
            char what[160];
            snprintf(what, sizeof what, "%s step %d output %d (%s)", GRAPHS[i].name, step, k,
                     jdt_op_name(t->op));
            fx_compare(what, got, jdt_program_output(pc, k), t->dtype, jdt_shape_numel(&t->shape),
                       GRAPHS[i].rtol, GRAPHS[i].atol);
            free(got);
        }
    }
    ck_assert_msg(jdt_device_pull(d, &e) == JDT_OK, "pull: %s", e.msg);
    for (int l = 0; l < f.n; l++)
        fx_compare(f.leaf[l]->name, f.jit[l], f.ref[l], f.leaf[l]->dtype,
                   jdt_shape_numel(&f.leaf[l]->shape), GRAPHS[i].rtol, GRAPHS[i].atol);
    jdt_program_free(pc);
    jdt_program_free(pg);
    jdt_device_close(d);
    fx_free(&f);
}

START_TEST(test_gpu_ops_match_cpu)
{
    jdt_device *d = gpu_or_skip(GRAPHS[_i].name);
    if (d) graph_vs_cpu(_i, d);
}
END_TEST

/* The index in GRAPHS of the graph named name (it must be there). */
static int graph_named(const char *name)
{
    int i = 0;
    while (strcmp(GRAPHS[i].name, name) != 0)
        i++;
    return i;
}

/* f holds graph i of GRAPHS, its inputs filled from seed and bound for the JIT. */
static void graph_fx(fx *f, int i, uint64_t seed)
{
    fx_init(f);
    GRAPHS[i].build(f);
    fx_fill(f, seed);
    fx_bind(f, true);
}

/* Every output of programs a and b of graph g is the same bytes. */
static void outputs_bitwise(jdt_graph *g, const jdt_program *a, const jdt_program *b,
                            const char *what)
{
    jdt_err e;
    jdt_err_clear(&e);
    for (int k = 0; k < jdt_graph_n_outputs(g); k++) {
        jdt_tensor *t = jdt_graph_output(g, k);
        size_t nb = (size_t)jdt_shape_numel(&t->shape) * jdt_dtype_size(t->dtype);
        unsigned char *x = malloc(nb + 8), *y = malloc(nb + 8);
        ck_assert_msg(jdt_program_read_output(a, k, x, nb, &e) == JDT_OK, "read: %s", e.msg);
        ck_assert_msg(jdt_program_read_output(b, k, y, nb, &e) == JDT_OK, "read: %s", e.msg);
        ck_assert_msg(memcmp(x, y, nb) == 0, "output %d (%s): %s", k, jdt_op_name(t->op), what);
        free(x);
        free(y);
    }
}

/* Merged launches (merge.c) compute bit for bit what one launch per kernel does: the graphs
 * with the most independent neighbours (reductions split and not, the optimizer's shape). */
START_TEST(test_gpu_merged_launches_bitwise)
{
    static const char *const names[] = {"shape_reduce", "optimizer"};
    const int i = graph_named(names[_i]);
    jdt_device *d = gpu_or_skip(names[_i]);
    if (!d) return;
    fx f;
    graph_fx(&f, i, 5);
    jdt_err e;
    jdt_err_clear(&e);
    jdt_program *p[2] = {NULL, NULL};
    for (int m = 0; m < 2; m++) {
        jdt_compile_opts o;
        fx_opts(&f, &o);
        o.device = d;
        o.no_merge_launches = m == 1;
        ck_assert_msg(jdt_program_compile(f.g, &o, &p[m], &e) == JDT_OK, "compile: %s", e.msg);
        ck_assert_msg(jdt_program_run(p[m], &e) == JDT_OK, "run: %s", e.msg);
    }
    ck_assert_int_gt(jdt_program_stats(p[0])->n_launch_merged, 0);
    ck_assert_int_eq(jdt_program_stats(p[1])->n_launch_merged, 0);
    char what[64];
    snprintf(what, sizeof what, "%s: merged launches differ", names[_i]);
    outputs_bitwise(f.g, p[0], p[1], what);
    jdt_program_free(p[0]);
    jdt_program_free(p[1]);
    jdt_device_close(d);
    fx_free(&f);
}
END_TEST

/* The steps' spans a profiled run reports (jdt_compile_opts.trace). */
typedef struct {
    int n;           /* spans so far */
    double last_end; /* where the last span of this run ended */
    bool fresh;      /* no span of this run yet */
    bool ordered;    /* each span ends at or after its start, the next starts where it ended */
} spans;
static void span_hook(void *ctx, const char *name, double t0, double t1)
{
    spans *sp = ctx;
    if (t1 < t0 || (!sp->fresh && t0 != sp->last_end)) sp->ordered = false;
    sp->fresh = false;
    sp->last_end = t1;
    sp->n++;
}

/* A profiled run on the GPU times its steps by events behind each step (the backend's marks),
 * without a wait per step: the spans are back to back (each starts where the last ended, by
 * the device's clock), the profile's kinds add up to its time per run, and the outputs are
 * those of an unprofiled run bit for bit. */
START_TEST(test_gpu_profile_marks)
{
    jdt_device *d = gpu_or_skip("profile marks");
    if (!d) return;
    const int i = graph_named("builtins");
    fx f;
    graph_fx(&f, i, 3);
    jdt_err e;
    jdt_err_clear(&e);
    spans sp = {.fresh = true, .ordered = true};
    jdt_program *p[2] = {NULL, NULL};
    for (int m = 0; m < 2; m++) {
        jdt_compile_opts o;
        fx_opts(&f, &o);
        o.device = d;
        o.profile = m == 1;
        o.trace = m == 1 ? span_hook : NULL;
        o.trace_ctx = &sp;
        ck_assert_msg(jdt_program_compile(f.g, &o, &p[m], &e) == JDT_OK, "compile: %s", e.msg);
    }
    int per_run = -1;
    for (int r = 0; r < 3; r++) {
        ck_assert_msg(jdt_program_run(p[0], &e) == JDT_OK, "run: %s", e.msg);
        const int n0 = sp.n;
        ck_assert_msg(jdt_program_run(p[1], &e) == JDT_OK, "profiled run: %s", e.msg);
        ck_assert_int_gt(sp.n - n0, 0);
        if (per_run < 0) per_run = sp.n - n0;
        ck_assert_int_eq(sp.n - n0, per_run);
        char what[64];
        snprintf(what, sizeof what, "run %d: profiling changed it", r);
        outputs_bitwise(f.g, p[0], p[1], what);
        sp.fresh = true; /* the next run starts anew, after its own wait */
    }
    ck_assert_msg(sp.ordered, "the profiled steps' spans are not back to back");
    char prof[8192];
    jdt_program_profile(p[1], prof, sizeof prof);
    double per_ms = 0.0, sum_ms = 0.0;
    int runs = 0;
    ck_assert_msg(sscanf(prof, "%d runs, %lf ms per run", &runs, &per_ms) == 2, "%s", prof);
    ck_assert_int_eq(runs, 3);
    for (const char *l = strchr(prof, '\n'); l && l[1]; l = strchr(l + 1, '\n')) {
        double pct, ms;
        if (sscanf(l + 1, " %lf%% %lf ms", &pct, &ms) != 2) break; /* the GEMM table */
        sum_ms += ms;
    }
    ck_assert_msg(per_ms > 0 && fabs(sum_ms - per_ms) <= 0.002 * 40 + 1e-3 * per_ms,
                  "kinds add to %.3f ms of %.3f:\n%s", sum_ms, per_ms, prof);
    jdt_program_free(p[0]);
    jdt_program_free(p[1]);
    jdt_device_close(d);
    fx_free(&f);
}
END_TEST

static void fill_batch(const jdt_config *c, int k, int32_t *xi, float *xf, int32_t *y)
{
    uint32_t s = 12345u + 7919u * (uint32_t)k;
    if (c->model.type == JDT_MODEL_MLP) {
        for (int r = 0; r < c->data.batch_size; r++) {
            for (int j = 0; j < c->model.in_dim; j++) {
                s = s * 1664525u + 1013904223u;
                xf[r * c->model.in_dim + j] = (float)(s >> 8) / 16777216.0f - 0.5f;
            }
            y[r] = r % c->model.n_classes;
        }
        return;
    }
    int n = c->data.batch_size * c->model.seq_len;
    for (int j = 0; j < n; j++) {
        s = s * 1664525u + 1013904223u;
        xi[j] = (int32_t)((s >> 8) % (uint32_t)c->model.vocab_size);
        y[j] = (xi[j] + 1) % c->model.vocab_size;
    }
}

/* Trains model i for 8 steps on device d and on the CPU backend: losses and gradient norms
 * step by step, then (params) every parameter and moment after a pull. Closes d. */
static void model_vs_cpu(int i, jdt_device *d, double rtol, bool params)
{
    jdt_config c;
    load_model(i, &c);
    char cache[] = "/tmp/jdt-check-cuda-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(cache));
    jdt_step *sc = make_step(&c, NULL, cache), *sg = make_step(&c, d, cache);
    /* bf16 storage on the device too (the CPU's count may differ: it folds scatter-adds) */
    printf("check_cuda: %s: bf16-stored values cpu %d, cuda %d\n", MODELS[i].name,
           jdt_step_stats(sc)->n_bf16_stored, jdt_step_stats(sg)->n_bf16_stored);
    if (strstr(MODELS[i].name, "bf16")) ck_assert_int_gt(jdt_step_stats(sg)->n_bf16_stored, 0);
    /* bf16 compute: both steps read every GEMM weight through one CAST to bf16 (the cast form);
     * the device's GEMMs take the bf16 copies as stored operands */
    ck_assert_int_eq(n_bf16_casts(sg), n_bf16_casts(sc));
    if (strstr(MODELS[i].name, "bf16")) ck_assert_int_gt(n_bf16_casts(sg), 0);
    /* bf16 activations: the casts folded into the GEMMs, attention and cross-entropy of the
     * device and of the CPU (passes.c fold_bf16_casts; the device's GEMMs that
     * add the residual take some of its GEMM folds' place, so neither count bounds the other) */
    if (strstr(MODELS[i].name, "bf16act")) {
        ck_assert_int_gt(jdt_step_stats(sc)->n_bf16_folded, 0);
        ck_assert_int_gt(jdt_step_stats(sg)->n_bf16_folded, 0);
    } else {
        ck_assert_int_eq(jdt_step_stats(sc)->n_bf16_folded, 0);
    }
    /* the residual adds of bf16 branch outputs: by the GEMMs unless JDT_RESIDUAL_GEMM=0 */
    if (strstr(MODELS[i].name, "bf16act"))
        ck_assert_int_eq(jdt_step_stats(sg)->n_residual_gemms,
                         getenv("JDT_RESIDUAL_GEMM") ? 0 : 2 * c.model.n_layer);
    /* the fused classifier on both (the CPU's since session 51; JDT_FUSED_XENT=0: the two
     * builtins) */
    ck_assert_int_eq(jdt_step_stats(sc)->n_xent_fused, getenv("JDT_FUSED_XENT") ? 0 : 1);
    ck_assert_int_eq(jdt_step_stats(sg)->n_xent_fused, getenv("JDT_FUSED_XENT") ? 0 : 1);
    ck_assert_int_eq(jdt_step_stats(sc)->n_attention_copies, 0);
    /* the attention backward's cotangent form on the device only (JDT_ATTENTION_GRADS=0: the
     * packed output): the parameters below then come from its copies and partial sums */
    ck_assert_int_eq(jdt_step_stats(sc)->n_attention_cotangents, 0);
    /* the forward's log-sum-exp kept for the backward on both (the CPU's since session 48) */
    const int n_lse =
        c.model.type == JDT_MODEL_MLP || getenv("JDT_ATTENTION_LSE") ? 0 : c.model.n_layer;
    ck_assert_int_eq(jdt_step_stats(sc)->n_attention_lse, n_lse);
    ck_assert_int_eq(jdt_step_stats(sg)->n_attention_lse, n_lse);
    ck_assert_int_eq(
        jdt_step_stats(sg)->n_attention_cotangents,
        c.model.type == JDT_MODEL_MLP || getenv("JDT_ATTENTION_GRADS") ? 0 : c.model.n_layer);
    /* grouped-query models: k and v read unrepeated on the device (passes.c
     * fold_attention_groups), the backward's grouped dk and dv behind every parameter below */
    const bool gqa = c.model.n_kv_head && c.model.n_kv_head != c.model.n_head;
    ck_assert_int_eq(jdt_step_stats(sc)->n_attention_groups, 0);
    ck_assert_int_eq(jdt_step_stats(sg)->n_attention_groups, gqa ? 2 * c.model.n_layer : 0);
    size_t n = (size_t)c.data.batch_size *
               (size_t)(c.model.type == JDT_MODEL_MLP ? c.model.in_dim : c.model.seq_len);
    int32_t *xi = calloc(n, 4), *y = calloc(n, 4);
    float *xf = calloc(n, 4);
    jdt_err e;
    jdt_err_clear(&e);
    double first_c = 0, last_c = 0;
    for (int k = 0; k < 8; k++) {
        fill_batch(&c, k, xi, xf, y);
        const void *x = c.model.type == JDT_MODEL_MLP ? (const void *)xf : (const void *)xi;
        double lc, lg, gc, gg;
        ck_assert_msg(jdt_step_run(sc, k, jdt_train_lr(&c, k), x, y, &lc, &gc, &e) == JDT_OK,
                      "cpu step %d: %s", k, e.msg);
        ck_assert_msg(jdt_step_run(sg, k, jdt_train_lr(&c, k), x, y, &lg, &gg, &e) == JDT_OK,
                      "cuda step %d: %s", k, e.msg);
        printf("check_cuda: %s step %d loss cpu %.6f cuda %.6f, grad norm %.5f / %.5f\n",
               MODELS[i].name, k, lc, lg, gc, gg);
        ck_assert_msg(fabs(lc - lg) <= rtol * fabs(lc) + 1e-4,
                      "%s step %d: loss cpu %.6f vs cuda %.6f", MODELS[i].name, k, lc, lg);
        ck_assert_msg(fabs(gc - gg) <= 10 * rtol * fabs(gc) + 1e-4,
                      "%s step %d: grad norm cpu %.6f vs cuda %.6f", MODELS[i].name, k, gc, gg);
        if (k == 0) first_c = lc;
        last_c = lc;
    }
    ck_assert_msg(last_c < first_c, "%s: the loss did not fall (%g -> %g)", MODELS[i].name, first_c,
                  last_c);
    /* the device's parameters come back to the host (checkpoints) and agree with the CPU's */
    ck_assert_msg(jdt_step_sync_host(sg, &e) == JDT_OK, "pull: %s", e.msg);
    for (int t = 0; params && t < jdt_step_n_tensors(sc); t++) {
        const char *name, *name2;
        float *a, *b;
        jdt_shape sh;
        jdt_step_tensor(sc, t, &name, &a, &sh);
        jdt_step_tensor(sg, t, &name2, &b, &sh);
        fx_compare(name, b, a, JDT_DTYPE_F32, jdt_shape_numel(&sh), 10 * rtol, rtol);
    }
    free(xi);
    free(xf);
    free(y);
    jdt_step_free(sc);
    jdt_step_free(sg);
    jdt_device_close(d);
    jdt_config_free(&c);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", cache);
    ck_assert_int_eq(system(cmd), 0);
}

START_TEST(test_gpu_train_matches_cpu)
{
    /* f32 GEMMs in full FP32 (JDT_CUDA_TF32=0): with TF32, AdamW turns the GEMMs' 1e-3 noise on
     * near-zero gradients into whole steps of lr (seen: 3e-3 on a wte element after 8 steps),
     * past any tolerance that would still catch a wrong update; bf16: the GEMMs round at the
     * CPU's points, the attention's rounding points differ in the forward (docs/backend.md) */
    setenv("JDT_CUDA_TF32", "0", 1);
    jdt_device *d = gpu_or_skip(MODELS[_i].name);
    unsetenv("JDT_CUDA_TF32");
    bool bf16 = strstr(MODELS[_i].name, "bf16") != NULL;
    /* the parameters are compared where the device rounds where the CPU does: bf16 activations'
     * residual adds take the branch output unrounded on the device (passes.c
     * fold_residual_gemms), and with bf16 compute the device stores the attention backward's
     * dO and o and the norm backwards' dy as bf16 (fold_attention_dout16, fold_attention_o16,
     * fold_norm_dy16: autocast's rounding points, not the CPU's; JDT_NORM_DY16=0 also turns
     * off fold_norm_dy_terms, which the norm_dy_terms graph checks), so the models comparing
     * parameters turn those folds off; gpt2-bf16act-bias, which compares losses and gradient
     * norms only, keeps them all */
    /* llama-gqa-bf16act compares losses and gradient norms only: its parameters' noise is
     * llama-bf16act's (AdamW moves an element whose gradient is rounding noise by up to lr a
     * step, either way: seen 0.005 there, 0.8 of the tolerance, and 0.0057 here on one of
     * 98784 elements, 1.1 of it), and llama-gqa compares the same model's parameters in f32 */
    const bool params = !strstr(MODELS[_i].name, "-bias") && !strstr(MODELS[_i].name, "gqa-bf16");
    if (params && strstr(MODELS[_i].name, "bf16act")) setenv("JDT_RESIDUAL_GEMM", "0", 1);
    if (params && bf16) {
        setenv("JDT_ATTENTION_DOUT16", "0", 1);
        setenv("JDT_NORM_DY16", "0", 1);
    }
    if (d) model_vs_cpu(_i, d, bf16 ? 5e-3 : 2e-3, params);
    unsetenv("JDT_RESIDUAL_GEMM");
    unsetenv("JDT_ATTENTION_DOUT16");
    unsetenv("JDT_NORM_DY16");
}
END_TEST

/* TF32 GEMMs (the default for f32): losses and gradient norms step by step (parameters: see
 * above) for the GPT and its dropout + accumulation variant. */
START_TEST(test_gpu_train_tf32_matches_cpu)
{
    jdt_device *d = gpu_or_skip("tf32");
    if (d) model_vs_cpu(_i == 0 ? 0 : 2, d, 2e-3, false);
}
END_TEST

/* ---- collectives overlapping compute (STEP_COLL_PACK / START / WAIT) ------------------------
 * An FSDP-style step of 3 layers, h = tanh(h @ all_gather(W_l) + b_l), loss = sum(h^2): the
 * weights gathered along axis 0 (layers 0, 2) or axis 1 (layer 1: outer > 1, the permuted block
 * order), their gradients reduce-scattered (the gather's VJP), the bias gradients all-reduced
 * (the data-parallel mean over one rank), the loss max-all-reduced,
 * every parameter updated by SGD. Run blocking, with start/wait, and with start/wait and
 * buckets: the results must be bitwise equal, the window between a start and its wait never
 * touching the collective's buffer. */

#ifdef JDT_CUDA /* the GPU test below; the CPU build has no overlap test here */
#define OVL_PARAMS (3 * (64 + 8))
static int g_ovl_pending;

/* The host's collective for a group of one rank (the CPU reference run): the identity. */
static jdt_status one_rank_coll(void *ctx, int group, int kind, jdt_dtype dt, void *buf, size_t n,
                                jdt_err *e)
{
    (void)ctx, (void)group, (void)kind, (void)buf, (void)n, (void)e;
    ck_assert_int_eq(dt, JDT_DTYPE_F32);
    return JDT_OK;
}

typedef struct {
    int kind;
    float *buf, *snap;
    size_t n;
} ovl_work;

/* start: a snapshot of the buffer; wait: it must be unchanged, then the collective runs. */
static jdt_status ovl_start(void *ctx, int group, int kind, jdt_dtype dt, void *buf, size_t n,
                            void **handle, jdt_err *e)
{
    ovl_work *w = malloc(sizeof *w);
    ck_assert_ptr_nonnull(w);
    *w = (ovl_work){kind, buf, malloc(n * sizeof(float) + 4), n};
    ck_assert_ptr_nonnull(w->snap);
    memcpy(w->snap, buf, n * sizeof(float));
    g_ovl_pending++;
    *handle = w;
    return JDT_OK;
}

static jdt_status ovl_wait(void *ctx, void *handle, jdt_err *e)
{
    ovl_work *w = handle;
    ck_assert_msg(memcmp(w->buf, w->snap, w->n * sizeof(float)) == 0,
                  "a collective's buffer (%zu floats) was written between its start and wait",
                  w->n);
    jdt_status st = one_rank_coll(ctx, 1, w->kind, JDT_DTYPE_F32, w->buf, w->n, e);
    g_ovl_pending--;
    free(w->snap);
    free(w);
    return st;
}

/* The step for a group of one rank; P[6] its parameters bound to pv, x bound to xv (4, 8). */
static jdt_graph *ovl_graph(float *pv, float *xv)
{
    jdt_graph *g = jdt_graph_new();
    const int64_t xd[2] = {4, 8}, bd[1] = {8};
    jdt_tensor *x = jdt_graph_input(g, "x", JDT_DTYPE_F32, 2, xd, NULL), *h = x, *P[6], *G[6];
    x->data = xv;
    float *next = pv;
    for (int l = 0; l < 3; l++) {
        const int axis = l == 1;
        const int64_t wd[2] = {8, 8};
        char nm[16];
        snprintf(nm, sizeof nm, "w%d", l);
        P[2 * l] = jdt_graph_param(g, nm, JDT_DTYPE_F32, 2, wd, NULL);
        snprintf(nm, sizeof nm, "b%d", l);
        P[2 * l + 1] = jdt_graph_param(g, nm, JDT_DTYPE_F32, 1, bd, NULL);
        P[2 * l]->data = next;
        next += 64;
        P[2 * l + 1]->data = next;
        next += 8;
        jdt_tensor *wg = jdt_graph_all_gather(g, P[2 * l], 1, 1, axis); /* (8, 8) */
        jdt_tensor *z = jdt_graph_matmul(g, h, wg, false, false);
        h = jdt_graph_tanh(g, jdt_graph_add(g, z, jdt_graph_broadcast(g, P[2 * l + 1], 2, xd)));
    }
    jdt_tensor *loss = jdt_graph_reduce_sum(g, jdt_graph_mul(g, h, h), 3u, false);
    jdt_err e;
    ck_assert_int_eq(jdt_autodiff_grad(g, loss, 6, P, G, &e), JDT_OK);
    jdt_graph_add_output(g, loss);
    jdt_graph_add_output(g, jdt_graph_all_reduce(g, loss, 1, 1, 1.0));
    for (int i = 0; i < 6; i++) {
        if (i % 2) G[i] = jdt_graph_all_reduce(g, G[i], 1, 0, 1.0);
        jdt_graph_add_output(g, G[i]);
        jdt_graph_add_update(g, P[i], jdt_graph_sub(g, P[i], jdt_graph_mul_scalar(g, G[i], 0.1)));
    }
    return g;
}

/* Two runs of the step on device d (NULL: the CPU) with schedule `mode` (0 blocking, 1
 * start/wait, 2 start/wait + buckets); out: the outputs of the second run, then the
 * parameters after it. Returns the count; *stats the program's statistics. */
static size_t ovl_run(jdt_device *d, int mode, float *out, jdt_compile_stats *stats)
{
    float pv[OVL_PARAMS], xv[32];
    for (int i = 0; i < OVL_PARAMS; i++)
        pv[i] = 0.05f * (float)((i * 37) % 23 - 11);
    for (int i = 0; i < 32; i++)
        xv[i] = 0.1f * (float)((i * 13) % 17 - 8);
    jdt_graph *g = ovl_graph(pv, xv);
    jdt_compile_opts o;
    jdt_compile_opts_init(&o);
    char cache[] = "/tmp/jdt-check-cuda-ovl-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(cache));
    o.cache_dir = cache;
    o.threads = 1;
    o.device = d;
    o.collective = one_rank_coll;
    if (mode >= 1) {
        o.collective_start = ovl_start;
        o.collective_wait = ovl_wait;
    }
    if (mode == 2) o.bucket_bytes = 1 << 20;
    jdt_program *prog = NULL;
    jdt_err e;
    jdt_err_clear(&e);
    ck_assert_msg(jdt_program_compile(g, &o, &prog, &e) == JDT_OK, "compile: %s", e.msg);
    g_ovl_pending = 0;
    for (int r = 0; r < 2; r++) {
        ck_assert_msg(jdt_program_run(prog, &e) == JDT_OK, "run %d (mode %d): %s", r, mode, e.msg);
        ck_assert_int_eq(g_ovl_pending, 0); /* every start was waited within the run */
    }
    size_t n = 0;
    for (int i = 0; i < jdt_graph_n_outputs(g); i++) {
        const jdt_tensor *t = jdt_graph_output(g, i);
        const size_t nb = (size_t)jdt_shape_numel(&t->shape) * sizeof(float);
        ck_assert_msg(jdt_program_read_output(prog, i, out + n, nb, &e) == JDT_OK, "read: %s",
                      e.msg);
        n += (size_t)jdt_shape_numel(&t->shape);
    }
    if (d) ck_assert_msg(jdt_device_pull(d, &e) == JDT_OK, "pull: %s", e.msg);
    const int n_par = OVL_PARAMS;
    memcpy(out + n, pv, (size_t)n_par * sizeof(float));
    n += (size_t)n_par;
    *stats = *jdt_program_stats(prog);
    jdt_program_free(prog);
    jdt_graph_free(g);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", cache);
    ck_assert_int_eq(system(cmd), 0);
    return n;
}

#define OVL_OUT (2 + 2 * OVL_PARAMS + 8)

/* A one-rank job on loopback (the rendezvous NCCL's unique id travels through). */
static jdt_dist *one_rank_job(void)
{
    int port, lfd = tu_free_listener(&port);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    jdt_dist_opts o;
    jdt_dist_opts_default(&o);
    o.coordinator = addr;
    o.token = "cuda-ovl-test";
    o.coord_listen_fd = lfd;
    o.connect_timeout_s = 20;
    jdt_dist *d = NULL;
    jdt_err e;
    jdt_err_clear(&e);
    ck_assert_msg(jdt_dist_init(&o, &d, &e) == JDT_OK, "dist: %s", e.msg);
    return d;
}

static int rank0_group(void *ctx, int group, int *ranks, int max_ranks)
{
    (void)ctx, (void)group;
    ranks[0] = 0;
    return max_ranks >= 1;
}
#endif /* JDT_CUDA */

/* On a GPU: the same step for a group of one rank, its collectives forced through NCCL
 * (JDT_CUDA_NCCL_SINGLE=1: a one-rank communicator, the only kind one GPU can make), blocking
 * vs started on the communicator's stream and waited by the compute stream: bitwise equal, the
 * CPU within TF32 tolerance, and the NCCL time counted (jdt_device_comm_times). */
START_TEST(test_gpu_overlap_matches_blocking)
{
    jdt_device *probe = gpu_or_skip("overlap");
    if (!probe) return;
    jdt_device_close(probe);
#ifdef JDT_CUDA
    const char *nccl = getenv("JDT_NCCL_LIBRARY"); /* the library cuk_comm.c loads */
    if (!nccl || !*nccl) nccl = "libnccl.so.2";
    if (!dlopen(nccl, RTLD_NOW | RTLD_LOCAL)) {
        printf("SKIP check_cuda: overlap: %s not found\n", nccl);
        return;
    }
    setenv("JDT_CUDA_NCCL_SINGLE", "1", 1);
    jdt_dist *dist = one_rank_job();
    float res[3][OVL_OUT], cpu[OVL_OUT];
    jdt_compile_stats st[3], cs;
    size_t n[3];
    double waited = 0, moving = 0;
    jdt_err e;
    jdt_err_clear(&e);
    for (int mode = 0; mode < 3; mode++) {
        jdt_device *d = NULL;
        ck_assert_msg(jdt_device_open(JDT_DEVICE_CUDA, 0, NULL, &d, &e) == JDT_OK, "open: %s",
                      e.msg);
        jdt_device_set_dist(d, dist);
        jdt_device_set_groups(d, rank0_group, NULL);
        n[mode] = ovl_run(d, mode, res[mode], &st[mode]);
        ck_assert(jdt_device_comm_times(d, &waited, &moving));
        printf("check_cuda: overlap mode %d: NCCL %.3f ms on its stream, compute waited %.3f ms\n",
               mode, moving * 1e3, waited * 1e3);
        ck_assert_msg(moving > 0 && waited >= 0, "NCCL time not counted: %g / %g", moving, waited);
        jdt_device_close(d);
    }
    ck_assert_int_gt(st[1].n_coll_async, 5);
    ck_assert_msg(memcmp(res[1], res[0], n[0] * sizeof(float)) == 0, "start/wait != blocking");
    ck_assert_msg(memcmp(res[2], res[0], n[0] * sizeof(float)) == 0, "buckets != blocking");
    ck_assert_int_eq(ovl_run(NULL, 0, cpu, &cs), n[0]);
    fx_compare("overlap step (gpu vs cpu)", res[0], cpu, JDT_DTYPE_F32, (int64_t)n[0], 2e-3, 2e-3);
    jdt_dist_free(dist);
    unsetenv("JDT_CUDA_NCCL_SINGLE");
#endif
}
END_TEST

/* No GPU: opening the CUDA device is one clear error, never a crash. */
START_TEST(test_no_gpu_is_one_clear_error)
{
#ifdef JDT_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) {
        /* with a GPU: asking for a device past the last is the clear error instead */
        jdt_device *d = NULL;
        jdt_err e;
        jdt_err_clear(&e);
        ck_assert_int_eq(jdt_device_open(JDT_DEVICE_CUDA, n, NULL, &d, &e), JDT_ERR_CONFIG);
        ck_assert_ptr_null(d);
        ck_assert_ptr_nonnull(strstr(e.msg, "GPU"));
        return;
    }
#endif
    jdt_device *d = NULL;
    jdt_err e;
    jdt_err_clear(&e);
    ck_assert_int_eq(jdt_device_open(JDT_DEVICE_CUDA, 0, NULL, &d, &e), JDT_ERR_UNSUPPORTED);
    ck_assert_ptr_null(d);
    ck_assert_msg(strchr(e.msg, '\n') == NULL && strlen(e.msg) > 10, "message: %s", e.msg);
}
END_TEST

/* The CUDA plan's memory (fuse.c, the device's vtable): dlogits take over the logits' buffer
 * where both have one storage type (f32 and f32, or bf16 activations: bf16 and bf16, padded
 * rows or not, fused with the forward or not), not where f32 logits meet bf16 dlogits (bf16
 * compute alone); the eval program runs in the train step's arena. */
START_TEST(test_nvrtc_memory_plan)
{
    static const struct {
        const char *over[8];
        const char *env; /* "VAR=value" set for this case, or NULL */
        int inplace;     /* dlogits over their logits */
    } CASES[] = {
        {{NULL}, NULL, 1},
        {{BF16_ACT, NULL}, NULL, 1},
        {{BF16_ACT, "model.vocab_size=250", NULL}, NULL, 1},
        {{BF16_ACT, NULL}, "JDT_FUSED_XENT=0", 1},
        {{"precision.compute=bf16", NULL}, NULL, 0},
    };
    jdt_device *d = emit_only_device();
    for (int i = 0; i < (int)(sizeof CASES / sizeof CASES[0]); i++) {
        jdt_step *s = plan_gpt(d, CASES[i].over, CASES[i].env);
        const jdt_compile_stats *sm = jdt_step_prog_stats(s, JDT_STEP_PROG_MAIN);
        const jdt_compile_stats *se = jdt_step_prog_stats(s, JDT_STEP_PROG_EVAL);
        ck_assert_msg(sm->n_xent_inplace == CASES[i].inplace,
                      "case %d: %d dlogits in place, not %d", i, sm->n_xent_inplace,
                      CASES[i].inplace);
        ck_assert_msg(se && se->arena_shared, "case %d: the eval program has its own arena", i);
        ck_assert_int_le(se->arena_bytes, sm->arena_bytes);
        /* inspect's "memory peak": the bytes live at once fit the arena, the largest first */
        ck_assert(sm->peak_live_bytes > 0 && sm->peak_live_bytes <= sm->arena_bytes);
        ck_assert(sm->peak_step >= 0 && sm->peak_step < sm->n_steps);
        int64_t sum = 0;
        for (int t = 0; t < 4; t++) {
            sum += sm->peak_top[t].bytes;
            ck_assert(sm->peak_top[t].op[0] || sm->peak_top[t].bytes == 0);
            if (t) ck_assert_int_le(sm->peak_top[t].bytes, sm->peak_top[t - 1].bytes);
        }
        ck_assert(sum > 0 && sum <= sm->peak_live_bytes);
        jdt_step_free(s);
    }
    jdt_device_close(d);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("cuda");
    TCase *tc = tcase_create("nvrtc");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_nvrtc_op_graphs, 0, N_GRAPHS);
    tcase_add_loop_test(tc, test_nvrtc_train_steps, 0, N_MODELS);
    tcase_add_test(tc, test_nvrtc_pitched_logits);
    tcase_add_test(tc, test_nvrtc_index_width);
    tcase_add_test(tc, test_nvrtc_bf16_cotangents);
    tcase_add_test(tc, test_nvrtc_memory_plan);
    tcase_add_test(tc, test_no_gpu_is_one_clear_error);
    suite_add_tcase(s, tc);
#ifdef JDT_CUDA /* a CPU-only build has no GPU path to test (make test-cuda builds one) */
    TCase *tg = tcase_create("gpu");
    tcase_set_timeout(tg, 300);
    tcase_add_loop_test(tg, test_gpu_ops_match_cpu, 0, N_GRAPHS);
    tcase_add_loop_test(tg, test_gpu_merged_launches_bitwise, 0, 2);
    tcase_add_loop_test(tg, test_gpu_train_matches_cpu, 0, N_MODELS);
    tcase_add_loop_test(tg, test_gpu_train_tf32_matches_cpu, 0, 2);
    tcase_add_test(tg, test_gpu_overlap_matches_blocking);
    tcase_add_test(tg, test_gpu_profile_marks);
    suite_add_tcase(s, tg);
#else
    (void)test_gpu_ops_match_cpu;
    (void)test_gpu_merged_launches_bitwise;
    (void)test_gpu_train_matches_cpu;
    (void)test_gpu_train_tf32_matches_cpu;
    (void)test_gpu_overlap_matches_blocking;
    (void)test_gpu_profile_marks;
#endif
    return s;
}

int main(void)
{
    /* the CUDA backend's own attention kernels: cuDNN's only where a test asks for it (the
     * product's default, auto, would try cuDNN against them per shape); GEMMs untimed (the
     * default times each plan's algorithms once: check_cuk and cuda_emu.sh test that) */
    setenv("JDT_CUDNN_ATTENTION", "0", 0);
    setenv("JDT_CUDA_AUTOTUNE", "0", 0);
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
