/*
 * kernels.c — benchmark of the CPU backend's kernels: fused elementwise chains, a primitive-built
 * softmax (reductions fused with their producers), layer norm, cross-entropy and the causal
 * attention forward/backward. Each case is timed three ways in the same run: the compiled
 * program (fusion on), the compiled program with fusion off (one kernel per op), and the
 * reference interpreter (naive loops, double precision). Prints one line per case with the
 * minimum time (the least disturbed run on a shared machine) of each and the ratios. Sizes scale
 * with argv[1] (default 1 = GPT-2-small-like rows); threads from argv[2] (default all); argv[3] =
 * "cpu" times with the process CPU clock instead of the wall clock (use it with 1 thread on a
 * shared, loaded machine: preemption by other processes then does not count).
 *
 *   make bench-build && build/bench/kernels [scale] [threads] [wall|cpu]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compile/compile.h"
#include "graph/builder.h"
#include "graph/interp.h"

typedef struct {
    const char *name;
    jdt_graph *g;
    double flops; /* useful flops for GFLOP/s, 0 = not shown */
} bcase;

static void bind_random(jdt_graph *g)
{
    for (int i = 0; i < jdt_graph_n_nodes(g); i++) {
        jdt_tensor *t = jdt_graph_node(g, i);
        if (t->op != JDT_OP_INPUT && t->op != JDT_OP_PARAM) continue;
        int64_t n = jdt_shape_numel(&t->shape);
        t->data = jdt_malloc_aligned((size_t)n * jdt_dtype_size(t->dtype) + 64);
        float *u = malloc(sizeof(float) * (size_t)n);
        jdt_rng_uniform(jdt_rng_key(1, t->name), 0, (size_t)n, u);
        for (int64_t j = 0; j < n; j++) {
            if (t->dtype == JDT_DTYPE_I32)
                ((int32_t *)t->data)[j] = (int32_t)(u[j] * 100.0f);
            else
                ((float *)t->data)[j] = 2.0f * u[j] - 1.0f;
        }
        free(u);
    }
}

static bool g_cpu_clock; /* bench driver only: set once from argv */

static double now_s(void)
{
    if (!g_cpu_clock) return now_s();
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double time_program(jdt_graph *g, bool fuse, int threads, int reps)
{
    jdt_compile_opts o;
    jdt_compile_opts_init(&o);
    o.threads = threads;
    o.no_fuse = !fuse;
    jdt_program *p = NULL;
    jdt_err e;
    if (jdt_program_compile(g, &o, &p, &e) != JDT_OK) {
        fprintf(stderr, "compile: %s\n", e.msg);
        return -1;
    }
    double t[64] = {0};     /* reps is 1..64 */
    jdt_program_run(p, &e); /* warm-up */
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        jdt_program_run(p, &e);
        t[r] = now_s() - t0;
    }
    qsort(t, (size_t)reps, sizeof(double), cmp_d);
    jdt_program_free(p);
    return t[0];
}

static double time_interp(jdt_graph *g)
{
    jdt_interp *it = NULL;
    jdt_err e;
    if (jdt_interp_new(g, &it, &e) != JDT_OK) return -1;
    jdt_interp_run(it, &e);
    double t = 1e30;
    for (int r = 0; r < 3; r++) {
        double t0 = now_s();
        jdt_interp_run(it, &e);
        double dt = now_s() - t0;
        t = dt < t ? dt : t;
    }
    jdt_interp_free(it);
    return t;
}

