/*
 * models.c — the gpt and mlp builders (see models.h).
 *
 * gpt, per layer l (pre-norm):
 *   a = norm(h);  q = a Wq, k = a Wk, v = a Wv  (per-head norm of q, k when model.qk_norm;
 *                 rope on q, k);  h += attn(q, k, v) Wo   (q, k, v: heads * head_dim wide)
 *   m = norm(h);  h += gelu(m Wfc) Wproj   |   (silu(m Wgate) * (m Wup)) Wdown
 * then logits = norm(h) Wteᵀ (tied) or norm(h) Whead, loss = mean softmax-xent(logits, y).
 * Linear weights are stored (in, out): y = x @ W. Initialisation follows GPT-2: N(0, init_std)
 * for matrices and embeddings, N(0, init_std / sqrt(2 L)) for the projections that write into
 * the residual stream, zeros for biases, ones for norm weights.
 */
#include "models/models.h"

#include "graph/builder.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    jdt_graph *g;
    const jdt_config *cfg;
    jdt_model *m;
    int cap;
    bool oom;
    bool cast_weights; /* GEMM weights read through a CAST to bf16 (precision.compute: bf16) */
    bool bf16_out;     /* linear and head outputs stored as bf16 (precision.activations: bf16) */
    int seq_ways;      /* ways the mesh splits the sequence (sequence parallelism), else 1 */
} builder;

static jdt_tensor *add_param(builder *b, const char *name, int ndim, const int64_t *dims,
                             const char *const *axes, jdt_init_kind init, double std, bool decay)
{
    if (b->m->n_params == b->cap) {
        int cap = b->cap ? 2 * b->cap : 64;
        jdt_model_param *p = jdt_graph_alloc(b->g, (size_t)cap * sizeof *p);
        if (!p) {
            b->oom = true;
            return NULL;
        }
        if (b->m->n_params) memcpy(p, b->m->params, (size_t)b->m->n_params * sizeof *p);
        b->m->params = p;
        b->cap = cap;
    }
    jdt_tensor *t = jdt_graph_param(b->g, name, JDT_DTYPE_F32, ndim, dims, axes);
    jdt_model_param *p = &b->m->params[b->m->n_params++];
    p->t = t;
    p->init = init;
    p->std = std;
    p->decay = decay;
    return t;
}

/* The weight operand of a GEMM: under precision.compute: bf16 a bf16 copy, built once per
 * step (one CAST per parameter, read by the forward GEMM and by the backward's dX GEMM; its
 * gradient passes through the CAST as f32 to the f32 master weight). */
static jdt_tensor *gemm_weight(builder *b, jdt_tensor *w)
{
    return b->cast_weights ? jdt_graph_cast(b->g, w, JDT_DTYPE_BF16) : w;
}

/* A block's normed input (B, T, C) as the (N, C) rows its column-parallel GEMMs read. Under
 * sequence parallelism that reshape is where T is all-gathered; with bf16 compute the rows are
 * cast to bf16 first, so the gather moves bf16 (Megatron-LM's), the same numbers: the GEMMs
 * round them anyway, and rounding commutes with the gather. The cotangent comes back f32
 * through the CAST and is reduce-scattered in f32. */
static jdt_tensor *gemm_rows(builder *b, jdt_tensor *x, const int64_t *nc)
{
    if (b->seq_ways > 1 && b->cast_weights) x = jdt_graph_cast(b->g, x, JDT_DTYPE_BF16);
    return jdt_graph_reshape(b->g, x, 2, nc);
}

/* t, or its f32 widening when it is bf16 (exact) */
static jdt_tensor *as_f32(jdt_graph *g, jdt_tensor *t)
{
    return t && t->dtype == JDT_DTYPE_BF16 ? jdt_graph_cast(g, t, JDT_DTYPE_F32) : t;
}

