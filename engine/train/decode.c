/*
 * decode.c — the incremental gpt forward with a KV cache (see decode.h).
 *
 * Per call, for the n new rows (each at its sequence's next position p):
 *   h = wte[tok] (times sqrt(C) with model.embed_scale) (+ wpe[p])
 *   per layer: a = norm(h); q = a Wq, k = a Wk, v = a Wv (+ biases; each head of q, k normed
 *              when model.qk_norm; rope on q, k at p);
 *              k, v -> cache[l][seq][kv head][p]; o = softmax(q K[0..p]ᵀ / sqrt(D)) V[0..p];
 *              h += o Wo;  m = norm(h);  h += act(m W1) W2  |  (act(m Wgate) * (m Wup)) Wdown
 *              (act: silu for swiglu, the tanh GELU for geglu)
 *   logits = norm(h) wteᵀ (tied) or norm(h) head, for the rows asked for.
 * The same math as models.c's graph, in the same f32; every row attends to the cached keys of
 * its own sequence up to its own position, so a prefill of many rows and one row at a time
 * give the same numbers. The linear layers are one sgemm over all rows (sgemv for one row).
 */
#include "train/decode.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>

#define PAR_MIN_WORK 32768 /* below this many elements a parallel region costs more */
/* GEMM/GEMV work (multiply-adds) from which OpenBLAS gets the thread budget: one token of a
 * small model (C=256: 65K-262K per matrix) runs faster on one thread than paying a parallel
 * region per GEMV (and far faster on a loaded machine, where an idle worker spins in libgomp) */
#define GEMM_PAR_MIN (1 << 20)

typedef struct {
    const float *ln1_w, *ln1_b; /* (C); ln1_b NULL without a norm bias */
    const float *wq, *bq;       /* (C, H*D), (H*D) or NULL */
    const float *wk, *bk;       /* (C, Hkv*D), (Hkv*D) */
    const float *wv, *bv;       /* (C, Hkv*D), (Hkv*D) */
    const float *wo, *bo;       /* (H*D, C), (C) */
    const float *qn_w, *qn_b;   /* q_norm (D), (D): model.qk_norm; NULL without */
    const float *kn_w, *kn_b;   /* k_norm (D), (D) */
    const float *ln2_w, *ln2_b; /* (C) */
    const float *w1, *b1;       /* mlp.fc, or mlp.gate when gated: (C, F), (F) */
    const float *w3, *b3;       /* mlp.up (gated only): (C, F), (F) */
    const float *w2, *b2;       /* mlp.proj, or mlp.down when gated: (F, C), (C) */
} dec_layer;

struct jdt_decoder {
    int L, C, H, Hkv, D, F, V, T, S;
    jdt_norm_type norm;
    jdt_pos_type pos_kind;
    jdt_activation act;
    float eps;
    float embed_scale; /* sqrt(C) with model.embed_scale, else 1 */
    int threads;
    int blas_threads;           /* what OpenBLAS was last set to */
    const float *wte;           /* (V, C) */
    const float *wpe;           /* (T, C); NULL with rope */
    const float *lnf_w, *lnf_b; /* (C) */
    const float *head;          /* (C, V); NULL when tied to wte */
    dec_layer *layers;          /* (L) */
    float *kc, *vc;             /* (L, S, Hkv, T, D) */
    int *len;                   /* (S) positions held */
    int *next_len;              /* (S) scratch: positions once the running call is done */
    float *rope_cos, *rope_sin; /* (T, D/2): angle p * theta^(-2i/D) */
    /* row scratch, room for cap_rows rows */
    int cap_rows;
    int *row_pos;                           /* (n) position of each row */
    int *sel;                               /* (n) rows whose logits are asked for */
    float *h, *a, *q, *k, *v, *att, *u, *g; /* (n, C|C|H*D|Hkv*D|Hkv*D|H*D|F|F) */
    float *scores;                          /* (threads, T) softmax rows */
};

