/*
 * peak.c — the MFU reference: what "100%" means for this process, and peak memory.
 *
 * A CPU has no trustworthy datasheet number (turbo, AVX clocks, SMT), so the reference is the
 * SGEMM rate OpenBLAS reaches with the process's thread budget (under bf16 compute with oneDNN,
 * the bf16 GEMM's rate: the caller passes that measurement). Measured on a busy machine it
 * is too low and MFU comes out above 100%, so it is measured once per (host, threads), kept
 * only when the machine was quiet, and cached beside the compile cache; runtime.peak_gflops
 * overrides it. Quiet means its threads held their cores: the process's CPU time over the
 * timed products' wall time, at least JDT_PEAK_QUIET_SHARE of the thread count. The 1-minute load
 * average, used before, lagged: it still counted the previous run, and this run's own compile, so
 * back-to-back runs on a quiet 2-core box never cached their reference and each warned. See
 * docs/observability.md.
 */
#include "obs/obs.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    const float *a, *b;
    float *c;
} sgemm_ctx;

static void sgemm_run(void *p)
{
    enum { N = 1024 };
    const sgemm_ctx *x = p;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.0f, x->a, N, x->b, N, 0.0f,
                x->c, N);
}

double jdt_peak_measure_sgemm(int n_rep, double *cores)
{
    enum { N = 1024 }; /* big enough for OpenBLAS to reach its steady-state rate */
    float *a = jdt_malloc_aligned((size_t)N * N * sizeof(float));
    float *b = jdt_malloc_aligned((size_t)N * N * sizeof(float));
    float *c = jdt_malloc_aligned((size_t)N * N * sizeof(float));
    double best = 0;
    if (cores) *cores = 0;
    if (a && b && c) {
        for (int i = 0; i < N * N; i++)
            a[i] = b[i] = 1e-3f * (float)(i % 97);
        sgemm_ctx ctx = {a, b, c};
        best = jdt_best_rate(2.0 * N * N * N, n_rep, sgemm_run, &ctx, cores);
    }
    jdt_free_aligned(a);
    jdt_free_aligned(b);
    jdt_free_aligned(c);
    return best;
}

/* Dense (no sparsity) tensor-core peaks from NVIDIA's datasheets, TFLOP/s. A name matches the
 * first row whose key it contains, so the more specific keys come first ("H100 NVL" before
 * "H100", "A100" before "A10", "L40S" before "L40" before "L4"). */
static const struct {
    const char *key;
    double bf16_tflops, tf32_tflops;
} GPU_PEAKS[] = {
    {"GH200", 989.4, 494.7},    {"H200 NVL", 835.5, 417.5},  {"H200", 989.4, 494.7},
    {"H100 NVL", 835.5, 417.5}, {"H100 PCIe", 756.5, 378.0}, {"H100", 989.4, 494.7},
    {"B200", 2250.0, 1100.0},   {"A100", 312.0, 156.0},      {"A10", 125.0, 62.5},
    {"L40S", 362.05, 183.0},    {"L40", 181.05, 90.5},       {"L4", 121.0, 60.0},
    {"RTX 4090", 165.2, 82.6},
};

double jdt_peak_gpu_datasheet(const char *name, bool bf16)
{
    if (!name) return 0;
    for (size_t i = 0; i < sizeof GPU_PEAKS / sizeof GPU_PEAKS[0]; i++)
        if (strstr(name, GPU_PEAKS[i].key))
            return (bf16 ? GPU_PEAKS[i].bf16_tflops : GPU_PEAKS[i].tf32_tflops) * 1e12;
    return 0;
}

void jdt_peak_reference_gpu(const char *device_name, bool bf16, double override_gflops,
                            jdt_peak_ref *out)
{
    memset(out, 0, sizeof *out);
    if (override_gflops > 0) {
        out->flops = override_gflops * 1e9;
        out->source = "runtime.peak_gflops";
        return;
    }
    out->flops = jdt_peak_gpu_datasheet(device_name, bf16);
    out->source = bf16 ? "device datasheet (dense bf16)" : "device datasheet (dense TF32)";
    if (out->flops <= 0) {
        out->flops = jdt_peak_gpu_datasheet("H100", bf16);
        out->source = bf16 ? "unknown GPU: H100 SXM dense bf16 assumed"
                           : "unknown GPU: H100 SXM dense TF32 assumed";
        out->guessed = true;
    }
}

static void mkdir_parents(char *path)
{
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        mkdir(path, 0755);
        *p = '/';
    }
    mkdir(path, 0755);
}

