/*
 * graph.h — the IR: a static-shape dataflow graph of tensors, each produced by one op.
 *
 * A graph owns everything built for it (one arena; freed with jdt_graph_free). Nodes are
 * appended in topological order: every input of node i has an id < i, so the node array is a
 * valid schedule as built. Every op produces exactly one tensor; a fused backward op with
 * several results of one shape packs them along a new leading axis (ATTENTION_BWD), otherwise
 * it is split into separate ops.
 *
 * Leaves (PARAM, INPUT) are bound to caller-owned memory through `data` before a run; CONSTANT
 * data lives in the graph's arena. Outputs are the tensors a run must produce; updates say
 * "after the step, write tensor `value` into leaf `target`" (params in -> params out, donated
 * buffers updated in place).
 *
 * Dimension letters used in comments: B batch, T sequence, C channels/embed, V vocab, H heads,
 * D head dim, N rows (flattened leading dims), K contraction.
 */
#ifndef JDT_GRAPH_H
#define JDT_GRAPH_H

#include "core/core.h"

#define JDT_MAX_DIMS 6
#define JDT_MAX_INPUTS 8

typedef struct {
    int ndim;
    int64_t dims[JDT_MAX_DIMS];
} jdt_shape;

/*
 * Op classes: what kind of computation an op is. Passes and backends decide by class (never by
 * an op's position in the enum); a switch over jdt_op lists every op (no `default:`), so the
 * build (-Wswitch-enum) names each switch a new op must be added to.
 */
typedef enum {
    JDT_OPC_LEAF,        /* no inputs, value bound by the caller or stored: PARAM INPUT CONSTANT */
    JDT_OPC_ELEMENTWISE, /* out[j] = f(in0[j], in1[j], ...): unary, binary or ternary (arity) */
    JDT_OPC_GENERATOR,   /* no inputs, out[j] = f(index of j): IOTA CAUSAL_MASK */
    JDT_OPC_SHAPE,       /* data movement without arithmetic: broadcast, reshape (a view),
                            transpose, slice, concat */
    JDT_OPC_REDUCTION,   /* reduce over a mask of axes */
    JDT_OPC_MATMUL,      /* batched GEMM (the BLAS library's work) */
    JDT_OPC_INDEX,       /* row gather / scatter-add through an i32 index tensor */
    JDT_OPC_FUSED,       /* fused primitive with a hand-written forward and backward kernel */
    JDT_OPC_COLLECTIVE,  /* communication over a process group (keep last: JDT_OPC_COUNT) */
} jdt_op_class;
#define JDT_OPC_COUNT (JDT_OPC_COLLECTIVE + 1)

/*
 * Partition kinds: how the SPMD partitioner (engine/shard) splits an op over a device mesh.
 * Each op names its kind in engine/graph/ops.c, beside its shape and VJP rules (part_<OP>), so
 * adding an op keeps one place to edit; engine/shard implements one rule per kind.
 * JDT_PART_NONE: the op has no partition rule (backward-only ops and collectives: the
 * partitioner runs before autodiff and inserts the collectives itself).
 */
typedef enum {
    JDT_PART_NONE,
    JDT_PART_LEAF,        /* placement from the sharding rules (params) or the batch rule */
    JDT_PART_GENERATOR,   /* replicated, computed locally */
    JDT_PART_ELEMENTWISE, /* inputs brought to one placement; partial sums pass linear ops */
    JDT_PART_BROADCAST,
    JDT_PART_REDUCTION,   /* a reduced split dim becomes a partial sum */
    JDT_PART_RESHAPE,
    JDT_PART_TRANSPOSE,
    JDT_PART_AXIS_WHOLE,  /* slice / concat: the op's axis gathered whole */
    JDT_PART_MATMUL,      /* contraction split -> partial sum; batch and free dims carried */
    JDT_PART_GATHER,      /* row gather (embedding): table split on rows or columns */
    JDT_PART_ROWS,        /* softmax / norms: the last dim whole, other dims carried */
    JDT_PART_XENT,        /* softmax cross-entropy: classes whole, rows carried */
    JDT_PART_ROPE,
    JDT_PART_ATTENTION,   /* heads and batch carried, sequence and head dim whole */
} jdt_part_kind;
#define JDT_PART_COUNT (JDT_PART_ATTENTION + 1)

