/*
 * passes.c — lowering the caller's graph into the compiler's node list, with the graph-level
 * passes applied on the way (each new node is first simplified, then folded, then looked up
 * for CSE, so rewrites compose in one topological sweep), then dead-code elimination.
 *
 * Simplifications: identity ops (x*1, 1*x, x+0, 0+x, x-0, x/1, scalar ops with neutral
 * constants, pow 1, cast to the same dtype, stop_gradient, reshape/broadcast to the same shape,
 * identity transpose), neg(neg x), reshape(reshape x), transpose(transpose x) (perm composed),
 * broadcast(broadcast x). Folding: ops whose inputs are all splat constants (every element the
 * same value) become splats — autodiff seeds and optimizer hyper-parameters produce many.
 * Data constants are not folded (no evaluator here; the interpreter is the reference path).
 * x*0 is not simplified: it must stay NaN for x = NaN/Inf.
 */
#include "compile/compile-impl.h"

#include <math.h>
#include <string.h>

bool jdt_compile_grow(void **arr, int *cap, int need, size_t elem)
{
    if (need <= *cap) return true;
    int nc = *cap ? *cap * 2 : 32;
    while (nc < need)
        nc *= 2;
    void *p = jdt_realloc(*arr, (size_t)nc * elem);
    if (!p) return false;
    *arr = p;
    *cap = nc;
    return true;
}

/* How the compiler handles an op, decided by its class. A new SHAPE op is a builtin until it
 * is listed here, so program.c's exhaustive builtin switch names it. */
static cnode_kind kind_of(jdt_op op, const jdt_tensor *t)
{
    switch (jdt_op_class_of(op)) {
    case JDT_OPC_LEAF:
        return (op == JDT_OP_CONSTANT && !(t && t->data)) ? CK_SPLAT : CK_LEAF;
    case JDT_OPC_ELEMENTWISE:
    case JDT_OPC_GENERATOR:
        return CK_EW;
    case JDT_OPC_SHAPE:
        if (op == JDT_OP_BROADCAST || op == JDT_OP_TRANSPOSE || op == JDT_OP_SLICE) return CK_MAP;
        if (op == JDT_OP_RESHAPE) return CK_VIEW;
        return CK_BUILTIN; /* CONCAT */
    case JDT_OPC_REDUCTION:
        return CK_REDUCE;
    case JDT_OPC_MATMUL:
    case JDT_OPC_INDEX:
    case JDT_OPC_FUSED:
    case JDT_OPC_COLLECTIVE:
        return CK_BUILTIN;
    }
    return CK_BUILTIN; /* outside the op table: the builtin switch refuses it */
}

static bool dtype_supported(jdt_dtype dt)
{
    return dt == JDT_DTYPE_F32 || dt == JDT_DTYPE_F64 || dt == JDT_DTYPE_I32 ||
           dt == JDT_DTYPE_U8 || dt == JDT_DTYPE_U16 || dt == JDT_DTYPE_U32 || dt == JDT_DTYPE_BF16;
}

/* Evaluates an elementwise op on splat values in double (rounded to the dtype by the caller). */
static bool eval_splat(jdt_op op, const jdt_attrs *at, const double *v, double *out)
{
    double a = v[0], b = v[1], f = at->f[0];
    if (jdt_op_class_of(op) != JDT_OPC_ELEMENTWISE) return false;
    switch (op) {
    case JDT_OP_NEG:
        *out = -a;
        break;
    case JDT_OP_EXP:
        *out = exp(a);
        break;
    case JDT_OP_LOG:
        *out = log(a);
        break;
    case JDT_OP_TANH:
        *out = tanh(a);
        break;
    case JDT_OP_SQRT:
        *out = sqrt(a);
        break;
    case JDT_OP_RSQRT:
        *out = 1.0 / sqrt(a);
        break;
    case JDT_OP_RELU:
        *out = a > 0 ? a : 0.0;
        break;
    case JDT_OP_SIGMOID:
        *out = 1.0 / (1.0 + exp(-a));
        break;
    case JDT_OP_ABS:
        *out = fabs(a);
        break;
    case JDT_OP_ADD:
        *out = a + b;
        break;
    case JDT_OP_SUB:
        *out = a - b;
        break;
    case JDT_OP_MUL:
        *out = a * b;
        break;
    case JDT_OP_DIV:
        *out = a / b;
        break;
    case JDT_OP_MAX:
        *out = a > b ? a : b;
        break;
    case JDT_OP_MIN:
        *out = a < b ? a : b;
        break;
    case JDT_OP_GT:
        *out = a > b ? 1.0 : 0.0;
        break;
    case JDT_OP_GE:
        *out = a >= b ? 1.0 : 0.0;
        break;
    case JDT_OP_ADD_SCALAR:
        *out = a + f;
        break;
    case JDT_OP_MUL_SCALAR:
        *out = a * f;
        break;
    case JDT_OP_POW_SCALAR:
        *out = pow(a, f);
        break;
    case JDT_OP_SELECT:
        *out = a != 0 ? b : v[2];
        break;
    case JDT_OP_CAST:
        *out = a;
        break;
    case JDT_OP_PARAM:
    case JDT_OP_INPUT:
    case JDT_OP_CONSTANT:
    case JDT_OP_GELU:
    case JDT_OP_SILU:
    case JDT_OP_GELU_GRAD:
    case JDT_OP_SILU_GRAD:
    case JDT_OP_STOP_GRADIENT:
    case JDT_OP_DROPOUT:
    case JDT_OP_BROADCAST:
    case JDT_OP_REDUCE_SUM:
    case JDT_OP_REDUCE_MAX:
    case JDT_OP_REDUCE_MEAN:
    case JDT_OP_RESHAPE:
    case JDT_OP_TRANSPOSE:
    case JDT_OP_SLICE:
    case JDT_OP_CONCAT:
    case JDT_OP_MATMUL:
    case JDT_OP_GATHER:
    case JDT_OP_SCATTER_ADD:
    case JDT_OP_IOTA:
    case JDT_OP_CAUSAL_MASK:
    case JDT_OP_SOFTMAX:
    case JDT_OP_SOFTMAX_BWD:
    case JDT_OP_LOG_SOFTMAX:
    case JDT_OP_LOG_SOFTMAX_BWD:
    case JDT_OP_SOFTMAX_XENT:
    case JDT_OP_SOFTMAX_XENT_BWD:
    case JDT_OP_NORMALIZE:
    case JDT_OP_NORMALIZE_BWD:
    case JDT_OP_RMS_NORMALIZE:
    case JDT_OP_RMS_NORMALIZE_BWD:
    case JDT_OP_ROPE:
    case JDT_OP_ATTENTION:
    case JDT_OP_ATTENTION_BWD:
    case JDT_OP_ALL_REDUCE:
    case JDT_OP_ALL_GATHER:
    case JDT_OP_REDUCE_SCATTER:
        return false;
    }
    return true;
}

static double round_to(jdt_dtype dt, double v)
{
    switch (dt) {
    case JDT_DTYPE_F32:
        return (double)(float)v;
    case JDT_DTYPE_I32:
        return isfinite(v) ? (double)(int32_t)v : 0.0;
    case JDT_DTYPE_BF16: /* through f32, as the kernels compute it */
        return (double)jdt_bf16_round((float)v);
    case JDT_DTYPE_F64:
    case JDT_DTYPE_U16:
    case JDT_DTYPE_U32:
    case JDT_DTYPE_U8:
    case JDT_DTYPE_COUNT:
        break;
    }
    return v;
}

typedef struct {
    cprog *c;
    int *table; /* CSE hash table of cnode indices, -1 empty */
    int table_cap;
    bool simplify;
} lowerer;

static uint64_t node_hash(const cnode *n)
{
    uint64_t h = jdt_hash_u64(JDT_HASH_INIT, (uint64_t)n->op);
    h = jdt_hash_u64(h, (uint64_t)n->dtype);
    h = jdt_hash_bytes(h, &n->shape, sizeof n->shape);
    h = jdt_hash_bytes(h, n->in, sizeof(int) * (size_t)n->n_in);
    h = jdt_hash_bytes(h, &n->attrs, sizeof n->attrs);
    h = jdt_hash_bytes(h, &n->splat, sizeof n->splat);
    return h;
}

static bool node_same(const cnode *a, const cnode *b)
{
    return a->op == b->op && a->dtype == b->dtype && jdt_shape_eq(&a->shape, &b->shape) &&
           a->n_in == b->n_in && memcmp(a->in, b->in, sizeof(int) * (size_t)a->n_in) == 0 &&
           memcmp(&a->attrs, &b->attrs, sizeof a->attrs) == 0 &&
           memcmp(&a->splat, &b->splat, sizeof a->splat) == 0 && a->src == b->src;
}

/* Appends n (after the CSE lookup); returns its index or -1 on allocation failure. */
static int emit(lowerer *L, cnode *n)
{
    cprog *c = L->c;
    uint64_t slot = 0;
    bool cse = L->simplify && n->kind != CK_LEAF;
    if (cse) {
        slot = node_hash(n) & (uint64_t)(L->table_cap - 1);
        while (L->table[slot] >= 0) {
            if (node_same(&c->nodes[L->table[slot]], n)) return L->table[slot];
            slot = (slot + 1) & (uint64_t)(L->table_cap - 1);
        }
    }
    if (!jdt_compile_grow((void **)&c->nodes, &c->cap_nodes, c->n_nodes + 1, sizeof(cnode)))
        return -1;
    int id = c->n_nodes++;
    c->nodes[id] = *n;
    c->nodes[id].bf16 = n->bf16 || n->dtype == JDT_DTYPE_BF16; /* splats made here too */
    c->nodes[id].group = -1;
    c->nodes[id].buf = -1;
    if (cse) L->table[slot] = id;
    return id;
}

static bool is_splat(const cprog *c, int i, double v)
{
    return c->nodes[i].kind == CK_SPLAT && c->nodes[i].splat == v;
}

static int make_splat(lowerer *L, const cnode *like, double v)
{
    cnode s;
    memset(&s, 0, sizeof s);
    s.op = JDT_OP_CONSTANT;
    s.dtype = like->dtype;
    s.shape = like->shape;
    s.kind = CK_SPLAT;
    s.splat = round_to(like->dtype, v);
    return emit(L, &s);
}

/* Returns an existing/new node equivalent to n, or -2 when no rule applies (-1: no memory). */
static int simplify(lowerer *L, cnode *n)
{
    cprog *c = L->c;
    const cnode *a = n->n_in > 0 ? &c->nodes[n->in[0]] : NULL;
    int x = n->n_in > 0 ? n->in[0] : -1, y = n->n_in > 1 ? n->in[1] : -1;
    bool same_as_x = a && a->dtype == n->dtype && jdt_shape_eq(&a->shape, &n->shape);
    double f = n->attrs.f[0];

    /* fold: every input a splat */
    if (n->kind == CK_EW || n->kind == CK_MAP || n->kind == CK_VIEW || n->kind == CK_REDUCE) {
        bool all = n->n_in > 0;
        double v[3] = {0, 0, 0};
        for (int i = 0; i < n->n_in; i++) {
            if (c->nodes[n->in[i]].kind != CK_SPLAT)
                all = false;
            else if (i < 3)
                v[i] = c->nodes[n->in[i]].splat;
        }
        if (all) {
            double r = 0;
            if (n->kind == CK_MAP || n->kind == CK_VIEW) return make_splat(L, n, v[0]);
            if (n->op == JDT_OP_REDUCE_SUM)
                return make_splat(
                    L, n, v[0] * (double)(jdt_shape_numel(&a->shape) / jdt_shape_numel(&n->shape)));
            if (n->op == JDT_OP_REDUCE_MAX || n->op == JDT_OP_REDUCE_MEAN)
                return make_splat(L, n, v[0]);
            if (eval_splat(n->op, &n->attrs, v, &r)) return make_splat(L, n, r);
        }
    }
    /* an op that changes nothing when its result has its input's dtype and shape */
    if ((jdt_op_flags(n->op) & JDT_OPF_ID_IF_SAME_TYPE) && same_as_x) return x;
    switch (n->op) {
    case JDT_OP_MUL:
        if (is_splat(c, y, 1.0) && same_as_x) return x;
        if (is_splat(c, x, 1.0) && c->nodes[y].dtype == n->dtype) return y;
        break;
    case JDT_OP_ADD:
        if (is_splat(c, y, 0.0) && same_as_x) return x;
        if (is_splat(c, x, 0.0) && c->nodes[y].dtype == n->dtype) return y;
        break;
    case JDT_OP_SUB:
        if (is_splat(c, y, 0.0) && same_as_x) return x;
        break;
    case JDT_OP_DIV:
        if (is_splat(c, y, 1.0) && same_as_x) return x;
        break;
    case JDT_OP_MUL_SCALAR:
    case JDT_OP_POW_SCALAR:
        if (f == 1.0 && same_as_x) return x;
        break;
    case JDT_OP_ADD_SCALAR:
        if (f == 0.0 && same_as_x) return x;
        break;
    case JDT_OP_NEG:
        if (a->op == JDT_OP_NEG) return a->in[0];
        break;
    case JDT_OP_RESHAPE:
        if (a->op == JDT_OP_RESHAPE) {
            cnode r = *n;
            r.in[0] = a->in[0];
            if (jdt_shape_eq(&c->nodes[a->in[0]].shape, &n->shape) &&
                c->nodes[a->in[0]].dtype == n->dtype)
                return a->in[0];
            return emit(L, &r);
        }
        break;
    case JDT_OP_BROADCAST:
        if (a->op == JDT_OP_BROADCAST) {
            cnode r = *n;
            r.in[0] = a->in[0];
            return emit(L, &r);
        }
        break;
    case JDT_OP_TRANSPOSE: {
        bool ident = true;
        for (int k = 0; k < n->shape.ndim; k++)
            ident = ident && n->attrs.i[k] == k;
        if (ident && same_as_x) return x;
        if (a->op == JDT_OP_TRANSPOSE) {
            /* out.dims[k] = mid.dims[p2[k]] = in.dims[p1[p2[k]]] */
            cnode r = *n;
            r.in[0] = a->in[0];
            bool id2 = true;
            for (int k = 0; k < n->shape.ndim; k++) {
                r.attrs.i[k] = a->attrs.i[n->attrs.i[k]];
                id2 = id2 && r.attrs.i[k] == k;
            }
            if (id2) return a->in[0];
            return emit(L, &r);
        }
        break;
    }
    case JDT_OP_PARAM:
    case JDT_OP_INPUT:
    case JDT_OP_CONSTANT:
    case JDT_OP_EXP:
    case JDT_OP_LOG:
    case JDT_OP_TANH:
    case JDT_OP_SQRT:
    case JDT_OP_RSQRT:
    case JDT_OP_RELU:
    case JDT_OP_GELU:
    case JDT_OP_SILU:
    case JDT_OP_SIGMOID:
    case JDT_OP_ABS:
    case JDT_OP_MAX:
    case JDT_OP_MIN:
    case JDT_OP_GT:
    case JDT_OP_GE:
    case JDT_OP_GELU_GRAD:
    case JDT_OP_SILU_GRAD:
    case JDT_OP_SELECT:
    case JDT_OP_CAST:
    case JDT_OP_STOP_GRADIENT:
    case JDT_OP_DROPOUT:
    case JDT_OP_REDUCE_SUM:
    case JDT_OP_REDUCE_MAX:
    case JDT_OP_REDUCE_MEAN:
    case JDT_OP_SLICE:
    case JDT_OP_CONCAT:
    case JDT_OP_MATMUL:
    case JDT_OP_GATHER:
    case JDT_OP_SCATTER_ADD:
    case JDT_OP_IOTA:
    case JDT_OP_CAUSAL_MASK:
    case JDT_OP_SOFTMAX:
    case JDT_OP_SOFTMAX_BWD:
    case JDT_OP_LOG_SOFTMAX:
    case JDT_OP_LOG_SOFTMAX_BWD:
    case JDT_OP_SOFTMAX_XENT:
    case JDT_OP_SOFTMAX_XENT_BWD:
    case JDT_OP_NORMALIZE:
    case JDT_OP_NORMALIZE_BWD:
    case JDT_OP_RMS_NORMALIZE:
    case JDT_OP_RMS_NORMALIZE_BWD:
    case JDT_OP_ROPE:
    case JDT_OP_ATTENTION:
    case JDT_OP_ATTENTION_BWD:
    case JDT_OP_ALL_REDUCE:
    case JDT_OP_ALL_GATHER:
    case JDT_OP_REDUCE_SCATTER:
        break;
    }
    return -2;
}

static jdt_status check_node(const jdt_tensor *t, jdt_err *e)
{
    /* every switch over ops lists every op of the table; a value outside it stops here */
    if ((int)jdt_op_class_of(t->op) == JDT_OPC_COUNT)
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "compile: node %d: op %d is not in the op table",
                           t->id, (int)t->op);
    if (!dtype_supported(t->dtype))
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED,
                           "compile: node %d (%s): dtype %s has no CPU kernel", t->id,
                           jdt_op_name(t->op), jdt_dtype_name(t->dtype));
    if (t->shape.ndim < 0 || t->shape.ndim > JDT_MAX_DIMS)
        return jdt_err_set(e, JDT_ERR_SHAPE, "compile: node %d (%s): bad rank %d", t->id,
                           jdt_op_name(t->op), t->shape.ndim);
    for (int i = 0; i < t->n_inputs; i++)
        if (!t->inputs[i] || t->inputs[i]->id >= t->id)
            return jdt_err_set(e, JDT_ERR_INVALID, "compile: node %d (%s): input %d not before it",
                               t->id, jdt_op_name(t->op), i);
    return JDT_OK;
}

/* Readers of each node (inputs of nodes, graph outputs, update values and targets) in a new
 * (n_nodes + 1) array the caller frees; NULL when out of memory. */
/* Marks node i live and stacks it for live_nodes' walk, once. */
static void mark_live(unsigned char *live, int *stack, int *sp, int i)
{
    if (!live[i]) live[i] = 1, stack[(*sp)++] = i;
}

/* live[i] = 1 when node i is reachable from the outputs and the update values and targets
 * (any node order: a worklist, not a reverse scan); NULL when out of memory. Caller frees. */
