/*
 * emit.c — the CPU backend's emitter: C source for every fused group of a program, one
 * translation unit, one static function per group, exported through a table `jdt_kernels[]`
 * (cpu.c dlsym's it). Each group's loop nest (engine/compile/nest.c) becomes plain loops:
 * elementwise chains one flat loop, row reductions a (rows, cols) nest with an `omp simd`
 * accumulator, other reductions accumulating into the pre-initialised output (when the leading
 * dim is reduced: chunks of its rows into partials added in chunk order, or column tiles per
 * thread where the partials would not fit); a reduction that absorbed its elementwise producer
 * (reduce_stores) stores the producer's values from its loop too. Shapes, strides and scalars
 * are literals: the kernel is specialised to the program. The outer loop gets `omp parallel
 * for` when the domain
 * is big enough; its team size is the variable `jdt_nt` of the shared object, which the backend
 * sets before every run (the adaptive thread count changes it without changing the source, so
 * the compile cache still hits). The thread budget (c->nt) only shapes loops (collapse depth,
 * column tiles). Math is <tgmath.h> in the node's own type and no fast-math flag is used, so
 * NaN/Inf propagate as in the reference.
 */
#include "backend/cpu/cpu-impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define PAR_MIN_ELEMS 32768
/* Parallel loops hand out their iterations in shrinking chunks as threads ask (guided), not in
 * one fixed share per thread: a thread the OS runs at half speed (a busy core) takes less, and
 * no region waits for it (docs/compiler.md, Threads). Every output is still computed by one
 * thread in one order, so results do not depend on the thread count. */
#define SCHED "schedule(guided)"
/* An elementwise group that stores bf16 runs its innermost loop in tiles of this many values:
 * the values of a tile computed into f32 arrays on the stack, then rounded and stored by a loop
 * of their own. One loop mixing f32 loads with 16-bit stores ran the benchmark's GELU at 2.6x
 * the f32 program's time and its backward at 1.5x; split, 1.75x and 1.0x (docs/perf.md,
 * session 45). The same values either way. */
#define BF16_TILE 256
/* A reduction of a whole domain to one value: partial sums over this many chunks of the
 * outermost dim, taken by the threads as they come, then added in chunk order (the same
 * bits for every thread count, unlike an OpenMP reduction clause). */
#define RED_CHUNKS 64

/* True when access a reads one element for the whole nest (every stride 0): a scalar operand. */
static bool acc_invariant(const jdt_nest *N, int a)
{
    for (int k = 0; k < N->n; k++)
        if (N->acc[a].stride[k] != 0) return false;
    return true;
}

/* The write access storing into the buffer read access a reads (an update in place: AdamW's
 * moments, a parameter), in the same C type, or -1. The read then goes through that write's
 * pointer: one pointer per buffer, so the compiler sees the read and the store at the same
 * index as one array and needs no run-time overlap test for them (GCC tests at most 10 pairs
 * of pointers before it gives up vectorising a loop; AdamW's loops had 15). */
static int acc_writer(const jdt_nest *N, int a)
{
    const cnode *x = &N->c->nodes[N->acc[a].node];
    for (int w = 0; w < N->n_acc; w++) {
        if (!N->acc[w].write || w == N->flat) continue;
        const cnode *y = &N->c->nodes[N->acc[w].node];
        if (y->buf == x->buf && y->bf16 == x->bf16 && y->dtype == x->dtype) return w;
    }
    return -1;
}

/* False when buffers a and b hold disjoint memory whenever one step touches both. Distinct
 * leaves, and a leaf and the arena, never overlap (jdt_program_run's contract: leaf memory is
 * the caller's, one tensor's per leaf); arena buffers live at the same step own disjoint
 * intervals, except one taking over a donor's storage (fuse.c), which the intervals show. */
static bool bufs_overlap(const cprog *c, int a, int b)
{
    if (a == b) return true;
    const jdt_buf_info *x = &c->bufs[a].info, *y = &c->bufs[b].info;
    if (x->kind != JDT_BUF_ARENA || y->kind != JDT_BUF_ARENA) return false;
    return x->offset < y->offset + y->n_bytes && y->offset < x->offset + x->n_bytes;
}

/* True when read access a can be loaded once before the loops: it reads one element for the
 * whole nest and no store of the group can change it. Loaded inside the loop, a scalar that
 * the compiler cannot prove untouched by the loop's stores stops it vectorising the loop
 * (GCC: "no vectype for stmt"), as it did every AdamW update. */
