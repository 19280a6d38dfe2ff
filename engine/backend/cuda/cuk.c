/*
 * cuk.c — the CUDA kernels module's context and launchers (see cuk.h): NVRTC compilation of the
 * embedded kernel sources for the device's architecture, the on-disk cubin cache, loading with
 * the runtime's library API (cudaLibraryLoadData: the binary links libcudart, never libcuda, so
 * it starts on a machine without a driver) and one launcher per builtin kernel. GEMMs are in
 * cuk_gemm.c, NCCL in cuk_comm.c.
 *
 * Cache: the compile cache's entries (engine/compile/cache.c) <cache_dir>/jdt-<key>.cuk, key a
 * hash of (the .cu text, every header, NVRTC version, target); checksummed, renamed into place
 * whole, one compile per host at a time; a damaged entry, or one cudaLibraryLoadData rejects, is
 * recompiled. A source loads at the first launch of one of its kernels (jdt_cuk_load).
 */
#include "backend/cuda/cuda.h"
#include "backend/cuda/cuk-impl.h"
#include "compile/compile-impl.h"

#include <elf.h>
#include <link.h>
#include <nvrtc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *file, *name;
} KERNELS[JDT_CUK_K_COUNT] = {
#define X(e, f, n) {f, n},
    JDT_CUK_KERNELS(X)
#undef X
};
_Static_assert(sizeof(KERNELS) / sizeof(KERNELS[0]) == JDT_CUK_K_COUNT, "kernel table complete");

#define ROW_THREADS_MAX 1024
#define GRID_MAX 2147483647LL /* gridDim.x limit; the kernels grid-stride past it */

/* ---- errors ------------------------------------------------------------------------------- */

jdt_status jdt_cuk_cuda_err(jdt_err *e, cudaError_t rc, const char *what)
{
    jdt_status code = JDT_ERR_INTERNAL;
    if (rc == cudaErrorNoDevice || rc == cudaErrorInsufficientDriver ||
        rc == cudaErrorNoKernelImageForDevice || rc == cudaErrorInvalidDevice)
        code = JDT_ERR_UNSUPPORTED;
    else if (rc == cudaErrorMemoryAllocation)
        code = JDT_ERR_NOMEM;
    return jdt_err_set(e, code, "%s: %s (%s)", what, cudaGetErrorString(rc), cudaGetErrorName(rc));
}

void jdt_cuk_defer(jdt_cuk *k, jdt_status code, const char *fmt, ...)
{
    if (k->pending.code != JDT_OK) return; /* keep the first */
    va_list ap;
    va_start(ap, fmt);
    jdt_err_vset(&k->pending, code, fmt, ap);
    va_end(ap);
}

void *jdt_cuk_tmp_alloc(jdt_cuk *k, size_t n, bool *async, cudaError_t *rc)
{
    void *p = NULL;
    cudaError_t ce = cudaMallocAsync(&p, n, k->stream);
    *async = ce == cudaSuccess;
    if (ce == cudaErrorNotSupported) { /* a device or driver without memory pools */
        (void)cudaGetLastError();
        ce = cudaMalloc(&p, n);
    }
    *rc = ce;
    if (ce != cudaSuccess) {
        (void)cudaGetLastError(); /* reported by the caller, not left to the next call */
        return NULL;
    }
    return p;
}

void jdt_cuk_tmp_free(jdt_cuk *k, void *p, bool async)
{
    if (!p) return;
    if (async)
        (void)cudaFreeAsync(p, k->stream);
    else
        (void)cudaFree(p); /* after the device's work, which includes the caller's */
}

static jdt_status nvrtc_err(jdt_err *e, nvrtcResult rc, const char *what)
{
    return jdt_err_set(e, JDT_ERR_COMPILE, "%s: %s", what, nvrtcGetErrorString(rc));
}

/* JDT_CUK_ATTENTION=fma: the f32 FMA attention even for bf16 compute (to compare speed) */
static bool att_fma_forced(void)
{
    const char *att = getenv("JDT_CUK_ATTENTION");
    return att && strcmp(att, "fma") == 0;
}

/* ---- NVRTC -------------------------------------------------------------------------------- */

/* Picks the NVRTC target for a device of compute capability `arch`: a cubin (sm_XX) when NVRTC
 * supports that arch, else PTX for the newest supported arch below it (the driver JIT-compiles
 * it). *target receives "sm_90" or "compute_89". ERR_UNSUPPORTED when NVRTC is newer than the
 * device's architecture. */
static jdt_status pick_target(int arch, char *target, size_t n, bool *cubin, jdt_err *e)
{
    int n_archs = 0;
    nvrtcResult rc = nvrtcGetNumSupportedArchs(&n_archs);
    if (rc != NVRTC_SUCCESS) return nvrtc_err(e, rc, "nvrtcGetNumSupportedArchs");
    int archs[128], best = -1;
    if (n_archs > 128) n_archs = 128;
    if ((rc = nvrtcGetSupportedArchs(archs)) != NVRTC_SUCCESS)
        return nvrtc_err(e, rc, "nvrtcGetSupportedArchs");
    for (int i = 0; i < n_archs; i++)
        if (archs[i] <= arch && archs[i] > best) best = archs[i];
    if (best < 0)
        return jdt_err_set(
            e, JDT_ERR_UNSUPPORTED,
            "GPU architecture sm_%d is older than this NVRTC supports (oldest sm_%d)", arch,
            n_archs > 0 ? archs[0] : 0);
    *cubin = best == arch;
    snprintf(target, n, "%s_%d", *cubin ? "sm" : "compute", best);
    return JDT_OK;
}

/* Compiles source `si` for `target`. On success *code (jdt_malloc'd) holds the cubin (or PTX,
 * NUL-terminated) and *n_bytes its size. ERR_COMPILE with the NVRTC log on failure. */
static jdt_status nvrtc_compile(int si, const char *target, bool cubin, char **code,
                                size_t *n_bytes, jdt_err *e)
{
    const char *hdr_text[JDT_CUK_MAX_LIBS * 2], *hdr_name[JDT_CUK_MAX_LIBS * 2];
    int n_hdr = 0;
    for (int i = 0; i < jdt_cuk_n_sources && n_hdr < JDT_CUK_MAX_LIBS * 2; i++) {
        size_t len = strlen(jdt_cuk_sources[i].name);
        if (len > 4 && strcmp(jdt_cuk_sources[i].name + len - 4, ".cuh") == 0) {
            hdr_text[n_hdr] = jdt_cuk_sources[i].text;
            hdr_name[n_hdr++] = jdt_cuk_sources[i].name;
        }
    }
    nvrtcProgram prog;
    nvrtcResult rc = nvrtcCreateProgram(&prog, jdt_cuk_sources[si].text, jdt_cuk_sources[si].name,
                                        n_hdr, hdr_text, hdr_name);
    if (rc != NVRTC_SUCCESS) return nvrtc_err(e, rc, "nvrtcCreateProgram");
    jdt_status s = JDT_OK;
    rc = (nvrtcResult)jdt_cuda_nvrtc_compile(prog, target);
    if (rc != NVRTC_SUCCESS) {
        size_t log_n = 0;
        char log[1536] = "";
        if (nvrtcGetProgramLogSize(prog, &log_n) == NVRTC_SUCCESS && log_n > 1) {
            char *full = jdt_malloc(log_n);
            if (full && nvrtcGetProgramLog(prog, full) == NVRTC_SUCCESS)
                snprintf(log, sizeof log, "%s", full);
            jdt_free(full);
        }
        s = jdt_err_set(e, JDT_ERR_COMPILE, "NVRTC %s for %s: %s\n%s", jdt_cuk_sources[si].name,
                        target, nvrtcGetErrorString(rc), log);
        goto out_prog;
    }
    size_t n = 0;
    rc = cubin ? nvrtcGetCUBINSize(prog, &n) : nvrtcGetPTXSize(prog, &n);
    if (rc != NVRTC_SUCCESS) {
        s = nvrtc_err(e, rc, "nvrtcGetCUBINSize");
        goto out_prog;
    }
    char *buf = jdt_malloc(n + 1);
    if (!buf) {
        s = jdt_err_set(e, JDT_ERR_NOMEM, "NVRTC output of %zu bytes", n);
        goto out_prog;
    }
    rc = cubin ? nvrtcGetCUBIN(prog, buf) : nvrtcGetPTX(prog, buf);
    if (rc != NVRTC_SUCCESS) {
        jdt_free(buf);
        s = nvrtc_err(e, rc, "nvrtcGetCUBIN");
        goto out_prog;
    }
    buf[n] = '\0';
    *code = buf;
    *n_bytes = n;
out_prog:
    nvrtcDestroyProgram(&prog);
    return s;
}

/* ---- on-disk cache ------------------------------------------------------------------------ */

static uint64_t source_key(int si, const char *target)
{
    int maj = 0, min = 0;
    nvrtcVersion(&maj, &min);
    uint64_t h = jdt_hash_str(JDT_HASH_INIT, "cuk-v1");
    h = jdt_hash_u64(h, (uint64_t)maj * 1000 + (uint64_t)min);
    h = jdt_hash_str(h, target);
    h = jdt_hash_str(h, jdt_cuk_sources[si].text);
    for (int i = 0; i < jdt_cuk_n_sources; i++)
        if (i != si)
            h = jdt_hash_str(jdt_hash_str(h, jdt_cuk_sources[i].name), jdt_cuk_sources[i].text);
    return h;
}

typedef struct {
    int si;
    const char *target;
    bool cubin;
    bool ahead; /* jdt_cuk_precompile: no run is waiting for it */
} source_build;

static jdt_status build_source(void *ctx, unsigned char **bytes, size_t *n_bytes, jdt_err *e)
{
    const source_build *b = ctx;
    JDT_INFO("cuda: compiling the builtin kernels of %s for %s with NVRTC%s",
             jdt_cuk_sources[b->si].name, b->target,
             b->ahead ? " (ahead of time)" : " (first use; cached for later runs)");
    char *code = NULL;
    jdt_status s = nvrtc_compile(b->si, b->target, b->cubin, &code, n_bytes, e);
    *bytes = (unsigned char *)code;
    return s;
}