static const float *find_param(const jdt_model *m, float *const *data, const char *name, int ndim,
                               const int64_t *dims, jdt_status *st, jdt_err *e)
{
    if (*st != JDT_OK) return NULL;
    for (int i = 0; i < m->n_params; i++) {
        const jdt_tensor *t = m->params[i].t;
        if (strcmp(t->name, name) != 0) continue;
        bool same = t->shape.ndim == ndim;
        for (int k = 0; same && k < ndim; k++)
            same = t->shape.dims[k] == dims[k];
        if (!same) {
            *st = jdt_err_set(
                e, JDT_ERR_FORMAT,
                "decoder: parameter '%s' has another shape than the model options give", name);
            return NULL;
        }
        return data[i];
    }
    *st = jdt_err_set(e, JDT_ERR_FORMAT, "decoder: the model has no parameter '%s'", name);
    return NULL;
}

/* Looks up "<prefix>[.<suffix>]": 1-d (n1) when n0 == 0, else 2-d (n0, n1). */
static const float *pget(const jdt_model *m, float *const *data, const char *prefix,
                         const char *suffix, int64_t n0, int64_t n1, jdt_status *st, jdt_err *e)
{
    char name[256];
    snprintf(name, sizeof name, "%s%s%s", prefix, suffix[0] ? "." : "", suffix);
    const int64_t d2[2] = {n0, n1};
    return n0 ? find_param(m, data, name, 2, d2, st, e) : find_param(m, data, name, 1, &n1, st, e);
}

static jdt_status grow_rows(jdt_decoder *d, int n, jdt_err *e)
{
    if (n <= d->cap_rows) return JDT_OK;
    int cap = d->cap_rows ? d->cap_rows : 1;
    while (cap < n)
        cap *= 2;
    const size_t HD = (size_t)d->H * d->D, KD = (size_t)d->Hkv * d->D, C = (size_t)d->C;
    float **bufs[] = {&d->h, &d->a, &d->q, &d->k, &d->v, &d->att, &d->u, &d->g};
    const size_t width[] = {C, C, HD, KD, KD, HD, (size_t)d->F, (size_t)d->F};
    bool ok = true;
    for (size_t i = 0; i < JDT_ARRAY_LEN(bufs); i++) {
        jdt_free_aligned(*bufs[i]);
        *bufs[i] = jdt_malloc_aligned((size_t)cap * width[i] * sizeof(float));
        ok = ok && *bufs[i];
    }
    jdt_free(d->row_pos);
    jdt_free(d->sel);
    d->row_pos = jdt_calloc((size_t)cap, sizeof *d->row_pos);
    d->sel = jdt_calloc((size_t)cap, sizeof *d->sel);
    if (!ok || !d->row_pos || !d->sel) {
        d->cap_rows = 0;
        return jdt_err_set(e, JDT_ERR_NOMEM, "decoder: out of memory for %d rows", n);
    }
    d->cap_rows = cap;
    return JDT_OK;
}

