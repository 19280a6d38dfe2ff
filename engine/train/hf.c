/*
 * hf.c — `jdt-train export CKPT --format hf OUT_DIR` (see hf.h): reads a checkpoint's params by
 * their global names (as sample.c does), renames and re-lays them out for transformers'
 * GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM or GemmaForCausalLM,
 * and writes
 * model.safetensors, config.json and the tokenizer; and the reverse (checkpoint.init_from,
 * eval --ckpt, sample of a Hugging Face directory). Layout facts (docs/interop.md):
 *   - our linear weights are (in, out); GPT-2's Conv1D weights are (in, out) too, Llama's
 *     nn.Linear weights are (out, in), so Llama gets transposes;
 *   - GPT-2 packs q, k, v into one c_attn (C, 3C): columns [q | k | v];
 *   - our RoPE rotates interleaved pairs (2i, 2i+1), HF Llama's rotate_half rotates (i, i+D/2)
 *     with the same frequency theta^(-2i/D), so q_proj/k_proj rows are permuted per head:
 *     our feature 2i+j becomes HF row j*D/2 + i (q.k is unchanged by a common permutation);
 *     Qwen2's q/k biases and Qwen3's q_norm/k_norm scales (one head of D) move with them.
 *   - Gemma's RMSNorm scales by (1 + weight): our norm weights are HF's plus one (ours start
 *     at ones, as Gemma's start at zeros);
 * The rmsnorm family (Llama, Mistral, Qwen2, Qwen3, Gemma) shares the tensor names and layouts;
 * what tells them apart is in hf_arch below.
 */
#include "train/hf.h"

#include "config/config.h"
#include "datasets/bpe.h"
#include "datasets/datasets.h"
#include "graph/builder.h"
#include "io/ckpt.h"
#include "io/io-impl.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "models/models.h"
#include "train/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The transformers architectures a gpt maps to exactly. */
typedef enum { HF_GPT2, HF_LLAMA, HF_QWEN2, HF_QWEN3, HF_GEMMA, HF_N_ARCH } hf_arch;

typedef struct {
    jdt_model m;
    float **params; /* [n_params] */
    jdt_st_tensor *out;
    void **owned; /* buffers made for the export (transposes, packs, names) */
    int n_out, n_owned, cap;
    hf_arch arch;
    const char *ckpt;
    jdt_err *e;
} exporter;

static const struct {
    const char *model_type, *class_name;
    const char *needs; /* the config settings that select it */
} HF_ARCH[HF_N_ARCH] = {
    [HF_GPT2] = {"gpt2", "GPT2LMHeadModel",
                 "model.norm=layernorm model.bias=true model.pos=learned model.activation=gelu"},
    [HF_LLAMA] = {"llama", "LlamaForCausalLM",
                  "model.norm=rmsnorm model.bias=false model.qkv_bias=false model.qk_norm=false"},
    [HF_QWEN2] = {"qwen2", "Qwen2ForCausalLM", "model.norm=rmsnorm model.bias=false model.qkv_bias=true"},
    [HF_QWEN3] = {"qwen3", "Qwen3ForCausalLM", "model.norm=rmsnorm model.bias=false model.qk_norm=true"},
    [HF_GEMMA] = {"gemma", "GemmaForCausalLM",
                  "model.norm=rmsnorm model.bias=false model.activation=geglu model.embed_scale=true"},
};

/* The architectures and model_types named in errors */
#define HF_ARCH_NAMES "GPT-2, Llama, Qwen2, Qwen3, Gemma"
#define HF_MODEL_TYPES "gpt2, llama, mistral, phi3, qwen2, qwen3 and gemma"

/* The architecture cfg's gpt maps to, when mismatch() finds nothing against it. */
static hf_arch arch_of(const jdt_config *c)
{
    if (c->model.norm == JDT_NORM_LAYERNORM) return HF_GPT2;
    if (c->model.embed_scale || c->model.activation == JDT_ACT_GEGLU) return HF_GEMMA;
    if (c->model.qk_norm) return HF_QWEN3;
    return c->model.qkv_bias ? HF_QWEN2 : HF_LLAMA;
}

/* The architecture of config.json's model_type (Mistral's is Llama's, less a sliding window
 * check_hf_config looks at; Phi-3's is Llama's with q, k, v in one qkv_proj and gate, up in one
 * gate_up_proj, which read_hf_param takes apart); -1 for another. */
static int arch_of_model_type(const char *mt)
{
    if (!mt) return -1;
    if (strcmp(mt, "mistral") == 0 || strcmp(mt, "phi3") == 0) return HF_LLAMA;
    for (int a = 0; a < HF_N_ARCH; a++)
        if (strcmp(mt, HF_ARCH[a].model_type) == 0) return a;
    return -1;
}

/* Whether our param `ours` is a norm weight that Gemma stores less one (its RMSNorm scales by
 * 1 + weight): the layers' ln1 and ln2 and the final ln_f. */
static bool offset_norm(hf_arch arch, const char *ours)
{
    if (arch != HF_GEMMA) return false;
    const size_t n = strlen(ours);
    return strcmp(ours, "ln_f.w") == 0 ||
           (n > 6 && (strcmp(ours + n - 6, ".ln1.w") == 0 || strcmp(ours + n - 6, ".ln2.w") == 0));
}

/* The row (or entry) of an HF q/k projection that holds our feature j, in heads of width D:
 * our interleaved RoPE pair (2i, 2i+1) is HF's (i, i + D/2) (the file comment). */
static int64_t rope_row(int64_t j, int64_t D)
{
    const int64_t h = j / D, f = j % D;
    return h * D + (f % 2) * (D / 2) + f / 2;
}

/* GPT-2's per-block tensors, ours -> HF under transformer.h.L., laid out alike; q, k and v
 * are packed into attn.c_attn apart from these. */
static const char *const GPT2_BLOCK[][2] = {
    {"ln1.w", "ln_1.weight"},           {"ln1.b", "ln_1.bias"},         {"attn.o.w", "attn.c_proj.weight"},
    {"attn.o.b", "attn.c_proj.bias"},   {"ln2.w", "ln_2.weight"},       {"ln2.b", "ln_2.bias"},
    {"mlp.fc.w", "mlp.c_fc.weight"},    {"mlp.fc.b", "mlp.c_fc.bias"},  {"mlp.proj.w", "mlp.c_proj.weight"},
    {"mlp.proj.b", "mlp.c_proj.bias"},
};

/* Rows (entries) of an HF q/k tensor permuted per head for RoPE (rope_row): those of the query
 * heads, of the key/value heads, or of one head (Qwen3's norm scales). */
typedef enum { ROPE_NONE, ROPE_Q_HEADS, ROPE_KV_HEADS, ROPE_ONE_HEAD } rope_rows;

/* The Llama family's per-block tensors, ours -> HF under model.layers.L.: whether HF stores the
 * weight (out, in), which rows RoPE permutes, and the one architecture that has it (-1: all). */
static const struct {
    const char *ours, *hf;
    rope_rows rope;
    bool transpose;
    int only;
} LLAMA_BLOCK[] = {
    {"ln1.w", "input_layernorm.weight", ROPE_NONE, false, -1},
    {"attn.q.w", "self_attn.q_proj.weight", ROPE_Q_HEADS, true, -1},
    {"attn.k.w", "self_attn.k_proj.weight", ROPE_KV_HEADS, true, -1},
    {"attn.v.w", "self_attn.v_proj.weight", ROPE_NONE, true, -1},
    {"attn.o.w", "self_attn.o_proj.weight", ROPE_NONE, true, -1},
    {"ln2.w", "post_attention_layernorm.weight", ROPE_NONE, false, -1},
    {"mlp.gate.w", "mlp.gate_proj.weight", ROPE_NONE, true, -1},
    {"mlp.up.w", "mlp.up_proj.weight", ROPE_NONE, true, -1},
    {"mlp.down.w", "mlp.down_proj.weight", ROPE_NONE, true, -1},
    {"attn.q.b", "self_attn.q_proj.bias", ROPE_Q_HEADS, false, HF_QWEN2},
    {"attn.k.b", "self_attn.k_proj.bias", ROPE_KV_HEADS, false, HF_QWEN2},
    {"attn.v.b", "self_attn.v_proj.bias", ROPE_NONE, false, HF_QWEN2},
    {"attn.q_norm.w", "self_attn.q_norm.weight", ROPE_ONE_HEAD, false, HF_QWEN3},
    {"attn.k_norm.w", "self_attn.k_norm.weight", ROPE_ONE_HEAD, false, HF_QWEN3},
};