static double read_cache(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[128] = "";
    double v = 0;
    if (fgets(line, sizeof line, f)) {
        char *end;
        v = strtod(line, &end);
        if (end == line || !isfinite(v) || v <= 0) v = 0;
    }
    fclose(f);
    return v;
}

jdt_status jdt_peak_reference(const char *cache_dir, int threads, double override_gflops,
                              const jdt_peak_gemm *gemm, jdt_peak_ref *out, jdt_err *e)
{
    memset(out, 0, sizeof *out);
    if (override_gflops > 0) {
        out->flops = override_gflops * 1e9;
        out->source = "runtime.peak_gflops";
        return JDT_OK;
    }
    if (gemm) snprintf(out->gemm, sizeof out->gemm, "%s", gemm->what);
    const char *core = openblas_get_corename();
    snprintf(out->blas_core, sizeof out->blas_core, "%s", core && *core ? core : "unknown");
    for (char *p = out->blas_core; *p; p++)
        if (*p == '/' || *p == ' ') *p = '_';
    int nt = threads > 0 ? threads : omp_get_max_threads();
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    for (char *p = host; *p; p++)
        if (*p == '/') *p = '_';
    if (cache_dir && *cache_dir) {
        /* a path that would not fit is not cached (measured each run) rather than truncated */
        char dir[sizeof out->cache_path - sizeof host - sizeof out->blas_core - 32];
        const int nd = snprintf(dir, sizeof dir, "%s/peak", cache_dir);
        if (nd < 0 || (size_t)nd >= sizeof dir) goto measure;
        mkdir_parents(dir);
        snprintf(out->cache_path, sizeof out->cache_path, "%s/%s-t%d-%s%s%s.txt", dir, host, nt,
                 out->blas_core, gemm ? "-" : "", gemm ? gemm->name : "");
        double cached = read_cache(out->cache_path);
        if (cached > 0) {
            out->flops = cached * 1e9;
            out->source = "cached";
            openblas_set_num_threads(nt);
            return JDT_OK;
        }
    }
measure:
    openblas_set_num_threads(nt);
    double held = 0;
    out->flops = gemm ? gemm->measure(7, nt, &held) : jdt_peak_measure_sgemm(7, &held);
    if (out->flops <= 0)
        return gemm ? jdt_err_set(e, JDT_ERR_INTERNAL, "MFU reference: measuring %s failed",
                                  gemm->what)
                    : jdt_err_set(e, JDT_ERR_NOMEM, "MFU reference: out of memory");
    /* all its threads' worth: more threads than the CPUs it may use (taskset, a cpuset) never
     * pass, so a rate measured oversubscribed is not cached under the thread count (a later run
     * with the CPUs would read half its rate as its peak) */
    out->cores_held = held;
    out->cores_wanted = nt;
    if (held < JDT_PEAK_QUIET_SHARE * out->cores_wanted) {
        out->source = "measured (busy machine: not cached)";
        out->provisional = true;
        return JDT_OK;
    }
    out->source = "measured";
    if (out->cache_path[0]) {
        char tmp[1100];
        snprintf(tmp, sizeof tmp, "%s.tmp.%ld", out->cache_path, (long)getpid());
        FILE *f = fopen(tmp, "w");
        bool ok = f && fprintf(f,
                               "%.3f\n# GFLOP/s: best of 7+ %s 1024^3 on %d threads (OpenBLAS "
                               "%s), host %s, its threads holding %.2f of %g cores\n",
                               out->flops * 1e-9, gemm ? gemm->what : "SGEMM", nt, out->blas_core,
                               host, held, out->cores_wanted) > 0;
        if (f && fclose(f) != 0) ok = false;
        if (!ok || rename(tmp, out->cache_path) != 0) {
            JDT_WARN("could not cache the MFU reference in %s: %s", out->cache_path,
                     strerror(errno));
            unlink(tmp);
            out->cache_path[0] = '\0';
        }
    }
    return JDT_OK;
}

int64_t jdt_obs_peak_rss_bytes(void)
{
    /* VmHWM belongs to this program's address space. getrusage's ru_maxrss survives execve: a
     * process started by a big launcher (torchrun's Python forks, then execs us) reported the
     * launcher's ~230 MB as its own peak. */
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        char line[128];
        long long kib = -1;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "VmHWM: %lld kB", &kib) == 1) break;
        fclose(f);
        if (kib >= 0) return (int64_t)kib * 1024;
    }
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (int64_t)ru.ru_maxrss * 1024; /* Linux reports KiB */
}