/*
 * Op flags: yes/no properties the compiler asks of an op, one bit each. Each op names its set
 * in engine/graph/ops.c, beside its shape, VJP and partition entries (flags_<OP>, 0 for none),
 * so a new op cannot compile without deciding them; `jdt_op_flags` reads them.
 */
enum {
    /* On bf16 inputs the result is already a bf16 value (one of its inputs, a bf16 literal, 0 or
     * 1), so a bf16 node of this op needs no rounding (engine/compile/nest.c). */
    JDT_OPF_EXACT_BF16 = 1u << 0,
    /* The result is input 0 itself whenever it has input 0's dtype and shape, whatever the
     * attributes: the simplifier drops such a node (engine/compile/passes.c). */
    JDT_OPF_ID_IF_SAME_TYPE = 1u << 1,
};

/*
 * The op list. X(NAME, "name", n_inputs, CLASS); n_inputs -1 = variadic (1..JDT_MAX_INPUTS);
 * CLASS is a jdt_op_class without its JDT_OPC_ prefix.
 * Semantics (attrs are jdt_attrs.i[] integers and .f[] doubles):
 *
 * Leaves
 *   PARAM, INPUT        bound by caller; no inputs. PARAM is differentiable.
 *   CONSTANT            arena data (t->data) or, when data is NULL, every element = f[0].
 * Dtypes: f32 and f64 everywhere a float is taken; bf16 (JDT_DTYPE_BF16) on CAST, elementwise
 * ops, shape ops (broadcast, reshape, transpose, slice) and MATMUL operands. A bf16 node is
 * computed in f32 and its value rounded to bf16 (nearest even: round(f32 result)); that rounded
 * value is what its readers see. Reductions, fused primitives, concat, index ops and
 * collectives take f32/f64 only (cast first), except ALL_GATHER, which moves bf16 as bytes
 * (FSDP gathers bf16 copies of weight shards). The cotangent of a bf16 value is f32.
 * Elementwise, all inputs and the output have the same shape (the builder inserts BROADCAST)
 *   and one dtype (the builder casts a bf16 input mixed with f32/f64 ones up: promotion)
 *   NEG EXP LOG TANH SQRT RSQRT RELU GELU(tanh form) SILU SIGMOID ABS
 *   ADD SUB MUL DIV MAX MIN
 *   GT GE               f32 1.0 where a > b (a >= b), else 0.0; no gradient (the output has
 *                       the inputs' float dtype: f32 in f32 graphs, f64 in f64 graphs)
 *   ADD_SCALAR MUL_SCALAR POW_SCALAR   x + f[0], x * f[0], x ** f[0]
 *   GELU_GRAD SILU_GRAD (x, dy) -> dy * f'(x)
 *   SELECT              (cond, a, b) -> cond != 0 ? a : b
 *   CAST                converts to the node's dtype (f32, f64, i32 among themselves; bf16
 *                       to and from f32 and f64)
 *   STOP_GRADIENT       identity forward, zero gradient
 *   DROPOUT             (x, step) step: i32 scalar (shape ndim 0). keep element j with prob
 *                       1 - f[0] using Philox(key = i[0], ctr_hi = step, ctr_lo = j), scale kept
 *                       by 1/(1-f[0]). Its VJP is DROPOUT(dy, step) with the same attrs.
 *                       (x, step, row0 [, base]): row0 and base f64 scalars, i[2 + d] the
 *                       strides of the global x: j = row0 * i[2] + base + sum over dims of the
 *                       element's (local) index times i[2 + d]. row0 numbers x's rows within
 *                       the step's batch (set per micro-batch), base is the partitioner's: a
 *                       block's offset along the other dims; so micro-batches and every mesh
 *                       draw one device's masks of the whole batch.
 *                       Exactly: u = jdt_u32_to_unit_float(word v[0]); kept iff u >= f[0].
 * Shape and reduction
 *   BROADCAST           input right-aligned against the output shape (numpy rules; size-1 or
 *                       missing dims expand).
 *   REDUCE_SUM REDUCE_MAX REDUCE_MEAN   i[0] = bitmask of reduced axes, i[1] = keepdims (0/1)
 *   RESHAPE             same element count, row-major order
 *   TRANSPOSE           i[0..ndim) = perm: out.dims[k] = in.dims[perm[k]]
 *   SLICE               i[0] = axis, i[1] = start, i[2] = stop (step 1)
 *   CONCAT              variadic, i[0] = axis
 *   MATMUL              (a, b): a (..., M, K) [(..., K, M) if i[0]], b (..., K, N) [(..., N, K)
 *                       if i[1]]; leading batch dims equal, or b 2-D (shared by every batch).
 *                       out (..., M, N). f32, accumulated in f32. i[2] = 1: bf16 compute (a
 *                       and b rounded to bf16 first; jdt_graph_set_matmul_bf16). a or b may be
 *                       bf16 (the other bf16 or f32): then i[2] must be 1 and out is f32.
 *   GATHER              (table (V, C), idx (...) i32) -> (..., C); row lookup
 *   SCATTER_ADD         (src (..., C), idx (...) i32) -> (i[0] = V, C); rows summed into zeros
 *   IOTA                no inputs; value = index along axis i[0]
 *   CAUSAL_MASK         no inputs; shape (T, T): 0 where col <= row, -inf elsewhere
 * Fused primitives (hand-written forward and backward kernels; all work on the last axis)
 *   SOFTMAX             rows of the last axis
 *   SOFTMAX_BWD         (y, dy) -> y * (dy - sum(dy * y))
 *   LOG_SOFTMAX         rows of the last axis
 *   LOG_SOFTMAX_BWD     (y, dy) -> dy - exp(y) * sum(dy)      (y = log_softmax output)
 *   SOFTMAX_XENT        (logits (N, V), targets (N) i32) -> loss (N) = lse(row) - row[target];
 *                       a target < 0 is ignored (loss 0, no gradient). N may be several
 *                       leading dims, (B, T, V) with targets (B, T) (sequence parallelism)
 *   SOFTMAX_XENT_BWD    (logits (N, V), targets (N), dloss (N), loss (N)) -> dlogits (N, V);
 *                       loss is SOFTMAX_XENT's output for the same logits and targets (the
 *                       kernels take a row's logsumexp from it instead of another pass)
 *   NORMALIZE           layernorm without affine: (x - mean) * rsqrt(var + f[0])
 *   NORMALIZE_BWD       (x, dxhat) -> dx
 *   RMS_NORMALIZE       x * rsqrt(mean(x^2) + f[0])
 *   RMS_NORMALIZE_BWD   (x, dxhat) -> dx
 *   ROPE                x (B, T, H, D), rotary embedding on pairs (2i, 2i+1) with angle
 *                       t * f[0]^(-2i/D) (f[0] = theta); i[0] = 1 rotates by minus the angle
 *                       (its own VJP). f[1] > 0: the frequencies scaled as Llama 3's
 *                       rope_scaling, factor f[1], low/high frequency factors f[2], f[3],
 *                       original context i[3] (jdt_rope_freq; jdt_rope_scaling_of)
 *   ATTENTION           (q, k, v) each (B, H, T, D); causal; scale f[0]; -> (B, H, T, D).
 *                       Tiled with an online softmax: no T x T matrix is kept. i[0] = 1: bf16
 *                       compute (as MATMUL's i[2]): the inputs of each product (q, k, v, the
 *                       probabilities; in the backward also dout and dS) are rounded to bf16,
 *                       sums, softmax and dS stay f32. Set from jdt_graph_set_matmul_bf16.
 *   ATTENTION_BWD       (q, k, v, o, do) -> (3, B, H, T, D) packing dq, dk, dv; recomputes the
 *                       row log-sum-exp from q, k.
 * Collectives (SPMD: every process runs the same graph on its shard)
 *   ALL_REDUCE          x -> reduce(x over the ranks of process group i[0]) * f[0]; i[1] = 0 sum,
 *                       1 max. f32. Executed through the jdt_collective_fn the caller hands to
 *                       the program or interpreter (group ids are the caller's table). The VJP
 *                       of a sum is the same all-reduce of the cotangent.
 *   ALL_GATHER          x -> the group's k = i[2] members' x concatenated along axis i[1], in
 *                       group order (process group i[0]). VJP: REDUCE_SCATTER of the cotangent.
 *   REDUCE_SCATTER      x -> member j of the k = i[2] members of group i[0] gets part j of the
 *                       sum of everyone's x split evenly along axis i[1] (which k must divide),
 *                       times f[0]. VJP: ALL_GATHER of the cotangent times f[0].
 *   Autodiff convention (as psum/all_gather/psum_scatter transpose in JAX): the objective is
 *   the sum over ranks of each rank's scalar, so each collective's VJP is its linear transpose
 *   over the stacked per-rank values (engine/shard seeds the loss with 1/world accordingly).
 */