/* The heads rows of kind r are permuted in (0: none). */
static int64_t rope_heads_of(const jdt_config *c, rope_rows r)
{
    switch (r) {
    case ROPE_Q_HEADS: return c->model.n_head;
    case ROPE_KV_HEADS: return jdt_config_kv_heads(c);
    case ROPE_ONE_HEAD: return 1;
    case ROPE_NONE: break;
    }
    return 0;
}

static const float *param(exporter *x, const char *name, int64_t *d0, int64_t *d1)
{
    for (int i = 0; i < x->m.n_params; i++) {
        const jdt_tensor *t = x->m.params[i].t;
        if (strcmp(t->name, name) == 0) {
            *d0 = t->shape.dims[0];
            *d1 = t->shape.ndim > 1 ? t->shape.dims[1] : 1;
            return x->params[i];
        }
    }
    return NULL;
}

static float *own(exporter *x, size_t n)
{
    float *p = jdt_malloc(n * sizeof *p);
    if (p) x->owned[x->n_owned++] = p;
    return p;
}

/* Adds an output tensor; name is copied. */
static jdt_status emit(exporter *x, const char *name, const float *data, int ndim, int64_t a, int64_t b)
{
    if (x->n_out == x->cap) return jdt_err_set(x->e, JDT_ERR_INTERNAL, "hf export: tensor table full");
    char *nm = jdt_strdup(name);
    if (!nm) return jdt_err_set(x->e, JDT_ERR_NOMEM, "hf export: out of memory");
    x->owned[x->n_owned++] = nm;
    jdt_st_tensor *t = &x->out[x->n_out++];
    memset(t, 0, sizeof *t);
    t->name = nm;
    t->ndim = ndim;
    t->shape[0] = a;
    t->shape[1] = b;
    t->data = data;
    return JDT_OK;
}

/* Emits our param `ours` as `hf` (ours must exist). With transpose, a (R, K) weight becomes
 * (K, R); with rope_heads > 0 the rows of the transposed weight (the entries of a vector) are
 * permuted per head from interleaved to half-split RoPE pairs. */
static jdt_status emit_param(exporter *x, const char *ours, const char *hf, bool transpose, int64_t rope_heads)
{
    int64_t r, k;
    const float *w = param(x, ours, &r, &k);
    if (!w) return jdt_err_set(x->e, JDT_ERR_FORMAT, "%s: checkpoint has no params/%s", x->ckpt, ours);
    bool vec = false;
    for (int i = 0; i < x->m.n_params; i++)
        if (strcmp(x->m.params[i].t->name, ours) == 0) vec = x->m.params[i].t->shape.ndim == 1;
    if (vec && offset_norm(x->arch, ours)) { /* Gemma's norm weights, stored less one */
        float *o = own(x, (size_t)r);
        if (!o) return jdt_err_set(x->e, JDT_ERR_NOMEM, "hf export: out of memory");
        for (int64_t j = 0; j < r; j++) o[j] = w[j] - 1.0f;
        return emit(x, hf, o, 1, r, 0);
    }
    if (vec && rope_heads <= 0) return emit(x, hf, w, 1, r, 0);
    if (!vec && !transpose) return emit(x, hf, w, 2, r, k);
    float *o = own(x, (size_t)(r * k));
    if (!o) return jdt_err_set(x->e, JDT_ERR_NOMEM, "hf export: out of memory");
    if (vec) {
        for (int64_t j = 0; j < r; j++) o[rope_row(j, r / rope_heads)] = w[j];
        return emit(x, hf, o, 1, r, 0);
    }
    /* o is (k, r): o[j][i] = w[i][j], row j permuted for rope */
    const int64_t D = rope_heads > 0 ? k / rope_heads : 0;
    for (int64_t j = 0; j < k; j++) {
        const int64_t dst = rope_heads > 0 ? rope_row(j, D) : j;
        for (int64_t i = 0; i < r; i++) o[dst * r + i] = w[i * k + j];
    }
    return emit(x, hf, o, 2, k, r);
}

/* What keeps cfg's gpt from mapping to arch_of(cfg), or NULL. */
static const char *mismatch(const jdt_config *c)
{
    if (arch_of(c) == HF_GPT2) {
        if (c->model.bias != true) return "model.bias must be true";
        if (c->model.pos != JDT_POS_LEARNED) return "model.pos must be learned";
        if (c->model.activation != JDT_ACT_GELU) return "model.activation must be gelu";
        if (!c->model.tie_embeddings) return "model.tie_embeddings must be true";
        if (jdt_config_kv_heads(c) != c->model.n_head) return "model.n_kv_head must equal n_head";
        if (c->model.qk_norm) return "model.qk_norm must be false";
        if (jdt_config_head_dim(c) * c->model.n_head != c->model.n_embd)
            return "model.head_dim must be n_embd / n_head";
        if (c->model.embed_scale) return "model.embed_scale must be false";
    } else if (arch_of(c) == HF_GEMMA) {
        if (c->model.bias) return "model.bias must be false";
        if (c->model.pos != JDT_POS_ROPE) return "model.pos must be rope";
        if (c->model.activation != JDT_ACT_GEGLU) return "model.activation must be geglu (Gemma's GeGLU)";
        if (!c->model.embed_scale) return "model.embed_scale must be true (Gemma scales its embeddings)";
        if (c->model.qkv_bias || c->model.qk_norm) return "model.qkv_bias and model.qk_norm must be false (Gemma)";
    } else {
        if (c->model.bias) return "model.bias must be false";
        if (c->model.pos != JDT_POS_ROPE) return "model.pos must be rope";
        if (c->model.activation != JDT_ACT_SWIGLU) return "model.activation must be swiglu";
        if (c->model.qk_norm && c->model.qkv_bias)
            return "model.qkv_bias must be false with model.qk_norm (Qwen3 has no q/k/v biases)";
    }
    return NULL;
}

