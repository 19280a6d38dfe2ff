/*
 * bench_io.c — throughput of the HDF5 data loader and checkpoint save/load.
 *
 *   build/bench/bench_io DIR [n_tokens] [ckpt_mib]
 *
 * Writes a synthetic token file (vocab 50257, u16) and a checkpoint of one f32 tensor into DIR
 * (which it creates), reads 200 batches of B=64, T=1024 sequentially and shuffled, with and
 * without prefetch, and prints ms/batch and tokens/s; then the checkpoint save (with fsync)
 * and load rates. Deletes what it wrote.
 */
#include "datasets/datasets.h"
#include "io/ckpt.h"
#include "io/data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const jdt_err *e)
{
    fprintf(stderr, "bench_io: %s\n", e->msg);
    return 1;
}

static int64_t parse_i64(const char *s, const char *what)
{
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    if (!end || *end || v <= 0) {
        fprintf(stderr, "bench_io: bad %s '%s'\n", what, s);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_io DIR [n_tokens] [ckpt_mib]\n");
        return 2;
    }
    const char *dir = argv[1];
    int64_t n_tokens = argc > 2 ? parse_i64(argv[2], "n_tokens") : 20000000;
    int64_t ckpt_mib = argc > 3 ? parse_i64(argv[3], "ckpt_mib") : 256;
    jdt_err e;
    char cmd[2200], tok[1024], ck[1024];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
    if (system(cmd) != 0) return 1;
    snprintf(tok, sizeof tok, "%s/bench_tokens.h5", dir);
    snprintf(ck, sizeof ck, "%s/bench_ckpt", dir);

    double t0 = jdt_now_s();
    if (jdt_prep_synth_tokens(tok, n_tokens, 50257, 1, &e)) return fail(&e);
    printf("write %lld tokens: %.2f s\n", (long long)n_tokens, jdt_now_s() - t0);
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        for (int pf = 0; pf < 3; pf += 2) {
            jdt_data_opts o = {.path = tok,
                               .seq_len = 1024,
                               .global_batch = 64,
                               .shuffle = shuffle,
                               .prefetch = pf};
            jdt_data *d = NULL;
            if (jdt_data_open(&o, &d, &e)) return fail(&e);
            jdt_data_batch b;
            enum { K = 200 };
            t0 = jdt_now_s();
            for (int k = 0; k < K; k++)
                if (jdt_data_get(d, k, &b, &e)) return fail(&e);
            double dt = jdt_now_s() - t0;
            printf("B=64 T=1024 shuffle=%d prefetch=%d: %.2f ms/batch, %.1f M tokens/s\n", shuffle,
                   pf, dt / K * 1e3, K * 64.0 * 1024 / dt / 1e6);
            jdt_data_close(d);
        }
    }
    size_t n = (size_t)ckpt_mib << 18; /* f32 elements */
    float *x = malloc(n * sizeof *x);
    if (!x) return 1;
    for (size_t i = 0; i < n; i++)
        x[i] = (float)i;
    jdt_ckpt_tensor t = {.name = "params/w",
                         .dtype = JDT_DTYPE_F32,
                         .ndim = 2,
                         .shape = {(int64_t)(n / 1024), 1024},
                         .data = x};
    jdt_ckpt_meta m = {.step = 1};
    t0 = jdt_now_s();
    if (jdt_ckpt_save(ck, &m, &t, 1, NULL, NULL, &e)) return fail(&e);
    double ds = jdt_now_s() - t0;
    jdt_ckpt *c = NULL;
    char step[1100];
    snprintf(step, sizeof step, "%s/step_000001", ck);
    if (jdt_ckpt_open(step, &c, &e)) return fail(&e);
    t0 = jdt_now_s();
    if (jdt_ckpt_read(c, &t, x, &e)) return fail(&e);
    double dl = jdt_now_s() - t0;
    jdt_ckpt_close(c);
    printf("checkpoint %lld MiB: save %.2f s (%.0f MiB/s, with fsync), load %.2f s (%.0f MiB/s)\n",
           (long long)ckpt_mib, ds, (double)ckpt_mib / ds, dl, (double)ckpt_mib / dl);
    free(x);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", tok, ck);
    return system(cmd) == 0 ? 0 : 1;
}
