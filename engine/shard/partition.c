/*
 * partition.c — the partitioner pass (see shard.h, docs/sharding.md): walks a global forward
 * graph in order and builds this rank's local graph. Each op has a partition rule in RULES
 * below (enum-indexed, next to nothing else: the op's shape and VJP rules are in
 * engine/graph/ops.c, its partition rule is here); a rule states the placements it needs of its
 * inputs and the placement of its output, and redistribute() inserts the collective that turns
 * one placement into another:
 *   partial over A      -> not partial     ALL_REDUCE over the group of A
 *   dim split over A    -> replicated dim  ALL_GATHER along that dim over A
 *   replicated dim      -> split over A    SLICE of this rank's block (no communication)
 *   partial over A      -> split over A    REDUCE_SCATTER along that dim (sequence parallelism)
 * A few rules build more than the op: the vocab-parallel lookup and cross-entropy (a table or
 * logits split on vocab, `[vocab, tensor]`) are written out of masks, the op on the rank's
 * block and collectives (rule_gather, xent_vocab_parallel).
 */
#include "shard/shard.h"

#include "graph/builder.h"

#include <stdio.h>
#include <string.h>

/* One redistribution made (redistribute's cache): local x moved from one placement to another
 * while partitioning nodes of remat block `block`, giving y. */
typedef struct {
    const jdt_tensor *x;
    jdt_placement from, to;
    int block;
    jdt_tensor *y;
} moved_value;

typedef struct {
    const jdt_mesh *m;
    const jdt_config_rules *rules;
    jdt_graph *g;
    jdt_shard_result *r;
    jdt_err *e;
    int block;          /* the remat block of the node being partitioned */
    moved_value *moves; /* open addressing, cap_moves a power of two (NULL: no cache) */
    int n_moves, cap_moves;
    /* data inputs bound with a dim whole and sliced (rule_leaf): a reader that wants that dim
     * whole again slices the bound leaf instead of gathering the slices (ids are i32) */
    struct {
        const jdt_tensor *sliced;
        jdt_tensor *leaf;
        jdt_placement bound;
    } inputs[8];
    int n_inputs;
} pctx;

typedef jdt_status (*prule)(pctx *c, const jdt_tensor *n, jdt_tensor **in, jdt_placement *pin,
                            jdt_tensor **out, jdt_placement *pout);

static jdt_placement replicated(void)
{
    jdt_placement p;
    memset(&p, 0, sizeof p);
    return p;
}

static jdt_tensor *all_reduce_axes(pctx *c, jdt_tensor *x, unsigned axes)
{
    axes = jdt_mesh_live(c->m, axes);
    if (!axes) return x;
    c->r->n_collectives++;
    return jdt_graph_all_reduce(c->g, x, (int)axes, 0, 1.0);
}

static jdt_tensor *redistribute_now(pctx *c, jdt_tensor *x, const jdt_placement *from,
                                    const jdt_placement *to);

static bool same_placement(const jdt_placement *a, const jdt_placement *b, int nd)
{
    if (a->partial != b->partial) return false;
    for (int d = 0; d < nd; d++)
        if (a->dim[d] != b->dim[d]) return false;
    return true;
}

/* The cache slot of (x, from, to, block): the entry made for it, or the empty slot where it
 * goes; NULL without a cache. */
static moved_value *move_slot(pctx *c, const jdt_tensor *x, const jdt_placement *from,
                              const jdt_placement *to, int block)
{
    if (!c->moves) return NULL;
    const int nd = x->shape.ndim;
    size_t h = (size_t)(uintptr_t)x * 0x9E3779B97F4A7C15u ^ (size_t)block * 31u;
    for (int d = 0; d < nd; d++)
        h = h * 131u + (size_t)from->dim[d] * 7u + to->dim[d];
    h = h * 131u + (size_t)from->partial * 7u + to->partial;
    for (size_t i = h & (size_t)(c->cap_moves - 1);; i = (i + 1) & (size_t)(c->cap_moves - 1)) {
        moved_value *v = &c->moves[i];
        if (!v->x || (v->x == x && v->block == block && same_placement(&v->from, from, nd) &&
                      same_placement(&v->to, to, nd)))
            return v;
    }
}

/* Remembers y as (x, from, to) moved; the cache is dropped (every later move made anew) when
 * it cannot grow. */
static void move_keep(pctx *c, jdt_tensor *x, const jdt_placement *from, const jdt_placement *to,
                      jdt_tensor *y)
{
    if (!c->moves) return;
    if (2 * (c->n_moves + 1) > c->cap_moves) {
        moved_value *old = c->moves;
        const int cap = c->cap_moves;
        c->moves = jdt_calloc((size_t)cap * 2, sizeof *c->moves);
        c->cap_moves = cap * 2;
        c->n_moves = 0;
        for (int i = 0; c->moves && i < cap; i++) {
            if (!old[i].x) continue;
            *move_slot(c, old[i].x, &old[i].from, &old[i].to, old[i].block) = old[i];
            c->n_moves++;
        }
        jdt_free(old);
        if (!c->moves) return;
    }
    moved_value *v = move_slot(c, x, from, to, c->block);
    *v = (moved_value){.x = x, .from = *from, .to = *to, .block = c->block, .y = y};
    c->n_moves++;
}