static bool acc_hoistable(const jdt_nest *N, int a)
{
    if (N->acc[a].write || a == N->flat || !acc_invariant(N, a)) return false;
    int rb = N->c->nodes[N->acc[a].node].buf;
    for (int w = 0; w < N->n_acc; w++)
        if (N->acc[w].write && w != N->flat &&
            bufs_overlap(N->c, rb, N->c->nodes[N->acc[w].node].buf))
            return false;
    return true;
}

/* `const T x<a> = <ptr>[<offset>];` of read access a, indented by ind; through the store's
 * pointer when the group writes the buffer too (acc_writer). */
static void emit_load(jdt_sbuf *s, const jdt_nest *N, int a, const char *ind)
{
    char off[512], ptr[16];
    jdt_nest_offset(N, a, off, sizeof off);
    int w = acc_writer(N, a);
    snprintf(ptr, sizeof ptr, "%c%d", w >= 0 ? 'w' : 'r', w >= 0 ? w : a);
    const cnode *x = &N->c->nodes[N->acc[a].node];
    if (x->bf16) /* bf16 storage: widened, computed in f32 */
        jdt_sb_printf(s, "%sconst float x%d = jdt_bf16_ld(%s[%s]);\n", ind, a, ptr, off);
    else
        jdt_sb_printf(s, "%sconst %s x%d = %s[%s];\n", ind, jdt_nest_ctype(x->dtype), a, ptr, off);
}

/* The loads of the loop body: `x<a>` for every read access not in hoisted (NULL: none). */
static void emit_loads(jdt_sbuf *s, const jdt_nest *N, const bool *hoisted)
{
    for (int a = 0; a < N->n_acc; a++)
        if (!N->acc[a].write && a != N->flat && !(hoisted && hoisted[a]))
            emit_load(s, N, a, "        ");
    if (N->flat >= 0) {
        char off[512];
        jdt_nest_offset(N, N->flat, off, sizeof off);
        jdt_sb_printf(s, "        const int64_t flat = %s;\n", off);
    }
}

static void emit_loops(jdt_sbuf *s, const jdt_nest *N, int from, int to)
{
    for (int k = from; k < to; k++)
        jdt_sb_printf(s, "    for (int64_t i%d = 0; i%d < %lldLL; i%d++)\n", k, k,
                      (long long)N->dims[k], k);
}

static void emit_parallel(jdt_sbuf *s, const jdt_nest *N, int n_outer, int nt)
{
    if (jdt_shape_numel(&N->g->domain) < PAR_MIN_ELEMS || n_outer < 1 || !N->kept[0]) return;
    int col = 1;
    int64_t prod = N->dims[0];
    while (col < n_outer && N->kept[col] && prod < 4 * nt)
        prod *= N->dims[col++];
    if (prod < 2) return;
    if (col > 1)
        jdt_sb_printf(
            s, "    #pragma omp parallel for num_threads(jdt_nt) " SCHED " collapse(%d)\n", col);
    else
        jdt_sb_printf(s, "    #pragma omp parallel for num_threads(jdt_nt) " SCHED "\n");
}

/* Bytes of stack a reduction's partial outputs may take (row_chunks). */
#define PART_STACK_BYTES (128 * 1024)

/* The leading reduced dims of a reduction's nest (those before its first kept dim), and in
 * *rows the number of rows they span. */
static int lead_reduced(const jdt_nest *N, int64_t *rows)
{
    int lead = 0;
    *rows = 1;
    while (lead < N->n && !N->kept[lead])
        *rows *= N->dims[lead++];
    return lead;
}

/* Chunks of the leading reduced dims' rows (lead_reduced) a reduction into out_n outputs of
 * elem bytes each sums in parallel, each into partials of its own (emit_group), or 0 where that
 * form does not apply: dim 0 kept, a domain under PAR_MIN_ELEMS, or partials past
 * PART_STACK_BYTES with 2 chunks. Shapes alone decide it, never the thread count: the chunks
 * fix the order of the sums. */
static int64_t row_chunks(const jdt_nest *N, int64_t out_n, size_t elem)
{
    if (N->kept[0] || N->n < 2 || jdt_shape_numel(&N->g->domain) < PAR_MIN_ELEMS || out_n < 1)
        return 0;
    int64_t rows;
    lead_reduced(N, &rows);
    int64_t fit = PART_STACK_BYTES / (out_n * (int64_t)elem);
    int64_t n_ch = rows < RED_CHUNKS ? rows : RED_CHUNKS;
    if (fit < n_ch) n_ch = fit;
    return n_ch > 1 ? n_ch : 0;
}

