/*
 * autodiff.c — the reverse-mode transform (autodiff.h). Two marking passes over the node array
 * (which is already a topological order) find the nodes on a gradient path; a reverse sweep then
 * calls each such node's VJP rule and sums the cotangents of fanned-out inputs.
 */
#include "autodiff/autodiff.h"

#include "graph/builder.h"
#include "graph/ops-impl.h"

#include <string.h>

/* Ops whose output does not vary (almost everywhere) with their float inputs: no gradient. */
static bool piecewise_constant(jdt_op op)
{
    return op == JDT_OP_GT || op == JDT_OP_GE;
}

jdt_status jdt_autodiff_grad(jdt_graph *g, jdt_tensor *loss, int n_params,
                             jdt_tensor *const *params, jdt_tensor **grads, jdt_err *e)
{
    return jdt_autodiff_grad_ex(g, loss, n_params, params, grads, JDT_AD_REMAT_NONE, e);
}

/* Kept by JDT_AD_REMAT_DOTS: the ops whose recompute costs a GEMM's or a collective's time. */
static bool dots_kept(jdt_op op)
{
    return op == JDT_OP_MATMUL || op == JDT_OP_ATTENTION || op == JDT_OP_ALL_REDUCE ||
           op == JDT_OP_ALL_GATHER || op == JDT_OP_REDUCE_SCATTER;
}

/* Rematerialisation: copies of the forward nodes of block `block` (ids < n), inputs mapped to
 * earlier copies inside the block; leaves and nodes outside the block are shared. With
 * JDT_AD_REMAT_DOTS only the nodes that depend on the step's data (act) and are not kept
 * (dots_kept) are copied: the kept nodes, and what depends on parameters alone (a weight's
 * bf16 cast), are shared too. The GEMM's own output is what stays, before its bias add and
 * bf16 cast. Keeping those too was tried: the compiler then keeps more of its folds into the
 * GEMM (planned traffic for GPT-2 at B 32 on CUDA 107 GB a step against 130; none 87.4), but
 * the planned arena was 13.12 GiB against 10.31 (none 13.70), with or without the GELU's
 * epilogue fold. */
static void clone_block(jdt_graph *g, int n, int block, jdt_ad_remat remat, const bool *act,
                        jdt_tensor **clone)
{
    for (int j = 0; j < n; j++) {
        jdt_tensor *t = jdt_graph_node(g, j);
        if (t->block != block || t->n_inputs == 0) continue;
        if (remat == JDT_AD_REMAT_DOTS && (dots_kept(t->op) || !act[j])) continue;
        jdt_tensor *in[JDT_MAX_INPUTS];
        for (int k = 0; k < t->n_inputs; k++) {
            jdt_tensor *x = t->inputs[k];
            in[k] = clone[x->id] ? clone[x->id] : x;
        }
        jdt_tensor *c = jdt_graph_op(g, t->op, t->n_inputs, in, &t->attrs, t->dtype, &t->shape);
        if (!c) return; /* sticky graph error */
        c->flags |= JDT_TENSOR_REMAT;
        for (int d = 0; d < t->shape.ndim; d++) c->axes[d] = t->axes[d];
        clone[j] = c;
    }
}

/* JDT_AD_REMAT_DOTS: a kept node's VJP reads the recomputed copies of its inputs (the same
 * values), so the forward's copies die after their forward use. Swaps node's inputs that have
 * copies; returns the mask of swapped inputs (restored by inputs_restore). */
static unsigned clone_swap(jdt_tensor *node, int n, jdt_tensor **clone, jdt_tensor **saved)
{
    unsigned swapped = 0;
    for (int k = 0; k < node->n_inputs; k++) {
        jdt_tensor *in = node->inputs[k];
        if (in->id < 0 || in->id >= n || !clone[in->id]) continue;
        saved[k] = in;
        node->inputs[k] = clone[in->id];
        swapped |= 1u << k;
    }
    return swapped;
}

/* Undoes clone_swap or regather_swap: node's inputs in the mask swapped back to saved's. */
static void inputs_restore(jdt_tensor *node, unsigned swapped, jdt_tensor **saved)
{
    for (int k = 0; k < node->n_inputs; k++)
        if (swapped & (1u << k)) node->inputs[k] = saved[k];
}

/* An FSDP weight gather: ALL_GATHER of a parameter, or of its shard's bf16 copy (a CAST, under
 * precision.compute: bf16), not itself a recomputed copy. */
