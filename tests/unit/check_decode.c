/*
 * check_decode.c — the KV-cache decoder (engine/train/decode.h) against the full forward graph
 * (models/ built for one row, run by the compiled program or the reference interpreter): for
 * several gpt configs covering every option (layernorm/rmsnorm, learned/rope, gelu/relu/swiglu,
 * GQA, tied/untied head, biases on/off, q/k/v-only biases, q/k norm, a head_dim apart from
 * n_embd / n_head, an MLP width apart from mlp_ratio), the next-token logits at every position
 * agree within 1e-4 whether the cache is filled by one prefill or one token at a time, and greedy
 * decoding gives the same tokens as greedy decoding with the full forward. Parameters, biases and
 * norm weights included, are random (not the init's zeros/ones) so every term counts.
 */
#include "compile/compile.h"
#include "config/config.h"
#include "graph/builder.h"
#include "models/models.h"
#include "train/decode.h"
#include "tests/unit/testutil.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *BASE = "run: {seed: 11}\n"
                          "model: {type: gpt, vocab_size: 61, seq_len: 24, n_layer: 2, n_embd: 32, "
                          "n_head: 4, mlp_ratio: 2}\n"
                          "data: {format: synthetic, batch_size: 1, micro_batch_size: 1}\n";

typedef struct {
    jdt_config cfg;
    jdt_graph *g;
    jdt_model m;
    float **data;
    jdt_program *prog;
    int32_t *x, *y;
    char cache[64];
} fixture;

static void fixture_init(fixture *f, int n_over, char **over, bool jit)
{
    memset(f, 0, sizeof *f);
    jdt_err e;
    jdt_err_clear(&e);
    ck_assert_msg(jdt_config_load_string(BASE, "test", n_over, over, NULL, &f->cfg, &e) == JDT_OK,
                  "config: %s", e.msg);
    f->g = jdt_graph_new();
    ck_assert_ptr_nonnull(f->g);
    ck_assert_msg(jdt_model_build(f->g, &f->cfg, 1, false, &f->m, &e) == JDT_OK, "%s", e.msg);
    jdt_graph_add_output(f->g, f->m.logits);
    f->data = calloc((size_t)f->m.n_params, sizeof *f->data);
    for (int i = 0; i < f->m.n_params; i++) {
        jdt_tensor *t = f->m.params[i].t;
        size_t n = (size_t)jdt_shape_numel(&t->shape);
        f->data[i] = jdt_malloc_aligned(n * sizeof(float));
        jdt_rng_normal(jdt_rng_key(5, t->name), 0, n, f->data[i]);
        /* matrices N(0, 0.25); norm weights 1 + N(0, 0.2); biases N(0, 0.2) */
        const bool is_norm_w =
            t->shape.ndim == 1 &&
            (strstr(t->name, "ln") != NULL || strstr(t->name, "_norm") != NULL) &&
            t->name[strlen(t->name) - 1] == 'w';
        for (size_t k = 0; k < n; k++)
            f->data[i][k] = t->shape.ndim == 2 ? 0.25f * f->data[i][k]
                            : is_norm_w        ? 1.0f + 0.2f * f->data[i][k]
                                               : 0.2f * f->data[i][k];
        t->data = f->data[i];
    }
    const int T = f->cfg.model.seq_len;
    f->x = calloc((size_t)T, sizeof *f->x);
    f->y = calloc((size_t)T, sizeof *f->y);
    f->m.x->data = f->x;
    f->m.y->data = f->y;
    snprintf(f->cache, sizeof f->cache, "/tmp/jdt-check-decode-%d", (int)getpid());
    jdt_compile_opts co;
    jdt_compile_opts_init(&co);
    co.cache_dir = f->cache;
    co.threads = 1;
    co.no_jit = !jit;
    ck_assert_msg(jdt_program_compile(f->g, &co, &f->prog, &e) == JDT_OK, "compile: %s", e.msg);
}

static void fixture_free(fixture *f)
{
    jdt_program_free(f->prog);
    for (int i = 0; i < f->m.n_params; i++)
        jdt_free_aligned(f->data[i]);
    free(f->data);
    free(f->x);
    free(f->y);
    jdt_graph_free(f->g);
    jdt_config_free(&f->cfg);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", f->cache);
    ck_assert_int_eq(system(cmd), 0);
}