static unsigned char *live_nodes(const cprog *c)
{
    unsigned char *live = jdt_calloc((size_t)c->n_nodes + 1, 1);
    int *stack = jdt_malloc(sizeof(int) * ((size_t)c->n_nodes + 1));
    if (!live || !stack) {
        jdt_free(live), jdt_free(stack);
        return NULL;
    }
    int sp = 0;
    for (int i = 0; i < c->n_outputs; i++)
        mark_live(live, stack, &sp, c->outputs[i]);
    for (int i = 0; i < c->n_updates; i++) {
        mark_live(live, stack, &sp, c->updates[i].value);
        mark_live(live, stack, &sp, c->updates[i].target);
    }
    while (sp > 0) {
        const cnode *n = &c->nodes[stack[--sp]];
        for (int k = 0; k < n->n_in; k++)
            mark_live(live, stack, &sp, n->in[k]);
    }
    jdt_free(stack);
    return live;
}

/* Readers of each node among the live ones (a reader DCE will drop, such as a cotangent the VJP
 * built and nothing took, must not keep a fold from its value), plus one per output and per
 * update use. Caller frees; NULL when out of memory. */
static int *count_users(const cprog *c)
{
    int *users = jdt_calloc((size_t)c->n_nodes + 1, sizeof(int));
    unsigned char *live = live_nodes(c);
    if (!users || !live) {
        jdt_free(users), jdt_free(live);
        return NULL;
    }
    for (int i = 0; i < c->n_nodes; i++)
        for (int k = 0; live[i] && k < c->nodes[i].n_in; k++)
            users[c->nodes[i].in[k]]++;
    jdt_free(live);
    for (int i = 0; i < c->n_outputs; i++)
        users[c->outputs[i]]++;
    for (int i = 0; i < c->n_updates; i++)
        users[c->updates[i].value]++, users[c->updates[i].target]++;
    return users;
}

/* Is node a an elementwise f32 ADD of two operands (what the add folds look for)? */
static bool is_f32_add(const cnode *a)
{
    return a->op == JDT_OP_ADD && a->kind == CK_EW && a->n_in == 2 && a->dtype == JDT_DTYPE_F32;
}

/* Node a, folded into the builtin computing its value (an add into the builtin computing one
 * of its operands, a cast into the GEMM computing its input), becomes a view of node v, the
 * builtin's result (or a view of it). */
static void to_view(cnode *a, int v)
{
    a->op = JDT_OP_RESHAPE;
    a->kind = CK_VIEW;
    a->n_in = 1;
    a->in[0] = v;
    memset(&a->attrs, 0, sizeof a->attrs);
}

/* Folds y = matmul(a, w) + broadcast(bias) (bias: one value per output column, the matmul read
 * by nothing else) into the matmul: the builtin gets the bias as a third input and starts its
 * accumulator from it (GEMM with beta = 1), and the add becomes a view of the product. Saves a
 * full read and write of y per linear layer. Skipped with no_fuse (tests compare both paths). */
static jdt_status order_inputs_first(cprog *c, jdt_err *e);
static void renumber(cprog *c, cnode *out, const int *pos);
static jdt_status apply_order(cprog *c, const int *order, jdt_err *e);

/* Is node b, a later one than node at, a chain of one-input nodes down to a node before `at`
 * or a leaf? Such a value cannot depend on `at`, so order_inputs_first can move the chain
 * ahead of it (FSDP's gathered bias: its all-gather and casts come after the GEMM). */
static bool early_chain(const cprog *c, int b, int at)
{
    while (b > at && c->nodes[b].kind != CK_LEAF) {
        if (c->nodes[b].n_in != 1) return false;
        b = c->nodes[b].in[0];
    }
    return true;
}

static jdt_status fold_bias_adds(cprog *c, jdt_err *e)
{
    int *users = count_users(c);
    if (!users) return jdt_err_set(e, JDT_ERR_NOMEM, "compile: bias folding");
    bool reorder = false;
    for (int i = 0; i < c->n_nodes; i++) {
        cnode *a = &c->nodes[i];
        if (!is_f32_add(a) || a->shape.ndim < 2) continue;
        for (int side = 0; side < 2; side++) {
            int mi = a->in[side], bi = a->in[1 - side];
            cnode *m = &c->nodes[mi], *bc = &c->nodes[bi];
            if (m->op != JDT_OP_MATMUL || m->n_in != 2 || users[mi] != 1 ||
                !jdt_shape_eq(&m->shape, &a->shape) || bc->op != JDT_OP_BROADCAST)
                continue;
            const cnode *x = &c->nodes[bc->in[0]];
            int64_t N = a->shape.dims[a->shape.ndim - 1];
            /* inputs precede their users, except leaves (valid before the first step) and
             * a later bias that can move ahead (early_chain; renumbered below) */
            if ((bc->in[0] > mi && !early_chain(c, bc->in[0], mi)) || x->kind == CK_SPLAT ||
                x->dtype != JDT_DTYPE_F32 || x->shape.ndim < 1 ||
                x->shape.dims[x->shape.ndim - 1] != N || jdt_shape_numel(&x->shape) != N)
                continue;
            reorder = reorder || (bc->in[0] > mi && x->kind != CK_LEAF);
            m->in[2] = bc->in[0];
            m->n_in = 3;
            to_view(a, mi);
            break;
        }
    }
    jdt_free(users);
    return reorder ? order_inputs_first(c, e) : JDT_OK;
}

/* Follows views (CK_VIEW) down from node i while the aliased node has no other reader: the
 * node at the bottom (i itself when i is not a view). */
static int view_base(const cprog *c, const int *users, int i)
{
    while (c->nodes[i].kind == CK_VIEW && users[c->nodes[i].in[0]] == 1)
        i = c->nodes[i].in[0];
    return i;
}

/* Is node l a CAST to f32 of a bf16 value (an exact widening)? */
static bool is_widening(const cprog *c, int l)
{
    const cnode *n = &c->nodes[l];
    return n->op == JDT_OP_CAST && n->kind == CK_EW && n->dtype == JDT_DTYPE_F32 &&
           c->nodes[n->in[0]].dtype == JDT_DTYPE_BF16;
}

/* Node l, read by nothing now, becomes an unread constant, so that the passes before DCE that
 * count readers no longer see it read its inputs. */
static void unread(cprog *c, int *users, int l)
{
    for (int k = 0; k < c->nodes[l].n_in; k++)
        users[c->nodes[l].in[k]]--;
    c->nodes[l].op = JDT_OP_CONSTANT;
    c->nodes[l].kind = CK_SPLAT;
    c->nodes[l].n_in = 0;
    c->nodes[l].splat = 0.0;
}

/* Node v, when nothing reads it any more, and then each of its inputs that nothing reads any
 * more, become unread constants (unread): the nodes a fold cut off, down to those still read. */
static void unread_dead(cprog *c, int *users, int v)
{
    if (users[v] != 0) return;
    int in[JDT_MAX_INPUTS];
    const int n = c->nodes[v].n_in;
    memcpy(in, c->nodes[v].in, sizeof(int) * (size_t)n);
    unread(c, users, v);
    for (int k = 0; k < n; k++)
        unread_dead(c, users, in[k]);
}

/* Builtin input k of node x, a CAST to f32 of a bf16 value, becomes that value; the CAST, when
 * nothing else reads it, turns into an unread constant so that passes before DCE (the
 * attention-layout fold counts readers) no longer see it read its input. */
static void skip_widening(cprog *c, int *users, cnode *x, int k)
{
    const int l = x->in[k];
    x->in[k] = c->nodes[l].in[0];
    users[x->in[k]]++;
    if (--users[l] == 0) unread(c, users, l);
}

/* Node x and its views down to node m (a GEMM's product, or a RoPE) become bf16 nodes: m's
 * builtin stores bf16. */
static void store_bf16(cprog *c, int x, int m)
{
    for (int v = x;; v = c->nodes[v].in[0]) {
        c->nodes[v].dtype = JDT_DTYPE_BF16;
        c->nodes[v].bf16 = true;
        if (v == m) return;
    }
}

/* precision.activations: bf16 on a device whose builtins take bf16 (c->bf16_builtins: CUDA;
 * the CPU: (1) for its GEMMs, c->gemm_bf16_out, and (2) for its attention and cross-entropy,
 * c->attention_bf16_qkv and c->xent_bf16_logits).
 * (1) y = CAST(matmul(a, w) [+ bias], bf16), the product read by nothing else and computed in
 * bf16 (attrs i[2]): the GEMM stores y as bf16 itself (cuBLASLt's D type, oneDNN's bf16
 * destination) and the CAST becomes a view. A folded bias must be the bf16 rounding of the model's
 * (CAST(CAST(b, bf16), f32), models.c), since cuBLASLt's bias has D's type: the GEMM then reads the
 * bf16 node. (2) The cross-entropy (forward and backward) reading CAST(x, f32) of a bf16 x reads x,
 * and so does the attention (forward and backward) of its q, k and v when all three are such; so
 * does RoPE, and (1) holds for it too (rotating bf16 q and k, storing them rounded). Both change no
 * number: the builtin rounds its f32 result once as the CAST did, and widening a bf16 value is
 * exact. They save the f32 copies: 6 bytes of 10 per element of GPT-2's logits. Skipped with
 * no_fuse. */
static jdt_status fold_bf16_casts(cprog *c, jdt_err *e)
{
    int *users = count_users(c);
    if (!users) return jdt_err_set(e, JDT_ERR_NOMEM, "compile: bf16 cast folding");
    for (int i = 0; i < c->n_nodes; i++) {
        cnode *x = &c->nodes[i];
        if (x->op == JDT_OP_CAST && x->kind == CK_EW && x->dtype == JDT_DTYPE_BF16 &&
            c->nodes[x->in[0]].dtype == JDT_DTYPE_F32 && c->gemm_bf16_out) {
            int mi = view_base(c, users, x->in[0]);
            cnode *m = &c->nodes[mi];
            const bool rope = m->op == JDT_OP_ROPE && m->kind == CK_BUILTIN && c->bf16_builtins;
            if (users[x->in[0]] != 1 || (!rope && (m->op != JDT_OP_MATMUL || !m->attrs.i[2])) ||
                users[mi] != 1 || m->dtype != JDT_DTYPE_F32)
                continue;
            int bias = -1;
            if (!rope && m->n_in == 3) { /* the bias (no accumulate input yet: later) */
                if (!is_widening(c, m->in[2])) continue;
                bias = c->nodes[m->in[2]].in[0];
            }
            if (bias >= 0) m->in[2] = bias;
            store_bf16(c, x->in[0], mi); /* the product and its views */
            to_view(x, x->in[0]);
            c->stats.n_bf16_folded++;
        } else if ((x->op == JDT_OP_ATTENTION || x->op == JDT_OP_ATTENTION_BWD) &&
                   x->kind == CK_BUILTIN && c->attention_bf16_qkv) {
            /* q, k, v: all three bf16 or none (the kernels take one type for them) */
            bool all = true;
            for (int k = 0; k < 3; k++)
                all = all && is_widening(c, x->in[k]);
            for (int k = 0; k < 3 && all; k++)
                skip_widening(c, users, x, k);
            c->stats.n_bf16_folded += all;
        } else if ((((x->op == JDT_OP_SOFTMAX_XENT || x->op == JDT_OP_SOFTMAX_XENT_BWD) &&
                     c->xent_bf16_logits) ||
                    (x->op == JDT_OP_ROPE && c->bf16_builtins)) &&
                   x->kind == CK_BUILTIN) {
            if (is_widening(c, x->in[0])) {
                skip_widening(c, users, x, 0);
                c->stats.n_bf16_folded++;
            }
        }
    }
    jdt_free(users);
    return JDT_OK;
}

/* Node `node` becomes another output of builtin `host` (CK_COOUT, a later index), the last of
 * its chain: its one input is the host, whose step writes its buffer (compile-impl.h). */
static void make_co_output(cprog *c, int host, int node)
{
    cnode *x = &c->nodes[node];
    x->kind = CK_COOUT;
    x->n_in = 1;
    x->in[0] = host;
    x->co = 0;
    int *at = &c->nodes[host].co;
    while (*at)
        at = &c->nodes[*at].co;
    *at = node;
}

/* Is node i a graph output, or an update's value or target (a value the caller sees)? */
static bool is_result(const cprog *c, int i)
{
    for (int q = 0; q < c->n_outputs; q++)
        if (c->outputs[q] == i) return true;
    for (int q = 0; q < c->n_updates; q++)
        if (c->updates[q].value == i || c->updates[q].target == i) return true;
    return false;
}

/* The nodes between a projection (or its RoPE) and the attention that moves q, k or v without
 * arithmetic: reshape views, the head transposes, and grouped-query attention's broadcast that
 * repeats each key/value head for its group of query heads (models.c). Each copies values, so
 * it stores bf16 as exactly as f32 what it is given in bf16. */
static bool qkv_carrier(const cnode *u)
{
    return (u->kind == CK_VIEW && u->op == JDT_OP_RESHAPE) ||
           (u->kind == CK_MAP && (u->op == JDT_OP_TRANSPOSE || u->op == JDT_OP_BROADCAST));
}

/* Is every reader of node r (through qkv_carrier nodes) a bf16-compute
 * attention, forward or backward, reading it as q, k or v? Such an attention rounds it to bf16
 * as it reads it. Not an output or update value. */
static bool read_as_bf16_qkv(const cprog *c, int r)
{
    if (is_result(c, r)) return false;
    for (int j = r + 1; j < c->n_nodes; j++) {
        const cnode *u = &c->nodes[j];
        for (int k = 0; k < u->n_in; k++) {
            if (u->in[k] != r) continue;
            if (qkv_carrier(u)) {
                if (!read_as_bf16_qkv(c, j)) return false;
                break;
            }
            if ((u->op != JDT_OP_ATTENTION && u->op != JDT_OP_ATTENTION_BWD) ||
                u->kind != CK_BUILTIN || !u->attrs.i[0] || k >= 3)
                return false;
        }
    }
    return true;
}

/* Llama's q and k reach the attention through RoPE, a builtin that stores f32, so the attention
 * rule of fold_bf16_casts (all of q, k, v widened bf16 values) misses them, and v is widened by a
 * kernel of its own. With bf16 compute the attention rounds q, k and v to bf16 as it reads them
 * (the tensor-core kernels; the CPU's too): a RoPE read only so (through the head transposes)
 * stores bf16 (cuk_rope's y16), and v's widening is skipped. The forward and backward then read
 * 6 bytes per element of q, k, v instead of 12, RoPE writes 2 instead of 4, and v's widening
 * kernel goes: the same numbers on the tensor-core kernels (the f32 FMA ones, for head sizes
 * over 128, round q and k where they did not). Needs bf16_builtins; skipped with no_fuse. */
static jdt_status fold_rope_attention(cprog *c, jdt_err *e)
{
    int *users = count_users(c);
    if (!users) return jdt_err_set(e, JDT_ERR_NOMEM, "compile: rope attention folding");
    for (int i = 0; i < c->n_nodes; i++) {
        cnode *x = &c->nodes[i];
        if ((x->op != JDT_OP_ATTENTION && x->op != JDT_OP_ATTENTION_BWD) || x->kind != CK_BUILTIN ||
            !x->attrs.i[0])
            continue;
        int base[3], n_work = 0;
        bool ok = true;
        for (int k = 0; k < 3 && ok; k++) {
            int b = x->in[k];
            while (qkv_carrier(&c->nodes[b]))
                b = c->nodes[b].in[0];
            const cnode *bn = &c->nodes[b];
            base[k] = -1;
            if (bn->dtype == JDT_DTYPE_BF16) continue;
            if (b == x->in[k] && is_widening(c, b)) {
                n_work++;
                continue;
            }
            ok = bn->op == JDT_OP_ROPE && bn->kind == CK_BUILTIN && bn->dtype == JDT_DTYPE_F32 &&
                 read_as_bf16_qkv(c, b);
            base[k] = b;
            n_work++;
        }
        if (!ok || n_work == 0) continue;
        for (int k = 0; k < 3; k++) {
            if (base[k] >= 0) /* the RoPE and the views down to it store bf16 */
                for (int v = x->in[k];; v = c->nodes[v].in[0]) {
                    c->nodes[v].dtype = JDT_DTYPE_BF16;
                    c->nodes[v].bf16 = true;
                    if (v == base[k]) break;
                }
            else if (is_widening(c, x->in[k]))
                skip_widening(c, users, x, k);
        }
        c->stats.n_bf16_folded++;
    }
    jdt_free(users);
    return JDT_OK;
}

/* llm.c's fused classifier: SOFTMAX_XENT_BWD(logits, targets, dloss, X) with X =
 * SOFTMAX_XENT(logits, targets) and dloss a splat (the VJP of the loss's mean: every row's
 * cotangent 1/N times the seed) becomes X's co-output (CK_COOUT): X's step finds each row's
 * logsumexp in one read, stores the loss and, while the row is still in cache, dlogits =
 * dloss * (softmax - onehot). The backward's own pass over the logits goes (one read of GPT-2's
 * bf16 logits, 3.3 GB per step at B 32). The numbers change only by one rounding: the
 * backward used to take the logsumexp back from X's loss as loss + row[t]; now it is exact. dloss's
 * value moves into X's attrs f[0]; the backward keeps its buffer and readers, its one input now
 * X. Needs the device's xent_fused; skipped with no_fuse. */
static jdt_status fold_xent_backwards(cprog *c, jdt_err *e)
{
    (void)e;
    for (int i = 0; i < c->n_nodes; i++) {
        cnode *b = &c->nodes[i];
        if (b->op != JDT_OP_SOFTMAX_XENT_BWD || b->kind != CK_BUILTIN || b->n_in != 4) continue;
        cnode *x = &c->nodes[b->in[3]], *d = &c->nodes[b->in[2]];
        if (x->op != JDT_OP_SOFTMAX_XENT || x->kind != CK_BUILTIN || x->n_in != 2 || x->co ||
            x->in[0] != b->in[0] || x->in[1] != b->in[1] || d->kind != CK_SPLAT ||
            d->dtype != JDT_DTYPE_F32 || jdt_shape_numel(&d->shape) != jdt_shape_numel(&x->shape))
            continue;
        x->attrs.f[0] = d->splat;
        make_co_output(c, b->in[3], i);
        c->stats.n_xent_fused++;
    }
    return JDT_OK;
}

/* The node that BROADCAST node b spreads along the rows of a (..., C) tensor when it holds C
 * f32 values and is valid at node `at` (computed before it, or a leaf), else -1. */
static int row_vector(const cprog *c, int b, int64_t C, int at)
{
    const cnode *bc = &c->nodes[b];
    if (bc->op != JDT_OP_BROADCAST) return -1;
    const int wi = bc->in[0];
    const cnode *w = &c->nodes[wi];
    if ((wi > at && w->kind != CK_LEAF) || w->kind == CK_SPLAT || w->dtype != JDT_DTYPE_F32 ||
        w->shape.ndim < 1 || w->shape.dims[w->shape.ndim - 1] != C ||
        jdt_shape_numel(&w->shape) != C)
        return -1;
    return wi;
}

