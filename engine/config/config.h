/*
 * config.h — the declarative run configuration: YAML files -> one typed, validated struct.
 *
 * One schema table (schema.c: key path, type, bounds or choices, default, one-line doc) drives
 * everything: defaults, parsing, range checks, "did you mean" hints, environment variable names,
 * `--schema` output and the resolved YAML printer. Sections follow MaxText's vocabulary: run,
 * model, mesh, sharding, data, optimizer, precision, checkpoint, runtime, dist.
 *
 * Resolution order: schema defaults <- base_config chain (deep merge, child wins) <- the file
 * <- JDT_<SECTION>_<KEY> environment variables and key.path=value command-line overrides (one
 * key set both ways is an error). Every error names its place: file:line:column, the override
 * text or the environment variable, the key path and what was expected.
 *
 * Dimension letters: V vocab, T sequence, C embed, L layers, H heads.
 */
#ifndef JDT_CONFIG_H
#define JDT_CONFIG_H

#include "core/core.h"

#include <stdio.h>

/* The longest path a config may give (run.out_dir/run.name, checkpoint.dir, runtime.cache_dir,
 * data paths): the run appends file names to them in fixed buffers of about 1 KiB. */
#define JDT_CONFIG_PATH_MAX 512

/* ---- enumerations used by config fields (value = index of the name in the schema) -------- */

typedef enum { JDT_MODEL_GPT, JDT_MODEL_MLP } jdt_model_type;
typedef enum { JDT_NORM_LAYERNORM, JDT_NORM_RMSNORM } jdt_norm_type;
typedef enum { JDT_POS_LEARNED, JDT_POS_ROPE } jdt_pos_type;
typedef enum { JDT_ROPE_SCALING_NONE, JDT_ROPE_SCALING_LLAMA3 } jdt_rope_scaling;
/* geglu: gelu(x W_gate) * (x W_up), the tanh GELU (Gemma's GeGLU); swiglu the same with SiLU */
typedef enum { JDT_ACT_GELU, JDT_ACT_SWIGLU, JDT_ACT_RELU, JDT_ACT_GEGLU } jdt_activation;
typedef enum { JDT_DATA_TOKENS, JDT_DATA_ARRAYS, JDT_DATA_SYNTHETIC } jdt_data_format;
typedef enum { JDT_TOKENIZER_BYTE, JDT_TOKENIZER_BPE } jdt_tokenizer;
typedef enum { JDT_OPTIM_ADAMW, JDT_OPTIM_SGD } jdt_optim_type;
typedef enum { JDT_SCHED_CONSTANT, JDT_SCHED_COSINE, JDT_SCHED_LINEAR } jdt_lr_schedule;
typedef enum { JDT_NAN_STOP, JDT_NAN_SKIP } jdt_nan_policy;
typedef enum { JDT_BACKEND_CPU, JDT_BACKEND_CUDA } jdt_backend;
typedef enum { JDT_REMAT_NONE, JDT_REMAT_BLOCK, JDT_REMAT_DOTS } jdt_remat;

/* The mesh axes, in the order of the device mesh (outermost first). */
typedef enum { JDT_MESH_DATA, JDT_MESH_FSDP, JDT_MESH_TENSOR, JDT_MESH_AXIS_COUNT } jdt_mesh_axis;

/* Returns "data", "fsdp" or "tensor" ("?" when out of range). */
const char *jdt_config_mesh_axis_name(jdt_mesh_axis a);

/* One sharding rule: a logical axis name -> an ordered list of mesh axes (empty = replicated,
 * written `null` in YAML). MaxText logical_axis_rules semantics: rules are tried in order and
 * the first rule for a logical name whose mesh axes are still free wins. */
typedef struct {
    char *logical;                                  /* owned, e.g. "batch" */
    int n_mesh_axes;                                /* 0 = replicated */
    jdt_mesh_axis mesh_axes[JDT_MESH_AXIS_COUNT];   /* distinct */
} jdt_config_rule;

typedef struct {
    int n_rules;
    jdt_config_rule *rules; /* (n_rules), owned */
} jdt_config_rules;

/* ---- the config --------------------------------------------------------------------------- */

