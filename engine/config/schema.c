/*
 * schema.c — the one table of config keys (path, type, bounds or choices, default, doc) and the
 * functions that read it: lookup, environment variable names, --schema printing.
 *
 * The loader (config.c) sets every field from its default text first, so a default that does
 * not parse is caught by the first load (and by check_config's schema test).
 */
#include "config/config-impl.h"

#include <float.h>
#include <limits.h>
#include <stddef.h>
#include <string.h>

_Static_assert(sizeof(jdt_model_type) == sizeof(int), "enum fields are written as int");
_Static_assert(sizeof(jdt_dtype) == sizeof(int), "enum fields are written as int");

static const char *const C_LOG[] = {"debug", "info", "warn", "error", NULL};
static const char *const C_MODEL[] = {"gpt", "mlp", NULL};
static const char *const C_NORM[] = {"layernorm", "rmsnorm", NULL};
static const char *const C_POS[] = {"learned", "rope", NULL};
static const char *const C_ROPE_SCALING[] = {"none", "llama3", NULL};
static const char *const C_ACT[] = {"gelu", "swiglu", "relu", "geglu", NULL};
static const char *const C_FORMAT[] = {"tokens", "arrays", "synthetic", NULL};
static const char *const C_TOKENIZER[] = {"byte", "bpe", NULL};
static const char *const C_OPTIM[] = {"adamw", "sgd", NULL};
static const char *const C_SCHED[] = {"constant", "cosine", "linear", NULL};
static const char *const C_NAN[] = {"stop", "skip", NULL};
static const char *const C_COMPUTE[] = {"f32", "bf16", NULL};
static const int V_COMPUTE[] = {JDT_DTYPE_F32, JDT_DTYPE_BF16};
static const char *const C_PARAMS[] = {"f32", NULL};
static const int V_PARAMS[] = {JDT_DTYPE_F32};
static const char *const C_BACKEND[] = {"cpu", "cuda", NULL};
static const char *const C_REMAT[] = {"none", "block", "dots", NULL};

#define OFF(field) offsetof(jdt_config, field)
#define K_INT(p, f, lo, hi, d, doc) {p, JDT_CONFIG_INT, OFF(f), lo, hi, false, NULL, NULL, d, doc}
#define K_I64(p, f, lo, hi, d, doc) {p, JDT_CONFIG_I64, OFF(f), lo, hi, false, NULL, NULL, d, doc}
#define K_FLT(p, f, lo, hi, d, doc) {p, JDT_CONFIG_FLOAT, OFF(f), lo, hi, false, NULL, NULL, d, doc}
#define K_FLTO(p, f, lo, hi, d, doc) {p, JDT_CONFIG_FLOAT, OFF(f), lo, hi, true, NULL, NULL, d, doc}
#define K_BOOL(p, f, d, doc) {p, JDT_CONFIG_BOOL, OFF(f), 0, 0, false, NULL, NULL, d, doc}
#define K_STR(p, f, d, doc) {p, JDT_CONFIG_STR, OFF(f), 0, 0, false, NULL, NULL, d, doc}
#define K_ENUM(p, f, ch, d, doc) {p, JDT_CONFIG_ENUM, OFF(f), 0, 0, false, ch, NULL, d, doc}
#define K_ENUMV(p, f, ch, v, d, doc) {p, JDT_CONFIG_ENUM, OFF(f), 0, 0, false, ch, v, d, doc}

#define IMAX ((double)INT_MAX)
#define LMAX 1e15 /* exactly representable as a double; far beyond any step count */
#define FMAX DBL_MAX