/* The norm backwards read their scale (c->norm_bwd_scale: CUDA): NORMALIZE_BWD(x, dy * w) and
 * RMS_NORMALIZE_BWD(x, dy * w), the product read by nothing else and w one value per column
 * broadcast along the rows (the VJP of the norm's affine, models.c norm), become the builtin
 * on (x, dy, w): it forms dy * w as it reads dy, so the product's kernel (a full read and write)
 * and its buffer go, and no number changes (the same f32 products). Skipped with no_fuse. */
static jdt_status fold_norm_scales(cprog *c, jdt_err *e)
{
    int *users = count_users(c);
    if (!users) return jdt_err_set(e, JDT_ERR_NOMEM, "compile: norm scale folding");
    for (int i = 0; i < c->n_nodes; i++) {
        cnode *nb = &c->nodes[i];
        if ((nb->op != JDT_OP_NORMALIZE_BWD && nb->op != JDT_OP_RMS_NORMALIZE_BWD) ||
            nb->kind != CK_BUILTIN || nb->n_in != 2 || users[nb->in[1]] != 1)
            continue;
        const cnode *mul = &c->nodes[nb->in[1]];
        if (mul->op != JDT_OP_MUL || mul->kind != CK_EW || mul->n_in != 2 ||
            mul->dtype != JDT_DTYPE_F32 || !jdt_shape_eq(&mul->shape, &nb->shape))
            continue;
        const int64_t C = nb->shape.dims[nb->shape.ndim - 1];
        for (int side = 0; side < 2; side++) {
            const cnode *dy = &c->nodes[mul->in[side]];
            const int wi = row_vector(c, mul->in[1 - side], C, i);
            if (wi < 0 || dy->dtype != JDT_DTYPE_F32 || !jdt_shape_eq(&dy->shape, &nb->shape))
                continue;
            nb->in[1] = mul->in[side];
            nb->in[2] = wi;
            nb->n_in = 3;
            c->stats.n_norm_scales_folded++;
            break;
        }
    }
    jdt_free(users);
    return JDT_OK;
}

/* Follows views (CK_VIEW) down from node i, whatever else reads them: the node whose buffer
 * holds i's elements in i's order. */
static int view_root(const cprog *c, int i)
{
    while (c->nodes[i].kind == CK_VIEW)
        i = c->nodes[i].in[0];
    return i;
}

/* Is r a REDUCE_SUM of a tensor whose rows are those of root (views followed), C values per
 * row, over every axis but the last: the column sums of root's (rows, C) matrix? */
static bool column_sums_of(const cprog *c, int r, int root, int64_t C, int64_t numel)
{
    const cnode *n = &c->nodes[r];
    if (n->op != JDT_OP_REDUCE_SUM || n->kind != CK_REDUCE || n->dtype != JDT_DTYPE_F32)
        return false;
    const cnode *a = &c->nodes[n->in[0]];
    const int nd = a->shape.ndim;
    return view_root(c, n->in[0]) == root && nd >= 1 && a->shape.dims[nd - 1] == C &&
           jdt_shape_numel(&a->shape) == numel &&
           n->attrs.i[0] == (((int64_t)1 << nd) - 1) - ((int64_t)1 << (nd - 1));
}

/* Appends node n (group and buffer unset) to c's nodes; its index, or -1 out of memory. Its
 * inputs may follow it until order_inputs_first runs. */
static int append_node(cprog *c, const cnode *n)
{
    if (!jdt_compile_grow((void **)&c->nodes, &c->cap_nodes, c->n_nodes + 1, sizeof(cnode)))
        return -1;
    c->nodes[c->n_nodes] = *n;
    c->nodes[c->n_nodes].group = c->nodes[c->n_nodes].buf = -1;
    return c->n_nodes++;
}

/* Renumbers the nodes so that every node follows its inputs, leaves included, keeping the
 * order of nodes already so (a depth-first walk that emits a node's inputs before it, in index
 * order): a rewrite that appends nodes another node reads runs it. */
static jdt_status order_inputs_first(cprog *c, jdt_err *e)
{
    const int n = c->n_nodes;
    int *pos = jdt_malloc(sizeof(int) * ((size_t)n + 1)),
        *stack = jdt_malloc(sizeof(int) * ((size_t)n + 1));
    cnode *out = jdt_malloc(sizeof(cnode) * ((size_t)n + 1));
    if (!pos || !stack || !out) {
        jdt_free(pos), jdt_free(stack), jdt_free(out);
        return jdt_err_set(e, JDT_ERR_NOMEM, "compile: ordering %d nodes", n);
    }
    memset(pos, 0xff, sizeof(int) * (size_t)n);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (pos[i] >= 0) continue;
        int sp = 0;
        stack[sp++] = i;
        pos[i] = -2; /* on the stack */
        while (sp > 0) {
            const int t = stack[sp - 1];
            int next = -1;
            for (int k = 0; k < c->nodes[t].n_in && next < 0; k++)
                if (pos[c->nodes[t].in[k]] == -1) next = c->nodes[t].in[k];
            if (next >= 0) {
                pos[next] = -2;
                stack[sp++] = next;
                continue;
            }
            out[m] = c->nodes[t];
            pos[t] = m++;
            sp--;
        }
    }
    renumber(c, out, pos);
    jdt_free(pos), jdt_free(stack), jdt_free(out);
    return JDT_OK;
}

/* Makes out (c->n_nodes nodes, old indices in their in[] and co) c's nodes, pos[old] being
 * each old node's new index: inputs, co-outputs, outputs and updates renumbered. */
static void renumber(cprog *c, cnode *out, const int *pos)
{
    const int n = c->n_nodes;
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < out[i].n_in; k++)
            out[i].in[k] = pos[out[i].in[k]];
        if (out[i].co) out[i].co = pos[out[i].co]; /* still later: it reads node i */
    }
    memcpy(c->nodes, out, sizeof(cnode) * (size_t)n);
    for (int i = 0; i < c->n_outputs; i++)
        c->outputs[i] = pos[c->outputs[i]];
    for (int i = 0; i < c->n_updates; i++) {
        c->updates[i].target = pos[c->updates[i].target];
        c->updates[i].value = pos[c->updates[i].value];
    }
}

/* Puts c's nodes in the order order[new] = old, which must keep every node after its inputs
 * and every co-output after its builtin. */
static jdt_status apply_order(cprog *c, const int *order, jdt_err *e)
{
    const int n = c->n_nodes;
    int *pos = jdt_malloc(sizeof(int) * ((size_t)n + 1));
    cnode *out = jdt_malloc(sizeof(cnode) * ((size_t)n + 1));
    if (!pos || !out) {
        jdt_free(pos), jdt_free(out);
        return jdt_err_set(e, JDT_ERR_NOMEM, "compile: ordering %d nodes", n);
    }
    for (int i = 0; i < n; i++) {
        pos[order[i]] = i;
        out[i] = c->nodes[order[i]];
    }
    renumber(c, out, pos);
    jdt_free(pos), jdt_free(out);
    return JDT_OK;
}

/* A cross-entropy backward: SOFTMAX_XENT_BWD, standalone or the fused classifier's co-output. */
static bool is_xent_backward(const cprog *c, const cnode *x)
{
    return x->op == JDT_OP_SOFTMAX_XENT_BWD ||
           (x->kind == CK_COOUT && c->nodes[x->in[0]].op == JDT_OP_SOFTMAX_XENT);
}

/* The last key among node a's inputs. */
static int inputs_key(const cprog *c, const int *key, int a)
{
    int kk = 0;
    for (int k = 0; k < c->nodes[a].n_in; k++)
        if (key[c->nodes[a].in[k]] > kk) kk = key[c->nodes[a].in[k]];
    return kk;
}

/* Is node a, read by a node that moves (so a depends on no cross-entropy backward), an
 * all-gather that does not move itself: the head weight's forward gather, or an FSDP re-gather
 * that share_loss_gathers left (autodiff.c regather_swap)? It then moves too, to just before its
 * first reader that moves, where its own inputs allow (the forward's gather, earlier than that
 * reader already, stays where it is). */
static bool pulled_gather(const cprog *c, const unsigned char *mv, int a)
{
    return c->nodes[a].op == JDT_OP_ALL_GATHER && mv[a] != 1;
}

/*
 * Which nodes the loss's backward moves up (hoist_loss_backwards) and where: mv[i] 1 for a node
 * that moves, 2 for a constant (splat) or an FSDP re-gather (pulled_gather) one reads, which
 * moves with it; key[i] the index of the node it follows (its own index for a node that stays).
 * A node moves when it is a cross-entropy backward, or a view, slice, cast, add or GEMM reading
 * one that moves whose other inputs each move or depend on no cross-entropy backward (the
 * forward's values, leaves, constants, weight gathers). Its key is its last input's but those
 * pulled; a pulled node's, the least of its readers'. mv and key have c->n_nodes entries;
 * returns the number of nodes that move (mv 1).
 */
static int loss_moves(const cprog *c, unsigned char *mv, int *key)
{
    const int n = c->n_nodes;
    int moved = 0;
    bool any = false;
    for (int i = 0; i < n; i++) {
        mv[i] = 0;
        key[i] = i;
        any = any || is_xent_backward(c, &c->nodes[i]);
    }
    if (!any) return 0;
    /* mv[i] 3 while marking: node i stays but depends on a node that moves */
    for (int i = 0; i < n; i++) {
        const cnode *x = &c->nodes[i];
        bool reads = false, clean = true, tainted = false;
        for (int k = 0; k < x->n_in; k++) {
            const unsigned char m = mv[x->in[k]];
            reads = reads || m == 1;
            clean = clean && m != 3;
            tainted = tainted || m == 1 || m == 3;
        }
        bool kind_ok = x->kind == CK_VIEW || x->kind == CK_MAP || x->op == JDT_OP_MATMUL ||
                       x->op == JDT_OP_ADD || x->op == JDT_OP_CAST;
        mv[i] = is_xent_backward(c, x) || (reads && clean && kind_ok) ? 1 : tainted ? 3 : 0;
    }
    for (int i = 0; i < n; i++)
        if (mv[i] == 3) mv[i] = 0;
    for (int i = 0; i < n; i++) {
        if (mv[i] != 1) continue;
        int kk = 0;
        for (int k = 0; k < c->nodes[i].n_in; k++) {
            const int a = c->nodes[i].in[k];
            if (c->nodes[a].kind != CK_SPLAT && !pulled_gather(c, mv, a) && key[a] > kk)
                kk = key[a];
        }
        for (int k = 0; k < c->nodes[i].n_in; k++) { /* constants and re-gathers pulled up */
            const int a = c->nodes[i].in[k];
            if (c->nodes[a].kind == CK_SPLAT ||
                (pulled_gather(c, mv, a) && inputs_key(c, key, a) <= kk))
                mv[a] = 2;
            else if (key[a] > kk)
                kk = key[a];
        }
        key[i] = kk;
        moved++;
    }
    for (int i = n - 1; i >= 0; i--)
        for (int k = 0; k < c->nodes[i].n_in; k++) {
            const int a = c->nodes[i].in[k];
            if (mv[a] == 2 && key[i] < key[a]) key[a] = key[i];
        }
    return moved;
}

/* Can chain member a (an add of the sum rooted at root) be rewritten: an f32 add that moves,
 * of root's shape, read by one node only? */
static bool sum_link(const cprog *c, const unsigned char *mv, const int *users, int a, int root)
{
    const cnode *x = &c->nodes[a];
    return is_f32_add(x) && mv[a] == 1 && jdt_shape_eq(&x->shape, &c->nodes[root].shape) &&
           (a == root || users[a] == 1);
}

/*
 * Sums the moved terms of each gradient sum in the order their terms become available. Autodiff
 * adds a fanned-out node's cotangents in its reverse sweep, so the head's weight gradient (read
 * by every slice of runtime.loss_chunks) is dW_K + dW_{K-1} + ... + dW_1: the first add waits for
 * the last slice, and every slice's dW would live until then. Each chain of such adds (f32, one
 * reader each, all moving: loss_moves) is rewritten as a left fold of its terms by key, so that
 * hoist_loss_backwards can run each add right after its slice: ((dW_1 + dW_2) + dW_3) + ...
 * A chain already in that order is left as it is (the f32 sums of every other gradient). Runs
 * before the GEMM folds, which then fold each add into its slice's dW GEMM.
 */
static jdt_status order_loss_sums(cprog *c, jdt_err *e)
{
    const int n = c->n_nodes;
    unsigned char *mv = jdt_malloc((size_t)n + 1);
    int *key = jdt_malloc(sizeof(int) * ((size_t)n + 1)), *users = count_users(c);
    int *terms = jdt_malloc(sizeof(int) * ((size_t)n + 1)),
        *link = jdt_malloc(sizeof(int) * ((size_t)n + 1)),
        *adds = jdt_malloc(sizeof(int) * ((size_t)n + 1));
    jdt_status st = JDT_OK;
    if (!mv || !key || !users || !terms || !link || !adds) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "compile: ordering sums of %d nodes", n);
        goto out;
    }
    bool changed = false;
    unsigned char *live = NULL;
    if (loss_moves(c, mv, key) == 0) goto out;
    if (!(live = live_nodes(c))) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "compile: ordering sums of %d nodes", n);
        goto out;
    }
    for (int i = 0; i < n; i++) /* adds[i]: a live node reading node i (the one, as users[i]) */
        adds[i] = -1;
    for (int u = 0; u < n; u++)
        for (int k = 0; live[u] && k < c->nodes[u].n_in; k++)
            adds[c->nodes[u].in[k]] = u;
    for (int i = 0; i < n; i++) /* a dead add is no link: users[] counts live readers only */
        if (!live[i]) mv[i] = 0;
    jdt_free(live);
    for (int r = 0; r < n; r++) {
        /* a sum's root: a link whose reader is not a link of the same sum */
        if (!sum_link(c, mv, users, r, r)) continue;
        if (users[r] == 1 && adds[r] >= 0 && sum_link(c, mv, users, adds[r], adds[r])) continue;
        /* its adds (link) and terms, breadth first */
        int na = 0, nt = 0;
        link[na++] = r;
        for (int q = 0; q < na; q++) {
            const cnode *x = &c->nodes[link[q]];
            for (int k = 0; k < 2; k++) {
                const int a = x->in[k];
                if (sum_link(c, mv, users, a, r) && a != r)
                    link[na++] = a;
                else
                    terms[nt++] = a;
            }
        }
        if (nt < 3) continue;
        /* terms by key (then index); already a left fold in that order: nothing to do */
        for (int a = 1; a < nt; a++)
            for (int b = a;
                 b > 0 && (key[terms[b - 1]] > key[terms[b]] ||
                           (key[terms[b - 1]] == key[terms[b]] && terms[b - 1] > terms[b]));
                 b--) {
                int t = terms[b];
                terms[b] = terms[b - 1];
                terms[b - 1] = t;
            }
        for (int a = 1; a < na; a++) /* adds by index: the root last */
            for (int b = a; b > 0 && link[b - 1] > link[b]; b--) {
                int t = link[b];
                link[b] = link[b - 1];
                link[b - 1] = t;
            }
        bool fold = c->nodes[link[0]].in[0] == terms[0] && c->nodes[link[0]].in[1] == terms[1];
        for (int a = 1; a < na && fold; a++)
            fold =
                c->nodes[link[a]].in[0] == link[a - 1] && c->nodes[link[a]].in[1] == terms[a + 1];
        if (fold) continue;
        c->nodes[link[0]].in[0] = terms[0];
        c->nodes[link[0]].in[1] = terms[1];
        for (int a = 1; a < na; a++) {
            c->nodes[link[a]].in[0] = link[a - 1];
            c->nodes[link[a]].in[1] = terms[a + 1];
        }
        changed = true;
    }
    if (changed) st = order_inputs_first(c, e);
out:
    jdt_free(mv), jdt_free(key), jdt_free(users), jdt_free(terms), jdt_free(link), jdt_free(adds);
    return st;
}

/*
 * FSDP's re-gather of the head's weight (autodiff.c regather_swap: a fresh all-gather for the
 * dX GEMM, so that the forward's gathered copy dies after the forward) is of no use where the
 * loss's backward runs next to its forward (hoist_loss_backwards): the forward's copy is still
 * live there. Each moving reader (loss_moves) of a re-gather (a recomputed ALL_GATHER: cnode.src
 * set) reads the forward's identical gather instead, which then lives until the head's last
 * dX GEMM; a re-gather left without readers goes with DCE. One collective fewer a step, and one
 * gathered weight live at a time instead of two. Runs before the folds.
 */
static jdt_status share_loss_gathers(cprog *c, jdt_err *e)
{
    const int n = c->n_nodes;
    unsigned char *mv = jdt_malloc((size_t)n + 1);
    int *key = jdt_malloc(sizeof(int) * ((size_t)n + 1));
    if (!mv || !key) {
        jdt_free(mv), jdt_free(key);
        return jdt_err_set(e, JDT_ERR_NOMEM, "compile: sharing gathers of %d nodes", n);
    }
    if (loss_moves(c, mv, key) > 0)
        for (int i = 0; i < n; i++) {
            cnode *r = &c->nodes[i];
            if (mv[i] != 1) continue;
            for (int k = 0; k < r->n_in; k++) {
                const cnode *a = &c->nodes[r->in[k]];
                if (a->op != JDT_OP_ALL_GATHER || !a->src) continue;
                for (int j = r->in[k] - 1; j >= 0; j--) { /* the nearest identical gather */
                    const cnode *f = &c->nodes[j];
                    if (f->op == JDT_OP_ALL_GATHER && !f->src && f->dtype == a->dtype &&
                        f->n_in == a->n_in && f->in[0] == a->in[0] &&
                        jdt_shape_eq(&f->shape, &a->shape) &&
                        memcmp(&f->attrs, &a->attrs, sizeof f->attrs) == 0) {
                        r->in[k] = j;
                        break;
                    }
                }
            }
        }
    jdt_free(mv), jdt_free(key);
    return JDT_OK;
}

/*
 * Runs each cross-entropy's backward right after its forward (runtime.loss_chunks, models.c
 * gpt_loss): the backward's pass over the logits (SOFTMAX_XENT_BWD, or the fused classifier's
 * dlogits co-output), the views and casts of its dlogits (the bf16 cotangent), the GEMMs
 * reading them (the head's dX and dW) and the adds summing those dW over the slices
 * (order_loss_sums) move up to just after their last input (loss_moves), so a slice's dlogits
 * die before the next slice's logits are made; under FSDP the head weight's re-gather for the
 * dX GEMM comes up with them. Nothing is computed before its inputs, and nothing else of the
 * backward is pulled up. A moved node is marked (cnode.hoisted) so that it joins no reader's
 * fusion group, which would run it at the group's root. The values are the same; only the
 * schedule (node order, fuse.c) changes. Runs before the folds (after order_loss_sums) and again
 * after DCE. stats.n_loss_slices: the cross-entropy backwards, where there are several.
 */