/* x (N, in) @ W (in, out) [+ b (out)] -> (N, out). Under precision.activations: bf16 the
 * output is a bf16 node, bf16(x @ W + bf16(b)): PyTorch autocast's linear, whose bias is cast
 * to bf16 too, and what cuBLASLt computes with a bf16 output and bias. The rounded bias is
 * built before the product so that the compiler can fold it into the GEMM (passes.c). Readers
 * that need f32 (attention, RoPE, the loss) widen it (as_f32), which the CUDA compiler folds
 * into their builtins. */
static jdt_tensor *linear_b(builder *b, jdt_tensor *x, const char *prefix, int64_t in, int64_t out,
                            const char *in_axis, const char *out_axis, double std, bool has_bias)
{
    char name[256];
    const int64_t wd[2] = {in, out};
    const char *wa[2] = {in_axis, out_axis};
    snprintf(name, sizeof name, "%s.w", prefix);
    jdt_tensor *w = add_param(b, name, 2, wd, wa, JDT_INIT_NORMAL, std, true);
    jdt_tensor *bias = NULL;
    if (has_bias) {
        const char *ba[1] = {out_axis};
        snprintf(name, sizeof name, "%s.b", prefix);
        bias = add_param(b, name, 1, &out, ba, JDT_INIT_ZEROS, 0, false);
        if (b->bf16_out)
            bias = as_f32(b->g, jdt_graph_cast(b->g, bias, JDT_DTYPE_BF16));
    }
    jdt_tensor *y = jdt_graph_matmul(b->g, x, gemm_weight(b, w), false, false);
    if (bias) y = jdt_graph_add_bcast(b->g, y, bias);
    return b->bf16_out ? jdt_graph_cast(b->g, y, JDT_DTYPE_BF16) : y;
}

/* linear_b with a bias when model.bias */
static jdt_tensor *linear(builder *b, jdt_tensor *x, const char *prefix, int64_t in, int64_t out,
                          const char *in_axis, const char *out_axis, double std)
{
    return linear_b(b, x, prefix, in, out, in_axis, out_axis, std, b->cfg->model.bias);
}

/* The head's logits: bf16 under precision.activations: bf16, read by the loss as f32 (the
 * compiler lets a backend's cross-entropy read the bf16 values directly). */
/* x (rows, C) times the head's weight operand wg (gemm_weight's: (V, C) tied, tb, else (C, V)) */
static jdt_tensor *head_logits(builder *b, jdt_tensor *x, jdt_tensor *wg, bool tb)
{
    jdt_tensor *y = jdt_graph_matmul(b->g, x, wg, false, tb);
    return b->bf16_out ? as_f32(b->g, jdt_graph_cast(b->g, y, JDT_DTYPE_BF16)) : y;
}

/* The concatenation of n tensors along axis, in groups of at most JDT_MAX_INPUTS. */
static jdt_tensor *concat_all(jdt_graph *g, int n, jdt_tensor **xs, int axis)
{
    while (n > 1) {
        int m = 0;
        for (int i = 0; i < n; i += JDT_MAX_INPUTS) {
            int k = n - i < JDT_MAX_INPUTS ? n - i : JDT_MAX_INPUTS;
            xs[m++] = k == 1 ? xs[i] : jdt_graph_concat(g, k, xs + i, axis);
        }
        n = m;
    }
    return xs[0];
}

/*
 * gpt_loss when the mesh splits the sequence k = b->seq_ways ways (`[seq, tensor]`): the rows
 * are never flattened across (B, T), which would gather T (a split of T does not lead the
 * merged B * T), so each rank's head and cross-entropy run on its own T / k positions: the
 * logits are (B, T, V), or with chunks > 1 each slice is (B, k, T / (k chunks), V), a slice of
 * every rank's block (the split of T moves onto the k axis). The per-token losses are the same;
 * their mean sums in another order.
 */