/* Moves local x from placement from to placement to (see the file comment). The same move of
 * the same value within one remat block is made once and its result shared (the GEMMs of
 * runtime.loss_chunks' sequence slices read one gather of the head's weight, so autodiff makes
 * one re-gather and one reduce-scatter of their summed dW instead of one each). Across blocks
 * each makes its own: a block recomputed in the backward gathers its weights again. */
static jdt_tensor *redistribute(pctx *c, jdt_tensor *x, const jdt_placement *from,
                                const jdt_placement *to)
{
    if (!x) return NULL;
    for (int i = 0; i < c->n_inputs; i++) {
        if (c->inputs[i].sliced != x || to->partial) continue;
        const jdt_placement *b = &c->inputs[i].bound;
        bool slices_only = true;
        for (int d = 0; d < x->shape.ndim; d++)
            slices_only = slices_only && (!b->dim[d] || b->dim[d] == to->dim[d]);
        if (slices_only) {
            x = c->inputs[i].leaf;
            from = &c->inputs[i].bound;
        }
        break;
    }
    moved_value *v = move_slot(c, x, from, to, c->block);
    if (v && v->x) return v->y;
    jdt_tensor *y = redistribute_now(c, x, from, to);
    if (y && y != x) move_keep(c, x, from, to, y);
    return y;
}

/* redistribute's collectives and slices, made. */
static jdt_tensor *redistribute_now(pctx *c, jdt_tensor *x, const jdt_placement *from,
                                    const jdt_placement *to)
{
    const int nd = x->shape.ndim;
    unsigned red = from->partial & ~to->partial, scattered = 0;
    /* partial over A and to be split over A along a whole dim: one reduce-scatter, half the
     * bytes of an all-reduce and its slice (sequence parallelism's row-parallel outputs) */
    for (int d = 0; d < nd && x; d++) {
        const unsigned ax = to->dim[d];
        if (!red || from->dim[d] || !ax || (ax & ~red)) continue;
        const int k = jdt_mesh_group_size(c->m, ax);
        if (x->shape.dims[d] % k) continue;
        c->r->n_collectives++;
        x = jdt_graph_reduce_scatter(c->g, x, (int)ax, k, d, 1.0);
        red &= ~ax;
        scattered |= 1u << d;
    }
    if (red && x) x = all_reduce_axes(c, x, red);
    for (int d = 0; d < nd && x; d++) {
        if (from->dim[d] == to->dim[d] || !from->dim[d]) continue;
        const int k = jdt_mesh_group_size(c->m, from->dim[d]);
        c->r->n_collectives++;
        x = jdt_graph_all_gather(c->g, x, from->dim[d], k, d);
    }
    for (int d = 0; d < nd && x; d++) {
        if (from->dim[d] == to->dim[d] || !to->dim[d] || (scattered >> d & 1u)) continue;
        const int k = jdt_mesh_group_size(c->m, to->dim[d]);
        const int64_t len = x->shape.dims[d] / k;
        const int64_t at = (int64_t)jdt_mesh_group_index(c->m, to->dim[d]) * len;
        x = jdt_graph_slice(c->g, x, d, at, at + len);
    }
    return x;
}

jdt_tensor *jdt_shard_replicate(const jdt_mesh *m, jdt_graph *g, jdt_tensor *x,
                                const jdt_placement *p)
{
    jdt_shard_result r;
    memset(&r, 0, sizeof r);
    pctx c = {.m = m, .g = g, .r = &r};
    jdt_placement to = replicated();
    return redistribute(&c, x, p, &to);
}

/* Input i to placement want (updates in[i] and pin[i]). */
static void want(pctx *c, jdt_tensor **in, jdt_placement *pin, int i, const jdt_placement *w)
{
    in[i] = redistribute(c, in[i], &pin[i], w);
    pin[i] = *w;
}

static unsigned used_axes(const jdt_placement *p, int nd)
{
    unsigned u = 0;
    for (int d = 0; d < nd; d++) u |= p->dim[d];
    return u;
}

static jdt_shape local_of(pctx *c, const jdt_tensor *n, const jdt_placement *p)
{
    return jdt_shard_local_shape(c->m, &n->shape, p);
}

static jdt_tensor *emit(pctx *c, const jdt_tensor *n, jdt_tensor **in, const jdt_placement *p)
{
    jdt_shape s = local_of(c, n, p);
    return jdt_graph_op(c->g, n->op, n->n_inputs, in, &n->attrs, n->dtype, &s);
}

/* ---- rules -------------------------------------------------------------------------------- */