static const jdt_config_key KEYS[] = {
    /* run */
    K_STR("run.name", run.name, "run", "run name; outputs go to <out_dir>/<name>/"),
    K_STR("run.out_dir", run.out_dir, "runs", "root folder for run outputs (logs, checkpoints)"),
    K_I64("run.seed", run.seed, 0, LMAX, "1337", "seed of every random stream (init, dropout, data order)"),
    K_I64("run.steps", run.steps, 0, LMAX, "1000", "number of optimizer steps to train"),
    K_I64("run.log_every", run.log_every, 1, LMAX, "10", "log train metrics every N steps"),
    K_I64("run.eval_every", run.eval_every, 0, LMAX, "200", "evaluate on val data every N steps (0 = never)"),
    K_I64("run.eval_steps", run.eval_steps, 1, LMAX, "20", "batches per evaluation"),
    K_BOOL("run.profile", run.profile, "false", "record per-kernel timings"),
    K_I64("run.profile_steps", run.profile_steps, 0, LMAX, "5", "steps to profile when run.profile is on"),
    K_ENUM("run.log_level", run.log_level, C_LOG, "info", "log verbosity (--log-level overrides it)"),
    /* model */
    K_ENUM("model.type", model.type, C_MODEL, "gpt", "model family"),
    K_INT("model.vocab_size", model.vocab_size, 2, IMAX, "256", "gpt: vocabulary size V (one token would leave nothing to predict)"),
    K_INT("model.seq_len", model.seq_len, 1, IMAX, "256", "gpt: context length T"),
    K_INT("model.n_layer", model.n_layer, 1, IMAX, "4", "gpt: transformer blocks L"),
    K_INT("model.n_embd", model.n_embd, 1, IMAX, "256", "gpt: embedding width C (multiple of n_head)"),
    K_INT("model.n_head", model.n_head, 1, IMAX, "4", "gpt: attention heads H"),
    K_INT("model.n_kv_head", model.n_kv_head, 0, IMAX, "0", "gpt: key/value heads for GQA (0 = n_head; must divide n_head)"),
    K_INT("model.head_dim", model.head_dim, 0, IMAX, "0", "gpt: attention head width D (Qwen3's head_dim; q, k, v project to heads * D); 0 = n_embd / n_head"),
    K_INT("model.mlp_ratio", model.mlp_ratio, 1, 64, "4", "gpt: MLP hidden width = mlp_ratio * n_embd (unless model.mlp_dim is set)"),
    K_INT("model.mlp_dim", model.mlp_dim, 0, IMAX, "0", "gpt: MLP hidden width F (Llama's intermediate_size); 0 = mlp_ratio * n_embd"),
    K_ENUM("model.norm", model.norm, C_NORM, "layernorm", "gpt: normalisation"),
    K_FLT("model.norm_eps", model.norm_eps, 0, 1, "1e-05", "gpt: epsilon inside the norm's square root"),
    K_ENUM("model.pos", model.pos, C_POS, "learned", "gpt: position encoding"),
    K_FLT("model.rope_theta", model.rope_theta, 1, FMAX, "10000", "gpt: RoPE base frequency"),
    K_ENUM("model.rope_scaling", model.rope_scaling, C_ROPE_SCALING, "none", "gpt: RoPE frequency scaling: none, or llama3 (Llama 3.1-3.3's rope_scaling: the model.rope_* keys below)"),
    K_FLT("model.rope_factor", model.rope_factor, 1, FMAX, "8", "llama3 scaling: long wavelengths' frequencies divided by this"),
    K_FLT("model.rope_low_freq_factor", model.rope_low_freq_factor, 0, FMAX, "1", "llama3 scaling: wavelengths above original / this are divided by the factor"),
    K_FLT("model.rope_high_freq_factor", model.rope_high_freq_factor, 0, FMAX, "4", "llama3 scaling: wavelengths below original / this are kept (in between: blended)"),
    K_INT("model.rope_original_max_pos", model.rope_original_max_pos, 1, IMAX, "8192", "llama3 scaling: the context the model was pretrained at (original_max_position_embeddings)"),
    K_ENUM("model.activation", model.activation, C_ACT, "gelu", "MLP activation (gelu = tanh form; swiglu, geglu: gated, gpt only, SiLU or tanh GELU of the gate times the up projection)"),
    K_BOOL("model.tie_embeddings", model.tie_embeddings, "true", "gpt: output head shares the token embedding"),
    K_BOOL("model.bias", model.bias, "true", "biases in linear layers and layernorm"),
    K_BOOL("model.qkv_bias", model.qkv_bias, "false", "gpt: biases on the q, k and v projections even when model.bias is false (Qwen2)"),
    K_BOOL("model.qk_norm", model.qk_norm, "false", "gpt: normalise each head's q and k (model.norm, a learned scale of head_dim) before RoPE (Qwen3)"),
    K_BOOL("model.embed_scale", model.embed_scale, "false", "gpt: multiply the token embeddings by sqrt(n_embd) on the way in, not in the tied head (Gemma)"),
    K_FLTO("model.dropout", model.dropout, 0, 1, "0", "dropout probability, in [0, 1)"),
    K_FLT("model.init_std", model.init_std, 0, FMAX, "0.02", "std of the normal weight init"),
    K_INT("model.in_dim", model.in_dim, 1, IMAX, "784", "mlp: input features"),
    K_INT("model.hidden_dim", model.hidden_dim, 1, IMAX, "256", "mlp: hidden width"),
    K_INT("model.n_hidden", model.n_hidden, 0, 1024, "2", "mlp: hidden layers"),
    K_INT("model.n_classes", model.n_classes, 1, IMAX, "10", "mlp: output classes"),
    /* mesh */
    K_INT("mesh.data", mesh.data, -1, 65536, "1", "data-parallel replicas (batch split, params replicated); -1: fill in from the world size"),
    K_INT("mesh.fsdp", mesh.fsdp, -1, 65536, "1", "FSDP/ZeRO-3 shards (batch and params split)"),
    K_INT("mesh.tensor", mesh.tensor, -1, 65536, "1", "tensor-parallel shards (Megatron-style)"),
    /* sharding */
    {"sharding.rules", JDT_CONFIG_RULES, OFF(sharding.rules), 0, 0, false, NULL, NULL,
     "[[batch, [data, fsdp]], [embed, fsdp], [mlp, tensor], [heads, tensor], [kv_heads, tensor], "
     "[vocab, null], [norm, null]]",
     "ordered [logical_axis, mesh_axis | [mesh_axes] | null] pairs (MaxText logical_axis_rules)"},
    /* data */
    K_ENUM("data.format", data.format, C_FORMAT, "tokens", "tokens (HDF5 /tokens), arrays (HDF5 /x, /y) or synthetic"),
    K_STR("data.source", data.source, "",
          "what `jdt-train prepare` tokenizes: a text file, a .jsonl of {\"text\": ...} documents, or llm.c / nanoGPT .bin token files (a file or folder) it imports"),
    K_STR("data.train_path", data.train_path, "", "train data: HDF5 file or directory of shards, or an http(s):// URL (one .h5, a directory listing or a manifest; docs/data.md)"),
    K_STR("data.val_path", data.val_path, "", "validation data: HDF5 file or directory of shards, or an http(s):// URL"),
    K_INT("data.n_shards", data.n_shards, 1, 1000000, "1", "shards `prepare` writes"),
    K_FLTO("data.val_fraction", data.val_fraction, 0, 1, "0.1", "fraction of the source `prepare` holds out for validation"),
    K_INT("data.batch_size", data.batch_size, 1, IMAX, "32", "global batch size in sequences (per optimizer step)"),
    K_INT("data.micro_batch_size", data.micro_batch_size, 0, IMAX, "0", "sequences per forward/backward (0 = batch_size; must divide it)"),
    K_BOOL("data.shuffle", data.shuffle, "true", "shuffle the sample order each epoch"),
    K_INT("data.prefetch", data.prefetch, 0, 64, "2", "batches loaded ahead"),
    K_ENUM("data.tokenizer", data.tokenizer, C_TOKENIZER, "byte", "tokenizer `prepare` uses: byte, or bpe (byte-level BPE, docs/tokenizers.md)"),
    K_INT("data.fetch_retries", data.fetch_retries, 0, 1000, "5", "remote data (http/https URLs): retries after a timeout, 5xx or reset, with exponential backoff"),
    K_FLT("data.fetch_backoff_s", data.fetch_backoff_s, 0, 3600, "1", "remote data: wait before the first retry (doubled each time, at most 30 s)"),
    K_FLT("data.fetch_timeout_s", data.fetch_timeout_s, 0.001, 86400, "30", "remote data: connect timeout, and the longest a download may go without a byte"),
    K_STR("data.tokenizer_path", data.tokenizer_path, "", "bpe: tokenizer.json, GPT-2 vocab.bpe (encoder.json beside it) or a folder of either; empty = train one of model.vocab_size on data.source"),
    /* optimizer */
    K_ENUM("optimizer.type", optimizer.type, C_OPTIM, "adamw", "optimizer"),
    K_FLT("optimizer.lr", optimizer.lr, 0, FMAX, "0.0003", "peak learning rate"),
    K_ENUM("optimizer.schedule", optimizer.schedule, C_SCHED, "cosine", "LR schedule after warmup"),
    K_I64("optimizer.warmup_steps", optimizer.warmup_steps, 0, LMAX, "100", "linear warmup steps: lr * (t + 1) / warmup_steps at step t"),
    K_I64("optimizer.decay_steps", optimizer.decay_steps, 0, LMAX, "0", "step where the decay ends (0 = run.steps)"),
    K_FLT("optimizer.min_lr_ratio", optimizer.min_lr_ratio, 0, 1, "0.1", "final lr = lr * min_lr_ratio"),
    K_FLTO("optimizer.beta1", optimizer.beta1, 0, 1, "0.9", "adamw: first-moment decay"),
    K_FLTO("optimizer.beta2", optimizer.beta2, 0, 1, "0.95", "adamw: second-moment decay"),
    K_FLT("optimizer.eps", optimizer.eps, 0, 1, "1e-08", "adamw: denominator epsilon"),
    K_FLT("optimizer.weight_decay", optimizer.weight_decay, 0, FMAX, "0.1", "decoupled weight decay (matrices only)"),
    K_FLTO("optimizer.momentum", optimizer.momentum, 0, 1, "0.9", "sgd: momentum"),
    K_BOOL("optimizer.nesterov", optimizer.nesterov, "false", "sgd: Nesterov momentum"),
    K_FLT("optimizer.grad_clip", optimizer.grad_clip, 0, FMAX, "1", "clip the global gradient norm to this (0 = off)"),
    K_ENUM("optimizer.nan_policy", optimizer.nan_policy, C_NAN, "stop", "on a non-finite loss or gradient: stop the run or skip the step"),
    /* precision */
    K_ENUMV("precision.compute", precision.compute, C_COMPUTE, V_COMPUTE, "f32", "dtype of matmul inputs (bf16: f32 accumulation)"),
    K_ENUMV("precision.activations", precision.activations, C_COMPUTE, V_COMPUTE, "f32", "dtype the linear layers' and the head's outputs are stored in (bf16 needs compute: bf16; PyTorch autocast's and MaxText's activations)"),
    K_ENUMV("precision.params", precision.params, C_PARAMS, V_PARAMS, "f32", "dtype of master weights and optimizer state"),
    /* checkpoint */
    K_STR("checkpoint.dir", checkpoint.dir, "", "checkpoint folder (\"\" = <out_dir>/<name>/ckpt)"),
    K_I64("checkpoint.every", checkpoint.every, 0, LMAX, "1000", "save every N steps (0 = never; the last step is always saved)"),
    K_INT("checkpoint.keep", checkpoint.keep, 1, 1000000, "3", "newest checkpoints kept on disk"),
    K_STR("checkpoint.resume", checkpoint.resume, "auto", "none, auto (latest in dir if any) or a checkpoint path"),
    K_STR("checkpoint.init_from", checkpoint.init_from, "", "start a new run (step 0, fresh optimizer) from these weights: a jdt checkpoint (or run ckpt folder) or a Hugging Face directory written by export --format hf, or an http(s):// URL of such a folder (fetched into the cache); ignored when resuming"),
    K_BOOL("checkpoint.save_on_signal", checkpoint.save_on_signal, "true", "save a checkpoint on SIGINT/SIGTERM before exiting"),
    /* runtime */
    K_ENUM("runtime.backend", runtime.backend, C_BACKEND, "cpu", "device kind (cuda: a `make CUDA=1` binary, one process per GPU, docs/backend.md)"),
    K_INT("runtime.threads", runtime.threads, 0, 4096, "0", "CPU threads per process (0 = OMP_NUM_THREADS, else cores / local processes)"),
    K_BOOL("runtime.adaptive_threads", runtime.adaptive_threads, "true", "CPU: time steps with runtime.threads and with 1 thread now and then, keep the faster (false = always runtime.threads)"),
    K_STR("runtime.cache_dir", runtime.cache_dir, "", "JIT kernel cache (\"\" = ~/.cache/jdt-train)"),
    K_INT("runtime.cache_max_mb", runtime.cache_max_mb, 0, 16777216, "1024", "JIT cache size bound in MiB, least recently used entries pruned (0 = unbounded)"),
    K_BOOL("runtime.jit", runtime.jit, "true", "compile fused kernels (false = reference interpreter)"),
    K_ENUM("runtime.remat", runtime.remat, C_REMAT, "none", "recompute activations in backward: none, per block, or all but the GEMMs' and attentions' outputs (dots; docs/autodiff.md)"),
    K_INT("runtime.loss_chunks", runtime.loss_chunks, 1, 65536, "1", "gpt: the lm head and cross-entropy on this many slices of the sequence (at most model.seq_len), each slice's backward right after its forward, so one slice's logits are live at a time (MaxText's num_vocab_tiling; docs/compiler.md \"The loss in slices\"); 1 = whole; 4 to 8 is where GPT-2's planned memory is lowest"),
    K_BOOL("runtime.overlap_comm", runtime.overlap_comm, "true", "run collectives under compute (start/wait: the CPU's communication thread, NCCL's own stream on CUDA); false = blocking, in graph order"),
    K_INT("runtime.bucket_mb", runtime.bucket_mb, 0, 4096, "4", "coalesce gradient all-reduces and reduce-scatters, and FSDP weight all-gathers, into buckets of this many MiB (0 = one call per tensor)"),
    K_INT("runtime.prefetch_mb", runtime.prefetch_mb, 0, 1048576, "8", "FSDP weight all-gathers issued ahead of their use while the gathered MiB in flight fit this budget (0 = one call ahead only)"),
    K_STR("runtime.cc", runtime.cc, "cc", "C compiler the CPU JIT runs"),
    K_STR("runtime.cflags", runtime.cflags, "", "the JIT compiler's flags, in place of the built-in ones (\"\" = built-in: docs/compiler.md)"),
    K_FLT("runtime.peak_gflops", runtime.peak_gflops, 0, FMAX, "0", "MFU reference GFLOP/s per process (0 = measured once per machine and thread count, cached)"),
    /* dist */
    K_STR("dist.coordinator", dist.coordinator, "", "rendezvous host:port (\"\" = single process or launcher/SLURM)"),
    K_INT("dist.rank", dist.rank, -1, 65535, "-1", "this process's rank (-1 = from launcher/SLURM)"),
    K_INT("dist.world_size", dist.world_size, -1, 65536, "-1", "number of processes (-1 = auto; else mesh size)"),
    K_INT("dist.local_rank", dist.local_rank, -1, 65535, "-1", "rank on this node (-1 = auto)"),
    K_STR("dist.token", dist.token, "", "job token peers must present (\"\" = none)"),
    K_STR("dist.token_file", dist.token_file, "", "file holding the job token"),
    K_FLT("dist.connect_timeout_s", dist.connect_timeout_s, 0.001, 86400, "60", "give up rendezvous after this many seconds"),
    K_FLT("dist.heartbeat_s", dist.heartbeat_s, 0.001, 3600, "1", "heartbeat interval"),
    K_FLT("dist.peer_timeout_s", dist.peer_timeout_s, 0.001, 86400, "15", "declare a silent peer lost after this many seconds"),
    K_INT("dist.port", dist.port, 0, 65535, "0", "coordinator port when coordinator has none (0 = derive)"),
};