/* Every char * is owned by the config (never NULL after a successful load; "" when unset). */
typedef struct jdt_config {
    struct {
        char *name;
        char *out_dir;
        int64_t seed;
        int64_t steps;
        int64_t log_every;
        int64_t eval_every; /* 0 = never */
        int64_t eval_steps;
        bool profile;
        int64_t profile_steps;
        jdt_log_level log_level; /* debug|info|warn|error */
    } run;
    struct {
        jdt_model_type type;
        /* gpt */
        int vocab_size; /* V */
        int seq_len;    /* T */
        int n_layer;    /* L */
        int n_embd;     /* C */
        int n_head;     /* H */
        int n_kv_head;  /* 0 = n_head; must divide n_head */
        int head_dim;   /* D when > 0 (Qwen3's head_dim); 0 = n_embd / n_head */
        int mlp_ratio;  /* MLP hidden = mlp_ratio * C (for every activation, swiglu included) */
        int mlp_dim;    /* MLP hidden width when > 0 (Llama's intermediate_size); overrides mlp_ratio */
        jdt_norm_type norm;
        double norm_eps;
        jdt_pos_type pos;
        double rope_theta;
        jdt_rope_scaling rope_scaling; /* Llama 3.1's frequency scaling, with: */
        double rope_factor;            /*   factor */
        double rope_low_freq_factor;   /*   low_freq_factor */
        double rope_high_freq_factor;  /*   high_freq_factor */
        int rope_original_max_pos;     /*   original_max_position_embeddings */
        jdt_activation activation;
        bool tie_embeddings;
        bool bias;
        bool qkv_bias;  /* q, k, v biases even when bias is false (Qwen2) */
        bool qk_norm;   /* a norm over each head's q and k before RoPE (Qwen3) */
        bool embed_scale; /* token embeddings times sqrt(n_embd) on the way in (Gemma) */
        double dropout;
        double init_std;
        /* mlp */
        int in_dim;
        int hidden_dim;
        int n_hidden;
        int n_classes;
    } model;
    struct {
        int data;
        int fsdp;
        int tensor;
    } mesh;
    struct {
        jdt_config_rules rules;
    } sharding;
    struct {
        jdt_data_format format;
        char *source;
        char *train_path;
        char *val_path;
        int n_shards;
        double val_fraction;
        int batch_size;       /* global, in sequences (B) */
        int micro_batch_size; /* resolved: never 0 after load (0 in YAML = batch_size) */
        bool shuffle;
        int prefetch;
        jdt_tokenizer tokenizer;
        char *tokenizer_path; /* bpe: tokenizer to load; "" = train one in prepare */
        int fetch_retries;      /* remote data: retries after transient failures */
        double fetch_backoff_s; /* remote data: first retry delay, doubled each time */
        double fetch_timeout_s; /* remote data: connect / stall timeout */
    } data;
    struct {
        jdt_optim_type type;
        double lr;
        jdt_lr_schedule schedule;
        int64_t warmup_steps;
        int64_t decay_steps; /* 0 = run.steps (kept as written; see jdt_config_decay_steps) */
        double min_lr_ratio;
        double beta1;
        double beta2;
        double eps;
        double weight_decay;
        double momentum;
        bool nesterov;
        double grad_clip; /* 0 = off */
        jdt_nan_policy nan_policy;
    } optimizer;
    struct {
        jdt_dtype compute;     /* JDT_DTYPE_F32 or JDT_DTYPE_BF16 */
        jdt_dtype activations; /* JDT_DTYPE_F32, or JDT_DTYPE_BF16 (needs compute bf16) */
        jdt_dtype params;  /* JDT_DTYPE_F32 */
    } precision;
    struct {
        char *dir; /* "" = <run.out_dir>/<run.name>/ckpt */
        int64_t every; /* 0 = never */
        int keep;
        char *resume; /* "none" | "auto" | a path */
        char *init_from; /* "" | a jdt checkpoint | a Hugging Face model directory */
        bool save_on_signal;
    } checkpoint;
    struct {
        jdt_backend backend;
        int threads;     /* 0 = auto */
        bool adaptive_threads; /* use 1 thread instead of `threads` while that measures faster */
        char *cache_dir; /* "" = ~/.cache/jdt-train */
        int cache_max_mb; /* bound of the JIT cache in MiB, least recently used pruned; 0 = none */
        bool jit;        /* false = reference interpreter */
        jdt_remat remat;
        int loss_chunks;   /* gpt: head + cross-entropy in this many sequence slices (1 = whole) */
        bool overlap_comm; /* collectives as start/wait pairs under compute (CPU and CUDA) */
        int bucket_mb;     /* collective buckets in MiB; 0 = one call per tensor */
        int prefetch_mb;   /* FSDP gathers in flight ahead of use, MiB; 0 = one call ahead */
        char *cc;
        char *cflags; /* "" = the compiler's built-in flags */
        double peak_gflops; /* MFU reference per process; 0 = measured once per machine, cached */
    } runtime;
    struct {
        char *coordinator; /* host:port, "" = none */
        int rank;          /* -1 = auto */
        int world_size;    /* -1 = auto */
        int local_rank;    /* -1 = auto */
        char *token;
        char *token_file;
        double connect_timeout_s;
        double heartbeat_s;
        double peer_timeout_s;
        int port; /* 0 = derive */
    } dist;

    char *path;          /* the top config file as given (owned) */
    char *resolved_yaml; /* the fully resolved config as YAML (owned); round-trips */
} jdt_config;