/* The full forward over toks[0..n) (right-padded to T): logits (T, V) */
static const float *full_forward(fixture *f, const int32_t *toks, int n)
{
    const int T = f->cfg.model.seq_len;
    memset(f->x, 0, (size_t)T * sizeof *f->x);
    memcpy(f->x, toks, (size_t)n * sizeof *toks);
    jdt_err e;
    ck_assert_msg(jdt_program_run(f->prog, &e) == JDT_OK, "run: %s", e.msg);
    return jdt_program_output(f->prog, 0);
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static double max_abs_diff(const float *a, const float *b, int n)
{
    double m = 0;
    for (int i = 0; i < n; i++)
        m = tu_worse(m, fabs((double)a[i] - (double)b[i]));
    return m;
}

static void check_variant(const char *label, int n_over, char **over, bool jit)
{
    fixture f;
    fixture_init(&f, n_over, over, jit);
    const int T = f.cfg.model.seq_len, V = f.cfg.model.vocab_size;
    int32_t toks[64] = {0};
    ck_assert_int_le(T, 64);
    for (int t = 0; t < T; t++)
        toks[t] = (int32_t)((t * 17 + 5) % V);
    const float *full = full_forward(&f, toks, T);
    float *ref = malloc((size_t)T * V * sizeof(float));
    memcpy(ref, full, (size_t)T * V * sizeof(float));

    jdt_decoder *d = NULL;
    jdt_err e;
    ck_assert_msg(jdt_decoder_new(&f.cfg, &f.m, f.data, 3, 2, &d, &e) == JDT_OK, "%s: %s", label,
                  e.msg);
    float *lg = malloc((size_t)T * V * sizeof(float));
    int seqs[64] = {0};

    /* (a) one prefill of all T tokens into sequence 1: every row's logits */
    for (int t = 0; t < T; t++)
        seqs[t] = 1;
    ck_assert_msg(jdt_decoder_forward(d, T, seqs, toks, NULL, lg, &e) == JDT_OK, "%s", e.msg);
    double worst = 0;
    for (int t = 0; t < T; t++) {
        double diff = max_abs_diff(lg + (size_t)t * V, ref + (size_t)t * V, V);
        ck_assert_msg(diff < 1e-4, "%s: prefill position %d: max |diff| %g", label, t, diff);
        worst = tu_worse(worst, diff);
    }
    ck_assert_int_eq(jdt_decoder_len(d, 1), T);
    /* the cache is full: one more token is refused and changes nothing */
    ck_assert_int_eq(jdt_decoder_forward(d, 1, seqs, toks, NULL, lg, &e), JDT_ERR_INVALID);
    ck_assert_int_eq(jdt_decoder_len(d, 1), T);

    /* (b) a short prefill then one token at a time into sequence 0, interleaved with a
     * second sequence (2) in the same calls: rows of several sequences share one call */
    int32_t other[64] = {0};
    for (int t = 0; t < T; t++)
        other[t] = (int32_t)((t * 7 + 3) % V);
    const int P = 5;
    for (int t = 0; t < P; t++)
        seqs[t] = 0;
    bool want[64] = {false};
    want[P - 1] = true;
    ck_assert_msg(jdt_decoder_forward(d, P, seqs, toks, want, lg, &e) == JDT_OK, "%s", e.msg);
    double diff = max_abs_diff(lg, ref + (size_t)(P - 1) * V, V); /* packed: row 0 */
    ck_assert_msg(diff < 1e-4, "%s: prefill of %d, last row: %g", label, P, diff);
    for (int t = P; t < T; t++) {
        const int s2[2] = {0, 2};
        const int32_t t2[2] = {toks[t], other[t - P]};
        ck_assert_msg(jdt_decoder_forward(d, 2, s2, t2, NULL, lg, &e) == JDT_OK, "%s", e.msg);
        diff = max_abs_diff(lg, ref + (size_t)t * V, V);
        ck_assert_msg(diff < 1e-4, "%s: decode position %d: max |diff| %g", label, t, diff);
        worst = tu_worse(worst, diff);
    }
    /* sequence 2 saw other[0..T-P): its last logits equal the full forward over those */
    const float *o = full_forward(&f, other, T - P);
    diff = max_abs_diff(lg + V, o + (size_t)(T - P - 1) * V, V);
    ck_assert_msg(diff < 1e-4, "%s: second sequence: %g", label, diff);

    /* (c) greedy: the same tokens from a 3-token prompt to the end of the window */
    int32_t ga[64] = {0}, gb[64] = {0};
    memcpy(ga, toks, 3 * sizeof *ga);
    memcpy(gb, toks, 3 * sizeof *gb);
    for (int n = 3; n < T; n++)
        ga[n] = argmax(full_forward(&f, ga, n) + (size_t)(n - 1) * V, V);
    jdt_decoder_reset(d, 0);
    ck_assert_int_eq(jdt_decoder_len(d, 0), 0);
    for (int t = 0; t < 3; t++)
        seqs[t] = 0;
    memset(want, 0, sizeof want);
    want[2] = true;
    ck_assert_msg(jdt_decoder_forward(d, 3, seqs, gb, want, lg, &e) == JDT_OK, "%s", e.msg);
    gb[3] = argmax(lg, V);
    for (int n = 4; n < T; n++) {
        ck_assert_msg(jdt_decoder_forward(d, 1, seqs, &gb[n - 1], NULL, lg, &e) == JDT_OK, "%s",
                      e.msg);
        gb[n] = argmax(lg, V);
    }
    for (int n = 0; n < T; n++)
        ck_assert_msg(ga[n] == gb[n], "%s: greedy token %d: full forward %d, cached %d", label, n,
                      ga[n], gb[n]);
    fprintf(stderr, "%s (%s): max |logit diff| %.2g over %d positions; %d greedy tokens equal\n",
            label, jit ? "compiled" : "interpreter", worst, T, T - 3);
    jdt_decoder_free(d);
    free(lg);
    free(ref);
    fixture_free(&f);
}

START_TEST(test_gpt2_options)
{
    char *o[] = {"model.norm=layernorm", "model.pos=learned", "model.activation=gelu",
                 "model.bias=true", "model.tie_embeddings=true"};
    check_variant("gpt2 (layernorm, learned, gelu, bias, tied)", 5, o, true);
}
END_TEST

START_TEST(test_llama_options)
{
    char *o[] = {"model.norm=rmsnorm",         "model.pos=rope",
                 "model.activation=swiglu",    "model.bias=false",
                 "model.tie_embeddings=false", "model.n_kv_head=2",
                 "model.rope_theta=500"};
    check_variant("llama (rmsnorm, rope, swiglu, GQA 4/2, untied, no bias)", 7, o, true);
}
END_TEST

START_TEST(test_mixed_options)
{
    char *a[] = {"model.norm=layernorm", "model.pos=rope",    "model.activation=relu",
                 "model.bias=true",      "model.n_kv_head=1", "model.tie_embeddings=false"};
    check_variant("layernorm+bias, rope, relu, MQA, untied", 6, a, false);
    char *b[] = {"model.norm=rmsnorm", "model.pos=learned", "model.activation=swiglu",
                 "model.bias=true"};
    check_variant("rmsnorm, learned, swiglu, bias, tied", 4, b, false);
    char *c[] = {"model.norm=layernorm", "model.bias=false", "model.activation=gelu",
                 "model.n_layer=3", "model.n_head=2"};
    check_variant("layernorm without bias, 3 layers, 2 heads", 5, c, false);
}
END_TEST

START_TEST(test_qwen_options)
{
    char *a[] = {"model.norm=rmsnorm", "model.pos=rope",      "model.activation=swiglu",
                 "model.bias=false",   "model.qkv_bias=true", "model.n_kv_head=2",
                 "model.mlp_dim=40"};
    check_variant("qwen2 (q/k/v biases only, GQA 4/2, mlp_dim 40)", 7, a, true);
    char *b[] = {"model.norm=rmsnorm",      "model.pos=rope",
                 "model.activation=swiglu", "model.bias=false",
                 "model.qk_norm=true",      "model.head_dim=12",
                 "model.n_kv_head=2",       "model.tie_embeddings=false"};
    check_variant("qwen3 (q/k norm, head_dim 12 of C=32 H=4, GQA, untied)", 8, b, true);
    char *c[] = {"model.norm=layernorm", "model.qk_norm=true", "model.bias=true",
                 "model.head_dim=6"};
    check_variant("layernorm+bias q/k norm, learned, head_dim 6", 4, c, false);
    /* Llama 3's RoPE scaling, its three bands at D 8, theta 500: wavelength 6.3 kept (below
     * 64 / 8), 30 blended, 140 and 660 divided by 4 (above 64 / 1) */
    char *d[] = {"model.norm=rmsnorm",
                 "model.pos=rope",
                 "model.activation=swiglu",
                 "model.bias=false",
                 "model.rope_theta=500",
                 "model.rope_scaling=llama3",
                 "model.rope_factor=4",
                 "model.rope_high_freq_factor=8",
                 "model.rope_original_max_pos=64"};
    check_variant("llama 3.1 (rope_scaling llama3)", 9, d, true);
    /* Gemma: GeGLU, embeddings times sqrt(C), multi-query, a head width apart from C / H */
    char *g[] = {"model.norm=rmsnorm", "model.pos=rope",         "model.activation=geglu",
                 "model.bias=false",   "model.embed_scale=true", "model.n_kv_head=1",
                 "model.head_dim=12",  "model.mlp_dim=40"};
    check_variant("gemma (geglu, embeddings times sqrt(C), MQA, head_dim 12)", 8, g, true);
}
END_TEST

START_TEST(test_mlp_refused)
{
    char *o[] = {"model.type=mlp", "model.in_dim=8", "model.n_classes=3"};
    jdt_config c;
    jdt_err e;
    jdt_err_clear(&e);
    ck_assert(jdt_config_load_string(BASE, "test", 3, o, NULL, &c, &e) == JDT_OK);
    jdt_graph *g = jdt_graph_new();
    jdt_model m;
    ck_assert(jdt_model_build(g, &c, 1, false, &m, &e) == JDT_OK);
    jdt_decoder *d = NULL;
    ck_assert_int_eq(jdt_decoder_new(&c, &m, NULL, 1, 1, &d, &e), JDT_ERR_CONFIG);
    ck_assert_ptr_null(d);
    ck_assert_msg(strstr(e.msg, "not autoregressive") != NULL, "%s", e.msg);
    jdt_graph_free(g);
    jdt_config_free(&c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("decode");
    TCase *tc = tcase_create("decode");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_gpt2_options);
    tcase_add_test(tc, test_llama_options);
    tcase_add_test(tc, test_mixed_options);
    tcase_add_test(tc, test_qwen_options);
    tcase_add_test(tc, test_mlp_refused);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