/* How long a process waits for another's NVRTC compile of the same source (the FMA attention
 * takes about a minute on 2 cores). */
#define CUK_LOCK_WAIT_S 900.0

/* Source si for target, from the compile cache under cache_dir (NULL or "": none) or compiled
 * by NVRTC (one process of a node compiles, the others wait for its entry), loaded as *lib. */
static jdt_status load_source(int si, const char *target, bool cubin, const char *cache_dir,
                              cudaLibrary_t *lib, jdt_err *e)
{
    const uint64_t key = source_key(si, target);
    source_build b = {si, target, cubin, false};
    unsigned char *code = NULL;
    size_t n = 0;
    jdt_cache_how how;
    jdt_status s = jdt_compile_cache_fetch(cache_dir, key, "cuk", CUK_LOCK_WAIT_S, 0, build_source,
                                           &b, &code, &n, &how, e);
    if (s != JDT_OK) return s;
    cudaError_t rc = cudaLibraryLoadData(lib, code, NULL, NULL, 0, NULL, NULL, 0);
    if (rc != cudaSuccess && how != JDT_CACHE_BUILT) { /* an entry this NVRTC cannot load */
        jdt_free(code);
        code = NULL;
        if ((s = build_source(&b, &code, &n, e)) != JDT_OK) return s;
        rc = cudaLibraryLoadData(lib, code, NULL, NULL, 0, NULL, NULL, 0);
        jdt_err pe;
        jdt_err_clear(&pe);
        if (rc == cudaSuccess && cache_dir && *cache_dir &&
            jdt_compile_cache_put(cache_dir, key, "cuk", code, n, 0, &pe) != JDT_OK)
            JDT_WARN("%s", pe.msg);
    }
    jdt_free(code);
    if (rc != cudaSuccess) {
        jdt_cuk_cuda_err(e, rc, "cudaLibraryLoadData");
        return jdt_err_prefix(e, "loading %s (%s)", jdt_cuk_sources[si].name, target);
    }
    return JDT_OK;
}

/* The jdt_cuk_sources index of file, or -1. */
static int source_index(const char *file)
{
    for (int si = 0; si < jdt_cuk_n_sources; si++)
        if (strcmp(jdt_cuk_sources[si].name, file) == 0) return si;
    return -1;
}

jdt_status jdt_cuk_precompile(int arch, const char *cache_dir, unsigned sources, int *n_built,
                              int *n_cached, jdt_err *e)
{
    static const struct {
        unsigned bit;
        const char *file;
    } SRC[] = {{JDT_CUK_SRC_BASE, "cuk_misc.cu"},
               {JDT_CUK_SRC_BASE, "cuk_rows.cu"},
               {JDT_CUK_SRC_ATT_TC, "cuk_attention_tc.cu"},
               {JDT_CUK_SRC_ATT_FMA, "cuk_attention.cu"}};
    char target[32];
    bool cubin;
    jdt_status s = pick_target(arch, target, sizeof target, &cubin, e);
    if (s != JDT_OK) return s;
    for (size_t i = 0; i < sizeof SRC / sizeof SRC[0]; i++) {
        if (!(sources & SRC[i].bit)) continue;
        const int si = source_index(SRC[i].file);
        if (si < 0)
            return jdt_err_set(e, JDT_ERR_INTERNAL, "builtin source %s not embedded", SRC[i].file);
        source_build b = {si, target, cubin, true};
        unsigned char *code = NULL;
        size_t n = 0;
        jdt_cache_how how;
        const uint64_t key = source_key(si, target);
        s = jdt_compile_cache_fetch(cache_dir, key, "cuk", CUK_LOCK_WAIT_S, 0, build_source, &b,
                                    &code, &n, &how, e);
        jdt_free(code);
        if (s != JDT_OK) return s;
        /* compiled for the cache: a store that failed (a warning at run time) fails here */
        if (cache_dir && *cache_dir && (s = jdt_compile_cache_require(cache_dir, key, "cuk", e)))
            return s;
        ++*(how == JDT_CACHE_BUILT ? n_built : n_cached);
    }
    return JDT_OK;
}

/* ---- context ------------------------------------------------------------------------------ */

jdt_status jdt_cuk_load(jdt_cuk *k, int kernel, jdt_err *e)
{
    if (k->fn[kernel]) return JDT_OK;
    const char *file = KERNELS[kernel].file;
    const int si = source_index(file);
    if (si < 0)
        return jdt_err_set(e, JDT_ERR_INTERNAL, "kernel %s: source %s not embedded",
                           KERNELS[kernel].name, file);
    if (si >= 64 || k->n_libs == JDT_CUK_MAX_LIBS)
        return jdt_err_set(e, JDT_ERR_INTERNAL, "more than %d kernel sources", JDT_CUK_MAX_LIBS);
    if (k->failed_src >> si & 1) /* once: not a second compile per launch */
        return jdt_err_set(e, JDT_ERR_COMPILE, "kernel %s: its source %s did not load",
                           KERNELS[kernel].name, file);
    cudaLibrary_t lib;
    jdt_status s = load_source(si, k->target, k->cubin, k->cache_dir, &lib, e);
    if (s != JDT_OK) {
        k->failed_src |= 1ull << si;
        return s;
    }
    k->libs[k->n_libs++] = lib;
    for (int ki = 0; ki < JDT_CUK_K_COUNT; ki++) {
        if (strcmp(KERNELS[ki].file, file) != 0) continue;
        cudaError_t rc = cudaLibraryGetKernel(&k->fn[ki], lib, KERNELS[ki].name);
        if (rc != cudaSuccess) {
            k->fn[ki] = NULL;
            k->failed_src |= 1ull << si;
            jdt_cuk_cuda_err(e, rc, "cudaLibraryGetKernel");
            return jdt_err_prefix(e, "kernel %s", KERNELS[ki].name);
        }
    }
    return JDT_OK;
}

jdt_status jdt_cuk_load_all(jdt_cuk *k, jdt_err *e)
{
    for (int ki = 0; ki < JDT_CUK_K_COUNT; ki++) {
        jdt_status s = jdt_cuk_load(k, ki, e);
        if (s != JDT_OK) return s;
    }
    return JDT_OK;
}

int jdt_cuk_n_loaded(const jdt_cuk *k)
{
    return k->n_libs;
}

/* dl_iterate_phdr's callback: the first object (the executable) ends the walk, its GNU build
 * ID hashed into *(uint64_t *)data when it has one. A note is a 12-byte header, the name from
 * offset 12 and the descriptor from the next multiple of the segment's alignment (4, or 8 for
 * .note.gnu.property's segment), each note starting at such a multiple. */
static int build_id_of(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_NOTE) continue;
        const size_t al = ph->p_align == 8 ? 8 : 4, len = ph->p_memsz;
        const char *seg = (const char *)(info->dlpi_addr + ph->p_vaddr);
        for (size_t at = 0; at + sizeof(ElfW(Nhdr)) <= len;) {
            const ElfW(Nhdr) *nh = (const void *)(seg + at);
            const size_t name = at + sizeof *nh, desc = (name + nh->n_namesz + al - 1) & ~(al - 1),
                         next = (desc + nh->n_descsz + al - 1) & ~(al - 1);
            if (desc > len || nh->n_descsz > len - desc) break;
            if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 &&
                memcmp(seg + name, "GNU", 4) == 0) {
                *(uint64_t *)data = jdt_hash_bytes(JDT_HASH_INIT, seg + desc, nh->n_descsz);
                return 1;
            }
            at = next;
        }
    }
    return 1;
}

static uint64_t build_id_;

static void build_id_once(void)
{
    dl_iterate_phdr(build_id_of, &build_id_);
}

uint64_t jdt_cuk_build_id(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, build_id_once);
    return build_id_;
}

/* The part of jdt_cuk_pick_key that is fixed for k: the build ID, the GPU (name, architecture,
 * multiprocessors), the driver's and NVRTC's versions and NVRTC's target (k->target set). */
static uint64_t pick_base(const jdt_cuk *k)
{
    struct cudaDeviceProp prop;
    uint64_t h = jdt_hash_u64(JDT_HASH_INIT, jdt_cuk_build_id());
    if (cudaGetDeviceProperties(&prop, k->device) == cudaSuccess)
        h = jdt_hash_str(h, prop.name);
    else
        (void)cudaGetLastError();
    h = jdt_hash_u64(jdt_hash_u64(h, (uint64_t)k->arch), (uint64_t)k->sms);
    /* our kernels' compiler and target, and the driver (which compiles PTX targets) */
    int drv = 0, nv_major = 0, nv_minor = 0;
    if (cudaDriverGetVersion(&drv) != cudaSuccess) (void)cudaGetLastError();
    (void)nvrtcVersion(&nv_major, &nv_minor);
    h = jdt_hash_u64(h, (uint64_t)drv * 1000000u + (uint64_t)nv_major * 1000u + (uint64_t)nv_minor);
    return jdt_hash_str(h, k->target);
}

uint64_t jdt_cuk_pick_key(const jdt_cuk *k, const char *kind)
{
    return jdt_hash_u64(jdt_hash_u64(jdt_hash_str(JDT_HASH_INIT, kind), k->pick_base),
                        (uint64_t)k->pick_salt);
}

bool jdt_cuk_pick_read(const jdt_cuk *k, uint64_t key, const char *kind, char *buf, size_t n)
{
    unsigned char *b = NULL;
    size_t len = 0;
    if (n == 0 || !k->cache_dir[0] || !jdt_cuk_build_id() ||
        !jdt_compile_cache_get(k->cache_dir, key, kind, &b, &len))
        return false;
    const size_t m = len < n - 1 ? len : n - 1;
    memcpy(buf, b, m);
    buf[m] = '\0';
    jdt_free(b);
    return true;
}

