/*
 * builder.h — the graph builder API used by models/, autodiff and tests: one checked
 * constructor per op of graph.h, plus leaves, constants and numpy-style broadcasting helpers.
 *
 * Error model (for model code): every builder function accepts NULL tensor arguments and then
 * returns NULL. The FIRST error (bad shape, bad dtype, bad attribute, NULL input with no prior
 * error, out of memory) is recorded in the graph and is sticky: it names the op, the inputs'
 * shapes and dtypes and what was wrong. Model code builds everything and checks once at the
 * end with jdt_graph_error(g, &err) (graph.h). Once an error is recorded, every later builder
 * call returns NULL without appending a node.
 *
 * Every returned tensor is owned by g (freed by jdt_graph_free). Logical axis names (`axes`)
 * are propagated through shape-preserving ops, reductions (reduced dims dropped), transposes,
 * matmuls, gathers and broadcasts. The SPMD partitioner (engine/shard, docs/sharding.md)
 * maps them to mesh axes through sharding.rules.
 */
#ifndef JDT_GRAPH_BUILDER_H
#define JDT_GRAPH_BUILDER_H

#include "graph/graph.h"

#include <stdio.h>

/* ---- leaves ------------------------------------------------------------------------------- */

/* A trainable parameter named `name` (unique among the graph's leaves) of shape dims[0..ndim)
 * and dtype dt. axis_names may be NULL or hold ndim entries (each may be NULL): the logical
 * name per dim ("embed", "mlp", "vocab", "heads" ...). The caller binds t->data before a run. */
jdt_tensor *jdt_graph_param(jdt_graph *g, const char *name, jdt_dtype dt, int ndim,
                            const int64_t *dims, const char *const *axis_names);
/* A per-step input (data, targets, learning rate ...); same contract as jdt_graph_param. */
jdt_tensor *jdt_graph_input(jdt_graph *g, const char *name, jdt_dtype dt, int ndim,
                            const int64_t *dims, const char *const *axis_names);
/* A non-trainable persistent leaf (optimizer moments): op INPUT with flag JDT_TENSOR_STATE
 * instead of JDT_TENSOR_INPUT, so it can be an update target. Same contract as above. */
jdt_tensor *jdt_graph_state(jdt_graph *g, const char *name, jdt_dtype dt, int ndim,
                            const int64_t *dims, const char *const *axis_names);

/* A CONSTANT whose data (numel elements of dt, row-major) is copied into g's arena. */
jdt_tensor *jdt_graph_constant(jdt_graph *g, jdt_dtype dt, int ndim, const int64_t *dims,
                               const void *data);
/* A CONSTANT with every element = value (no data stored). */
jdt_tensor *jdt_graph_full(jdt_graph *g, jdt_dtype dt, int ndim, const int64_t *dims, double value);
/* A 0-d CONSTANT. */
jdt_tensor *jdt_graph_scalar(jdt_graph *g, jdt_dtype dt, double value);
/* IOTA: value = index along `axis`. dt may be f32, f64 or i32. */
jdt_tensor *jdt_graph_iota(jdt_graph *g, jdt_dtype dt, int ndim, const int64_t *dims, int axis);
/* CAUSAL_MASK (T, T): 0 where col <= row, -inf elsewhere. dt f32 or f64. */
jdt_tensor *jdt_graph_causal_mask(jdt_graph *g, jdt_dtype dt, int64_t seq_len);

/* ---- generic constructor ------------------------------------------------------------------ */

/* Appends op with the given inputs and attrs after checking them with the op's shape rule
 * (engine/graph/ops.c). `dt` and `shape` are read only by ops whose result the caller chooses
 * (CAST: dt; BROADCAST, RESHAPE: shape; CONSTANT, IOTA, CAUSAL_MASK: both; others ignore them,
 * shape may be NULL). Returns the new tensor, or NULL with the sticky error recorded. */
jdt_tensor *jdt_graph_op(jdt_graph *g, jdt_op op, int n_inputs, jdt_tensor *const *inputs,
                         const jdt_attrs *attrs, jdt_dtype dt, const jdt_shape *shape);

/* ---- elementwise (inputs must have equal shapes and the same float dtype) ------------------ */