#define JDT_OP_LIST(X)                                                                            \
    X(PARAM, "param", 0, LEAF)                                                                    \
    X(INPUT, "input", 0, LEAF)                                                                    \
    X(CONSTANT, "constant", 0, LEAF)                                                              \
    X(NEG, "neg", 1, ELEMENTWISE)                                                                 \
    X(EXP, "exp", 1, ELEMENTWISE)                                                                 \
    X(LOG, "log", 1, ELEMENTWISE)                                                                 \
    X(TANH, "tanh", 1, ELEMENTWISE)                                                               \
    X(SQRT, "sqrt", 1, ELEMENTWISE)                                                               \
    X(RSQRT, "rsqrt", 1, ELEMENTWISE)                                                             \
    X(RELU, "relu", 1, ELEMENTWISE)                                                               \
    X(GELU, "gelu", 1, ELEMENTWISE)                                                               \
    X(SILU, "silu", 1, ELEMENTWISE)                                                               \
    X(SIGMOID, "sigmoid", 1, ELEMENTWISE)                                                         \
    X(ABS, "abs", 1, ELEMENTWISE)                                                                 \
    X(ADD, "add", 2, ELEMENTWISE)                                                                 \
    X(SUB, "sub", 2, ELEMENTWISE)                                                                 \
    X(MUL, "mul", 2, ELEMENTWISE)                                                                 \
    X(DIV, "div", 2, ELEMENTWISE)                                                                 \
    X(MAX, "max", 2, ELEMENTWISE)                                                                 \
    X(MIN, "min", 2, ELEMENTWISE)                                                                 \
    X(GT, "gt", 2, ELEMENTWISE)                                                                   \
    X(GE, "ge", 2, ELEMENTWISE)                                                                   \
    X(ADD_SCALAR, "add_scalar", 1, ELEMENTWISE)                                                   \
    X(MUL_SCALAR, "mul_scalar", 1, ELEMENTWISE)                                                   \
    X(POW_SCALAR, "pow_scalar", 1, ELEMENTWISE)                                                   \
    X(GELU_GRAD, "gelu_grad", 2, ELEMENTWISE)                                                     \
    X(SILU_GRAD, "silu_grad", 2, ELEMENTWISE)                                                     \
    X(SELECT, "select", 3, ELEMENTWISE)                                                           \
    X(CAST, "cast", 1, ELEMENTWISE)                                                               \
    X(STOP_GRADIENT, "stop_gradient", 1, ELEMENTWISE)                                             \
    X(DROPOUT, "dropout", -1, ELEMENTWISE)                                                        \
    X(BROADCAST, "broadcast", 1, SHAPE)                                                           \
    X(REDUCE_SUM, "reduce_sum", 1, REDUCTION)                                                     \
    X(REDUCE_MAX, "reduce_max", 1, REDUCTION)                                                     \
    X(REDUCE_MEAN, "reduce_mean", 1, REDUCTION)                                                   \
    X(RESHAPE, "reshape", 1, SHAPE)                                                               \
    X(TRANSPOSE, "transpose", 1, SHAPE)                                                           \
    X(SLICE, "slice", 1, SHAPE)                                                                   \
    X(CONCAT, "concat", -1, SHAPE)                                                                \
    X(MATMUL, "matmul", 2, MATMUL)                                                                \
    X(GATHER, "gather", 2, INDEX)                                                                 \
    X(SCATTER_ADD, "scatter_add", 2, INDEX)                                                       \
    X(IOTA, "iota", 0, GENERATOR)                                                                 \
    X(CAUSAL_MASK, "causal_mask", 0, GENERATOR)                                                   \
    X(SOFTMAX, "softmax", 1, FUSED)                                                               \
    X(SOFTMAX_BWD, "softmax_bwd", 2, FUSED)                                                       \
    X(LOG_SOFTMAX, "log_softmax", 1, FUSED)                                                       \
    X(LOG_SOFTMAX_BWD, "log_softmax_bwd", 2, FUSED)                                               \
    X(SOFTMAX_XENT, "softmax_xent", 2, FUSED)                                                     \
    X(SOFTMAX_XENT_BWD, "softmax_xent_bwd", 4, FUSED)                                             \
    X(NORMALIZE, "normalize", 1, FUSED)                                                           \
    X(NORMALIZE_BWD, "normalize_bwd", 2, FUSED)                                                   \
    X(RMS_NORMALIZE, "rms_normalize", 1, FUSED)                                                   \
    X(RMS_NORMALIZE_BWD, "rms_normalize_bwd", 2, FUSED)                                           \
    X(ROPE, "rope", 1, FUSED)                                                                     \
    X(ATTENTION, "attention", 3, FUSED)                                                           \
    X(ATTENTION_BWD, "attention_bwd", 5, FUSED)                                                   \
    X(ALL_REDUCE, "all_reduce", 1, COLLECTIVE)                                                    \
    X(ALL_GATHER, "all_gather", 1, COLLECTIVE)                                                    \
    X(REDUCE_SCATTER, "reduce_scatter", 1, COLLECTIVE)