jdt_status jdt_hf_export(const char *ckpt_path, const char *out_dir, const char **arch_out, jdt_err *e)
{
    exporter x;
    memset(&x, 0, sizeof x);
    x.ckpt = ckpt_path;
    x.e = e;
    jdt_ckpt *ck = NULL;
    jdt_graph *g = NULL;
    jdt_config cfg;
    bool have_cfg = false;
    jdt_bpe *tok = NULL;
    char *path = NULL;
    jdt_status st = jdt_ckpt_open(ckpt_path, &ck, e);
    if (st != JDT_OK) return st;
    jdt_ckpt_meta meta;
    jdt_ckpt_get_meta(ck, &meta);
    char label[1100];
    snprintf(label, sizeof label, "%s (stored config)", ckpt_path);
    if ((st = jdt_config_load_string(meta.config_text, label, 0, NULL, NULL, &cfg, e)) != JDT_OK) goto out;
    have_cfg = true;
    if (cfg.model.type != JDT_MODEL_GPT) {
        st = jdt_err_set(e, JDT_ERR_UNSUPPORTED, "%s: --format hf exports gpt models only", ckpt_path);
        goto out;
    }
    const hf_arch arch = arch_of(&cfg);
    const bool llama = arch != HF_GPT2; /* the rmsnorm family's names and layouts */
    x.arch = arch;
    const char *bad = mismatch(&cfg);
    if (bad) {
        st = jdt_err_set(e, JDT_ERR_UNSUPPORTED,
                         "%s: this gpt maps to no transformers architecture (" HF_ARCH_NAMES "): with "
                         "model.norm %s, %s (docs/interop.md)",
                         ckpt_path, llama ? "rmsnorm" : "layernorm", bad);
        goto out;
    }
    if (!(g = jdt_graph_new())) goto oom;
    if ((st = jdt_model_build(g, &cfg, 1, false, &x.m, e)) != JDT_OK) goto out;
    if (!(x.params = jdt_calloc((size_t)x.m.n_params, sizeof *x.params))) goto oom;
    double total_mb = 0, done_mb = 0;
    for (int i = 0; i < x.m.n_params; i++)
        total_mb += (double)jdt_shape_numel(&x.m.params[i].t->shape) * sizeof(float) / 1048576.0;
    jdt_progress prog;
    jdt_progress_begin(&prog, "loading parameters", total_mb, "MB");
    for (int i = 0; i < x.m.n_params && st == JDT_OK; i++) {
        const jdt_tensor *p = x.m.params[i].t;
        if (!(x.params[i] = jdt_malloc((size_t)jdt_shape_numel(&p->shape) * sizeof(float)))) {
            st = jdt_err_set(e, JDT_ERR_NOMEM, "hf export: out of memory");
            break;
        }
        st = jdt_train_read_param(ck, p, x.params[i], e);
        done_mb += (double)jdt_shape_numel(&p->shape) * sizeof(float) / 1048576.0;
        jdt_progress_update(&prog, done_mb);
    }
    jdt_progress_end(&prog);
    if (st != JDT_OK) goto out;
    x.cap = 16 + 16 * cfg.model.n_layer;
    x.out = jdt_calloc((size_t)x.cap, sizeof *x.out);
    x.owned = jdt_calloc((size_t)x.cap * 2, sizeof *x.owned);
    if (!x.out || !x.owned) goto oom;

    const int64_t L = cfg.model.n_layer, C = cfg.model.n_embd, H = cfg.model.n_head;
    const int64_t Hkv = jdt_config_kv_heads(&cfg), D = jdt_config_head_dim(&cfg), F = jdt_config_mlp_dim(&cfg);
    const int64_t V = cfg.model.vocab_size, T = cfg.model.seq_len;
    char a[200], b[200];
#define EMIT(ours, hf, tr, rope)                                                                   \
    do {                                                                                           \
        if ((st = emit_param(&x, ours, hf, tr, rope))) goto out;                                   \
    } while (0)
    if (!llama) {
        EMIT("wte", "transformer.wte.weight", false, 0);
        EMIT("wpe", "transformer.wpe.weight", false, 0);
        for (int64_t l = 0; l < L; l++) {
            for (size_t k = 0; k < JDT_ARRAY_LEN(GPT2_BLOCK); k++) {
                snprintf(a, sizeof a, "blocks.%lld.%s", (long long)l, GPT2_BLOCK[k][0]);
                snprintf(b, sizeof b, "transformer.h.%lld.%s", (long long)l, GPT2_BLOCK[k][1]);
                EMIT(a, b, false, 0);
            }
            /* c_attn: (C, 3C) = [q | k | v] along columns; bias likewise */
            float *w = own(&x, (size_t)(C * 3 * C)), *bias = own(&x, (size_t)(3 * C));
            if (!w || !bias) goto oom;
            const char *qkv[3] = {"q", "k", "v"};
            for (int s = 0; s < 3; s++) {
                int64_t r, k;
                snprintf(a, sizeof a, "blocks.%lld.attn.%s.w", (long long)l, qkv[s]);
                const float *pw = param(&x, a, &r, &k);
                snprintf(a, sizeof a, "blocks.%lld.attn.%s.b", (long long)l, qkv[s]);
                const float *pb = param(&x, a, &r, &k);
                if (!pw || !pb) {
                    st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: checkpoint lacks %s", ckpt_path, a);
                    goto out;
                }
                for (int64_t i = 0; i < C; i++) memcpy(w + i * 3 * C + s * C, pw + i * C, (size_t)C * sizeof *w);
                memcpy(bias + s * C, pb, (size_t)C * sizeof *bias);
            }
            snprintf(b, sizeof b, "transformer.h.%lld.attn.c_attn.weight", (long long)l);
            if ((st = emit(&x, b, w, 2, C, 3 * C))) goto out;
            snprintf(b, sizeof b, "transformer.h.%lld.attn.c_attn.bias", (long long)l);
            if ((st = emit(&x, b, bias, 1, 3 * C, 0))) goto out;
        }
        EMIT("ln_f.w", "transformer.ln_f.weight", false, 0);
        EMIT("ln_f.b", "transformer.ln_f.bias", false, 0);
    } else {
        EMIT("wte", "model.embed_tokens.weight", false, 0);
        for (int64_t l = 0; l < L; l++) {
            for (size_t k = 0; k < JDT_ARRAY_LEN(LLAMA_BLOCK); k++) {
                if (LLAMA_BLOCK[k].only >= 0 && LLAMA_BLOCK[k].only != (int)arch) continue;
                snprintf(a, sizeof a, "blocks.%lld.%s", (long long)l, LLAMA_BLOCK[k].ours);
                snprintf(b, sizeof b, "model.layers.%lld.%s", (long long)l, LLAMA_BLOCK[k].hf);
                EMIT(a, b, LLAMA_BLOCK[k].transpose, rope_heads_of(&cfg, LLAMA_BLOCK[k].rope));
            }
        }
        EMIT("ln_f.w", "model.norm.weight", false, 0);
        if (!cfg.model.tie_embeddings) EMIT("head", "lm_head.weight", true, 0);
    }
#undef EMIT
    if ((st = jdt_io_mkdir_p(out_dir, e))) goto out;
    size_t pl = strlen(out_dir) + 32;
    if (!(path = jdt_malloc(pl))) goto oom;
    snprintf(path, pl, "%s/model.safetensors", out_dir);
    static const char *const meta_kv[] = {"format", "pt", "producer", "jdt-train"};
    if ((st = jdt_st_write(path, x.out, x.n_out, meta_kv, 2, e))) goto out;

    int bos = -1, eos = -1;
    if (cfg.data.tokenizer == JDT_TOKENIZER_BPE) {
        if ((st = jdt_prep_bpe_for_run(cfg.data.train_path, cfg.data.tokenizer_path, &tok, e))) goto out;
        snprintf(path, pl, "%s/tokenizer.json", out_dir);
        if ((st = jdt_bpe_save(tok, path, e))) goto out;
        /* BOS: what the tokenizer's template puts before a text (Llama 3's <|begin_of_text|>,
         * Llama 2's <s>, Gemma's <bos>), else GPT-2's <|endoftext|>; EOS: the end-of-text token
         * of the family (<|endoftext|>, <|end_of_text|>, </s>, <eos>), else the BOS */
        const uint32_t *pre;
        int n_pre = 0;
        jdt_err pe;
        if (jdt_bpe_prompt_prefix(tok, &pre, &n_pre, &pe) == JDT_OK && n_pre > 0) bos = (int)pre[0];
        static const char *const ends[] = {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"};
        for (size_t k = 0; k < JDT_ARRAY_LEN(ends) && eos < 0; k++) eos = jdt_bpe_special_id(tok, ends[k]);
        if (bos < 0) bos = jdt_bpe_special_id(tok, "<|endoftext|>");
        if (bos < 0) bos = jdt_bpe_special_id(tok, "<|begin_of_text|>");
        if (eos < 0) eos = bos;
    }
    char *cj = NULL;
    size_t cl = 0;
    FILE *mf = open_memstream(&cj, &cl);
    if (!mf) goto oom;
    fprintf(mf, "{\n  \"architectures\": [\"%s\"],\n", HF_ARCH[arch].class_name);
    if (!llama) {
        fprintf(mf,
                "  \"model_type\": \"gpt2\",\n  \"vocab_size\": %lld,\n  \"n_positions\": %lld,\n"
                "  \"n_ctx\": %lld,\n  \"n_embd\": %lld,\n  \"n_layer\": %lld,\n  \"n_head\": %lld,\n"
                "  \"n_inner\": %lld,\n  \"activation_function\": \"gelu_new\",\n"
                "  \"layer_norm_epsilon\": %.9g,\n  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n"
                "  \"attn_pdrop\": 0.0,\n  \"scale_attn_weights\": true,\n  \"tie_word_embeddings\": true,\n",
                (long long)V, (long long)T, (long long)T, (long long)C, (long long)L, (long long)H,
                (long long)F, cfg.model.norm_eps);
    } else {
        fprintf(mf,
                "  \"model_type\": \"%s\",\n  \"vocab_size\": %lld,\n  \"hidden_size\": %lld,\n"
                "  \"intermediate_size\": %lld,\n  \"num_hidden_layers\": %lld,\n"
                "  \"num_attention_heads\": %lld,\n  \"num_key_value_heads\": %lld,\n  \"head_dim\": %lld,\n"
                "  \"max_position_embeddings\": %lld,\n  \"rms_norm_eps\": %.9g,\n  \"rope_theta\": %.17g,\n"
                "  \"hidden_act\": \"%s\",\n"
                "  \"attention_dropout\": 0.0,\n  \"tie_word_embeddings\": %s,\n",
                HF_ARCH[arch].model_type, (long long)V, (long long)C, (long long)F, (long long)L, (long long)H,
                (long long)Hkv, (long long)D, (long long)T, cfg.model.norm_eps, cfg.model.rope_theta,
                arch == HF_GEMMA ? "gelu_pytorch_tanh" : "silu", cfg.model.tie_embeddings ? "true" : "false");
        /* GemmaMLP reads hidden_activation (hidden_act is the original files' "gelu", ignored) */
        if (arch == HF_GEMMA) fprintf(mf, "  \"hidden_activation\": \"gelu_pytorch_tanh\",\n");
        double sc[4];
        jdt_config_rope_scaling(&cfg, sc);
        if (sc[0] > 0) /* transformers 4's key; 5 reads it too */
            fprintf(mf,
                    "  \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": %.17g, \"low_freq_factor\": %.17g, "
                    "\"high_freq_factor\": %.17g, \"original_max_position_embeddings\": %d},\n",
                    sc[0], sc[1], sc[2], cfg.model.rope_original_max_pos);
        else
            fprintf(mf, "  \"rope_scaling\": null,\n");
        /* Qwen2's q/k/v biases are built in; Llama's and Qwen3's attention_bias would add o's */
        if (arch != HF_QWEN2) fprintf(mf, "  \"attention_bias\": false,\n");
        if (arch == HF_LLAMA) fprintf(mf, "  \"mlp_bias\": false,\n");
        else if (arch != HF_GEMMA) fprintf(mf, "  \"use_sliding_window\": false,\n  \"sliding_window\": null,\n");
    }
    if (bos >= 0) fprintf(mf, "  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n", bos, eos);
    fprintf(mf, "  \"torch_dtype\": \"float32\",\n  \"jdt_tokenizer\": \"%s\"\n}\n",
            cfg.data.tokenizer == JDT_TOKENIZER_BPE ? "bpe" : "byte");
    fclose(mf);
    snprintf(path, pl, "%s/config.json", out_dir);
    st = jdt_write_file_atomic(path, cj, e);
    free(cj);
    if (st) goto out;
    if (arch_out) *arch_out = HF_ARCH[arch].class_name;
    st = JDT_OK;
    goto out;
oom:
    st = jdt_err_set(e, JDT_ERR_NOMEM, "hf export: out of memory");
out:
    for (int i = 0; i < x.n_owned; i++) jdt_free(x.owned[i]);
    jdt_free(x.owned);
    jdt_free(x.out);
    if (x.params)
        for (int i = 0; i < x.m.n_params; i++) jdt_free(x.params[i]);
    jdt_free(x.params);
    jdt_free(path);
    jdt_bpe_free(tok);
    jdt_graph_free(g);
    if (have_cfg) jdt_config_free(&cfg);
    jdt_ckpt_close(ck);
    return st;
}

/* ---- import: checkpoint.init_from ----------------------------------------------------------- */

typedef struct {
    char hf[200];
    bool transpose;
    int64_t rope_heads;
    int slot;  /* GPT-2 c_attn: 0 q, 1 k, 2 v; -1 otherwise */
    float add; /* added to each value read: 1 for Gemma's norm weights */
    int64_t row0, rows; /* Phi-3's fused qkv_proj, gate_up_proj: our rows row0.. of its rows */
} src_map;

/* Where our param `ours` comes from in an HF checkpoint (fused: Phi-3's layout); false if it
 * has no source. */
static bool map_name(const jdt_config *c, const char *ours, bool fused, src_map *m)
{
    const bool llama = arch_of(c) != HF_GPT2;
    memset(m, 0, sizeof *m);
    m->slot = -1;
    long l = -1;
    const char *rest = ours;
    if (strncmp(ours, "blocks.", 7) == 0) {
        char *end;
        l = strtol(ours + 7, &end, 10);
        if (*end != '.') return false;
        rest = end + 1;
    }
    if (!llama) {
        static const char *const top[][2] = {{"wte", "transformer.wte.weight"}, {"wpe", "transformer.wpe.weight"},
                                             {"ln_f.w", "transformer.ln_f.weight"}, {"ln_f.b", "transformer.ln_f.bias"}};
        if (l < 0) {
            for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
                if (strcmp(ours, top[i][0]) == 0) return snprintf(m->hf, sizeof m->hf, "%s", top[i][1]) > 0;
            return false;
        }
        for (size_t i = 0; i < JDT_ARRAY_LEN(GPT2_BLOCK); i++)
            if (strcmp(rest, GPT2_BLOCK[i][0]) == 0)
                return snprintf(m->hf, sizeof m->hf, "transformer.h.%ld.%s", l, GPT2_BLOCK[i][1]) > 0;
        if (strncmp(rest, "attn.", 5) == 0 && (rest[5] == 'q' || rest[5] == 'k' || rest[5] == 'v') && rest[6] == '.') {
            m->slot = rest[5] == 'q' ? 0 : rest[5] == 'k' ? 1 : 2;
            snprintf(m->hf, sizeof m->hf, "transformer.h.%ld.attn.c_attn.%s", l, rest[7] == 'w' ? "weight" : "bias");
            return true;
        }
        return false;
    }
    m->add = offset_norm(arch_of(c), ours) ? 1.0f : 0.0f;
    if (l < 0) {
        if (strcmp(ours, "wte") == 0) return snprintf(m->hf, sizeof m->hf, "model.embed_tokens.weight") > 0;
        if (strcmp(ours, "ln_f.w") == 0) return snprintf(m->hf, sizeof m->hf, "model.norm.weight") > 0;
        if (strcmp(ours, "head") == 0) {
            m->transpose = true;
            return snprintf(m->hf, sizeof m->hf, "lm_head.weight") > 0;
        }
        return false;
    }
    for (size_t i = 0; i < JDT_ARRAY_LEN(LLAMA_BLOCK); i++)
        if (strcmp(rest, LLAMA_BLOCK[i].ours) == 0) {
            m->transpose = LLAMA_BLOCK[i].transpose;
            m->rope_heads = rope_heads_of(c, LLAMA_BLOCK[i].rope);
            /* Phi-3: rows [q | k | v] of qkv_proj, [gate | up] of gate_up_proj */
            static const char *const fused_of[] = {"attn.q.w", "attn.k.w", "attn.v.w", "mlp.gate.w", "mlp.up.w"};
            for (int f = 0; fused && f < 5; f++) {
                if (strcmp(rest, fused_of[f]) != 0) continue;
                const int64_t D = jdt_config_head_dim(c), Q = c->model.n_head * D,
                              KV = jdt_config_kv_heads(c) * D, F = jdt_config_mlp_dim(c);
                const int64_t r0[5] = {0, Q, Q + KV, 0, F};
                m->row0 = r0[f];
                m->rows = f < 3 ? Q + 2 * KV : 2 * F;
                return snprintf(m->hf, sizeof m->hf, "model.layers.%ld.%s", l,
                                f < 3 ? "self_attn.qkv_proj.weight" : "mlp.gate_up_proj.weight") > 0;
            }
            return snprintf(m->hf, sizeof m->hf, "model.layers.%ld.%s", l, LLAMA_BLOCK[i].hf) > 0;
        }
    return false;
}

/* An integer of config.json: the member `key`, or `dflt` where it is absent or null (transformers'
 * defaults: GPT-2's hub config has no n_inner, older Llama configs no num_key_value_heads);
 * dflt < 0 means required. False if present and not an integer, or absent and required. */
static bool hf_int(const jdt_json *r, const char *key, int64_t dflt, int64_t *v)
{
    const jdt_json *j = jdt_json_get(r, key);
    if (!j || j->type == JDT_JSON_NULL) {
        *v = dflt;
        return dflt >= 0;
    }
    return jdt_json_int(j, 0, INT64_MAX / 2, v);
}

/* A number of config.json, or dflt where it is absent or not a number. */
static double hf_num(const jdt_json *r, const char *key, double dflt)
{
    const jdt_json *j = jdt_json_get(r, key);
    return j && j->type == JDT_JSON_NUMBER ? j->num : dflt;
}

/* config.json's RoPE: transformers 4 writes "rope_theta" and "rope_scaling" (null, or an object
 * with "rope_type", or "type" in older files), transformers 5 one "rope_parameters" object
 * holding both. */
typedef struct {
    double theta;
    const char *type; /* NULL or "default": none; "llama3" reads into sc */
    double sc[4];     /* jdt_rope_freq's: factor, low/high_freq_factor, original context */
} hf_rope;

static hf_rope hf_rope_of(const jdt_json *r)
{
    hf_rope h = {.theta = hf_num(r, "rope_theta", 10000.0)};
    const jdt_json *rp = jdt_json_get(r, "rope_parameters");
    const jdt_json *sc = rp && rp->type == JDT_JSON_OBJECT ? rp : jdt_json_get(r, "rope_scaling");
    if (rp && rp->type == JDT_JSON_OBJECT) h.theta = hf_num(rp, "rope_theta", h.theta);
    if (!sc || sc->type != JDT_JSON_OBJECT) return h;
    h.type = jdt_json_str(jdt_json_get(sc, "rope_type"));
    if (!h.type) h.type = jdt_json_str(jdt_json_get(sc, "type"));
    if (h.type && strcmp(h.type, "default") == 0) h.type = NULL;
    if (h.type && strcmp(h.type, "llama3") == 0) {
        h.sc[0] = hf_num(sc, "factor", 8.0);
        h.sc[1] = hf_num(sc, "low_freq_factor", 1.0);
        h.sc[2] = hf_num(sc, "high_freq_factor", 4.0);
        h.sc[3] = hf_num(sc, "original_max_position_embeddings", 8192.0);
    }
    return h;
}

/* Whether a Llama-family config.json ties the head to the embedding (tie_word_embeddings;
 * absent: GemmaConfig's default is tied, LlamaConfig's untied). */
static bool hf_tied(const jdt_json *r, int arch)
{
    const jdt_json *tie = jdt_json_get(r, "tie_word_embeddings");
    return tie ? tie->type == JDT_JSON_TRUE : arch == HF_GEMMA;
}

/* The sliding window config.json's model attends over (Mistral's and Phi-3's "sliding_window";
 * Qwen's where "use_sliding_window" is true), or 0 for its whole context. */
static int64_t hf_window(const jdt_json *r, const char *model_type)
{
    const jdt_json *usw = jdt_json_get(r, "use_sliding_window");
    int64_t window = 0;
    if ((model_type && (strcmp(model_type, "mistral") == 0 || strcmp(model_type, "phi3") == 0)) ||
        (usw && usw->type == JDT_JSON_TRUE))
        if (!hf_int(r, "sliding_window", 0, &window) || window < 0) window = 0;
    return window;
}

/* Parses dir/config.json (its path into p) and finds its model_type (NULL when absent). */
static jdt_status open_hf_config(const char *dir, char *p, size_t n, jdt_json_doc **doc,
                                 const jdt_json **root, const char **model_type, jdt_err *e)
{
    snprintf(p, n, "%s/config.json", dir);
    jdt_status st = jdt_json_parse_file(p, doc, e);
    if (st) return st;
    *root = jdt_json_root(*doc);
    *model_type = jdt_json_str(jdt_json_get(*root, "model_type"));
    return JDT_OK;
}

/* Checks config.json against cfg: every dimension must agree (the error names both values);
 * settings that change the function but not the shapes (norm epsilon, RoPE base and scaling,
 * the activation's form) are warned about, since a run may change them on purpose. *fused:
 * whether the weights are in Phi-3's fused layout (read_hf_param). */
static jdt_status check_hf_config(const char *dir, const jdt_config *c, bool *fused, jdt_err *e)
{
    char p[1100];
    jdt_json_doc *doc = NULL;
    const jdt_json *r;
    const char *mt;
    jdt_status st = open_hf_config(dir, p, sizeof p, &doc, &r, &mt, e);
    if (st) return st;
    *fused = mt && strcmp(mt, "phi3") == 0;
    const hf_arch arch = arch_of(c);
    const bool llama = arch != HF_GPT2;
    const int file_arch = arch_of_model_type(mt);
    if (file_arch < 0) {
        st = jdt_err_set(e, JDT_ERR_UNSUPPORTED, "%s: model_type '%s': only " HF_MODEL_TYPES " map to a gpt", p, mt ? mt : "?");
        goto out;
    }
    if (file_arch != (int)arch) {
        st = jdt_err_set(e, JDT_ERR_CONFIG, "%s: model_type '%s' but this config's gpt maps to '%s': set %s",
                         p, mt, HF_ARCH[arch].model_type, HF_ARCH[file_arch].needs);
        goto out;
    }
    /* what the family's classes can hold that a gpt cannot */
    const jdt_json *ab = jdt_json_get(r, "attention_bias"), *mb = jdt_json_get(r, "mlp_bias");
    if (llama && arch != HF_QWEN2 && ab && ab->type == JDT_JSON_TRUE) {
        st = jdt_err_set(e, JDT_ERR_UNSUPPORTED, "%s: attention_bias is true (biases on q, k, v and o): a gpt has "
                         "q/k/v biases only, as Qwen2 (model.qkv_bias)", p);
        goto out;
    }
    if (llama && mb && mb->type == JDT_JSON_TRUE) {
        st = jdt_err_set(e, JDT_ERR_UNSUPPORTED, "%s: mlp_bias is true: a gpt of the Llama family has no MLP biases", p);
        goto out;
    }
    /* Phi-4-mini rotates 3/4 of each head; a gpt's RoPE rotates all of it */
    const jdt_json *rpar = jdt_json_get(r, "rope_parameters"); /* transformers 5 may hold it there */
    const double prf = hf_num(rpar, "partial_rotary_factor", hf_num(r, "partial_rotary_factor", 1.0));
    if (llama && prf != 1.0) {
        st = jdt_err_set(e, JDT_ERR_UNSUPPORTED, "%s: partial_rotary_factor is %g: a gpt's RoPE rotates whole heads", p,
                         prf);
        goto out;
    }
    /* a sliding window shorter than the run's context would attend elsewhere than this gpt */
    const int64_t window = llama ? hf_window(r, mt) : 0;
    if (window > 0 && window < c->model.seq_len) {
        st = jdt_err_set(e, JDT_ERR_CONFIG, "%s: sliding_window is %lld, below this config's model.seq_len %d "
                         "(a gpt attends to its whole context): set model.seq_len <= %lld",
                         p, (long long)window, c->model.seq_len, (long long)window);
        goto out;
    }
    int64_t heads = 0, embd = 0;
    hf_int(r, llama ? "num_attention_heads" : "n_head", -1, &heads);
    hf_int(r, llama ? "hidden_size" : "n_embd", -1, &embd);
    const struct {
        const char *key, *ours;
        int64_t want, dflt;
    } dims[] = {
        {"vocab_size", "model.vocab_size", c->model.vocab_size, -1},
        {llama ? "hidden_size" : "n_embd", "model.n_embd", c->model.n_embd, -1},
        {llama ? "num_hidden_layers" : "n_layer", "model.n_layer", c->model.n_layer, -1},
        {llama ? "num_attention_heads" : "n_head", "model.n_head", c->model.n_head, -1},
        {llama ? "num_key_value_heads" : "n_head", "model.n_kv_head", jdt_config_kv_heads(c), heads},
        {llama ? "intermediate_size" : "n_inner", "model.mlp_dim (or mlp_ratio * n_embd)", jdt_config_mlp_dim(c),
         llama ? -1 : 4 * embd},
        {"head_dim", "model.head_dim (or n_embd / n_head)", jdt_config_head_dim(c), heads > 0 ? embd / heads : 0},
    };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        int64_t v;
        if (!hf_int(r, dims[i].key, dims[i].dflt, &v)) {
            st = jdt_err_set(e, JDT_ERR_CONFIG, "%s: %s is %s (this config's %s is %lld)", p, dims[i].key,
                             jdt_json_get(r, dims[i].key) ? "not an integer" : "missing", dims[i].ours,
                             (long long)dims[i].want);
            goto out;
        }
        if (v != dims[i].want) {
            st = jdt_err_set(e, JDT_ERR_CONFIG, "%s: %s is %lld but this config's %s is %lld", p, dims[i].key,
                             (long long)v, dims[i].ours, (long long)dims[i].want);
            goto out;
        }
    }
    if (!llama) {
        int64_t v;
        if (!hf_int(r, "n_positions", -1, &v)) {
            st = jdt_err_set(e, JDT_ERR_CONFIG, "%s: n_positions is missing or not an integer", p);
            goto out;
        }
        if (v < c->model.seq_len) {
            st = jdt_err_set(e, JDT_ERR_CONFIG, "%s: n_positions is %lld, below this config's model.seq_len %d",
                             p, (long long)v, c->model.seq_len);
            goto out;
        }
    } else {
        const bool tied = hf_tied(r, arch);
        if (tied != c->model.tie_embeddings) {
            st = jdt_err_set(e, JDT_ERR_CONFIG, "%s: tie_word_embeddings is %s but this config's "
                             "model.tie_embeddings is %s", p, tied ? "true" : "false",
                             c->model.tie_embeddings ? "true" : "false");
            goto out;
        }
    }
    /* transformers' defaults where the key is absent */
    double eps = hf_num(r, llama ? "rms_norm_eps" : "layer_norm_epsilon", llama ? 1e-6 : 1e-5);
    if (fabs(eps - c->model.norm_eps) > 1e-3 * c->model.norm_eps)
        JDT_WARN("init_from %s: %s is %g, this config's model.norm_eps %g: the run uses %g", dir,
                 llama ? "rms_norm_eps" : "layer_norm_epsilon", eps, c->model.norm_eps, c->model.norm_eps);
    /* GemmaMLP reads hidden_activation (absent or null: the tanh GELU; the original files'
     * hidden_act "gelu" is not used) */
    const bool gemma = arch == HF_GEMMA;
    const char *act_key = gemma ? "hidden_activation" : llama ? "hidden_act" : "activation_function";
    const char *act = jdt_json_str(jdt_json_get(r, act_key));
    const bool tanh_gelu = act && (strcmp(act, "gelu_new") == 0 || strcmp(act, "gelu_pytorch_tanh") == 0);
    if (act && !(llama && !gemma ? strcmp(act, "silu") == 0 : tanh_gelu))
        JDT_WARN("init_from %s: %s is '%s'; this gpt computes %s", dir, act_key, act,
                 gemma ? "the tanh GELU (GeGLU)" : llama ? "silu (SwiGLU)" : "the tanh GELU (gelu_new)");
    if (llama) {
        const hf_rope h = hf_rope_of(r);
        if (fabs(h.theta - c->model.rope_theta) > 1e-6 * h.theta)
            JDT_WARN("init_from %s: rope_theta is %g, this config's model.rope_theta %g: the run uses %g", dir,
                     h.theta, c->model.rope_theta, c->model.rope_theta);
        double ours[4];
        jdt_config_rope_scaling(c, ours);
        if (h.type && strcmp(h.type, "llama3") != 0) {
            JDT_WARN("init_from %s: config.json's RoPE scaling is '%s', which this gpt does not compute (only "
                     "llama3's): the run uses %s", dir, h.type, ours[0] > 0 ? "llama3's" : "plain RoPE");
        } else if (!h.type && ours[0] > 0) {
            JDT_WARN("init_from %s: config.json scales no RoPE frequencies; this config's model.rope_scaling "
                     "llama3 is used", dir);
        } else if (h.type && (ours[0] <= 0 || memcmp(ours, h.sc, sizeof ours) != 0)) {
            JDT_WARN("init_from %s: config.json's RoPE scaling is llama3 (factor %g, low_freq_factor %g, "
                     "high_freq_factor %g, original_max_position_embeddings %g): set model.rope_scaling=llama3 "
                     "model.rope_factor=%g model.rope_low_freq_factor=%g model.rope_high_freq_factor=%g "
                     "model.rope_original_max_pos=%g to compute it; the run uses %s", dir, h.sc[0], h.sc[1],
                     h.sc[2], h.sc[3], h.sc[0], h.sc[1], h.sc[2], h.sc[3],
                     ours[0] > 0 ? "this config's llama3 values" : "plain RoPE");
        }
    }
out:
    jdt_json_doc_free(doc);
    return st;
}