static void gpt_loss_seq(builder *b, jdt_tensor *hn, jdt_tensor *w, bool tb, int64_t B, int chunks)
{
    jdt_graph *g = b->g;
    jdt_model *m = b->m;
    const int64_t T = hn->shape.dims[1], C = hn->shape.dims[2], k = b->seq_ways, Tk = T / k;
    if (chunks <= 1 || Tk < 2) {
        m->logits = head_logits(b, hn, gemm_weight(b, w), tb); /* (B, T, V) */
        m->loss = jdt_graph_reduce_mean(g, jdt_graph_softmax_xent(g, m->logits, m->y), 3u, false);
        return;
    }
    if (chunks > Tk) chunks = (int)Tk;
    const int64_t bktc[4] = {B, k, Tk, C}, bkt[3] = {B, k, Tk};
    jdt_tensor *h4 = jdt_graph_reshape(g, hn, 4, bktc), *y3 = jdt_graph_reshape(g, m->y, 3, bkt);
    jdt_tensor *wg = gemm_weight(b, w);
    jdt_tensor **rows = jdt_graph_alloc(g, (size_t)chunks * sizeof *rows);
    if (!rows) {
        b->oom = true;
        return;
    }
    for (int c = 0; c < chunks; c++) {
        const int64_t lo = Tk * c / chunks, hi = Tk * (c + 1) / chunks;
        jdt_tensor *x = jdt_graph_slice(g, h4, 2, lo, hi), *t = jdt_graph_slice(g, y3, 2, lo, hi);
        rows[c] = jdt_graph_softmax_xent(g, head_logits(b, x, wg, tb), t); /* (B, k, hi - lo) */
    }
    m->loss = jdt_graph_reduce_mean(g, concat_all(g, chunks, rows, 2), 7u, false);
}

/*
 * The loss from the final norm's output hn (B, T, C): the mean cross-entropy of the head's
 * logits. With chunks > 1 (runtime.loss_chunks) the head and the cross-entropy run on that many
 * slices of the sequence, each slice's rows (B, T/chunks) on their own (B * T/chunks, V) logits,
 * and the per-token losses are concatenated before the mean: the same values, and the compiler
 * (passes.c hoist_loss_backwards) runs each slice's backward right after its forward, so one
 * slice's logits are live at a time instead of all N rows'. m->logits is then NULL.
 */
static void gpt_loss(builder *b, jdt_tensor *hn, jdt_tensor *w, bool tb, int64_t B, int chunks)
{
    jdt_graph *g = b->g;
    jdt_model *m = b->m;
    const int64_t T = hn->shape.dims[1], C = hn->shape.dims[2], N = B * T;
    const int64_t n1[1] = {N};
    if (b->seq_ways > 1) {
        gpt_loss_seq(b, hn, w, tb, B, chunks);
        return;
    }
    if (chunks <= 1) {
        const int64_t nc[2] = {N, C};
        jdt_tensor *x = jdt_graph_reshape(g, hn, 2, nc);
        m->logits = head_logits(b, x, gemm_weight(b, w), tb); /* (N, V) */
        jdt_tensor *tgt = jdt_graph_reshape(g, m->y, 1, n1);
        m->loss = jdt_graph_reduce_mean(g, jdt_graph_softmax_xent(g, m->logits, tgt), 1u, false);
        return;
    }
    jdt_tensor *wg = gemm_weight(b, w); /* one bf16 copy read by every slice's GEMMs */
    jdt_tensor **rows = jdt_graph_alloc(g, (size_t)chunks * sizeof *rows);
    if (!rows) {
        b->oom = true;
        return;
    }
    for (int k = 0; k < chunks; k++) {
        const int64_t lo = T * k / chunks, hi = T * (k + 1) / chunks, r = B * (hi - lo);
        const int64_t rc[2] = {r, C}, r1[1] = {r}, bs[2] = {B, hi - lo};
        jdt_tensor *x = jdt_graph_reshape(g, jdt_graph_slice(g, hn, 1, lo, hi), 2, rc);
        jdt_tensor *t = jdt_graph_reshape(g, jdt_graph_slice(g, m->y, 1, lo, hi), 1, r1);
        jdt_tensor *l = jdt_graph_softmax_xent(g, head_logits(b, x, wg, tb), t);
        rows[k] = jdt_graph_reshape(g, l, 2, bs);
    }
    jdt_tensor *all = jdt_graph_reshape(g, concat_all(g, chunks, rows, 1), 1, n1);
    m->loss = jdt_graph_reduce_mean(g, all, 1u, false);
}