typedef enum {
#define JDT_OP_ENUM_(name, str, n_in, cls) JDT_OP_##name,
    JDT_OP_LIST(JDT_OP_ENUM_)
#undef JDT_OP_ENUM_
} jdt_op;
/* The number of ops: not an enumerator, so an exhaustive switch over jdt_op need not name it. */
enum {
#define JDT_OP_ONE_(name, str, n_in, cls) +1
    JDT_OP_COUNT = 0 JDT_OP_LIST(JDT_OP_ONE_)
#undef JDT_OP_ONE_
};

typedef struct {
    int64_t i[8];
    double f[4];
} jdt_attrs;

/* Tensor flags. */
enum {
    JDT_TENSOR_PARAM = 1u << 0,  /* trainable parameter (differentiated) */
    JDT_TENSOR_INPUT = 1u << 1,  /* per-step input (data, targets, lr ...) */
    JDT_TENSOR_OUTPUT = 1u << 2, /* listed in the graph's outputs */
    JDT_TENSOR_STATE = 1u << 3,  /* non-trainable persistent leaf (optimizer moments) */
    JDT_TENSOR_REMAT = 1u << 4,  /* recomputed copy of a forward node (autodiff remat): the
                                    compiler must not merge it with its original by CSE */
};

/* ROPE's frequency scaling as jdt_rope_freq takes it: sc[0] = 0 when none. */
static inline void jdt_rope_scaling_of(const jdt_attrs *a, double sc[4])
{
    sc[0] = a->f[1];
    sc[1] = a->f[2];
    sc[2] = a->f[3];
    sc[3] = (double)a->i[3];
}