static jdt_status bind_params(jdt_decoder *d, const jdt_config *cfg, const jdt_model *m,
                              float *const *data, jdt_err *e)
{
    const bool bias = cfg->model.bias, nbias = bias && d->norm == JDT_NORM_LAYERNORM;
    const bool qkvb = jdt_config_qkv_bias(cfg);
    const bool glu = jdt_config_gated_mlp(cfg);
    const int64_t C = d->C, V = d->V, T = d->T, HD = (int64_t)d->H * d->D,
                  KD = (int64_t)d->Hkv * d->D, F = d->F;
    jdt_status st = JDT_OK;
    d->wte = pget(m, data, "wte", "", V, C, &st, e);
    if (d->pos_kind == JDT_POS_LEARNED) d->wpe = pget(m, data, "wpe", "", T, C, &st, e);
    d->lnf_w = pget(m, data, "ln_f", "w", 0, C, &st, e);
    if (nbias) d->lnf_b = pget(m, data, "ln_f", "b", 0, C, &st, e);
    if (!cfg->model.tie_embeddings) d->head = pget(m, data, "head", "", C, V, &st, e);
    for (int l = 0; l < d->L && st == JDT_OK; l++) {
        dec_layer *y = &d->layers[l];
        char p[8][96];
        const char *sub[8] = {"ln1",
                              "ln2",
                              "attn.q",
                              "attn.k",
                              "attn.v",
                              "attn.o",
                              glu ? "mlp.gate" : "mlp.fc",
                              glu ? "mlp.down" : "mlp.proj"};
        for (int i = 0; i < 8; i++)
            snprintf(p[i], sizeof p[i], "blocks.%d.%s", l, sub[i]);
        char up[96];
        snprintf(up, sizeof up, "blocks.%d.mlp.up", l);
        y->ln1_w = pget(m, data, p[0], "w", 0, C, &st, e);
        y->ln2_w = pget(m, data, p[1], "w", 0, C, &st, e);
        if (nbias) {
            y->ln1_b = pget(m, data, p[0], "b", 0, C, &st, e);
            y->ln2_b = pget(m, data, p[1], "b", 0, C, &st, e);
        }
        y->wq = pget(m, data, p[2], "w", C, HD, &st, e);
        y->wk = pget(m, data, p[3], "w", C, KD, &st, e);
        y->wv = pget(m, data, p[4], "w", C, KD, &st, e);
        y->wo = pget(m, data, p[5], "w", HD, C, &st, e);
        y->w1 = pget(m, data, p[6], "w", C, F, &st, e);
        if (glu) y->w3 = pget(m, data, up, "w", C, F, &st, e);
        y->w2 = pget(m, data, p[7], "w", F, C, &st, e);
        if (cfg->model.qk_norm) {
            char qn[96], kn[96];
            snprintf(qn, sizeof qn, "blocks.%d.attn.q_norm", l);
            snprintf(kn, sizeof kn, "blocks.%d.attn.k_norm", l);
            y->qn_w = pget(m, data, qn, "w", 0, d->D, &st, e);
            y->kn_w = pget(m, data, kn, "w", 0, d->D, &st, e);
            if (nbias) {
                y->qn_b = pget(m, data, qn, "b", 0, d->D, &st, e);
                y->kn_b = pget(m, data, kn, "b", 0, d->D, &st, e);
            }
        }
        if (qkvb) {
            y->bq = pget(m, data, p[2], "b", 0, HD, &st, e);
            y->bk = pget(m, data, p[3], "b", 0, KD, &st, e);
            y->bv = pget(m, data, p[4], "b", 0, KD, &st, e);
        }
        if (bias) {
            y->bo = pget(m, data, p[5], "b", 0, C, &st, e);
            y->b1 = pget(m, data, p[6], "b", 0, F, &st, e);
            if (glu) y->b3 = pget(m, data, up, "b", 0, F, &st, e);
            y->b2 = pget(m, data, p[7], "b", 0, C, &st, e);
        }
    }
    return st;
}