jdt_tensor *jdt_graph_neg(jdt_graph *g, jdt_tensor *x);
jdt_tensor *jdt_graph_exp(jdt_graph *g, jdt_tensor *x);
jdt_tensor *jdt_graph_log(jdt_graph *g, jdt_tensor *x);
jdt_tensor *jdt_graph_tanh(jdt_graph *g, jdt_tensor *x);
jdt_tensor *jdt_graph_sqrt(jdt_graph *g, jdt_tensor *x);
jdt_tensor *jdt_graph_rsqrt(jdt_graph *g, jdt_tensor *x);
jdt_tensor *jdt_graph_relu(jdt_graph *g, jdt_tensor *x);
jdt_tensor *jdt_graph_gelu(jdt_graph *g, jdt_tensor *x);
jdt_tensor *jdt_graph_silu(jdt_graph *g, jdt_tensor *x);
jdt_tensor *jdt_graph_sigmoid(jdt_graph *g, jdt_tensor *x);
jdt_tensor *jdt_graph_abs(jdt_graph *g, jdt_tensor *x);
jdt_tensor *jdt_graph_stop_gradient(jdt_graph *g, jdt_tensor *x);

jdt_tensor *jdt_graph_add(jdt_graph *g, jdt_tensor *a, jdt_tensor *b);
jdt_tensor *jdt_graph_sub(jdt_graph *g, jdt_tensor *a, jdt_tensor *b);
jdt_tensor *jdt_graph_mul(jdt_graph *g, jdt_tensor *a, jdt_tensor *b);
jdt_tensor *jdt_graph_div(jdt_graph *g, jdt_tensor *a, jdt_tensor *b);
jdt_tensor *jdt_graph_max(jdt_graph *g, jdt_tensor *a, jdt_tensor *b);
jdt_tensor *jdt_graph_min(jdt_graph *g, jdt_tensor *a, jdt_tensor *b);
jdt_tensor *jdt_graph_gt(jdt_graph *g, jdt_tensor *a, jdt_tensor *b);
jdt_tensor *jdt_graph_ge(jdt_graph *g, jdt_tensor *a, jdt_tensor *b);

/* numpy-style broadcasting versions: each side is BROADCAST to the common shape first (only
 * when needed). Incompatible shapes are a sticky error naming the op and both shapes. */
jdt_tensor *jdt_graph_add_bcast(jdt_graph *g, jdt_tensor *a, jdt_tensor *b);
jdt_tensor *jdt_graph_sub_bcast(jdt_graph *g, jdt_tensor *a, jdt_tensor *b);
jdt_tensor *jdt_graph_mul_bcast(jdt_graph *g, jdt_tensor *a, jdt_tensor *b);
jdt_tensor *jdt_graph_div_bcast(jdt_graph *g, jdt_tensor *a, jdt_tensor *b);
jdt_tensor *jdt_graph_max_bcast(jdt_graph *g, jdt_tensor *a, jdt_tensor *b);
jdt_tensor *jdt_graph_min_bcast(jdt_graph *g, jdt_tensor *a, jdt_tensor *b);

jdt_tensor *jdt_graph_add_scalar(jdt_graph *g, jdt_tensor *x, double c);
jdt_tensor *jdt_graph_mul_scalar(jdt_graph *g, jdt_tensor *x, double c);
jdt_tensor *jdt_graph_pow_scalar(jdt_graph *g, jdt_tensor *x, double p);
/* dy * gelu'(x), dy * silu'(x). */
jdt_tensor *jdt_graph_gelu_grad(jdt_graph *g, jdt_tensor *x, jdt_tensor *dy);
jdt_tensor *jdt_graph_silu_grad(jdt_graph *g, jdt_tensor *x, jdt_tensor *dy);
/* cond != 0 ? a : b; cond of any numeric dtype with the same shape. */
jdt_tensor *jdt_graph_select(jdt_graph *g, jdt_tensor *cond, jdt_tensor *a, jdt_tensor *b);
/* Converts between f32, f64 and i32 (float -> i32 truncates toward zero). */
jdt_tensor *jdt_graph_cast(jdt_graph *g, jdt_tensor *x, jdt_dtype dt);
/* Inverted dropout with probability `rate` in [0, 1) keyed on `key`; step is an i32 0-d tensor. */
jdt_tensor *jdt_graph_dropout(jdt_graph *g, jdt_tensor *x, jdt_tensor *step, double rate,
                              uint64_t key);
