/*
 * cache.c — turning generated C into a loaded shared object, through an on-disk cache.
 *
 * Key: FNV-1a over (format version, source, compiler path, `cc --version` first line, flags,
 * the CPU model line — flags like -march=native depend on the host, and cache dirs may be
 * shared over NFS). Entry: <dir>/jdt-<key>.so, the ELF bytes followed by a 24-byte trailer
 * {magic "JDTSO001", u64 ELF size, u64 FNV of the ELF bytes}; the loader ignores trailing
 * bytes. A lookup verifies the trailer before dlopen; a truncated or damaged entry (or one
 * dlopen rejects) is rebuilt. Writers compile into a unique temporary name in the same
 * directory and rename(2) it into place, so many processes may compile the same program at
 * once and readers only ever see complete files. The compiler's output goes to
 * <dir>/jdt-<key>.<pid>.log, kept (and named in the error) when compilation fails.
 */
#include "compile/compile-impl.h"

#include <dirent.h>
#include <dlfcn.h>
#include <signal.h>
#include <time.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define CACHE_FORMAT "jdt-cpu-so-1"
#define TRAILER_MAGIC "JDTSO001"
#define DEFAULT_CFLAGS "-O3 -march=native -fno-math-errno -fno-trapping-math"

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

/* Runs argv with stdout+stderr appended to out_fd; returns the exit status, 127 when the
 * program cannot be executed, -1 if fork fails, RUN_TIMED_OUT (the child is killed) after
 * timeout_s seconds: a hung compiler must not hang training. */