jdt_status jdt_decoder_new(const jdt_config *cfg, const jdt_model *m, float *const *data,
                           int n_seqs, int threads, jdt_decoder **out, jdt_err *e)
{
    *out = NULL;
    if (cfg->model.type != JDT_MODEL_GPT)
        return jdt_err_set(e, JDT_ERR_CONFIG,
                           "decoder: mlp models are not autoregressive (sampling needs a gpt)");
    if (n_seqs < 1) return jdt_err_set(e, JDT_ERR_INVALID, "decoder: n_seqs must be >= 1");
    jdt_decoder *d = jdt_calloc(1, sizeof *d);
    if (!d) return jdt_err_set(e, JDT_ERR_NOMEM, "decoder: out of memory");
    d->L = cfg->model.n_layer;
    d->C = cfg->model.n_embd;
    d->H = cfg->model.n_head;
    d->Hkv = jdt_config_kv_heads(cfg);
    d->D = jdt_config_head_dim(cfg);
    d->F = (int)jdt_config_mlp_dim(cfg);
    d->V = cfg->model.vocab_size;
    d->T = cfg->model.seq_len;
    d->S = n_seqs;
    d->norm = cfg->model.norm;
    d->pos_kind = cfg->model.pos;
    d->act = cfg->model.activation;
    d->eps = (float)cfg->model.norm_eps;
    d->embed_scale = cfg->model.embed_scale ? sqrtf((float)d->C) : 1.0f;
    d->threads = threads > 0 ? threads : omp_get_max_threads();
    openblas_set_num_threads(d->threads); /* process-wide, as a program compile sets it */
    d->blas_threads = d->threads;
    jdt_status st = JDT_OK;
    const size_t cache = (size_t)d->L * (size_t)d->S * (size_t)d->Hkv * (size_t)d->T * (size_t)d->D;
    d->layers = jdt_calloc((size_t)d->L, sizeof *d->layers);
    d->kc = jdt_malloc_aligned(cache * sizeof(float));
    d->vc = jdt_malloc_aligned(cache * sizeof(float));
    d->len = jdt_calloc((size_t)d->S, sizeof *d->len);
    d->next_len = jdt_calloc((size_t)d->S, sizeof *d->next_len);
    d->scores = jdt_malloc_aligned((size_t)d->threads * (size_t)d->T * sizeof(float));
    if (!d->layers || !d->kc || !d->vc || !d->len || !d->next_len || !d->scores) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "decoder: out of memory for a KV cache of %.1f MiB",
                         2.0 * (double)cache * sizeof(float) / (1 << 20));
        goto fail;
    }
    if (d->pos_kind == JDT_POS_ROPE) {
        const int half = d->D / 2;
        d->rope_cos = jdt_malloc_aligned((size_t)d->T * (size_t)half * sizeof(float));
        d->rope_sin = jdt_malloc_aligned((size_t)d->T * (size_t)half * sizeof(float));
        if (!d->rope_cos || !d->rope_sin) {
            st = jdt_err_set(e, JDT_ERR_NOMEM, "decoder: out of memory");
            goto fail;
        }
        double sc[4];
        jdt_config_rope_scaling(cfg, sc);
        for (int p = 0; p < d->T; p++)
            for (int i = 0; i < half; i++) { /* as the graph's ROPE: double angle, f32 cos/sin */
                double ang = (double)p * jdt_rope_freq(cfg->model.rope_theta, i, d->D, sc);
                d->rope_cos[p * half + i] = (float)cos(ang);
                d->rope_sin[p * half + i] = (float)sin(ang);
            }
    }
    if ((st = bind_params(d, cfg, m, data, e)) != JDT_OK) goto fail;
    *out = d;
    return JDT_OK;
fail:
    jdt_decoder_free(d);
    return st;
}

void jdt_decoder_free(jdt_decoder *d)
{
    if (!d) return;
    float *bufs[] = {d->h, d->a,  d->q,  d->k,      d->v,        d->att,     d->u,
                     d->g, d->kc, d->vc, d->scores, d->rope_cos, d->rope_sin};
    for (size_t i = 0; i < JDT_ARRAY_LEN(bufs); i++)
        jdt_free_aligned(bufs[i]);
    jdt_free(d->row_pos);
    jdt_free(d->sel);
    jdt_free(d->len);
    jdt_free(d->next_len);
    jdt_free(d->layers);
    jdt_free(d);
}

void jdt_decoder_reset(jdt_decoder *d, int seq)
{
    if (seq >= 0 && seq < d->S) d->len[seq] = 0;
}

int jdt_decoder_len(const jdt_decoder *d, int seq)
{
    return seq >= 0 && seq < d->S ? d->len[seq] : 0;
}

