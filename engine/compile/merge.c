/*
 * merge.c — horizontal fusion of launches: consecutive fused kernels that are independent of
 * one another run as one launch (devices whose vtable sets merge_launches: CUDA).
 *
 * A train step's optimizer is one small kernel per parameter: GPT-2 124M has 196 gradient
 * sums of squares (the clip norm), 196 AdamW updates and, with bf16 compute, 146 bf16 copies
 * of the weights, most of them 768 values. On a GPU each launch costs microseconds of its own
 * whatever its size, so the step paid ~540 launches, most of them to move a few KB. A run of
 * consecutive STEP_KERNEL steps whose kernels touch disjoint memory (no member writes bytes
 * another member of the run reads or writes) may run in any order, so the CUDA emitter gives
 * the run one grid: each member keeps its own blocks and code, a block's index picks the
 * member (engine/backend/cuda/emit.c). This is XLA's horizontal loop fusion, decided here on
 * the memory plan rather than on the graph: two buffers the plan placed in the same bytes at
 * different times are a conflict too, since the members no longer run one after another.
 *
 * The run starts at its first member's step and the other members' steps become no-ops: every
 * input of the run was computed before its first step (the steps between are kernels of the
 * run, independent by construction), and every result is written by the time the step after
 * the last member runs. Numbers are unchanged (each member computes exactly what its own launch
 * did).
 */
#include "compile/compile-impl.h"

#include <stdint.h>
#include <string.h>

/* The most kernels in one launch: the launch picks its member by a chain of comparisons. */
#define MERGE_MAX 256

/* One memory range a kernel touches: an arena interval, or a leaf buffer (its own memory). */
typedef struct {
    int leaf; /* leaf buffer index, or -1 for an arena interval */
    int64_t lo, hi;
    bool write;
} touch;

static bool touches_overlap(const touch *a, const touch *b)
{
    if (!a->write && !b->write) return false;
    if (a->leaf >= 0 || b->leaf >= 0) return a->leaf == b->leaf;
    return a->lo < b->hi && b->lo < a->hi;
}

/* The memory kernel step s touches, appended to t (room for JDT_NEST_MAX_ACC more); false when
 * its nest cannot be built (the emitter reports that) or a buffer has no place. */
static bool step_touches(const cprog *c, int s, touch *t, int *n)
{
    jdt_nest N;
    jdt_err e = {0};
    if (jdt_nest_build(c, c->steps[s].group, &N, &e) != JDT_OK) return false;
    for (int a = 0; a < N.n_acc; a++) {
        if (a == N.flat) continue; /* the flat index: no memory, no node */
        const int b = c->nodes[N.acc[a].node].buf;
        if (b < 0) return false;
        const jdt_buf_info *bi = &c->bufs[b].info;
        touch x = {.leaf = -1, .write = N.acc[a].write};
        if (bi->kind == JDT_BUF_LEAF) {
            x.leaf = b;
        } else {
            if (bi->offset < 0) return false;
            x.lo = bi->offset;
            x.hi = bi->offset + bi->n_bytes;
        }
        t[(*n)++] = x;
    }
    return true;
}

jdt_status jdt_compile_merge_launches(cprog *c, jdt_err *e)
{
    touch *run = jdt_malloc(sizeof *run * (size_t)MERGE_MAX * JDT_NEST_MAX_ACC);
    if (!run) return jdt_err_set(e, JDT_ERR_NOMEM, "compile: launch merging");
    int head = -1, n_members = 0, n_run = 0;
    for (int s = 0; s <= c->n_steps; s++) {
        touch mine[JDT_NEST_MAX_ACC];
        int n_mine = 0;
        const bool kernel = s < c->n_steps && c->steps[s].kind == STEP_KERNEL;
        const bool ok = kernel && step_touches(c, s, mine, &n_mine);
        bool joins = ok && head >= 0 && n_members < MERGE_MAX;
        for (int i = 0; joins && i < n_mine; i++)
            for (int k = 0; joins && k < n_run; k++)
                if (touches_overlap(&mine[i], &run[k])) joins = false;
        if (joins) {
            c->steps[s].merged = -1;
            memcpy(run + n_run, mine, sizeof *mine * (size_t)n_mine);
            n_run += n_mine;
            n_members++;
            c->stats.n_launch_merged++;
            continue;
        }
        if (head >= 0 && n_members > 1) c->steps[head].merged = n_members;
        head = -1;
        if (!ok) continue;
        head = s;
        n_members = 1;
        memcpy(run, mine, sizeof *mine * (size_t)n_mine);
        n_run = n_mine;
    }
    jdt_free(run);
    return JDT_OK;
}