typedef struct jdt_tensor jdt_tensor;
struct jdt_tensor {
    int id; /* index in the graph's node array; inputs have smaller ids */
    jdt_op op;
    jdt_dtype dtype;
    jdt_shape shape;
    int n_inputs;
    jdt_tensor *inputs[JDT_MAX_INPUTS];
    jdt_attrs attrs;
    uint32_t flags;
    const char *name;                  /* leaves: stable global name; else NULL (arena) */
    const char *axes[JDT_MAX_DIMS];    /* logical axis name per dim or NULL (arena strings) */
    void *data;                        /* leaves: caller-bound memory; CONSTANT: arena data */
    int block;                         /* rematerialisation block id (0: none), see
                                          jdt_graph_set_block */
};

typedef struct jdt_graph jdt_graph;

/* What a jdt_collective_fn call does (the value of its `kind` argument). The first two keep
 * the historical all-reduce encoding (0 sum, 1 max). */
typedef enum {
    JDT_COLL_ALLREDUCE_SUM = 0,  /* buf (n_elems) becomes the sum over the group */
    JDT_COLL_ALLREDUCE_MAX = 1,  /* ... the maximum */
    JDT_COLL_ALLGATHER = 2,      /* on entry the first n_elems / k values of buf hold this
                                    member's part; on return segment j holds member j's */
    JDT_COLL_REDUCE_SCATTER = 3, /* on return the first n_elems / k values of buf hold the sum
                                    of everyone's segment g (g = this member's group index);
                                    the rest of buf is clobbered */
} jdt_collective_kind;