int64_t jdt_decoder_cache_bytes(const jdt_decoder *d)
{
    return 2 * (int64_t)d->L * d->S * d->Hkv * d->T * d->D * (int64_t)sizeof(float);
}

/* Gives OpenBLAS the thread budget for a product of `work` multiply-adds. */
static void blas_threads(jdt_decoder *d, int64_t work)
{
    const int nt = work >= GEMM_PAR_MIN ? d->threads : 1;
    if (nt != d->blas_threads) openblas_set_num_threads(nt);
    d->blas_threads = nt;
}

/* y (n, out) = x (n, in) @ w (in, out) [+ b (out)] */
static void linear(jdt_decoder *d, const float *x, const float *w, const float *b, float *y, int n,
                   int in, int out)
{
    blas_threads(d, (int64_t)n * in * out);
    float beta = 0.0f;
    if (b) {
        for (int r = 0; r < n; r++)
            memcpy(y + (size_t)r * out, b, (size_t)out * sizeof(float));
        beta = 1.0f;
    }
    if (n == 1)
        cblas_sgemv(CblasRowMajor, CblasTrans, in, out, 1.0f, w, out, x, 1, beta, y, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, out, in, 1.0f, x, in, w, out,
                    beta, y, out);
}

/* y (n, C) = norm(x) * w [+ b] over rows of width C, rows listed in rows[0..n) of x (rows NULL:
 * 0..n), packed; y may be x when rows is NULL. */
static void norm_rows(const jdt_decoder *d, const float *x, const int *rows, int n, int C,
                      const float *w, const float *b, float *y)
{
#pragma omp parallel for num_threads(d->threads) if ((int64_t)n * C >= PAR_MIN_WORK)
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)(rows ? rows[r] : r) * C;
        float *yr = y + (size_t)r * C;
        if (d->norm == JDT_NORM_RMSNORM) {
            float ms = 0;
#pragma omp simd reduction(+ : ms)
            for (int c = 0; c < C; c++)
                ms += xr[c] * xr[c];
            float rr = 1.0f / sqrtf(ms / (float)C + d->eps);
            for (int c = 0; c < C; c++)
                yr[c] = xr[c] * rr * w[c];
        } else {
            float mean = 0, var = 0;
#pragma omp simd reduction(+ : mean)
            for (int c = 0; c < C; c++)
                mean += xr[c];
            mean /= (float)C;
#pragma omp simd reduction(+ : var)
            for (int c = 0; c < C; c++)
                var += (xr[c] - mean) * (xr[c] - mean);
            float rstd = 1.0f / sqrtf(var / (float)C + d->eps);
            for (int c = 0; c < C; c++)
                yr[c] = (xr[c] - mean) * rstd * w[c] + (b ? b[c] : 0.0f);
        }
    }
}