/* A model's weights: model.safetensors, or the shards model.safetensors.index.json lists in its
 * "weight_map" (tensor name -> file in the same directory; transformers writes them for models
 * above its shard size, 5 GB by default). */
enum { HF_MAX_SHARDS = 256 };
typedef struct {
    jdt_st_file *f[HF_MAX_SHARDS];
    int n;
    bool fused; /* Phi-3's qkv_proj and gate_up_proj (check_hf_config sets it) */
} hf_files;

static void hf_files_close(hf_files *h)
{
    for (int i = 0; i < h->n; i++) jdt_st_close(h->f[i]);
    h->n = 0;
}

static jdt_status hf_files_open(const char *dir, hf_files *h, jdt_err *e)
{
    h->n = 0;
    char p[1100];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    if (jdt_io_is_file(p)) {
        jdt_status st = jdt_st_open(p, &h->f[0], e);
        if (st == JDT_OK) h->n = 1;
        return st;
    }
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    jdt_json_doc *doc = NULL;
    jdt_status st = jdt_json_parse_file(p, &doc, e);
    if (st) return st;
    const jdt_json *map = jdt_json_get(jdt_json_root(doc), "weight_map");
    if (!map || map->type != JDT_JSON_OBJECT || !map->child)
        st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: no \"weight_map\" object", p);
    /* each file once, in the order the map first names it */
    const char *names[HF_MAX_SHARDS];
    for (const jdt_json *m = map ? map->child : NULL; m && st == JDT_OK; m = m->next) {
        const char *file = jdt_json_str(m);
        if (!file || !file[0] || strchr(file, '/') || strcmp(file, "..") == 0) {
            st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: '%s' maps to '%s', not a file name in the directory",
                             p, m->key, file ? file : "(not a string)");
            break;
        }
        int k = 0;
        while (k < h->n && strcmp(names[k], file) != 0) k++;
        if (k < h->n) continue;
        if (h->n == HF_MAX_SHARDS) {
            st = jdt_err_set(e, JDT_ERR_UNSUPPORTED, "%s: more than %d files", p, HF_MAX_SHARDS);
            break;
        }
        char fp[1400];
        snprintf(fp, sizeof fp, "%s/%s", dir, file);
        if ((st = jdt_st_open(fp, &h->f[h->n], e)) == JDT_OK) names[h->n++] = file;
    }
    jdt_json_doc_free(doc);
    if (st) hf_files_close(h);
    return st;
}