static int run_cmd(char *const *argv, int out_fd, double timeout_s)
{
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(out_fd, 1);
        dup2(out_fd, 2);
        execvp(argv[0], argv);
        dprintf(2, "cannot execute '%s': %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    int ws;
    double t0 = jdt_now_s();
    jdt_progress prog;
    jdt_progress_begin(&prog, "compiling the step's kernels", 0, "");
    for (;;) {
        pid_t r = waitpid(pid, &ws, WNOHANG);
        if (r == pid) break;
        jdt_progress_update(&prog, 0);
        if (r < 0 && errno != EINTR) return -1;
        if (jdt_now_s() - t0 > timeout_s) {
            kill(pid, SIGKILL);
            while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
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
    if (run_cmd(argv, fd, timeout_s < 30 ? timeout_s : 30) == 0) {
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

/* Removes temporaries (jdt-*.tmp, jdt-*.c) older than an hour: left by killed compiles. */
static void sweep_stale(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    time_t now = time(NULL);
    for (struct dirent *de; (de = readdir(d));) {
        size_t l = strlen(de->d_name);
        if (strncmp(de->d_name, "jdt-", 4) != 0) continue;
        bool tmp = (l > 4 && strcmp(de->d_name + l - 4, ".tmp") == 0) ||
                   (l > 2 && strcmp(de->d_name + l - 2, ".c") == 0);
        if (!tmp) continue;
        char path[1400];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (stat(path, &sb) == 0 && now - sb.st_mtime > 3600) unlink(path);
    }
    closedir(d);
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

/* True when path holds a complete entry whose checksum matches. */
static bool entry_valid(const char *path)
{
    size_t n = 0;
    unsigned char *b = read_file(path, &n);
    bool ok = false;
    if (b && n > 24 && memcmp(b + n - 24, TRAILER_MAGIC, 8) == 0) {
        uint64_t size, hash;
        memcpy(&size, b + n - 16, 8);
        memcpy(&hash, b + n - 8, 8);
        ok = size == n - 24 && jdt_hash_bytes(JDT_HASH_INIT, b, (size_t)size) == hash;
    }
    jdt_free(b);
    return ok;
}

static jdt_status append_trailer(const char *path, jdt_err *e)
{
    size_t n = 0;
    unsigned char *b = read_file(path, &n);
    if (!b) return jdt_err_set(e, JDT_ERR_IO, "compile cache: cannot read %s", path);
    uint64_t size = n, hash = jdt_hash_bytes(JDT_HASH_INIT, b, n);
    jdt_free(b);
    FILE *f = fopen(path, "ab");
    if (!f) return jdt_err_set(e, JDT_ERR_IO, "compile cache: %s: %s", path, strerror(errno));
    bool ok = fwrite(TRAILER_MAGIC, 1, 8, f) == 8 && fwrite(&size, 8, 1, f) == 1 &&
              fwrite(&hash, 8, 1, f) == 1;
    ok = (fflush(f) == 0) && ok && fsync(fileno(f)) == 0;
    if (fclose(f) != 0) ok = false;
    if (!ok) return jdt_err_set(e, JDT_ERR_IO, "compile cache: writing %s failed", path);
    return JDT_OK;
}

static int split_flags(char *flags, char **argv, int max)
{
    int n = 0;
    for (char *tok = strtok(flags, " \t"); tok && n < max; tok = strtok(NULL, " \t"))
        argv[n++] = tok;
    return n;
}

jdt_status jdt_compile_build(const jdt_compile_opts *o, const char *src, void **handle,
                             jdt_compile_stats *st, jdt_err *e)
{
    char dir[768], ver[256], cpu[8192], so[1024], tmp_c[1100], tmp_so[1100], log[1100];
    char flags_buf[1024];
    const char *cc = o->cc ? o->cc : (getenv("CC") && *getenv("CC") ? getenv("CC") : "cc");
    const char *flags = o->cflags ? o->cflags : DEFAULT_CFLAGS;
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
    snprintf(so, sizeof so, "%s/jdt-%016llx.so", dir, (unsigned long long)key);
    snprintf(st->so_path, sizeof st->so_path, "%s", so);

    if (entry_valid(so)) {
        *handle = dlopen(so, RTLD_NOW | RTLD_LOCAL);
        if (*handle) {
            st->cache_hit = true;
            return JDT_OK;
        }
        JDT_WARN("compile cache: %s does not load (%s); rebuilding", so, dlerror());
    }

    /* miss or corrupt: compile into a unique temporary, then rename into place */
    unsigned long long uniq =
        (unsigned long long)getpid() ^ ((unsigned long long)(jdt_now_s() * 1e9));
    snprintf(tmp_c, sizeof tmp_c, "%s/jdt-%016llx.%d.%llx.c", dir, (unsigned long long)key,
             (int)getpid(), uniq);
    snprintf(tmp_so, sizeof tmp_so, "%s/jdt-%016llx.%d.%llx.tmp", dir, (unsigned long long)key,
             (int)getpid(), uniq);
    snprintf(log, sizeof log, "%s/jdt-%016llx.%d.log", dir, (unsigned long long)key, (int)getpid());
    FILE *f = fopen(tmp_c, "w");
    if (!f) return jdt_err_set(e, JDT_ERR_IO, "compile cache: %s: %s", tmp_c, strerror(errno));
    bool wrote = fputs(src, f) >= 0;
    if (fclose(f) != 0 || !wrote) {
        unlink(tmp_c);
        return jdt_err_set(e, JDT_ERR_IO, "compile cache: writing %s failed", tmp_c);
    }
    int lfd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
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
    double t0 = jdt_now_s();
    sweep_stale(dir);
    int rc = run_cmd(argv, lfd, timeout_s);
    st->cc_s = jdt_now_s() - t0;
    close(lfd);
    if (rc == RUN_TIMED_OUT) {
        unlink(tmp_so);
        return jdt_err_set(e, JDT_ERR_TIMEOUT,
                           "compile: C compiler '%s' did not finish in %.0f s and was killed; its "
                           "output is in %s (source kept in %s)",
                           cc, timeout_s, log, tmp_c);
    }
    if (rc != 0) {
        unlink(tmp_so);
        s = jdt_err_set(e, JDT_ERR_COMPILE,
                        "compile: C compiler '%s' failed (exit %d); its output is in %s "
                        "(source kept in %s)",
                        cc, rc, log, tmp_c);
        return s;
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
    *handle = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    if (!*handle) return jdt_err_set(e, JDT_ERR_COMPILE, "compile: dlopen %s: %s", so, dlerror());
    st->cache_hit = false;
    return JDT_OK;
}