#define N_KEYS ((int)JDT_ARRAY_LEN(KEYS))

const char *const JDT_CONFIG_SECTIONS[] = {"run",       "model",     "mesh",    "sharding",
                                            "data",      "optimizer", "precision",
                                            "checkpoint", "runtime",  "dist",    NULL};

int jdt_config_schema_count(void) { return N_KEYS; }

const jdt_config_key *jdt_config_schema_key(int i)
{
    if (i < 0 || i >= N_KEYS) return NULL;
    return &KEYS[i];
}

const jdt_config_key *jdt_config_schema_find(const char *path)
{
    for (int i = 0; i < N_KEYS; i++)
        if (strcmp(KEYS[i].path, path) == 0) return &KEYS[i];
    return NULL;
}

int jdt_config_key_index(const jdt_config_key *k) { return (int)(k - KEYS); }

/* Keys each process of a job may set for itself: where it finds its inputs and caches, how it
 * uses its own host (threads, compiler, network retries), what it logs, and its place in the
 * job. Every other key must agree across the ranks (jdt_world_connect checks); a key not listed
 * here must agree, so a new key is safe by default. A prefix ending in '.' names a section. */
static const char *const PER_PROCESS[] = {
    "run.log_level", "run.profile", "run.profile_steps",
    "data.source", "data.train_path", "data.val_path", "data.tokenizer_path", "data.prefetch",
    "data.fetch_retries", "data.fetch_backoff_s", "data.fetch_timeout_s",
    "runtime.threads", "runtime.adaptive_threads", "runtime.cache_dir", "runtime.cache_max_mb",
    "runtime.cc", "runtime.cflags", "runtime.peak_gflops",
    "dist.",
    NULL};

