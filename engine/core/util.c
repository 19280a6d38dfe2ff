/*
 * util.c — dtypes, FNV-1a hashing, the Philox counter-based RNG and the clock (see core.h).
 */
#include "core/core.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const struct {
    const char *name;
    size_t size;
} DTYPES[JDT_DTYPE_COUNT] = {
#define X_(name, str, size) {str, size},
    JDT_DTYPE_LIST(X_)
#undef X_
};

_Static_assert(JDT_ARRAY_LEN(DTYPES) == JDT_DTYPE_COUNT, "dtype table incomplete");

const char *jdt_dtype_name(jdt_dtype dt)
{
    return ((int)dt >= 0 && dt < JDT_DTYPE_COUNT) ? DTYPES[dt].name : "?";
}

double jdt_rope_freq(double theta, int64_t i, int64_t D, const double *sc)
{
    const double f = pow(theta, -2.0 * (double)i / (double)D);
    if (!sc || !(sc[0] > 0)) return f;
    const double factor = sc[0], lo = sc[1], hi = sc[2], orig = sc[3];
    const double wavelen = 2.0 * M_PI / f;
    if (wavelen < orig / hi) return f;          /* high frequencies: as trained */
    if (wavelen > orig / lo) return f / factor; /* low frequencies: stretched */
    const double smooth = (orig / wavelen - lo) / (hi - lo);
    return (1.0 - smooth) * f / factor + smooth * f;
}

float jdt_bf16_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        u = (u | 0x00400000u) & 0xffff0000u; /* NaN stays a (quiet) NaN */
    } else {
        u += 0x7fffu + ((u >> 16) & 1u); /* nearest even; a carry into Inf is the right answer */
        u &= 0xffff0000u;
    }
    memcpy(&x, &u, 4);
    return x;
}

size_t jdt_dtype_size(jdt_dtype dt)
{
    return ((int)dt >= 0 && dt < JDT_DTYPE_COUNT) ? DTYPES[dt].size : 0;
}

bool jdt_dtype_parse(const char *name, jdt_dtype *out)
{
    for (int i = 0; i < JDT_DTYPE_COUNT; i++) {
        if (strcmp(name, DTYPES[i].name) == 0) {
            *out = (jdt_dtype)i;
            return true;
        }
    }
    return false;
}

uint64_t jdt_hash_bytes(uint64_t h, const void *data, size_t n_bytes)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n_bytes; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

uint64_t jdt_hash_str(uint64_t h, const char *s)
{
    return jdt_hash_bytes(h, s, strlen(s) + 1);
}

uint64_t jdt_hash_u64(uint64_t h, uint64_t v)
{
    return jdt_hash_bytes(h, &v, sizeof v);
}

/* Philox-4x32 with 10 rounds; constants from the paper. */
jdt_philox_ctr jdt_philox(uint64_t key, uint64_t ctr_hi, uint64_t ctr_lo)
{
    uint32_t c0 = (uint32_t)ctr_lo, c1 = (uint32_t)(ctr_lo >> 32);
    uint32_t c2 = (uint32_t)ctr_hi, c3 = (uint32_t)(ctr_hi >> 32);
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0, c1 = n1, c2 = n2, c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    jdt_philox_ctr out = {{c0, c1, c2, c3}};
    return out;
}

float jdt_u32_to_unit_float(uint32_t x)
{
    return (float)(x >> 8) * (1.0f / 16777216.0f);
}

void jdt_rng_uniform(uint64_t key, uint64_t first, size_t n, float *out)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t idx = first + i;
        jdt_philox_ctr r = jdt_philox(key, 0, idx);
        out[i] = jdt_u32_to_unit_float(r.v[0]);
    }
}

