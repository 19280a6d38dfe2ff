/*
 * cache.c — turning generated C into a loaded shared object, through an on-disk cache, and the
 * cache itself, generic over what it stores (NVRTC output reuses it: a key, bytes, a kind).
 *
 * Key: FNV-1a over (format version, source, compiler path, `cc --version` first line, flags,
 * the CPU model line — flags like -march=native depend on the host, and cache dirs may be
 * shared over NFS). Entry: <dir>/jdt-<key>.<kind> (kind "so" for the CPU JIT), the bytes
 * followed by a 24-byte trailer {magic "JDTSO001", u64 size, u64 FNV of the bytes}; the ELF
 * loader ignores trailing bytes. A lookup verifies the trailer; a truncated or damaged entry
 * (or one dlopen rejects) is rebuilt. Writers write a unique temporary in the same directory
 * and rename(2) it into place, so many processes may write the same entry at once and readers
 * only ever see complete files.
 *
 * Hygiene: temporaries are named jdt-<key>.<host>-<pid>.<n>.{c,tmp,log}; a compile that fails
 * renames its source and log to jdt-<key>.<host>-<pid>.failed.{c,log} (named in the error).
 * Every build prunes (one process at a time, flock on <dir>/.prune.lock): temporaries of a dead
 * process on this host at once, any temporary older than an hour (another host's, or a
 * recycled pid), failure records older than 7 days, then the least recently used entries
 * (a hit refreshes an entry's mtime) until the total is within the bound
 * (runtime.cache_max_mb, default 1024 MiB).
 *
 * One build per entry at a time: a miss takes flock on <dir>/.jdt-<key>.lock (the ranks of a job
 * on one host compile the same program at once; the first builds, the others wait, then load its
 * entry), unlinked and released once the entry is in place. No lock (read-only directory, a
 * holder past the compiler's timeout): build anyway, the rename keeps entries whole.
 *
 * Progress: the compiler says nothing while it runs, so the progress line estimates the time
 * left from this compiler's last rate on this machine (bytes of C per second, kept in
 * <dir>/.cc-rate-<hash of compiler, version, flags, CPU>.txt; not an entry, never pruned).
 */
#include "compile/compile-impl.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CACHE_FORMAT "jdt-cpu-so-1"
#define TRAILER_MAGIC "JDTSO001"
#define DEFAULT_CFLAGS "-O3 -march=native -fno-math-errno -fno-trapping-math"

/* The flags when runtime.cflags is unset: DEFAULT_CFLAGS, plus -mprefer-vector-width=512 on
 * x86 CPUs with AVX512-BF16 (Cooper Lake, Sapphire Rapids and later, Zen 4 and later). GCC's
 * -march=native keeps 256-bit vectors there (the choice for Skylake-SP, whose 512-bit code
 * lowered the clock for everything else); on these CPUs the wider loops ran the benchmark's bf16
 * step 10% faster (the GELU's rational tanh is compute-bound) and its f32 step as fast
 * (docs/perf.md, session 46). */
static const char *default_cflags(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (__builtin_cpu_supports("avx512bf16")) return DEFAULT_CFLAGS " -mprefer-vector-width=512";
#endif
    return DEFAULT_CFLAGS;
}

static jdt_status mkdir_p(const char *path, jdt_err *e)
{
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
            return jdt_err_set(e, JDT_ERR_IO, "compile cache: mkdir %s: %s", tmp, strerror(errno));
        *p = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return jdt_err_set(e, JDT_ERR_IO, "compile cache: mkdir %s: %s", tmp, strerror(errno));
    return JDT_OK;
}