/* The file and index of tensor name, or -1. */
static int hf_find(const hf_files *h, const char *name, jdt_st_file **which)
{
    for (int k = 0; k < h->n; k++) {
        int i = jdt_st_find(h->f[k], name);
        if (i >= 0) {
            *which = h->f[k];
            return i;
        }
    }
    return -1;
}

static jdt_status read_hf_param(const hf_files *hfs, const char *dir, const jdt_config *c, const char *ours,
                                const jdt_shape *shape, float *dst, jdt_err *e)
{
    src_map m;
    if (!map_name(c, ours, hfs->fused, &m))
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "%s: no Hugging Face tensor maps to our param '%s'", dir, ours);
    jdt_st_file *sf = NULL;
    int i = hf_find(hfs, m.hf, &sf);
    if (i < 0) { /* a file saved from the base model (GPT2Model, LlamaModel) has no prefix: the hub's gpt2 */
        const char *dot = strchr(m.hf, '.');
        if (dot && (strncmp(m.hf, "transformer.", 12) == 0 || strncmp(m.hf, "model.", 6) == 0))
            i = hf_find(hfs, dot + 1, &sf);
    }
    if (i < 0) return jdt_err_set(e, JDT_ERR_FORMAT, "%s: no tensor '%s' in its weights (for '%s')", dir, m.hf, ours);
    jdt_st_tensor info = jdt_st_info(sf, i);
    int64_t r = shape->dims[0], k = shape->ndim > 1 ? shape->dims[1] : 1;
    int64_t want0 = m.transpose ? k : r, want1 = m.transpose ? r : k;
    if (m.slot >= 0) want1 = shape->ndim > 1 ? 3 * k : 0, want0 = shape->ndim > 1 ? r : 3 * r;
    if (m.rows > 0) want0 = m.rows; /* Phi-3: ours is rows [row0, row0 + k) of the fused tensor */
    /* GPT-2's position table has n_positions rows (checked >= seq_len): a shorter run takes the first */
    bool rows_prefix = strcmp(ours, "wpe") == 0 && info.ndim == 2 && info.shape[0] >= want0;
    bool ok = info.ndim == shape->ndim && (info.shape[0] == want0 || rows_prefix) &&
              (info.ndim == 1 || info.shape[1] == want1);
    if (!ok)
        return jdt_err_set(e, JDT_ERR_FORMAT, "%s/model.safetensors: '%s' has shape (%lld%s%lld), expected (%lld, %lld) for '%s'",
                           dir, m.hf, (long long)info.shape[0], info.ndim > 1 ? ", " : "",
                           info.ndim > 1 ? (long long)info.shape[1] : 0LL, (long long)want0, (long long)want1, ours);
    int64_t n = info.shape[0] * (info.ndim > 1 ? info.shape[1] : 1);
    float *buf = jdt_malloc((size_t)n * sizeof *buf);
    if (!buf) return jdt_err_set(e, JDT_ERR_NOMEM, "init_from: out of memory");
    jdt_status st = jdt_st_read(sf, i, buf, e);
    if (st == JDT_OK) {
        if (m.slot >= 0 && shape->ndim > 1) {
            for (int64_t a = 0; a < r; a++) memcpy(dst + a * k, buf + a * 3 * k + m.slot * k, (size_t)k * sizeof *dst);
        } else if (m.slot >= 0) {
            memcpy(dst, buf + m.slot * r, (size_t)r * sizeof *dst);
        } else if (shape->ndim == 1 && m.rope_heads > 0) { /* q/k bias, q/k norm scale */
            for (int64_t j = 0; j < r; j++) dst[j] = buf[rope_row(j, r / m.rope_heads)];
        } else if (!m.transpose || shape->ndim == 1) {
            memcpy(dst, buf, (size_t)(r * k) * sizeof *dst);
            if (m.add != 0.0f)
                for (int64_t j = 0; j < r * k; j++) dst[j] += m.add;
        } else { /* buf is (k, r), rows permuted for rope: inverse of emit_param */
            const int64_t D = m.rope_heads > 0 ? k / m.rope_heads : 0;
            const float *rows = buf + m.row0 * r;
            for (int64_t j = 0; j < k; j++) {
                const int64_t src = m.rope_heads > 0 ? rope_row(j, D) : j;
                for (int64_t a = 0; a < r; a++) dst[a * k + j] = rows[src * r + a];
            }
        }
    }
    jdt_free(buf);
    return st;
}