bool jdt_config_key_per_process(const jdt_config_key *k)
{
    for (int i = 0; PER_PROCESS[i]; i++) {
        size_t n = strlen(PER_PROCESS[i]);
        if (PER_PROCESS[i][n - 1] == '.' ? strncmp(k->path, PER_PROCESS[i], n) == 0
                                         : strcmp(k->path, PER_PROCESS[i]) == 0)
            return true;
    }
    return false;
}

const char *jdt_config_per_process_key(int i)
{
    return i >= 0 && i < (int)(sizeof PER_PROCESS / sizeof *PER_PROCESS) - 1 ? PER_PROCESS[i]
                                                                            : NULL;
}

void jdt_config_env_name(const jdt_config_key *k, char *buf, size_t n_bytes)
{
    size_t o = 0;
    const char *pre = "JDT_";
    for (const char *s = pre; *s && o + 1 < n_bytes; s++) buf[o++] = *s;
    for (const char *s = k->path; *s && o + 1 < n_bytes; s++) {
        char ch = *s == '.' ? '_' : *s;
        buf[o++] = (ch >= 'a' && ch <= 'z') ? (char)(ch - 'a' + 'A') : ch;
    }
    if (n_bytes) buf[o < n_bytes ? o : n_bytes - 1] = '\0';
}