static jdt_status hoist_loss_backwards(cprog *c, jdt_err *e)
{
    const int n = c->n_nodes;
    unsigned char *mv = jdt_malloc((size_t)n + 1);
    int *key = jdt_malloc(sizeof(int) * ((size_t)n + 1)),
        *order = jdt_malloc(sizeof(int) * ((size_t)n + 1)),
        *start = jdt_calloc((size_t)n + 2, sizeof(int));
    jdt_status st = JDT_OK;
    if (!mv || !key || !order || !start) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "compile: scheduling %d nodes", n);
        goto out;
    }
    if (loss_moves(c, mv, key) == 0) goto out;
    /* order: by key, the node that stays at a key before those that follow it, ties by index
     * (a counting sort: keys < n) */
    for (int i = 0; i < n; i++)
        start[key[i] + 1]++;
    for (int i = 0; i < n; i++)
        start[i + 1] += start[i];
    for (int i = 0; i < n; i++)
        if (!mv[i]) order[start[key[i]]++] = i;
    for (int i = 0; i < n; i++)
        if (mv[i]) order[start[key[i]]++] = i;
    int slices = 0, moved = 0;
    for (int i = 0; i < n; i++) {
        slices += is_xent_backward(c, &c->nodes[i]);
        moved += order[i] != i;
    }
    for (int i = 0; i < n; i++)
        c->nodes[i].hoisted = mv[i] == 1;
    if (moved) st = apply_order(c, order, e);
    if (st == JDT_OK && slices > 1) c->stats.n_loss_slices = slices;
out:
    jdt_free(mv), jdt_free(key), jdt_free(order), jdt_free(start);
    return st;
}

/* The one node reading node i (users[i] == 1) among those after it, or -1. */
static int sole_reader(const cprog *c, const int *users, int i)
{
    if (users[i] != 1) return -1;
    for (int j = i + 1; j < c->n_nodes; j++)
        for (int k = 0; k < c->nodes[j].n_in; k++)
            if (c->nodes[j].in[k] == i) return j;
    return -1;
}

/* Is t a (0, 2, 1, 3) transpose of a 4-D tensor, (B, H, T, D) <-> (B, T, H, D): the head split
 * the attention and RoPE kernels can read or write through their layout flags? */
static bool is_head_transpose(const cnode *t)
{
    return t->op == JDT_OP_TRANSPOSE && t->shape.ndim == 4 && t->attrs.i[0] == 0 &&
           t->attrs.i[1] == 2 && t->attrs.i[2] == 1 && t->attrs.i[3] == 3;
}

/* Node `sum` becomes a view of a new REDUCE_SUM of node src over every axis but the last (its
 * column sums). False when out of memory. */
static bool sum_columns_of(cprog *c, int sum, int src)
{
    const jdt_shape *s = &c->nodes[src].shape;
    const int nd = s->ndim;
    cnode red = {
        .op = JDT_OP_REDUCE_SUM, .dtype = JDT_DTYPE_F32, .n_in = 1, .in = {src}, .kind = CK_REDUCE};
    red.attrs.i[0] = (((int64_t)1 << nd) - 1) - ((int64_t)1 << (nd - 1));
    red.shape.ndim = 1;
    red.shape.dims[0] = s->dims[nd - 1];
    const int ri = append_node(c, &red);
    if (ri < 0) return false;
    to_view(&c->nodes[sum], ri); /* the old sum: a view of the new one */
    return true;
}

/* Node `sum` (a column sum over every row of a (d0, ..., C) tensor) becomes a view of the sum
 * over k partial rows instead: slots [slot, slot + k) of axis 0 of packed node pi, whose builtin
 * writes per-block column sums there (fold_norm_partials, fold_norm_cotangents). `like` is the
 * full tensor's shape. False when out of memory. */
static bool sum_partials(cprog *c, int sum, int pi, const jdt_shape *like, int64_t slot, int64_t k)
{
    cnode part = {.op = JDT_OP_SLICE,
                  .dtype = JDT_DTYPE_F32,
                  .shape = *like,
                  .n_in = 1,
                  .in = {pi},
                  .kind = CK_MAP};
    part.shape.dims[0] = k;
    part.attrs.i[1] = slot;
    part.attrs.i[2] = slot + k;
    const int si = append_node(c, &part);
    return si >= 0 && sum_columns_of(c, sum, si);
}

/* Node `sum` (a column sum over every row of a (rows, n) tensor) becomes a view of the sum over
 * the first k rows of n columns of packed node pi, read in place through a prefix view (k, n)
 * (fold_attention_cotangents: grouped-query attention's dq partials, which are wider than the
 * packed node's rows). False when out of memory. */
static bool sum_prefix_partials(cprog *c, int sum, int pi, int64_t k, int64_t n)
{
    cnode rows = {.dtype = JDT_DTYPE_F32, .shape = {.ndim = 2, .dims = {k, n}}};
    to_view(&rows, pi);
    const int vi = append_node(c, &rows);
    return vi >= 0 && sum_columns_of(c, sum, vi);
}

/* Partial rows per norm backward (passes.c fold_norm_partials): enough blocks to fill a GPU,
 * few enough that their sums are a small read. */
#define NORM_PARTIALS 1024

/* The affine's gradients summed by the norm backward (c->norm_bwd_partials: CUDA). After
 * fold_norm_scales a layer norm's backward reads x through three kernels: dx =
 * NORMALIZE_BWD(x, dy, w), dw = REDUCE_SUM(dy * xhat) (xhat = NORMALIZE(x), stored by the
 * forward for it) and db = REDUCE_SUM(dy), each over every row. The builtin already walks x
 * and dy row by row; it now also sums, per block of rows, dy * xhat and dy per column, and
 * writes those P partial rows after dx in one packed output (attrs i[0] = P): (d0 + 2k, ..., C)
 * for dx's (d0, ..., C), k slots of axis 0 (S rows each, P = k S) for dw's partials, k for
 * db's. dx becomes a view of its first d0 slots (a prefix: contiguous, so fused kernels and
 * builtins read it in place), dw and db reductions over the slices [d0, d0 + k) and [d0 + k,
 * d0 + 2k): P rows
 * instead of all, and nothing reads xhat in the backward any more. Same for RMS_NORMALIZE_BWD
 * (dw only; xhat = x * rstd). When dx's one reader adds it to a tensor computed before (the
 * residual stream's cotangent), the builtin takes that as a fourth input and the add's result
 * is the slice instead: the add's kernel (two full reads and a write) goes for one read. The
 * sums change order (per block, then over the blocks); each term is the same f32 product, and
 * the add the same f32 add. Skipped with no_fuse. */
static jdt_status fold_norm_partials(cprog *c, jdt_err *e)
{
    int *users = count_users(c);
    if (!users) return jdt_err_set(e, JDT_ERR_NOMEM, "compile: norm gradient partials");
    const int n0 = c->n_nodes;
    int folded = 0;
    for (int i = 0; i < n0; i++) {
        const cnode nb = c->nodes[i];
        const bool rms = nb.op == JDT_OP_RMS_NORMALIZE_BWD;
        if ((nb.op != JDT_OP_NORMALIZE_BWD && !rms) || nb.kind != CK_BUILTIN || nb.n_in != 3 ||
            nb.attrs.i[0] != 0 || nb.dtype != JDT_DTYPE_F32 || nb.shape.ndim < 2)
            continue;
        const int nd = nb.shape.ndim;
        const int64_t C = nb.shape.dims[nd - 1], numel = jdt_shape_numel(&nb.shape);
        if (C < 1 || C > c->norm_bwd_partials || numel < 1) continue;
        const int xr = view_root(c, nb.in[0]), dyr = view_root(c, nb.in[1]);
        /* dw: REDUCE_SUM(MUL(dy, xhat)), the product read by nothing else, xhat the same norm
         * of the same x (views followed) */
        int dw = -1, db = -1;
        for (int r = 0; r < n0 && dw < 0; r++) {
            const cnode *red = &c->nodes[r];
            if (red->op != JDT_OP_REDUCE_SUM || red->kind != CK_REDUCE) continue;
            const cnode *mul = &c->nodes[red->in[0]];
            if (mul->op != JDT_OP_MUL || mul->kind != CK_EW || mul->n_in != 2 ||
                users[red->in[0]] != 1)
                continue;
            for (int side = 0; side < 2; side++) {
                const int xh = view_root(c, mul->in[1 - side]);
                const cnode *f = &c->nodes[xh];
                if (view_root(c, mul->in[side]) != dyr ||
                    f->op != (rms ? JDT_OP_RMS_NORMALIZE : JDT_OP_NORMALIZE) ||
                    f->kind != CK_BUILTIN || view_root(c, f->in[0]) != xr ||
                    f->attrs.f[0] != nb.attrs.f[0] || f->dtype != JDT_DTYPE_F32 ||
                    !jdt_shape_eq(&c->nodes[mul->in[side]].shape, &mul->shape) ||
                    !jdt_shape_eq(&c->nodes[mul->in[1 - side]].shape, &mul->shape))
                    continue;
                if (column_sums_of(c, r, red->in[0], C, numel)) dw = r;
                break;
            }
        }
        if (dw < 0) continue;
        const int prod = c->nodes[dw].in[0];
        for (int r = 0; r < n0 && db < 0 && !rms; r++)
            if (column_sums_of(c, r, dyr, C, numel)) db = r;

        /* dx read only by an add of a tensor of its shape computed before (the residual
         * stream's cotangent): the kernel adds it as it writes dx, and the add's kernel goes */
        int acc = -1;
        const int ai = sole_reader(c, users, i);
        if (ai >= 0) {
            const cnode *a = &c->nodes[ai];
            const int r = a->n_in == 2 ? a->in[a->in[0] == i ? 1 : 0] : -1;
            if (a->op == JDT_OP_ADD && a->kind == CK_EW && a->n_in == 2 &&
                a->dtype == JDT_DTYPE_F32 && jdt_shape_eq(&a->shape, &nb.shape) &&
                (a->in[0] == i) != (a->in[1] == i) && c->nodes[r].dtype == JDT_DTYPE_F32 &&
                jdt_shape_eq(&c->nodes[r].shape, &nb.shape) && c->nodes[r].kind != CK_SPLAT &&
                c->nodes[r].kind != CK_MAP && (r < i || c->nodes[r].kind == CK_LEAF))
                acc = r;
        }
        /* the packing: S rows per index of axis 0, k indices per partial block */
        const int64_t d0 = nb.shape.dims[0], S = numel / C / d0;
        int64_t k = (NORM_PARTIALS + S - 1) / S;
        if (k > d0) k = d0;
        cnode packed = nb;
        packed.shape.dims[0] = d0 + 2 * k;
        packed.attrs.i[0] = k * S;
        if (acc >= 0) packed.in[packed.n_in++] = acc;
        const int pi = append_node(c, &packed);
        if (pi < 0) goto nomem;
        int sums[2] = {dw, db};
        for (int q = 0; q < 2; q++)
            if (sums[q] >= 0 && !sum_partials(c, sums[q], pi, &nb.shape, d0 + q * k, k)) goto nomem;
        /* dx (plus acc): the packed output's first elements, a view (the one kind whose input
         * holds more elements than it), so builtins read it in place too */
        cnode dxv = nb;
        to_view(&dxv, pi);
        if (acc >= 0) { /* the add's value is the view's; nothing reads the old node */
            c->nodes[ai] = dxv;
            c->nodes[i].n_in = 0; /* its inputs are the packed node's now: counts unchanged */
            unread(c, users, i);
            c->stats.n_norm_acc_folded++;
        } else {
            c->nodes[i] = dxv;
        }
        unread(c, users, prod); /* dy * xhat: xhat's reader no more (fold_norm_affines) */
        folded++;
    }
    jdt_free(users);
    c->stats.n_norm_partials_folded += folded;
    return folded ? order_inputs_first(c, e) : JDT_OK;
nomem:
    jdt_free(users);
    return jdt_err_set(e, JDT_ERR_NOMEM, "compile: norm gradient partials");
}

/* A packed norm backward's output g (fold_norm_partials: dx, plus the residual's cotangent when
 * it took that) is the input cotangent of the linear layer before the norm's reader in the
 * forward: GPT-2's attention and MLP projections. Their backward reads g twice more: the bias
 * gradient, a column-sum reduction of g, and the bf16 GEMMs' copy, CAST(g, bf16) (ops.c
 * vjp_MATMUL; one kernel stores both, fuse.c fuse_reduce_siblings). The builtin, which holds
 * each value of g as it writes it, does both (c->norm_bwd_partials: CUDA's _part kernels): the
 * column sums per block of rows into k more slots of its packed output (attrs i[1] = 1; the
 * reduction then sums P rows, as for dw and db), and the copy as its co-output (CK_COOUT): the
 * f32 g is no longer read for them (4 bytes per element of each of GPT-2's 24, ~2.4 GB per step
 * at B 32), and no kernel stores the copy. The copy is the same rounding of the same value;
 * the bias gradient's sum changes order (per block, then over the blocks). Skipped with
 * no_fuse. */
static jdt_status fold_norm_cotangents(cprog *c, jdt_err *e)
{
    const int n0 = c->n_nodes;
    int folded = 0;
    for (int pi = 0; pi < n0; pi++) {
        const cnode *nb = &c->nodes[pi];
        if ((nb->op != JDT_OP_NORMALIZE_BWD && nb->op != JDT_OP_RMS_NORMALIZE_BWD) ||
            nb->kind != CK_BUILTIN || nb->attrs.i[0] <= 0 || nb->attrs.i[1] != 0 || nb->co)
            continue;
        int v = -1; /* g: the view of the packed output's first slots */
        for (int j = pi + 1; j < n0 && v < 0; j++)
            if (c->nodes[j].kind == CK_VIEW && c->nodes[j].in[0] == pi) v = j;
        if (v < 0) continue;
        const jdt_shape *gs = &c->nodes[v].shape;
        const int nd = gs->ndim;
        const int64_t C = gs->dims[nd - 1], numel = jdt_shape_numel(gs), d0 = gs->dims[0],
                      k = (nb->shape.dims[0] - d0) / 2;
        int sum = -1, copy = -1;
        for (int r = v + 1; r < n0; r++) {
            const cnode *x = &c->nodes[r];
            if (sum < 0 && column_sums_of(c, r, pi, C, numel)) sum = r;
            if (copy < 0 && x->op == JDT_OP_CAST && x->kind == CK_EW &&
                x->dtype == JDT_DTYPE_BF16 && c->nodes[x->in[0]].dtype == JDT_DTYPE_F32 &&
                view_root(c, x->in[0]) == pi && jdt_shape_numel(&x->shape) == numel)
                copy = r;
        }
        if (sum < 0 && copy < 0) continue;
        if (sum >= 0) { /* k more partial rows: the sums of g, reduced over P rows */
            c->nodes[pi].shape.dims[0] += k;
            c->nodes[pi].attrs.i[1] = 1;
            if (!sum_partials(c, sum, pi, gs, d0 + 2 * k, k)) goto nomem;
        }
        if (copy >= 0) make_co_output(c, pi, copy); /* written by the builtin's step */
        c->stats.n_norm_cotangents_folded++;
        folded++;
    }
    return folded ? order_inputs_first(c, e) : JDT_OK;
nomem:
    return jdt_err_set(e, JDT_ERR_NOMEM, "compile: norm cotangent folding");
}

/* The norms apply their affine (c->norm_bwd_partials: CUDA, whose norm backwards no longer read
 * xhat, fold_norm_partials): y = NORMALIZE(x) * w (+ b), xhat read by nothing else and w, b
 * one value per column broadcast along the rows (models.c norm), becomes NORMALIZE(x, w[, b])
 * (RMS_NORMALIZE likewise) and the affine's result a view of it. The norm's kernel computes the
 * same f32 xhat and applies the affine as it stores, so xhat's buffer (f32, a full write and
 * read) and the affine's kernel go; y is stored as bf16 when only bf16 GEMMs read it, as the
 * affine's kernel stored it (fuse.c mark_bf16_storage). Skipped with no_fuse. */
static jdt_status fold_norm_affines(cprog *c, jdt_err *e)
{
    int *users = count_users(c);
    if (!users) return jdt_err_set(e, JDT_ERR_NOMEM, "compile: norm affines");
    for (int i = 0; i < c->n_nodes; i++) {
        cnode *f = &c->nodes[i];
        if ((f->op != JDT_OP_NORMALIZE && f->op != JDT_OP_RMS_NORMALIZE) || f->kind != CK_BUILTIN ||
            f->n_in != 1 || f->dtype != JDT_DTYPE_F32 || f->shape.ndim < 1)
            continue;
        const int64_t C = f->shape.dims[f->shape.ndim - 1];
        const int mi = sole_reader(c, users, i);
        if (mi < 0) continue;
        const cnode *m = &c->nodes[mi];
        if (m->op != JDT_OP_MUL || m->kind != CK_EW || m->n_in != 2 || m->dtype != JDT_DTYPE_F32 ||
            !jdt_shape_eq(&m->shape, &f->shape))
            continue;
        const int w = row_vector(c, m->in[m->in[0] == i ? 1 : 0], C, i);
        if (w < 0 || (m->in[0] == i) == (m->in[1] == i)) continue;
        /* the shift, when the product's one reader adds a row vector to it */
        int top = mi, b = -1;
        const int ai = sole_reader(c, users, mi);
        if (ai >= 0) {
            const cnode *a = &c->nodes[ai];
            if (a->op == JDT_OP_ADD && a->kind == CK_EW && a->n_in == 2 &&
                a->dtype == JDT_DTYPE_F32 && jdt_shape_eq(&a->shape, &f->shape) &&
                (a->in[0] == mi) != (a->in[1] == mi) &&
                (b = row_vector(c, a->in[a->in[0] == mi ? 1 : 0], C, i)) >= 0)
                top = ai;
        }
        f->in[1] = w;
        f->n_in = 2;
        if (b >= 0) f->in[f->n_in++] = b;
        users[w]++;
        if (b >= 0) users[b]++;
        if (top != mi) unread(c, users, mi);
        to_view(&c->nodes[top], i);
        c->stats.n_norm_affines_folded++;
    }
    jdt_free(users);
    return JDT_OK;
}