/* The stores of a reduction's members at the element the loop is at: every write access but
 * the result's (w). A reduction that absorbed its elementwise producer (fuse.c
 * fuse_reduce_producers, reduce_stores) stores the producer's bf16 copy, or its value where
 * others read it; every loop form below visits each element of the domain once. With tiled,
 * bf16 values go to the tile's array s<a> instead, stored by a loop of their own (BF16_TILE). */
static void emit_member_stores(jdt_sbuf *s, const jdt_nest *N, int w, bool tiled)
{
    char off[512];
    const int K = N->n - 1;
    for (int a = 0; a < N->n_acc; a++) {
        if (!N->acc[a].write || a == w || a == N->flat) continue;
        jdt_nest_offset(N, a, off, sizeof off);
        if (!N->c->nodes[N->acc[a].node].bf16)
            jdt_sb_printf(s, "        w%d[%s] = v%d;\n", a, off, N->acc[a].node);
        else if (tiled)
            jdt_sb_printf(s, "        s%d[i%d - t] = v%d;\n", a, K, N->acc[a].node);
        else /* rounded to nearest even on store */
            jdt_sb_printf(s, "        w%d[%s] = jdt_bf16_st(v%d);\n", a, off, N->acc[a].node);
    }
}

/* The loops from dim `from` in and the body of a reduction's innermost loop: loads, the members
 * but the root (and their stores), then the root's input src added (or max-ed) into out[offset
 * of access w]. A kept innermost dim of 2 * BF16_TILE or more whose members store bf16 runs in
 * tiles, as elementwise groups do: one loop mixing the f32 sums with 16-bit stores ran the
 * benchmark's merged GELU backward and fc bias sum slower than the two kernels it replaced. */
static void emit_accumulate(jdt_sbuf *s, const jdt_nest *N, const cgroup *g, int w, const char *out,
                            const char *src, bool is_max, int from)
{
    char off[512];
    const int K = N->n - 1;
    const int64_t D = N->dims[K];
    bool tiled = false;
    for (int a = 0; a < N->n_acc; a++)
        tiled = tiled || (N->acc[a].write && a != w && N->c->nodes[N->acc[a].node].bf16);
    tiled = tiled && from <= K && N->kept[K] && D >= 2 * BF16_TILE;
    if (!tiled) {
        emit_loops(s, N, from, N->n);
    } else {
        emit_loops(s, N, from, K);
        jdt_sb_printf(s, "    for (int64_t t = 0; t < %lldLL; t += %d) {\n", (long long)D,
                      BF16_TILE);
        jdt_sb_printf(s, "    const int64_t te = t + %d < %lldLL ? t + %d : %lldLL;\n", BF16_TILE,
                      (long long)D, BF16_TILE, (long long)D);
        for (int a = 0; a < N->n_acc; a++)
            if (N->acc[a].write && a != w && N->c->nodes[N->acc[a].node].bf16)
                jdt_sb_printf(s, "    float s%d[%d];\n", a, BF16_TILE);
        jdt_sb_printf(s, "    for (int64_t i%d = t; i%d < te; i%d++)\n", K, K, K);
    }
    jdt_sb_printf(s, "    {\n");
    emit_loads(s, N, NULL);
    for (int i = 0; i < g->n_members; i++)
        if (g->members[i] != g->root) jdt_nest_value(s, N, g->members[i]);
    emit_member_stores(s, N, w, tiled);
    jdt_nest_offset(N, w, off, sizeof off);
    if (is_max)
        jdt_sb_printf(s, "        if (%s > %s[%s]) %s[%s] = %s;\n", src, out, off, out, off, src);
    else
        jdt_sb_printf(s, "        %s[%s] += %s;\n", out, off, src);
    jdt_sb_printf(s, "    }\n");
    if (tiled) { /* the tile's bf16 stores, rounded to nearest even */
        jdt_sb_printf(s, "    for (int64_t i%d = t; i%d < te; i%d++) {\n", K, K, K);
        for (int a = 0; a < N->n_acc; a++) {
            if (!N->acc[a].write || a == w || !N->c->nodes[N->acc[a].node].bf16) continue;
            jdt_nest_offset(N, a, off, sizeof off);
            jdt_sb_printf(s, "        w%d[%s] = jdt_bf16_st(s%d[i%d - t]);\n", a, off, a, K);
        }
        jdt_sb_printf(s, "    }\n    }\n");
    }
}