/* Runs a collective for a graph op in place on buf (n_elems values of dtype dt) over process
 * group `group` (the caller's table). Segments are n_elems / k contiguous values (the graph
 * only issues counts the group size divides), segment j belonging to group member j. Every
 * rank of the group must reach the same collectives in the same order (the graph guarantees
 * it: same graph, same schedule). Returns JDT_OK or an error (a lost peer, a timeout) with e
 * naming the rank. */
typedef jdt_status (*jdt_collective_fn)(void *ctx, int group, int kind, jdt_dtype dt,
                                        void *buf, size_t n_elems, jdt_err *e);

/* ---- core (engine/graph/graph.c) ----------------------------------------------------------- */

const char *jdt_op_name(jdt_op op);
int jdt_op_arity(jdt_op op); /* -1 for variadic */
/* The op's class (the table's CLASS column); (jdt_op_class)JDT_OPC_COUNT outside the enum. */
jdt_op_class jdt_op_class_of(jdt_op op);
/* "leaf", "elementwise", ... ; "?" outside the enum. */
const char *jdt_op_class_name(jdt_op_class c);
/* The op's partition kind (engine/graph/ops.c, part_<OP>); JDT_PART_NONE outside the enum. */
jdt_part_kind jdt_op_partition(jdt_op op);
/* The op's JDT_OPF_* flags ORed together (engine/graph/ops.c, flags_<OP>); 0 outside the enum. */
uint32_t jdt_op_flags(jdt_op op);

int64_t jdt_shape_numel(const jdt_shape *s);
bool jdt_shape_eq(const jdt_shape *a, const jdt_shape *b);
jdt_shape jdt_shape_make(int ndim, const int64_t *dims);
/* Writes "(2, 3, 4)" into buf; returns buf. */
char *jdt_shape_str(const jdt_shape *s, char *buf, size_t n);

/* Creates an empty graph. Returns NULL on allocation failure. */
jdt_graph *jdt_graph_new(void);
/* Frees the graph and everything allocated in its arena. NULL is a no-op. */
void jdt_graph_free(jdt_graph *g);

/* Arena allocation owned by g (zeroed, 64-byte aligned); NULL on failure. */
void *jdt_graph_alloc(jdt_graph *g, size_t n_bytes);
/* Copies s into g's arena. */
const char *jdt_graph_strdup(jdt_graph *g, const char *s);

/* Low-level node constructor: appends a node with the given op, inputs, attrs, dtype and
 * output shape, WITHOUT shape checking (the builder functions check). Returns NULL on
 * allocation failure. Inputs must belong to g. */