/* The same, x's rows (dim 0) numbered from row0 (an f64 0-d tensor, set per run): element
 * (r, rest) draws counter (row0 + r) * row size + rest, so that micro-batches and the ranks'
 * blocks of a step's batch draw one device's masks of the whole batch (graph.h DROPOUT). */
jdt_tensor *jdt_graph_dropout_rows(jdt_graph *g, jdt_tensor *x, jdt_tensor *step, jdt_tensor *row0,
                                   double rate, uint64_t key);

/* ---- shape and reduction ------------------------------------------------------------------ */

/* Broadcasts x (right-aligned, numpy rules) to dims[0..ndim). */
jdt_tensor *jdt_graph_broadcast(jdt_graph *g, jdt_tensor *x, int ndim, const int64_t *dims);
/* Reduces the axes whose bit is set in axes_mask; keepdims keeps them as size 1. */
jdt_tensor *jdt_graph_reduce_sum(jdt_graph *g, jdt_tensor *x, uint32_t axes_mask, bool keepdims);
jdt_tensor *jdt_graph_reduce_max(jdt_graph *g, jdt_tensor *x, uint32_t axes_mask, bool keepdims);
jdt_tensor *jdt_graph_reduce_mean(jdt_graph *g, jdt_tensor *x, uint32_t axes_mask, bool keepdims);
/* Same element count, row-major. */
jdt_tensor *jdt_graph_reshape(jdt_graph *g, jdt_tensor *x, int ndim, const int64_t *dims);
/* perm[0..x->shape.ndim): out.dims[k] = x.dims[perm[k]]. */
jdt_tensor *jdt_graph_transpose(jdt_graph *g, jdt_tensor *x, const int *perm);
/* x[..., start:stop, ...] along axis. */
jdt_tensor *jdt_graph_slice(jdt_graph *g, jdt_tensor *x, int axis, int64_t start, int64_t stop);
/* Concatenates n (1..JDT_MAX_INPUTS) tensors along axis. */
jdt_tensor *jdt_graph_concat(jdt_graph *g, int n, jdt_tensor *const *xs, int axis);
/* a (..., M, K) [(..., K, M) if ta] x b (..., K, N) [(..., N, K) if tb] -> (..., M, N). */
jdt_tensor *jdt_graph_matmul(jdt_graph *g, jdt_tensor *a, jdt_tensor *b, bool ta, bool tb);
/* table (V, C), idx (...) i32 -> (..., C). */
jdt_tensor *jdt_graph_gather(jdt_graph *g, jdt_tensor *table, jdt_tensor *idx);
/* src (..., C), idx (...) i32 -> (n_rows, C), rows summed into zeros. */
jdt_tensor *jdt_graph_scatter_add(jdt_graph *g, jdt_tensor *src, jdt_tensor *idx, int64_t n_rows);

/* ---- fused primitives (last axis) --------------------------------------------------------- */

jdt_tensor *jdt_graph_softmax(jdt_graph *g, jdt_tensor *x);
jdt_tensor *jdt_graph_softmax_bwd(jdt_graph *g, jdt_tensor *y, jdt_tensor *dy);
jdt_tensor *jdt_graph_log_softmax(jdt_graph *g, jdt_tensor *x);
jdt_tensor *jdt_graph_log_softmax_bwd(jdt_graph *g, jdt_tensor *y, jdt_tensor *dy);
/* logits (N, V), targets (N) i32 -> loss (N); target < 0 is ignored. */
jdt_tensor *jdt_graph_softmax_xent(jdt_graph *g, jdt_tensor *logits, jdt_tensor *targets);
/* dlogits (N, V) of the loss above with per-row cotangent dloss (N). loss: that forward's
 * output for these logits and targets (the kernels read a row's logsumexp from it), or NULL
 * to add it here. */
jdt_tensor *jdt_graph_softmax_xent_bwd(jdt_graph *g, jdt_tensor *logits, jdt_tensor *targets,
                                       jdt_tensor *dloss, jdt_tensor *loss);