static void emit_group(jdt_sbuf *s, const cprog *c, int gi, int kernel, int nt, jdt_err *e,
                       jdt_status *st)
{
    const cgroup *g = &c->groups[gi];
    jdt_nest N;
    if ((*st = jdt_nest_build(c, gi, &N, e)) != JDT_OK) return;

    const cnode *root = &c->nodes[g->root];
    jdt_sb_printf(s, "/* group %d: %d op(s), root node %d (%s), domain", gi, g->n_members, g->root,
                  jdt_op_name(root->op));
    for (int k = 0; k < N.n; k++)
        jdt_sb_printf(s, " %lld%s", (long long)N.dims[k], N.kept[k] ? "" : "r");
    jdt_sb_printf(s, " */\nstatic void k%d(void *const *p)\n{\n", kernel);
    for (int a = 0; a < N.n_acc; a++) {
        if (a == N.flat) continue;
        const cnode *x = &c->nodes[N.acc[a].node];
        const char *T = x->bf16 ? "uint16_t" : jdt_nest_ctype(x->dtype);
        if (N.acc[a].write)
            jdt_sb_printf(s, "    %s *w%d = (%s *)p[%d];\n", T, a, T, x->buf);
        else if (acc_writer(&N, a) < 0)
            jdt_sb_printf(s, "    const %s *r%d = (const %s *)p[%d];\n", T, a, T, x->buf);
    }
    char off[512];
    if (!g->is_reduce) {
        bool hoisted[JDT_NEST_MAX_ACC] = {0};
        for (int a = 0; a < N.n_acc; a++) {
            hoisted[a] = acc_hoistable(&N, a);
            if (hoisted[a]) emit_load(s, &N, a, "    ");
        }
        emit_parallel(s, &N, N.n > 1 ? N.n - 1 : 1, nt);
        const int K = N.n - 1;
        const int64_t D = N.dims[K];
        bool tiled = D >= 2 * BF16_TILE;
        bool any16 = false;
        for (int a = 0; a < N.n_acc; a++)
            any16 = any16 || (N.acc[a].write && c->nodes[N.acc[a].node].bf16);
        tiled = tiled && any16;
        if (!tiled) {
            emit_loops(s, &N, 0, N.n);
        } else { /* the innermost loop in tiles: the parallel loop where it is the only one */
            emit_loops(s, &N, 0, K);
            jdt_sb_printf(s, "    for (int64_t t = 0; t < %lldLL; t += %d) {\n", (long long)D,
                          BF16_TILE);
            jdt_sb_printf(s, "    const int64_t te = t + %d < %lldLL ? t + %d : %lldLL;\n",
                          BF16_TILE, (long long)D, BF16_TILE, (long long)D);
            for (int a = 0; a < N.n_acc; a++)
                if (N.acc[a].write && c->nodes[N.acc[a].node].bf16)
                    jdt_sb_printf(s, "    float s%d[%d];\n", a, BF16_TILE);
            jdt_sb_printf(s, "    for (int64_t i%d = t; i%d < te; i%d++)\n", K, K, K);
        }
        jdt_sb_printf(s, "    {\n");
        emit_loads(s, &N, hoisted);
        for (int i = 0; i < g->n_members; i++)
            jdt_nest_value(s, &N, g->members[i]);
        for (int a = 0; a < N.n_acc; a++) {
            if (!N.acc[a].write) continue;
            jdt_nest_offset(&N, a, off, sizeof off);
            if (!c->nodes[N.acc[a].node].bf16)
                jdt_sb_printf(s, "        w%d[%s] = v%d;\n", a, off, N.acc[a].node);
            else if (tiled) /* kept for the tile's stores */
                jdt_sb_printf(s, "        s%d[i%d - t] = v%d;\n", a, K, N.acc[a].node);
            else /* rounded to nearest even on store */
                jdt_sb_printf(s, "        w%d[%s] = jdt_bf16_st(v%d);\n", a, off, N.acc[a].node);
        }
        jdt_sb_printf(s, "    }\n");
        if (tiled) { /* the tile's bf16 stores, rounded to nearest even */
            jdt_sb_printf(s, "    for (int64_t i%d = t; i%d < te; i%d++) {\n", K, K, K);
            for (int a = 0; a < N.n_acc; a++) {
                if (!N.acc[a].write || !c->nodes[N.acc[a].node].bf16) continue;
                jdt_nest_offset(&N, a, off, sizeof off);
                jdt_sb_printf(s, "        w%d[%s] = jdt_bf16_st(s%d[i%d - t]);\n", a, off, a, K);
            }
            jdt_sb_printf(s, "    }\n    }\n");
        }
        jdt_sb_printf(s, "}\n\n");
        return;
    }
    /* reductions */
    const cnode *in = &c->nodes[root->in[0]];
    const char *T = jdt_nest_ctype(root->dtype);
    int w = -1; /* the result's store (members may store too: emit_member_stores) */
    for (int a = 0; a < N.n_acc; a++)
        if (N.acc[a].write && N.acc[a].node == g->root) w = a;
    char init[64], src[96];
    jdt_nest_lit(init, sizeof init, root->dtype, root->op == JDT_OP_REDUCE_MAX ? -INFINITY : 0.0);
    jdt_nest_operand(&N, root, 0, src, sizeof src);
    int64_t count = jdt_shape_numel(&in->shape) /
                    (jdt_shape_numel(&root->shape) ? jdt_shape_numel(&root->shape) : 1);
    bool is_max = root->op == JDT_OP_REDUCE_MAX, is_mean = root->op == JDT_OP_REDUCE_MEAN;
    bool acc_pattern = !N.kept[N.n - 1];
    for (int k = 0; k < N.n - 1; k++)
        acc_pattern = acc_pattern && N.kept[k];
    if (acc_pattern) {
        int n_outer = N.n - 1;
        if (n_outer > 0) emit_parallel(s, &N, n_outer, nt);
        emit_loops(s, &N, 0, n_outer);
        int64_t n_ch = N.dims[0] < RED_CHUNKS ? N.dims[0] : RED_CHUNKS;
        bool chunked = n_outer == 0 && jdt_shape_numel(&g->domain) >= PAR_MIN_ELEMS && n_ch > 1;
        if (chunked) { /* partials per chunk of dim 0, then summed in order */
            int64_t len = (N.dims[0] + n_ch - 1) / n_ch;
            n_ch = (N.dims[0] + len - 1) / len;
            jdt_sb_printf(s, "    {\n    %s part[%lld];\n", T, (long long)n_ch);
            jdt_sb_printf(
                s, "    #pragma omp parallel for num_threads(jdt_nt) schedule(dynamic, 1)\n");
            jdt_sb_printf(s, "    for (int64_t ch = 0; ch < %lldLL; ch++) {\n    %s acc = %s;\n",
                          (long long)n_ch, T, init);
            jdt_sb_printf(s,
                          "    const int64_t hi = ch * %lldLL + %lldLL < %lldLL ? ch * %lldLL + "
                          "%lldLL : %lldLL;\n",
                          (long long)len, (long long)len, (long long)N.dims[0], (long long)len,
                          (long long)len, (long long)N.dims[0]);
            jdt_sb_printf(s, "    #pragma omp simd reduction(%s : acc)\n", is_max ? "max" : "+");
            jdt_sb_printf(s, "    for (int64_t i0 = ch * %lldLL; i0 < hi; i0++)\n", (long long)len);
            emit_loops(s, &N, 1, N.n);
        } else {
            jdt_sb_printf(s, "    {\n    %s acc = %s;\n", T, init);
            jdt_sb_printf(s, "    #pragma omp simd reduction(%s : acc)\n", is_max ? "max" : "+");
            emit_loops(s, &N, n_outer, N.n);
        }
        jdt_sb_printf(s, "    {\n");
        emit_loads(s, &N, NULL);
        for (int i = 0; i < g->n_members; i++)
            if (g->members[i] != g->root) jdt_nest_value(s, &N, g->members[i]);
        emit_member_stores(s, &N, w, false);
        if (is_max)
            jdt_sb_printf(s, "        acc = %s > acc ? %s : acc;\n", src, src);
        else
            jdt_sb_printf(s, "        acc += %s;\n", src);
        jdt_sb_printf(s, "    }\n");
        if (chunked) {
            jdt_sb_printf(s, "    part[ch] = acc;\n    }\n    %s acc = %s;\n", T, init);
            jdt_sb_printf(s, "    for (int64_t ch = 0; ch < %lldLL; ch++)\n", (long long)n_ch);
            if (is_max)
                jdt_sb_printf(s, "        acc = part[ch] > acc ? part[ch] : acc;\n");
            else
                jdt_sb_printf(s, "        acc += part[ch];\n");
        }
        jdt_nest_offset(&N, w, off, sizeof off);
        if (is_mean)
            jdt_sb_printf(s, "    w%d[%s] = acc / (%s)%lld;\n", w, off, T, (long long)count);
        else
            jdt_sb_printf(s, "    w%d[%s] = acc;\n", w, off);
        jdt_sb_printf(s, "    }\n}\n\n");
        return;
    }
    int64_t out_n = jdt_shape_numel(&root->shape);
    int64_t n_ch = row_chunks(&N, out_n, jdt_dtype_size(root->dtype));
    if (n_ch > 1) {
        /* a leading reduced dim (bias gradients): chunks of its rows, taken by the threads as
         * they come, each summed in row order into a partial output of its own on the stack,
         * the partials then added in chunk order. Every thread streams whole rows (the column
         * tiles below read a few cache lines per row, strided: half the bandwidth), and the
         * result does not depend on the thread count. */
        int64_t rows;
        const int lead = lead_reduced(&N, &rows);
        int64_t len = (rows + n_ch - 1) / n_ch;
        n_ch = (rows + len - 1) / len;
        jdt_sb_printf(s, "    %s part[%lldLL];\n", T, (long long)(n_ch * out_n));
        jdt_sb_printf(s, "    #pragma omp parallel for num_threads(jdt_nt) schedule(dynamic, 1)\n");
        jdt_sb_printf(s, "    for (int64_t ch = 0; ch < %lldLL; ch++) {\n", (long long)n_ch);
        jdt_sb_printf(s, "    %s *pp = part + ch * %lldLL;\n", T, (long long)out_n);
        jdt_sb_printf(s, "    for (int64_t o = 0; o < %lldLL; o++) pp[o] = %s;\n", (long long)out_n,
                      init);
        jdt_sb_printf(s,
                      "    const int64_t hi = ch * %lldLL + %lldLL < %lldLL ? ch * %lldLL + "
                      "%lldLL : %lldLL;\n",
                      (long long)len, (long long)len, (long long)rows, (long long)len,
                      (long long)len, (long long)rows);
        if (lead == 1) {
            jdt_sb_printf(s, "    for (int64_t i0 = ch * %lldLL; i0 < hi; i0++)\n", (long long)len);
        } else { /* several leading reduced dims (a reshape's rows, fuse.c reduce_directly):
                  * chunks of their rows in order, each row's indices taken apart */
            jdt_sb_printf(s, "    for (int64_t r = ch * %lldLL; r < hi; r++) {\n", (long long)len);
            jdt_sb_printf(s, "    int64_t q = r;\n");
            for (int k = lead - 1; k > 0; k--)
                jdt_sb_printf(s, "    const int64_t i%d = q %% %lldLL;\n    q /= %lldLL;\n", k,
                              (long long)N.dims[k], (long long)N.dims[k]);
            jdt_sb_printf(s, "    const int64_t i0 = q;\n");
        }
        emit_accumulate(s, &N, g, w, "pp", src, is_max, lead);
        if (lead > 1) jdt_sb_printf(s, "    }\n");
        jdt_sb_printf(s, "    }\n");
        jdt_sb_printf(s, "    for (int64_t o = 0; o < %lldLL; o++) w%d[o] = %s;\n",
                      (long long)out_n, w, init);
        jdt_sb_printf(s, "    for (int64_t ch = 0; ch < %lldLL; ch++)\n", (long long)n_ch);
        jdt_sb_printf(s, "    for (int64_t o = 0; o < %lldLL; o++)\n", (long long)out_n);
        if (is_max)
            jdt_sb_printf(s,
                          "        w%d[o] = part[ch * %lldLL + o] > w%d[o] ? part[ch * %lldLL + "
                          "o] : w%d[o];\n",
                          w, (long long)out_n, w, (long long)out_n, w);
        else
            jdt_sb_printf(s, "        w%d[o] += part[ch * %lldLL + o];\n", w, (long long)out_n);
    } else {
        jdt_sb_printf(s, "    for (int64_t o = 0; o < %lldLL; o++) w%d[o] = %s;\n",
                      (long long)out_n, w, init);
        int64_t last = N.dims[N.n - 1];
        bool col_tiles = !N.kept[0] && N.n > 1 && N.kept[N.n - 1] && nt > 1 && last >= 32 &&
                         jdt_shape_numel(&g->domain) >= PAR_MIN_ELEMS;
        if (col_tiles) {
            /* the leading reduced dim's rows do not fit row_chunks' partials: threads own
             * column tiles of the innermost kept dim, so every thread accumulates into its own
             * outputs */
            int64_t tile = (last + 4 * nt - 1) / (4 * nt);
            tile = (tile + 15) / 16 * 16;
            jdt_sb_printf(s, "    #pragma omp parallel for num_threads(jdt_nt) " SCHED "\n");
            jdt_sb_printf(s, "    for (int64_t cb = 0; cb < %lldLL; cb += %lldLL)\n",
                          (long long)last, (long long)tile);
            emit_loops(s, &N, 0, N.n - 1);
            jdt_sb_printf(
                s,
                "    for (int64_t i%d = cb; i%d < (cb + %lldLL < %lldLL ? cb + %lldLL : %lldLL); "
                "i%d++)\n",
                N.n - 1, N.n - 1, (long long)tile, (long long)last, (long long)tile,
                (long long)last, N.n - 1);
        } else if (N.kept[0]) {
            emit_parallel(s, &N, 1, nt);
        }
        char wn[16];
        snprintf(wn, sizeof wn, "w%d", w);
        emit_accumulate(s, &N, g, w, wn, src, is_max, col_tiles ? N.n : 0);
    }
    if (is_mean)
        jdt_sb_printf(s, "    for (int64_t o = 0; o < %lldLL; o++) w%d[o] /= (%s)%lld;\n",
                      (long long)out_n, w, T, (long long)count);
    jdt_sb_printf(s, "}\n\n");
}