void jdt_cuk_pick_write(const jdt_cuk *k, uint64_t key, const char *kind, const char *text,
                        const char *what, bool *said)
{
    if (!k->cache_dir[0] || !jdt_cuk_build_id()) return;
    jdt_err e;
    jdt_err_clear(&e);
    if (jdt_compile_cache_put(k->cache_dir, key, kind, text, strlen(text), -1, &e) != JDT_OK &&
        !*said) {
        *said = true;
        JDT_INFO("cuda: %s is not remembered: %s", what, e.msg);
    }
}

jdt_status jdt_cuk_init(int device, const char *cache_dir, jdt_cuk **out, jdt_err *e)
{
    *out = NULL;
    int n_dev = 0;
    cudaError_t rc = cudaGetDeviceCount(&n_dev);
    if (rc != cudaSuccess)
        return jdt_cuk_cuda_err(e, rc, "no usable CUDA GPU (cudaGetDeviceCount)");
    if (n_dev == 0) return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "no CUDA GPU found");
    if (device < 0 || device >= n_dev)
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED,
                           "CUDA device %d requested but this machine has %d GPU%s (is the local "
                           "rank larger than the GPUs per node?)",
                           device, n_dev, n_dev == 1 ? "" : "s");
    jdt_cuk *k = jdt_calloc(1, sizeof *k);
    if (!k) return jdt_err_set(e, JDT_ERR_NOMEM, "CUDA context");
    k->device = device;
    jdt_status s = JDT_OK;
    int major = 0, minor = 0;
    if ((rc = cudaSetDevice(device)) != cudaSuccess ||
        (rc = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device)) !=
            cudaSuccess ||
        (rc = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device)) !=
            cudaSuccess ||
        (rc = cudaDeviceGetAttribute(&k->sms, cudaDevAttrMultiProcessorCount, device)) !=
            cudaSuccess) {
        s = jdt_cuk_cuda_err(e, rc, "cudaSetDevice");
        goto fail;
    }
    k->arch = major * 10 + minor;
    k->att_fma = att_fma_forced();
    /* JDT_CUDA_TF32=0: f32 GEMMs without TF32 (PyTorch's allow_tf32 = False), for comparing
     * against the CPU beyond TF32's 10-bit mantissa (check_cuda's train test) */
    const char *tf32 = getenv("JDT_CUDA_TF32");
    k->no_tf32 = tf32 && strcmp(tf32, "0") == 0;
    /* JDT_CUDA_AUTOTUNE: auto (unset: the default) gives each GEMM plan the algorithm timed
     * fastest, once, or remembered from an earlier run in the kernel cache (cuk_gemm.c); 1 times
     * every plan again, remembered or not; 0 the heuristic's first, untimed */
    const char *tune = getenv("JDT_CUDA_AUTOTUNE");
    const bool tune_auto = !tune || !*tune || strcmp(tune, "auto") == 0;
    k->autotune = tune_auto || strcmp(tune, "1") == 0;
    k->retune = k->autotune && !tune_auto;
    if (!k->autotune && strcmp(tune, "0") != 0)
        JDT_WARN("JDT_CUDA_AUTOTUNE=%s: expected auto, 0 or 1; GEMMs take cuBLASLt's heuristic's "
                 "first algorithm, untimed",
                 tune);
    const char *split = getenv("JDT_GEMM_SPLIT");
    k->gemm_split = !(split && strcmp(split, "0") == 0);
    /* JDT_NORM_WARPS=0: the norms with an affine and their backwards' partial-sum kernels a
     * block per row, as before Session 31 (check.sh's stage 4w compares) */
    const char *nw = getenv("JDT_NORM_WARPS");
    k->norm_warps = !(nw && strcmp(nw, "0") == 0);
    /* JDT_XENT_SMEM=0: the fused classifier reads each bf16 row twice, as before Session 32 */
    const char *xs = getenv("JDT_XENT_SMEM");
    k->xent_smem = !(xs && strcmp(xs, "0") == 0);
    /* JDT_CUDNN_ATTENTION: the bf16 attention through cuDNN's fused engines where they take
     * the shape (cuk_cudnn.c). auto (unset: the default) tries each shape and direction once
     * against jdt-train's kernels and keeps cuDNN only where its outputs agree and it is faster
     * (jdt_cuk_dnn_attention_auto); 1 cuDNN wherever it takes the shape, unchecked; fast the
     * same with the backward's dQ accumulated (maybe atomically); 0 never */
    const char *dnn = getenv("JDT_CUDNN_ATTENTION");
    k->dnn_auto = !dnn || !*dnn || strcmp(dnn, "auto") == 0;
    k->dnn_on = k->dnn_auto || strcmp(dnn, "1") == 0 ? 1 : strcmp(dnn, "fast") == 0 ? 2 : 0;
    if (dnn && *dnn && !k->dnn_on && strcmp(dnn, "0") != 0)
        JDT_WARN("JDT_CUDNN_ATTENTION=%s: expected auto, 0, 1 or fast; cuDNN's attention stays off",
                 dnn);
    if ((s = pick_target(k->arch, k->target, sizeof k->target, &k->cubin, e)) != JDT_OK) goto fail;
    k->pick_base = pick_base(k);
    snprintf(k->cache_dir, sizeof k->cache_dir, "%s", cache_dir ? cache_dir : "");
    /* the other sources load at their first launch (jdt_cuk_load): a run never compiles the
     * attention it does not use (the FMA one is NVRTC's longest, about a minute on 2 cores);
     * this small one now, so a broken NVRTC or driver is reported when the device opens */
    if ((s = jdt_cuk_load(k, JDT_CUK_K_FILL_ROWS, e)) != JDT_OK) goto fail;
    if ((rc = cudaStreamCreateWithFlags(&k->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        s = jdt_cuk_cuda_err(e, rc, "cudaStreamCreate");
        goto fail;
    }
    if ((rc = cudaMalloc(&k->workspace, JDT_CUK_WORKSPACE)) != cudaSuccess) {
        s = jdt_cuk_cuda_err(e, rc, "cudaMalloc of the cuBLASLt workspace");
        goto fail;
    }
    cublasStatus_t bs = cublasLtCreate(&k->lt);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        k->lt = NULL;
        s = jdt_err_set(e, JDT_ERR_INTERNAL, "cublasLtCreate: %s", cublasLtGetStatusString(bs));
        goto fail;
    }
    *out = k;
    return JDT_OK;
fail:
    jdt_cuk_free(k);
    return s;
}

void jdt_cuk_free(jdt_cuk *k)
{
    if (!k) return;
    if (k->stream) cudaStreamSynchronize(k->stream);
    jdt_cuk_dnn_free(k);
    jdt_cuk_gemm_free_plans(k);
    if (k->lt) cublasLtDestroy(k->lt);
    if (k->workspace) cudaFree(k->workspace);
    if (k->stream) cudaStreamDestroy(k->stream);
    if (k->comm_stream) cudaStreamDestroy(k->comm_stream);
    for (int i = 0; i < k->n_libs; i++)
        cudaLibraryUnload(k->libs[i]);
    jdt_free(k);
}

void *jdt_cuk_stream(jdt_cuk *k)
{
    return k->stream;
}

int jdt_cuk_arch(const jdt_cuk *k)
{
    return k->arch;
}

jdt_status jdt_cuk_check(jdt_cuk *k, const char *what, bool sync, jdt_err *e)
{
    if (k->pending.code != JDT_OK) {
        jdt_status s = jdt_err_set(e, k->pending.code, "%s: %s", what, k->pending.msg);
        jdt_err_clear(&k->pending);
        return s;
    }
    cudaError_t rc = sync ? cudaStreamSynchronize(k->stream) : cudaSuccess;
    if (rc == cudaSuccess) rc = cudaGetLastError();
    if (rc != cudaSuccess) return jdt_cuk_cuda_err(e, rc, what);
    return JDT_OK;
}

/* ---- launchers ---------------------------------------------------------------------------- */

static void launch(jdt_cuk *k, jdt_cuk_kernel ki, int64_t grid, unsigned block, size_t smem,
                   void **args)
{
    if (grid <= 0) return;
    if (!k->fn[ki]) { /* its source's first launch */
        jdt_err le;
        jdt_err_clear(&le);
        if (jdt_cuk_load(k, ki, &le) != JDT_OK) {
            jdt_cuk_defer(k, le.code, "%s", le.msg);
            return;
        }
    }
    dim3 g = {(unsigned)(grid > GRID_MAX ? GRID_MAX : grid), 1, 1}, b = {block, 1, 1};
    cudaError_t rc = cudaLaunchKernel((const void *)k->fn[ki], g, b, args, smem, k->stream);
    if (rc != cudaSuccess)
        jdt_cuk_defer(k, JDT_ERR_INTERNAL, "launching %s: %s", KERNELS[ki].name,
                      cudaGetErrorString(rc));
}

static bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

/* float4 row access: the row length a multiple of 4 and every row pointer 16-byte aligned. */
static int vec_ok(int64_t C, const void *a, const void *b, const void *c)
{
    return C % 4 == 0 && aligned16(a) && aligned16(b) && (!c || aligned16(c));
}

/* Threads per row block: about 4 (or 16 with float4) elements per thread, 128..1024. */
static unsigned row_threads(int64_t C)
{
    unsigned t = 128;
    while (t < ROW_THREADS_MAX && (int64_t)t * 8 < C)
        t *= 2;
    return t;
}

static void row_launch2(jdt_cuk *k, jdt_cuk_kernel ki, const float *x, float *y, int64_t N,
                        int64_t C)
{
    if (N <= 0 || C <= 0) return;
    int vec = vec_ok(C, x, y, NULL);
    void *args[] = {&x, &y, &N, &C, &vec};
    launch(k, ki, N, row_threads(C), 0, args);
}