jdt_status jdt_compile_cache_dir(const jdt_compile_opts *o, char *buf, size_t n, jdt_err *e)
{
    const char *d = o->cache_dir ? o->cache_dir : getenv("JDT_CACHE_DIR");
    if (d && *d)
        snprintf(buf, n, "%s", d);
    else if (getenv("XDG_CACHE_HOME") && *getenv("XDG_CACHE_HOME"))
        snprintf(buf, n, "%s/jdt-train", getenv("XDG_CACHE_HOME"));
    else if (getenv("HOME") && *getenv("HOME"))
        snprintf(buf, n, "%s/.cache/jdt-train", getenv("HOME"));
    else
        snprintf(buf, n, "/tmp/jdt-train-cache");
    return mkdir_p(buf, e);
}

#define RUN_TIMED_OUT (-2)
#define RUN_JOB_LOST (-3)

/* Runs argv with stdout+stderr appended to out_fd; returns the exit status, 127 when the
 * program cannot be executed, -1 if fork fails, RUN_TIMED_OUT (the child is killed) after
 * timeout_s seconds: a hung compiler must not hang training; RUN_JOB_LOST (killed too) when the
 * job this process is a rank of ends meanwhile (jdt_job_lost). */
static int run_cmd(char *const *argv, int out_fd, double timeout_s, const char *what,
                   double estimate_s)
{
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        jdt_signals_reset_child(); /* the compiler stops on SIGINT (Ctrl-C) as usual */
        dup2(out_fd, 1);
        dup2(out_fd, 2);
        execvp(argv[0], argv);
        dprintf(2, "cannot execute '%s': %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    int ws;
    double t0 = jdt_now_s();
    jdt_progress prog;
    jdt_progress_begin(&prog, what, 0, "");
    jdt_progress_set_estimate(&prog, estimate_s);
    for (;;) {
        pid_t r = waitpid(pid, &ws, WNOHANG);
        if (r == pid) break;
        jdt_progress_update(&prog, 0);
        if (r < 0 && errno != EINTR) return -1;
        const bool lost = jdt_job_lost();
        if (lost || jdt_now_s() - t0 > timeout_s) {
            kill(pid, SIGKILL);
            while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
            }
            if (lost) {
                dprintf(out_fd, "\njdt-train: killed '%s': the job ended\n", argv[0]);
                return RUN_JOB_LOST;
            }
            dprintf(out_fd, "\njdt-train: killed '%s' after %.0f s (compile timeout)\n", argv[0],
                    timeout_s);
            return RUN_TIMED_OUT;
        }
        struct timespec ts = {0, 2 * 1000 * 1000}; /* 2 ms */
        nanosleep(&ts, NULL);
    }
    jdt_progress_end(&prog);
    if (WIFEXITED(ws)) return WEXITSTATUS(ws);
    return 128 + (WIFSIGNALED(ws) ? WTERMSIG(ws) : 0);
}

/* First line of `cc --version` (empty if the compiler cannot run). */
static void cc_version(const char *cc, double timeout_s, char *out, size_t n)
{
    out[0] = 0;
    char path[] = "/tmp/jdt-ccver-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return;
    unlink(path);
    char *argv[] = {(char *)cc, (char *)"--version", NULL};
    if (run_cmd(argv, fd, timeout_s < 30 ? timeout_s : 30, "cc --version", 0) == 0) {
        ssize_t r = pread(fd, out, n - 1, 0);
        out[r > 0 ? r : 0] = 0;
        char *nl = strchr(out, '\n');
        if (nl) *nl = 0;
    }
    close(fd);
}

static void cpu_model(char *out, size_t n)
{
    out[0] = 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[4096];
    bool model = false, flags = false;
    size_t off = 0;
    while (fgets(line, sizeof line, f) && !(model && flags)) {
        if ((!model && strncmp(line, "model name", 10) == 0) ||
            (!flags && strncmp(line, "flags", 5) == 0)) {
            off += (size_t)snprintf(out + off, off < n ? n - off : 0, "%s", line);
            if (off >= n) off = n - 1;
            if (line[0] == 'm')
                model = true;
            else
                flags = true;
        }
    }
    fclose(f);
}

/* ---- the generic cache ------------------------------------------------------------------ */