static bool is_param_gather(const jdt_tensor *t)
{
    if (t->op != JDT_OP_ALL_GATHER || (t->flags & JDT_TENSOR_REMAT)) return false;
    const jdt_tensor *x = t->inputs[0];
    if (x->op == JDT_OP_CAST && x->dtype == JDT_DTYPE_BF16) x = x->inputs[0];
    return x->op == JDT_OP_PARAM;
}

/* Reshard after forward (PyTorch FSDP's reshard_after_forward): a GEMM's VJP that reads an
 * all-gathered parameter to propagate the cotangent to its other operand reads a fresh gather
 * instead, made (once per gather) where the backward needs it, so the forward's gathered copy
 * dies after its forward use instead of living until the backward. Swaps node's inputs to the
 * re-gathered copies (restored by inputs_restore); returns the mask of swapped inputs. */
static unsigned regather_swap(jdt_graph *g, jdt_tensor *node, const bool *need,
                              jdt_tensor **regather, jdt_tensor **saved)
{
    unsigned swapped = 0;
    if (node->op != JDT_OP_MATMUL || !regather) return 0;
    for (int k = 0; k < 2; k++) {
        jdt_tensor *in = node->inputs[k];
        if (!is_param_gather(in) || !need[1 - k]) continue;
        if (!regather[in->id]) {
            jdt_tensor *c =
                jdt_graph_op(g, in->op, 1, in->inputs, &in->attrs, in->dtype, &in->shape);
            if (!c) return swapped; /* sticky graph error */
            c->flags |= JDT_TENSOR_REMAT;
            for (int d = 0; d < in->shape.ndim; d++)
                c->axes[d] = in->axes[d];
            regather[in->id] = c;
        }
        saved[k] = in;
        node->inputs[k] = regather[in->id];
        swapped |= 1u << k;
    }
    return swapped;
}

/* Is t a zero splat (a CONSTANT without data, every element 0)? */
static bool zero_splat(const jdt_tensor *t)
{
    return t->op == JDT_OP_CONSTANT && !t->data && t->attrs.f[0] == 0.0;
}

/*
 * The sum of two cotangents that are zero-padded slices of one tensor (vjp_SLICE's CONCATs of
 * zeros and a part) along the same axis, their parts disjoint: one CONCAT of both parts with
 * zeros between, instead of two full-size tensors and their add. The slices of runtime.
 * loss_chunks (models.c gpt_loss) read the final norm's output in sequence slices; their dX
 * would otherwise cost a full (B, T, C) tensor each, all live until their adds. The same values
 * (x + 0 = x). NULL where it does not apply (more than JDT_MAX_INPUTS parts, overlaps).
 */
static jdt_tensor *merge_padded(jdt_graph *g, jdt_tensor *a, jdt_tensor *b)
{
    if (a->op != JDT_OP_CONCAT || b->op != JDT_OP_CONCAT || a->attrs.i[0] != b->attrs.i[0] ||
        !jdt_shape_eq(&a->shape, &b->shape) || a->dtype != b->dtype)
        return NULL;
    const int ax = (int)a->attrs.i[0];
    jdt_tensor *part[2 * JDT_MAX_INPUTS];
    int64_t at[2 * JDT_MAX_INPUTS];
    int np = 0;
    for (int s = 0; s < 2; s++) { /* the data parts of both, with their offsets */
        const jdt_tensor *c = s ? b : a;
        int64_t off = 0;
        for (int k = 0; k < c->n_inputs; k++) {
            jdt_tensor *x = c->inputs[k];
            if (!zero_splat(x)) {
                part[np] = x;
                at[np++] = off;
            }
            off += x->shape.dims[ax];
        }
    }
    for (int i = 1; i < np; i++) /* by offset */
        for (int j = i; j > 0 && at[j - 1] > at[j]; j--) {
            jdt_tensor *t = part[j];
            int64_t o = at[j];
            part[j] = part[j - 1], at[j] = at[j - 1];
            part[j - 1] = t, at[j - 1] = o;
        }
    jdt_tensor *in[JDT_MAX_INPUTS];
    int n = 0;
    int64_t off = 0;
    const int64_t full = a->shape.dims[ax];
    for (int i = 0; i <= np; i++) {
        const int64_t next = i < np ? at[i] : full;
        if (next < off) return NULL; /* overlapping parts */
        if (next > off) {            /* zeros up to the next part */
            jdt_shape z = a->shape;
            z.dims[ax] = next - off;
            if (n == JDT_MAX_INPUTS) return NULL;
            in[n++] = jdt_graph_full(g, a->dtype, z.ndim, z.dims, 0.0);
        }
        if (i == np) break;
        if (n == JDT_MAX_INPUTS) return NULL;
        in[n++] = part[i];
        off = at[i] + part[i]->shape.dims[ax];
    }
    return jdt_graph_concat(g, n, in, ax);
}