/* norm over the last axis of x (..., C) with learned scale (and shift for layernorm+bias) */
static jdt_tensor *norm(builder *b, jdt_tensor *x, const char *prefix, int64_t C)
{
    const jdt_config *cfg = b->cfg;
    char name[256];
    const char *axes[1] = {"norm"}; /* MaxText's name for norm weights: replicated by default */
    jdt_tensor *xn = cfg->model.norm == JDT_NORM_RMSNORM
                         ? jdt_graph_rms_normalize(b->g, x, cfg->model.norm_eps)
                         : jdt_graph_normalize(b->g, x, cfg->model.norm_eps);
    snprintf(name, sizeof name, "%s.w", prefix);
    jdt_tensor *w = add_param(b, name, 1, &C, axes, JDT_INIT_ONES, 0, false);
    jdt_tensor *y = jdt_graph_mul_bcast(b->g, xn, w);
    if (cfg->model.norm == JDT_NORM_LAYERNORM && cfg->model.bias) {
        snprintf(name, sizeof name, "%s.b", prefix);
        jdt_tensor *bias = add_param(b, name, 1, &C, axes, JDT_INIT_ZEROS, 0, false);
        y = jdt_graph_add_bcast(b->g, y, bias);
    }
    return y;
}

static jdt_tensor *dropout(builder *b, jdt_tensor *x, const char *site)
{
    if (!b->m->step) return x;
    uint64_t key = jdt_rng_key((uint64_t)b->cfg->run.seed, site);
    return jdt_graph_dropout_rows(b->g, x, b->m->step, b->m->row0, b->cfg->model.dropout, key);
}

/* (B, T, n, D) -> (B, n, T, D) */
static jdt_tensor *heads_first(jdt_graph *g, jdt_tensor *x)
{
    const int perm[4] = {0, 2, 1, 3};
    return jdt_graph_transpose(g, x, perm);
}