bool jdt_hf_is_model_dir(const char *path)
{
    char p[1100], q[1100];
    snprintf(p, sizeof p, "%s/model.safetensors", path);
    snprintf(q, sizeof q, "%s/model.safetensors.index.json", path);
    if (!jdt_io_is_file(p) && !jdt_io_is_file(q)) return false;
    snprintf(p, sizeof p, "%s/config.json", path);
    return jdt_io_is_file(p);
}

/* The longest context `sample` gives a model read from config.json: Llama 3's 131072
 * positions would size a KV cache of gigabytes per sequence */
enum { HF_SAMPLE_MAX_T = 4096 };

jdt_status jdt_hf_config_yaml(const char *dir, char **yaml, jdt_err *e)
{
    *yaml = NULL;
    char p[1100];
    jdt_json_doc *doc = NULL;
    const jdt_json *r;
    const char *mt;
    jdt_status st = open_hf_config(dir, p, sizeof p, &doc, &r, &mt, e);
    if (st) return st;
    const int arch = arch_of_model_type(mt);
    const bool llama = arch != HF_GPT2;
    int64_t V = 0, C = 0, L = 0, H = 0, Hkv = 0, F = 0, T = 0, D = 0;
    if (arch < 0) {
        st = jdt_err_set(e, JDT_ERR_UNSUPPORTED, "%s: model_type '%s': only " HF_MODEL_TYPES " map to a gpt", p, mt ? mt : "?");
        goto out;
    }
    const char *miss = NULL;
    if (!hf_int(r, "vocab_size", -1, &V)) miss = "vocab_size";
    else if (!hf_int(r, llama ? "hidden_size" : "n_embd", -1, &C)) miss = llama ? "hidden_size" : "n_embd";
    else if (!hf_int(r, llama ? "num_hidden_layers" : "n_layer", -1, &L)) miss = llama ? "num_hidden_layers" : "n_layer";
    else if (!hf_int(r, llama ? "num_attention_heads" : "n_head", -1, &H)) miss = llama ? "num_attention_heads" : "n_head";
    else if (!hf_int(r, "num_key_value_heads", H, &Hkv)) miss = "num_key_value_heads";
    else if (!hf_int(r, llama ? "intermediate_size" : "n_inner", llama ? -1 : 4 * C, &F))
        miss = llama ? "intermediate_size" : "n_inner";
    else if (!hf_int(r, llama ? "max_position_embeddings" : "n_positions", -1, &T))
        miss = llama ? "max_position_embeddings" : "n_positions";
    else if (!hf_int(r, "head_dim", H > 0 ? C / H : 0, &D)) miss = "head_dim";
    if (miss) {
        st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: %s is missing or not an integer", p, miss);
        goto out;
    }
    if (llama && T > HF_SAMPLE_MAX_T) T = HF_SAMPLE_MAX_T;
    /* Mistral 7B v0.1 attends over a window of 4096: the context it was trained to use */
    const int64_t window = hf_window(r, mt);
    if (window > 0 && window < T) T = window;
    const bool tied = !llama || hf_tied(r, arch); /* GPT2LMHeadModel always ties */
    char tok[1100];
    snprintf(tok, sizeof tok, "%s/tokenizer.json", dir);
    const char *jt = jdt_json_str(jdt_json_get(r, "jdt_tokenizer"));
    const bool bpe = jdt_io_is_file(tok);
    if (!bpe && !(jt && strcmp(jt, "byte") == 0)) {
        st = jdt_err_set(e, JDT_ERR_NOT_FOUND, "%s: no tokenizer.json beside the model (its ids would mean "
                         "nothing)", dir);
        goto out;
    }
    size_t cap = 2048 + strlen(dir);
    if (!(*yaml = jdt_malloc(cap))) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "out of memory");
        goto out;
    }
    const hf_rope rope = hf_rope_of(r);
    char scaling[320] = "";
    if (llama && rope.type && strcmp(rope.type, "llama3") == 0)
        snprintf(scaling, sizeof scaling,
                 "  rope_scaling: llama3\n  rope_factor: %.17g\n  rope_low_freq_factor: %.17g\n"
                 "  rope_high_freq_factor: %.17g\n  rope_original_max_pos: %.0f\n",
                 rope.sc[0], rope.sc[1], rope.sc[2], rope.sc[3]);
    /* another scaling: plain RoPE, which check_hf_config warns of when the weights are read */
    /* rope_theta and the epsilons as %.17g: they round-trip */
    snprintf(*yaml, cap,
             "model:\n  type: gpt\n  vocab_size: %lld\n  seq_len: %lld\n  n_layer: %lld\n  n_embd: %lld\n"
             "  n_head: %lld\n  n_kv_head: %lld\n  head_dim: %lld\n  mlp_dim: %lld\n  norm: %s\n  norm_eps: %.17g\n"
             "  pos: %s\n  rope_theta: %.17g\n  activation: %s\n  tie_embeddings: %s\n  bias: %s\n"
             "  qkv_bias: %s\n  qk_norm: %s\n  embed_scale: %s\n%s"
             "data:\n  tokenizer: %s\n  tokenizer_path: \"%s\"\n",
             (long long)V, (long long)T, (long long)L, (long long)C, (long long)H, (long long)Hkv, (long long)D,
             (long long)F, llama ? "rmsnorm" : "layernorm",
             hf_num(r, llama ? "rms_norm_eps" : "layer_norm_epsilon", llama ? 1e-6 : 1e-5), llama ? "rope" : "learned",
             rope.theta, arch == HF_GEMMA ? "geglu" : llama ? "swiglu" : "gelu", tied ? "true" : "false",
             llama ? "false" : "true", arch == HF_QWEN2 ? "true" : "false", arch == HF_QWEN3 ? "true" : "false",
             arch == HF_GEMMA ? "true" : "false", scaling, bpe ? "bpe" : "byte",
             bpe ? dir : "");