const char *jdt_config_mesh_axis_name(jdt_mesh_axis a)
{
    static const char *const names[JDT_MESH_AXIS_COUNT] = {"data", "fsdp", "tensor"};
    if ((int)a < 0 || a >= JDT_MESH_AXIS_COUNT) return "?";
    return names[a];
}

static const char *type_name(const jdt_config_key *k)
{
    switch (k->type) {
    case JDT_CONFIG_INT:
    case JDT_CONFIG_I64: return "int";
    case JDT_CONFIG_FLOAT: return "float";
    case JDT_CONFIG_BOOL: return "bool";
    case JDT_CONFIG_STR: return "str";
    case JDT_CONFIG_ENUM: return "enum";
    case JDT_CONFIG_RULES: return "rules";
    }
    return "?";
}

/* Writes "choices a|b|c" or "range [lo, hi]" (or "" when unbounded) into buf. */
void jdt_config_key_expect(const jdt_config_key *k, char *buf, size_t n_bytes)
{
    size_t o = 0;
    buf[0] = '\0';
    switch (k->type) {
    case JDT_CONFIG_ENUM:
        for (int i = 0; k->choices[i] && o + 1 < n_bytes; i++)
            o += (size_t)snprintf(buf + o, n_bytes - o, "%s%s", i ? "|" : "", k->choices[i]);
        break;
    case JDT_CONFIG_INT:
    case JDT_CONFIG_I64:
        if (k->max >= (k->type == JDT_CONFIG_INT ? IMAX : LMAX))
            snprintf(buf, n_bytes, ">= %.0f", k->min);
        else
            snprintf(buf, n_bytes, "%.0f..%.0f", k->min, k->max);
        break;
    case JDT_CONFIG_FLOAT:
        if (k->max >= FMAX)
            snprintf(buf, n_bytes, ">= %g", k->min);
        else
            snprintf(buf, n_bytes, "[%g, %g%s", k->min, k->max, k->max_open ? ")" : "]");
        break;
    case JDT_CONFIG_BOOL: snprintf(buf, n_bytes, "true|false"); break;
    case JDT_CONFIG_STR: break;
    case JDT_CONFIG_RULES: snprintf(buf, n_bytes, "mesh axes data|fsdp|tensor"); break;
    }
}