/* The GELU of a linear layer by its GEMM (c->gemm_gelu: CUDA, cuBLASLt's GELU_AUX_BIAS
 * epilogue). Under precision.activations: bf16 the MLP is u = bf16(x @ W + b), g = GELU(u) (a
 * bf16 node, models.c): after fold_bf16_casts a bf16 MATMUL m read only through the CAST's view
 * v, which GELU and, in the backward, GELU_GRAD read. m gets attrs i[4] and twice the rows: its
 * output packs g and then u, both bf16 (the epilogue writes GELU's input to the aux matrix); g
 * becomes a view of the first half (what the projection's GEMMs read, in place) and v the
 * slice of the second (composed into the fused kernels that read it; any other kind of reader
 * and the fold is skipped). The GELU kernel (a read and a write of the (rows, 4C) bf16 tensor)
 * goes. The epilogue applies GELU to the f32 sum before rounding where the graph rounds u
 * first: g may differ from the CPU's by one bf16 step (jdt_cuk_matmul_bf16_gelu's fallback
 * keeps the graph's order). Skipped with no_fuse. */
static jdt_status fold_gelu_epilogues(cprog *c, jdt_err *e)
{
    int *users = count_users(c);
    if (!users) return jdt_err_set(e, JDT_ERR_NOMEM, "compile: GELU epilogues");
    for (int i = 0; i < c->n_nodes; i++) {
        cnode *m = &c->nodes[i];
        if (m->op != JDT_OP_MATMUL || m->kind != CK_BUILTIN || m->dtype != JDT_DTYPE_BF16 ||
            !m->attrs.i[2] || m->attrs.i[3] || m->attrs.i[4] || m->shape.ndim != 2)
            continue;
        /* the views (the bias add's, the CAST's) down to the last, each read only by the next */
        int vi = sole_reader(c, users, i), next;
        while (vi >= 0 && c->nodes[vi].kind == CK_VIEW && (next = sole_reader(c, users, vi)) >= 0 &&
               c->nodes[next].kind == CK_VIEW)
            vi = next;
        if (vi < 0 || c->nodes[vi].kind != CK_VIEW || c->nodes[vi].dtype != JDT_DTYPE_BF16 ||
            !jdt_shape_eq(&c->nodes[vi].shape, &m->shape))
            continue;
        int g = -1;
        bool ok = true;
        for (int j = vi + 1; j < c->n_nodes && ok; j++) {
            const cnode *r = &c->nodes[j];
            bool reads = false;
            for (int k = 0; k < r->n_in; k++)
                reads = reads || r->in[k] == vi;
            if (!reads) continue;
            if (r->op == JDT_OP_GELU && r->kind == CK_EW && r->dtype == JDT_DTYPE_BF16 && g < 0)
                g = j;
            else
                ok = r->kind == CK_EW || r->kind == CK_REDUCE;
        }
        if (!ok || g < 0) continue;
        const int64_t M = m->shape.dims[0];
        m->shape.dims[0] = 2 * M;
        m->attrs.i[4] = 1;
        cnode *v = &c->nodes[vi]; /* u: the second half (the views between go unread) */
        v->op = JDT_OP_SLICE;
        v->kind = CK_MAP;
        v->in[0] = i;
        memset(&v->attrs, 0, sizeof v->attrs);
        v->attrs.i[1] = M;
        v->attrs.i[2] = 2 * M;
        users[vi]--;
        to_view(&c->nodes[g], i); /* GELU(u): the first M rows */
        users[i]++;
        c->stats.n_gelu_epilogues++;
    }
    jdt_free(users);
    return JDT_OK;
}

/* The GELU backward by the GEMM computing its cotangent (c->gemm_gelu: CUDA, cuBLASLt's DGELU
 * epilogue), after fold_gelu_epilogues: GELU_GRAD(f32(u), f32(d)), u the second half of a
 * GELU-folded MATMUL (the forward's GELU input) and d the bf16 output of a MATMUL read by
 * nothing else (the projection's input gradient, rounded to bf16 by its GEMM: vjp_MATMUL). That
 * GEMM takes the folded MATMUL as a last input (attrs i[5], cnode_mm_aux) and writes d GELU'(u)
 * as bf16 instead of d; GELU_GRAD becomes the f32 widening of that, and a bf16 CAST of it (the
 * copy the fc layer's GEMMs read) a view. The fused kernel that read u and d and wrote the copy
 * goes for the GEMM's read of u. Numbers: the epilogue multiplies the f32 product before any
 * rounding, where the graph rounds d first. The bias gradient, a column sum of the product, is
 * then the GEMM's co-output (CK_COOUT; CUBLASLT_EPILOGUE_DGELU_BGRAD, stats.n_dgelu_bgrads): it
 * sums the f32 values before their rounding to bf16, where the graph sums the rounded ones
 * (autocast's order); the reduction's read of the (rows, 4C) product goes. Skipped with
 * no_fuse. */
static jdt_status fold_dgelu_epilogues(cprog *c, jdt_err *e)
{
    int *users = count_users(c);
    if (!users) return jdt_err_set(e, JDT_ERR_NOMEM, "compile: GELU backward epilogues");
    for (int i = 0; i < c->n_nodes; i++) {
        cnode *gg = &c->nodes[i];
        if (gg->op != JDT_OP_GELU_GRAD || gg->kind != CK_EW || gg->n_in != 2 ||
            gg->dtype != JDT_DTYPE_F32 || !is_widening(c, gg->in[0]) ||
            !is_widening(c, gg->in[1]) || users[gg->in[1]] != 1)
            continue;
        const int ux = gg->in[0], dx = gg->in[1], v = c->nodes[ux].in[0], t = c->nodes[dx].in[0];
        const cnode *vn = &c->nodes[v];
        if (vn->op != JDT_OP_SLICE || vn->kind != CK_MAP) continue;
        const int fi = vn->in[0];
        const cnode *f = &c->nodes[fi];
        if (f->op != JDT_OP_MATMUL || !f->attrs.i[4] || vn->attrs.i[0] != 0 ||
            vn->attrs.i[1] != cnode_mm_rows(f) || users[t] != 1)
            continue;
        int mi = t; /* d's GEMM, down the views only this chain reads */
        while (c->nodes[mi].kind == CK_VIEW && users[c->nodes[mi].in[0]] == 1)
            mi = c->nodes[mi].in[0];
        cnode *m = &c->nodes[mi];
        if (m->op != JDT_OP_MATMUL || m->kind != CK_BUILTIN || m->dtype != JDT_DTYPE_BF16 ||
            !m->attrs.i[2] || m->attrs.i[3] || m->attrs.i[4] || m->attrs.i[5] || m->n_in != 2 ||
            m->shape.ndim != 2 || !jdt_shape_eq(&m->shape, &vn->shape) ||
            !jdt_shape_eq(&c->nodes[t].shape, &gg->shape) || fi > mi)
            continue;
        m->in[m->n_in++] = fi;
        m->attrs.i[5] = 1;
        users[fi]++;
        unread(c, users, dx); /* d's widening: GELU_GRAD's place is taken by the product's */
        if (--users[ux] == 0) unread(c, users, ux);
        gg->op = JDT_OP_CAST;
        gg->n_in = 1;
        gg->in[0] = t;
        memset(&gg->attrs, 0, sizeof gg->attrs);
        users[t]++;
        for (int j = i + 1; j < c->n_nodes; j++) { /* bf16 copies of it: the product itself */
            cnode *r = &c->nodes[j];
            if (r->op == JDT_OP_CAST && r->kind == CK_EW && r->n_in == 1 && r->in[0] == i &&
                r->dtype == JDT_DTYPE_BF16 && jdt_shape_eq(&r->shape, &c->nodes[t].shape)) {
                users[i]--;
                to_view(r, t);
                users[t]++;
            }
        }
        c->stats.n_dgelu_epilogues++;
        /* the fc bias gradient, the column sums of d GELU'(u): the GEMM's co-output
         * (cuBLASLt's DGELU_BGRAD), no longer a reduction reading the product back */
        const int64_t N = m->shape.dims[1], numel = jdt_shape_numel(&m->shape);
        for (int r = i + 1; r < c->n_nodes && !m->co; r++) {
            if (!column_sums_of(c, r, i, N, numel) || is_result(c, r)) continue;
            int x = c->nodes[r].in[0];
            if (--users[x] == 0 && x != i) unread(c, users, x);
            make_co_output(c, mi, r);
            users[mi]++;
            c->stats.n_dgelu_bgrads++;
        }
    }
    jdt_free(users);
    return JDT_OK;
}

/* A builtin that can add a tensor of its result's shape to that result: `takes` says whether
 * builtin f (reached through views when `viewed`) may take x so, `flag` is the attrs slot that
 * marks it (the last input is then the addend) or -1 when its input count says so. */
typedef struct {
    bool (*takes)(const cnode *f, const cnode *x, bool viewed);
    int flag;
} addend_rule;

/* Can builtin fi (f32, its result read through views as add a's operand) take x = node xi,
 * the add's other operand, as an input added to its result: x an f32 tensor of a's shape,
 * materialised, and valid at fi (inputs precede their users, except leaves, valid before the
 * first step)? The op's own rule (addend_rule.takes) comes on top. */
static bool addend_fits(const cprog *c, const cnode *a, int fi, int xi)
{
    const cnode *f = &c->nodes[fi], *x = &c->nodes[xi];
    return f->kind == CK_BUILTIN && f->dtype == JDT_DTYPE_F32 && f->n_in < JDT_MAX_INPUTS &&
           jdt_shape_numel(&f->shape) == jdt_shape_numel(&a->shape) &&
           jdt_shape_eq(&x->shape, &a->shape) && x->dtype == JDT_DTYPE_F32 && x->kind != CK_SPLAT &&
           !(xi > fi && x->kind != CK_LEAF);
}

/* y = x + f(...), f a builtin that `rule` lets take x: f's result read by nothing else (through
 * views) and f32, x an f32 tensor of y's shape materialised before f. f gets x as its last
 * input and the add becomes a view of f's result: the add's kernel (two full reads, a write)
 * goes for one read inside f. *n_folded counts them (NULL: not counted). */
static jdt_status fold_addends(cprog *c, addend_rule rule, int *n_folded, jdt_err *e)
{
    int *users = count_users(c);
    if (!users) return jdt_err_set(e, JDT_ERR_NOMEM, "compile: folding adds into builtins");
    for (int i = 0; i < c->n_nodes; i++) {
        cnode *a = &c->nodes[i];
        if (!is_f32_add(a)) continue;
        for (int side = 0; side < 2; side++) {
            const int top = a->in[side], xi = a->in[1 - side];
            const int fi = view_base(c, users, top);
            cnode *f = &c->nodes[fi];
            if (users[top] != 1 || !addend_fits(c, a, fi, xi) ||
                !rule.takes(f, &c->nodes[xi], fi != top))
                continue;
            f->in[f->n_in++] = xi;
            if (rule.flag >= 0) f->attrs.i[rule.flag] = 1;
            to_view(a, top);
            if (n_folded) (*n_folded)++;
            break;
        }
    }
    jdt_free(users);
    return JDT_OK;
}

/* The most bf16 GEMM products a norm backward sums into its dy (fold_norm_dy_terms): the q, k
 * and v projections' dX (GPT-2, Llama's ln1), or the gate's and the up projection's (Llama's
 * ln2). cuda.c and the _part kernels take as many. */
#define NORM_DY_TERMS 3

/* Is m the f32 product of a bf16-compute GEMM builtin with no bias, addend or epilogue: one
 * whose GEMM can store it as bf16 instead (cuBLASLt's D type, nearest even)? */
static bool plain_bf16_product(const cnode *m)
{
    return m->op == JDT_OP_MATMUL && m->kind == CK_BUILTIN && m->attrs.i[2] &&
           m->dtype == JDT_DTYPE_F32 && m->n_in == 2 && !m->attrs.i[3] && !m->attrs.i[4] &&
           !m->attrs.i[5];
}

/* Node i, through reshape views each read once, a plain_bf16_product read by nothing else:
 * that GEMM's index, else -1. */
static int plain_bf16_gemm(const cprog *c, const int *users, int i)
{
    if (users[i] != 1) return -1;
    while (c->nodes[i].kind == CK_VIEW && c->nodes[i].op == JDT_OP_RESHAPE &&
           users[c->nodes[i].in[0]] == 1)
        i = c->nodes[i].in[0];
    return plain_bf16_product(&c->nodes[i]) ? i : -1;
}

/* The operands of the f32 sum at node i (reshape views and ADDs of numel elements, each read
 * once, taken apart) into t[*n..]: false when there are more than NORM_DY_TERMS. */
static bool sum_terms(const cprog *c, const int *users, int i, int64_t numel, int *t, int *n)
{
    int r = i;
    while (c->nodes[r].kind == CK_VIEW && c->nodes[r].op == JDT_OP_RESHAPE && users[r] == 1)
        r = c->nodes[r].in[0];
    const cnode *a = &c->nodes[r];
    if (is_f32_add(a) && users[r] == 1 && jdt_shape_numel(&a->shape) == numel &&
        a->in[0] != a->in[1])
        return sum_terms(c, users, a->in[0], numel, t, n) &&
               sum_terms(c, users, a->in[1], numel, t, n);
    if (*n == NORM_DY_TERMS) return false;
    t[(*n)++] = i;
    return true;
}

/* A norm backward in its partial-sums form whose dy is a sum of bf16-compute GEMM products, the
 * input cotangents of the linear layers that read the norm's output (GPT-2's q, k and v
 * projections; Llama's also its gate and up projections), each read by that sum alone (c->
 * norm_dy_terms: CUDA, unless JDT_NORM_DY_TERMS=0). fold_addends would chain those GEMMs
 * through cuBLASLt's C (beta 1) in f32: on the H200, GPT-2 124M's two accumulating dX GEMMs
 * (32768 x 768 x 768) took 0.14 ms each against 0.061 for the same GEMM storing bf16 (run 2,
 * docs/perf.md), the f32 C read and D written being most of their time. Here each GEMM stores
 * its product as bf16 instead (cuBLASLt's D type, nearest even), and the norm backward reads
 * all of them (the first as dy, the others as its last inputs, attrs i[2] their count) and adds
 * them in f32 as it loads: 150 MB of bf16 reads per layer at B 32 instead of the chain's 500
 * MB. Each term is rounded to bf16 before the sum, as autocast's dX is (PyTorch's fused qkv
 * GEMM returns one bf16 dX); the sum is f32 in the terms' order. Runs before fold_addends.
 * Skipped with no_fuse. */
static jdt_status fold_norm_dy_terms(cprog *c, jdt_err *e)
{
    int *users = count_users(c);
    if (!users) return jdt_err_set(e, JDT_ERR_NOMEM, "compile: norm dy terms");
    for (int ni = 0; ni < c->n_nodes; ni++) {
        cnode *nb = &c->nodes[ni];
        if ((nb->op != JDT_OP_NORMALIZE_BWD && nb->op != JDT_OP_RMS_NORMALIZE_BWD) ||
            nb->kind != CK_BUILTIN || nb->attrs.i[0] <= 0 || nb->attrs.i[2] != 0 || nb->n_in < 3 ||
            nb->n_in + NORM_DY_TERMS - 1 > JDT_MAX_INPUTS)
            continue;
        const int dy = nb->in[1];
        const int64_t numel = jdt_shape_numel(&c->nodes[dy].shape);
        int t[NORM_DY_TERMS], n = 0, m[NORM_DY_TERMS];
        if (!sum_terms(c, users, dy, numel, t, &n) || n < 2) continue;
        bool ok = true;
        for (int q = 0; q < n && ok; q++)
            ok = (m[q] = plain_bf16_gemm(c, users, t[q])) >= 0 &&
                 jdt_shape_numel(&c->nodes[t[q]].shape) == numel;
        if (!ok) continue;
        /* the GEMMs store bf16, the norm reads the terms, and the sum's ADDs and views (read
         * by nothing now) go, down to the terms the norm reads */
        for (int q = 0; q < n; q++) {
            store_bf16(c, t[q], m[q]);
            users[t[q]]++;
        }
        users[dy]--;
        unread_dead(c, users, dy);
        nb = &c->nodes[ni];
        nb->in[1] = t[0];
        for (int q = 1; q < n; q++)
            nb->in[nb->n_in++] = t[q];
        nb->attrs.i[2] = n - 1;
        c->stats.n_norm_dy_terms++;
    }
    jdt_free(users);
    return JDT_OK;
}

/* y = x + a @ b on a device whose GEMMs accumulate (c->gemm_accumulate: CUDA): the GEMM gets x
 * as a last input (attrs i[3], cuBLASLt's C with beta 1). GPT-2's backward sums the three q/k/v
 * GEMMs' input cotangents so where fold_norm_dy_terms did not take them (f32 compute); an f32
 * residual stream adds each block's projections so. The f32
 * sum is the same up to its order. Skipped with no_fuse. */
static bool gemm_takes(const cnode *f, const cnode *x, bool viewed)
{
    (void)viewed; /* the bias fold's view */
    return f->op == JDT_OP_MATMUL && !f->attrs.i[3] && !f->attrs.i[4] && !f->attrs.i[5] &&
           x->kind != CK_MAP; /* not with a GELU epilogue (the aux stays the last input) */
}

/* y = x + scatter_add(src, idx) (x f32, the scatter's shape): the builtin gets x as a third
 * input and adds the rows into a copy of it, or into x's own buffer when x dies there (fuse.c
 * plans that in place). A tied embedding's two gradients (the output projection's and the token
 * lookup's) then need one (V, C) buffer instead of three live at once. CPU builtins only;
 * skipped with no_fuse. */
static bool scatter_takes(const cnode *f, const cnode *x, bool viewed)
{
    (void)x;
    return f->op == JDT_OP_SCATTER_ADD && f->n_in == 2 && !viewed;
}

/* precision.activations: bf16 on a device whose GEMMs accumulate and take bf16 (CUDA): a
 * residual add y = x + CAST(CAST(p, bf16), f32), p a bf16-compute GEMM's f32 product [+ bias]
 * read by nothing else and x an f32 tensor that fold_addends would give that GEMM. The branch
 * output is then not rounded to bf16: the add reads p itself, and fold_addends (run later) has
 * the GEMM add x as cuBLASLt's C, writing y in f32. The bf16 store of the branch output, its
 * read and the add's kernel (x read, y written) go for an f32 read of x inside the GEMM: 2 of
 * the 10 bytes per element. It changes numbers as autocast would not (y = x + p where autocast
 * has x + bf16(p): more exact, not the same), so it is a switch of its own (JDT_RESIDUAL_GEMM=0
 * in the environment turns it off, program.c). A bias stays the widened bf16 rounding of the
 * model's (cuBLASLt's f32 bias). Skipped with no_fuse. */