static jdt_status build_gpt(builder *b, int64_t B, bool training, int loss_chunks, jdt_err *e)
{
    const jdt_config *cfg = b->cfg;
    jdt_graph *g = b->g;
    jdt_model *m = b->m;
    const int64_t V = cfg->model.vocab_size, T = cfg->model.seq_len, C = cfg->model.n_embd;
    const int64_t H = cfg->model.n_head, Hkv = jdt_config_kv_heads(cfg), D = jdt_config_head_dim(cfg);
    const bool qkvb = jdt_config_qkv_bias(cfg);
    const int64_t F = jdt_config_mlp_dim(cfg), N = B * T, L = cfg->model.n_layer;
    const double std = cfg->model.init_std, std_resid = std / sqrt(2.0 * (double)L);
    char name[256];

    const int64_t bt[2] = {B, T};
    const char *bt_axes[2] = {"batch", "seq"};
    m->x = jdt_graph_input(g, "x", JDT_DTYPE_I32, 2, bt, bt_axes);
    m->y = jdt_graph_input(g, "y", JDT_DTYPE_I32, 2, bt, bt_axes);
    if (training && cfg->model.dropout > 0) {
        m->step = jdt_graph_input(g, "dropout_step", JDT_DTYPE_I32, 0, NULL, NULL);
        m->row0 = jdt_graph_input(g, "dropout_row0", JDT_DTYPE_F64, 0, NULL, NULL);
    }

    const int64_t vc[2] = {V, C};
    const char *vc_axes[2] = {"vocab", "embed"};
    jdt_tensor *wte = add_param(b, "wte", 2, vc, vc_axes, JDT_INIT_NORMAL, std, true);
    jdt_tensor *h = jdt_graph_gather(g, wte, m->x); /* (B, T, C) */
    /* Gemma: sqrt(C) as an f32 (transformers' normalizer in an f32 model), not in the head */
    if (cfg->model.embed_scale) h = jdt_graph_mul_scalar(g, h, (double)sqrtf((float)C));
    if (cfg->model.pos == JDT_POS_LEARNED) {
        const int64_t tc[2] = {T, C};
        const char *tc_axes[2] = {NULL, "embed"};
        jdt_tensor *wpe = add_param(b, "wpe", 2, tc, tc_axes, JDT_INIT_NORMAL, std, true);
        h = jdt_graph_add_bcast(g, h, wpe);
    }
    h = dropout(b, h, "drop.emb");

    const int64_t btc[3] = {B, T, C}, nc[2] = {N, C}, nq[2] = {N, H * D};
    const int64_t bthd[4] = {B, T, H, D}, btkd[4] = {B, T, Hkv, D};
    const double scale = 1.0 / sqrt((double)D);
    for (int64_t l = 0; l < L; l++) {
        char p[64];
        snprintf(p, sizeof p, "blocks.%lld", (long long)l);
        jdt_graph_set_block(g, (int)l + 1);

        /* attention */
        snprintf(name, sizeof name, "%s.ln1", p);
        jdt_tensor *a = gemm_rows(b, norm(b, h, name, C), nc);
        snprintf(name, sizeof name, "%s.attn.q", p);
        jdt_tensor *q = jdt_graph_reshape(g, linear_b(b, a, name, C, H * D, "embed", "heads", std, qkvb), 4, bthd);
        snprintf(name, sizeof name, "%s.attn.k", p);
        jdt_tensor *k = jdt_graph_reshape(g, linear_b(b, a, name, C, Hkv * D, "embed", "kv_heads", std, qkvb), 4, btkd);
        snprintf(name, sizeof name, "%s.attn.v", p);
        jdt_tensor *v = jdt_graph_reshape(g, linear_b(b, a, name, C, Hkv * D, "embed", "kv_heads", std, qkvb), 4, btkd);
        if (cfg->model.qk_norm) { /* per head, over D, one scale shared by the heads (Qwen3) */
            snprintf(name, sizeof name, "%s.attn.q_norm", p);
            q = norm(b, as_f32(g, q), name, D);
            snprintf(name, sizeof name, "%s.attn.k_norm", p);
            k = norm(b, as_f32(g, k), name, D);
        }
        if (cfg->model.pos == JDT_POS_ROPE) {
            double sc[4];
            jdt_config_rope_scaling(cfg, sc);
            q = jdt_graph_rope_scaled(g, as_f32(g, q), cfg->model.rope_theta, false, sc);
            k = jdt_graph_rope_scaled(g, as_f32(g, k), cfg->model.rope_theta, false, sc);
        }
        q = heads_first(g, q); /* (B, H, T, D) */
        k = heads_first(g, k); /* (B, Hkv, T, D) */
        v = heads_first(g, v);
        if (Hkv != H) { /* grouped-query: query head h reads kv head h / (H / Hkv) */
            const int64_t G = H / Hkv;
            const int64_t b1[5] = {B, Hkv, 1, T, D}, bg[5] = {B, Hkv, G, T, D}, bh[4] = {B, H, T, D};
            k = jdt_graph_reshape(g, jdt_graph_broadcast(g, jdt_graph_reshape(g, k, 5, b1), 5, bg), 4, bh);
            v = jdt_graph_reshape(g, jdt_graph_broadcast(g, jdt_graph_reshape(g, v, 5, b1), 5, bg), 4, bh);
        }
        jdt_tensor *att = /* (B, H, T, D) */
            jdt_graph_attention(g, as_f32(g, q), as_f32(g, k), as_f32(g, v), scale);
        att = jdt_graph_reshape(g, heads_first(g, att), 2, nq);   /* (N, H * D) */
        snprintf(name, sizeof name, "%s.attn.o", p);
        jdt_tensor *o = linear(b, att, name, H * D, C, "heads", "embed", std_resid);
        snprintf(name, sizeof name, "%s.drop.attn", p);
        h = jdt_graph_add(g, h, dropout(b, jdt_graph_reshape(g, o, 3, btc), name));

        /* mlp */
        snprintf(name, sizeof name, "%s.ln2", p);
        jdt_tensor *x2 = gemm_rows(b, norm(b, h, name, C), nc);
        jdt_tensor *u;
        if (jdt_config_gated_mlp(cfg)) { /* SwiGLU, GeGLU */
            snprintf(name, sizeof name, "%s.mlp.gate", p);
            jdt_tensor *gate = linear(b, x2, name, C, F, "embed", "mlp", std);
            snprintf(name, sizeof name, "%s.mlp.up", p);
            jdt_tensor *up = linear(b, x2, name, C, F, "embed", "mlp", std);
            gate = cfg->model.activation == JDT_ACT_GEGLU ? jdt_graph_gelu(g, gate) : jdt_graph_silu(g, gate);
            u = jdt_graph_mul(g, gate, up);
            snprintf(name, sizeof name, "%s.mlp.down", p);
        } else {
            snprintf(name, sizeof name, "%s.mlp.fc", p);
            u = linear(b, x2, name, C, F, "embed", "mlp", std);
            u = cfg->model.activation == JDT_ACT_RELU ? jdt_graph_relu(g, u) : jdt_graph_gelu(g, u);
            snprintf(name, sizeof name, "%s.mlp.proj", p);
        }
        jdt_tensor *mo = linear(b, u, name, F, C, "mlp", "embed", std_resid);
        snprintf(name, sizeof name, "%s.drop.mlp", p);
        h = jdt_graph_add(g, h, dropout(b, jdt_graph_reshape(g, mo, 3, btc), name));
    }

    jdt_graph_set_block(g, 0);
    jdt_tensor *hn = norm(b, h, "ln_f", C); /* (B, T, C) */
    if (cfg->model.tie_embeddings) {
        gpt_loss(b, hn, wte, true, B, loss_chunks);
    } else {
        const int64_t cv[2] = {C, V};
        const char *cv_axes[2] = {"embed", "vocab"};
        jdt_tensor *head = add_param(b, "head", 2, cv, cv_axes, JDT_INIT_NORMAL, std, true);
        gpt_loss(b, hn, head, false, B, loss_chunks);
    }
    (void)e;
    return JDT_OK;
}

