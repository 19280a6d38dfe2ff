/*
 * ops-impl.h — internal: the enum-indexed op registry (engine/graph/ops.c). One row per op of
 * JDT_OP_LIST with its name, arity, shape rule, VJP rule, partition kind and flags; the builder
 * checks every node with the shape rule, autodiff (engine/autodiff) calls the VJP rule, the SPMD
 * partitioner (engine/shard) the rule of the op's partition kind.
 */
#ifndef JDT_GRAPH_OPS_IMPL_H
#define JDT_GRAPH_OPS_IMPL_H

#include "graph/graph.h"

/* Checks inputs/attrs and computes the result's dtype and shape. On entry *dt and *out hold the
 * caller's requested values (used by ops whose result the caller chooses: CAST, BROADCAST,
 * RESHAPE, leaves, IOTA, CAUSAL_MASK). Returns false with a reason in why[0..n_why). */
typedef bool (*jdt_shape_rule)(jdt_tensor *const *in, int n_in, const jdt_attrs *a, jdt_dtype *dt,
                               jdt_shape *out, char *why, size_t n_why);

/* Vector-Jacobian product of `node` given its cotangent dy (same shape/dtype as node). For each
 * input i with need[i], sets dx[i] to the cotangent of input i (same shape as that input), or
 * leaves it NULL when no gradient flows to it (stop_gradient, integer inputs). Builds nodes with
 * the builder API; failures are the graph's sticky error. */
typedef void (*jdt_vjp_rule)(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                             jdt_tensor **dx);

typedef struct {
    const char *name;
    int arity;            /* -1 variadic */
    jdt_shape_rule shape; /* never NULL */
    jdt_vjp_rule vjp;     /* NULL: not differentiable (an error if reached on a gradient path) */
    jdt_part_kind part;   /* how engine/shard partitions it (JDT_PART_NONE: it does not) */
    uint32_t flags;       /* JDT_OPF_* bits (graph.h) */
} jdt_op_info;

/* The registry row for op (op must be < JDT_OP_COUNT). */
const jdt_op_info *jdt_op_info_get(jdt_op op);

#endif /* JDT_GRAPH_OPS_IMPL_H */
