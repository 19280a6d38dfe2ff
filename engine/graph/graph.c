/*
 * graph.c — the IR core: the arena, node storage, outputs and updates (see graph.h).
 * Shape rules and the builder API live in builder.c; this file never checks op semantics.
 */
#include "graph/graph.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    int arity;
    jdt_op_class cls;
} OPS[JDT_OP_COUNT] = {
#define X_(name, str, n_in, cls) {str, n_in, JDT_OPC_##cls},
    JDT_OP_LIST(X_)
#undef X_
};
_Static_assert(JDT_ARRAY_LEN(OPS) == JDT_OP_COUNT, "op table incomplete");

typedef struct arena_block {
    struct arena_block *next;
    size_t used, cap;
    _Alignas(64) unsigned char data[];
} arena_block;

typedef struct {
    jdt_tensor *target, *value;
} graph_update;

struct jdt_graph {
    arena_block *arena;
    int cur_block; /* block id given to new nodes */
    bool matmul_bf16; /* MATMULs built from now on compute in bf16 (attrs i[2] = 1) */
    bool bf16_weights; /* models read GEMM weights through a CAST to bf16 */
    bool bf16_grads;   /* GEMM VJPs round bf16 activations' cotangents to bf16 */
    jdt_tensor **nodes; /* (n_nodes) */
    int n_nodes, cap_nodes;
    jdt_tensor **outputs;
    int n_outputs, cap_outputs;
    graph_update *updates;
    int n_updates, cap_updates;
    /* name index for jdt_graph_find, built lazily: open addressing over the ids of named
     * nodes (id + 1; 0 = empty), covering nodes [0, n_indexed) */
    int *name_slots; /* (name_cap), a power of two */
    int name_cap, n_named, n_indexed;
    jdt_err err; /* the first builder error (sticky); code JDT_OK while none */
};

const char *jdt_op_name(jdt_op op) { return ((int)op >= 0 && (int)op < JDT_OP_COUNT) ? OPS[op].name : "?"; }
int jdt_op_arity(jdt_op op) { return ((int)op >= 0 && (int)op < JDT_OP_COUNT) ? OPS[op].arity : 0; }
jdt_op_class jdt_op_class_of(jdt_op op) { return ((int)op >= 0 && (int)op < JDT_OP_COUNT) ? OPS[op].cls : (jdt_op_class)JDT_OPC_COUNT; }

const char *jdt_op_class_name(jdt_op_class c)
{
    static const char *const NAMES[] = {"leaf", "elementwise", "generator", "shape", "reduction",
                                        "matmul", "index", "fused", "collective"};
    _Static_assert(JDT_ARRAY_LEN(NAMES) == JDT_OPC_COUNT, "op class names incomplete");
    return ((int)c >= 0 && c < JDT_OPC_COUNT) ? NAMES[c] : "?";
}

int64_t jdt_shape_numel(const jdt_shape *s)
{
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) n *= s->dims[i];
    return n;
}

bool jdt_shape_eq(const jdt_shape *a, const jdt_shape *b)
{
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->dims[i] != b->dims[i]) return false;
    return true;
}

jdt_shape jdt_shape_make(int ndim, const int64_t *dims)
{
    jdt_shape s;
    memset(&s, 0, sizeof s);
    s.ndim = ndim;
    for (int i = 0; i < ndim && i < JDT_MAX_DIMS; i++) s.dims[i] = dims[i];
    return s;
}

char *jdt_shape_str(const jdt_shape *s, char *buf, size_t n)
{
    size_t off = 0;
    off += (size_t)snprintf(buf + off, n - off, "(");
    for (int i = 0; i < s->ndim && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, i ? ", %lld" : "%lld", (long long)s->dims[i]);
    if (off < n) snprintf(buf + off, n - off, ")");
    return buf;
}

jdt_graph *jdt_graph_new(void) { return jdt_calloc(1, sizeof(jdt_graph)); }