out:
    jdt_json_doc_free(doc);
    return st;
}

/* Adds config.json-style eos_token_id (v: an id, a list, null) of file p to ids. */
static jdt_status add_eos(const char *p, const jdt_json *v, int vocab, int *ids, int *n, jdt_err *e)
{
    if (!v || v->type == JDT_JSON_NULL) return JDT_OK;
    const jdt_json *one = v->type == JDT_JSON_ARRAY ? v->child : v;
    for (; one; one = v->type == JDT_JSON_ARRAY ? one->next : NULL) {
        int64_t id;
        if (!jdt_json_int(one, 0, vocab - 1, &id))
            return jdt_err_set(e, JDT_ERR_FORMAT, "%s: eos_token_id holds something other than an id in [0, %d)",
                               p, vocab);
        bool seen = false;
        for (int i = 0; i < *n; i++) seen = seen || ids[i] == (int)id;
        if (!seen && *n < JDT_HF_MAX_EOS) ids[(*n)++] = (int)id;
    }
    return JDT_OK;
}

jdt_status jdt_hf_eos_ids(const char *dir, int vocab, int *ids, int *n, jdt_err *e)
{
    *n = 0;
    static const char *const files[2] = {"config.json", "generation_config.json"};
    for (int f = 0; f < 2; f++) {
        char p[1100];
        snprintf(p, sizeof p, "%s/%s", dir, files[f]);
        if (f == 1 && !jdt_io_is_file(p)) break;
        jdt_json_doc *doc = NULL;
        jdt_status st = jdt_json_parse_file(p, &doc, e);
        if (st == JDT_OK) st = add_eos(p, jdt_json_get(jdt_json_root(doc), "eos_token_id"), vocab, ids, n, e);
        jdt_json_doc_free(doc);
        if (st != JDT_OK) return st;
    }
    return JDT_OK;
}

