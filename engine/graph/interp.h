/*
 * interp.h — the reference interpreter: runs a graph with plain, obviously-correct loops. It is
 * the oracle every compiled kernel is tested against, not the product's path (it is slow and
 * allocates per node).
 *
 * Numerics: every op is computed in double precision from its inputs' values; the result is
 * then rounded to the node's dtype (f32 results are rounded to float, i32 truncated), and that
 * rounded value is what consumers see. So an f64 graph is evaluated fully in double (for
 * finite-difference checks) and an f32 graph gives, per op, the correctly rounded result of the
 * op on its f32 inputs. Supported dtypes: f32, f64 and i32 (indices, targets, step); a node of
 * another dtype is an ERR_UNSUPPORTED naming it. ATTENTION uses the plain T x T formulation.
 */
#ifndef JDT_GRAPH_INTERP_H
#define JDT_GRAPH_INTERP_H

#include "graph/graph.h"

typedef struct jdt_interp jdt_interp;

/* Creates an interpreter for g (which must outlive it and have no recorded builder error).
 * Node buffers are allocated by the first run (and again if nodes were appended since).
 * Returns JDT_OK and *out, or ERR_INVALID (g has a builder error; its message is copied) /
 * ERR_NOMEM. */
jdt_status jdt_interp_new(const jdt_graph *g, jdt_interp **out, jdt_err *e);

/* Frees the interpreter and its buffers; NULL is a no-op. */
void jdt_interp_free(jdt_interp *it);

/* Sets the communicator for ALL_REDUCE nodes (see jdt_collective_fn in graph.h). Without one,
 * a graph with collectives fails at run time with ERR_UNSUPPORTED. */
void jdt_interp_set_collective(jdt_interp *it, jdt_collective_fn fn, void *ctx);

/* Runs one step: reads every leaf from t->data (PARAM/INPUT/STATE: caller memory, which must be
 * bound; CONSTANT: arena data or the fill value), computes every node in order into the
 * interpreter's own buffers, and only then writes each update's value into its target leaf's
 * t->data (so every node sees the pre-step values). Errors: ERR_INVALID for an unbound leaf or
 * an index out of range (message names the node id, op and the bad index), ERR_UNSUPPORTED for
 * an unsupported dtype, ERR_NOMEM. On error no update has been applied. */
jdt_status jdt_interp_run(jdt_interp *it, jdt_err *e);

/* The value of t from the last run, in t's dtype, row-major (numel elements); for leaves the
 * snapshot taken at the start of the run. Owned by the interpreter, valid until the next run or
 * free. NULL before the first run or if t is not a node of the graph. */
const void *jdt_interp_value(const jdt_interp *it, const jdt_tensor *t);

/* Copies t's value from the last run into out[0..numel) as doubles. Returns ERR_INVALID if
 * there is no value (no run yet, foreign tensor). */
jdt_status jdt_interp_read_f64(const jdt_interp *it, const jdt_tensor *t, double *out, jdt_err *e);

/* Copies the graph's outputs from the last run into caller buffers: outs[i] receives output i
 * in its dtype (numel * dtype size bytes). Returns ERR_INVALID if there is no run yet. */
jdt_status jdt_interp_copy_outputs(const jdt_interp *it, void *const *outs, jdt_err *e);

#endif /* JDT_GRAPH_INTERP_H */