jdt_status jdt_graph_fail(jdt_graph *g, jdt_status code, const char *fmt, ...)
{
    if (g->err.code != JDT_OK) return g->err.code;
    va_list ap;
    va_start(ap, fmt);
    jdt_err_vset(&g->err, code, fmt, ap);
    va_end(ap);
    return code;
}

jdt_status jdt_graph_error(const jdt_graph *g, jdt_err *e)
{
    if (!g) return jdt_err_set(e, JDT_ERR_INVALID, "graph is NULL");
    if (g->err.code == JDT_OK) return JDT_OK;
    return jdt_err_set(e, g->err.code, "%s", g->err.msg);
}

const char *jdt_graph_error_msg(const jdt_graph *g) { return g->err.code == JDT_OK ? NULL : g->err.msg; }

void jdt_graph_free(jdt_graph *g)
{
    if (!g) return;
    for (arena_block *b = g->arena, *next; b; b = next) {
        next = b->next;
        jdt_free_aligned(b);
    }
    jdt_free(g->nodes);
    jdt_free(g->outputs);
    jdt_free(g->updates);
    jdt_free(g->name_slots);
    jdt_free(g);
}

void *jdt_graph_alloc(jdt_graph *g, size_t n_bytes)
{
    n_bytes = (n_bytes + 63) & ~(size_t)63;
    if (!n_bytes) n_bytes = 64;
    arena_block *b = g->arena;
    if (!b || b->cap - b->used < n_bytes) {
        size_t cap = n_bytes > (1u << 16) ? n_bytes : (1u << 16);
        b = jdt_malloc_aligned(sizeof(arena_block) + cap);
        if (!b) return NULL;
        b->used = 0;
        b->cap = cap;
        b->next = g->arena;
        g->arena = b;
    }
    void *p = b->data + b->used;
    b->used += n_bytes;
    memset(p, 0, n_bytes);
    return p;
}

const char *jdt_graph_strdup(jdt_graph *g, const char *s)
{
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = jdt_graph_alloc(g, n);
    if (d) memcpy(d, s, n);
    return d;
}

static bool grow(void **arr, int *cap, int need, size_t elem)
{
    if (need <= *cap) return true;
    int nc = *cap ? *cap * 2 : 64;
    while (nc < need) nc *= 2;
    void *p = jdt_realloc(*arr, (size_t)nc * elem);
    if (!p) return false;
    *arr = p;
    *cap = nc;
    return true;
}

jdt_tensor *jdt_graph_new_node(jdt_graph *g, jdt_op op, jdt_dtype dtype, const jdt_shape *shape,
                               int n_inputs, jdt_tensor *const *inputs, const jdt_attrs *attrs)
{
    if (n_inputs < 0 || n_inputs > JDT_MAX_INPUTS) return NULL;
    if (!grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof(jdt_tensor *))) return NULL;
    jdt_tensor *t = jdt_graph_alloc(g, sizeof(jdt_tensor));
    if (!t) return NULL;
    t->id = g->n_nodes;
    t->op = op;
    t->dtype = dtype;
    t->shape = *shape;
    t->n_inputs = n_inputs;
    for (int i = 0; i < n_inputs; i++) t->inputs[i] = inputs[i];
    if (attrs) t->attrs = *attrs;
    t->block = g->cur_block;
    if (op == JDT_OP_PARAM) t->flags |= JDT_TENSOR_PARAM;
    if (op == JDT_OP_INPUT) t->flags |= JDT_TENSOR_INPUT;
    g->nodes[g->n_nodes++] = t;
    return t;
}

int jdt_graph_n_nodes(const jdt_graph *g) { return g->n_nodes; }

jdt_tensor *jdt_graph_node(const jdt_graph *g, int id)
{
    return (id >= 0 && id < g->n_nodes) ? g->nodes[id] : NULL;
}

int jdt_graph_add_output(jdt_graph *g, jdt_tensor *t)
{
    if (!grow((void **)&g->outputs, &g->cap_outputs, g->n_outputs + 1, sizeof(jdt_tensor *)))
        return -1;
    t->flags |= JDT_TENSOR_OUTPUT;
    g->outputs[g->n_outputs] = t;
    return g->n_outputs++;
}