static void row_launch3(jdt_cuk *k, jdt_cuk_kernel ki, const float *x, const float *g, float *y,
                        int64_t N, int64_t C)
{
    if (N <= 0 || C <= 0) return;
    int vec = vec_ok(C, x, g, y);
    void *args[] = {&x, &g, &y, &N, &C, &vec};
    launch(k, ki, N, row_threads(C), 0, args);
}

void jdt_cuk_softmax(jdt_cuk *k, const float *x, float *y, int64_t N, int64_t C)
{
    row_launch2(k, JDT_CUK_K_SOFTMAX, x, y, N, C);
}

void jdt_cuk_softmax_bwd(jdt_cuk *k, const float *y, const float *dy, float *dx, int64_t N,
                         int64_t C)
{
    row_launch3(k, JDT_CUK_K_SOFTMAX_BWD, y, dy, dx, N, C);
}

void jdt_cuk_log_softmax(jdt_cuk *k, const float *x, float *y, int64_t N, int64_t C)
{
    row_launch2(k, JDT_CUK_K_LOG_SOFTMAX, x, y, N, C);
}

void jdt_cuk_log_softmax_bwd(jdt_cuk *k, const float *y, const float *dy, float *dx, int64_t N,
                             int64_t C)
{
    row_launch3(k, JDT_CUK_K_LOG_SOFTMAX_BWD, y, dy, dx, N, C);
}

/* float4 (f32) or 8-byte (bf16) row loads: the row strides multiples of 4 and the logits
 * aligned to them (padded rows qualify whatever V; the kernels take a row's last V % 4 values
 * one by one) */
static int xent_vec(int64_t ldx, int64_t ldd, const void *logits, bool logits_bf16)
{
    return ldx % 4 == 0 && ldd % 4 == 0 && ((uintptr_t)logits & (logits_bf16 ? 7u : 15u)) == 0;
}

/* The row strides: 0 means V. False (and the failure recorded) when one is less than V. */
static bool xent_ld(jdt_cuk *k, int64_t V, int64_t *ldx, int64_t *ldd)
{
    if (*ldx == 0) *ldx = V;
    if (*ldd == 0) *ldd = V;
    if (*ldx >= V && *ldd >= V) return true;
    jdt_cuk_defer(k, JDT_ERR_INVALID, "softmax_xent: row stride %lld or %lld below %lld values",
                  (long long)*ldx, (long long)*ldd, (long long)V);
    return false;
}

void jdt_cuk_softmax_xent(jdt_cuk *k, const void *logits, bool logits_bf16, const int32_t *tgt,
                          float *loss, int64_t N, int64_t V, int64_t ldx)
{
    if (N <= 0) return;
    if (V <= 0) { /* every target is out of range: loss NaN, or 0 for negative targets */
        jdt_cuk_defer(k, JDT_ERR_INVALID, "softmax_xent: empty vocabulary");
        return;
    }
    int64_t ldd = 0;
    if (!xent_ld(k, V, &ldx, &ldd)) return;
    int vec = xent_vec(ldx, ldx, logits, logits_bf16); /* no dlogits here */
    void *args[] = {&logits, &tgt, &loss, &N, &V, &ldx, &ldd, &vec};
    launch(k, logits_bf16 ? JDT_CUK_K_SOFTMAX_XENT_B : JDT_CUK_K_SOFTMAX_XENT, N, row_threads(V), 0,
           args);
}

void jdt_cuk_softmax_xent_bwd(jdt_cuk *k, const void *logits, bool logits_bf16, const int32_t *tgt,
                              const float *dloss, const float *loss, float *dlogits, int64_t N,
                              int64_t V, int64_t ldx, int64_t ldd)
{
    if (N <= 0 || V <= 0 || !xent_ld(k, V, &ldx, &ldd)) return;
    int vec = xent_vec(ldx, ldd, logits, logits_bf16) && aligned16(dlogits);
    void *args[] = {&logits, &tgt, &dloss, &loss, &dlogits, &N, &V, &ldx, &ldd, &vec};
    launch(k, logits_bf16 ? JDT_CUK_K_SOFTMAX_XENT_BWD_B : JDT_CUK_K_SOFTMAX_XENT_BWD, N,
           row_threads(V), 0, args);
}

void jdt_cuk_softmax_xent_bwd_bf16(jdt_cuk *k, const void *logits, bool logits_bf16,
                                   const int32_t *tgt, const float *dloss, const float *loss,
                                   uint16_t *dlogits, int64_t N, int64_t V, int64_t ldx,
                                   int64_t ldd)
{
    if (N <= 0 || V <= 0 || !xent_ld(k, V, &ldx, &ldd)) return;
    /* 4-value reads, 8-byte bf16 writes */
    int vec = xent_vec(ldx, ldd, logits, logits_bf16) && ((uintptr_t)dlogits & 7u) == 0;
    void *args[] = {&logits, &tgt, &dloss, &loss, &dlogits, &N, &V, &ldx, &ldd, &vec};
    launch(k, logits_bf16 ? JDT_CUK_K_SOFTMAX_XENT_BWD_BF16_B : JDT_CUK_K_SOFTMAX_XENT_BWD_BF16, N,
           row_threads(V), 0, args);
}

/* The staged fused classifier (cuk_softmax_xent_fused_bf16_bs): 512 threads, and a row of at
 * most 112 KiB of bf16 (57344 values), so that two blocks fit an SM's shared memory. */
#define XENT_SMEM_THREADS 512
#define XENT_SMEM_MAX (112 * 1024)

/* The staged classifier's kernel loaded and allowed smem bytes of dynamic shared memory (once
 * per size); false, with the failure deferred, when not. */