#define DEFAULT_MAX_BYTES (1024LL << 20)
#define TMP_MAX_AGE_S 3600
#define FAILED_MAX_AGE_S (7 * 86400)

/* 8 hex digits naming this host in temporaries, so a sweeper only judges its own host's pids
 * (the directory may be shared over NFS). */
static void host_tag(char *out, size_t n)
{
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    snprintf(out, n, "%08x", (unsigned)(jdt_hash_str(JDT_HASH_INIT, host) & 0xffffffffu));
}

void jdt_compile_cache_path(const char *dir, uint64_t key, const char *kind, char *buf, size_t n)
{
    snprintf(buf, n, "%s/jdt-%016llx.%s", dir, (unsigned long long)key, kind);
}

/* A unique temporary for key in dir: jdt-<key>.<host>-<pid>.<n>.<suffix>. */
static void tmp_path(const char *dir, uint64_t key, const char *suffix, char *buf, size_t n)
{
    static _Atomic unsigned long counter;
    char host[16];
    host_tag(host, sizeof host);
    unsigned long c = ++counter;
    snprintf(buf, n, "%s/jdt-%016llx.%s-%d.%lx%llx.%s", dir, (unsigned long long)key, host,
             (int)getpid(), c, (unsigned long long)(jdt_now_s() * 1e6) & 0xffffff, suffix);
}

static unsigned char *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char *buf = NULL;
    if (fseek(f, 0, SEEK_END) != 0) goto fail;
    long sz = ftell(f);
    if (sz < 0 || fseek(f, 0, SEEK_SET) != 0) goto fail;
    buf = jdt_malloc((size_t)sz + 1);
    if (!buf || fread(buf, 1, (size_t)sz, f) != (size_t)sz) goto fail;
    fclose(f);
    *n = (size_t)sz;
    return buf;
fail:
    jdt_free(buf);
    fclose(f);
    return NULL;
}

/* The payload size of a complete entry whose checksum matches (b holds the whole file). */
static bool trailer_ok(const unsigned char *b, size_t n, size_t *payload)
{
    if (!b || n < 24 || memcmp(b + n - 24, TRAILER_MAGIC, 8) != 0) return false;
    uint64_t size, hash;
    memcpy(&size, b + n - 16, 8);
    memcpy(&hash, b + n - 8, 8);
    if (size != n - 24 || jdt_hash_bytes(JDT_HASH_INIT, b, (size_t)size) != hash) return false;
    *payload = (size_t)size;
    return true;
}

static bool entry_valid(const char *path)
{
    size_t n = 0, payload;
    unsigned char *b = read_file(path, &n);
    bool ok = trailer_ok(b, n, &payload);
    jdt_free(b);
    return ok;
}

bool jdt_compile_cache_get(const char *dir, uint64_t key, const char *kind, unsigned char **bytes,
                           size_t *n_bytes)
{
    char path[1200];
    jdt_compile_cache_path(dir, key, kind, path, sizeof path);
    size_t n = 0, payload;
    unsigned char *b = read_file(path, &n);
    if (!trailer_ok(b, n, &payload)) {
        jdt_free(b);
        return false;
    }
    utimensat(AT_FDCWD, path, NULL, 0); /* last use, for the LRU bound */
    *bytes = b;
    *n_bytes = payload;
    return true;
}

/* Appends the trailer to the file at path and fsyncs it. */
static jdt_status append_trailer(const char *path, jdt_err *e)
{
    size_t n = 0;
    unsigned char *b = read_file(path, &n);
    if (!b) return jdt_err_set(e, JDT_ERR_IO, "compile cache: cannot read %s", path);
    uint64_t size = n, hash = jdt_hash_bytes(JDT_HASH_INIT, b, n);
    jdt_free(b);
    FILE *f = fopen(path, "ab");
    if (!f) return jdt_err_set(e, JDT_ERR_IO, "compile cache: %s: %s", path, strerror(errno));
    errno = 0;
    bool ok = fwrite(TRAILER_MAGIC, 1, 8, f) == 8 && fwrite(&size, 8, 1, f) == 1 &&
              fwrite(&hash, 8, 1, f) == 1;
    ok = (fflush(f) == 0) && ok && fsync(fileno(f)) == 0;
    int err = errno;
    if (fclose(f) != 0) ok = false, err = err ? err : errno;
    if (!ok)
        return jdt_err_set(e, JDT_ERR_IO, "compile cache: writing %s failed: %s", path,
                           strerror(err ? err : EIO));
    return JDT_OK;
}