jdt_status jdt_autodiff_grad_ex(jdt_graph *g, jdt_tensor *loss, int n_params,
                                jdt_tensor *const *params, jdt_tensor **grads, jdt_ad_remat remat,
                                jdt_err *e)
{
    jdt_status st = JDT_OK;
    bool *dep = NULL, *live = NULL, *act = NULL;
    const bool remat_blocks = remat == JDT_AD_REMAT_BLOCK || remat == JDT_AD_REMAT_DOTS;
    jdt_tensor **ct = NULL, **clone = NULL, **regather = NULL;
    int cloned_block = 0;
    for (int i = 0; i < n_params; i++)
        grads[i] = NULL;
    if (!g || !loss) return jdt_err_set(e, JDT_ERR_INVALID, "autodiff: graph or loss is NULL");
    if ((st = jdt_graph_error(g, e)) != JDT_OK)
        return jdt_err_prefix(e, "autodiff: graph has a builder error");
    int n = jdt_graph_n_nodes(g);
    if (loss->id < 0 || loss->id >= n || jdt_graph_node(g, loss->id) != loss)
        return jdt_err_set(e, JDT_ERR_INVALID, "autodiff: loss is not a node of this graph");
    if (!jdt_dtype_is_float(loss->dtype) || jdt_shape_numel(&loss->shape) != 1) {
        char s[128];
        return jdt_err_set(e, JDT_ERR_INVALID,
                           "autodiff: loss must be a one-element float tensor, got %s %s",
                           jdt_shape_str(&loss->shape, s, sizeof s), jdt_dtype_name(loss->dtype));
    }
    for (int i = 0; i < n_params; i++) {
        jdt_tensor *p = params[i];
        if (!p || p->op != JDT_OP_PARAM || p->id >= n || jdt_graph_node(g, p->id) != p)
            return jdt_err_set(e, JDT_ERR_INVALID,
                               "autodiff: params[%d] is not a PARAM of this graph", i);
        if (!jdt_dtype_is_float(p->dtype))
            return jdt_err_set(e, JDT_ERR_INVALID, "autodiff: param '%s' has non-float dtype %s",
                               p->name, jdt_dtype_name(p->dtype));
    }
    dep = jdt_calloc((size_t)n, sizeof *dep);
    live = jdt_calloc((size_t)n, sizeof *live);
    ct = jdt_calloc((size_t)n, sizeof *ct);
    if (remat_blocks) clone = jdt_calloc((size_t)n, sizeof *clone);
    if (remat == JDT_AD_REMAT_DOTS) act = jdt_calloc((size_t)n, sizeof *act);
    regather = jdt_calloc((size_t)n, sizeof *regather);
    if (!dep || !live || !ct || (remat_blocks && !clone) || (remat == JDT_AD_REMAT_DOTS && !act) ||
        !regather) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "autodiff: out of memory for %d nodes", n);
        goto out;
    }
    /* act[i]: node i depends on the step's data (an INPUT), not on parameters and constants
     * alone (JDT_AD_REMAT_DOTS recomputes only such nodes) */
    for (int i = 0; act && i < n; i++) {
        jdt_tensor *t = jdt_graph_node(g, i);
        act[i] = t->op == JDT_OP_INPUT;
        for (int k = 0; k < t->n_inputs && !act[i]; k++)
            act[i] = act[t->inputs[k]->id];
    }
    /* dep[i]: node i depends differentiably on a requested parameter */
    for (int i = 0; i < n_params; i++)
        dep[params[i]->id] = true;
    for (int i = 0; i <= loss->id; i++) {
        jdt_tensor *t = jdt_graph_node(g, i);
        if (t->op == JDT_OP_STOP_GRADIENT || piecewise_constant(t->op) ||
            !jdt_dtype_is_float(t->dtype))
            continue;
        for (int k = 0; k < t->n_inputs && !dep[i]; k++)
            dep[i] = dep[t->inputs[k]->id];
    }
    /* live[i]: node i lies on a path from a parameter to the loss */
    live[loss->id] = dep[loss->id];
    for (int i = loss->id; i >= 0; i--) {
        if (!live[i]) continue;
        jdt_tensor *t = jdt_graph_node(g, i);
        for (int k = 0; k < t->n_inputs; k++)
            if (dep[t->inputs[k]->id]) live[t->inputs[k]->id] = true;
    }
    if (live[loss->id])
        ct[loss->id] = jdt_graph_full(g, jdt_dtype_cotangent(loss->dtype), loss->shape.ndim,
                                      loss->shape.dims, 1.0);
    for (int i = loss->id; i >= 0; i--) {
        jdt_tensor *t = jdt_graph_node(g, i);
        if (!live[i] || !ct[i] || t->n_inputs == 0) continue;
        bool need[JDT_MAX_INPUTS] = {false};
        jdt_tensor *dx[JDT_MAX_INPUTS] = {NULL};
        for (int k = 0; k < t->n_inputs; k++)
            need[k] = live[t->inputs[k]->id];
        const jdt_op_info *info = jdt_op_info_get(t->op);
        jdt_tensor *node = t;
        if (clone && t->block > 0) {
            if (t->block != cloned_block) { /* entering this block's backward: recompute it */
                clone_block(g, n, t->block, remat, act, clone);
                cloned_block = t->block;
            }
            if (clone[i]) node = clone[i];
        }
        if (!info->vjp) {
            st = jdt_err_set(
                e, JDT_ERR_UNSUPPORTED,
                "autodiff: op '%s' (node %d) has no VJP rule but lies on the gradient path "
                "from the loss to a parameter (fused backward ops are not differentiated again)",
                info->name, i);
            goto out;
        }
        /* a kept node of a recomputed block (JDT_AD_REMAT_DOTS) reads its inputs' copies */
        jdt_tensor *kept_in[JDT_MAX_INPUTS] = {NULL};
        const unsigned cloned_in =
            clone && node == t && t->block > 0 ? clone_swap(node, n, clone, kept_in) : 0;
        jdt_tensor *saved[2] = {NULL, NULL};
        const unsigned swapped = regather_swap(g, node, need, regather, saved);
        info->vjp(g, node, ct[i], need, dx);
        inputs_restore(node, swapped, saved);
        inputs_restore(node, cloned_in, kept_in);
        if ((st = jdt_graph_error(g, e)) != JDT_OK) {
            jdt_err_prefix(e, "autodiff: VJP of '%s' (node %d)", info->name, i);
            goto out;
        }
        for (int k = 0; k < t->n_inputs; k++) {
            jdt_tensor *in = t->inputs[k];
            if (!need[k] || !dx[k]) continue;
            if (!jdt_shape_eq(&dx[k]->shape, &in->shape) ||
                dx[k]->dtype != jdt_dtype_cotangent(in->dtype)) {
                st = jdt_err_set(e, JDT_ERR_INTERNAL,
                                 "autodiff: VJP of '%s' (node %d) gave input %d a "
                                 "cotangent of the wrong shape or dtype",
                                 info->name, i, k);
                goto out;
            }
            jdt_tensor *sum = ct[in->id] ? merge_padded(g, ct[in->id], dx[k]) : dx[k];
            ct[in->id] = sum ? sum : jdt_graph_add(g, ct[in->id], dx[k]);
        }
    }
    for (int i = 0; i < n_params; i++) {
        jdt_tensor *p = params[i];
        grads[i] =
            ct[p->id] ? ct[p->id]
                      : jdt_graph_full(g, jdt_dtype_cotangent(p->dtype), p->shape.ndim,
                                       p->shape.dims, 0.0);
    }
    if ((st = jdt_graph_error(g, e)) != JDT_OK) {
        jdt_err_prefix(e, "autodiff");
        for (int i = 0; i < n_params; i++)
            grads[i] = NULL;
    }
out:
    if (st != JDT_OK)
        for (int i = 0; i < n_params; i++)
            grads[i] = NULL;
    jdt_free(dep);
    jdt_free(live);
    jdt_free(ct);
    jdt_free(clone);
    jdt_free(act);
    jdt_free(regather);
    return st;
}