static jdt_status rule_leaf(pctx *c, const jdt_tensor *n, jdt_tensor **in, jdt_placement *pin,
                            jdt_tensor **out, jdt_placement *pout)
{
    (void)in;
    (void)pin;
    *pout = replicated();
    if (n->op == JDT_OP_CONSTANT) {
        *out = n->data ? jdt_graph_constant(c->g, n->dtype, n->shape.ndim, n->shape.dims, n->data)
                       : jdt_graph_full(c->g, n->dtype, n->shape.ndim, n->shape.dims, n->attrs.f[0]);
        return JDT_OK;
    }
    jdt_status st = jdt_shard_leaf_placement(c->m, c->rules, n, pout, c->e);
    if (st != JDT_OK) return st;
    /* a data input is bound as the loader reads it, its batch dims split and every other dim
     * whole; a split of another dim (`[seq, tensor]`: sequence parallelism) is a slice of it */
    jdt_placement bound = *pout;
    const bool input = !(n->flags & (JDT_TENSOR_PARAM | JDT_TENSOR_STATE));
    for (int d = 0; input && d < n->shape.ndim; d++)
        if (!n->axes[d] || strcmp(n->axes[d], "batch") != 0) bound.dim[d] = 0;
    jdt_shape s = local_of(c, n, &bound);
    jdt_tensor *t;
    if (n->flags & JDT_TENSOR_PARAM)
        t = jdt_graph_param(c->g, n->name, n->dtype, s.ndim, s.dims, n->axes);
    else if (n->flags & JDT_TENSOR_STATE)
        t = jdt_graph_state(c->g, n->name, n->dtype, s.ndim, s.dims, n->axes);
    else
        t = jdt_graph_input(c->g, n->name, n->dtype, s.ndim, s.dims, n->axes);
    if (t) t->data = n->data;
    *out = redistribute(c, t, &bound, pout);
    if (*out != t && c->n_inputs < (int)(sizeof c->inputs / sizeof c->inputs[0])) {
        c->inputs[c->n_inputs].sliced = *out;
        c->inputs[c->n_inputs].leaf = t;
        c->inputs[c->n_inputs++].bound = bound;
    }
    return JDT_OK;
}

/* Nullary generators (IOTA, CAUSAL_MASK): replicated. */
static jdt_status rule_gen(pctx *c, const jdt_tensor *n, jdt_tensor **in, jdt_placement *pin,
                           jdt_tensor **out, jdt_placement *pout)
{
    (void)pin;
    *pout = replicated();
    *out = jdt_graph_op(c->g, n->op, 0, in, &n->attrs, n->dtype, &n->shape);
    return JDT_OK;
}

/* Ops linear in every input (partial sums pass through when all inputs share them). */
static bool linear_op(jdt_op op)
{
    return op == JDT_OP_ADD || op == JDT_OP_SUB || op == JDT_OP_NEG || op == JDT_OP_MUL_SCALAR ||
           op == JDT_OP_CAST || op == JDT_OP_STOP_GRADIENT;
}

/* Input i of n to placement w; when that input is a broadcast (a bias or norm weight expanded
 * to the activation's shape), the small tensor before the broadcast is redistributed and
 * broadcast again, instead of moving the expanded one. */
static void want_input(pctx *c, const jdt_tensor *n, jdt_tensor **in, jdt_placement *pin, int i,
                       const jdt_placement *w)
{
    const jdt_tensor *b = n->inputs[i];
    if (b->op != JDT_OP_BROADCAST || memcmp(&pin[i], w, sizeof *w) == 0 || pin[i].partial != w->partial) {
        want(c, in, pin, i, w);
        return;
    }
    const jdt_tensor *x = b->inputs[0];
    const int off = b->shape.ndim - x->shape.ndim;
    jdt_placement wx;
    memset(&wx, 0, sizeof wx);
    wx.partial = w->partial;
    for (int d = 0; d < x->shape.ndim; d++)
        if (x->shape.dims[d] == b->shape.dims[d + off]) wx.dim[d] = w->dim[d + off];
    jdt_tensor *xl = redistribute(c, c->r->map[x->id], &c->r->place[x->id], &wx);
    jdt_shape s = jdt_shard_local_shape(c->m, &b->shape, w);
    in[i] = xl ? jdt_graph_broadcast(c->g, xl, s.ndim, s.dims) : NULL;
    pin[i] = *w;
}

/* DROPOUT (x, step, row0) on a block of x split along dims after the rows: its mask is the
 * one-device mask's block, each element's Philox counter its index in the step's batch (graph.h
 * DROPOUT). row0 (set per micro-batch and rank, engine/train/step.c) places the rows; the
 * block's offset along the other dims enters as data (an f64 scalar), not as an attribute, so
 * that the ranks' programs stay one program. */
static jdt_status dropout_block(pctx *c, const jdt_tensor *n, jdt_tensor **in,
                                const jdt_placement *t, jdt_tensor **out)
{
    const jdt_shape *s = &n->shape;
    double base = 0;
    for (int d = 1; d < s->ndim; d++)
        base += (double)jdt_shard_local_offset(c->m, s, t, d) * (double)n->attrs.i[2 + d];
    jdt_tensor *x4[4] = {in[0], in[1], in[2],
                         jdt_graph_constant(c->g, JDT_DTYPE_F64, 0, NULL, &base)};
    jdt_shape ls = local_of(c, n, t);
    *out = x4[0] && x4[1] && x4[2] && x4[3]
               ? jdt_graph_op(c->g, JDT_OP_DROPOUT, 4, x4, &n->attrs, n->dtype, &ls)
               : NULL;
    return JDT_OK;
}

/* Elementwise: the inputs of the output's shape take one common placement, built dim by dim
 * from the first input split there (an axis at most once); DROPOUT's step stays replicated. */
