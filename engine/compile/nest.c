/*
 * nest.c — the device-neutral half of code generation: a fused group as a loop nest over its
 * domain. Every memory access (reads of materialised inputs, stores of members, the reduction
 * output) is an affine map of the loop indices (stride per dim + base), which covers identity
 * reads, broadcasts (stride 0), transposes (permuted strides) and slices (base offset); the
 * maps of absorbed strided reads compose. Adjacent dims are merged whenever every access allows
 * it. The values of the members are written as C expressions that both dialects accept (plain
 * C for the CPU emitter, CUDA C++ for NVRTC): literals, operators, `exp`/`log`/`sqrt`/`fabs`/
 * `pow` overloaded on the node's type, and the helpers jdt_expf, jdt_tanhf, jdt_philox_w0 and
 * jdt_unit that each backend's prelude defines. The per-backend emitters
 * (engine/backend/cpu/emit.c, engine/backend/cuda/emit.c) turn a nest into loops or threads.
 */
#include "compile/compile-impl.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void jdt_sb_printf(jdt_sbuf *s, const char *fmt, ...)
{
    if (s->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(s->buf ? s->buf + s->len : NULL, s->buf ? s->cap - s->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            s->oom = true;
            return;
        }
        if (s->buf && s->len + (size_t)n < s->cap) {
            s->len += (size_t)n;
            return;
        }
        size_t nc = s->cap ? s->cap * 2 : 65536;
        while (nc < s->len + (size_t)n + 1)
            nc *= 2;
        char *p = jdt_realloc(s->buf, nc);
        if (!p) {
            s->oom = true;
            return;
        }
        s->buf = p;
        s->cap = nc;
    }
}

const char *jdt_nest_ctype(jdt_dtype dt)
{
    switch (dt) {
    case JDT_DTYPE_F32:
        return "float";
    case JDT_DTYPE_F64:
        return "double";
    case JDT_DTYPE_I32:
        return "int32_t";
    case JDT_DTYPE_U8:
        return "uint8_t";
    case JDT_DTYPE_U16:
        return "uint16_t";
    case JDT_DTYPE_U32:
        return "uint32_t";
    case JDT_DTYPE_BF16: /* computed in f32; its storage is uint16_t (cnode.bf16) */
        return "float";
    case JDT_DTYPE_COUNT:
        break;
    }
    return "void";
}

static bool is_float(jdt_dtype dt)
{
    return dt == JDT_DTYPE_F32 || dt == JDT_DTYPE_F64 || dt == JDT_DTYPE_BF16;
}

/* f32 math for f32 and bf16 values (the inline exp and tanh) */
static bool f32_math(jdt_dtype dt)
{
    return dt == JDT_DTYPE_F32 || dt == JDT_DTYPE_BF16;
}

/* A literal of type dt ("((float)0.5)", "((float)INFINITY)", "((int32_t)3)"). */
void jdt_nest_lit(char *out, size_t n, jdt_dtype dt, double v)
{
    const char *t = jdt_nest_ctype(dt);
    if (!is_float(dt))
        snprintf(out, n, "((%s)%lld)", t, (long long)v);
    else if (isnan(v))
        snprintf(out, n, "((%s)NAN)", t);
    else if (isinf(v))
        snprintf(out, n, "(%s(%s)INFINITY)", v < 0 ? "-" : "", t);
    else
        snprintf(out, n, "((%s)%.17g)", t, v);
}

/* ---- accesses and dim collapsing ------------------------------------------------------------ */

static void contiguous(const jdt_shape *s, int64_t *st)
{
    int64_t k = 1;
    for (int d = s->ndim - 1; d >= 0; d--) {
        st[d] = s->dims[d] == 1 ? 0 : k;
        k *= s->dims[d];
    }
}

/* Strides (in domain coords) of a MAP member's read. Each strided op is an affine index map
 * in = S * out + o (S selects dims: broadcast drops/zeros, transpose permutes, slice offsets);
 * maps of absorbed producers compose, then the buffer's contiguous strides give the offsets. */