jdt_status jdt_compile_cache_put(const char *dir, uint64_t key, const char *kind, const void *bytes,
                                 size_t n_bytes, int64_t max_bytes, jdt_err *e)
{
    char tmp[1200], path[1200];
    tmp_path(dir, key, "tmp", tmp, sizeof tmp);
    jdt_compile_cache_path(dir, key, kind, path, sizeof path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return jdt_err_set(e, JDT_ERR_IO, "compile cache: %s: %s", tmp, strerror(errno));
    errno = 0;
    bool ok = fwrite(bytes, 1, n_bytes, f) == n_bytes;
    int err = errno;
    if (fclose(f) != 0) ok = false, err = err ? err : errno;
    jdt_status st = ok ? append_trailer(tmp, e)
                       : jdt_err_set(e, JDT_ERR_IO, "compile cache: writing %s failed: %s", tmp,
                                     strerror(err ? err : EIO));
    if (st == JDT_OK && rename(tmp, path) != 0)
        st = jdt_err_set(e, JDT_ERR_IO, "compile cache: rename %s -> %s: %s", tmp, path,
                         strerror(errno));
    if (st != JDT_OK) {
        unlink(tmp);
        return st;
    }
    jdt_compile_cache_prune(dir, max_bytes, path);
    return JDT_OK;
}

typedef struct {
    char name[300];
    int64_t bytes;
    time_t used;
} cache_entry;

static int cmp_used(const void *a, const void *b)
{
    const cache_entry *x = a, *y = b;
    return (x->used > y->used) - (x->used < y->used);
}

/* Classifies a name: 0 not ours, 1 entry "jdt-<16 hex>.<kind>", 2 temporary
 * "jdt-<16 hex>.<host>-<pid>.<n>.<c|tmp|log>", 3 failure record "....failed.<c|log>".
 * For temporaries, host and pid receive the writer's. */
static int classify(const char *name, char *host, size_t host_n, long *pid)
{
    if (strncmp(name, "jdt-", 4) != 0 || strlen(name) < 22 || name[20] != '.') return 0;
    for (int i = 4; i < 20; i++)
        if (!strchr("0123456789abcdef", name[i])) return 0;
    const char *rest = name + 21;
    if (!strchr(rest, '.')) return 1;
    const char *dash = strchr(rest, '-');
    if (!dash || (size_t)(dash - rest) >= host_n) return 0;
    memcpy(host, rest, (size_t)(dash - rest));
    host[dash - rest] = '\0';
    *pid = strtol(dash + 1, NULL, 10);
    return strstr(rest, ".failed.") ? 3 : 2;
}

void jdt_compile_cache_prune(const char *dir, int64_t max_bytes, const char *keep)
{
    char lock_path[1200];
    snprintf(lock_path, sizeof lock_path, "%s/.prune.lock", dir);
    int lfd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lfd < 0) return;
    if (flock(lfd, LOCK_EX | LOCK_NB) != 0) { /* another process is pruning */
        close(lfd);
        return;
    }
    DIR *d = opendir(dir);
    if (!d) goto out_unlock;
    char me[16];
    host_tag(me, sizeof me);
    const char *keep_name = keep ? strrchr(keep, '/') : NULL;
    keep_name = keep_name ? keep_name + 1 : keep;
    time_t now = time(NULL);
    cache_entry *es = NULL;
    size_t n = 0, cap = 0;
    int64_t total = 0;
    for (struct dirent *de; (de = readdir(d));) {
        char host[16], path[1400];
        long pid = 0;
        int kind = classify(de->d_name, host, sizeof host, &pid);
        if (kind == 0) continue;
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        double age = difftime(now, sb.st_mtime);
        if (kind == 2) {
            bool dead = strcmp(host, me) == 0 && pid > 0 && (pid_t)pid != getpid() &&
                        kill((pid_t)pid, 0) != 0 && errno == ESRCH;
            if (dead || age > TMP_MAX_AGE_S) unlink(path);
            continue;
        }
        int64_t bytes = (int64_t)sb.st_size;
        if (kind == 3) {
            if (age > FAILED_MAX_AGE_S)
                unlink(path);
            else
                total += bytes;
            continue;
        }
        total += bytes;
        if (keep_name && strcmp(de->d_name, keep_name) == 0) continue;
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 64;
            cache_entry *ne = jdt_realloc(es, nc * sizeof *ne);
            if (!ne) break;
            es = ne;
            cap = nc;
        }
        snprintf(es[n].name, sizeof es[n].name, "%s", de->d_name);
        es[n].bytes = bytes;
        es[n].used = sb.st_mtime;
        n++;
    }
    closedir(d);
    int64_t bound = max_bytes == 0 ? DEFAULT_MAX_BYTES : max_bytes;
    if (bound > 0 && total > bound) {
        qsort(es, n, sizeof *es, cmp_used);
        int64_t freed = 0;
        int removed = 0;
        for (size_t i = 0; i < n && total - freed > bound; i++) {
            char path[1400];
            snprintf(path, sizeof path, "%s/%s", dir, es[i].name);
            if (unlink(path) == 0) {
                freed += es[i].bytes;
                removed++;
            }
        }
        if (removed)
            JDT_DEBUG("compile cache: removed %d least recently used entries (%.1f MiB) to stay "
                      "within %.0f MiB",
                      removed, (double)freed / 1048576.0, (double)bound / 1048576.0);
    }
    jdt_free(es);