static jdt_status rule_ew(pctx *c, const jdt_tensor *n, jdt_tensor **in, jdt_placement *pin,
                          jdt_tensor **out, jdt_placement *pout)
{
    const int nd = n->shape.ndim;
    jdt_placement t = replicated();
    unsigned used = 0;
    for (int d = 0; d < nd; d++)
        for (int i = 0; i < n->n_inputs; i++) {
            if (n->inputs[i]->shape.ndim != nd) continue;
            if (pin[i].dim[d] && !(pin[i].dim[d] & used)) {
                t.dim[d] = pin[i].dim[d];
                used |= t.dim[d];
                break;
            }
        }
    bool keep_partial = linear_op(n->op) && pin[0].partial;
    for (int i = 1; i < n->n_inputs; i++) keep_partial = keep_partial && pin[i].partial == pin[0].partial;
    if (keep_partial) t.partial = pin[0].partial;
    /* a partial sum plus a replicated broadcast (a row-parallel GEMM's bias): each of the k
     * ranks adds 1/k of the bias, so the sum stays partial and its reduction moves to the first
     * reader that needs the value whole (a reduce-scatter into the residual stream under
     * sequence parallelism, instead of an all-reduce here) */
    int bias = -1;
    if (n->op == JDT_OP_ADD && n->n_inputs == 2 && n->inputs[0]->shape.ndim == nd &&
        n->inputs[1]->shape.ndim == nd)
        for (int i = 0; i < 2 && bias < 0; i++)
            if (pin[i].partial && !pin[1 - i].partial && n->inputs[1 - i]->op == JDT_OP_BROADCAST)
                bias = 1 - i;
    if (bias >= 0 && !(used & pin[1 - bias].partial)) {
        const unsigned p = pin[1 - bias].partial;
        t.partial = p;
        want_input(c, n, in, pin, 1 - bias, &t);
        jdt_placement tb = t;
        tb.partial = 0;
        want_input(c, n, in, pin, bias, &tb);
        if (in[bias])
            in[bias] = jdt_graph_mul_scalar(c->g, in[bias],
                                            1.0 / (double)jdt_mesh_group_size(c->m, p));
        pin[bias] = t;
        *pout = t;
        *out = emit(c, n, in, pout);
        return JDT_OK;
    }
    for (int i = 0; i < n->n_inputs; i++) {
        if (n->inputs[i]->shape.ndim != nd) {
            jdt_placement r = replicated();
            want(c, in, pin, i, &r);
        } else {
            want_input(c, n, in, pin, i, &t);
        }
    }
    *pout = t;
    if (n->op == JDT_OP_DROPOUT && n->n_inputs == 3 && (used & ~(unsigned)t.dim[0]))
        return dropout_block(c, n, in, &t, out);
    *out = emit(c, n, in, pout);
    return JDT_OK;
}

static jdt_status rule_broadcast(pctx *c, const jdt_tensor *n, jdt_tensor **in,
                                 jdt_placement *pin, jdt_tensor **out, jdt_placement *pout)
{
    const jdt_tensor *x = n->inputs[0];
    const int off = n->shape.ndim - x->shape.ndim;
    jdt_placement t = replicated();
    t.partial = pin[0].partial;
    for (int d = 0; d < x->shape.ndim; d++)
        if (x->shape.dims[d] == n->shape.dims[d + off]) t.dim[d + off] = pin[0].dim[d];
    *pout = t;
    *out = emit(c, n, in, pout);
    return JDT_OK;
}

static jdt_status rule_reduce(pctx *c, const jdt_tensor *n, jdt_tensor **in, jdt_placement *pin,
                              jdt_tensor **out, jdt_placement *pout)
{
    const jdt_tensor *x = n->inputs[0];
    const uint32_t mask = (uint32_t)n->attrs.i[0];
    const bool keep = n->attrs.i[1] != 0;
    if (n->op == JDT_OP_REDUCE_MAX) { /* not linear: reduced dims whole, no partial sums */
        jdt_placement w = pin[0];
        w.partial = 0;
        for (int d = 0; d < x->shape.ndim; d++)
            if (mask & (1u << d)) w.dim[d] = 0;
        want(c, in, pin, 0, &w);
    }
    jdt_placement t = replicated();
    unsigned split = 0;
    int o = 0;
    for (int d = 0; d < x->shape.ndim; d++) {
        if (mask & (1u << d)) {
            split |= pin[0].dim[d];
            if (keep) t.dim[o++] = 0;
        } else {
            t.dim[o++] = pin[0].dim[d];
        }
    }
    t.partial = (uint8_t)(pin[0].partial | split);
    *pout = t;
    jdt_tensor *y = emit(c, n, in, pout);
    if (split && n->op == JDT_OP_REDUCE_MEAN) /* mean of local means: 1/k of their sum */
        y = jdt_graph_mul_scalar(c->g, y, 1.0 / (double)jdt_mesh_group_size(c->m, split));
    *out = y;
    return JDT_OK;
}

/* Reshape: dims are matched in groups of equal products; a split dim keeps its split when it
 * leads its group (then the group's leading output dim takes it, if it divides), else it is
 * gathered first. */