/* ---- the schema ----------------------------------------------------------------------------- */

typedef enum {
    JDT_CONFIG_INT,   /* int */
    JDT_CONFIG_I64,   /* int64_t */
    JDT_CONFIG_FLOAT, /* double, finite */
    JDT_CONFIG_BOOL,
    JDT_CONFIG_STR,   /* char *, owned */
    JDT_CONFIG_ENUM,  /* an enum field; value = choices index, or values[index] when set */
    JDT_CONFIG_RULES  /* jdt_config_rules */
} jdt_config_type;

typedef struct {
    const char *path;             /* "section.key" */
    jdt_config_type type;
    size_t offset;                /* of the field in jdt_config */
    double min, max;              /* INT/I64/FLOAT bounds (inclusive unless max_open) */
    bool max_open;                /* max is exclusive: [min, max) */
    const char *const *choices;   /* ENUM: NULL-terminated names */
    const int *values;            /* ENUM: field values per choice (NULL = index) */
    const char *def;              /* default, as YAML text */
    const char *doc;              /* one line */
} jdt_config_key;

/* Number of keys in the schema and the i-th key (0 <= i < count; NULL when out of range).
 * The table is static and immutable. */
int jdt_config_schema_count(void);
const jdt_config_key *jdt_config_schema_key(int i);
/* Looks a key up by "section.key"; NULL when unknown. */
const jdt_config_key *jdt_config_schema_find(const char *path);
/* Name of enum value `value` of key `path` ("gelu" for ("model.activation", JDT_ACT_GELU));
 * "?" when the key is not an enum or the value is not one of its choices. Static string. */
const char *jdt_config_choice_name(const char *path, int value);
/* Writes the environment variable name of a key ("JDT_MODEL_N_LAYER") into buf. */
void jdt_config_env_name(const jdt_config_key *k, char *buf, size_t n_bytes);
/* True for a key each process of a job may set for itself (input paths, caches, threads, the
 * compiler, logging, dist.*); every other key must agree across the ranks. */
bool jdt_config_key_per_process(const jdt_config_key *k);
/* The i-th entry of that list ("runtime.threads", or "dist." for a whole section); NULL past
 * the end. For messages and the schema test. */
const char *jdt_config_per_process_key(int i);

/* ---- loading and printing ------------------------------------------------------------------ */

/*
 * Loads `path` (following base_config), applies `envp` JDT_<SECTION>_<KEY> variables and the
 * n_overrides "key.path=value" strings, validates, and fills *out (which the caller need not
 * initialise). envp may be NULL (no environment); it is a NULL-terminated "NAME=value" array
 * like environ. JDT_* variables not starting with a section prefix (JDT_BIN, JDT_TOKEN, ...)
 * are ignored.
 *
 * Returns JDT_OK, JDT_ERR_NOMEM, or JDT_ERR_CONFIG for every user error (missing or unreadable
 * file, YAML syntax, duplicate or unknown key, wrong type, out of range, base_config cycle, bad
 * override, a key set both by override and environment, failed cross-field check); e->msg then
 * holds one line naming the place (file:line:col, the override or the variable), the key path
 * and what was expected. On failure *out holds nothing to free (it is zeroed). Writes no files.
 */