jdt_status jdt_hf_read_params(const char *dir, const jdt_config *c, int n, const char *const *names,
                              const jdt_shape *shapes, float *const *dst, jdt_err *e)
{
    hf_files hfs = {.n = 0};
    jdt_status st = check_hf_config(dir, c, &hfs.fused, e);
    if (st == JDT_OK) st = hf_files_open(dir, &hfs, e);
    for (int i = 0; i < n && st == JDT_OK; i++)
        st = read_hf_param(&hfs, dir, c, names[i], &shapes[i], dst[i], e);
    hf_files_close(&hfs);
    return st;
}

jdt_status jdt_hf_init_from(jdt_step *step, const jdt_config *c, const char *path, jdt_err *e)
{
    char st_path[1100];
    snprintf(st_path, sizeof st_path, "%s/model.safetensors", path);
    char idx_path[1100];
    snprintf(idx_path, sizeof idx_path, "%s/model.safetensors.index.json", path);
    bool hf = jdt_io_is_file(st_path) || jdt_io_is_file(idx_path);
    snprintf(st_path, sizeof st_path, "%s/pytorch_model.bin", path);
    if (!hf && jdt_io_is_file(st_path)) /* a Hugging Face directory we do not read: not "no checkpoint" */
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "checkpoint.init_from %s: pytorch_model.bin holds PyTorch "
                           "pickle weights; save them with safe_serialization=True", path);
    hf_files hfs = {.n = 0};
    jdt_ckpt *ck = NULL;
    char *ckpt = NULL;
    jdt_status st = JDT_OK;
    if (hf) {
        const char *bad = c->model.type == JDT_MODEL_GPT ? mismatch(c) : "model.type must be gpt";
        if (bad)
            return jdt_err_set(e, JDT_ERR_CONFIG, "checkpoint.init_from %s: a Hugging Face model needs a gpt that maps "
                               "to a transformers architecture (" HF_ARCH_NAMES "): %s", path, bad);
        if ((st = check_hf_config(path, c, &hfs.fused, e)) || (st = hf_files_open(path, &hfs, e))) goto out;
    } else {
        if (jdt_ckpt_find_latest(path, &ckpt, NULL, NULL) != JDT_OK || !ckpt) {
            jdt_free(ckpt);
            if (!(ckpt = jdt_strdup(path))) return jdt_err_set(e, JDT_ERR_NOMEM, "out of memory");
        }
        if ((st = jdt_ckpt_open(ckpt, &ck, e))) {
            if (st == JDT_ERR_NOT_FOUND)
                st = jdt_err_set(e, JDT_ERR_NOT_FOUND,
                                 "checkpoint.init_from %s: neither a jdt checkpoint nor a directory with model.safetensors",
                                 path);
            goto out;
        }
        /* another model's weights would load in part (fewer layers), or fail on the first
         * tensor missing: the stored config names the difference */
        jdt_ckpt_meta meta;
        jdt_ckpt_get_meta(ck, &meta);
        char why[160];
        const char *key = jdt_train_ckpt_differs(c, meta.config_text, ckpt, false, why, sizeof why);
        if (key) {
            st = jdt_err_set(e, JDT_ERR_CONFIG,
                             "checkpoint.init_from %s: the checkpoint holds another model (%s): "
                             "set this config's %s to match",
                             ckpt, why, key);
            goto out;
        }
    }
    /* under a sharded mesh (FSDP, tensor parallel) each rank holds a block of a param: its
     * global shape and offset say which part of the source's tensor to read */
    float *whole = NULL;
    int n = jdt_step_n_tensors(step);
    for (int i = 0; i < n && st == JDT_OK; i++) {
        const char *name;
        float *data;
        jdt_shape shape, global;
        int64_t off[JDT_MAX_DIMS] = {0};
        jdt_step_tensor(step, i, &name, &data, &shape);
        if (strncmp(name, "params/", 7) != 0) continue;
        jdt_step_tensor_block(step, i, &global, off);
        const bool block = jdt_shape_numel(&global) != jdt_shape_numel(&shape);
        if (hf && !block) {
            st = read_hf_param(&hfs, path, c, name + 7, &shape, data, e);
        } else if (hf && shape.ndim > 2) {
            st = jdt_err_set(e, JDT_ERR_UNSUPPORTED, "init_from: '%s' has %d dims, sharded", name, shape.ndim);
        } else if (hf) {
            jdt_free(whole);
            if (!(whole = jdt_malloc((size_t)jdt_shape_numel(&global) * sizeof *whole))) {
                st = jdt_err_set(e, JDT_ERR_NOMEM, "init_from: out of memory");
                break;
            }
            if ((st = read_hf_param(&hfs, path, c, name + 7, &global, whole, e))) break;
            const int64_t rows = shape.ndim > 1 ? shape.dims[0] : 1, cols = shape.dims[shape.ndim - 1];
            const int64_t g_cols = global.dims[global.ndim - 1];
            const int64_t r0 = shape.ndim > 1 ? off[0] : 0, c0 = off[shape.ndim - 1];
            for (int64_t a = 0; a < rows; a++)
                memcpy(data + a * cols, whole + (r0 + a) * g_cols + c0, (size_t)cols * sizeof *data);
        } else {
            jdt_ckpt_tensor want;
            memset(&want, 0, sizeof want);
            want.name = name;
            want.dtype = JDT_DTYPE_F32;
            want.ndim = shape.ndim;
            for (int d = 0; d < shape.ndim; d++) {
                want.shape[d] = global.dims[d];
                want.offset[d] = off[d];
                want.extent[d] = shape.dims[d];
            }
            st = jdt_ckpt_read(ck, &want, data, e);
        }
    }
    jdt_free(whole);
    jdt_step_host_changed(step); /* a device backend uploads them before the next run */
out:
    hf_files_close(&hfs);
    jdt_ckpt_close(ck);
    jdt_free(ckpt);
    return st;
}