static jdt_status rule_reshape(pctx *c, const jdt_tensor *n, jdt_tensor **in, jdt_placement *pin,
                               jdt_tensor **out, jdt_placement *pout)
{
    const jdt_shape *a = &n->inputs[0]->shape, *b = &n->shape;
    jdt_placement t = replicated(), w = pin[0];
    t.partial = pin[0].partial;
    int i = 0, j = 0;
    while (i < a->ndim || j < b->ndim) {
        /* skip size-1 dims (never split) */
        if (i < a->ndim && a->dims[i] == 1) { i++; continue; }
        if (j < b->ndim && b->dims[j] == 1) { j++; continue; }
        if (i >= a->ndim || j >= b->ndim) break;
        int i0 = i, j0 = j;
        int64_t pa = a->dims[i++], pb = b->dims[j++];
        while (pa != pb) {
            if (pa < pb && i < a->ndim) pa *= a->dims[i++];
            else if (pb < pa && j < b->ndim) pb *= b->dims[j++];
            else break;
        }
        for (int k = i0; k < i; k++) {
            if (!w.dim[k]) continue;
            const int ways = jdt_mesh_group_size(c->m, w.dim[k]);
            if (k == i0 && b->dims[j0] % ways == 0) t.dim[j0] = w.dim[k];
            else w.dim[k] = 0;
        }
    }
    want(c, in, pin, 0, &w);
    *pout = t;
    *out = emit(c, n, in, pout);
    return JDT_OK;
}

static jdt_status rule_transpose(pctx *c, const jdt_tensor *n, jdt_tensor **in,
                                 jdt_placement *pin, jdt_tensor **out, jdt_placement *pout)
{
    jdt_placement t = replicated();
    t.partial = pin[0].partial;
    for (int d = 0; d < n->shape.ndim; d++) t.dim[d] = pin[0].dim[n->attrs.i[d]];
    *pout = t;
    *out = emit(c, n, in, pout);
    return JDT_OK;
}

/* Slice / concat: the sliced or joined axis whole; concat's inputs share one placement. */
static jdt_status rule_axis_whole(pctx *c, const jdt_tensor *n, jdt_tensor **in,
                                  jdt_placement *pin, jdt_tensor **out, jdt_placement *pout)
{
    jdt_placement t = pin[0];
    t.dim[n->attrs.i[0]] = 0;
    for (int i = 0; i < n->n_inputs; i++) want(c, in, pin, i, &t);
    *pout = t;
    *out = emit(c, n, in, pout);
    return JDT_OK;
}

/*
 * Matmul a (..., M, K) x b (..., K, N): a weight (2-D b) is gathered along any dim split over
 * an axis that a already uses for its batch/M dims (FSDP: the weight's storage split meets the
 * batch split); the contraction dims must be split alike (else both are gathered), and then
 * the result is a partial sum over those axes (row-parallel); M and N keep their splits
 * (column-parallel).
 */
static jdt_status rule_matmul(pctx *c, const jdt_tensor *n, jdt_tensor **in, jdt_placement *pin,
                              jdt_tensor **out, jdt_placement *pout)
{
    const jdt_tensor *A = n->inputs[0], *B = n->inputs[1];
    const bool ta = n->attrs.i[0] != 0, tb = n->attrs.i[1] != 0;
    const int na = A->shape.ndim, nb = B->shape.ndim;
    const int aK = ta ? na - 2 : na - 1, aM = ta ? na - 1 : na - 2;
    const int bK = tb ? nb - 1 : nb - 2, bN = tb ? nb - 2 : nb - 1;
    jdt_placement wa = pin[0], wb = pin[1];
    wa.partial = wb.partial = 0;
    unsigned a_rows = 0;
    for (int d = 0; d < na; d++)
        if (d != aK) a_rows |= wa.dim[d];
    if (nb == 2) {
        if (wb.dim[bK] & a_rows) wb.dim[bK] = 0;
        if (wb.dim[bN] & a_rows) wb.dim[bN] = 0;
    } else {
        for (int d = 0; d < nb - 2; d++) wb.dim[d] = wa.dim[d]; /* batch dims alike */
        if (wb.dim[bN] & (a_rows | wa.dim[aK])) wb.dim[bN] = 0;
    }
    if (wa.dim[aK] != wb.dim[bK]) wa.dim[aK] = wb.dim[bK] = 0;
    if (wb.dim[bN] & wa.dim[aM]) wb.dim[bN] = 0;
    want(c, in, pin, 0, &wa);
    want(c, in, pin, 1, &wb);
    jdt_placement t = replicated();
    for (int d = 0; d < na - 2; d++) t.dim[d] = wa.dim[d];
    t.dim[na - 2] = wa.dim[aM];
    t.dim[na - 1] = wb.dim[bN];
    t.partial = wa.dim[aK];
    *pout = t;
    *out = emit(c, n, in, pout);
    return JDT_OK;
}

/* Vocab parallelism (Megatron-LM's): this rank holds ids [off, off + Vl) of a vocabulary split
 * over the axes `vax`. For ids idx (any shape, i32): *own = 1.0 where this rank holds the id,
 * else 0.0 (f32, idx's shape), and the result is the local index idx - off where owned, else
 * `other` (i32). Ids are compared as f32: exact below 2^24. NULL when out of memory. */