static jdt_status fold_residual_gemms(cprog *c, jdt_err *e)
{
    int *users = count_users(c);
    if (!users) return jdt_err_set(e, JDT_ERR_NOMEM, "compile: residual GEMM folding");
    for (int i = 0; i < c->n_nodes; i++) {
        cnode *a = &c->nodes[i];
        if (!is_f32_add(a)) continue;
        for (int side = 0; side < 2; side++) {
            const int l = a->in[side], xi = a->in[1 - side];
            if (!is_widening(c, l) || users[l] != 1) continue;
            int views[8], n_views = 0, r = c->nodes[l].in[0]; /* reshapes of CAST(p, bf16) */
            while (c->nodes[r].kind == CK_VIEW && users[r] == 1 && n_views < 8)
                views[n_views++] = r, r = c->nodes[r].in[0];
            const cnode *rn = &c->nodes[r];
            if (rn->op != JDT_OP_CAST || rn->kind != CK_EW || rn->dtype != JDT_DTYPE_BF16 ||
                users[r] != 1)
                continue;
            const int top = rn->in[0], fi = view_base(c, users, top);
            const cnode *f = &c->nodes[fi];
            if (users[top] != 1 || f->op != JDT_OP_MATMUL || !f->attrs.i[2] ||
                c->nodes[top].dtype != JDT_DTYPE_F32 || !addend_fits(c, a, fi, xi) ||
                !gemm_takes(f, &c->nodes[xi], true))
                continue;
            /* the reshapes now view the f32 product; the add reads the outermost */
            for (int k = 0; k < n_views; k++) {
                c->nodes[views[k]].dtype = JDT_DTYPE_F32;
                c->nodes[views[k]].bf16 = false;
            }
            const int in = n_views > 0 ? views[0] : top;
            if (n_views > 0) {
                c->nodes[views[n_views - 1]].in[0] = top;
                users[top]++, users[r]--;
            }
            a->in[side] = in;
            users[in]++;
            if (--users[l] == 0) unread(c, users, l);
            if (users[r] == 0) unread(c, users, r);
            c->stats.n_residual_gemms++;
            break;
        }
    }
    jdt_free(users);
    return JDT_OK;
}

/* Node i, read by users[i] nodes, all elementwise over its element count (not an output or
 * update): true, and copies of it appended so that each reader but the first reads one of its
 * own (*n_copies counted), so that each copy fuses into its reader's kernel. False when out of
 * memory; *ok false when i does not qualify. */
static bool split_per_reader(cprog *c, const int *users, int i, int n0, int *n_copies, bool *ok)
{
    const int64_t numel = jdt_shape_numel(&c->nodes[i].shape);
    int readers = 0;
    *ok = true;
    for (int j = i + 1; j < n0 && *ok; j++) {
        const cnode *u = &c->nodes[j];
        for (int k = 0; k < u->n_in && *ok; k++)
            if (u->in[k] == i) {
                *ok = u->kind == CK_EW && jdt_shape_numel(&u->shape) == numel;
                readers++;
            }
    }
    if (!*ok || readers != users[i]) return *ok = false, true; /* an output, an update, ... */
    bool first = true;
    for (int j = i + 1; j < n0; j++) {
        int kk[JDT_MAX_INPUTS], nk = 0;
        for (int k = 0; k < c->nodes[j].n_in; k++)
            if (c->nodes[j].in[k] == i) kk[nk++] = k;
        if (nk == 0) continue;
        if (first) {
            first = false;
            continue;
        }
        const cnode copy = c->nodes[i];
        const int ci = append_node(c, &copy);
        if (ci < 0) return false;
        for (int q = 0; q < nk; q++)
            c->nodes[j].in[kk[q]] = ci;
        (*n_copies)++;
    }
    return true;
}

/* Is node i a cheap elementwise function of one value that its own memory holds whatever this
 * node does (a builtin's output, a co-output, a leaf, through views)? Recomputing it in each
 * reader's kernel then reads nothing that was not read anyway. */
static bool cheap_of_stored(const cprog *c, int i)
{
    const cnode *n = &c->nodes[i];
    if (n->kind != CK_EW || n->n_in != 1 ||
        (n->op != JDT_OP_SILU && n->op != JDT_OP_SIGMOID && n->op != JDT_OP_TANH &&
         n->op != JDT_OP_EXP && n->op != JDT_OP_GELU && n->op != JDT_OP_RELU &&
         n->op != JDT_OP_NEG && n->op != JDT_OP_CAST))
        return false;
    const cnode_kind k = c->nodes[view_root(c, n->in[0])].kind;
    return k == CK_BUILTIN || k == CK_COOUT || k == CK_LEAF;
}

/* A value read by several elementwise nodes of its shape is kept by fusion in a kernel of its
 * own that stores it (fuse.c), and each reader's kernel reads it back. Two such values are
 * cheaper recomputed by each reader (one copy per reader, each fusing into its reader's
 * kernel):
 *   - a widening CAST (a bf16 value to f32): each kernel reads the bf16 value (2 bytes) and
 *     widens it as it goes instead of a kernel storing the f32 copy (2 bytes read, 4 written,
 *     then 4 read per reader). Llama's SwiGLU backward widens the bf16 cotangent of the gated
 *     product for the gate's and the up projection's kernels: at GPT-2's size, B 32, 10 bytes
 *     per element, 1 GB per layer. Exact: widening is. (stats.n_widenings_split)
 *   - a cheap unary function (SiLU, sigmoid, tanh, exp, GELU, ReLU, negation, a cast) of a
 *     value in memory anyway (cheap_of_stored): Llama's s = silu(g) of the gate GEMM's output,
 *     read by the forward's s * u and by the backward's dh * s, was a kernel storing s (and s
 *     lived from the forward to the backward); now the forward is one kernel reading g and u,
 *     and the backward reads g, which its gate cotangent (silu'(g)) read anyway. Each copy
 *     computes the same f32 value and, for a bf16 node, rounds it where it is computed
 *     (nest.c), as the stored one was: the same numbers. (stats.n_recomputes_split)
 * On devices with bf16_builtins; skipped with no_fuse. */
static jdt_status split_widenings(cprog *c, jdt_err *e)
{
    int *users = count_users(c);
    if (!users) return jdt_err_set(e, JDT_ERR_NOMEM, "compile: widening copies");
    const int n0 = c->n_nodes;
    int split = 0, recomputed = 0;
    for (int i = 0; i < n0; i++) {
        const bool widening = is_widening(c, i);
        if (users[i] < 2 || (!widening && !cheap_of_stored(c, i))) continue;
        bool ok;
        if (!split_per_reader(c, users, i, n0, widening ? &split : &recomputed, &ok)) {
            jdt_free(users);
            return jdt_err_set(e, JDT_ERR_NOMEM, "compile: widening copies");
        }
    }
    jdt_free(users);
    c->stats.n_widenings_split += split;
    c->stats.n_recomputes_split += recomputed;
    return split + recomputed ? order_inputs_first(c, e) : JDT_OK;
}

/* The RoPE backward (Llama's) reads the attention backward's dq or dk through the (0, 2, 1, 3)
 * transpose back to (B, T, H, D): a kernel that reads the slot (f32, strided) and stores the
 * transposed copy, which RoPE then reads. The RoPE kernel reads (B, H, T, D) input itself
 * (cuk_rope's x_bhtd; c->rope_bhtd: CUDA), so a transpose read by nothing but the RoPE is
 * skipped: the RoPE takes the transpose's input, a (B, H, T, D) node, or a slice along axis 0
 * of one (the backward's packed (3, B, H, T, D) output, through its reshape) as attrs i[2], the
 * element offset (i[1] = 1: that layout). The transpose's kernel and its buffer go (Llama at
 * GPT-2's size, B 32: 2 per layer, 8 bytes per element). The same values. Skipped with
 * no_fuse. */
static jdt_status fold_rope_transposes(cprog *c, jdt_err *e)
{
    int *users = count_users(c);
    if (!users) return jdt_err_set(e, JDT_ERR_NOMEM, "compile: rope layouts");
    for (int i = 0; i < c->n_nodes; i++) {
        cnode *r = &c->nodes[i];
        if (r->op != JDT_OP_ROPE || r->kind != CK_BUILTIN || r->n_in != 1 || r->attrs.i[1] != 0)
            continue;
        const int ti = r->in[0];
        const cnode *t = &c->nodes[ti];
        if (!is_head_transpose(t) || t->kind != CK_MAP || users[ti] != 1) continue;
        int src = t->in[0];
        int64_t off = 0;
        const cnode *sn = &c->nodes[src];
        if (sn->op == JDT_OP_SLICE && sn->kind == CK_MAP && sn->attrs.i[0] == 0) {
            const cnode *v = &c->nodes[sn->in[0]];
            bool rest = v->shape.ndim == sn->shape.ndim;
            for (int d = 1; rest && d < sn->shape.ndim; d++)
                rest = v->shape.dims[d] == sn->shape.dims[d];
            if (!rest || sn->shape.dims[0] < 1) continue;
            off = sn->attrs.i[1] * (jdt_shape_numel(&sn->shape) / sn->shape.dims[0]);
            src = sn->in[0];
            sn = v;
        }
        if (sn->kind == CK_MAP || sn->kind == CK_SPLAT || sn->dtype != t->dtype) continue;
        users[src]++;
        r->in[0] = src;
        r->attrs.i[1] = 1;
        r->attrs.i[2] = off;
        if (--users[ti] == 0) unread(c, users, ti);
        c->stats.n_rope_transposes_folded++;
    }
    jdt_free(users);
    return JDT_OK;
}

/* The attention's output o (B, H, T, D) goes to the projection's GEMM through a (0, 2, 1, 3)
 * transpose, a kernel that reads o (f32) and stores the (B, T, H, D) copy (bf16 when only bf16
 * GEMMs read it, fuse.c mark_bf16_storage); the backward reads o itself. The attention's step
 * writes that copy as its co-output (CK_COOUT) instead (c->attention_copy: CUDA's kernels, as
 * they store o): the transpose's kernel and its read of o go (GPT-2 124M, bf16, B 32: 12 of
 * them, 4 bytes of 10 per element, 1.2 GB per step). The same values, the same rounding.
 * Skipped with no_fuse. */
static jdt_status fold_attention_copies(cprog *c, jdt_err *e)
{
    (void)e;
    for (int i = 0; i < c->n_nodes; i++) {
        cnode *t = &c->nodes[i];
        if (!is_head_transpose(t) || t->kind != CK_MAP || t->dtype != JDT_DTYPE_F32) continue;
        cnode *a = &c->nodes[t->in[0]];
        if (a->op != JDT_OP_ATTENTION || a->kind != CK_BUILTIN || a->dtype != JDT_DTYPE_F32 ||
            a->co)
            continue;
        make_co_output(c, t->in[0], i);
        c->stats.n_attention_copies++;
    }
    return JDT_OK;
}

/* Node i holds elements [off, off + numel(i)) of an attention backward's packed output (3 n
 * elements, (3, B, H, T, D)): is every live reader of it among the first n0 nodes (those
 * `live` covers) a reshape view or a SLICE of axis 0
 * (both keep the elements contiguous) leading on, or the (0, 2, 1, 3) transpose of one whole
 * third (dims: its (B, H, T, D); hk heads for dk and dv, grouped-query attention's, at the
 * start of theirs: fold_attention_groups), recorded as tr[third], each third read once? */
static bool attention_thirds(const cprog *c, const unsigned char *live, int n0, int i, int64_t off,
                             int64_t n, const int64_t *dims, int64_t hk, int tr[3], int depth)
{
    const cnode *x = &c->nodes[i];
    if (is_result(c, i)) return false;
    for (int j = i + 1; j < n0; j++) {
        const cnode *u = &c->nodes[j];
        for (int k = 0; live[j] && k < u->n_in; k++) {
            if (u->in[k] != i) continue;
            if (depth < 8 && u->kind == CK_VIEW && u->op == JDT_OP_RESHAPE) {
                if (!attention_thirds(c, live, n0, j, off, n, dims, hk, tr, depth + 1))
                    return false;
            } else if (depth < 8 && u->op == JDT_OP_SLICE && u->kind == CK_MAP &&
                       u->attrs.i[0] == 0 && x->shape.ndim >= 1 && x->shape.dims[0] > 0) {
                const int64_t row = jdt_shape_numel(&x->shape) / x->shape.dims[0];
                if (!attention_thirds(c, live, n0, j, off + u->attrs.i[1] * row, n, dims, hk, tr,
                                      depth + 1))
                    return false;
            } else if (is_head_transpose(u) && u->kind == CK_MAP && u->dtype == JDT_DTYPE_F32 &&
                       x->shape.ndim == 4 && x->shape.dims[0] == dims[0] &&
                       x->shape.dims[1] == (off < n ? dims[1] : hk) &&
                       x->shape.dims[2] == dims[2] && x->shape.dims[3] == dims[3] && off % n == 0 &&
                       off / n < 3 && tr[off / n] < 0) {
                tr[off / n] = j;
            } else {
                return false;
            }
        }
    }
    return true;
}

/* Is every live reader of node i among the first n0 (through reshape views) node a or node b,
 * none of them an output or update? */
static bool read_only_by(const cprog *c, const unsigned char *live, int n0, int i, int a, int b)
{
    if (is_result(c, i)) return false;
    for (int j = i + 1; j < n0; j++)
        for (int k = 0; live[j] && k < c->nodes[j].n_in; k++) {
            if (c->nodes[j].in[k] != i || j == a || j == b) continue;
            if (c->nodes[j].kind != CK_VIEW || c->nodes[j].op != JDT_OP_RESHAPE ||
                !read_only_by(c, live, n0, j, a, b))
                return false;
        }
    return true;
}

/* Is node r a CAST to bf16 of an f32 value whose views lead to node root, numel elements? */
static bool bf16_cast_of(const cprog *c, int r, int root, int64_t numel)
{
    const cnode *x = &c->nodes[r];
    return x->op == JDT_OP_CAST && x->kind == CK_EW && x->dtype == JDT_DTYPE_BF16 &&
           c->nodes[x->in[0]].dtype == JDT_DTYPE_F32 && view_root(c, x->in[0]) == root &&
           jdt_shape_numel(&x->shape) == numel;
}

/* Qwen2's q and k: a bias before the RoPE, so the bias gradient sums RoPE's backward of dq
 * (or dk), rope, f32, over its rows (C columns, numel elements). The attention's kernels, which
 * rotate the copy as they store it, sum the rotated values instead (cuk.h jdt_cuk_att_grads):
 * the sum's node is returned for sum_partials, else -1 (nothing changed). When rope's other
 * readers are one CAST to bf16 (through reshape views: the GEMMs' operand under bf16
 * activations), the kernels store the copy as that bf16 rounding (rope and the views between
 * become bf16, the CAST a view), as fold_bf16_casts does for a RoPE the CAST alone reads. */
static int rotated_sums(cprog *c, const unsigned char *live, int n0, int rope, int64_t C,
                        int64_t numel)
{
    int sum = -1, cast = -1;
    for (int r = rope + 1; r < n0; r++) {
        if (!live[r]) continue;
        if (sum < 0 && column_sums_of(c, r, rope, C, numel)) sum = r;
        if (cast < 0 && c->bf16_builtins && bf16_cast_of(c, r, rope, numel)) cast = r;
    }
    if (sum < 0 || c->nodes[rope].dtype != JDT_DTYPE_F32) return -1;
    if (cast >= 0 && read_only_by(c, live, n0, rope, sum, cast)) {
        cnode *x = &c->nodes[cast];
        store_bf16(c, x->in[0], rope); /* the RoPE and its views */
        to_view(x, x->in[0]);
        c->stats.n_bf16_folded++;
    }
    c->stats.n_rotated_partials++;
    return sum;
}

/* The attention backward's packed output (3, B, H, T, D), f32, reaches the q, k and v
 * projections' backward as three slices, each through a (0, 2, 1, 3) transpose to (B, T, H, D)
 * that a kernel per projection reads whole (4 bytes per element) to sum its columns (the bias
 * gradient) and store the copy the GEMMs read (bf16 under bf16 compute; fuse.c puts both in one
 * kernel). The attention's kernels, which hold each value of dq, dk and dv as they write it,
 * do both instead (c->attention_part_rows: CUDA's, jdt_cuk_att_grads; attrs i[1] = 1): the
 * builtin's output becomes the column sums of each R = attention_part_rows rows of a sequence,
 * (3 P, H D) with P = B ceil(T / R), which the bias gradients reduce instead (sum_partials)
 * (grouped-query attention's dk and dv partials are (P, Hk D): the output is then (P (G + 2),
 * Hk D), dq's P H D floats first, read through a prefix view (P, H D), sum_prefix_partials,
 * then dk's and dv's P rows each, sum_partials)
 * (without biases, as in Llama, none are written: attrs i[3] = 1 and a 1-float output), and
 * the three copies become its co-outputs (CK_COOUT), in q, k, v order: the CAST when it and the
 * sum are the transpose's only readers, the RoPE backward when that is its only reader (Llama's
 * dq, dk: the kernels rotate the value as cuk_rope does, and the RoPE's kernel goes), else the
 * f32 transpose itself. The packed f32 output is
 * not written (GPT-2 124M, bf16, B 32: per layer 300 MB written, 450 MB read by three kernels).
 * The copies are the same values and the same rounding; the bias gradients change order (per
 * chunk of rows, then over the chunks). Only when every reader of the output is one of the
 * three transposes (so fold_rope_transposes finds nothing left to fold). Skipped with
 * no_fuse. */