static const char PRELUDE[] =
    "/* generated by jdt-train's CPU backend: one function per fused group */\n"
    "#include <stdint.h>\n#include <tgmath.h>\n\n"
    "typedef void (*jdt_kernel_fn)(void *const *);\n"
    "/* the team size of every parallel loop below: the backend sets it before each run */\n"
    "int jdt_nt = 1;\n"
    "__attribute__((unused)) static inline uint32_t jdt_philox_w0(uint64_t key, uint64_t hi, "
    "uint64_t lo)\n{\n"
    "    uint32_t c0 = (uint32_t)lo, c1 = (uint32_t)(lo >> 32), c2 = (uint32_t)hi, c3 = "
    "(uint32_t)(hi >> 32);\n"
    "    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);\n"
    "    for (int r = 0; r < 10; r++) {\n"
    "        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;\n"
    "        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;\n"
    "        c1 = (uint32_t)p1; c3 = (uint32_t)p0; c0 = n0; c2 = n2;\n"
    "        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;\n"
    "    }\n"
    "    return c0;\n}\n"
    /* bf16 storage: the upper 16 bits of an f32; stores round to nearest even (a NaN stays a
     * quiet NaN, overflow gives Inf), as jdt_bf16_round (engine/core/util.c) */
    "__attribute__((unused)) static inline float jdt_bf16_ld(uint16_t h)\n{\n"
    "    union { uint32_t u; float f; } b; b.u = (uint32_t)h << 16; return b.f;\n}\n"
    "__attribute__((unused)) static inline uint16_t jdt_bf16_st(float x)\n{\n"
    "    union { uint32_t u; float f; } b; b.f = x;\n"
    "    uint32_t q = (b.u | 0x00400000u) >> 16, r = (b.u + 0x7fffu + ((b.u >> 16) & 1u)) >> 16;\n"
    "    return (uint16_t)((b.u & 0x7fffffffu) > 0x7f800000u ? q : r);\n}\n"
    /* a bf16 node's value: its f32 result rounded to bf16 (kept in a float) */
    "__attribute__((unused)) static inline float jdt_bf16_rn(float x) { return "
    "jdt_bf16_ld(jdt_bf16_st(x)); }\n"
    "__attribute__((unused)) static inline float jdt_unit(uint32_t x) { return (float)(x >> 8) * "
    "(1.0f / 16777216.0f); }\n"
    /* exp and tanh for f32 written so the loop vectoriser can inline them (glibc's are scalar
     * calls without -ffast-math). exp: Cody-Waite range reduction and the Cephes polynomial,
     * max relative error 8e-8 measured; NaN and +-Inf are handled explicitly. */
    "__attribute__((unused)) static inline float jdt_expf(float x)\n{\n"
    "    float xc = x > 88.8f ? 88.8f : x < -104.0f ? -104.0f : x;\n"
    "    float n = floorf(xc * 1.44269504088896341f + 0.5f);\n"
    "    float r = xc - n * 0.693359375f + n * 2.12194440e-4f;\n"
    "    float p = 1.9875691500e-4f;\n"
    "    p = p * r + 1.3981999507e-3f; p = p * r + 8.3334519073e-3f; p = p * r + "
    "4.1665795894e-2f;\n"
    "    p = p * r + 1.6666665459e-1f; p = p * r + 5.0000001201e-1f;\n"
    "    float y = p * r * r + r + 1.0f;\n"
    "    int32_t ni = (int32_t)n, n1 = ni >> 1, n2 = ni - n1;\n" /* two factors: no overflow */
    "    union { uint32_t u; float f; } b1, b2;\n"
    "    b1.u = (uint32_t)(n1 + 127) << 23; b2.u = (uint32_t)(n2 + 127) << 23;\n"
    "    y = y * b1.f * b2.f;\n"
    "    y = x > 88.7228394f ? (float)INFINITY : x < -103.9720840f ? 0.0f : y;\n"
    "    return x != x ? x : y;\n}\n"
    /* tanh: a [13/6] rational minimax approximation on [-7.905, 7.905] (the form Eigen uses
     * for float tanh): one division, no exp; max relative error 3.8e-7 measured */
    "__attribute__((unused)) static inline float jdt_tanhf(float x)\n{\n"
    "    const float c = 7.90531110763549805f;\n"
    "    float xc = x > c ? c : x < -c ? -c : x, x2 = xc * xc;\n"
    "    float p = -2.76076847742355e-16f;\n"
    "    p = p * x2 + 2.00018790482477e-13f; p = p * x2 - 8.60467152213735e-11f;\n"
    "    p = p * x2 + 5.12229709037114e-08f; p = p * x2 + 1.48572235717979e-05f;\n"
    "    p = p * x2 + 6.37261928875436e-04f; p = p * x2 + 4.89352455891786e-03f;\n"
    "    float q = 1.19825839466702e-06f;\n"
    "    q = q * x2 + 1.18534705686654e-04f; q = q * x2 + 2.26843463243900e-03f;\n"
    "    q = q * x2 + 4.89352518554385e-03f;\n"
    "    float r = p * xc / q, a = fabsf(x);\n"
    "    r = a < 0.0004f ? x : r;\n"
    /* exactly +-1 like tanhf (so GELU's inf * 0 stays NaN); a NaN needs no test of its own: the
     * clamp passes it, so p and q are NaN, and both comparisons are false. One select fewer than
     * testing x > 9 and x < -9 apart and NaN last, the same bits for all 2^32 inputs, and the
     * benchmark's GELU 15% faster (docs/perf.md, session 49). */
    "    return a > 9.0f ? copysignf(1.0f, x) : r;\n}\n\n";

jdt_status jdt_cpu_codegen(const cprog *c, char **src, jdt_err *e)
{
    jdt_sbuf s = {0};
    jdt_status st = JDT_OK;
    *src = NULL;
    jdt_sb_printf(&s, "%s", PRELUDE);
    int n_k = 0;
    for (int i = 0; i < c->n_steps && st == JDT_OK; i++) {
        if (c->steps[i].kind != STEP_KERNEL) continue;
        emit_group(&s, c, c->steps[i].group, c->steps[i].kernel, c->nt, e, &st);
        n_k++;
    }
    jdt_sb_printf(&s, "const jdt_kernel_fn jdt_kernels[%d] = {", n_k ? n_k : 1);
    for (int k = 0; k < n_k; k++)
        jdt_sb_printf(&s, "%sk%d", k ? ", " : "", k);
    if (!n_k) jdt_sb_printf(&s, "0");
    jdt_sb_printf(&s, "};\nconst int jdt_n_kernels = %d;\n", n_k);
    if (st == JDT_OK) st = jdt_sb_status(&s, c, "codegen", e);
    if (st != JDT_OK) {
        jdt_free(s.buf);
        return st;
    }
    *src = s.buf;
    return JDT_OK;
}