jdt_tensor *jdt_graph_new_node(jdt_graph *g, jdt_op op, jdt_dtype dtype, const jdt_shape *shape,
                               int n_inputs, jdt_tensor *const *inputs, const jdt_attrs *attrs);

int jdt_graph_n_nodes(const jdt_graph *g);
jdt_tensor *jdt_graph_node(const jdt_graph *g, int id);

/* Marks t as a graph output (order of calls = output index). Returns the index or -1. */
int jdt_graph_add_output(jdt_graph *g, jdt_tensor *t);
int jdt_graph_n_outputs(const jdt_graph *g);
jdt_tensor *jdt_graph_output(const jdt_graph *g, int i);

/* Records that after the step `value` is written into leaf `target` (PARAM or STATE), same
 * shape and dtype. Returns the update index or -1 on a mismatch. */
int jdt_graph_add_update(jdt_graph *g, jdt_tensor *target, jdt_tensor *value);
int jdt_graph_n_updates(const jdt_graph *g);
void jdt_graph_update(const jdt_graph *g, int i, jdt_tensor **target, jdt_tensor **value);

/* Nodes created from now on belong to block `block` (0: none). Models mark each transformer
 * block so that autodiff can recompute a block's activations in the backward pass instead of
 * keeping them (runtime.remat: block). */
void jdt_graph_set_block(jdt_graph *g, int block);

/* MATMULs and ATTENTIONs built from now on (and the VJPs of bf16 ones) compute in bf16
 * when `on`: attrs i[2] = 1, inputs rounded to bf16, f32 accumulation and output
 * (precision.compute: bf16, the mixed-precision recipe). Default off. */
void jdt_graph_set_matmul_bf16(jdt_graph *g, bool on);
bool jdt_graph_matmul_bf16(const jdt_graph *g);

/* Models built from now on read each GEMM weight through one CAST to bf16 when `on` (a bf16
 * operand: bf16 compute; models/models.c), instead of letting every GEMM round the f32 weight.
 * The train step sets it for precision.compute: bf16 where the backend's GEMMs read bf16
 * operands and no fsdp axis would have to gather the copy. Default off. */
void jdt_graph_set_bf16_weights(jdt_graph *g, bool on);
bool jdt_graph_bf16_weights(const jdt_graph *g);

/* VJPs built from now on round the cotangent of a bf16 activation that a bf16 GEMM reads (an
 * operand of dtype bf16 that is not a CAST: a GELU or SwiGLU output, not a weight's copy) to
 * bf16, as autocast's backward does: dx = CAST(CAST(dy @ bᵀ, bf16), f32), still f32 by dtype
 * (jdt_dtype_cotangent), which the CUDA compiler turns into a GEMM storing bf16 (passes.c
 * fold_bf16_casts). The train step sets it for precision.activations: bf16. Default off. */
void jdt_graph_set_bf16_grads(jdt_graph *g, bool on);
bool jdt_graph_bf16_grads(const jdt_graph *g);

/* Finds a leaf by name; NULL if absent. Hashed: it indexes the named nodes added since its
 * last call (g is not const for that), so a lookup costs O(1) on average. */
jdt_tensor *jdt_graph_find(jdt_graph *g, const char *name);

/* Records a builder error in g unless one is already recorded (the FIRST error is sticky:
 * later calls keep it and return its code). Returns the recorded code. */
jdt_status jdt_graph_fail(jdt_graph *g, jdt_status code, const char *fmt, ...) JDT_PRINTF(3, 4);
/* Returns JDT_OK if no builder error was recorded in g, else the first error's code, with its
 * message (naming the op and the input shapes) copied into e (may be NULL). */
jdt_status jdt_graph_error(const jdt_graph *g, jdt_err *e);
/* The first error's message, or NULL while none. Owned by g. */
const char *jdt_graph_error_msg(const jdt_graph *g);

/* Builder API, autodiff and the interpreter are declared in graph/builder.h, autodiff/autodiff.h
 * and graph/interp.h. */

#endif /* JDT_GRAPH_H */