out_unlock:
    flock(lfd, LOCK_UN);
    close(lfd);
}

static int split_flags(char *flags, char **argv, int max)
{
    int n = 0;
    for (char *tok = strtok(flags, " \t"); tok && n < max; tok = strtok(NULL, " \t"))
        argv[n++] = tok;
    return n;
}

/* The compiler's last rate (bytes of C per second) for this key, 0 if unknown. */
static double read_rate(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    double v = 0;
    if (fscanf(f, "%lf", &v) != 1 || !(v > 0 && v < 1e12)) v = 0;
    fclose(f);
    return v;
}

/* Records the rate of a compile that took long enough to time (temp file + rename). */
static void write_rate(const char *path, double bytes_per_s)
{
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    bool ok = fprintf(f, "%.1f\n# bytes of generated C per second of cc, last compile\n",
                      bytes_per_s) > 0;
    if (fclose(f) != 0 || !ok || rename(tmp, path) != 0) unlink(tmp);
}

/* A valid entry `so` that loads: *handle, a hit (its mtime refreshed for the LRU bound). warn:
 * say so when a valid entry does not load (once: the check under the build lock). */
static bool load_hit(const char *so, bool warn, void **handle, jdt_compile_stats *st)
{
    if (!entry_valid(so)) return false;
    *handle = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    if (!*handle) {
        const char *why = dlerror();
        if (warn) JDT_WARN("compile cache: %s does not load (%s); rebuilding", so, why);
        return false;
    }
    utimensat(AT_FDCWD, so, NULL, 0);
    st->cache_hit = true;
    return true;
}

static void lock_path_of(const char *dir, uint64_t key, char *buf, size_t n)
{
    snprintf(buf, n, "%s/.jdt-%016llx.lock", dir, (unsigned long long)key);
}

