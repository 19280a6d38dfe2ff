/*
 * jit-fixture.h — shared by check_jit.c and check_compile.c: builds a graph's leaves with
 * random data twice (one copy for the reference interpreter, one for the compiled program),
 * runs both and compares every output and every updated leaf.
 */
#ifndef JDT_JIT_FIXTURE_H
#define JDT_JIT_FIXTURE_H

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compile/compile.h"
#include "graph/builder.h"
#include "graph/interp.h"

#define FX_MAX_LEAVES 128

typedef struct {
    jdt_graph *g;
    int n;
    jdt_tensor *leaf[FX_MAX_LEAVES];
    double lo[FX_MAX_LEAVES], hi[FX_MAX_LEAVES];
    void *ref[FX_MAX_LEAVES], *jit[FX_MAX_LEAVES];
    char cache[256];
} fx;

static void fx_init(fx *f)
{
    memset(f, 0, sizeof *f);
    f->g = jdt_graph_new();
    ck_assert_ptr_nonnull(f->g);
    snprintf(f->cache, sizeof f->cache, "/tmp/jdt-test-cache-%d", (int)getpid());
}

static void fx_free(fx *f)
{
    for (int i = 0; i < f->n; i++) {
        free(f->ref[i]);
        free(f->jit[i]);
    }
    jdt_graph_free(f->g);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", f->cache);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", f->cache);
}

/* A leaf of kind op (PARAM/INPUT, or STATE when state) filled uniformly in [lo, hi) (i32:
 * integers in [lo, hi)). */
static jdt_tensor *fx_leaf(fx *f, int kind, const char *name, jdt_dtype dt, int ndim,
                           const int64_t *dims, double lo, double hi)
{
    jdt_tensor *t = kind == 0   ? jdt_graph_param(f->g, name, dt, ndim, dims, NULL)
                    : kind == 1 ? jdt_graph_input(f->g, name, dt, ndim, dims, NULL)
                                : jdt_graph_state(f->g, name, dt, ndim, dims, NULL);
    ck_assert_msg(t != NULL, "leaf %s: %s", name, jdt_graph_error_msg(f->g));
    ck_assert_int_lt(f->n, FX_MAX_LEAVES);
    f->leaf[f->n] = t;
    f->lo[f->n] = lo;
    f->hi[f->n] = hi;
    f->n++;
    return t;
}
#define FX_PARAM(f, name, lo, hi, ...)                                                             \
    fx_leaf(f, 0, name, JDT_DTYPE_F32, (int)(sizeof((int64_t[]){__VA_ARGS__}) / 8),                \
            (int64_t[]){__VA_ARGS__}, lo, hi)
#define FX_INPUT(f, name, dt, lo, hi, ...)                                                         \
    fx_leaf(f, 1, name, dt, (int)(sizeof((int64_t[]){__VA_ARGS__}) / 8), (int64_t[]){__VA_ARGS__}, \
            lo, hi)

/* x rounded to bf16 (nearest even), as its 16 stored bits */
static uint16_t fx_bf16_bits(float x)
{
    float r = jdt_bf16_round(x);
    uint32_t u;
    memcpy(&u, &r, 4);
    return (uint16_t)(u >> 16);
}

static void fx_fill(fx *f, uint64_t seed)
{
    for (int i = 0; i < f->n; i++) {
        jdt_tensor *t = f->leaf[i];
        int64_t n = jdt_shape_numel(&t->shape);
        size_t nb = (size_t)n * jdt_dtype_size(t->dtype) + 64;
        free(f->ref[i]);
        free(f->jit[i]);
        f->ref[i] = calloc(1, nb);
        f->jit[i] = calloc(1, nb);
        float *u = malloc(sizeof(float) * (size_t)(n + 1));
        jdt_rng_uniform(jdt_rng_key(seed, t->name), 0, (size_t)n, u);
        for (int64_t j = 0; j < n; j++) {
            double v = f->lo[i] + (f->hi[i] - f->lo[i]) * u[j];
            if (t->dtype == JDT_DTYPE_F32)
                ((float *)f->ref[i])[j] = (float)v;
            else if (t->dtype == JDT_DTYPE_F64)
                ((double *)f->ref[i])[j] = v;
            else if (t->dtype == JDT_DTYPE_BF16)
                ((uint16_t *)f->ref[i])[j] = fx_bf16_bits((float)v);
            else
                ((int32_t *)f->ref[i])[j] = (int32_t)floor(v);
        }
        memcpy(f->jit[i], f->ref[i], nb);
        free(u);
    }
}