static jdt_tensor *vocab_local_ids(pctx *c, jdt_tensor *idx, unsigned vax, int64_t Vl, double other,
                                   jdt_tensor **own)
{
    jdt_graph *g = c->g;
    const jdt_shape *s = &idx->shape;
    /* the offset as data, not as an attribute or a splat the compiler folds: rank 0's "- 0"
     * would drop out of its program alone, and every rank must run the same collectives */
    float *off = jdt_graph_alloc(g, sizeof *off);
    if (!off) return NULL;
    *off = (float)((int64_t)jdt_mesh_group_index(c->m, vax) * Vl);
    const int64_t one[1] = {1};
    jdt_tensor *offs = jdt_graph_broadcast(g, jdt_graph_constant(g, JDT_DTYPE_F32, 1, one, off), s->ndim, s->dims);
    jdt_tensor *sh = jdt_graph_sub(g, jdt_graph_cast(g, idx, JDT_DTYPE_F32), offs);
    jdt_tensor *zero = jdt_graph_full(g, JDT_DTYPE_F32, s->ndim, s->dims, 0.0);
    jdt_tensor *top = jdt_graph_full(g, JDT_DTYPE_F32, s->ndim, s->dims, (double)Vl);
    *own = jdt_graph_mul(g, jdt_graph_ge(g, sh, zero), jdt_graph_gt(g, top, sh));
    jdt_tensor *alt = jdt_graph_full(g, JDT_DTYPE_F32, s->ndim, s->dims, other);
    return jdt_graph_cast(g, jdt_graph_select(g, *own, sh, alt), JDT_DTYPE_I32);
}

/* Gather rows of table (V, C) by idx: C's split must not clash with idx's. V whole, or, when the
 * table is stored split on V over axes idx does not use (`[vocab, tensor]`), vocab-parallel:
 * each rank looks up the ids it holds (zeros for the others) and the result is a partial sum
 * over those axes, all-reduced where it is read (Megatron's VocabParallelEmbedding: an
 * all-reduce of the (..., C) rows instead of an all-gather of the (V, C) table). */
static jdt_status rule_gather(pctx *c, const jdt_tensor *n, jdt_tensor **in, jdt_placement *pin,
                              jdt_tensor **out, jdt_placement *pout)
{
    jdt_placement wt = pin[0];
    const int ni = n->inputs[1]->shape.ndim;
    const unsigned vax = jdt_mesh_live(c->m, pin[0].dim[0]);
    /* ids split over the vocabulary's axes too (`[seq, tensor]` with `[vocab, tensor]`): the
     * lookup runs on the ids whole over those axes (a sliced input re-sliced from its leaf, no
     * gather) and its partial rows are reduce-scattered back to the ids' split */
    jdt_placement ids = pin[1];
    if (vax && (vax & used_axes(&pin[1], ni)) && !pin[0].partial && !pin[1].partial) {
        jdt_placement whole = pin[1];
        for (int d = 0; d < ni; d++) whole.dim[d] &= (uint8_t)~vax;
        want(c, in, pin, 1, &whole);
    }
    const bool vocab_par = vax && !(vax & used_axes(&pin[1], ni)) && !pin[0].partial;
    wt.partial = 0;
    if (!vocab_par) wt.dim[0] = 0;
    if (wt.dim[1] & (used_axes(&pin[1], ni) | wt.dim[0])) wt.dim[1] = 0;
    want(c, in, pin, 0, &wt);
    jdt_placement t = replicated();
    for (int d = 0; d < ni; d++) t.dim[d] = pin[1].dim[d];
    t.dim[ni] = wt.dim[1];
    if (!vocab_par) {
        *pout = t;
        *out = emit(c, n, in, pout);
        return JDT_OK;
    }
    jdt_graph *g = c->g;
    jdt_tensor *own;
    jdt_tensor *li = in[0] && in[1] ? vocab_local_ids(c, in[1], vax, in[0]->shape.dims[0], 0.0, &own) : NULL;
    if (!li) return jdt_err_set(c->e, JDT_ERR_NOMEM, "shard: out of memory");
    jdt_tensor *rows = jdt_graph_gather(g, in[0], li); /* (..., Cl) */
    int64_t d1[JDT_MAX_DIMS];
    for (int d = 0; d < ni; d++) d1[d] = li->shape.dims[d];
    d1[ni] = 1;
    jdt_tensor *mask = jdt_graph_broadcast(g, jdt_graph_reshape(g, own, ni + 1, d1), rows->shape.ndim,
                                           rows->shape.dims);
    t.partial = (uint8_t)vax;
    jdt_tensor *y = jdt_graph_mul(g, rows, mask);
    if (memcmp(&ids, &pin[1], sizeof ids) != 0) { /* back to the ids' split: a reduce-scatter */
        jdt_placement back = replicated();
        for (int d = 0; d < ni; d++) back.dim[d] = ids.dim[d];
        y = redistribute(c, y, &t, &back);
        t = back;
    }
    *pout = t;
    *out = y;
    return JDT_OK;
}

/* Row ops on the last axis (norms, softmaxes): the last axis whole, no partial sums. */
static jdt_status rule_rows(pctx *c, const jdt_tensor *n, jdt_tensor **in, jdt_placement *pin,
                            jdt_tensor **out, jdt_placement *pout)
{
    jdt_placement t = pin[0];
    t.partial = 0;
    t.dim[n->inputs[0]->shape.ndim - 1] = 0;
    for (int i = 0; i < n->n_inputs; i++) want(c, in, pin, i, &t);
    *pout = t;
    *out = emit(c, n, in, pout);
    return JDT_OK;
}

