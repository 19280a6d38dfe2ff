/*
 * gemm_bf16.c — f32 SGEMM (OpenBLAS, jdt_rt_matmul) against the bf16 GEMM of
 * `precision.compute: bf16` (jdt_rt_matmul_bf16: input conversion included) on the GEMM shapes
 * of the L=6 C=384 GPT's training step (B*T = 2048 rows) and a 2048^3 square, alternating the
 * two REPS times in one run and keeping each one's fastest run (the least disturbed on a shared
 * machine). Prints GFLOP/s per path and the ratio bf16 / f32.
 *
 *   make bench-build && OMP_WAIT_POLICY=passive build/bench/gemm_bf16 [threads] [reps]
 * (passive: what jdt-train itself runs with, cmd/main.c; a spinning pool on a busy machine
 * measures the scheduler, not the GEMMs)
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "runtime/runtime.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    int nt = argc > 1 ? atoi(argv[1]) : 2, reps = argc > 2 ? atoi(argv[2]) : 5;
    if (nt < 1 || reps < 1) {
        fprintf(stderr, "usage: gemm_bf16 [threads >= 1] [reps >= 1]\n");
        return 2;
    }
    static const struct {
        const char *what;
        int64_t M, N, K;
        bool ta, tb;
    } cases[] = {
        {"qkv fwd   x(2048,384) W(384,1152)", 2048, 1152, 384, false, false},
        {"mlp fwd   x(2048,384) W(384,1536)", 2048, 1536, 384, false, false},
        {"mlp bwd dx dy(2048,1536) W^T", 2048, 384, 1536, false, true},
        {"mlp bwd dW x^T dy (384,1536)", 384, 1536, 2048, true, false},
        {"square 2048^3", 2048, 2048, 2048, false, false},
    };
    jdt_rt_set_threads(nt);
    printf("%s; %d threads, best of %d alternating runs\n", jdt_rt_bf16_describe(), nt, reps);
    printf("%-36s %10s %10s %8s\n", "GEMM (M N K)", "f32 GF/s", "bf16 GF/s", "bf16/f32");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t M = cases[c].M, N = cases[c].N, K = cases[c].K;
        float *a = malloc(sizeof(float) * (size_t)(M * K)),
              *b = malloc(sizeof(float) * (size_t)(K * N));
        float *o = malloc(sizeof(float) * (size_t)(M * N));
        float *s =
            malloc(sizeof(float) * (size_t)jdt_rt_matmul_bf16_scratch_floats(1, M, N, K, true));
        if (!a || !b || !o || !s) return 1;
        for (int64_t i = 0; i < M * K; i++)
            a[i] = (float)((i * 7919) % 2001) / 1000.0f - 1.0f;
        for (int64_t i = 0; i < K * N; i++)
            b[i] = (float)((i * 104729) % 2001) / 1000.0f - 1.0f;
        double best32 = 1e30, best16 = 1e30;
        for (int r = 0; r <= reps; r++) { /* r = 0 warms both up (primitive creation) */
            double t0 = now_s();
            jdt_rt_matmul(a, b, NULL, o, 1, M, N, K, cases[c].ta, cases[c].tb, true, nt);
            double t1 = now_s();
            jdt_rt_matmul_bf16(a, b, NULL, o, 1, M, N, K, cases[c].ta, cases[c].tb, true, s, nt);
            double t2 = now_s();
            if (r > 0 && t1 - t0 < best32) best32 = t1 - t0;
            if (r > 0 && t2 - t1 < best16) best16 = t2 - t1;
        }
        double gf = 2.0 * (double)M * (double)N * (double)K / 1e9;
        printf("%-36s %10.1f %10.1f %8.2f\n", cases[c].what, gf / best32, gf / best16,
               best32 / best16);
        free(a);
        free(b);
        free(o);
        free(s);
    }
    return 0;
}