static void map_strides(const cprog *c, const cnode *m, jdt_access *a)
{
    int nd = m->shape.ndim;
    int64_t M[JDT_MAX_DIMS][JDT_MAX_DIMS], o[JDT_MAX_DIMS];
    memset(M, 0, sizeof M);
    memset(o, 0, sizeof o);
    for (int k = 0; k < nd; k++)
        M[k][k] = 1; /* cur index = M * domain index + o, cur = m's output */
    const cnode *cur = m;
    const cnode *x = &c->nodes[cur->in[0]];
    for (;;) {
        int cd = cur->shape.ndim, xd = x->shape.ndim;
        int64_t S[JDT_MAX_DIMS][JDT_MAX_DIMS], so[JDT_MAX_DIMS], M2[JDT_MAX_DIMS][JDT_MAX_DIMS],
            o2[JDT_MAX_DIMS];
        memset(S, 0, sizeof S);
        memset(so, 0, sizeof so);
        if (cur->op == JDT_OP_BROADCAST) {
            int lead = cd - xd;
            for (int l = 0; l < xd; l++)
                if (x->shape.dims[l] != 1) S[l][l + lead] = 1;
        } else if (cur->op == JDT_OP_TRANSPOSE) {
            for (int k = 0; k < cd; k++)
                S[cur->attrs.i[k]][k] = 1;
        } else { /* SLICE */
            for (int l = 0; l < xd; l++)
                S[l][l] = 1;
            so[cur->attrs.i[0]] = cur->attrs.i[1];
        }
        for (int l = 0; l < xd; l++) {
            o2[l] = so[l];
            for (int j = 0; j < cd; j++)
                o2[l] += S[l][j] * o[j];
            for (int k = 0; k < nd; k++) {
                M2[l][k] = 0;
                for (int j = 0; j < cd; j++)
                    M2[l][k] += S[l][j] * M[j][k];
            }
        }
        memcpy(M, M2, sizeof M);
        memcpy(o, o2, sizeof o);
        if (!x->absorbed) break;
        cur = x;
        x = &c->nodes[cur->in[0]];
    }
    int64_t in_st[JDT_MAX_DIMS];
    contiguous(&x->shape, in_st);
    memset(a->stride, 0, sizeof a->stride);
    a->base = 0;
    for (int l = 0; l < x->shape.ndim; l++) {
        a->base += in_st[l] * o[l];
        for (int k = 0; k < nd; k++)
            a->stride[k] += in_st[l] * M[l][k];
    }
}

static int add_access(jdt_nest *N, int node, int reader, bool write)
{
    for (int i = 0; i < N->n_acc; i++)
        if (N->acc[i].node == node && N->acc[i].reader == reader && N->acc[i].write == write)
            return i;
    if (N->n_acc >= JDT_NEST_MAX_ACC) return -1;
    const cprog *c = N->c;
    jdt_access *a = &N->acc[N->n_acc];
    memset(a, 0, sizeof *a);
    a->node = node;
    a->reader = reader;
    a->write = write;
    const jdt_shape *dom = &N->g->domain;
    if (reader >= 0) {
        map_strides(c, &c->nodes[reader], a);
    } else if (write && c->nodes[node].kind == CK_REDUCE) {
        /* kept dims contiguous over the kept shape, reduced dims 0 */
        int64_t k = 1;
        for (int d = dom->ndim - 1; d >= 0; d--) {
            if (cnode_reduces_axis(&c->nodes[node], d)) continue;
            a->stride[d] = dom->dims[d] == 1 ? 0 : k;
            k *= dom->dims[d];
        }
    } else if (jdt_shape_numel(&c->nodes[node].shape) == 1 && jdt_shape_numel(dom) != 1) {
        /* scalar read (DROPOUT's step) */
    } else {
        contiguous(dom, a->stride);
    }
    return N->n_acc++;
}