/*
 * softmax_xent: logits (..., V) with V whole; targets (...) split like the logits' rows. 2-D
 * logits split on V over axes the rows do not use (the head's weight stored split on vocab,
 * `[vocab, tensor]`: a column-parallel head) are not gathered: Megatron-LM's vocab-parallel
 * cross-entropy, from the op itself, on this rank's Vl columns [off, off + Vl):
 *   lse_r  = xent(L, 0) + L[:, 0]                   this block's log-sum-exp (target 0 is valid)
 *   LSE    = logsumexp over ranks of lse_r          an all-gather of the (N, 1) column, then
 *                                                   max-shifted as any log-sum-exp
 *   a_r    = xent(L, y - off)                       lse_r - L[y] where this rank holds y, else 0
 *                                                   (the op ignores a target < 0)
 *   loss   = LSE + all-reduce(a_r - own_r * lse_r)  = LSE - logit[y]
 * and 0 where y < 0, as the op. Its gradient on block r is the global softmax's columns minus the
 * one-hot where this rank holds y; autodiff derives it (the all-gather's VJP is a
 * reduce-scatter, the all-reduce's an all-reduce). Per rank: two fused cross-entropy passes over
 * (N, Vl) instead of one over (N, V), and 2 N floats moved instead of N V.
 */
static jdt_status xent_vocab_parallel(pctx *c, unsigned vax, jdt_tensor **in, jdt_placement *pin,
                                      jdt_tensor **out, jdt_placement *pout)
{
    jdt_graph *g = c->g;
    jdt_placement wl = pin[0], wt = replicated();
    wl.partial = 0;
    wt.dim[0] = wl.dim[0];
    want(c, in, pin, 0, &wl);
    want(c, in, pin, 1, &wt);
    jdt_tensor *L = in[0], *y = in[1];
    if (!L || !y) return jdt_err_set(c->e, JDT_ERR_NOMEM, "shard: out of memory");
    const int64_t Nl = L->shape.dims[0], Vl = L->shape.dims[1];
    const int k = jdt_mesh_group_size(c->m, vax);
    const int64_t n1[1] = {Nl}, n11[2] = {Nl, 1}, nk[2] = {Nl, k};
    jdt_tensor *own;
    jdt_tensor *tl = vocab_local_ids(c, y, vax, Vl, -1.0, &own);
    if (!tl) return jdt_err_set(c->e, JDT_ERR_NOMEM, "shard: out of memory");
    jdt_tensor *zero = jdt_graph_full(g, JDT_DTYPE_F32, 1, n1, 0.0);
    jdt_tensor *t0 = jdt_graph_cast(g, zero, JDT_DTYPE_I32);
    jdt_tensor *lse_r = jdt_graph_add(g, jdt_graph_softmax_xent(g, L, t0),
                                      jdt_graph_reshape(g, jdt_graph_slice(g, L, 1, 0, 1), 1, n1));
    c->r->n_collectives += 2;
    jdt_tensor *all = jdt_graph_all_gather(g, jdt_graph_reshape(g, lse_r, 2, n11), (int)vax, k, 1);
    jdt_tensor *m = jdt_graph_stop_gradient(g, jdt_graph_reduce_max(g, all, 2u, true)); /* (Nl, 1) */
    jdt_tensor *sum = jdt_graph_reduce_sum(g, jdt_graph_exp(g, jdt_graph_sub(g, all, jdt_graph_broadcast(g, m, 2, nk))),
                                           2u, false);
    jdt_tensor *lse = jdt_graph_add(g, jdt_graph_reshape(g, m, 1, n1), jdt_graph_log(g, sum));
    jdt_tensor *part = jdt_graph_sub(g, jdt_graph_softmax_xent(g, L, tl), jdt_graph_mul(g, own, lse_r));
    jdt_tensor *loss = jdt_graph_add(g, lse, jdt_graph_all_reduce(g, part, (int)vax, 0, 1.0));
    jdt_tensor *valid = jdt_graph_ge(g, jdt_graph_cast(g, y, JDT_DTYPE_F32), zero);
    *pout = wt;
    *out = jdt_graph_mul(g, loss, valid);
    return JDT_OK;
}

static jdt_status rule_xent(pctx *c, const jdt_tensor *n, jdt_tensor **in, jdt_placement *pin,
                            jdt_tensor **out, jdt_placement *pout)
{
    const int nd = n->inputs[0]->shape.ndim;
    const unsigned vax = jdt_mesh_live(c->m, pin[0].dim[nd - 1]);
    if (nd == 2 && vax && !(vax & pin[0].dim[0]) && n->dtype == JDT_DTYPE_F32)
        return xent_vocab_parallel(c, vax, in, pin, out, pout);
    jdt_placement wl = pin[0], wt = replicated();
    wl.partial = 0;
    wl.dim[nd - 1] = 0;
    for (int d = 0; d < nd - 1; d++) wt.dim[d] = wl.dim[d];
    want(c, in, pin, 0, &wl);
    want(c, in, pin, 1, &wt);
    *pout = wt;
    *out = emit(c, n, in, pout);
    return JDT_OK;
}

/* rope (B, T, H, D): positions and pairs whole; batch and heads may stay split. */
static jdt_status rule_rope(pctx *c, const jdt_tensor *n, jdt_tensor **in, jdt_placement *pin,
                            jdt_tensor **out, jdt_placement *pout)
{
    jdt_placement t = pin[0];
    t.partial = 0;
    t.dim[1] = t.dim[3] = 0;
    want(c, in, pin, 0, &t);
    *pout = t;
    *out = emit(c, n, in, pout);
    return JDT_OK;
}

