/*
 * models.h — model builders: turn the model section of a config into a forward graph with a
 * scalar loss, every parameter named by a stable global name and every dim by a logical axis.
 *
 * Models: `gpt` (GPT-2 style decoder with Llama options: rmsnorm, rotary positions, SwiGLU,
 * grouped-query attention, untied head, biases on/off, dropout; Qwen's: q/k/v-only biases, a
 * per-head q/k norm, a head width of its own) and `mlp` (classifier).
 *
 * Dimension letters: B micro-batch rows, T sequence, C embed, V vocab, H heads, Hkv kv heads,
 * D head dim (model.head_dim, else C / H), F mlp hidden (model.mlp_dim, else mlp_ratio * C),
 * N = B * T.
 */
#ifndef JDT_MODELS_H
#define JDT_MODELS_H

#include "config/config.h"
#include "graph/graph.h"

/* How a parameter is initialised (GPT-2 style; see jdt_model_init_param). */
typedef enum {
    JDT_INIT_NORMAL, /* N(0, std) */
    JDT_INIT_ZEROS,
    JDT_INIT_ONES,
} jdt_init_kind;

typedef struct {
    jdt_tensor *t;       /* the PARAM leaf (its name is the global name) */
    jdt_init_kind init;
    double std;          /* JDT_INIT_NORMAL only */
    bool decay;          /* weight decay applies (matrices and embeddings; not norms, biases) */
} jdt_model_param;

typedef struct {
    int64_t batch;       /* B: rows per run of this graph */
    jdt_tensor *x;       /* gpt: (B, T) i32 token ids;  mlp: (B, in_dim) f32 */
    jdt_tensor *y;       /* gpt: (B, T) i32 next tokens; mlp: (B) i32 labels */
    jdt_tensor *step;    /* () i32 dropout step counter; NULL when the graph has no dropout */
    jdt_tensor *row0;    /* () f64: the step-batch row of this run's first row (dropout's mask
                          * counter, graph.h DROPOUT); with step */
    jdt_tensor *logits;  /* gpt: (N, V); mlp: (B, n_classes); f32 (bf16-rounded values under
                          * precision.activations: bf16) */
    jdt_tensor *loss;    /* () f32: mean cross-entropy over the rows */
    int n_params;
    jdt_model_param *params; /* (n_params), arena-owned, in a stable order */
} jdt_model;

/* Builds the model of cfg->model into g for `batch` rows. `training` enables dropout (when
 * cfg->model.dropout > 0). When g's jdt_graph_bf16_weights is on, every GEMM weight is read
 * through one CAST to bf16 (a bf16 operand: bf16 compute); GEMMs of two activations and
 * attention compute in bf16 when jdt_graph_matmul_bf16 is on (the train step sets both from
 * precision.compute). With cfg->precision.activations bf16 the outputs of the linear layers
 * and of the head are bf16 nodes, bf16(x W + bf16(b)) as PyTorch autocast's.
 * Returns JDT_OK and fills *m (pointers into g's arena), or
 * ERR_CONFIG/ERR_SHAPE/ERR_NOMEM with e naming the first failing op. */
jdt_status jdt_model_build(jdt_graph *g, const jdt_config *cfg, int64_t batch, bool training,
                           jdt_model *m, jdt_err *e);

/* jdt_model_build with the gpt's head and cross-entropy computed in loss_chunks slices of the
 * sequence (runtime.loss_chunks; 1 <= loss_chunks <= T; 1 = jdt_model_build): the same loss,
 * no (N, V) logits tensor (m->logits NULL when loss_chunks > 1). seq_ways > 1: the mesh splits
 * the sequence that many ways (sequence parallelism, jdt_shard_seq_ways; it divides T): the
 * head and loss are built without flattening (B, T), so that each rank computes its own
 * positions' logits (m->logits (B, T, V) when loss_chunks is 1); 1 = one device's graph. The
 * mlp ignores both. */
jdt_status jdt_model_build_ex(jdt_graph *g, const jdt_config *cfg, int64_t batch, bool training,
                              int loss_chunks, int seq_ways, jdt_model *m, jdt_err *e);

/* Writes the initial value of p into data (numel floats): a pure function of (seed, p's name,
 * element index), so every process and every mesh draws the same initial weights. */
void jdt_model_init_param(const jdt_model_param *p, uint64_t seed, float *data);

/* The logical axis names the built-in models put on dims (NULL-terminated, static): batch,
 * seq, vocab, embed, heads, kv_heads, mlp, norm. sharding.rules may name only these. */
const char *const *jdt_model_axis_names(void);

/* Writes the block of p's initial value that starts at offset[] (per dim) of the whole tensor
 * of shape global and has shape local (row-major into data): the same numbers
 * jdt_model_init_param gives those elements, drawn only for the block, rows spread over the
 * OpenMP threads. */
void jdt_model_init_block(const jdt_model_param *p, uint64_t seed, const jdt_shape *global,
                          const int64_t *offset, const jdt_shape *local, float *data);

/* Total number of parameter elements in m. */
int64_t jdt_model_param_count(const jdt_model *m);

#endif /* JDT_MODELS_H */