int jdt_compile_cache_lock(const char *dir, uint64_t key, double wait_s)
{
    char lock_path[1100];
    lock_path_of(dir, key, lock_path, sizeof lock_path);
    int fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    const double deadline = jdt_now_s() + wait_s;
    bool said = false;
    while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno != EWOULDBLOCK || jdt_now_s() > deadline) {
            close(fd);
            return -1;
        }
        if (jdt_job_lost()) { /* the holder may be a stopped rank of the job: no point waiting */
            close(fd);
            return JDT_CACHE_LOCK_JOB_LOST;
        }
        if (!said) JDT_DEBUG("compile cache: another process is building %s; waiting", lock_path);
        said = true;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return fd;
}

void jdt_compile_cache_unlock(const char *dir, uint64_t key, int fd)
{
    if (fd < 0) return;
    char lock_path[1100];
    lock_path_of(dir, key, lock_path, sizeof lock_path);
    struct stat a, b; /* unlink only our file: a waiter's may since be a newcomer's lock */
    if (fstat(fd, &a) == 0 && stat(lock_path, &b) == 0 && a.st_ino == b.st_ino &&
        a.st_dev == b.st_dev)
        unlink(lock_path);
    close(fd);
}

jdt_status jdt_compile_cache_require(const char *dir, uint64_t key, const char *kind, jdt_err *e)
{
    char path[1200];
    jdt_compile_cache_path(dir, key, kind, path, sizeof path);
    if (access(path, R_OK) == 0) return JDT_OK;
    return jdt_err_set(e, JDT_ERR_IO,
                       "compile cache: %s was not stored (is %s writable? see the warning above)",
                       path, dir);
}

jdt_status jdt_compile_cache_fetch(const char *dir, uint64_t key, const char *kind, double wait_s,
                                   int64_t max_bytes, jdt_cache_build_fn build, void *ctx,
                                   unsigned char **bytes, size_t *n_bytes, jdt_cache_how *how,
                                   jdt_err *e)
{
    *bytes = NULL;
    *n_bytes = 0;
    *how = JDT_CACHE_HIT;
    const bool cached = dir && *dir;
    if (cached && jdt_compile_cache_get(dir, key, kind, bytes, n_bytes)) return JDT_OK;
    jdt_err de;
    if (cached) mkdir_p(dir, &de); /* a failure shows as the store's warning */
    const int lock = cached ? jdt_compile_cache_lock(dir, key, wait_s) : -1;
    if (lock == JDT_CACHE_LOCK_JOB_LOST)
        return jdt_err_set(e, JDT_ERR_PEER_LOST,
                           "compile cache: the job ended while another process built this %s "
                           "entry: %s",
                           kind, jdt_job_lost_why());
    jdt_status st = JDT_OK;
    if (lock >= 0 && jdt_compile_cache_get(dir, key, kind, bytes, n_bytes)) {
        *how = JDT_CACHE_WAITED;
    } else {
        *how = JDT_CACHE_BUILT;
        st = build(ctx, bytes, n_bytes, e);
        jdt_err pe;
        jdt_err_clear(&pe);
        if (st == JDT_OK && cached &&
            jdt_compile_cache_put(dir, key, kind, *bytes, *n_bytes, max_bytes, &pe) != JDT_OK)
            JDT_WARN("%s", pe.msg);
    }
    jdt_compile_cache_unlock(dir, key, lock);
    return st;
}

static jdt_status build_locked(const jdt_compile_opts *o, const char *src, const char *cc,
                               const char *flags, const char *ver, const char *cpu, const char *dir,
                               uint64_t key, const char *so, double timeout_s, void **handle,
                               jdt_compile_stats *st, jdt_err *e);