jdt_tensor *jdt_graph_normalize(jdt_graph *g, jdt_tensor *x, double eps);
jdt_tensor *jdt_graph_normalize_bwd(jdt_graph *g, jdt_tensor *x, jdt_tensor *dxhat, double eps);
jdt_tensor *jdt_graph_rms_normalize(jdt_graph *g, jdt_tensor *x, double eps);
jdt_tensor *jdt_graph_rms_normalize_bwd(jdt_graph *g, jdt_tensor *x, jdt_tensor *dxhat, double eps);
/* x (B, T, H, D), D even; inverse = rotate by minus the angle. */
jdt_tensor *jdt_graph_rope(jdt_graph *g, jdt_tensor *x, double theta, bool inverse);
/* jdt_graph_rope with Llama 3's frequency scaling sc = {factor, low_freq_factor,
 * high_freq_factor, original_max_position_embeddings} (NULL or sc[0] == 0: none). */
jdt_tensor *jdt_graph_rope_scaled(jdt_graph *g, jdt_tensor *x, double theta, bool inverse,
                                  const double *sc);
/* q, k, v (B, H, T, D) -> (B, H, T, D), causal, scores scaled by `scale`. */
jdt_tensor *jdt_graph_attention(jdt_graph *g, jdt_tensor *q, jdt_tensor *k, jdt_tensor *v,
                                double scale);
/* -> (3, B, H, T, D) = dq, dk, dv. */
jdt_tensor *jdt_graph_attention_bwd(jdt_graph *g, jdt_tensor *q, jdt_tensor *k, jdt_tensor *v,
                                    jdt_tensor *o, jdt_tensor *dout, double scale);

/* ---- helpers ------------------------------------------------------------------------------ */

/* Computes the numpy broadcast of shapes a and b into out; false if incompatible. */
/* ALL_REDUCE: x reduced over process group `group` (0 sum, 1 max), times scale. */
jdt_tensor *jdt_graph_all_reduce(jdt_graph *g, jdt_tensor *x, int group, int reduce_op,
                                 double scale);
/* ALL_GATHER: the k members' x concatenated along axis (k = the size of process group group). */
jdt_tensor *jdt_graph_all_gather(jdt_graph *g, jdt_tensor *x, int group, int k, int axis);
/* REDUCE_SCATTER: this member's 1/k part along axis of the sum over the group, times scale. */
jdt_tensor *jdt_graph_reduce_scatter(jdt_graph *g, jdt_tensor *x, int group, int k, int axis,
                                     double scale);

bool jdt_shape_broadcast(const jdt_shape *a, const jdt_shape *b, jdt_shape *out);
/* Sums dx down to `shape` (the inverse of a numpy broadcast to dx's shape): reduces the extra
 * leading axes and the axes where shape has size 1. Returns dx itself if already that shape. */
jdt_tensor *jdt_graph_unbroadcast(jdt_graph *g, jdt_tensor *dx, const jdt_shape *shape);
/* Re-checks every node of g as the builder would: inputs precede the node and belong to g, the
 * arity fits, and the op's shape rule accepts the inputs and attrs and yields exactly the
 * node's stored dtype and shape. For graphs rewritten by passes (jdt_graph_new_node does not
 * check). Returns JDT_OK or ERR_SHAPE/ERR_INVALID naming the first bad node (id, op, reason). */
jdt_status jdt_graph_verify(const jdt_graph *g, jdt_err *e);
/* Writes one line per node to f: "  %id = op(inputs) attrs : shape dtype [axes] 'name' flags",
 * then the outputs and updates. For debugging and `inspect`; the format is not a contract. */
void jdt_graph_fprint(const jdt_graph *g, FILE *f);
/* True for F32, F64 and BF16 (the differentiable dtypes). */
bool jdt_dtype_is_float(jdt_dtype dt);
/* The dtype of a cotangent (gradient) of a dt value: dt, except F32 for BF16 (gradients stay
 * f32 in the mixed-precision recipe; the GEMMs produce them in f32). */
jdt_dtype jdt_dtype_cotangent(jdt_dtype dt);

#endif /* JDT_GRAPH_BUILDER_H */