static bool xent_smem_ready(jdt_cuk *k, int smem)
{
    const jdt_cuk_kernel ki = JDT_CUK_K_SOFTMAX_XENT_FUSED_BF16_BS;
    if (k->xent_smem_set >= smem) return true;
    jdt_err le;
    jdt_err_clear(&le);
    if (!k->fn[ki] && jdt_cuk_load(k, ki, &le) != JDT_OK) {
        jdt_cuk_defer(k, le.code, "%s", le.msg);
        return false;
    }
    cudaError_t rc = cudaFuncSetAttribute((const void *)k->fn[ki],
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (rc != cudaSuccess) { /* the two-pass kernel then */
        cudaGetLastError();
        k->xent_smem = false;
        JDT_INFO("cuda: the staged classifier cannot have %d bytes of shared memory (%s); "
                 "reading each row twice",
                 smem, cudaGetErrorString(rc));
        return false;
    }
    k->xent_smem_set = smem;
    return true;
}

void jdt_cuk_softmax_xent_fused(jdt_cuk *k, const void *logits, bool logits_bf16,
                                const int32_t *tgt, float g, float *loss, void *dlogits,
                                bool dlogits_bf16, int64_t N, int64_t V, int64_t ldx, int64_t ldd)
{
    if (N <= 0) return;
    if (V <= 0) {
        jdt_cuk_defer(k, JDT_ERR_INVALID, "softmax_xent: empty vocabulary");
        return;
    }
    if (!xent_ld(k, V, &ldx, &ldd)) return;
    /* bf16 in and out, the row fitting shared memory twice an SM, 16-byte rows: staged */
    const int64_t smem = (V + 7) / 8 * 16;
    if (k->xent_smem && logits_bf16 && dlogits_bf16 && smem <= XENT_SMEM_MAX && ldx % 8 == 0 &&
        ldd % 8 == 0 && aligned16(logits) && aligned16(dlogits) && xent_smem_ready(k, (int)smem)) {
        void *args[] = {&logits, &tgt, &g, &loss, &dlogits, &N, &V, &ldx, &ldd};
        launch(k, JDT_CUK_K_SOFTMAX_XENT_FUSED_BF16_BS, N, XENT_SMEM_THREADS, (size_t)smem, args);
        return;
    }
    int vec = xent_vec(ldx, ldd, logits, logits_bf16) &&
              ((uintptr_t)dlogits & (dlogits_bf16 ? 7u : 15u)) == 0;
    void *args[] = {&logits, &tgt, &g, &loss, &dlogits, &N, &V, &ldx, &ldd, &vec};
    jdt_cuk_kernel ki = dlogits_bf16 ? (logits_bf16 ? JDT_CUK_K_SOFTMAX_XENT_FUSED_BF16_B
                                                    : JDT_CUK_K_SOFTMAX_XENT_FUSED_BF16)
                                     : (logits_bf16 ? JDT_CUK_K_SOFTMAX_XENT_FUSED_B
                                                    : JDT_CUK_K_SOFTMAX_XENT_FUSED);
    launch(k, ki, N, row_threads(V), 0, args);
}

static void norm_launch2(jdt_cuk *k, jdt_cuk_kernel ki, const float *x, float *y, int64_t N,
                         int64_t C, float eps)
{
    if (N <= 0 || C <= 0) return;
    int vec = vec_ok(C, x, y, NULL);
    void *args[] = {&x, &y, &N, &C, &eps, &vec};
    launch(k, ki, N, row_threads(C), 0, args);
}

static void norm_launch3(jdt_cuk *k, jdt_cuk_kernel ki, const float *x, const float *g,
                         const float *w, float *y, int64_t N, int64_t C, float eps)
{
    if (N <= 0 || C <= 0) return;
    int vec = vec_ok(C, x, g, y);
    void *args[] = {&x, &g, &w, &y, &N, &C, &eps, &vec};
    launch(k, ki, N, row_threads(C), 0, args);
}

void jdt_cuk_normalize(jdt_cuk *k, const float *x, float *y, int64_t N, int64_t C, float eps)
{
    norm_launch2(k, JDT_CUK_K_NORMALIZE, x, y, N, C, eps);
}

void jdt_cuk_normalize_bwd(jdt_cuk *k, const float *x, const float *dy, const float *w, float *dx,
                           int64_t N, int64_t C, float eps)
{
    norm_launch3(k, JDT_CUK_K_NORMALIZE_BWD, x, dy, w, dx, N, C, eps);
}

void jdt_cuk_rms_normalize(jdt_cuk *k, const float *x, float *y, int64_t N, int64_t C, float eps)
{
    norm_launch2(k, JDT_CUK_K_RMS_NORMALIZE, x, y, N, C, eps);
}

void jdt_cuk_rms_normalize_bwd(jdt_cuk *k, const float *x, const float *dy, const float *w,
                               float *dx, int64_t N, int64_t C, float eps)
{
    norm_launch3(k, JDT_CUK_K_RMS_NORMALIZE_BWD, x, dy, w, dx, N, C, eps);
}

/* Rows of C values a warp each (cuk_rows.cu norm_affine_w, norm_bwd_part_w): C a multiple of 128
 * up to CUK_PARTW_K (8) groups of 128, unless JDT_NORM_WARPS=0; the callers add their pointers'
 * alignments. */
#define NORM_WARP_MAX_C 1024
static bool norm_warp_rows(const jdt_cuk *k, int64_t C)
{
    return k->norm_warps && C % 128 == 0 && C <= NORM_WARP_MAX_C;
}

void jdt_cuk_normalize_affine(jdt_cuk *k, bool rms, const float *x, const float *w, const float *b,
                              void *y, bool y_bf16, int64_t N, int64_t C, float eps)
{
    if (N <= 0 || C <= 0) return;
    /* a warp per row (cuk_rows.cu norm_affine_w) where its layout applies: C a multiple of 128
     * up to 1024, 16-byte rows of x, w, b and an f32 y, 8-byte rows of a bf16 y */
    if (norm_warp_rows(k, C) && aligned16(x) && aligned16(w) && (!b || aligned16(b)) &&
        (uintptr_t)y % (y_bf16 ? 8 : 16) == 0) {
        void *args[] = {&x, &w, &b, &y, &N, &C, &eps};
        jdt_cuk_kernel kw =
            rms ? (y_bf16 ? JDT_CUK_K_RMS_NORMALIZE_AFFINE_BF16_W
                          : JDT_CUK_K_RMS_NORMALIZE_AFFINE_W)
                : (y_bf16 ? JDT_CUK_K_NORMALIZE_AFFINE_BF16_W : JDT_CUK_K_NORMALIZE_AFFINE_W);
        launch(k, kw, (N + 3) / 4, 128, 0, args);
        return;
    }
    int vec = C % 4 == 0 && aligned16(x); /* the moments' reads; y is written per element */
    void *args[] = {&x, &w, &b, &y, &N, &C, &eps, &vec};
    jdt_cuk_kernel ki =
        rms ? (y_bf16 ? JDT_CUK_K_RMS_NORMALIZE_AFFINE_BF16 : JDT_CUK_K_RMS_NORMALIZE_AFFINE)
            : (y_bf16 ? JDT_CUK_K_NORMALIZE_AFFINE_BF16 : JDT_CUK_K_NORMALIZE_AFFINE);
    launch(k, ki, N, row_threads(C), 0, args);
}

#define NORM_PART_MAX 8 /* CUK_PART_MAX of cuk_rows.cu: columns per thread */
_Static_assert(NORM_PART_MAX *ROW_THREADS_MAX == JDT_CUK_NORM_PART_MAX_C, "cuk.h's limit");

static void norm_part_launch(jdt_cuk *k, jdt_cuk_kernel ki, const float *x, const void *dy,
                             const void *dy2, const void *dy3, const float *w, const float *acc,
                             float *dx, float *pw, float *pb, float *pg, uint16_t *dx16, int64_t N,
                             int64_t C, int64_t P, float eps)
{
    if (N <= 0 || C <= 0 || P <= 0) return;
    unsigned bd = row_threads(C);
    if (C > (int64_t)NORM_PART_MAX * bd) {
        jdt_cuk_defer(k, JDT_ERR_INTERNAL, "%s: rows of %lld values (at most %lld)",
                      KERNELS[ki].name, (long long)C, (long long)NORM_PART_MAX * bd);
        return;
    }
    void *args[] = {&x, &dy, &dy2, &dy3, &w, &acc, &dx, &pw, &pb, &pg, &dx16, &N, &C, &eps, &P};
    /* a warp per row (cuk_rows.cu norm_bwd_part_w) where its layout applies: C a multiple of
     * 128 up to 1024, 16-byte rows of x, acc, dx and the partial sums, 8-byte rows of dx16 and
     * of a bf16 dy */
    const bool dy16 =
        ki == JDT_CUK_K_NORMALIZE_BWD_PART_BG || ki == JDT_CUK_K_RMS_NORMALIZE_BWD_PART_BG;
    const uintptr_t dys = (uintptr_t)dy | (uintptr_t)dy2 | (uintptr_t)dy3; /* NULL: aligned */
    if (norm_warp_rows(k, C) && aligned16(x) && aligned16(dx) && (!acc || aligned16(acc)) &&
        aligned16(pw) && aligned16(pb) && (!pg || aligned16(pg)) && dys % (dy16 ? 8 : 16) == 0 &&
        (!dx16 || (uintptr_t)dx16 % 8 == 0)) {
        const jdt_cuk_kernel kw =
            ki == JDT_CUK_K_NORMALIZE_BWD_PART       ? JDT_CUK_K_NORMALIZE_BWD_PART_W
            : ki == JDT_CUK_K_RMS_NORMALIZE_BWD_PART ? JDT_CUK_K_RMS_NORMALIZE_BWD_PART_W
            : ki == JDT_CUK_K_NORMALIZE_BWD_PART_BG  ? JDT_CUK_K_NORMALIZE_BWD_PART_BG_W
                                                     : JDT_CUK_K_RMS_NORMALIZE_BWD_PART_BG_W;
        launch(k, kw, P, 128, 0, args);
        return;
    }
    /* past 512 threads (C > 4096) the copy held to 64 registers (cuk_rows.cu NORM_BWD_PART) */
    if (bd > 512)
        ki = ki == JDT_CUK_K_NORMALIZE_BWD_PART       ? JDT_CUK_K_NORMALIZE_BWD_PART_K
             : ki == JDT_CUK_K_RMS_NORMALIZE_BWD_PART ? JDT_CUK_K_RMS_NORMALIZE_BWD_PART_K
             : ki == JDT_CUK_K_NORMALIZE_BWD_PART_BG  ? JDT_CUK_K_NORMALIZE_BWD_PART_BG_K
                                                      : JDT_CUK_K_RMS_NORMALIZE_BWD_PART_BG_K;
    launch(k, ki, P, bd, 0, args);
}

void jdt_cuk_normalize_bwd_part(jdt_cuk *k, const float *x, const void *dy, bool dy_bf16,
                                const void *dy2, const void *dy3, const float *w, const float *acc,
                                float *dx, float *pw, float *pb, float *pg, uint16_t *dx16,
                                int64_t N, int64_t C, int64_t P, float eps)
{
    norm_part_launch(k, dy_bf16 ? JDT_CUK_K_NORMALIZE_BWD_PART_BG : JDT_CUK_K_NORMALIZE_BWD_PART, x,
                     dy, dy2, dy3, w, acc, dx, pw, pb, pg, dx16, N, C, P, eps);
}

void jdt_cuk_rms_normalize_bwd_part(jdt_cuk *k, const float *x, const void *dy, bool dy_bf16,
                                    const void *dy2, const void *dy3, const float *w,
                                    const float *acc, float *dx, float *pw, float *pb, float *pg,
                                    uint16_t *dx16, int64_t N, int64_t C, int64_t P, float eps)
{
    norm_part_launch(
        k, dy_bf16 ? JDT_CUK_K_RMS_NORMALIZE_BWD_PART_BG : JDT_CUK_K_RMS_NORMALIZE_BWD_PART, x, dy,
        dy2, dy3, w, acc, dx, pw, pb, pg, dx16, N, C, P, eps);
}

void jdt_cuk_gather(jdt_cuk *k, const float *table, const int32_t *idx, float *out, int64_t n,
                    int64_t V, int64_t C)
{
    if (n <= 0 || C <= 0) return;
    /* every row start must be aligned for float4: the table base and C % 4 (checked by vec_ok) */
    int vec = vec_ok(C, table, out, NULL);
    void *args[] = {&table, &idx, &out, &n, &V, &C, &vec};
    launch(k, JDT_CUK_K_GATHER, n, row_threads(C), 0, args);
}

void jdt_cuk_scatter_add(jdt_cuk *k, const float *src, const int32_t *idx, float *out, int64_t n,
                         int64_t V, int64_t C)
{
    if (V <= 0 || C <= 0) return;
    cudaError_t rc = cudaMemsetAsync(out, 0, (size_t)(V * C) * sizeof(float), k->stream);
    if (rc != cudaSuccess) {
        jdt_cuk_defer(k, JDT_ERR_INTERNAL, "scatter_add: cudaMemsetAsync: %s",
                      cudaGetErrorString(rc));
        return;
    }
    if (n <= 0) return;
    void *args[] = {&src, &idx, &out, &n, &V, &C};
    launch(k, JDT_CUK_K_SCATTER_ADD, n, C >= 256 ? 256 : 128, 0, args);
}

void jdt_cuk_rope(jdt_cuk *k, const void *x, void *y, bool x16, bool y16, bool x_bhtd, int64_t B,
                  int64_t T, int64_t H, int64_t D, double theta, const double *sc, bool inverse)
{
    if (D % 2 != 0) {
        jdt_cuk_defer(k, JDT_ERR_INVALID, "rope: head size %lld is odd", (long long)D);
        return;
    }
    int64_t n_pairs = B * T * H * (D / 2);
    if (n_pairs <= 0) return;
    int inv = inverse, in16 = x16, out16 = y16, bhtd = x_bhtd;
    double factor = sc ? sc[0] : 0.0, lo = sc ? sc[1] : 0.0, hi = sc ? sc[2] : 0.0,
           orig = sc ? sc[3] : 0.0;
    void *args[] = {&x,    &y,     &B,    &T,      &H,  &D,  &theta, &inv,
                    &in16, &out16, &bhtd, &factor, &lo, &hi, &orig};
    launch(k, JDT_CUK_K_ROPE, (n_pairs + 255) / 256, 256, 0, args);
}

void jdt_cuk_concat(jdt_cuk *k, const float *const *in, const int64_t *len, int n_in, float *out,
                    int64_t outer, int64_t inner, size_t elem_bytes)
{
    size_t row = 0; /* bytes of one output row */
    for (int i = 0; i < n_in; i++)
        row += (size_t)(len[i] * inner) * elem_bytes;
    size_t off = 0;
    for (int i = 0; i < n_in && outer > 0; i++) {
        size_t nb = (size_t)(len[i] * inner) * elem_bytes;
        if (nb == 0) continue;
        /* one row (a concatenation along the first axis): a plain copy, since a 2D copy's
         * pitch, the whole row, may pass the GPU's limit (cudaDevAttrMaxPitch, 2^31 - 1) */
        cudaError_t rc =
            outer == 1
                ? cudaMemcpyAsync((char *)out + off, in[i], nb, cudaMemcpyDeviceToDevice, k->stream)
                : cudaMemcpy2DAsync((char *)out + off, row, in[i], nb, nb, (size_t)outer,
                                    cudaMemcpyDeviceToDevice, k->stream);
        if (rc != cudaSuccess) {
            jdt_cuk_defer(k, JDT_ERR_INTERNAL, "concat: %s: %s",
                          outer == 1 ? "cudaMemcpyAsync" : "cudaMemcpy2DAsync",
                          cudaGetErrorString(rc));
            return;
        }
        off += nb;
    }
}

/* An elementwise kernel over n elements: 256 threads a block, at most 65536 blocks (the
 * kernels grid-stride past them); nothing for n <= 0. */
static void launch_elems(jdt_cuk *k, jdt_cuk_kernel ki, int64_t n, void **args)
{
    if (n <= 0) return;
    int64_t grid = (n + 255) / 256;
    launch(k, ki, grid > 65536 ? 65536 : grid, 256, 0, args);
}

void jdt_cuk_fill_rows(jdt_cuk *k, float *c, const float *bias, int64_t rows, int64_t N)
{
    void *args[] = {&c, &bias, &rows, &N};
    launch_elems(k, JDT_CUK_K_FILL_ROWS, rows * N, args);
}

void jdt_cuk_to_bf16(jdt_cuk *k, const float *x, uint16_t *y, int64_t n)
{
    if (n <= 0) return;
    int vec = n % 4 == 0 && aligned16(x) && ((uintptr_t)y & 7u) == 0;
    int64_t grid = ((vec ? n / 4 : n) + 255) / 256;
    if (grid > 65536) grid = 65536;
    void *args[] = {&x, &y, &n, &vec};
    launch(k, JDT_CUK_K_TO_BF16, grid, 256, 0, args);
}

void jdt_cuk_permute_blocks(jdt_cuk *k, const float *src, float *dst, int64_t n_blocks,
                            int64_t outer, int64_t blk, bool to_outer)
{
    jdt_cuk_permute_blocks_bytes(k, src, dst, n_blocks, outer, blk * (int64_t)sizeof(float),
                                 to_outer);
}

void jdt_cuk_permute_blocks_bytes(jdt_cuk *k, const void *src, void *dst, int64_t n_blocks,
                                  int64_t outer, int64_t blk_bytes, bool to_outer)
{
    /* the wire of one tensor: segment r is part r alone */
    jdt_cuk_wire_bytes(k, to_outer ? dst : (void *)src, to_outer ? (void *)src : dst, n_blocks,
                       outer, blk_bytes, outer * blk_bytes, 0, to_outer);
}

void jdt_cuk_wire_bytes(jdt_cuk *k, void *x, void *wire, int64_t n_parts, int64_t outer,
                        int64_t blk_bytes, int64_t seg_bytes, int64_t off_bytes, bool get)
{
    if (n_parts <= 0 || outer <= 0 || blk_bytes <= 0) return;
    const size_t row = (size_t)blk_bytes, wide = (size_t)n_parts * row;
    char *xb = x, *wb = (char *)wire + off_bytes;
    /* outer = 1: part r is one row of x, segment r one row of the wire: one copy of k rows;
     * else part r's rows (o, r, :) are a stride of k blocks apart in x and contiguous in
     * segment r: one copy of outer rows per part */
    const int64_t copies = outer == 1 ? 1 : n_parts;
    const size_t height = outer == 1 ? (size_t)n_parts : (size_t)outer;
    const size_t xpitch = outer == 1 ? row : wide, wpitch = outer == 1 ? (size_t)seg_bytes : row;
    /* rows back to back on both sides (one tensor's wire, one part): one plain copy, which
     * also keeps a pitch past the driver's limit (2^31 bytes: a large lone part) out */
    const bool flat = height == 1 || (xpitch == row && wpitch == row);
    for (int64_t r = 0; r < copies; r++) {
        char *xr = xb + r * blk_bytes, *wr = wb + r * seg_bytes;
        char *dst = get ? xr : wr, *src = get ? wr : xr;
        cudaError_t rc =
            flat ? cudaMemcpyAsync(dst, src, row * height, cudaMemcpyDeviceToDevice, k->stream)
                 : cudaMemcpy2DAsync(dst, get ? xpitch : wpitch, src, get ? wpitch : xpitch, row,
                                     height, cudaMemcpyDeviceToDevice, k->stream);
        if (rc != cudaSuccess) {
            jdt_cuk_defer(k, JDT_ERR_INTERNAL, "collective wire copy: %s", cudaGetErrorString(rc));
            return;
        }
    }
}

void jdt_cuk_bf16_round(jdt_cuk *k, const float *x, float *y, int64_t n)
{
    void *args[] = {&x, &y, &n};
    launch_elems(k, JDT_CUK_K_BF16_ROUND, n, args);
}

void jdt_cuk_bf16_widen(jdt_cuk *k, const uint16_t *x, float *y, int64_t n)
{
    void *args[] = {&x, &y, &n};
    launch_elems(k, JDT_CUK_K_BF16_WIDEN, n, args);
}

void jdt_cuk_gelu_bf16(jdt_cuk *k, const uint16_t *x, uint16_t *y, int64_t n)
{
    void *args[] = {&x, &y, &n};
    launch_elems(k, JDT_CUK_K_GELU_BF16, n, args);
}

void jdt_cuk_dgelu_bf16(jdt_cuk *k, const uint16_t *u, uint16_t *g, int64_t n)
{
    void *args[] = {&u, &g, &n};
    launch_elems(k, JDT_CUK_K_DGELU_BF16, n, args);
}

void jdt_cuk_colsum_part_bf16(jdt_cuk *k, const uint16_t *x, float *part, int64_t rows, int64_t N,
                              int64_t chunk)
{
    if (N <= 0) return;
    /* no rows: one chunk of zeros */
    const int64_t chunks = rows > 0 ? (rows + chunk - 1) / chunk : 1;
    void *args[] = {&x, &part, &rows, &N, &chunk};
    launch(k, JDT_CUK_K_COLSUM_BF16, (N + 63) / 64 * chunks, 256, 0, args);
}

void jdt_cuk_colsum_bf16(jdt_cuk *k, const uint16_t *x, float *y, int64_t rows, int64_t N)
{
    if (N <= 0) return;
    /* chunks of 512 rows (more where the partials would not fit the cuBLASLt workspace, which
     * they borrow: the stream runs this between GEMMs), at least one */
    int64_t chunk = JDT_CUK_COLSUM_CHUNK;
    const int64_t fit = (int64_t)JDT_CUK_WORKSPACE / (4 * N);
    if (fit < 1) {
        jdt_cuk_defer(k, JDT_ERR_UNSUPPORTED,
                      "column sums of %lld columns: the partial sums "
                      "do not fit the GEMM workspace",
                      (long long)N);
        return;
    }
    if ((rows + chunk - 1) / chunk > fit) chunk = (rows + fit - 1) / fit;
    int64_t chunks = rows > 0 ? (rows + chunk - 1) / chunk : 1;
    float *part = k->workspace;
    jdt_cuk_colsum_part_bf16(k, x, part, rows, N, chunk);
    void *args[] = {&part, &y, &chunks, &N};
    launch(k, JDT_CUK_K_COLSUM_F32, (N + 255) / 256, 256, 0, args);
}

/* ---- attention ---------------------------------------------------------------------------- */

#define ATT_R 32        /* rows per block (kernels/cuk_attention.cu) */
#define ATT_THREADS 128 /* 4 threads per row */

#define ATT_TC_BR 64 /* rows per block (kernels/cuk_attention_tc.cu) */
#define ATT_TC_THREADS 128
/* The dK/dV kernel's split (cuk_attention_tc.cu tc_dkv): at most this many blocks per key
 * tile, and the multiprocessors the scratch is planned for (the plan is made without a GPU,
 * for ahead-of-time compiles too; a larger GPU splits as if it had this many). */
#define ATT_DKV_SPLIT_MAX 16
#define ATT_DKV_PLAN_SMS 192

/* The dK/dV kernel's key tiles (a block each unless split): B Hk ceil(T / 64). */
static int64_t att_key_tiles(int64_t B, int64_t Hk, int64_t T)
{
    return B * Hk * ((T + ATT_TC_BR - 1) / ATT_TC_BR);
}

/* The tensor-core kernels' head-size class width DM for D <= 128: 64 or 128. */
static int64_t att_tc_dm(int64_t D)
{
    return D <= 64 ? 64 : 128;
}

/* The dK/dV kernel's blocks per key tile on a GPU of sms multiprocessors: 1 when the key tiles
 * (B Hk ceil(T / 64)) give every multiprocessor two blocks; else enough that they do (grouped
 * queries at a small B T: Llama-3-70B at tensor: 8, one key/value head of 8 query heads per
 * rank, B 1, T 8192 has 128 key tiles), at most ATT_DKV_SPLIT_MAX and the first key tile's
 * query tiles (G ceil(T / BQ)). JDT_CUK_DKV_SPLIT=S forces S (within those bounds; tests). */
static int64_t att_dkv_split(int64_t B, int64_t H, int64_t T, int64_t D, int64_t G, int64_t sms)
{
    const int64_t tiles = att_key_tiles(B, H / G, T), bq = D <= 64 ? 64 : 16;
    if (tiles <= 0) return 1;
    const char *f = getenv("JDT_CUK_DKV_SPLIT");
    int64_t s = f && *f ? strtoll(f, NULL, 10) : (2 * sms + tiles - 1) / tiles;
    const int64_t most = G * ((T + bq - 1) / bq);
    if (s > most) s = most;
    if (s > ATT_DKV_SPLIT_MAX) s = ATT_DKV_SPLIT_MAX;
    return s < 1 ? 1 : s;
}

/* The backward's scratch: L and dO.O per row (f32), then, 16-byte aligned, where the
 * tensor-core kernels may serve (D <= 128), dO as bf16 with rows of the class's width (64 or
 * 128), which the dQ kernel writes and the dK/dV kernel's tiles copy (cuk_attention_tc.cu), and,
 * when the dK/dV kernel splits its key tiles (att_dkv_split), a count per key tile and each
 * block's f32 sums (S slots of 2 x 128 threads x DM / 2 per key tile). */
static int64_t att_g16_offset(int64_t B, int64_t H, int64_t T)
{
    return (2 * B * H * T * (int64_t)sizeof(float) + 15) / 16 * 16;
}

static int64_t att_cnt_offset(int64_t B, int64_t H, int64_t T, int64_t D)
{
    return att_g16_offset(B, H, T) + B * H * T * att_tc_dm(D) * 2;
}

static int64_t att_frag_offset(int64_t B, int64_t H, int64_t T, int64_t D, int64_t G)
{
    return att_cnt_offset(B, H, T, D) + (att_key_tiles(B, H / G, T) * 4 + 15) / 16 * 16;
}

int64_t jdt_cuk_attention_scratch_bytes(int64_t B, int64_t H, int64_t T, int64_t D, int64_t G)
{
    int64_t stats = 2 * B * H * T * (int64_t)sizeof(float);
    if (D > 128) return stats;
    if (G < 1 || H % G) G = 1;
    const int64_t S = att_dkv_split(B, H, T, D, G, ATT_DKV_PLAN_SMS);
    if (S == 1) return att_cnt_offset(B, H, T, D);
    return att_frag_offset(B, H, T, D, G) +
           att_key_tiles(B, H / G, T) * S * ATT_TC_THREADS * att_tc_dm(D) * 4;
}

/* The head-size class of D: kernel offset 0/1/2 and the tile rows CT; -1 when D > 256. */
static int att_class(int64_t D, int64_t *ct)
{
    if (D <= 64) return *ct = 64, 0;
    if (D <= 128) return *ct = 32, 1;
    if (D <= 256) return *ct = 16, 2;
    return -1;
}

/* The tensor-core class of D for bf16 compute on arch: 0 (D <= 64), 1 (D <= 128), -1 when the
 * FMA kernels serve (no bf16, D > 128, a GPU before sm_80, which has no bf16 mma, or
 * JDT_CUK_ATTENTION=fma). The caller also sends a scale that is not > 0 to the FMA kernels:
 * the tensor-core forward takes a row's max of the unscaled scores. */
static int att_tc_class_for(int arch, bool fma, bool bf16, int64_t D)
{
    if (!bf16 || arch < 80 || D > JDT_CUK_ATT_TC_MAX_D || fma) return -1;
    return D <= 64 ? 0 : 1;
}

static int att_tc_class(const jdt_cuk *k, bool bf16, int64_t D, float scale)
{
    return scale > 0.0f ? att_tc_class_for(k->arch, k->att_fma, bf16, D) : -1;
}

unsigned jdt_cuk_attention_sources(int arch, bool bf16, int64_t D)
{
    return att_tc_class_for(arch, att_fma_forced(), bf16, D) >= 0 ? JDT_CUK_SRC_ATT_TC
                                                                  : JDT_CUK_SRC_ATT_FMA;
}

/* The kernel of family `f32` (its D64 enumerator) for class cls, or of its bf16-q/k/v family
 * `b16` (qkv_bf16). */
static jdt_cuk_kernel att_kernel(jdt_cuk_kernel f32, jdt_cuk_kernel b16, bool qkv_bf16, int cls)
{
    return (jdt_cuk_kernel)((qkv_bf16 ? b16 : f32) + cls);
}

#define DNN_NOT_TC                                                                                 \
    "not the tensor-core kernels' case (bf16 compute, sm_80 or newer, a head of at most 128, a "   \
    "positive scale, JDT_CUK_ATTENTION not fma)"

/* With JDT_CUDNN_ATTENTION on, says once per direction (bwd) why a call does not go to cuDNN
 * (its first unmet condition; NULL: it does) and returns whether it may. Said only where cuDNN
 * was asked for (1 or fast): under auto, a call it cannot take is simply ours. */
static bool dnn_asks(jdt_cuk *k, bool bwd, const char *why)
{
    if (!why) return true;
    if (!k->dnn_auto && !(k->dnn_said & (1u << bwd))) {
        k->dnn_said |= 1u << bwd;
        JDT_INFO("cuDNN attention %s not asked, jdt-train's kernels run it: %s",
                 bwd ? "backward" : "forward", why);
    }
    return false;
}

void jdt_cuk_attention(jdt_cuk *k, const void *q, const void *kk, const void *v, bool qkv_bf16,
                       float *o, void *o2, bool o2_bf16, float *lse, int64_t B, int64_t H,
                       int64_t T, int64_t D, float scale, unsigned bthd, bool bf16, void *scratch)
{
    if (B * H * T * D <= 0) return;
    int tc = att_tc_class(k, bf16, D, scale);
    /* cuDNN's fused engines where they take it (cuk_cudnn.c): bf16 in and out, its tensors
     * 16-byte aligned */
    if (k->dnn_on &&
        dnn_asks(k, false,
                 tc < 0            ? DNN_NOT_TC
                 : !qkv_bf16       ? "q, k, v not bf16"
                 : o               ? "o stored in f32"
                 : !o2 || !o2_bf16 ? "o's copy not bf16 (precision.activations: bf16)"
                 : D % 8           ? "a head size not a multiple of 8"
                 : !aligned16(q) || !aligned16(kk) || !aligned16(v) || !aligned16(o2) ||
                         !aligned16(lse)
                     ? "a tensor not 16-byte aligned"
                     : NULL) &&
        (k->dnn_auto
             ? jdt_cuk_dnn_attention_auto(k, q, kk, v, o2, lse, B, H, T, D, scale, bthd, scratch)
             : jdt_cuk_dnn_attention(k, q, kk, v, o2, lse, B, H, T, D, scale, bthd)))
        return;
    jdt_cuk_att_fwd_ours(k, q, kk, v, qkv_bf16, o, o2, o2_bf16, lse, B, H, T, D, scale, bthd, bf16,
                         scratch);
}

void jdt_cuk_att_fwd_ours(jdt_cuk *k, const void *q, const void *kk, const void *v, bool qkv_bf16,
                          float *o, void *o2, bool o2_bf16, float *lse, int64_t B, int64_t H,
                          int64_t T, int64_t D, float scale, unsigned bthd, bool bf16,
                          void *scratch)
{
    (void)scratch;
    int tc = att_tc_class(k, bf16, D, scale), o2b = o2_bf16;
    static const char no_o[] = "attention: no o to store needs the tensor-core kernels and o's "
                               "copy (passes.c fold_attention_o16 and the device disagree)";
    if (tc >= 0) {
        if (!o && !o2) {
            jdt_cuk_defer(k, JDT_ERR_INTERNAL, "%s", no_o);
            return;
        }
        int64_t blocks = B * H * ((T + ATT_TC_BR - 1) / ATT_TC_BR);
        void *args[] = {&q, &kk, &v, &o, &o2, &o2b, &lse, &B, &H, &T, &D, &scale, &bthd};
        launch(k, att_kernel(JDT_CUK_K_ATT_TC_FWD_D64, JDT_CUK_K_ATT_TC_FWD_B_D64, qkv_bf16, tc),
               blocks, ATT_TC_THREADS, 0, args);
        return;
    }
    int64_t ct;
    int cls = att_class(D, &ct);
    if (cls < 0) {
        jdt_cuk_defer(k, JDT_ERR_UNSUPPORTED, "attention: head size %lld > 256", (long long)D);
        return;
    }
    if (!o) { /* the FMA kernels store o */
        jdt_cuk_defer(k, JDT_ERR_INTERNAL, "%s", no_o);
        return;
    }
    int64_t blocks = B * H * ((T + ATT_R - 1) / ATT_R);
    size_t smem = (size_t)(2 * ct * D + 2 * ct) * sizeof(float);
    void *args[] = {&q, &kk, &v, &o, &o2, &o2b, &lse, &B, &H, &T, &D, &scale, &bthd};
    launch(k, att_kernel(JDT_CUK_K_ATT_FWD_D64, JDT_CUK_K_ATT_FWD_B_D64, qkv_bf16, cls), blocks,
           ATT_THREADS, smem, args);
}

int64_t jdt_cuk_attention_dout16_d(int arch)
{
    return att_tc_class_for(arch, att_fma_forced(), true, JDT_CUK_ATT_TC_MAX_D) >= 0
               ? JDT_CUK_ATT_TC_MAX_D
               : 0;
}

void jdt_cuk_attention_bwd(jdt_cuk *k, const void *q, const void *kk, const void *v, bool qkv_bf16,
                           const void *o, bool o_bf16, const void *dout, bool dout_bf16,
                           const float *lse, float *dqkv, const jdt_cuk_att_grads *g, int64_t B,
                           int64_t H, int64_t T, int64_t D, float scale, unsigned bthd, bool bf16,
                           void *scratch)
{
    int64_t n = B * H * T * D;
    if (n <= 0) return;
    int tc = att_tc_class(k, bf16, D, scale);
    if ((dout_bf16 || o_bf16) && (tc < 0 || !qkv_bf16 || !dout_bf16)) {
        jdt_cuk_defer(k, JDT_ERR_INTERNAL,
                      "attention_bwd: a bf16 %s needs the tensor-core kernels, bf16 q, k, v%s "
                      "(passes.c fold_attention_dout16/o16 and the device disagree)",
                      o_bf16 ? "o" : "dO", o_bf16 ? " and a bf16 dO" : "");
        return;
    }
    if (k->dnn_on) {
        bool copies = g != NULL, aligned = aligned16(q) && aligned16(kk) && aligned16(v) &&
                                           aligned16(o) && aligned16(dout) && aligned16(lse) &&
                                           aligned16(scratch);
        for (int i = 0; i < 3 && g; i++) {
            copies &= g->copy[i] && g->copy_bf16[i];
            aligned &= aligned16(g->copy[i]);
        }
        const char *why = tc < 0    ? DNN_NOT_TC
                          : !o_bf16 ? "o not bf16 (precision.activations: bf16)"
                          : !lse    ? "no log-sum-exp from the forward"
                          : dqkv || !g
                              ? "not the cotangent form (dq, dk, dv copies for the projections)"
                          : !copies ? "a copy of dq, dk or dv not bf16 (f32 activations, or a copy "
                                      "with readers besides the bf16 GEMMs)"
                          : D % 8   ? "a head size not a multiple of 8"
                          : g->part && T % JDT_CUK_ATT_PART
                              ? "bias partial sums over a sequence not a multiple of 32"
                          : !aligned ? "a tensor not 16-byte aligned"
                                     : NULL;
        if (dnn_asks(k, true, why) &&
            (k->dnn_auto ? jdt_cuk_dnn_attention_bwd_auto(k, q, kk, v, o, dout, lse, g, B, H, T, D,
                                                          scale, bthd, scratch)
                         : jdt_cuk_dnn_attention_bwd(k, q, kk, v, o, dout, lse, g, B, H, T, D,
                                                     scale, bthd, scratch)))
            return;
    }
    jdt_cuk_att_bwd_ours(k, q, kk, v, qkv_bf16, o, o_bf16, dout, dout_bf16, lse, dqkv, g, B, H, T,
                         D, scale, bthd, bf16, scratch);
}

void jdt_cuk_att_bwd_ours(jdt_cuk *k, const void *q, const void *kk, const void *v, bool qkv_bf16,
                          const void *o, bool o_bf16, const void *dout, bool dout_bf16,
                          const float *lse, float *dqkv, const jdt_cuk_att_grads *g, int64_t B,
                          int64_t H, int64_t T, int64_t D, float scale, unsigned bthd, bool bf16,
                          void *scratch)
{
    const int64_t n = B * H * T * D;
    const int tc = att_tc_class(k, bf16, D, scale);
    /* grouped-query: dk and dv (B, Hk, T, D) at the start of their thirds, their partial
     * sums (P, Hk D) after dq's */
    const int64_t Hk = H / JDT_CUK_ATT_GROUP(bthd);
    float *stats = scratch, *dq = dqkv, *dk = dqkv ? dqkv + n : NULL,
          *dv = dqkv ? dqkv + 2 * n : NULL;
    /* the cotangent form's outputs (NULL: not written) */
    const int64_t P = B * ((T + JDT_CUK_ATT_PART - 1) / JDT_CUK_ATT_PART);
    void *q2 = g ? g->copy[0] : NULL, *k2 = g ? g->copy[1] : NULL, *v2 = g ? g->copy[2] : NULL;
    float *qp = g && g->part ? g->part : NULL, *kp = qp ? qp + P * H * D : NULL,
          *vp = qp ? kp + P * Hk * D : NULL;
    int q2b = g && g->copy_bf16[0],
        kv2b = g ? (g->copy_bf16[1] ? 1 : 0) | (g->copy_bf16[2] ? 2 : 0) : 0;
    double q2rot = g ? g->rope_theta[0] : 0.0, k2rot = g ? g->rope_theta[1] : 0.0,
           v2rot = g ? g->rope_theta[2] : 0.0;
    int q2inv = g && g->rope_inverse[0],
        kv2inv = g ? (g->rope_inverse[1] ? 1 : 0) | (g->rope_inverse[2] ? 2 : 0) : 0;
    /* with lse the dQ kernel forms the statistics (the row's dO . O, L copied) and the
     * statistics kernel, a pass over the keys for L, does not run */
    void *sargs[] = {&q, &kk, &o, &dout, &stats, &B, &H, &T, &D, &scale, &bthd};
    void *qargs[] = {&q,     &kk,    &v,  &o, &dout, &lse, &stats, &dq,    &q2,  &q2b,
                     &q2rot, &q2inv, &qp, &B, &H,    &T,   &D,     &scale, &bthd};
    void *kargs[] = {&q,     &kk,     &v,  &dout, &stats, &dk, &dv, &k2, &v2,    &kv2b, &k2rot,
                     &v2rot, &kv2inv, &kp, &vp,   &B,     &H,  &T,  &D,  &scale, &bthd};
    if (tc >= 0) {
        int64_t blocks = B * H * ((T + ATT_TC_BR - 1) / ATT_TC_BR);
        /* dO's bf16 copy after the statistics: the dQ kernel writes it, dK/dV reads it; a
         * bf16 dO is read where it is */
        void *g16 = (char *)scratch + att_g16_offset(B, H, T);
        const void *gsrc = dout_bf16 ? dout : g16;
        unsigned gbthd = dout_bf16 ? bthd & 31u : 0u; /* its layout bit 4 */
        int64_t gD = dout_bf16 ? D : att_tc_dm(D);
        void *tqargs[] = {&q,   &kk,    &v,     &o,  &dout, &lse, &stats, &g16, &dq,    &q2,
                          &q2b, &q2rot, &q2inv, &qp, &B,    &H,   &T,     &D,   &scale, &bthd};
        /* the dK/dV kernel's split: its counts zeroed, its sums after them (scratch) */
        const int64_t G = JDT_CUK_ATT_GROUP(bthd), tiles = att_key_tiles(B, Hk, T);
        int split = (int)att_dkv_split(B, H, T, D, G,
                                       k->sms < ATT_DKV_PLAN_SMS ? k->sms : ATT_DKV_PLAN_SMS);
        void *cnt = (char *)scratch + att_cnt_offset(B, H, T, D);
        void *frag = (char *)scratch + att_frag_offset(B, H, T, D, G);
        if (split > 1) {
            cudaError_t rc = cudaMemsetAsync(cnt, 0, (size_t)tiles * 4, k->stream);
            if (rc != cudaSuccess) {
                jdt_cuk_defer(k, JDT_ERR_INTERNAL, "attention_bwd: cudaMemsetAsync: %s",
                              cudaGetErrorString(rc));
                return;
            }
        }
        void *tkargs[] = {&q,   &kk,    &v,    &gsrc,  &gbthd, &gD,     &stats, &dk,  &dv,
                          &k2,  &v2,    &kv2b, &k2rot, &v2rot, &kv2inv, &kp,    &vp,  &frag,
                          &cnt, &split, &B,    &H,     &T,     &D,      &scale, &bthd};
        /* the statistics and dQ kernels by the types of q/k/v, dO and o */
        const jdt_cuk_kernel ks = o_bf16      ? JDT_CUK_K_ATT_TC_STATS_BGO_D64
                                  : dout_bf16 ? JDT_CUK_K_ATT_TC_STATS_BG_D64
                                  : qkv_bf16  ? JDT_CUK_K_ATT_TC_STATS_B_D64
                                              : JDT_CUK_K_ATT_TC_STATS_D64;
        const jdt_cuk_kernel kq = o_bf16      ? JDT_CUK_K_ATT_TC_DQ_BGO_D64
                                  : dout_bf16 ? JDT_CUK_K_ATT_TC_DQ_BG_D64
                                  : qkv_bf16  ? JDT_CUK_K_ATT_TC_DQ_B_D64
                                              : JDT_CUK_K_ATT_TC_DQ_D64;
        if (!lse) launch(k, (jdt_cuk_kernel)(ks + tc), blocks, ATT_TC_THREADS, 0, sargs);
        launch(k, (jdt_cuk_kernel)(kq + tc), blocks, ATT_TC_THREADS, 0, tqargs);
        launch(k, att_kernel(JDT_CUK_K_ATT_TC_DKV_D64, JDT_CUK_K_ATT_TC_DKV_B_D64, qkv_bf16, tc),
               tiles * split, ATT_TC_THREADS, 0, tkargs); /* split blocks per key tile */
        k->dkv_split = split;
        return;
    }
    int64_t ct;
    int cls = att_class(D, &ct);
    if (cls < 0) {
        jdt_cuk_defer(k, JDT_ERR_UNSUPPORTED, "attention_bwd: head size %lld > 256", (long long)D);
        return;
    }
    int64_t blocks = B * H * ((T + ATT_R - 1) / ATT_R);
    int64_t floats = 2 * ct * D + 2 * ct; /* the tiles, or the rows staged for g */
    if (floats < ATT_R * (D + 4)) floats = ATT_R * (D + 4);
    size_t smem = (size_t)floats * sizeof(float);
    if (!lse)
        launch(k, att_kernel(JDT_CUK_K_ATT_STATS_D64, JDT_CUK_K_ATT_STATS_B_D64, qkv_bf16, cls),
               blocks, ATT_THREADS, smem, sargs);
    launch(k, att_kernel(JDT_CUK_K_ATT_DQ_D64, JDT_CUK_K_ATT_DQ_B_D64, qkv_bf16, cls), blocks,
           ATT_THREADS, smem, qargs);
    launch(k, att_kernel(JDT_CUK_K_ATT_DKV_D64, JDT_CUK_K_ATT_DKV_B_D64, qkv_bf16, cls),
           blocks / H * Hk, ATT_THREADS, smem, kargs);
}
