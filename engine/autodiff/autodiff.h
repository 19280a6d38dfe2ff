/*
 * autodiff.h — reverse-mode automatic differentiation over the graph IR.
 *
 * jdt_autodiff_grad appends the backward pass to the SAME graph (so forward, backward and the
 * optimizer update form one whole-step graph) using each op's VJP rule from the op registry
 * (engine/graph/ops.c). Only nodes that both depend on a requested parameter and reach the loss
 * are differentiated; contributions of fanned-out tensors are summed; STOP_GRADIENT, integer
 * tensors and the piecewise-constant comparisons GT/GE pass no gradient.
 */
#ifndef JDT_AUTODIFF_H
#define JDT_AUTODIFF_H

#include "graph/graph.h"

/* Differentiates `loss` (a float tensor with exactly one element) with respect to
 * params[0..n_params) (PARAM leaves of g) and sets grads[i] to a tensor of g with the shape and
 * dtype of params[i] (f32 for a bf16 param: a bf16 value's cotangent is f32,
 * jdt_dtype_cotangent). A parameter the loss does not depend on gets a zero CONSTANT.
 * Returns JDT_OK; ERR_INVALID if the loss is not a one-element float node of g or a param is
 * not a PARAM of g; ERR_UNSUPPORTED if a node on a gradient path has no VJP rule (the message
 * names the op and node id: fused backward ops are not differentiated again); or the graph's
 * sticky builder error if a backward node could not be built. On error grads are all NULL and
 * the graph may hold unreferenced backward nodes (harmless: they are not outputs). */
jdt_status jdt_autodiff_grad(jdt_graph *g, jdt_tensor *loss, int n_params,
                             jdt_tensor *const *params, jdt_tensor **grads, jdt_err *e);

/* What the backward pass of a marked block (jdt_graph_set_block) reads of its forward. */
typedef enum {
    JDT_AD_REMAT_NONE = 0, /* the forward's activations, kept alive until the backward */
    /* a recomputed copy of the block's forward nodes, built from the block's inputs just before
     * its backward: only the activations at block boundaries stay alive from forward to
     * backward (the memory plan frees the rest), for about one more forward pass of compute */
    JDT_AD_REMAT_BLOCK = 1,
    /* the outputs of the GEMMs, attentions and collectives kept (JAX's checkpoint_dots, MaxText's
     * remat_policy "minimal"); everything between them (norms, activations, residual adds,
     * casts) recomputed from those and the block's inputs just before the block's backward:
     * the expensive results stay, the cheap elementwise ones die after their forward use */
    JDT_AD_REMAT_DOTS = 2,
} jdt_ad_remat;

/* Like jdt_autodiff_grad, with the marked blocks' backward reading their forward as remat says.
 * Results are the same values. */
jdt_status jdt_autodiff_grad_ex(jdt_graph *g, jdt_tensor *loss, int n_params,
                                jdt_tensor *const *params, jdt_tensor **grads, jdt_ad_remat remat,
                                jdt_err *e);

#endif /* JDT_AUTODIFF_H */