static jdt_status fold_attention_cotangents(cprog *c, jdt_err *e)
{
    unsigned char *live = live_nodes(c);
    if (!live) return jdt_err_set(e, JDT_ERR_NOMEM, "compile: attention cotangents");
    const int n0 = c->n_nodes;
    const int64_t R = c->attention_part_rows;
    int folded = 0;
    for (int ai = 0; ai < n0; ai++) {
        const cnode *a = &c->nodes[ai];
        if (!live[ai] || a->op != JDT_OP_ATTENTION_BWD || a->kind != CK_BUILTIN ||
            a->dtype != JDT_DTYPE_F32 || a->co || a->attrs.i[1] || a->shape.ndim != 5 ||
            a->shape.dims[0] != 3)
            continue;
        const int64_t *dims = a->shape.dims + 1; /* B, H, T, D */
        const int64_t n = dims[0] * dims[1] * dims[2] * dims[3], C = dims[1] * dims[3];
        /* grouped-query attention's dk and dv (fold_attention_groups): hk heads */
        const int64_t hk = c->nodes[a->in[1]].shape.dims[1];
        int tr[3] = {-1, -1, -1};
        if (n <= 0 || hk <= 0 || !attention_thirds(c, live, n0, ai, 0, n, dims, hk, tr, 0) ||
            tr[0] < 0 || tr[1] < 0 || tr[2] < 0)
            continue;
        int sum[3], co[3], ropes = 0;
        for (int s = 0; s < 3; s++) {
            const int64_t hs = s ? hk : dims[1], ns = n / dims[1] * hs;
            int copy = -1;
            sum[s] = -1;
            for (int r = tr[s] + 1; r < n0; r++) {
                if (!live[r]) continue;
                if (sum[s] < 0 && column_sums_of(c, r, tr[s], hs * dims[3], ns)) sum[s] = r;
                if (copy < 0 && bf16_cast_of(c, r, tr[s], ns)) copy = r;
            }
            co[s] = copy >= 0 && read_only_by(c, live, n0, tr[s], sum[s], copy) ? copy : tr[s];
            /* the copy's one reader RoPE's backward (Llama's dq, dk): the kernels rotate it as
             * they store it, and the RoPE is the co-output instead */
            int rope = -1;
            for (int r = tr[s] + 1; co[s] == tr[s] && r < n0 && rope < 0; r++) {
                const cnode *x = &c->nodes[r];
                if (live[r] && x->op == JDT_OP_ROPE && x->kind == CK_BUILTIN && x->n_in == 1 &&
                    x->in[0] == tr[s] && x->attrs.i[1] == 0 &&
                    jdt_shape_eq(&x->shape, &c->nodes[tr[s]].shape) && x->attrs.f[0] != 0.0 &&
                    x->attrs.f[1] == 0.0) /* the kernels' rotation is unscaled RoPE's */
                    rope = r;
            }
            if (rope >= 0 && read_only_by(c, live, n0, tr[s], rope, -1)) {
                co[s] = rope;
                ropes++;
                if (sum[s] < 0) sum[s] = rotated_sums(c, live, n0, rope, hs * dims[3], ns);
            }
        }
        c->stats.n_ropes_in_attention += ropes;
        const int64_t P = dims[0] * ((dims[2] + R - 1) / R), G = dims[1] / hk;
        cnode *am = &c->nodes[ai];
        /* (P (G + 2), Hk D): dq's (P, H D) its first P G rows, then dk's and dv's P rows each
         * ((3 P, H D) without groups) */
        const jdt_shape like = {.ndim = 2, .dims = {P * (G + 2), C / G}};
        am->attrs.i[1] = 1;
        if (sum[0] >= 0 || sum[1] >= 0 || sum[2] >= 0) {
            am->shape = like;
            c->stats.n_attention_partials++;
        } else { /* no bias reads the partials (Llama): none are written (attrs i[3] = 1), and
                    the output is one unwritten float */
            am->shape = (jdt_shape){.ndim = 1, .dims = {1}};
            am->attrs.i[3] = 1;
        }
        for (int s = 0; s < 3; s++)
            if (sum[s] >= 0 &&
                !(G > 1 && s == 0 ? sum_prefix_partials(c, sum[s], ai, P, C)
                                  : sum_partials(c, sum[s], ai, &like, (G - 1 + s) * P, P))) {
                jdt_free(live);
                return jdt_err_set(e, JDT_ERR_NOMEM, "compile: attention cotangents");
            }
        for (int s = 0; s < 3; s++)
            make_co_output(c, ai, co[s]);
        c->stats.n_attention_cotangents++;
        folded++;
    }
    jdt_free(live);
    return folded ? order_inputs_first(c, e) : JDT_OK;
}

/* The attention backward's first kernel finds each query row's log-sum-exp L of its scaled
 * causal scores again, a pass over the keys (the forward's QK^T and its exponentials) that the
 * forward had made for the same rows; FlashAttention keeps L from the forward instead
 * (c->attention_lse: CUDA's kernels). An ATTENTION_BWD whose o (in[3], views followed) is an
 * ATTENTION builtin on the same q, k, v inputs, scale and bf16 flag gets it: the forward's
 * output becomes packed, o then L (B, H, T), f32 (attrs i[1] = 1; the old node a prefix view
 * of it, its co-outputs the packed node's), and the backward takes L right after its o (attrs
 * i[2] = 1; its dQ kernel then forms the row statistics, and the statistics kernel, a pass
 * over the keys, does not run). The same floats either way (both kernels run the same online
 * softmax over the same tiles), and B H T floats per layer stay alive until the backward
 * (GPT-2 124M, B 32: 1.5 MB each). Under remat the recomputed forward is
 * the one packed. Skipped with no_fuse. */
static jdt_status fold_attention_lse(cprog *c, jdt_err *e)
{
    const int n0 = c->n_nodes;
    int folded = 0;
    for (int bi = 0; bi < n0; bi++) {
        const cnode *bw = &c->nodes[bi];
        if (bw->op != JDT_OP_ATTENTION_BWD || bw->kind != CK_BUILTIN || bw->n_in != 5 ||
            bw->attrs.i[2])
            continue;
        const int fi = view_root(c, bw->in[3]);
        const cnode *f = &c->nodes[fi];
        if (f->op != JDT_OP_ATTENTION || f->kind != CK_BUILTIN || f->dtype != JDT_DTYPE_F32 ||
            f->n_in != 3 || f->in[0] != bw->in[0] || f->in[1] != bw->in[1] ||
            f->in[2] != bw->in[2] || f->attrs.i[0] != bw->attrs.i[0] ||
            f->attrs.f[0] != bw->attrs.f[0] || c->nodes[f->in[0]].shape.ndim != 4)
            continue;
        if (!f->attrs.i[1]) { /* pack it (a forward two backwards read is packed once) */
            const jdt_shape *qs = &c->nodes[f->in[0]].shape;
            cnode pk = *f;
            pk.shape.ndim = 1;
            pk.shape.dims[0] = jdt_shape_numel(&f->shape) + qs->dims[0] * qs->dims[1] * qs->dims[2];
            pk.attrs.i[1] = 1;
            const int pi = append_node(c, &pk);
            if (pi < 0) return jdt_err_set(e, JDT_ERR_NOMEM, "compile: attention statistics");
            for (int q = c->nodes[pi].co; q; q = c->nodes[q].co)
                c->nodes[q].in[0] = pi; /* the forward's co-outputs follow it */
            to_view(&c->nodes[fi], pi);
            c->nodes[fi].co = 0;
        }
        c->nodes[bi].attrs.i[2] = 1;
        c->stats.n_attention_lse++;
        folded++;
    }
    return folded ? order_inputs_first(c, e) : JDT_OK;
}

/* Node x (a builtin's input, read by it alone) leads through views read once to the product
 * of a bf16-compute GEMM builtin, f32, with no bias, addend or GELU epilogue, read by nothing
 * else? Then that GEMM stores it as bf16 (cuBLASLt's D type, nearest even) and it and its views
 * become bf16 nodes: true. Else nothing changes: false. */
static bool gemm_stores_bf16(cprog *c, const int *users, int x)
{
    if (users[x] != 1) return false;
    const int mi = view_base(c, users, x);
    if (!plain_bf16_product(&c->nodes[mi]) || users[mi] != 1) return false;
    store_bf16(c, x, mi);
    return true;
}

/* The attention backward's dO comes from the output projection's backward GEMM, f32, and its
 * tensor-core kernels round it to bf16 for their products: the dQ kernel as it stages dO's
 * rows, also writing that bf16 copy to scratch for the dK/dV kernel. Where the device's kernels
 * read dO as bf16 (c->attention_dout16_d: head size D up to it, bf16 compute, bf16 q, k, v, a
 * scale > 0), the GEMM stores dO as bf16 (cuBLASLt's D type, the same nearest-even rounding),
 * read only by this backward through views: GPT-2 124M, bf16, B 32, per layer 50 MB less
 * written by the GEMM, 50 MB less read by the dQ kernel, and the 50 MB copy is not written
 * (1.8 GB per step). The products see the same bf16 values; delta = dO . O (f32) sums the
 * rounded dO, as FlashAttention-2 and cuDNN do with bf16 dO. Runs after
 * fold_attention_transposes (dO's transpose then is a view). Skipped with no_fuse. */
static jdt_status fold_attention_dout16(cprog *c, jdt_err *e)
{
    int *users = count_users(c);
    if (!users) return jdt_err_set(e, JDT_ERR_NOMEM, "compile: bf16 dO");
    for (int bi = 0; bi < c->n_nodes; bi++) {
        const cnode *bw = &c->nodes[bi];
        if (bw->op != JDT_OP_ATTENTION_BWD || bw->kind != CK_BUILTIN || bw->n_in < 5 ||
            !bw->attrs.i[0] || !(bw->attrs.f[0] > 0.0) ||
            c->nodes[bw->in[0]].dtype != JDT_DTYPE_BF16 || c->nodes[bw->in[0]].shape.ndim != 4 ||
            c->nodes[bw->in[0]].shape.dims[3] > c->attention_dout16_d)
            continue;
        if (gemm_stores_bf16(c, users, bw->in[4])) c->stats.n_attention_dout16++;
    }
    jdt_free(users);
    return JDT_OK;
}

/* With dO stored as bf16 (fold_attention_dout16) and the forward's log-sum-exp packed after its
 * f32 o (fold_attention_lse), the backward reads o only for delta = dO . O, and the forward
 * also stores o's (B, T, H, D) copy for the projection's GEMM (fold_attention_copies), bf16
 * when only bf16 GEMMs read it (fuse.c mark_bf16_storage). The backward reads that copy
 * instead, through a (0, 2, 1, 3) transpose view (its layout bit), and takes the log-sum-exp
 * as a sixth input (attrs i[2] = 2); the forward's own output becomes the log-sum-exp alone
 * (attrs i[1] = 2: o is not stored, its copy is). Per layer of GPT-2 124M at B 32 the forward
 * writes 100 MB less and the backward reads 50 MB instead of 100, and the arena loses the f32
 * o kept from the forward to the backward; delta sums the rounded o, as FlashAttention-2's
 * bf16 o does. The rewrite needs the packed forward read by nothing else than this backward's
 * o (through reshape views) and its co-outputs. Skipped with no_fuse. */
static jdt_status fold_attention_o16(cprog *c, jdt_err *e)
{
    int *users = count_users(c);
    if (!users) return jdt_err_set(e, JDT_ERR_NOMEM, "compile: bf16 o");
    const int n0 = c->n_nodes;
    int folded = 0;
    for (int bi = 0; bi < n0; bi++) {
        const cnode *bw = &c->nodes[bi];
        if (bw->op != JDT_OP_ATTENTION_BWD || bw->kind != CK_BUILTIN || bw->n_in != 5 ||
            bw->attrs.i[2] != 1 || c->nodes[bw->in[4]].dtype != JDT_DTYPE_BF16)
            continue;
        int pi = bw->in[3];
        bool once = true; /* o's chain of reshape views, each read once */
        for (; c->nodes[pi].kind == CK_VIEW; pi = c->nodes[pi].in[0])
            once = once && c->nodes[pi].op == JDT_OP_RESHAPE && users[pi] == 1;
        const cnode *pk = &c->nodes[pi];
        if (!once || pk->op != JDT_OP_ATTENTION || pk->kind != CK_BUILTIN || pk->attrs.i[1] != 1 ||
            !pk->co)
            continue;
        const int ci = pk->co; /* the projection's copy */
        const cnode *cp = &c->nodes[ci];
        int n_co = 0;
        for (int q = pk->co; q; q = c->nodes[q].co)
            n_co++;
        if (cp->kind != CK_COOUT || !is_head_transpose(cp) || users[pi] != 1 + n_co) continue;
        const jdt_shape o_shape = c->nodes[bw->in[3]].shape;
        cnode tv = {.op = JDT_OP_TRANSPOSE,
                    .kind = CK_VIEW,
                    .dtype = cp->dtype,
                    .shape = o_shape,
                    .n_in = 1,
                    .in = {ci},
                    .attrs = cp->attrs};
        const int ti = append_node(c, &tv);
        if (ti < 0) {
            jdt_free(users);
            return jdt_err_set(e, JDT_ERR_NOMEM, "compile: bf16 o");
        }
        cnode *b = &c->nodes[bi], *p = &c->nodes[pi];
        const int x = b->in[3];
        b->in[3] = ti;
        b->in[5] = pi;
        b->n_in = 6;
        b->attrs.i[2] = 2;
        users[pi]++;
        users[x]--;
        unread_dead(c, users, x); /* o's views, down to the packed node (read: b's in[5]) */
        const jdt_shape *qs = &c->nodes[b->in[0]].shape;
        p->shape.ndim = 1;
        p->shape.dims[0] = qs->dims[0] * qs->dims[1] * qs->dims[2];
        p->attrs.i[1] = 2;
        c->stats.n_attention_o16++;
        folded++;
    }
    jdt_free(users);
    return folded ? order_inputs_first(c, e) : JDT_OK;
}

/* A norm backward in its partial-sums form (fold_norm_partials: CUDA's _part kernels) reads dy,
 * which a bf16-compute GEMM computed and stored in f32 (d of the next layer's input: the fc's
 * dX for ln2, the lm head's for the final norm). Where dy is that GEMM's product read only by
 * this norm backward through views, with no bias, addend or epilogue, the GEMM stores it as
 * bf16 (cuBLASLt's D type) and the kernel widens it as it loads (c->norm_dy16: bf16_builtins,
 * unless JDT_NORM_DY16=0): PyTorch's autocast linear returns that bf16 dX too, which its norm
 * backward reads widened. GPT-2 124M at B 32: 13 norms, 50 MB less written by the GEMM and 50
 * MB less read by the norm each (1.3 GB a step). A dy summed from several GEMMs (the q/k/v
 * projections' dX) is fold_norm_dy_terms' (earlier). Skipped with no_fuse. */
static jdt_status fold_norm_dy16(cprog *c, jdt_err *e)
{
    int *users = count_users(c);
    if (!users) return jdt_err_set(e, JDT_ERR_NOMEM, "compile: bf16 dy");
    for (int ni = 0; ni < c->n_nodes; ni++) {
        const cnode *nb = &c->nodes[ni];
        if ((nb->op != JDT_OP_NORMALIZE_BWD && nb->op != JDT_OP_RMS_NORMALIZE_BWD) ||
            nb->kind != CK_BUILTIN || nb->attrs.i[0] <= 0 || nb->n_in < 2)
            continue;
        if (gemm_stores_bf16(c, users, nb->in[1])) c->stats.n_norm_dy16++;
    }
    jdt_free(users);
    return JDT_OK;
}

/* Grouped-query attention's k or v as models.c builds it: node i a reshape view (B, H, T, D) of
 * a BROADCAST map (B, Hk, G, T, D) of a reshape view (B, Hk, 1, T, D) of x (B, Hk, T, D), each
 * key/value head repeated for its group of G = H / Hk query heads. Returns x and sets *g, or -1. */
static int repeated_heads(const cprog *c, int i, int64_t *g)
{
    const cnode *r4 = &c->nodes[i];
    if (r4->kind != CK_VIEW || r4->op != JDT_OP_RESHAPE || r4->shape.ndim != 4) return -1;
    const cnode *bc = &c->nodes[r4->in[0]];
    if (bc->kind != CK_MAP || bc->op != JDT_OP_BROADCAST || bc->shape.ndim != 5) return -1;
    const cnode *r5 = &c->nodes[bc->in[0]];
    if (r5->kind != CK_VIEW || r5->op != JDT_OP_RESHAPE || r5->shape.ndim != 5) return -1;
    const int x = r5->in[0];
    const jdt_shape *xs = &c->nodes[x].shape, *bs = &bc->shape, *rs = &r5->shape;
    if (xs->ndim != 4 || rs->dims[2] != 1 || bs->dims[2] < 2 || c->nodes[x].dtype != r4->dtype)
        return -1;
    for (int d = 0; d < 2; d++)
        if (rs->dims[d] != xs->dims[d] || bs->dims[d] != xs->dims[d]) return -1;
    for (int d = 2; d < 4; d++)
        if (rs->dims[d + 1] != xs->dims[d] || bs->dims[d + 1] != xs->dims[d] ||
            r4->shape.dims[d] != xs->dims[d])
            return -1;
    if (r4->shape.dims[0] != xs->dims[0] || r4->shape.dims[1] != xs->dims[1] * bs->dims[2])
        return -1;
    *g = bs->dims[2];
    return x;
}

/* The sum over each group that grouped-query attention's backward applies to third s (1: dk,
 * 2: dv) of attention backward ai's packed output (3, B, H, T, D): the REDUCE_SUM over axis 2
 * of that third (a SLICE of axis 0 of the output's (3B, H, T, D) view) viewed (B, Hk, G, T, D),
 * the broadcast's gradient (builder.c jdt_graph_unbroadcast), the slice and the view read by
 * nothing else; the sum's shape kv's, (B, Hk, T, D). Returns the reduction, or -1. */
static int group_sum(const cprog *c, const int *users, int ai, int s, int64_t g,
                     const jdt_shape *kv)
{
    const cnode *a = &c->nodes[ai];
    const int64_t B = a->shape.dims[1], H = a->shape.dims[2];
    const int64_t r5_dims[5] = {B, kv->dims[1], g, kv->dims[2], kv->dims[3]};
    for (int r = ai + 1; r < c->n_nodes; r++) {
        const cnode *x = &c->nodes[r];
        if (x->op != JDT_OP_REDUCE_SUM || x->kind != CK_REDUCE || x->attrs.i[0] != 4 ||
            x->n_in != 1 || !jdt_shape_eq(&x->shape, kv) || is_result(c, x->in[0]))
            continue;
        const cnode *r5 = &c->nodes[x->in[0]];
        if (r5->kind != CK_VIEW || r5->op != JDT_OP_RESHAPE || r5->shape.ndim != 5 ||
            memcmp(r5->shape.dims, r5_dims, sizeof r5_dims) != 0 || kv->dims[1] * g != H ||
            users[x->in[0]] != 1)
            continue;
        const int si = r5->in[0];
        const cnode *sl = &c->nodes[si];
        if (sl->op != JDT_OP_SLICE || sl->kind != CK_MAP || sl->attrs.i[0] != 0 ||
            sl->attrs.i[1] != s * B || sl->attrs.i[2] != (s + 1) * B || users[si] != 1 ||
            is_result(c, si))
            continue;
        const cnode *v = &c->nodes[sl->in[0]];
        if (v->kind == CK_VIEW && v->op == JDT_OP_RESHAPE && v->in[0] == ai && v->shape.ndim == 4 &&
            v->shape.dims[0] == 3 * B && v->shape.dims[1] == H)
            return r;
    }
    return -1;
}