static void collapse(jdt_nest *N)
{
    const jdt_shape *dom = &N->g->domain;
    int64_t st[JDT_NEST_MAX_ACC][JDT_MAX_DIMS];
    int n = 0;
    /* drop size-1 dims */
    for (int d = 0; d < dom->ndim; d++) {
        if (dom->dims[d] == 1) continue;
        N->dims[n] = dom->dims[d];
        N->kept[n] = !N->g->is_reduce || !cnode_reduces_axis(&N->c->nodes[N->g->root], d);
        for (int a = 0; a < N->n_acc; a++)
            st[a][n] = N->acc[a].stride[d];
        n++;
    }
    /* merge k, k+1 when every jdt_access allows it */
    for (int k = n - 2; k >= 0; k--) {
        bool ok = N->kept[k] == N->kept[k + 1];
        for (int a = 0; a < N->n_acc && ok; a++)
            ok = st[a][k] == st[a][k + 1] * N->dims[k + 1];
        if (!ok) continue;
        N->dims[k] *= N->dims[k + 1];
        for (int a = 0; a < N->n_acc; a++)
            st[a][k] = st[a][k + 1];
        for (int j = k + 1; j < n - 1; j++) {
            N->dims[j] = N->dims[j + 1];
            N->kept[j] = N->kept[j + 1];
            for (int a = 0; a < N->n_acc; a++)
                st[a][j] = st[a][j + 1];
        }
        n--;
    }
    if (n == 0) { /* a single element */
        N->dims[0] = 1;
        N->kept[0] = true;
        for (int a = 0; a < N->n_acc; a++)
            st[a][0] = 0;
        n = 1;
    }
    N->n = n;
    for (int a = 0; a < N->n_acc; a++) {
        memset(N->acc[a].stride, 0, sizeof N->acc[a].stride);
        for (int k = 0; k < n; k++)
            N->acc[a].stride[k] = st[a][k];
    }
}

void jdt_nest_offset(const jdt_nest *N, int a, char *out, size_t n)
{
    size_t off = (size_t)snprintf(out, n, "%lld", (long long)N->acc[a].base);
    for (int k = 0; k < N->n && off < n; k++) {
        int64_t s = N->acc[a].stride[k];
        if (s == 0) continue;
        if (s == 1)
            off += (size_t)snprintf(out + off, n - off, " + i%d", k);
        else
            off += (size_t)snprintf(out + off, n - off, " + %lldLL * i%d", (long long)s, k);
    }
}

/* ---- values ---------------------------------------------------------------------------------- */

/* The expression naming input k of member m: a literal, a member value or a loaded read. */
/* The reader of member m's input k, as accesses record it: m itself for a strided read (MAP),
 * the absorbed strided read when the input is one (a broadcast several groups read, fuse.c
 * broadcast_absorbable), else -1 (a read at the loop index). */
static int read_reader(const cprog *c, const cnode *m, int k)
{
    if (m->kind == CK_MAP) return (int)(m - c->nodes);
    return c->nodes[m->in[k]].absorbed ? m->in[k] : -1;
}

void jdt_nest_operand(const jdt_nest *N, const cnode *m, int k, char *out, size_t n)
{
    const cprog *c = N->c;
    int x = cnode_read_src(c, m->in[k]);
    const cnode *xn = &c->nodes[x];
    const int r = read_reader(c, m, k);
    if (xn->kind == CK_SPLAT)
        jdt_nest_lit(out, n, xn->dtype, xn->splat);
    else if (xn->group == m->group && m->group >= 0 && r < 0)
        snprintf(out, n, "v%d", x);
    else {
        for (int a = 0; a < N->n_acc; a++)
            if (!N->acc[a].write && N->acc[a].node == x && N->acc[a].reader == r) {
                snprintf(out, n, "x%d", a);
                return;
            }
        snprintf(out, n, "0 /* missing */");
    }
}