jdt_status jdt_compile_build(const jdt_compile_opts *o, const char *src, void **handle,
                             jdt_compile_stats *st, jdt_err *e)
{
    char dir[768], ver[256], cpu[8192], so[1024];
    const char *cc = o->cc ? o->cc : (getenv("CC") && *getenv("CC") ? getenv("CC") : "cc");
    const char *flags = o->cflags ? o->cflags : default_cflags();
    jdt_status s = jdt_compile_cache_dir(o, dir, sizeof dir, e);
    if (s != JDT_OK) return s;
    *handle = NULL;
    double timeout_s = o->cc_timeout_s > 0 ? o->cc_timeout_s : 600.0;
    cc_version(cc, timeout_s, ver, sizeof ver);
    cpu_model(cpu, sizeof cpu);
    uint64_t key = jdt_hash_str(JDT_HASH_INIT, CACHE_FORMAT);
    key = jdt_hash_str(key, src);
    key = jdt_hash_str(key, cc);
    key = jdt_hash_str(key, ver);
    key = jdt_hash_str(key, flags);
    key = jdt_hash_str(key, cpu);
    jdt_compile_cache_path(dir, key, "so", so, sizeof so);
    snprintf(st->so_path, sizeof st->so_path, "%s", so);

    if (load_hit(so, false, handle, st)) return JDT_OK;
    /* the processes of a job on this host compile the same program at once: one builds it,
     * the others wait for its entry (and build it themselves if none appears) */
    const int lock = jdt_compile_cache_lock(dir, key, timeout_s + 30.0);
    if (lock == JDT_CACHE_LOCK_JOB_LOST)
        return jdt_err_set(e, JDT_ERR_PEER_LOST,
                           "compile: the job ended while another process compiled this "
                           "program (%s): %s",
                           so, jdt_job_lost_why());
    if (lock >= 0 && load_hit(so, true, handle, st)) {
        st->cache_waited = true;
        s = JDT_OK;
    } else {
        s = build_locked(o, src, cc, flags, ver, cpu, dir, key, so, timeout_s, handle, st, e);
    }
    jdt_compile_cache_unlock(dir, key, lock);
    return s;
}

/* The miss path of jdt_compile_build: compile src into unique temporaries, rename the shared
 * object into place as entry `so`, load it. */