/* Is attention backward ai's packed output read only as vjp_ATTENTION reads it, through one
 * (3B, H, T, D) view whose readers are SLICEs of axis 0, each within one third, the dk and dv
 * thirds' by slices sk and sv alone? After fold_attention_groups its kernels write only the
 * first 1/G of those two thirds: nothing else may read them. */
static bool only_thirds_read(const cprog *c, const int *users, int ai, int sk, int sv)
{
    const int64_t B = c->nodes[ai].shape.dims[1];
    if (users[ai] != 1 || is_result(c, ai)) return false;
    const int v = c->nodes[sk].in[0];
    if (c->nodes[sv].in[0] != v || c->nodes[v].in[0] != ai || is_result(c, v)) return false;
    for (int j = v + 1; j < c->n_nodes; j++) {
        const cnode *u = &c->nodes[j];
        for (int k = 0; k < u->n_in; k++) {
            if (u->in[k] != v || j == sk || j == sv) continue;
            if (u->op != JDT_OP_SLICE || u->kind != CK_MAP || u->attrs.i[0] != 0 ||
                u->attrs.i[2] > B) /* within dq's third */
                return false;
        }
    }
    return true;
}

/* Grouped-query attention (models.c, model.n_kv_head): k and v reach the attention, forward and
 * backward, with each key/value head repeated for its group of G query heads (repeated_heads:
 * a broadcast kernel storing G copies, 2 x G x the bytes of k and v a layer), and the backward's
 * dk and dv go back through the sums over each group (group_sum: a reduction kernel each,
 * reading G x the bytes). On a device whose attention builtins take the group themselves
 * (c->attention_groups: CUDA's kernels, JDT_CUK_ATT_GROUP; the device reads G from k's head
 * count) the attention reads k and v (B, Hk, T, D) as they are, and each sum becomes a slice of
 * the backward's packed output viewed (3 G B, Hk, T, D): the kernels write each group's sum at
 * the start of its third (cuk.h), so the slice at G B (dk) and 2 G B (dv) is it. Both only
 * together for a backward (its kernels write the sums only); a forward alone too. The broadcast
 * and reduction kernels and their buffers go; the sums change order only (the kernels add the
 * group's heads in one accumulator), and the copies and RoPE folds after this one see the
 * grouped dk and dv (fold_attention_cotangents). Skipped with no_fuse. */
static jdt_status fold_attention_groups(cprog *c, jdt_err *e)
{
    int *users = count_users(c);
    if (!users) return jdt_err_set(e, JDT_ERR_NOMEM, "compile: grouped attention");
    const int n0 = c->n_nodes;
    int appended = 0;
    for (int ai = 0; ai < n0; ai++) {
        cnode *a = &c->nodes[ai];
        if ((a->op != JDT_OP_ATTENTION && a->op != JDT_OP_ATTENTION_BWD) || a->kind != CK_BUILTIN ||
            c->nodes[a->in[0]].shape.ndim != 4)
            continue;
        int64_t gk = 0, gv = 0;
        const int xk = repeated_heads(c, a->in[1], &gk), xv = repeated_heads(c, a->in[2], &gv);
        if (xk < 0 || xv < 0 || gk != gv ||
            c->nodes[a->in[0]].shape.dims[1] != c->nodes[xk].shape.dims[1] * gk ||
            !jdt_shape_eq(&c->nodes[xk].shape, &c->nodes[xv].shape))
            continue;
        int sums[3] = {-1, -1, -1};
        if (a->op == JDT_OP_ATTENTION_BWD) {
            if (a->shape.ndim != 5 || a->shape.dims[0] != 3 || a->attrs.i[1]) continue;
            const jdt_shape *kv = &c->nodes[xk].shape;
            sums[1] = group_sum(c, users, ai, 1, gk, kv);
            sums[2] = group_sum(c, users, ai, 2, gk, kv);
            if (sums[1] < 0 || sums[2] < 0 ||
                !only_thirds_read(c, users, ai, c->nodes[c->nodes[sums[1]].in[0]].in[0],
                                  c->nodes[c->nodes[sums[2]].in[0]].in[0]))
                continue;
            /* the packed output viewed (3 G B, Hk, T, D) */
            cnode view;
            memset(&view, 0, sizeof view);
            view.op = JDT_OP_RESHAPE;
            view.kind = CK_VIEW;
            view.dtype = a->dtype;
            view.n_in = 1;
            view.in[0] = ai;
            view.shape = c->nodes[xk].shape;
            view.shape.dims[0] *= 3 * gk;
            const int vi = append_node(c, &view);
            if (vi < 0) {
                jdt_free(users);
                return jdt_err_set(e, JDT_ERR_NOMEM, "compile: grouped attention");
            }
            int *grown = jdt_realloc(users, sizeof(int) * ((size_t)c->n_nodes + 1));
            if (!grown) {
                jdt_free(users);
                return jdt_err_set(e, JDT_ERR_NOMEM, "compile: grouped attention");
            }
            users = grown;
            users[vi] = 0;
            users[ai]++;
            appended++;
            a = &c->nodes[ai]; /* the nodes may have moved */
            const int64_t B = a->shape.dims[1];
            for (int s = 1; s < 3; s++) {
                cnode *r = &c->nodes[sums[s]];
                const int old = r->in[0];
                r->op = JDT_OP_SLICE;
                r->kind = CK_MAP;
                r->in[0] = vi;
                memset(&r->attrs, 0, sizeof r->attrs);
                r->attrs.i[1] = s * gk * B;
                r->attrs.i[2] = s * gk * B + B;
                users[vi]++;
                users[old]--;
                unread_dead(c, users, old);
            }
        }
        const int was[2] = {a->in[1], a->in[2]};
        a->in[1] = xk;
        a->in[2] = xv;
        users[xk]++;
        users[xv]++;
        for (int k = 0; k < 2; k++) {
            users[was[k]]--;
            unread_dead(c, users, was[k]);
        }
        c->stats.n_attention_groups++;
    }
    jdt_free(users);
    return appended ? order_inputs_first(c, e) : JDT_OK;
}

/* The attention builtins read q, k, v, o and dout in either (B, H, T, D) or (B, T, H, D)
 * layout (runtime.h). A (0, 2, 1, 3) transpose read only by attention builtins is therefore not
 * materialised: it becomes a view of its input's buffer, and the builtin reads that buffer
 * strided (program.c passes the layout). Skipped with no_fuse. */
static jdt_status fold_attention_transposes(cprog *c, jdt_err *e)
{
    int *users = count_users(c);
    int *att_uses = jdt_calloc((size_t)c->n_nodes + 1, sizeof(int));
    if (!users || !att_uses) {
        jdt_free(users);
        jdt_free(att_uses);
        return jdt_err_set(e, JDT_ERR_NOMEM, "compile: attention layouts");
    }
    for (int i = 0; i < c->n_nodes; i++) {
        const cnode *n = &c->nodes[i];
        if (n->op == JDT_OP_ATTENTION || n->op == JDT_OP_ATTENTION_BWD)
            for (int k = 0; k < n->n_in; k++)
                att_uses[n->in[k]]++;
    }
    for (int i = 0; i < c->n_nodes; i++) {
        cnode *t = &c->nodes[i];
        if (!is_head_transpose(t) || t->kind != CK_MAP ||
            (t->dtype != JDT_DTYPE_F32 && t->dtype != JDT_DTYPE_BF16) || users[i] == 0 ||
            users[i] != att_uses[i])
            continue;
        if (c->nodes[t->in[0]].kind == CK_SPLAT) continue;
        t->kind = CK_VIEW; /* op stays TRANSPOSE: program.c reads it as (B, T, H, D) */
    }
    jdt_free(users);
    jdt_free(att_uses);
    return JDT_OK;
}

jdt_status jdt_compile_lower(cprog *c, jdt_graph *g, jdt_err *e)
{
    jdt_status st = JDT_OK;
    int n = jdt_graph_n_nodes(g);
    lowerer L = {.c = c, .simplify = !c->opts.no_simplify};
    int *map = jdt_calloc((size_t)n + 1, sizeof(int));
    int *remap = NULL;
    L.table_cap = 64;
    while (L.table_cap < 4 * n)
        L.table_cap *= 2;
    L.table = jdt_malloc(sizeof(int) * (size_t)L.table_cap);
    if (!map || !L.table) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "compile: lowering %d nodes", n);
        goto out;
    }
    memset(L.table, 0xff, sizeof(int) * (size_t)L.table_cap);

    for (int i = 0; i < n; i++) {
        jdt_tensor *t = jdt_graph_node(g, i);
        st = check_node(t, e);
        if (st != JDT_OK) goto out;
        cnode cn;
        memset(&cn, 0, sizeof cn);
        cn.op = t->op;
        cn.dtype = t->dtype;
        cn.shape = t->shape;
        cn.n_in = t->n_inputs;
        for (int k = 0; k < t->n_inputs; k++)
            cn.in[k] = map[t->inputs[k]->id];
        cn.attrs = t->attrs;
        cn.kind = kind_of(t->op, t);
        /* leaves carry their tensor; so do remat copies, which makes them distinct for CSE
         * (node_same compares src): merging a recomputation with its original would keep
         * the activation alive again */
        if (cn.kind == CK_LEAF || (t->flags & JDT_TENSOR_REMAT)) cn.src = t;
        if (cn.kind == CK_SPLAT) cn.splat = round_to(t->dtype, t->attrs.f[0]);
        /* a bf16 node is computed in f32 and stored as bf16 wherever it is materialised */
        cn.bf16 = t->dtype == JDT_DTYPE_BF16;
        int id = -2;
        if (L.simplify && cn.kind != CK_LEAF && cn.kind != CK_SPLAT) id = simplify(&L, &cn);
        if (id == -2) id = emit(&L, &cn);
        if (id < 0) {
            st = jdt_err_set(e, JDT_ERR_NOMEM, "compile: lowering node %d", i);
            goto out;
        }
        map[i] = id;
    }

    /* outputs and updates in cnode terms */
    c->n_outputs = jdt_graph_n_outputs(g);
    c->n_updates = jdt_graph_n_updates(g);
    c->outputs = jdt_calloc((size_t)c->n_outputs + 1, sizeof(int));
    c->updates = jdt_calloc((size_t)c->n_updates + 1, sizeof(cupdate));
    if (!c->outputs || !c->updates) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "compile: outputs");
        goto out;
    }
    for (int i = 0; i < c->n_outputs; i++)
        c->outputs[i] = map[jdt_graph_output(g, i)->id];
    for (int i = 0; i < c->n_updates; i++) {
        jdt_tensor *tt, *vv;
        jdt_graph_update(g, i, &tt, &vv);
        c->updates[i].target = map[tt->id];
        c->updates[i].value = map[vv->id];
    }

    /* the loss's backward next to its forward, its sums in forward order (so that the folds
     * below see each slice's dW GEMM after the sum it adds to), then again after the folds */
    if ((st = share_loss_gathers(c, e)) != JDT_OK || (st = order_loss_sums(c, e)) != JDT_OK ||
        (st = hoist_loss_backwards(c, e)) != JDT_OK)
        goto out;
    if (!c->opts.no_fuse && (st = fold_bias_adds(c, e)) != JDT_OK) goto out;
    if (!c->opts.no_fuse && c->residual_gemm && (st = fold_residual_gemms(c, e)) != JDT_OK)
        goto out;
    if (!c->opts.no_fuse && (c->gemm_bf16_out || c->attention_bf16_qkv || c->xent_bf16_logits) &&
        (st = fold_bf16_casts(c, e)) != JDT_OK)
        goto out;
    if (!c->opts.no_fuse && c->bf16_builtins && (st = fold_rope_attention(c, e)) != JDT_OK)
        goto out;
    if (!c->opts.no_fuse && c->xent_fused && (st = fold_xent_backwards(c, e)) != JDT_OK) goto out;
    if (!c->opts.no_fuse && c->gemm_gelu && (st = fold_gelu_epilogues(c, e)) != JDT_OK) goto out;
    if (!c->opts.no_fuse && c->gemm_gelu && (st = fold_dgelu_epilogues(c, e)) != JDT_OK) goto out;
    if (!c->opts.no_fuse && c->norm_bwd_scale && (st = fold_norm_scales(c, e)) != JDT_OK) goto out;
    if (!c->opts.no_fuse && c->norm_bwd_partials > 0 && (st = fold_norm_partials(c, e)) != JDT_OK)
        goto out;
    if (!c->opts.no_fuse && c->norm_bwd_partials > 0 && (st = fold_norm_cotangents(c, e)) != JDT_OK)
        goto out;
    if (!c->opts.no_fuse && c->norm_bwd_partials > 0 && (st = fold_norm_affines(c, e)) != JDT_OK)
        goto out;
    if (!c->opts.no_fuse && c->norm_dy_terms && (st = fold_norm_dy_terms(c, e)) != JDT_OK) goto out;
    if (!c->opts.no_fuse && c->gemm_accumulate &&
        (st = fold_addends(c, (addend_rule){gemm_takes, 3}, &c->stats.n_gemm_acc_folded, e)) !=
            JDT_OK)
        goto out;
    if (!c->opts.no_fuse && c->attention_groups && (st = fold_attention_groups(c, e)) != JDT_OK)
        goto out;
    if (!c->opts.no_fuse && (st = fold_attention_transposes(c, e)) != JDT_OK) goto out;
    if (!c->opts.no_fuse && c->attention_dout16_d > 0 &&
        (st = fold_attention_dout16(c, e)) != JDT_OK)
        goto out;
    if (!c->opts.no_fuse && c->attention_copy && (st = fold_attention_copies(c, e)) != JDT_OK)
        goto out;
    if (!c->opts.no_fuse && c->attention_part_rows > 0 &&
        (st = fold_attention_cotangents(c, e)) != JDT_OK)
        goto out;
    if (!c->opts.no_fuse && c->attention_lse && (st = fold_attention_lse(c, e)) != JDT_OK) goto out;
    if (!c->opts.no_fuse && c->attention_o16 && (st = fold_attention_o16(c, e)) != JDT_OK) goto out;
    if (!c->opts.no_fuse && c->rope_bhtd && (st = fold_rope_transposes(c, e)) != JDT_OK) goto out;
    if (!c->opts.no_fuse && c->norm_dy16 && (st = fold_norm_dy16(c, e)) != JDT_OK) goto out;
    if (!c->opts.no_fuse && c->bf16_builtins && (st = split_widenings(c, e)) != JDT_OK) goto out;
    if (!c->opts.no_fuse && c->host_builtins &&
        (st = fold_addends(c, (addend_rule){scatter_takes, -1}, NULL, e)) != JDT_OK)
        goto out;

    /* DCE: live = reachable from outputs, update values and targets (the folds may have
     * added nodes: remap is sized after them) */
    remap = jdt_malloc(sizeof(int) * ((size_t)c->n_nodes + 1));
    unsigned char *live = remap ? live_nodes(c) : NULL;
    if (!live) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "compile: dead code elimination");
        goto out;
    }
    for (int i = 0; i < c->n_nodes; i++)
        c->nodes[i].live = live[i];
    jdt_free(live);
    /* A live builtin's co-outputs keep their places in its chain (the kernel takes them by
     * position): one read by nothing stays while a later one is live; dead ones at the end go
     * (not written). */
    for (int i = 0; i < c->n_nodes; i++) {
        if (!c->nodes[i].live || c->nodes[i].kind != CK_BUILTIN) continue;
        int last = 0;
        for (int q = c->nodes[i].co; q; q = c->nodes[q].co)
            if (c->nodes[q].live) last = q;
        for (int q = c->nodes[i].co; last && q != last; q = c->nodes[q].co)
            c->nodes[q].live = true;
        if (!last)
            c->nodes[i].co = 0;
        else
            c->nodes[last].co = 0;
    }
    int m = 0;
    for (int i = 0; i < c->n_nodes; i++) /* first: a folded bias leaf may follow its reader */
        remap[i] = c->nodes[i].live ? m++ : -1;
    m = 0;
    for (int i = 0; i < c->n_nodes; i++) {
        if (!c->nodes[i].live) continue;
        cnode cn = c->nodes[i];
        for (int k = 0; k < cn.n_in; k++)
            cn.in[k] = remap[cn.in[k]];
        cn.co = cn.co ? remap[cn.co] : 0; /* live: above */
        c->nodes[m++] = cn;
    }
    c->n_nodes = m;
    for (int i = 0; i < c->n_outputs; i++)
        c->outputs[i] = remap[c->outputs[i]];
    for (int i = 0; i < c->n_updates; i++) {
        c->updates[i].target = remap[c->updates[i].target];
        c->updates[i].value = remap[c->updates[i].value];
    }
    if ((st = hoist_loss_backwards(c, e)) != JDT_OK) goto out;
    /* An output that is (a view of) an updated leaf must show the pre-step value, but the
     * leaf's buffer receives the update: such outputs read through an identity copy. */
    for (int i = 0; i < c->n_outputs; i++) {
        int r = c->outputs[i];
        while (c->nodes[r].kind == CK_VIEW)
            r = c->nodes[r].in[0];
        bool updated = false;
        for (int k = 0; k < c->n_updates; k++)
            updated = updated || c->updates[k].target == r;
        if (!updated) continue;
        if (!jdt_compile_grow((void **)&c->nodes, &c->cap_nodes, c->n_nodes + 1, sizeof(cnode))) {
            st = jdt_err_set(e, JDT_ERR_NOMEM, "compile: output copy");
            goto out;
        }
        cnode cp = c->nodes[c->outputs[i]];
        cp.op = JDT_OP_STOP_GRADIENT;
        cp.kind = CK_EW;
        cp.n_in = 1;
        cp.in[0] = c->outputs[i];
        cp.src = NULL;
        cp.co = 0;
        cp.live = true;
        cp.n_users = 0;
        cp.group = cp.buf = -1;
        c->nodes[c->n_nodes] = cp;
        c->outputs[i] = c->n_nodes++;
    }
    for (int i = 0; i < c->n_nodes; i++)
        for (int k = 0; k < c->nodes[i].n_in; k++)
            c->nodes[c->nodes[i].in[k]].n_users++;
    c->stats.n_ops_in = n;
    c->stats.n_ops_out = c->n_nodes;
out:
    jdt_free(map);
    jdt_free(remap);
    jdt_free(L.table);
    return st;
}