int jdt_graph_n_outputs(const jdt_graph *g) { return g->n_outputs; }

jdt_tensor *jdt_graph_output(const jdt_graph *g, int i)
{
    return (i >= 0 && i < g->n_outputs) ? g->outputs[i] : NULL;
}

int jdt_graph_add_update(jdt_graph *g, jdt_tensor *target, jdt_tensor *value)
{
    if (!target || !value) return -1;
    if (target->op != JDT_OP_PARAM && !(target->flags & JDT_TENSOR_STATE)) return -1;
    if (!jdt_shape_eq(&target->shape, &value->shape) || target->dtype != value->dtype) return -1;
    if (!grow((void **)&g->updates, &g->cap_updates, g->n_updates + 1, sizeof(graph_update)))
        return -1;
    g->updates[g->n_updates].target = target;
    g->updates[g->n_updates].value = value;
    return g->n_updates++;
}

int jdt_graph_n_updates(const jdt_graph *g) { return g->n_updates; }

void jdt_graph_update(const jdt_graph *g, int i, jdt_tensor **target, jdt_tensor **value)
{
    *target = g->updates[i].target;
    *value = g->updates[i].value;
}

void jdt_graph_set_block(jdt_graph *g, int block) { g->cur_block = block; }
void jdt_graph_set_matmul_bf16(jdt_graph *g, bool on) { g->matmul_bf16 = on; }
bool jdt_graph_matmul_bf16(const jdt_graph *g) { return g->matmul_bf16; }
void jdt_graph_set_bf16_weights(jdt_graph *g, bool on) { g->bf16_weights = on; }
bool jdt_graph_bf16_weights(const jdt_graph *g) { return g->bf16_weights; }
void jdt_graph_set_bf16_grads(jdt_graph *g, bool on) { g->bf16_grads = on; }
bool jdt_graph_bf16_grads(const jdt_graph *g) { return g->bf16_grads; }

/* Puts node id into the name index (which has room). */
static void name_insert(jdt_graph *g, int id)
{
    size_t mask = (size_t)g->name_cap - 1, i = (size_t)jdt_hash_str(JDT_HASH_INIT, g->nodes[id]->name) & mask;
    while (g->name_slots[i]) i = (i + 1) & mask;
    g->name_slots[i] = id + 1;
    g->n_named++;
}

/* Indexes the named nodes appended since the last call; false when out of memory. A name is
 * set once, right after its node is appended (builder.c leaf()), so it is in place here. */
static bool name_index_update(jdt_graph *g)
{
    for (; g->n_indexed < g->n_nodes; g->n_indexed++) {
        if (!g->nodes[g->n_indexed]->name) continue;
        if (2 * (g->n_named + 1) > g->name_cap) { /* keep the load at most 1/2 */
            int cap = g->name_cap ? 2 * g->name_cap : 256;
            int *slots = jdt_calloc((size_t)cap, sizeof *slots);
            if (!slots) return false;
            int *old = g->name_slots, old_cap = g->name_cap;
            g->name_slots = slots;
            g->name_cap = cap;
            g->n_named = 0;
            for (int k = 0; k < old_cap; k++)
                if (old[k]) name_insert(g, old[k] - 1);
            jdt_free(old);
        }
        name_insert(g, g->n_indexed);
    }
    return true;
}

jdt_tensor *jdt_graph_find(jdt_graph *g, const char *name)
{
    if (name_index_update(g) && g->name_cap) {
        size_t mask = (size_t)g->name_cap - 1, i = (size_t)jdt_hash_str(JDT_HASH_INIT, name) & mask;
        for (; g->name_slots[i]; i = (i + 1) & mask) {
            jdt_tensor *t = g->nodes[g->name_slots[i] - 1];
            if (strcmp(t->name, name) == 0) return t;
        }
        return NULL;
    }
    for (int i = 0; i < g->n_nodes; i++) { /* no memory for the index: scan */
        jdt_tensor *t = g->nodes[i];
        if (t->name && strcmp(t->name, name) == 0) return t;
    }
    return NULL;
}