void jdt_rng_normal(uint64_t key, uint64_t first, size_t n, float *out)
{
    /* One Philox call per index so value i never depends on its neighbours. */
    for (size_t i = 0; i < n; i++) {
        uint64_t idx = first + i;
        jdt_philox_ctr r = jdt_philox(key, 1, idx);
        double u1 = ((double)r.v[0] + 1.0) / 4294967297.0; /* (0, 1] */
        double u2 = (double)r.v[1] / 4294967296.0;
        out[i] = (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
    }
}

uint64_t jdt_rng_key(uint64_t seed, const char *name)
{
    uint64_t h = jdt_hash_u64(JDT_HASH_INIT, seed);
    h = jdt_hash_str(h, name);
    /* finalise (splitmix64) so nearby names give unrelated keys */
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebULL;
    h ^= h >> 31;
    return h;
}

double jdt_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double jdt_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double jdt_best_rate(double flops, int n_rep, void (*run)(void *), void *ctx, double *cores)
{
    double best = 0;
    run(ctx);
    const double c0 = jdt_cpu_s(), t0 = jdt_now_s();
    for (int r = 0; r < n_rep || (r < 1000 && jdt_now_s() - t0 < 0.2); r++) {
        const double t1 = jdt_now_s();
        run(ctx);
        const double f = flops / (jdt_now_s() - t1);
        if (f > best) best = f;
    }
    if (cores) *cores = (jdt_cpu_s() - c0) / (jdt_now_s() - t0);
    return best;
}

void jdt_permute_blocks_bytes(const void *src, void *dst, int64_t k, int64_t outer,
                              int64_t blk_bytes, bool to_outer)
{
    const char *s = src;
    char *d = dst;
    for (int64_t j = 0; j < k; j++)
        for (int64_t o = 0; o < outer; o++) {
            const char *a =
                to_outer ? s + (j * outer + o) * blk_bytes : s + (o * k + j) * blk_bytes;
            char *b = to_outer ? d + (o * k + j) * blk_bytes : d + (j * outer + o) * blk_bytes;
            memcpy(b, a, (size_t)blk_bytes);
        }
}

void jdt_permute_blocks_f32(const float *src, float *dst, int64_t k, int64_t outer, int64_t blk,
                            bool to_outer)
{
    jdt_permute_blocks_bytes(src, dst, k, outer, blk * (int64_t)sizeof(float), to_outer);
}

int jdt_thread_create(void *thread, void *(*fn)(void *), void *arg)
{
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &block, &old); /* the new thread inherits this mask */
    int rc = pthread_create((pthread_t *)thread, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

jdt_status jdt_write_file_atomic(const char *path, const char *text, jdt_err *e)
{
    char tmp[1200];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return jdt_err_set(e, JDT_ERR_IO, "%s: path too long", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return jdt_err_set(e, JDT_ERR_IO, "%s: %s", tmp, strerror(errno));
    fputs(text, f);
    jdt_status st = JDT_OK;
    if (fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0)
        st = jdt_err_set(e, JDT_ERR_IO, "%s: write failed", tmp);
    if (fclose(f) != 0 && !st) st = jdt_err_set(e, JDT_ERR_IO, "%s: close failed", tmp);
    if (!st && rename(tmp, path) != 0)
        st = jdt_err_set(e, JDT_ERR_IO, "%s: rename: %s", path, strerror(errno));
    if (st) remove(tmp);
    return st;
}

jdt_status jdt_read_file(const char *path, bool allow_pipe, size_t max_bytes, char **text,
                         size_t *len, int *err_no)
{
    char *buf = NULL;
    size_t n = 0, cap = 0;
    *text = NULL;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        *err_no = errno;
        return JDT_ERR_IO;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !(S_ISREG(sb.st_mode) || (allow_pipe && S_ISFIFO(sb.st_mode)))) {
        *err_no = S_ISDIR(sb.st_mode) ? EISDIR : EINVAL; /* EINVAL: "not a regular file" */
        close(fd);
        return JDT_ERR_IO;
    }
    *len = 0;
    if (S_ISREG(sb.st_mode) && (uint64_t)sb.st_size > max_bytes) { /* refused before reading */
        *err_no = EFBIG;
        *len = (size_t)sb.st_size;
        close(fd);
        return JDT_ERR_IO;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        *err_no = errno;
        close(fd);
        return JDT_ERR_IO;
    }
    for (;;) {
        if (cap - n < 4096) {
            cap = cap ? cap * 2 : 8192;
            char *nb = jdt_realloc(buf, cap + 1);
            if (!nb) {
                jdt_free(buf);
                fclose(f);
                return JDT_ERR_NOMEM;
            }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
        if (n > max_bytes) { /* a pipe, or a file that grew */
            jdt_free(buf);
            fclose(f);
            *err_no = EFBIG;
            return JDT_ERR_IO;
        }
    }
    if (ferror(f)) {
        *err_no = errno ? errno : EIO;
        jdt_free(buf);
        fclose(f);
        return JDT_ERR_IO;
    }
    fclose(f);
    buf[n] = '\0';
    *text = buf;
    *len = n;
    return JDT_OK;
}