static void fx_bind(fx *f, bool jit)
{
    for (int i = 0; i < f->n; i++)
        f->leaf[i]->data = jit ? f->jit[i] : f->ref[i];
}

static bool fx_close(double a, double b, double rtol, double atol)
{
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    if (isinf(a) || isinf(b)) return a == b;
    return fabs(a - b) <= atol + rtol * fabs(b);
}

static double fx_get(const void *p, jdt_dtype dt, int64_t j)
{
    if (dt == JDT_DTYPE_F32) return ((const float *)p)[j];
    if (dt == JDT_DTYPE_F64) return ((const double *)p)[j];
    if (dt == JDT_DTYPE_BF16) {
        uint32_t u = (uint32_t)((const uint16_t *)p)[j] << 16;
        float x;
        memcpy(&x, &u, 4);
        return x;
    }
    return ((const int32_t *)p)[j];
}

/* Compares n values; reports the first mismatch with `what`. */
static void fx_compare(const char *what, const void *got, const void *want, jdt_dtype dt, int64_t n,
                       double rtol, double atol)
{
    for (int64_t j = 0; j < n; j++) {
        double a = fx_get(got, dt, j), b = fx_get(want, dt, j);
        ck_assert_msg(fx_close(a, b, rtol, atol), "%s: element %lld: jit %.9g vs reference %.9g",
                      what, (long long)j, a, b);
    }
}

static void fx_opts(fx *f, jdt_compile_opts *o)
{
    jdt_compile_opts_init(o);
    o->cache_dir = f->cache;
    o->threads = 2;
}

/* Compiles, runs `steps` steps of the interpreter and of the program from identical leaves,
 * comparing every output after each step and every leaf at the end. Returns the program (for
 * stats checks; caller frees) when keep, else frees it. */
static jdt_program *fx_check_steps(fx *f, const jdt_compile_opts *o, int steps, double rtol,
                                   double atol, bool keep)
{
    jdt_err e;
    jdt_err_clear(&e);
    ck_assert_msg(jdt_graph_error(f->g, &e) == JDT_OK, "builder: %s", e.msg);
    jdt_program *p = NULL;
    jdt_status st = jdt_program_compile(f->g, o, &p, &e);
    ck_assert_msg(st == JDT_OK, "compile: %s", e.msg);
    jdt_interp *it = NULL;
    ck_assert_int_eq(jdt_interp_new(f->g, &it, &e), JDT_OK);
    for (int s = 0; s < steps; s++) {
        fx_bind(f, false);
        ck_assert_msg(jdt_interp_run(it, &e) == JDT_OK, "interp: %s", e.msg);
        fx_bind(f, true);
        ck_assert_msg(jdt_program_run(p, &e) == JDT_OK, "run: %s", e.msg);
        for (int i = 0; i < jdt_graph_n_outputs(f->g); i++) {
            jdt_tensor *t = jdt_graph_output(f->g, i);
            char what[128];
            snprintf(what, sizeof what, "step %d output %d (%s, node %d)", s, i, jdt_op_name(t->op),
                     t->id);
            fx_compare(what, jdt_program_output(p, i), jdt_interp_value(it, t), t->dtype,
                       jdt_shape_numel(&t->shape), rtol, atol);
        }
    }
    for (int i = 0; i < f->n; i++) {
        char what[128];
        snprintf(what, sizeof what, "leaf %s after %d steps", f->leaf[i]->name, steps);
        fx_compare(what, f->jit[i], f->ref[i], f->leaf[i]->dtype,
                   jdt_shape_numel(&f->leaf[i]->shape), rtol, atol);
    }
    jdt_interp_free(it);
    if (keep) return p;
    jdt_program_free(p);
    return NULL;
}

#endif /* JDT_JIT_FIXTURE_H */