void jdt_config_print_schema(FILE *f)
{
    const char *section = "";
    for (int i = 0; i < N_KEYS; i++) {
        const jdt_config_key *k = &KEYS[i];
        size_t sl = (size_t)(strchr(k->path, '.') - k->path);
        if (strncmp(section, k->path, sl) != 0 || section[sl] != '.') {
            fprintf(f, "%s%.*s:\n", i ? "\n" : "", (int)sl, k->path);
            section = k->path;
        }
        char exp[160], env[96];
        jdt_config_key_expect(k, exp, sizeof exp);
        jdt_config_env_name(k, env, sizeof env);
        fprintf(f, "  %-28s %-5s default %s%s%s%s%s  [%s]\n", k->path, type_name(k),
                k->type == JDT_CONFIG_STR ? "\"" : "", k->def, k->type == JDT_CONFIG_STR ? "\"" : "",
                exp[0] ? "  " : "", exp, env);
        fprintf(f, "      %s\n", k->doc);
    }
}

void jdt_config_print_schema_markdown(FILE *f)
{
    fprintf(f, "| key | type | default | allowed | env | doc |\n|---|---|---|---|---|---|\n");
    for (int i = 0; i < N_KEYS; i++) {
        const jdt_config_key *k = &KEYS[i];
        char exp[160], env[96];
        jdt_config_key_expect(k, exp, sizeof exp);
        jdt_config_env_name(k, env, sizeof env);
        for (char *p = exp; *p; p++)
            if (*p == '|') *p = '/';
        fprintf(f, "| `%s` | %s | `%s%s%s` | %s | `%s` | %s |\n", k->path, type_name(k),
                k->type == JDT_CONFIG_STR ? "\"" : "", k->def, k->type == JDT_CONFIG_STR ? "\"" : "",
                exp, env, k->doc);
    }
}