int main(int argc, char **argv)
{
    double scale = argc > 1 ? strtod(argv[1], NULL) : 1.0;
    int threads = argc > 2 ? (int)strtol(argv[2], NULL, 10) : 0;
    if (scale <= 0) scale = 1.0;
    g_cpu_clock = argc > 3 && strcmp(argv[3], "cpu") == 0;
    int64_t N = (int64_t)(2048 * scale), C = 768, V = 8192;
    int64_t B = 2, H = 12, T = (int64_t)(256 * (scale < 1 ? scale : 1) + 0.5), D = 64;
    if (T < 16) T = 16;
    bcase cases[8];
    int nc = 0;
    jdt_graph *g;
    int64_t nc_dims[2] = {N, C};

    /* 1. bias + gelu + residual + scale: 5 elementwise ops and a broadcast */
    g = jdt_graph_new();
    {
        jdt_tensor *x = jdt_graph_input(g, "x", JDT_DTYPE_F32, 2, nc_dims, NULL);
        jdt_tensor *r = jdt_graph_input(g, "r", JDT_DTYPE_F32, 2, nc_dims, NULL);
        jdt_tensor *b = jdt_graph_input(g, "b", JDT_DTYPE_F32, 1, &C, NULL);
        jdt_tensor *h = jdt_graph_gelu(g, jdt_graph_add_bcast(g, x, b));
        jdt_graph_add_output(g, jdt_graph_mul_scalar(g, jdt_graph_add(g, h, r), 0.5));
    }
    cases[nc++] = (bcase){"bias_gelu_residual", g, 0};

    /* 2. softmax from primitives: max, sub, exp, sum, div over rows */
    g = jdt_graph_new();
    {
        jdt_tensor *x = jdt_graph_input(g, "x", JDT_DTYPE_F32, 2, nc_dims, NULL);
        jdt_tensor *m = jdt_graph_reduce_max(g, x, 2u, true);
        jdt_tensor *ex = jdt_graph_exp(g, jdt_graph_sub_bcast(g, x, m));
        jdt_graph_add_output(g, jdt_graph_div_bcast(g, ex, jdt_graph_reduce_sum(g, ex, 2u, true)));
    }
    cases[nc++] = (bcase){"softmax_primitives", g, 0};

    /* 3. layer norm (fused primitive) with affine from primitives */
    g = jdt_graph_new();
    {
        jdt_tensor *x = jdt_graph_input(g, "x", JDT_DTYPE_F32, 2, nc_dims, NULL);
        jdt_tensor *w = jdt_graph_input(g, "w", JDT_DTYPE_F32, 1, &C, NULL);
        jdt_tensor *b = jdt_graph_input(g, "b", JDT_DTYPE_F32, 1, &C, NULL);
        jdt_tensor *y = jdt_graph_normalize(g, x, 1e-5);
        jdt_graph_add_output(g, jdt_graph_add_bcast(g, jdt_graph_mul_bcast(g, y, w), b));
    }
    cases[nc++] = (bcase){"layernorm_affine", g, 0};

    /* 4. cross-entropy forward + backward over a vocab */
    g = jdt_graph_new();
    {
        int64_t nv[2] = {N / 4, V};
        jdt_tensor *x = jdt_graph_input(g, "logits", JDT_DTYPE_F32, 2, nv, NULL);
        jdt_tensor *t = jdt_graph_input(g, "tg", JDT_DTYPE_I32, 1, nv, NULL);
        jdt_tensor *dl = jdt_graph_input(g, "dl", JDT_DTYPE_F32, 1, nv, NULL);
        jdt_tensor *xe = jdt_graph_softmax_xent(g, x, t);
        jdt_graph_add_output(g, xe);
        jdt_graph_add_output(g, jdt_graph_softmax_xent_bwd(g, x, t, dl, xe));
    }
    cases[nc++] = (bcase){"xent_fwd_bwd", g, 0};

    /* 5, 6. causal attention */
    double pairs = (double)T * (double)(T + 1) / 2.0, att = 4.0 * (double)(B * H * D) * pairs;
    int64_t qd[4] = {B, H, T, D};
    g = jdt_graph_new();
    {
        jdt_tensor *q = jdt_graph_input(g, "q", JDT_DTYPE_F32, 4, qd, NULL);
        jdt_tensor *k = jdt_graph_input(g, "k", JDT_DTYPE_F32, 4, qd, NULL);
        jdt_tensor *v = jdt_graph_input(g, "v", JDT_DTYPE_F32, 4, qd, NULL);
        jdt_graph_add_output(g, jdt_graph_attention(g, q, k, v, 0.125));
    }
    cases[nc++] = (bcase){"attention_fwd", g, att};
    g = jdt_graph_new();
    {
        jdt_tensor *q = jdt_graph_input(g, "q", JDT_DTYPE_F32, 4, qd, NULL);
        jdt_tensor *k = jdt_graph_input(g, "k", JDT_DTYPE_F32, 4, qd, NULL);
        jdt_tensor *v = jdt_graph_input(g, "v", JDT_DTYPE_F32, 4, qd, NULL);
        jdt_tensor *o = jdt_graph_input(g, "o", JDT_DTYPE_F32, 4, qd, NULL);
        jdt_tensor *d = jdt_graph_input(g, "do", JDT_DTYPE_F32, 4, qd, NULL);
        jdt_graph_add_output(g, jdt_graph_attention_bwd(g, q, k, v, o, d, 0.125));
    }
    cases[nc++] = (bcase){"attention_bwd", g, 2.5 * att};

    printf("# rows N=%lld C=%lld V=%lld; attention B=%lld H=%lld T=%lld D=%lld; threads=%d; "
           "clock=%s\n",
           (long long)N, (long long)C, (long long)V, (long long)B, (long long)H, (long long)T,
           (long long)D, threads, g_cpu_clock ? "cpu" : "wall");
    printf("%-20s %12s %12s %12s %10s %10s %9s\n", "case", "jit_ms", "nofuse_ms", "interp_ms",
           "nofuse/jit", "interp/jit", "GFLOP/s");
    for (int i = 0; i < nc; i++) {
        bind_random(cases[i].g);
        double tj = time_program(cases[i].g, true, threads, 15);
        double tn = time_program(cases[i].g, false, threads, 15);
        double ti = time_interp(cases[i].g);
        printf("%-20s %12.3f %12.3f %12.3f %10.2f %10.1f", cases[i].name, tj * 1e3, tn * 1e3,
               ti * 1e3, tn / tj, ti / tj);
        if (cases[i].flops > 0) printf(" %9.2f", cases[i].flops / tj / 1e9);
        printf("\n");
        fflush(stdout);
    }
    return 0;
}