/* A bf16 member whose f32 result must be rounded to bf16 (its op is not JDT_OPF_EXACT_BF16). */
static bool bf16_rounded(const cnode *m)
{
    return m->dtype == JDT_DTYPE_BF16 && !(jdt_op_flags(m->op) & JDT_OPF_EXACT_BF16);
}

static void emit_value(jdt_sbuf *s, const jdt_nest *N, int id)
{
    const cprog *c = N->c;
    const cnode *m = &c->nodes[id];
    const char *T = jdt_nest_ctype(m->dtype);
    char a[96] = "", b[96] = "", d[96] = "", e4[96] = "";
    if (m->n_in > 0) jdt_nest_operand(N, m, 0, a, sizeof a);
    if (m->n_in > 1) jdt_nest_operand(N, m, 1, b, sizeof b);
    if (m->n_in > 2) jdt_nest_operand(N, m, 2, d, sizeof d);
    if (m->n_in > 3) jdt_nest_operand(N, m, 3, e4, sizeof e4);
    double f = m->attrs.f[0];
    const char *EXP = f32_math(m->dtype) ? "jdt_expf" : "exp";
    const char *TANH = f32_math(m->dtype) ? "jdt_tanhf" : "tanh";
    char F[64];
    jdt_nest_lit(F, sizeof F, m->dtype, f);
    /* a bf16 member's f32 result is u<id>; jdt_nest_value rounds it into v<id> */
    jdt_sb_printf(s, "        const %s %c%d = ", T, bf16_rounded(m) ? 'u' : 'v', id);
    switch (m->op) {
    case JDT_OP_CONSTANT: {
        char L[64];
        jdt_nest_lit(L, sizeof L, m->dtype, m->splat);
        jdt_sb_printf(s, "%s;\n", L);
        return;
    }
    case JDT_OP_BROADCAST:
    case JDT_OP_TRANSPOSE:
    case JDT_OP_SLICE:
        jdt_sb_printf(s, "%s;\n", a);
        return;
    case JDT_OP_NEG:
        jdt_sb_printf(s, "-%s;\n", a);
        return;
    case JDT_OP_EXP:
        jdt_sb_printf(s, "%s(%s);\n", EXP, a);
        return;
    case JDT_OP_LOG:
        jdt_sb_printf(s, "log(%s);\n", a);
        return;
    case JDT_OP_TANH:
        jdt_sb_printf(s, "%s(%s);\n", TANH, a);
        return;
    case JDT_OP_SQRT:
        jdt_sb_printf(s, "sqrt(%s);\n", a);
        return;
    case JDT_OP_RSQRT:
        jdt_sb_printf(s, "(%s)1 / sqrt(%s);\n", T, a);
        return;
    case JDT_OP_RELU:
        jdt_sb_printf(s, "%s > (%s)0 ? %s : (%s)0;\n", a, T, a, T);
        return;
    case JDT_OP_GELU:
        jdt_sb_printf(
            s,
            "(%s)0.5 * %s * ((%s)1 + %s((%s)0.7978845608028654 * (%s + (%s)0.044715 * %s * "
            "%s * %s)));\n",
            T, a, T, TANH, T, a, T, a, a, a);
        return;
    case JDT_OP_SILU:
        jdt_sb_printf(s, "%s / ((%s)1 + %s(-%s));\n", a, T, EXP, a);
        return;
    case JDT_OP_SIGMOID:
        jdt_sb_printf(s, "(%s)1 / ((%s)1 + %s(-%s));\n", T, T, EXP, a);
        return;
    case JDT_OP_ABS:
        jdt_sb_printf(s, "fabs(%s);\n", a);
        return;
    case JDT_OP_ADD:
        jdt_sb_printf(s, "%s + %s;\n", a, b);
        return;
    case JDT_OP_SUB:
        jdt_sb_printf(s, "%s - %s;\n", a, b);
        return;
    case JDT_OP_MUL:
        jdt_sb_printf(s, "%s * %s;\n", a, b);
        return;
    case JDT_OP_DIV:
        jdt_sb_printf(s, "%s / %s;\n", a, b);
        return;
    case JDT_OP_MAX:
        jdt_sb_printf(s, "%s >= %s ? %s : %s;\n", a, b, a, b);
        return;
    case JDT_OP_MIN:
        jdt_sb_printf(s, "%s <= %s ? %s : %s;\n", a, b, a, b);
        return;
    case JDT_OP_GT:
        jdt_sb_printf(s, "%s > %s ? (%s)1 : (%s)0;\n", a, b, T, T);
        return;
    case JDT_OP_GE:
        jdt_sb_printf(s, "%s >= %s ? (%s)1 : (%s)0;\n", a, b, T, T);
        return;
    case JDT_OP_ADD_SCALAR:
        jdt_sb_printf(s, "%s + %s;\n", a, F);
        return;
    case JDT_OP_MUL_SCALAR:
        jdt_sb_printf(s, "%s * %s;\n", a, F);
        return;
    case JDT_OP_POW_SCALAR:
        if (f == 2.0)
            jdt_sb_printf(s, "%s * %s;\n", a, a);
        else if (f == 3.0)
            jdt_sb_printf(s, "%s * %s * %s;\n", a, a, a);
        else if (f == -1.0)
            jdt_sb_printf(s, "(%s)1 / %s;\n", T, a);
        else if (f == 0.5) /* GCC's vectoriser turns pow(x, 0.5) into sqrt(x), which differs at
                              -0 and -inf: spell out pow's values there */
            jdt_sb_printf(s, "%s == -(%s)INFINITY ? (%s)INFINITY : sqrt(%s) + (%s)0;\n", a, T, T, a,
                          T);
        else
            jdt_sb_printf(s, "pow(%s, %s);\n", a, F);
        return;
    case JDT_OP_SELECT:
        jdt_sb_printf(s, "%s != 0 ? %s : %s;\n", a, b, d);
        return;
    case JDT_OP_CAST:
        if (m->dtype == JDT_DTYPE_I32 && is_float(N->c->nodes[m->in[0]].dtype))
            /* saturating, NaN -> 0: a plain C cast is undefined out of range */
            jdt_sb_printf(s,
                          "%s != %s ? 0 : %s >= 2147483647.0 ? INT32_MAX : %s <= -2147483648.0 ? "
                          "INT32_MIN : (int32_t)%s;\n",
                          a, a, a, a, a);
        else
            jdt_sb_printf(s, "(%s)%s;\n", T, a);
        return;
    case JDT_OP_STOP_GRADIENT:
        jdt_sb_printf(s, "%s;\n", a);
        return;
    case JDT_OP_DROPOUT: {
        double p = f, scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
        char P[64], SC[64];
        jdt_nest_lit(P, sizeof P, JDT_DTYPE_F32, p);
        jdt_nest_lit(SC, sizeof SC, m->dtype, scale);
        /* the counter: the flat index, or with row0 (input 2) and a block's base (input 3, the
         * partitioner's) the element's index in the step's whole batch: row0 times the row
         * stride, plus base, plus each local index times its global stride (attrs i[2 + d]).
         * The dims from j on, where the block is whole inward of j (global stride of j - 1 =
         * stride of j times j's local size), are one term: the flat index modulo their size
         * (all of it with one device, or on the batch's rows: no division) */
        char ctr[640] = "(uint64_t)flat";
        if (m->n_in > 2) {
            const int nd = m->shape.ndim;
            const int64_t *S = &m->attrs.i[2], *L = m->shape.dims;
            int j = nd - 1;
            while (j >= 1 && S[j - 1] == S[j] * L[j])
                j--;
            int64_t ls[8], acc = 1;
            for (int k = nd - 1; k >= 0; k--) {
                ls[k] = acc;
                acc *= L[k];
            }
            size_t o = (size_t)snprintf(ctr, sizeof ctr, "(uint64_t)((int64_t)%s * %lldLL%s%s", d,
                                        (long long)S[0], m->n_in > 3 ? " + (int64_t)" : "",
                                        m->n_in > 3 ? e4 : "");
            if (j <= 0)
                o += (size_t)snprintf(ctr + o, sizeof ctr - o, " + flat");
            else
                o += (size_t)snprintf(ctr + o, sizeof ctr - o, " + flat %% %lldLL",
                                      (long long)(ls[j] * L[j]));
            for (int k = 0; k < j && o < sizeof ctr; k++)
                if (L[k] > 1)
                    o += (size_t)snprintf(ctr + o, sizeof ctr - o,
                                          " + (flat / %lldLL %% %lldLL) * %lldLL", (long long)ls[k],
                                          (long long)L[k], (long long)S[k]);
            if (o < sizeof ctr) snprintf(ctr + o, sizeof ctr - o, ")");
        }
        jdt_sb_printf(s,
                      "jdt_unit(jdt_philox_w0(%lluULL, (uint64_t)(int64_t)%s, %s)) >= %s "
                      "? %s * %s : (%s)0;\n",
                      (unsigned long long)m->attrs.i[0], b, ctr, P, a, SC, T);
        return;
    }
    case JDT_OP_IOTA: {
        int ax = (int)m->attrs.i[0];
        int64_t inner = 1;
        for (int k = ax + 1; k < m->shape.ndim; k++)
            inner *= m->shape.dims[k];
        jdt_sb_printf(s, "(%s)((flat / %lldLL) %% %lldLL);\n", T, (long long)inner,
                      (long long)m->shape.dims[ax]);
        return;
    }
    case JDT_OP_CAUSAL_MASK: {
        long long t = (long long)m->shape.dims[1];
        jdt_sb_printf(s, "(flat %% %lldLL) <= (flat / %lldLL) ? (%s)0 : -(%s)INFINITY;\n", t, t, T,
                      T);
        return;
    }
    case JDT_OP_GELU_GRAD: /* written by jdt_nest_value */
    case JDT_OP_SILU_GRAD:
    case JDT_OP_PARAM: /* not members of a fused group: leaves, reductions (written by the */
    case JDT_OP_INPUT: /* emitter as the group's accumulation), views and builtins */
    case JDT_OP_REDUCE_SUM:
    case JDT_OP_REDUCE_MAX:
    case JDT_OP_REDUCE_MEAN:
    case JDT_OP_RESHAPE:
    case JDT_OP_CONCAT:
    case JDT_OP_MATMUL:
    case JDT_OP_GATHER:
    case JDT_OP_SCATTER_ADD:
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
    /* none of the ops above should reach here: an error, never generated zeros */
    jdt_sb_printf(s, "0;\n");
    if (!s->bad_node) s->bad_node = id + 1;
}

jdt_status jdt_sb_status(const jdt_sbuf *s, const cprog *c, const char *what, jdt_err *e)
{
    if (s->bad_node)
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "%s: node %d: op '%s' (%d) has no emitter", what,
                           s->bad_node - 1, jdt_op_name(c->nodes[s->bad_node - 1].op),
                           (int)c->nodes[s->bad_node - 1].op);
    if (s->oom) return jdt_err_set(e, JDT_ERR_NOMEM, "%s: source buffer", what);
    return JDT_OK;
}

