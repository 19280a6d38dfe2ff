/*
 * sample.c — `jdt-train sample`: autoregressive generation from a checkpoint (see train.h).
 *
 * The model is rebuilt from the config text stored in the checkpoint, for one row, with its
 * logits as the output; parameters are read by their global names. Every new token runs the
 * compiled forward pass over the last seq_len tokens, right-padded: with causal attention the
 * padding cannot affect the logits at the last real position. Text goes in and out through
 * the run's tokenizer: bytes, or the byte-level BPE of prepared data (datasets/bpe.h).
 */
#include "train/train.h"

#include "datasets/bpe.h"
#include "datasets/datasets.h"
#include "graph/builder.h"
#include "io/ckpt.h"

#include <math.h>
#include <string.h>

static int pick_token(const float *logits, int V, const jdt_sample_opts *o, long i, float *probs)
{
    int best = 0;
    for (int v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    if (o->temperature <= 0) return best;
    /* top-k: the k-th largest logit is the cut-off (ties kept) */
    float cut = -INFINITY;
    if (o->top_k > 0 && o->top_k < V) {
        for (int v = 0; v < V; v++) probs[v] = logits[v];
        for (int k = 0; k < o->top_k; k++) { /* partial selection, V is small for bytes */
            int arg = -1;
            for (int v = 0; v < V; v++)
                if (probs[v] != -INFINITY && (arg < 0 || probs[v] > probs[arg])) arg = v;
            cut = probs[arg];
            probs[arg] = -INFINITY;
        }
    }
    double sum = 0;
    for (int v = 0; v < V; v++) {
        double p = logits[v] >= cut ? exp((logits[v] - logits[best]) / o->temperature) : 0.0;
        probs[v] = (float)p;
        sum += p;
    }
    jdt_philox_ctr r = jdt_philox(o->seed, 7, (uint64_t)i);
    double u = (double)jdt_u32_to_unit_float(r.v[0]) * sum, acc = 0;
    for (int v = 0; v < V; v++) {
        acc += probs[v];
        if (u < acc) return v;
    }
    return best;
}

/* Reads parameter p (whole, f32, global shape) from checkpoint ck under "params/<name>" into
 * dst (numel(p) floats). Errors are jdt_ckpt_read's (missing tensor, shape/dtype mismatch). */
jdt_status jdt_train_read_param(jdt_ckpt *ck, const jdt_tensor *p, float *dst, jdt_err *e)
{
    char name[300];
    snprintf(name, sizeof name, "params/%s", p->name);
    jdt_ckpt_tensor want;
    memset(&want, 0, sizeof want);
    want.name = name;
    want.dtype = JDT_DTYPE_F32;
    want.ndim = p->shape.ndim;
    for (int d = 0; d < p->shape.ndim; d++) want.shape[d] = p->shape.dims[d];
    return jdt_ckpt_read(ck, &want, dst, e);
}

jdt_status jdt_sample_run(const char *ckpt_path, const jdt_sample_opts *o, FILE *out, jdt_err *e)
{
    jdt_ckpt *ck = NULL;
    jdt_graph *g = NULL;
    jdt_program *prog = NULL;
    float **params = NULL;
    int32_t *x = NULL, *y = NULL, *ctx = NULL;
    float *probs = NULL;
    uint32_t *pids = NULL;
    size_t n_pids = 0, pcap = 0;
    jdt_bpe *tok = NULL;
    jdt_model m;
    memset(&m, 0, sizeof m);
    jdt_config cfg;
    bool have_cfg = false;
    jdt_status st = jdt_ckpt_open(ckpt_path, &ck, e);
    if (st != JDT_OK) return st;
    jdt_ckpt_meta meta;
    jdt_ckpt_get_meta(ck, &meta);
    char label[1100];
    snprintf(label, sizeof label, "%s (stored config)", ckpt_path);
    if ((st = jdt_config_load_string(meta.config_text, label, 0, NULL, NULL, &cfg, e)) != JDT_OK) {
        /* the file is at fault, not the command line: a run-time error (exit 1), not usage */
        if (st == JDT_ERR_CONFIG) st = e ? (e->code = JDT_ERR_FORMAT) : JDT_ERR_FORMAT;
        goto out;
    }
    have_cfg = true;
    if (cfg.model.type != JDT_MODEL_GPT) {
        st = jdt_err_set(e, JDT_ERR_CONFIG, "%s: sample needs a gpt model", ckpt_path);
        goto out;
    }
    if (cfg.data.tokenizer == JDT_TOKENIZER_BPE) {
        if ((st = jdt_prep_bpe_for_run(cfg.data.train_path, cfg.data.tokenizer_path, &tok, e)) != JDT_OK)
            goto out;
        int eot = jdt_bpe_special_id(tok, "<|endoftext|>");
        if (o->prompt[0])
            st = jdt_bpe_encode(tok, o->prompt, strlen(o->prompt), &pids, &n_pids, &pcap, e);
        else if (eot >= 0)
            st = jdt_bpe_encode(tok, "<|endoftext|>", 13, &pids, &n_pids, &pcap, e);
        else
            st = jdt_bpe_encode(tok, "\n", 1, &pids, &n_pids, &pcap, e);
        if (st != JDT_OK) goto out;
    }
    const int T = cfg.model.seq_len, V = cfg.model.vocab_size;
    if (!(g = jdt_graph_new())) goto oom;
    if ((st = jdt_model_build(g, &cfg, 1, false, &m, e)) != JDT_OK) goto out;
    jdt_graph_add_output(g, m.logits);
    if (!(params = jdt_calloc((size_t)m.n_params, sizeof *params))) goto oom;
    double total_mb = 0, done_mb = 0;
    for (int i = 0; i < m.n_params; i++)
        total_mb += (double)jdt_shape_numel(&m.params[i].t->shape) * sizeof(float) / 1048576.0;
    jdt_progress lp;
    jdt_progress_begin(&lp, "loading parameters", total_mb, "MB");
    for (int i = 0; i < m.n_params && st == JDT_OK; i++) {
        const jdt_tensor *p = m.params[i].t;
        if (!(params[i] = jdt_malloc_aligned((size_t)jdt_shape_numel(&p->shape) * sizeof(float)))) {
            st = jdt_err_set(e, JDT_ERR_NOMEM, "sample: out of memory");
            break;
        }
        st = jdt_train_read_param(ck, p, params[i], e);
        m.params[i].t->data = params[i];
        done_mb += (double)jdt_shape_numel(&p->shape) * sizeof(float) / 1048576.0;
        jdt_progress_update(&lp, done_mb);
    }
    jdt_progress_end(&lp);
    if (st != JDT_OK) goto out;
    jdt_compile_opts co;
    jdt_train_compile_opts(&cfg, &co);
    if ((st = jdt_program_compile(g, &co, &prog, e)) != JDT_OK) goto out;

    size_t n_prompt = strlen(o->prompt);
    size_t cap = (tok ? n_pids : n_prompt) + (size_t)o->length + 1;
    x = jdt_calloc((size_t)T, sizeof *x);
    y = jdt_calloc((size_t)T, sizeof *y);
    ctx = jdt_calloc(cap, sizeof *ctx);
    probs = jdt_calloc((size_t)V, sizeof *probs);
    if (!x || !y || !ctx || !probs) goto oom;
    size_t n = 0;
    if (tok) {
        for (size_t i = 0; i < n_pids; i++) ctx[n++] = (int32_t)pids[i];
    } else {
        if (n_prompt == 0) ctx[n++] = '\n';
        for (size_t i = 0; i < n_prompt; i++) ctx[n++] = (unsigned char)o->prompt[i];
    }
    fwrite(o->prompt, 1, n_prompt, out);
    m.x->data = x;
    m.y->data = y;
    for (long i = 0; i < o->length; i++) {
        size_t start = n > (size_t)T ? n - (size_t)T : 0, len = n - start;
        memset(x, 0, (size_t)T * sizeof *x);
        for (size_t j = 0; j < len; j++) x[j] = ctx[start + j] < V ? ctx[start + j] : 0;
        if ((st = jdt_program_run(prog, e)) != JDT_OK) goto out;
        const float *logits = jdt_program_output(prog, 0);
        int next = pick_token(logits + (len - 1) * (size_t)V, V, o, i, probs);
        ctx[n++] = next;
        if (tok) {
            size_t nb;
            const char *b = jdt_bpe_token_bytes(tok, (uint32_t)next, &nb);
            fwrite(b, 1, nb, out);
        } else {
            fputc(next, out);
        }
        fflush(out);
    }
    fputc('\n', out);
    st = JDT_OK;
    goto out;
oom:
    st = jdt_err_set(e, JDT_ERR_NOMEM, "sample: out of memory");
out:
    jdt_program_free(prog);
    if (params)
        for (int i = 0; i < m.n_params; i++) jdt_free_aligned(params[i]);
    jdt_free(params);
    jdt_graph_free(g);
    jdt_free(x);
    jdt_free(y);
    jdt_free(ctx);
    jdt_free(probs);
    jdt_free(pids);
    jdt_bpe_free(tok);
    if (have_cfg) jdt_config_free(&cfg);
    jdt_ckpt_close(ck);
    return st;
}