/* attention q, k, v (B, H, T, D): T and D whole; k and v split like q (batch, heads). */
static jdt_status rule_attention(pctx *c, const jdt_tensor *n, jdt_tensor **in,
                                 jdt_placement *pin, jdt_tensor **out, jdt_placement *pout)
{
    jdt_placement t = pin[0];
    t.partial = 0;
    t.dim[2] = t.dim[3] = 0;
    for (int i = 0; i < 3; i++) want(c, in, pin, i, &t);
    *pout = t;
    *out = emit(c, n, in, pout);
    return JDT_OK;
}

/* The rule of each partition kind; an op names its kind beside its shape and VJP rules
 * (engine/graph/ops.c, part_<OP>). JDT_PART_NONE: no rule (backward-only ops, collectives:
 * the partitioner runs before autodiff); partitioning a graph that holds one fails naming it. */
static const prule RULES[JDT_PART_COUNT] = {
    [JDT_PART_NONE] = NULL,
    [JDT_PART_LEAF] = rule_leaf,
    [JDT_PART_GENERATOR] = rule_gen,
    [JDT_PART_ELEMENTWISE] = rule_ew,
    [JDT_PART_BROADCAST] = rule_broadcast,
    [JDT_PART_REDUCTION] = rule_reduce,
    [JDT_PART_RESHAPE] = rule_reshape,
    [JDT_PART_TRANSPOSE] = rule_transpose,
    [JDT_PART_AXIS_WHOLE] = rule_axis_whole,
    [JDT_PART_MATMUL] = rule_matmul,
    [JDT_PART_GATHER] = rule_gather,
    [JDT_PART_ROWS] = rule_rows,
    [JDT_PART_XENT] = rule_xent,
    [JDT_PART_ROPE] = rule_rope,
    [JDT_PART_ATTENTION] = rule_attention,
};
_Static_assert(sizeof RULES / sizeof RULES[0] == JDT_PART_COUNT, "partition rule table size");

void jdt_shard_result_free(jdt_shard_result *r)
{
    if (!r) return;
    jdt_free(r->map);
    jdt_free(r->place);
    r->map = NULL;
    r->place = NULL;
}

jdt_status jdt_shard_partition(const jdt_mesh *m, const jdt_config_rules *rules,
                               const jdt_graph *src, jdt_shard_result *out, jdt_err *e)
{
    memset(out, 0, sizeof *out);
    const int n = jdt_graph_n_nodes(src);
    out->map = jdt_calloc((size_t)(n ? n : 1), sizeof *out->map);
    out->place = jdt_calloc((size_t)(n ? n : 1), sizeof *out->place);
    out->g = jdt_graph_new();
    if (!out->map || !out->place || !out->g) {
        jdt_graph_free(out->g);
        jdt_shard_result_free(out);
        out->g = NULL;
        return jdt_err_set(e, JDT_ERR_NOMEM, "shard: out of memory");
    }
    /* the backward (autodiff runs on the partitioned graph) builds its bf16 GEMMs' cotangent
     * casts under the cast form as the one-device graph would (graph/ops.c vjp_MATMUL) */
    jdt_graph_set_bf16_weights(out->g, jdt_graph_bf16_weights(src));
    jdt_graph_set_bf16_grads(out->g, jdt_graph_bf16_grads(src));
    pctx c = {.m = m, .rules = rules, .g = out->g, .r = out, .e = e, .cap_moves = 256};
    c.moves = jdt_calloc((size_t)c.cap_moves, sizeof *c.moves); /* NULL: no cache, still right */
    jdt_status st = JDT_OK;
    for (int i = 0; i < n && st == JDT_OK; i++) {
        const jdt_tensor *t = jdt_graph_node(src, i);
        prule rule = RULES[jdt_op_partition(t->op)];
        if (!rule) {
            st = jdt_err_set(e, JDT_ERR_UNSUPPORTED, "shard: %s (node %d) has no partition rule",
                             jdt_op_name(t->op), i);
            break;
        }
        jdt_tensor *in[JDT_MAX_INPUTS];
        jdt_placement pin[JDT_MAX_INPUTS];
        for (int k = 0; k < t->n_inputs; k++) {
            in[k] = out->map[t->inputs[k]->id];
            pin[k] = out->place[t->inputs[k]->id];
        }
        jdt_graph_set_block(out->g, t->block);
        c.block = t->block;
        jdt_tensor *y = NULL;
        st = rule(&c, t, in, pin, &y, &out->place[i]);
        if (st != JDT_OK) break;
        if (!y || jdt_graph_error(out->g, NULL) != JDT_OK) {
            st = jdt_graph_error(out->g, e);
            if (st == JDT_OK) st = jdt_err_set(e, JDT_ERR_NOMEM, "shard: out of memory");
            jdt_err_prefix(e, "shard: partitioning %s (node %d)", jdt_op_name(t->op), i);
            break;
        }
        y->flags |= t->flags & JDT_TENSOR_REMAT;
        out->map[i] = y;
    }
    jdt_graph_set_block(out->g, 0);
    jdt_free(c.moves);
    if (st != JDT_OK) {
        jdt_graph_free(out->g);
        out->g = NULL;
        jdt_shard_result_free(out);
    }
    return st;
}