static jdt_status build_mlp(builder *b, int64_t B, jdt_err *e)
{
    const jdt_config *cfg = b->cfg;
    jdt_graph *g = b->g;
    jdt_model *m = b->m;
    const int64_t in = cfg->model.in_dim, hid = cfg->model.hidden_dim, K = cfg->model.n_classes;
    const int64_t bx[2] = {B, in};
    const char *bx_axes[2] = {"batch", NULL};
    const char *by_axes[1] = {"batch"};
    m->x = jdt_graph_input(g, "x", JDT_DTYPE_F32, 2, bx, bx_axes);
    m->y = jdt_graph_input(g, "y", JDT_DTYPE_I32, 1, &B, by_axes);
    jdt_tensor *h = m->x;
    int64_t width = in;
    char name[64];
    for (int i = 0; i < cfg->model.n_hidden; i++) {
        snprintf(name, sizeof name, "layers.%d", i);
        /* He-style std for ReLU-family hidden layers keeps activations O(1) at any width */
        h = linear(b, h, name, width, hid, i ? "mlp" : "embed", "mlp", sqrt(2.0 / (double)width));
        h = cfg->model.activation == JDT_ACT_GELU ? jdt_graph_gelu(g, h) : jdt_graph_relu(g, h);
        width = hid;
    }
    m->logits = linear(b, h, "out", width, K, cfg->model.n_hidden ? "mlp" : "embed", "vocab",
                       sqrt(1.0 / (double)width));
    m->logits = as_f32(g, m->logits); /* the loss reads f32 */
    m->loss = jdt_graph_reduce_mean(g, jdt_graph_softmax_xent(g, m->logits, m->y), 1u, false);
    (void)e;
    return JDT_OK;
}