static jdt_status build_locked(const jdt_compile_opts *o, const char *src, const char *cc,
                               const char *flags, const char *ver, const char *cpu, const char *dir,
                               uint64_t key, const char *so, double timeout_s, void **handle,
                               jdt_compile_stats *st, jdt_err *e)
{
    char tmp_c[1100], tmp_so[1100], log[1100], flags_buf[1024];
    const int64_t max_bytes = o->cache_max_bytes;
    jdt_status s;
    jdt_compile_cache_prune(dir, max_bytes, NULL); /* dead compiles' temporaries, the bound */

    /* miss or corrupt: compile into unique temporaries, then rename into place */
    tmp_path(dir, key, "c", tmp_c, sizeof tmp_c);
    tmp_path(dir, key, "tmp", tmp_so, sizeof tmp_so);
    tmp_path(dir, key, "log", log, sizeof log);
    FILE *f = fopen(tmp_c, "w");
    if (!f) return jdt_err_set(e, JDT_ERR_IO, "compile cache: %s: %s", tmp_c, strerror(errno));
    errno = 0;
    bool wrote = fputs(src, f) >= 0;
    int err = errno;
    if (fclose(f) != 0 || !wrote) {
        err = err ? err : errno;
        unlink(tmp_c);
        return jdt_err_set(e, JDT_ERR_IO,
                           "compile cache: writing %s failed: %s (the cache "
                           "directory is runtime.cache_dir)",
                           tmp_c, strerror(err ? err : EIO));
    }
    int lfd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (lfd < 0) {
        unlink(tmp_c);
        return jdt_err_set(e, JDT_ERR_IO, "compile cache: %s: %s", log, strerror(errno));
    }
    snprintf(flags_buf, sizeof flags_buf, "%s", flags);
    char *argv[80];
    int n = 0;
    argv[n++] = (char *)cc;
    n += split_flags(flags_buf, argv + n, 64);
    argv[n++] = (char *)"-fPIC";
    argv[n++] = (char *)"-shared";
    argv[n++] = (char *)"-fopenmp";
    argv[n++] = (char *)"-o";
    argv[n++] = tmp_so;
    argv[n++] = tmp_c;
    argv[n] = NULL;
    dprintf(lfd, "$");
    for (int i = 0; argv[i]; i++)
        dprintf(lfd, " %s", argv[i]);
    dprintf(lfd, "\n");
    uint64_t rate_key = jdt_hash_str(JDT_HASH_INIT, cc);
    rate_key = jdt_hash_str(jdt_hash_str(jdt_hash_str(rate_key, ver), flags), cpu);
    char rate_path[1100], what[96];
    snprintf(rate_path, sizeof rate_path, "%s/.cc-rate-%016llx.txt", dir,
             (unsigned long long)rate_key);
    const size_t src_bytes = strlen(src);
    const double rate = read_rate(rate_path);
    snprintf(what, sizeof what, "compiling the step's kernels (%.0f KB of C)",
             (double)src_bytes / 1024.0);
    double t0 = jdt_now_s();
    int rc = run_cmd(argv, lfd, timeout_s, what, rate > 0 ? (double)src_bytes / rate : 0);
    st->cc_s = jdt_now_s() - t0;
    /* small programs (eval, sampling) are dominated by the compiler's start-up: not a rate */
    if (rc == 0 && st->cc_s > 0.5 && src_bytes >= (64u << 10))
        write_rate(rate_path, (double)src_bytes / st->cc_s);
    close(lfd);
    if (rc != 0) {
        /* keep the source and the log for the user, under names the sweeper keeps 7 days */
        char kept_c[1100], kept_log[1100];
        char host[16];
        host_tag(host, sizeof host);
        snprintf(kept_c, sizeof kept_c, "%s/jdt-%016llx.%s-%d.failed.c", dir,
                 (unsigned long long)key, host, (int)getpid());
        snprintf(kept_log, sizeof kept_log, "%s/jdt-%016llx.%s-%d.failed.log", dir,
                 (unsigned long long)key, host, (int)getpid());
        unlink(tmp_so);
        if (rename(tmp_c, kept_c) != 0) snprintf(kept_c, sizeof kept_c, "%s", tmp_c);
        if (rename(log, kept_log) != 0) snprintf(kept_log, sizeof kept_log, "%s", log);
        if (rc == RUN_JOB_LOST)
            return jdt_err_set(e, JDT_ERR_PEER_LOST,
                               "compile: the job ended while the C compiler ran (stopped it): %s",
                               jdt_job_lost_why());
        if (rc == RUN_TIMED_OUT)
            return jdt_err_set(e, JDT_ERR_TIMEOUT,
                               "compile: C compiler '%s' did not finish in %.0f s and was killed; "
                               "its output is in %s (source kept in %s)",
                               cc, timeout_s, kept_log, kept_c);
        if (rc == 127) /* the shell's or exec's "command not found" */
            return jdt_err_set(e, JDT_ERR_COMPILE,
                               "compile: C compiler '%s' not found (exit 127): the CPU backend "
                               "compiles its kernels at run time; install one (gcc) or name it "
                               "with runtime.cc; its output is in %s",
                               cc, kept_log);
        return jdt_err_set(e, JDT_ERR_COMPILE,
                           "compile: C compiler '%s' failed (exit %d); its output is in %s "
                           "(source kept in %s)",
                           cc, rc, kept_log, kept_c);
    }
    unlink(tmp_c);
    unlink(log);
    s = append_trailer(tmp_so, e);
    if (s != JDT_OK || rename(tmp_so, so) != 0) {
        if (s == JDT_OK)
            s = jdt_err_set(e, JDT_ERR_IO, "compile cache: rename %s -> %s: %s", tmp_so, so,
                            strerror(errno));
        unlink(tmp_so);
        return s;
    }
    jdt_compile_cache_prune(dir, max_bytes, so);
    *handle = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    if (!*handle) return jdt_err_set(e, JDT_ERR_COMPILE, "compile: dlopen %s: %s", so, dlerror());
    st->cache_hit = false;
    return JDT_OK;
}