/* x (n, nh, D) rotated in place at each row's position: pairs (2i, 2i+1). */
static void rope_rows(const jdt_decoder *d, float *x, int n, int nh)
{
    const int D = d->D, half = D / 2;
    for (int r = 0; r < n; r++) {
        const float *cs = d->rope_cos + (size_t)d->row_pos[r] * half;
        const float *sn = d->rope_sin + (size_t)d->row_pos[r] * half;
        for (int hh = 0; hh < nh; hh++) {
            float *xr = x + ((size_t)r * nh + hh) * D;
            for (int i = 0; i < half; i++) {
                float x0 = xr[2 * i], x1 = xr[2 * i + 1];
                xr[2 * i] = x0 * cs[i] - x1 * sn[i];
                xr[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
            }
        }
    }
}

static size_t cache_off(const jdt_decoder *d, int l, int seq, int hk, int p)
{
    return ((((size_t)l * d->S + seq) * d->Hkv + hk) * d->T + p) * d->D;
}

/* att (n, H, D): each row's query heads against its sequence's cached keys 0..pos. */
static void attend(jdt_decoder *d, int l, const int *seqs, int n)
{
    const int H = d->H, D = d->D, G = d->H / d->Hkv;
    const float scale = 1.0f / sqrtf((float)D);
    int64_t work = 0;
    for (int r = 0; r < n; r++)
        work += (int64_t)(d->row_pos[r] + 1) * H * D;
#pragma omp parallel for collapse(2) schedule(dynamic, 4)                                          \
    num_threads(d->threads) if (work >= GEMM_PAR_MIN / 4)
    for (int r = 0; r < n; r++) {
        for (int hh = 0; hh < H; hh++) {
            float *s = d->scores + (size_t)omp_get_thread_num() * d->T;
            const int np = d->row_pos[r] + 1;
            const float *q = d->q + ((size_t)r * H + hh) * D;
            const float *K = d->kc + cache_off(d, l, seqs[r], hh / G, 0);
            const float *Vc = d->vc + cache_off(d, l, seqs[r], hh / G, 0);
            float mx = -INFINITY;
            for (int j = 0; j < np; j++) {
                float dot = 0;
                const float *kj = K + (size_t)j * D;
#pragma omp simd reduction(+ : dot)
                for (int c = 0; c < D; c++)
                    dot += q[c] * kj[c];
                s[j] = dot * scale;
                mx = s[j] > mx ? s[j] : mx;
            }
            float sum = 0;
            for (int j = 0; j < np; j++)
                sum += (s[j] = expf(s[j] - mx));
            const float inv = 1.0f / sum;
            float *o = d->att + ((size_t)r * H + hh) * D;
            for (int c = 0; c < D; c++)
                o[c] = 0;
            for (int j = 0; j < np; j++) {
                const float pj = s[j] * inv, *vj = Vc + (size_t)j * D;
                for (int c = 0; c < D; c++)
                    o[c] += pj * vj[c];
            }
        }
    }
}

static float gelu_tanh(float x)
{
    const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

/* u (n, F) = act(u) (gelu/relu), silu(u) * g (swiglu) or gelu(u) * g (geglu) */
static void activate(const jdt_decoder *d, int n)
{
    const int64_t N = (int64_t)n * d->F;
    float *u = d->u;
    const float *g = d->g;
    const jdt_activation act = d->act;
#pragma omp parallel for num_threads(d->threads) if (N >= PAR_MIN_WORK)
    for (int64_t i = 0; i < N; i++) {
        float x = u[i];
        if (act == JDT_ACT_SWIGLU)
            u[i] = x / (1.0f + expf(-x)) * g[i];
        else if (act == JDT_ACT_GEGLU)
            u[i] = gelu_tanh(x) * g[i];
        else if (act == JDT_ACT_RELU)
            u[i] = x > 0 ? x : 0.0f;
        else
            u[i] = gelu_tanh(x);
    }
}

static void add_into(float *h, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        h[i] += x[i];
}

jdt_status jdt_decoder_forward(jdt_decoder *d, int n, const int *seqs, const int32_t *toks,
                               const bool *want, float *logits, jdt_err *e)
{
    if (n < 1) return jdt_err_set(e, JDT_ERR_INVALID, "decoder: no rows to run");
    for (int s = 0; s < d->S; s++)
        d->next_len[s] = d->len[s];
    for (int r = 0; r < n; r++) {
        if (seqs[r] < 0 || seqs[r] >= d->S)
            return jdt_err_set(e, JDT_ERR_INVALID, "decoder: sequence %d out of range [0, %d)",
                               seqs[r], d->S);
        if (toks[r] < 0 || toks[r] >= d->V)
            return jdt_err_set(e, JDT_ERR_INVALID, "decoder: token %d out of range [0, %d)",
                               (int)toks[r], d->V);
        if (d->next_len[seqs[r]] >= d->T)
            return jdt_err_set(e, JDT_ERR_INVALID,
                               "decoder: sequence %d would pass model.seq_len %d positions",
                               seqs[r], d->T);
        d->next_len[seqs[r]]++;
    }
    jdt_status st = grow_rows(d, n, e);
    if (st != JDT_OK) return st;
    for (int s = 0; s < d->S; s++)
        d->next_len[s] = d->len[s];
    for (int r = 0; r < n; r++)
        d->row_pos[r] = d->next_len[seqs[r]]++;

    const int C = d->C, HD = d->H * d->D, KD = d->Hkv * d->D, F = d->F, D = d->D;
    for (int r = 0; r < n; r++) {
        memcpy(d->h + (size_t)r * C, d->wte + (size_t)toks[r] * C, (size_t)C * sizeof(float));
        if (d->embed_scale != 1.0f)
            for (int c = 0; c < C; c++)
                d->h[(size_t)r * C + c] *= d->embed_scale;
        if (d->wpe) add_into(d->h + (size_t)r * C, d->wpe + (size_t)d->row_pos[r] * C, C);
    }
    for (int l = 0; l < d->L; l++) {
        const dec_layer *y = &d->layers[l];
        norm_rows(d, d->h, NULL, n, C, y->ln1_w, y->ln1_b, d->a);
        linear(d, d->a, y->wq, y->bq, d->q, n, C, HD);
        linear(d, d->a, y->wk, y->bk, d->k, n, C, KD);
        linear(d, d->a, y->wv, y->bv, d->v, n, C, KD);
        if (y->qn_w) { /* each head's row of D, in place */
            norm_rows(d, d->q, NULL, n * d->H, D, y->qn_w, y->qn_b, d->q);
            norm_rows(d, d->k, NULL, n * d->Hkv, D, y->kn_w, y->kn_b, d->k);
        }
        if (d->pos_kind == JDT_POS_ROPE) {
            rope_rows(d, d->q, n, d->H);
            rope_rows(d, d->k, n, d->Hkv);
        }
        for (int r = 0; r < n; r++)
            for (int hk = 0; hk < d->Hkv; hk++) {
                size_t o = cache_off(d, l, seqs[r], hk, d->row_pos[r]);
                memcpy(d->kc + o, d->k + ((size_t)r * d->Hkv + hk) * D, (size_t)D * sizeof(float));
                memcpy(d->vc + o, d->v + ((size_t)r * d->Hkv + hk) * D, (size_t)D * sizeof(float));
            }
        attend(d, l, seqs, n);
        linear(d, d->att, y->wo, y->bo, d->a, n, HD, C);
        add_into(d->h, d->a, (int64_t)n * C);
        norm_rows(d, d->h, NULL, n, C, y->ln2_w, y->ln2_b, d->a);
        linear(d, d->a, y->w1, y->b1, d->u, n, C, F);
        if (y->w3) linear(d, d->a, y->w3, y->b3, d->g, n, C, F);
        activate(d, n);
        linear(d, d->u, y->w2, y->b2, d->a, n, F, C);
        add_into(d->h, d->a, (int64_t)n * C);
    }
    int n_sel = 0;
    for (int r = 0; r < n; r++)
        if (!want || want[r]) d->sel[n_sel++] = r;
    if (n_sel) {
        norm_rows(d, d->h, d->sel, n_sel, C, d->lnf_w, d->lnf_b, d->a);
        const int V = d->V;
        if (d->head) {
            linear(d, d->a, d->head, NULL, logits, n_sel, C, V);
        } else if (n_sel == 1) {
            blas_threads(d, (int64_t)V * C);
            cblas_sgemv(CblasRowMajor, CblasNoTrans, V, C, 1.0f, d->wte, C, d->a, 1, 0.0f, logits,
                        1);
        } else {
            blas_threads(d, (int64_t)n_sel * V * C);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n_sel, V, C, 1.0f, d->a, C, d->wte,
                        C, 0.0f, logits, V);
        }
    }
    for (int s = 0; s < d->S; s++)
        d->len[s] = d->next_len[s];
    return JDT_OK;
}