static void emit_grad_value(jdt_sbuf *s, const jdt_nest *N, int id);

/* GELU_GRAD/SILU_GRAD need a temporary; written as a statement block. A bf16 member is
 * computed in f32 and rounded to bf16 (jdt_bf16_rn, nearest even) right there, stored or not,
 * so its readers inside the group see the value the reference rounds. */
void jdt_nest_value(jdt_sbuf *s, const jdt_nest *N, int id)
{
    const cnode *m = &N->c->nodes[id];
    if (m->op != JDT_OP_GELU_GRAD && m->op != JDT_OP_SILU_GRAD)
        emit_value(s, N, id);
    else
        emit_grad_value(s, N, id);
    if (bf16_rounded(m)) jdt_sb_printf(s, "        const float v%d = jdt_bf16_rn(u%d);\n", id, id);
}

static void emit_grad_value(jdt_sbuf *s, const jdt_nest *N, int id)
{
    const cnode *m = &N->c->nodes[id];
    const char *T = jdt_nest_ctype(m->dtype);
    const char *V = bf16_rounded(m) ? "u" : "v";
    const char *EXP = f32_math(m->dtype) ? "jdt_expf" : "exp";
    const char *TANH = f32_math(m->dtype) ? "jdt_tanhf" : "tanh";
    char x[96], dy[96];
    jdt_nest_operand(N, m, 0, x, sizeof x);
    jdt_nest_operand(N, m, 1, dy, sizeof dy);
    if (m->op == JDT_OP_GELU_GRAD) {
        jdt_sb_printf(
            s,
            "        const %s t%d = %s((%s)0.7978845608028654 * (%s + (%s)0.044715 * %s * %s "
            "* %s));\n",
            T, id, TANH, T, x, T, x, x, x);
        jdt_sb_printf(
            s,
            "        const %s %s%d = %s * ((%s)0.5 * ((%s)1 + t%d) + (%s)0.5 * %s * ((%s)1 - "
            "t%d * t%d) * (%s)0.7978845608028654 * ((%s)1 + (%s)0.134145 * %s * %s));\n",
            T, V, id, dy, T, T, id, T, x, T, id, id, T, T, T, x, x);
    } else {
        jdt_sb_printf(s, "        const %s t%d = (%s)1 / ((%s)1 + %s(-%s));\n", T, id, T, T, EXP,
                      x);
        jdt_sb_printf(s, "        const %s %s%d = %s * t%d * ((%s)1 + %s * ((%s)1 - t%d));\n", T, V,
                      id, dy, id, T, x, T, id);
    }
}