jdt_status jdt_config_load(const char *path, int n_overrides, char *const *overrides,
                           char *const *envp, jdt_config *out, jdt_err *e);

/* Like jdt_config_load, from YAML text in memory; `label` names it in messages and
 * base_config paths are resolved relative to the current directory. */
jdt_status jdt_config_load_string(const char *text, const char *label, int n_overrides,
                                  char *const *overrides, char *const *envp, jdt_config *out,
                                  jdt_err *e);

/* Frees everything the config owns and zeroes it. NULL and zeroed configs are fine. */
void jdt_config_free(jdt_config *c);

/* Writes the config as YAML (every key, schema order) that loads back to an equal config.
 * Returns JDT_OK or JDT_ERR_IO when writing to f fails. */
jdt_status jdt_config_write_yaml(const jdt_config *c, FILE *f, jdt_err *e);

/* Returns the YAML text of jdt_config_write_yaml in a new jdt_malloc'd string (caller frees
 * with jdt_free), or NULL with e set (JDT_ERR_NOMEM). */
char *jdt_config_to_yaml(const jdt_config *c, jdt_err *e);

/* True when a and b hold the same values for every schema key (paths are not compared). */
bool jdt_config_equal(const jdt_config *a, const jdt_config *b);

/* The first schema key (schema order) on which a and b differ, skipping the per-process keys
 * when job_only (jdt_config_key_per_process); NULL when none does. */
const jdt_config_key *jdt_config_first_difference(const jdt_config *a, const jdt_config *b,
                                                  bool job_only);

/* Writes c's value of key k as one line of YAML text into buf (truncated to n_bytes - 1;
 * sharding rules as a flow list), e.g. "0.001", "\"runs\"", "[[batch, data]]". */
void jdt_config_value_text(const jdt_config_key *k, const jdt_config *c, char *buf,
                           size_t n_bytes);

/* Prints every key: path, type, default, bounds or choices, env variable, doc. */
void jdt_config_print_schema(FILE *f);
/* The same as a Markdown table (used for docs/config.md). */
void jdt_config_print_schema_markdown(FILE *f);

/* ---- derived values ------------------------------------------------------------------------ */

/* Number of trainable parameters the model section describes (GPT: token and position
 * embeddings, per block q/k/v/o, MLP and norms, final norm, untied head; MLP: dense layers).
 * Norm scales count n_embd each; layernorm adds a shift when model.bias. */
int64_t jdt_config_param_count(const jdt_config *c);
/* optimizer.decay_steps, or run.steps when it is 0. */
int64_t jdt_config_decay_steps(const jdt_config *c);
/* The MLP hidden width F: model.mlp_dim, or mlp_ratio * n_embd when it is 0. */
int64_t jdt_config_mlp_dim(const jdt_config *c);
/* model.n_kv_head, or model.n_head when it is 0. */
int jdt_config_kv_heads(const jdt_config *c);
/* RoPE's frequency scaling as jdt_rope_freq takes it (sc[0] = 0: none). */
void jdt_config_rope_scaling(const jdt_config *c, double sc[4]);
/* The attention head width D: model.head_dim, or n_embd / n_head when it is 0. */
int jdt_config_head_dim(const jdt_config *c);
/* Whether the q, k and v projections have biases (model.bias or model.qkv_bias). */
bool jdt_config_qkv_bias(const jdt_config *c);
/* Whether the MLP is gated (swiglu, geglu): mlp.gate, mlp.up and mlp.down, not mlp.fc and
 * mlp.proj. */
bool jdt_config_gated_mlp(const jdt_config *c);
/* data * fsdp * tensor. */
int jdt_config_mesh_size(const jdt_config *c);

#endif /* JDT_CONFIG_H */