jdt_status jdt_model_build(jdt_graph *g, const jdt_config *cfg, int64_t batch, bool training,
                           jdt_model *m, jdt_err *e)
{
    return jdt_model_build_ex(g, cfg, batch, training, 1, 1, m, e);
}

jdt_status jdt_model_build_ex(jdt_graph *g, const jdt_config *cfg, int64_t batch, bool training,
                              int loss_chunks, int seq_ways, jdt_model *m, jdt_err *e)
{
    memset(m, 0, sizeof *m);
    m->batch = batch;
    if (batch < 1) return jdt_err_set(e, JDT_ERR_CONFIG, "model: batch must be >= 1, got %lld", (long long)batch);
    builder b = {.g = g,
                 .cfg = cfg,
                 .m = m,
                 .cast_weights = jdt_graph_bf16_weights(g),
                 .bf16_out = cfg->precision.activations == JDT_DTYPE_BF16,
                 .seq_ways = seq_ways > 1 ? seq_ways : 1};
    jdt_status st = cfg->model.type == JDT_MODEL_MLP ? build_mlp(&b, batch, e)
                                         : build_gpt(&b, batch, training, loss_chunks, e);
    if (st != JDT_OK) return st;
    if (b.oom) return jdt_err_set(e, JDT_ERR_NOMEM, "model: out of memory building the graph");
    st = jdt_graph_error(g, e);
    if (st != JDT_OK) return jdt_err_prefix(e, "building model '%s'",
                                            cfg->model.type == JDT_MODEL_MLP ? "mlp" : "gpt");
    return JDT_OK;
}

void jdt_model_init_param(const jdt_model_param *p, uint64_t seed, float *data)
{
    int64_t n = jdt_shape_numel(&p->t->shape);
    switch (p->init) {
    case JDT_INIT_ZEROS:
        memset(data, 0, (size_t)n * sizeof(float));
        break;
    case JDT_INIT_ONES:
        for (int64_t i = 0; i < n; i++) data[i] = 1.0f;
        break;
    case JDT_INIT_NORMAL:
        jdt_rng_normal(jdt_rng_key(seed, p->t->name), 0, (size_t)n, data);
        for (int64_t i = 0; i < n; i++) data[i] *= (float)p->std;
        break;
    }
}

void jdt_model_init_block(const jdt_model_param *p, uint64_t seed, const jdt_shape *global,
                          const int64_t *offset, const jdt_shape *local, float *data)
{
    const int nd = local->ndim;
    const int64_t run = nd ? local->dims[nd - 1] : 1, n = jdt_shape_numel(local);
    const int64_t rows = run ? n / run : 0;
    const uint64_t key = jdt_rng_key(seed, p->t->name);
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t r = 0; r < rows; r++) {
        float *dst = data + r * run;
        if (p->init != JDT_INIT_NORMAL) {
            for (int64_t i = 0; i < run; i++) dst[i] = p->init == JDT_INIT_ONES ? 1.0f : 0.0f;
            continue;
        }
        /* global index of this row's first element: local row index digits + offsets */
        int64_t rest = r, g = 0, stride = 1;
        for (int d = nd - 1; d >= 0; d--) {
            int64_t idx = d == nd - 1 ? 0 : rest % local->dims[d];
            if (d != nd - 1) rest /= local->dims[d];
            g += (offset[d] + idx) * stride;
            stride *= global->dims[d];
        }
        jdt_rng_normal(key, (uint64_t)g, (size_t)run, dst);
        for (int64_t i = 0; i < run; i++) dst[i] *= (float)p->std;
    }
}

int64_t jdt_model_param_count(const jdt_model *m)
{
    int64_t n = 0;
    for (int i = 0; i < m->n_params; i++) n += jdt_shape_numel(&m->params[i].t->shape);
    return n;
}

const char *const *jdt_model_axis_names(void)
{
    static const char *const NAMES[] = {"batch", "seq",      "vocab", "embed",
                                        "heads", "kv_heads", "mlp",   "norm", NULL};
    return NAMES;
}