static bool needs_flat(const jdt_nest *N)
{
    for (int i = 0; i < N->g->n_members; i++) {
        jdt_op op = N->c->nodes[N->g->members[i]].op;
        if (op == JDT_OP_DROPOUT || op == JDT_OP_IOTA || op == JDT_OP_CAUSAL_MASK) return true;
    }
    return false;
}

jdt_status jdt_nest_build(const cprog *c, int gi, jdt_nest *N, jdt_err *e)
{
    const cgroup *g = &c->groups[gi];
    memset(N, 0, sizeof *N);
    N->c = c;
    N->g = g;
    N->flat = -1;
    for (int i = 0; i < g->n_members; i++) {
        const cnode *m = &c->nodes[g->members[i]];
        for (int k = 0; k < m->n_in; k++) {
            int xi = cnode_read_src(c, m->in[k]);
            const cnode *x = &c->nodes[xi];
            const int r = read_reader(c, m, k);
            if (x->kind == CK_SPLAT || (x->group == gi && r < 0)) continue;
            if (add_access(N, xi, r, false) < 0) goto too_many;
        }
        if (m->store && add_access(N, g->members[i], -1, true) < 0) goto too_many;
    }
    if (needs_flat(N)) {
        if (N->n_acc >= JDT_NEST_MAX_ACC) goto too_many;
        N->flat = N->n_acc++;
        memset(&N->acc[N->flat], 0, sizeof(jdt_access));
        N->acc[N->flat].node = -1;
        N->acc[N->flat].reader = -2;
        contiguous(&g->domain, N->acc[N->flat].stride);
    }
    collapse(N);
    return JDT_OK;
too_many:
    return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "compile: group of node %d reads too many buffers",
                       g->root);
}
