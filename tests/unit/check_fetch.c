/*
 * check_fetch.c — unit tests for remote data (engine/io/fetch.h): SHA-256 against the FIPS
 * 180-4 examples, and downloads against a small HTTP/1.1 server written here (a forked
 * process on 127.0.0.1, one child per connection) that serves a folder with Range, If-Range
 * and ETag, HTML listings, and misbehaviour chosen by path prefix:
 *   /cut/F    the first response stops half-way through the body (a server that goes away)
 *   /e500/F   the first two requests get HTTP 500
 *   /stall/F  sends half the body, then nothing
 *   /slow/F   sends the body in 4 KiB pieces 20 ms apart
 * Every request is logged as "PATH RANGE STATUS" lines, which the tests read to check what
 * was asked for (one download for two processes, a Range that resumes a part).
 */
#include "core/core.h"
#include "io/data.h"
#include "io/fetch.h"
#include "testutil.h"

#include <arpa/inet.h>
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char g_dir[256], g_root[300], g_cache[300], g_log[300];
static pid_t g_server = -1;
static int g_port;

/* ---- the test server --------------------------------------------------------------------- */

static void send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w <= 0) return;
        c += w;
        n -= (size_t)w;
    }
}

static void msleep(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Requests for path logged so far. */
static int count_requests(const char *path)
{
    FILE *f = fopen(g_log, "r");
    if (!f) return 0;
    char line[1024], p[900];
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "%899s", p) == 1 && strcmp(p, path) == 0) n++;
    fclose(f);
    return n;
}

/* Requests for path answered with status. */
static int count_status(const char *path, int status)
{
    FILE *f = fopen(g_log, "r");
    if (!f) return 0;
    char line[1024], p[900], r[200];
    int n = 0, code;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "%899s %199s %d", p, r, &code) == 3 && strcmp(p, path) == 0 &&
            code == status)
            n++;
    fclose(f);
    return n;
}

static void log_request(const char *path, const char *range, int status)
{
    FILE *f = fopen(g_log, "a");
    if (!f) return;
    fprintf(f, "%s %s %d\n", path, range[0] ? range : "-", status);
    fclose(f);
}

static void reply_status(int fd, int status, const char *text)
{
    char h[256];
    int n =
        snprintf(h, sizeof h, "HTTP/1.1 %d %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                 status, text);
    send_all(fd, h, (size_t)n);
}

static void serve_listing(int fd, const char *dir)
{
    char body[16384];
    size_t n = (size_t)snprintf(body, sizeof body, "<html><body><a href=\"../\">../</a>\n");
    DIR *d = opendir(dir);
    for (struct dirent *de; d && (de = readdir(d));) {
        if (de->d_name[0] == '.') continue;
        bool sub = de->d_type == DT_DIR;
        n += (size_t)snprintf(body + n, sizeof body - n, "<a href=\"%s%s\">%s</a> 1 Dec 2026\n",
                              de->d_name, sub ? "/" : "", de->d_name);
    }
    if (d) closedir(d);
    n += (size_t)snprintf(body + n, sizeof body - n, "</body></html>\n");
    char h[256];
    int hn = snprintf(h, sizeof h,
                      "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %zu\r\n"
                      "Connection: close\r\n\r\n",
                      n);
    send_all(fd, h, (size_t)hn);
    send_all(fd, body, n);
}

static void handle(int fd)
{
    char req[8192] = "";
    size_t got = 0;
    while (got < sizeof req - 1 && !strstr(req, "\r\n\r\n")) {
        ssize_t r = recv(fd, req + got, sizeof req - 1 - got, 0);
        if (r <= 0) return;
        got += (size_t)r;
        req[got] = '\0';
    }
    char method[16], path[900];
    if (sscanf(req, "%15s %899s", method, path) != 2) return;
    char range[128] = "", if_range[256] = "", if_none[256] = "";
    for (char *l = strstr(req, "\r\n"); l; l = strstr(l + 2, "\r\n")) {
        if (strncasecmp(l + 2, "Range:", 6) == 0) sscanf(l + 8, " %127[^\r]", range);
        if (strncasecmp(l + 2, "If-Range:", 9) == 0) sscanf(l + 11, " %255[^\r]", if_range);
        if (strncasecmp(l + 2, "If-None-Match:", 14) == 0) sscanf(l + 16, " %255[^\r]", if_none);
    }
    int seen = count_requests(path);
    const char *mode = "", *rel = path;
    static const char *modes[] = {"/cut/", "/e500/", "/stall/", "/slow/"};
    for (size_t i = 0; i < sizeof modes / sizeof *modes; i++)
        if (strncmp(path, modes[i], strlen(modes[i])) == 0) {
            mode = modes[i];
            rel = path + strlen(modes[i]) - 1;
        }
    char file[1300];
    snprintf(file, sizeof file, "%s%s", g_root, rel);
    if (strcmp(mode, "/e500/") == 0 && seen < 2) {
        log_request(path, range, 500);
        reply_status(fd, 500, "Internal Server Error");
        return;
    }
    struct stat sb;
    if (stat(file, &sb) != 0) {
        log_request(path, range, 404);
        reply_status(fd, 404, "Not Found");
        return;
    }
    if (S_ISDIR(sb.st_mode)) {
        log_request(path, range, 200);
        serve_listing(fd, file);
        return;
    }
    char etag[64];
    snprintf(etag, sizeof etag, "\"%llx-%llx\"", (unsigned long long)sb.st_size,
             (unsigned long long)sb.st_mtime);
    long long size = (long long)sb.st_size, from = 0;
    if (if_none[0] && strcmp(if_none, etag) == 0) {
        log_request(path, range, 304);
        char h[200];
        int hn =
            snprintf(h, sizeof h,
                     "HTTP/1.1 304 Not Modified\r\nETag: %s\r\nConnection: close\r\n\r\n", etag);
        send_all(fd, h, (size_t)hn);
        return;
    }
    bool partial = range[0] && (!if_range[0] || strcmp(if_range, etag) == 0) &&
                   sscanf(range, "bytes=%lld-", &from) == 1;
    if (partial && from >= size) {
        log_request(path, range, 416);
        reply_status(fd, 416, "Range Not Satisfiable");
        return;
    }
    if (!partial) from = 0;
    int status = partial ? 206 : 200;
    log_request(path, range, status);
    char h[512];
    int hn = snprintf(h, sizeof h, "HTTP/1.1 %d %s\r\nContent-Length: %lld\r\nETag: %s\r\n", status,
                      partial ? "Partial Content" : "OK", size - from, etag);
    if (partial)
        hn += snprintf(h + hn, sizeof h - (size_t)hn, "Content-Range: bytes %lld-%lld/%lld\r\n",
                       from, size - 1, size);
    hn += snprintf(h + hn, sizeof h - (size_t)hn, "Connection: close\r\n\r\n");
    send_all(fd, h, (size_t)hn);
    if (strcmp(method, "HEAD") == 0) return;
    FILE *f = fopen(file, "rb");
    if (!f) return;
    fseek(f, (long)from, SEEK_SET);
    long long left = size - from, stop = left;
    if ((strcmp(mode, "/cut/") == 0 && seen == 0) || strcmp(mode, "/stall/") == 0) stop = left / 2;
    char buf[4096];
    for (long long sent = 0; sent < stop;) {
        size_t want =
            (size_t)(stop - sent < (long long)sizeof buf ? stop - sent : (long long)sizeof buf);
        size_t r = fread(buf, 1, want, f);
        if (r == 0) break;
        send_all(fd, buf, r);
        sent += (long long)r;
        if (strcmp(mode, "/slow/") == 0) msleep(20);
    }
    fclose(f);
    if (strcmp(mode, "/stall/") == 0) msleep(20000);
}

static void server_start(void)
{
    int s = tu_free_listener(&g_port);
    g_server = fork();
    ck_assert_int_ge(g_server, 0);
    if (g_server == 0) {
        signal(SIGCHLD, SIG_IGN); /* connection children are reaped by the kernel */
        for (;;) {
            int c = accept(s, NULL, NULL);
            if (c < 0) continue;
            pid_t p = fork();
            if (p == 0) {
                close(s);
                handle(c);
                shutdown(c, SHUT_RDWR);
                close(c);
                _exit(0);
            }
            close(c);
        }
    }
    close(s);
}

static void server_stop(void)
{
    if (g_server > 0) {
        kill(g_server, SIGKILL);
        waitpid(g_server, NULL, 0);
    }
    g_server = -1;
}

/* ---- fixture and helpers ----------------------------------------------------------------- */

static void setup(void)
{
    tu_tmpdir_make("check-fetch");
    snprintf(g_dir, sizeof g_dir, "%s", tu_tmpdir());
    snprintf(g_root, sizeof g_root, "%s/www", g_dir);
    snprintf(g_cache, sizeof g_cache, "%s/cache", g_dir);
    snprintf(g_log, sizeof g_log, "%s/requests.log", g_dir);
    ck_assert_int_eq(mkdir(g_root, 0755), 0);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    jdt_log_set_level(JDT_LOG_ERROR);
    server_start();
}

static void teardown(void)
{
    server_stop();
    tu_tmpdir_remove();
}

static jdt_fetch_opts opts(int retries, double timeout_s)
{
    jdt_fetch_opts o;
    jdt_fetch_opts_default(&o);
    o.cache_dir = g_cache;
    o.retries = retries;
    o.backoff_s = 0.01;
    o.timeout_s = timeout_s;
    return o;
}

static char *url_of(const char *path)
{
    static char buf[8][600];
    static int i;
    i = (i + 1) % 8;
    snprintf(buf[i], sizeof buf[i], "http://127.0.0.1:%d%s", g_port, path);
    return buf[i];
}

/* Writes n pseudo-random bytes to g_root/name; returns them (caller frees). */
static unsigned char *make_file(const char *name, size_t n)
{
    unsigned char *b = malloc(n);
    ck_assert_ptr_nonnull(b);
    uint64_t x = 0x9e3779b97f4a7c15ULL ^ n;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b[i] = (unsigned char)x;
    }
    char p[600];
    snprintf(p, sizeof p, "%s/%s", g_root, name);
    FILE *f = fopen(p, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(b, 1, n, f), n);
    fclose(f);
    return b;
}

static bool file_equals(const char *path, const unsigned char *want, size_t n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    unsigned char *b = malloc(n + 1);
    size_t r = fread(b, 1, n + 1, f);
    fclose(f);
    bool ok = r == n && memcmp(b, want, n) == 0;
    free(b);
    return ok;
}

static bool exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* An item for URL path p (no expectations) with its cache path. */
static jdt_fetch_item item(const char *p, char *local, size_t n)
{
    jdt_fetch_item it;
    memset(&it, 0, sizeof it);
    it.url = url_of(p);
    snprintf(local, n, "%s/data/127.0.0.1_%d%s", g_cache, g_port, p);
    it.local = local;
    it.name = strrchr(local, '/') + 1;
    it.n_bytes = it.n_units = -1;
    return it;
}

static void mkdir_for(const char *path)
{
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\"", path);
    ck_assert_int_eq(system(cmd), 0);
}

/* ---- tests ------------------------------------------------------------------------------- */

static const char *sha_of(const void *p, size_t n, char out[65])
{
    jdt_sha256 s = {0};
    ck_assert(jdt_sha256_init(&s));
    jdt_sha256_update(&s, p, n);
    ck_assert(jdt_sha256_hex(&s, out));
    jdt_sha256_free(&s);
    return out;
}

START_TEST(test_sha256_vectors)
{
    char h[65];
    ck_assert_str_eq(sha_of("", 0, h),
                     "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    ck_assert_str_eq(sha_of("abc", 3, h),
                     "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    ck_assert_str_eq(sha_of(two, strlen(two), h),
                     "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    /* a million 'a's fed in uneven pieces: the block buffering must not matter */
    char *a = malloc(1000000);
    memset(a, 'a', 1000000);
    jdt_sha256 s = {0};
    ck_assert(jdt_sha256_init(&s));
    for (size_t at = 0, step = 1; at < 1000000; at += step, step = step * 3 % 1000 + 1)
        jdt_sha256_update(&s, a + at, at + step > 1000000 ? 1000000 - at : step);
    ck_assert(jdt_sha256_hex(&s, h));
    ck_assert_str_eq(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    /* restarted after a finish, the same context hashes afresh */
    ck_assert(jdt_sha256_init(&s));
    jdt_sha256_update(&s, "abc", 3);
    ck_assert(jdt_sha256_hex(&s, h));
    ck_assert_str_eq(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    jdt_sha256_free(&s);
    jdt_sha256_free(&s); /* a freed digest is a no-op to free */
    free(a);
}
END_TEST

START_TEST(test_fetch_and_reuse)
{
    unsigned char *b = make_file("a.bin", 300000);
    char local[700], hex[65];
    jdt_fetch_item it = item("/a.bin", local, sizeof local);
    jdt_fetch_opts o = opts(0, 5);
    jdt_err e;
    ck_assert_int_eq(jdt_fetch_file(&o, &it, NULL, NULL, &e), JDT_OK);
    ck_assert(file_equals(local, b, 300000));
    /* with the size and digest known, the cached copy is used without a request */
    it.n_bytes = 300000;
    snprintf(it.sha256, sizeof it.sha256, "%s", sha_of(b, 300000, hex));
    ck_assert_int_eq(jdt_fetch_file(&o, &it, NULL, NULL, &e), JDT_OK);
    ck_assert_int_eq(count_requests("/a.bin"), 1);
    /* a damaged cached copy is noticed and fetched again */
    FILE *f = fopen(local, "r+b");
    fputc('!', f);
    fclose(f);
    char side[800];
    snprintf(side, sizeof side, "%s.sha256", local);
    unlink(side);
    ck_assert_int_eq(jdt_fetch_file(&o, &it, NULL, NULL, &e), JDT_OK);
    ck_assert(file_equals(local, b, 300000));
    ck_assert_int_eq(count_requests("/a.bin"), 2);
    free(b);
}
END_TEST

/* A cached file from a listing (no digest) is revalidated with its ETag: unchanged costs a 304
 * and keeps the copy; a file replaced on the server is fetched again. */
START_TEST(test_revalidate_listing_file)
{
    unsigned char *b = make_file("v.bin", 50000);
    char local[700];
    jdt_fetch_item it = item("/v.bin", local, sizeof local);
    jdt_fetch_opts o = opts(0, 5);
    jdt_err e;
    ck_assert_int_eq(jdt_fetch_file(&o, &it, NULL, NULL, &e), JDT_OK);
    ck_assert_int_eq(jdt_fetch_file(&o, &it, NULL, NULL, &e), JDT_OK);
    ck_assert(file_equals(local, b, 50000));
    FILE *lf = fopen(g_log, "r");
    char l1[256], l2[256];
    ck_assert_ptr_nonnull(fgets(l1, sizeof l1, lf));
    ck_assert_ptr_nonnull(fgets(l2, sizeof l2, lf));
    fclose(lf);
    ck_assert_str_eq(l2, "/v.bin - 304\n");
    free(b);
    b = make_file("v.bin", 40000); /* replaced: another size, so another ETag */
    ck_assert_int_eq(jdt_fetch_file(&o, &it, NULL, NULL, &e), JDT_OK);
    ck_assert(file_equals(local, b, 40000));
    ck_assert_int_eq(count_requests("/v.bin"), 3);
    free(b);
}
END_TEST

START_TEST(test_resume_part)
{
    unsigned char *b = make_file("r.bin", 200000);
    char local[700], part[800], hex[65];
    jdt_fetch_item it = item("/r.bin", local, sizeof local);
    it.n_bytes = 200000;
    snprintf(it.sha256, sizeof it.sha256, "%s", sha_of(b, 200000, hex));
    snprintf(part, sizeof part, "%s.part", local);
    mkdir_for(part);
    FILE *f = fopen(part, "wb");
    fwrite(b, 1, 120000, f);
    fclose(f);
    jdt_fetch_opts o = opts(0, 5);
    jdt_err e;
    ck_assert_int_eq(jdt_fetch_file(&o, &it, NULL, NULL, &e), JDT_OK);
    ck_assert(file_equals(local, b, 200000));
    ck_assert(!exists(part));
    FILE *lf = fopen(g_log, "r");
    char line[256];
    ck_assert_ptr_nonnull(fgets(line, sizeof line, lf));
    fclose(lf);
    ck_assert_str_eq(line, "/r.bin bytes=120000- 206\n"); /* only the rest was asked for */
    free(b);
}
END_TEST

/* A .part whose start is not the file's (left by an older version, no ETag to notice) fails
 * the digest once resumed: it is fetched again from byte 0, once. */
START_TEST(test_stale_part_restarts)
{
    unsigned char *b = make_file("p.bin", 90000);
    char local[700], part[800], hex[65];
    jdt_fetch_item it = item("/p.bin", local, sizeof local);
    it.n_bytes = 90000;
    snprintf(it.sha256, sizeof it.sha256, "%s", sha_of(b, 90000, hex));
    snprintf(part, sizeof part, "%s.part", local);
    mkdir_for(part);
    FILE *f = fopen(part, "wb");
    for (int i = 0; i < 30000; i++)
        fputc('x', f);
    fclose(f);
    jdt_fetch_opts o = opts(0, 5);
    jdt_err e;
    ck_assert_msg(jdt_fetch_file(&o, &it, NULL, NULL, &e) == JDT_OK, "%s", e.msg);
    ck_assert(file_equals(local, b, 90000));
    ck_assert_int_eq(count_status("/p.bin", 206), 1);
    ck_assert_int_eq(count_status("/p.bin", 200), 1);
    free(b);
}
END_TEST

START_TEST(test_cut_and_resumed)
{
    unsigned char *b = make_file("c.bin", 400000);
    char local[700];
    jdt_fetch_item it = item("/cut/c.bin", local, sizeof local);
    jdt_fetch_opts o = opts(2, 5);
    jdt_err e;
    ck_assert_int_eq(jdt_fetch_file(&o, &it, NULL, NULL, &e), JDT_OK);
    ck_assert(file_equals(local, b, 400000));
    ck_assert_int_eq(count_requests("/cut/c.bin"), 2);
    FILE *lf = fopen(g_log, "r");
    char l1[256], l2[256];
    ck_assert_ptr_nonnull(fgets(l1, sizeof l1, lf));
    ck_assert_ptr_nonnull(fgets(l2, sizeof l2, lf));
    fclose(lf);
    ck_assert_str_eq(l1, "/cut/c.bin - 200\n");
    ck_assert_str_eq(l2, "/cut/c.bin bytes=200000- 206\n");
    free(b);
}
END_TEST

START_TEST(test_retry_5xx)
{
    unsigned char *b = make_file("s.bin", 1000);
    char local[700];
    jdt_fetch_item it = item("/e500/s.bin", local, sizeof local);
    jdt_err e;
    jdt_fetch_opts o1 = opts(1, 5); /* two attempts, both get 500 */
    ck_assert_int_eq(jdt_fetch_file(&o1, &it, NULL, NULL, &e), JDT_ERR_NET);
    ck_assert_ptr_nonnull(strstr(e.msg, it.url));
    ck_assert_ptr_nonnull(strstr(e.msg, "HTTP 500"));
    ck_assert(!exists(local));
    jdt_fetch_opts o3 = opts(3, 5); /* the third request succeeds */
    ck_assert_int_eq(jdt_fetch_file(&o3, &it, NULL, NULL, &e), JDT_OK);
    ck_assert(file_equals(local, b, 1000));
    ck_assert_int_eq(count_requests("/e500/s.bin"), 3);
    free(b);
}
END_TEST

START_TEST(test_not_found)
{
    char local[700];
    jdt_fetch_item it = item("/missing.h5", local, sizeof local);
    jdt_fetch_opts o = opts(3, 5);
    jdt_err e;
    ck_assert_int_eq(jdt_fetch_file(&o, &it, NULL, NULL, &e), JDT_ERR_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(e.msg, it.url));
    ck_assert_ptr_nonnull(strstr(e.msg, "404"));
    ck_assert_int_eq(count_requests("/missing.h5"), 1); /* a 404 is not retried */
    ck_assert(!exists(local));
}
END_TEST

START_TEST(test_server_gone)
{
    char local[700];
    jdt_fetch_item it = item("/a.bin", local, sizeof local);
    server_stop();
    jdt_fetch_opts o = opts(2, 5);
    jdt_err e;
    ck_assert_int_eq(jdt_fetch_file(&o, &it, NULL, NULL, &e), JDT_ERR_NET);
    ck_assert_ptr_nonnull(strstr(e.msg, it.url));
    ck_assert_ptr_nonnull(strstr(e.msg, "gave up"));
    ck_assert(!exists(local));
}
END_TEST

START_TEST(test_stall_times_out)
{
    free(make_file("t.bin", 100000));
    char local[700], part[800];
    jdt_fetch_item it = item("/stall/t.bin", local, sizeof local);
    jdt_fetch_opts o = opts(0, 1);
    jdt_err e;
    double t0 = jdt_now_s();
    ck_assert_int_eq(jdt_fetch_file(&o, &it, NULL, NULL, &e), JDT_ERR_TIMEOUT);
    ck_assert(jdt_now_s() - t0 < 15); /* bounded by the stall timeout, not the server's 20 s */
    ck_assert_ptr_nonnull(strstr(e.msg, it.url));
    ck_assert(!exists(local));
    snprintf(part, sizeof part, "%s.part", local); /* what came is kept for a resume */
    struct stat sb;
    ck_assert_int_eq(stat(part, &sb), 0);
    ck_assert_int_eq(sb.st_size, 50000);
    ck_assert_ptr_nonnull(strstr(e.msg, "kept"));
}
END_TEST

START_TEST(test_checksum_and_size_refused)
{
    free(make_file("m.bin", 5000));
    char local[700], part[800];
    jdt_fetch_item it = item("/m.bin", local, sizeof local);
    snprintf(part, sizeof part, "%s.part", local);
    jdt_fetch_opts o = opts(0, 5);
    jdt_err e;
    memset(it.sha256, '0', 64);
    it.sha256[64] = '\0';
    ck_assert_int_eq(jdt_fetch_file(&o, &it, NULL, NULL, &e), JDT_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, "sha256"));
    ck_assert_ptr_nonnull(strstr(e.msg, it.url));
    ck_assert(!exists(local));
    ck_assert(!exists(part));
    it.sha256[0] = '\0';
    it.n_bytes = 4999;
    ck_assert_int_eq(jdt_fetch_file(&o, &it, NULL, NULL, &e), JDT_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, "4999"));
    ck_assert(!exists(local));
}
END_TEST

static bool keep_h5(const char *name, void *ctx)
{
    size_t n = strlen(name);
    return n > 3 && strcmp(name + n - 3, ".h5") == 0;
}

START_TEST(test_listing_and_manifest)
{
    char p[600];
    snprintf(p, sizeof p, "%s/ds", g_root);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/ds/sub", g_root);
    mkdir(p, 0755);
    const char *names[] = {"ds/train_10.h5", "ds/train_9.h5", "ds/val 0.h5", "ds/notes.txt",
                           "ds/sub/x.h5"};
    for (int i = 0; i < 5; i++)
        free(make_file(names[i], 10));
    jdt_fetch_opts o = opts(0, 5);
    jdt_fetch_list *l = NULL;
    jdt_err e;
    ck_assert_int_eq(jdt_fetch_resolve(&o, url_of("/ds"), keep_h5, NULL, &l, &e), JDT_OK);
    ck_assert_int_eq(l->n_items, 3);
    ck_assert_str_eq(l->items[0].name, "train_9.h5");
    ck_assert_str_eq(l->items[1].name, "train_10.h5");
    ck_assert_str_eq(l->items[2].name, "val 0.h5");
    ck_assert_str_eq(l->items[2].url, url_of("/ds/val%200.h5"));
    ck_assert_int_eq(l->items[0].n_bytes, -1);
    ck_assert(!l->manifest);
    jdt_fetch_list_free(l);

    /* an empty listing (no shards) */
    snprintf(p, sizeof p, "%s/empty", g_root);
    mkdir(p, 0755);
    ck_assert_int_eq(jdt_fetch_resolve(&o, url_of("/empty/"), keep_h5, NULL, &l, &e),
                     JDT_ERR_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(e.msg, url_of("/empty/")));
    /* a listing of folders only: says so */
    snprintf(p, sizeof p, "%s/empty/step_000100", g_root);
    mkdir(p, 0755);
    ck_assert_int_eq(jdt_fetch_resolve(&o, url_of("/empty/"), NULL, NULL, &l, &e),
                     JDT_ERR_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(e.msg, "only 1 folder(s), which are not followed"));
    /* a file linked twice is listed once */
    ck_assert_int_eq(
        jdt_fetch_parse(&o, url_of("/x/"),
                        "<a href=\"b.h5\">b</a><a href=\"a.h5\">a</a><a href=\"b.h5\">", NULL, NULL,
                        &l, &e),
        JDT_OK);
    ck_assert_int_eq(l->n_items, 2);
    ck_assert_str_eq(l->items[0].name, "a.h5");
    jdt_fetch_list_free(l);

    /* a page that is neither */
    free(make_file("plain.txt", 100));
    ck_assert_int_eq(jdt_fetch_resolve(&o, url_of("/plain.txt"), NULL, NULL, &l, &e),
                     JDT_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, "neither"));

    /* a manifest: sizes, digests, lengths; a listing holding one is read through it */
    snprintf(p, sizeof p, "%s/ds/manifest.txt", g_root);
    FILE *f = fopen(p, "w");
    fprintf(f, "%s\n# comment\ntrain_9.h5 10 %s 4\n\ntrain_10.h5 10 - -\n",
            JDT_FETCH_MANIFEST_MAGIC,
            "ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef0123456789");
    fclose(f);
    ck_assert_int_eq(jdt_fetch_resolve(&o, url_of("/ds/"), keep_h5, NULL, &l, &e), JDT_OK);
    ck_assert(l->manifest);
    ck_assert_int_eq(l->n_items, 2);
    ck_assert_int_eq(l->items[0].n_bytes, 10);
    ck_assert_int_eq(l->items[0].n_units, 4);
    ck_assert_str_eq(l->items[0].sha256,
                     "abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789");
    ck_assert_int_eq(l->items[1].n_units, -1);
    ck_assert_str_eq(l->items[1].url, url_of("/ds/train_10.h5"));
    jdt_fetch_list_free(l);
    f = fopen(p, "w");
    fprintf(f, "%s\ntrain_9.h5 10 - 4\ntrain_10.h5 ten - -\n", JDT_FETCH_MANIFEST_MAGIC);
    fclose(f);
    ck_assert_int_eq(jdt_fetch_resolve(&o, url_of("/ds/manifest.txt"), NULL, NULL, &l, &e),
                     JDT_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, "manifest.txt:3:"));
    f = fopen(p, "w");
    fprintf(f, "%s\n../etc/passwd 10 - 4\n", JDT_FETCH_MANIFEST_MAGIC);
    fclose(f);
    ck_assert_int_eq(jdt_fetch_resolve(&o, url_of("/ds/manifest.txt"), NULL, NULL, &l, &e),
                     JDT_ERR_FORMAT);
    const char *folder_names[] = {"sub/", "a//b.h5", "/abs.h5", "./x.h5"}; /* found by fuzz_fetch */
    for (int i = 0; i < 4; i++) {
        char body[200];
        snprintf(body, sizeof body, "%s\n%s 10 - 4\n", JDT_FETCH_MANIFEST_MAGIC, folder_names[i]);
        ck_assert_int_eq(jdt_fetch_parse(&o, url_of("/m.txt"), body, NULL, NULL, &l, &e),
                         JDT_ERR_FORMAT);
        ck_assert_ptr_nonnull(strstr(e.msg, "must be relative"));
    }
    ck_assert_int_eq(jdt_fetch_resolve(&o, url_of("/nothing/"), NULL, NULL, &l, &e),
                     JDT_ERR_NOT_FOUND);

    /* the file beside a shard, a listing or a manifest (the tokenizer.json of remote data) */
    unsigned char *tj = make_file("ds/tokenizer.json", 77);
    const char *from[] = {"/ds/train_9.h5", "/ds/", "/ds", "/ds/manifest.txt"};
    for (int i = 0; i < 4; i++) {
        char *local = NULL;
        ck_assert_int_eq(jdt_fetch_beside(&o, url_of(from[i]), "tokenizer.json", &local, &e),
                         JDT_OK);
        ck_assert(file_equals(local, tj, 77));
        jdt_free(local);
    }
    /* fetched once, then revalidated from the cache (304) */
    ck_assert_int_eq(count_status("/ds/tokenizer.json", 200), 1);
    ck_assert_int_eq(count_status("/ds/tokenizer.json", 304), 3);
    free(tj);
}
END_TEST

START_TEST(test_one_download_for_two_processes)
{
    unsigned char *b = make_file("big.bin", 120000); /* ~0.6 s through /slow/ */
    char local[700];
    jdt_fetch_item it = item("/slow/big.bin", local, sizeof local);
    jdt_fetch_opts o = opts(0, 10);
    pid_t kids[2];
    for (int k = 0; k < 2; k++) {
        kids[k] = fork();
        ck_assert_int_ge(kids[k], 0);
        if (kids[k] == 0) {
            jdt_err e;
            _exit(jdt_fetch_file(&o, &it, NULL, NULL, &e) == JDT_OK ? 0 : 1);
        }
    }
    for (int k = 0; k < 2; k++) {
        int status;
        ck_assert_int_eq(waitpid(kids[k], &status, 0), kids[k]);
        ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    ck_assert(file_equals(local, b, 120000));
    /* one download; the process that waited revalidates the copy (a 304, no body) */
    ck_assert_int_eq(count_status("/slow/big.bin", 200), 1);
    ck_assert_int_eq(count_status("/slow/big.bin", 304), 1);
    free(b);
}
END_TEST

/* A remote dataset gives the same batches as the same files read locally: from a manifest
 * (streamed: the loader waits per shard) and from a bare listing (all shards first). */
START_TEST(test_remote_dataset_equals_local)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/tok", g_root);
    mkdir(dir, 0755);
    const int64_t n_tok = 3000;
    uint32_t *t = malloc(n_tok * sizeof *t);
    for (int s = 0; s < 3; s++) {
        for (int64_t i = 0; i < n_tok; i++)
            t[i] = (uint32_t)((i * 7 + s * 13) % 251);
        char p[700];
        snprintf(p, sizeof p, "%s/train_%03d.h5", dir, s);
        ck_assert_int_eq(jdt_data_write_tokens(p, t, n_tok - s * 100, 256, "byte", NULL), JDT_OK);
    }
    free(t);
    jdt_err e;
    ck_assert_int_eq(jdt_fetch_write_manifest(dir, &e), JDT_OK);
    jdt_fetch_opts fo = opts(0, 5);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) { /* a listing without a manifest, into a fresh cache */
            char p[700];
            snprintf(p, sizeof p, "%s/manifest.txt", dir);
            unlink(p);
            snprintf(g_cache, sizeof g_cache, "%s/cache2", g_dir);
            fo.cache_dir = g_cache;
        }
        jdt_data_opts lo = {.path = dir,
                            .split = "train",
                            .kind = JDT_DATA_KIND_TOKENS,
                            .seq_len = 16,
                            .global_batch = 8,
                            .seed = 3,
                            .shuffle = true,
                            .prefetch = 2};
        jdt_data_opts ro = lo;
        ro.path = url_of("/tok/");
        ro.fetch = &fo;
        jdt_data *ld = NULL, *rd = NULL;
        ck_assert_int_eq(jdt_data_open(&lo, &ld, &e), JDT_OK);
        ck_assert_msg(jdt_data_open(&ro, &rd, &e) == JDT_OK, "%s", e.msg);
        jdt_data_info li, ri;
        jdt_data_get_info(ld, &li);
        jdt_data_get_info(rd, &ri);
        ck_assert_int_eq(li.n_units, ri.n_units);
        ck_assert_int_eq(ri.n_files, 3);
        for (int64_t k = 0; k < 80; k++) {
            jdt_data_batch lb, rb;
            ck_assert_int_eq(jdt_data_get(ld, k, &lb, &e), JDT_OK);
            ck_assert_msg(jdt_data_get(rd, k, &rb, &e) == JDT_OK, "%s", e.msg);
            ck_assert_mem_eq(lb.x, rb.x, 8 * 16 * sizeof(int32_t));
            ck_assert_mem_eq(lb.y, rb.y, 8 * 16 * sizeof(int32_t));
        }
        jdt_data_close(ld);
        jdt_data_close(rd);
    }
}
END_TEST

/* Training can start once the first shard is local: through /slow/ (about 200 kB/s) the open
 * returns after shard 0 while shard 2 is still to come; batch 0 reads at once; a batch in
 * shard 2 waits for it and equals the local read. */
START_TEST(test_remote_streams)
{
    char dir[600], p[700];
    snprintf(dir, sizeof dir, "%s/big", g_root);
    mkdir(dir, 0755);
    const int64_t n_tok = 100000; /* 200 kB per shard */
    uint32_t *t = malloc(n_tok * sizeof *t);
    for (int s = 0; s < 3; s++) {
        for (int64_t i = 0; i < n_tok; i++)
            t[i] = (uint32_t)((i * 31 + s) % 256);
        snprintf(p, sizeof p, "%s/train_%d.h5", dir, s);
        ck_assert_int_eq(jdt_data_write_tokens(p, t, n_tok, 256, "byte", NULL), JDT_OK);
    }
    free(t);
    jdt_err e;
    ck_assert_int_eq(jdt_fetch_write_manifest(dir, &e), JDT_OK);
    jdt_fetch_opts fo = opts(0, 10);
    jdt_data_opts lo = {
        .path = dir, .kind = JDT_DATA_KIND_TOKENS, .seq_len = 16, .global_batch = 8, .prefetch = 1};
    jdt_data_opts ro = lo;
    ro.path = url_of("/slow/big/");
    ro.fetch = &fo;
    jdt_data *ld = NULL, *rd = NULL;
    ck_assert_int_eq(jdt_data_open(&lo, &ld, &e), JDT_OK);
    ck_assert_msg(jdt_data_open(&ro, &rd, &e) == JDT_OK, "%s", e.msg);
    char last[700];
    snprintf(last, sizeof last, "%s/data/127.0.0.1_%d/slow/big/train_2.h5", g_cache, g_port);
    ck_assert(!exists(last));
    jdt_data_batch lb, rb;
    ck_assert_int_eq(jdt_data_get(rd, 0, &rb, &e), JDT_OK);
    ck_assert_int_eq(jdt_data_get(ld, 0, &lb, &e), JDT_OK);
    ck_assert_mem_eq(lb.x, rb.x, 8 * 16 * sizeof(int32_t));
    ck_assert(!exists(last));
    int64_t k = (2 * n_tok / 16) / 8 + 3; /* a batch inside shard 2 */
    ck_assert_msg(jdt_data_get(rd, k, &rb, &e) == JDT_OK, "%s", e.msg);
    ck_assert(exists(last));
    ck_assert_int_eq(jdt_data_get(ld, k, &lb, &e), JDT_OK);
    ck_assert_mem_eq(lb.x, rb.x, 8 * 16 * sizeof(int32_t));
    ck_assert_mem_eq(lb.y, rb.y, 8 * 16 * sizeof(int32_t));
    jdt_data_close(ld);
    jdt_data_close(rd);
}
END_TEST

/* A manifest whose length for a later shard is wrong: the read that reaches it fails with a
 * line naming the shard's URL (and the loader never reads past the file). */
START_TEST(test_remote_wrong_length)
{
    char dir[600], p[700];
    snprintf(dir, sizeof dir, "%s/bad", g_root);
    mkdir(dir, 0755);
    uint32_t t[500];
    for (int i = 0; i < 500; i++)
        t[i] = (uint32_t)(i % 200);
    for (int s = 0; s < 2; s++) {
        snprintf(p, sizeof p, "%s/train_%d.h5", dir, s);
        ck_assert_int_eq(jdt_data_write_tokens(p, t, 500, 256, "byte", NULL), JDT_OK);
    }
    snprintf(p, sizeof p, "%s/manifest.txt", dir);
    FILE *f = fopen(p, "w");
    fprintf(f, "%s\ntrain_0.h5 - - 500\ntrain_1.h5 - - 600\n", JDT_FETCH_MANIFEST_MAGIC);
    fclose(f);
    jdt_fetch_opts fo = opts(0, 5);
    jdt_data_opts o = {.path = url_of("/bad/"),
                       .kind = JDT_DATA_KIND_TOKENS,
                       .seq_len = 10,
                       .global_batch = 4,
                       .fetch = &fo};
    jdt_data *d = NULL;
    jdt_err e;
    ck_assert_int_eq(jdt_data_open(&o, &d, &e), JDT_OK);
    jdt_status st = JDT_OK;
    for (int64_t k = 0; k < 40 && st == JDT_OK; k++) {
        jdt_data_batch b;
        st = jdt_data_get(d, k, &b, &e);
    }
    ck_assert_int_eq(st, JDT_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, url_of("/bad/train_1.h5")));
    ck_assert_ptr_nonnull(strstr(e.msg, "manifest says 600"));
    jdt_data_close(d);
}
END_TEST

/* Every allocation failure in a remote open, its background downloads and a read that waits
 * for a later shard ends as ERR_NOMEM (or success), never a crash or a leak (ASan build). */
START_TEST(test_alloc_failures)
{
    char dir[600], p[700];
    snprintf(dir, sizeof dir, "%s/af", g_root);
    mkdir(dir, 0755);
    uint32_t t[400];
    for (int i = 0; i < 400; i++)
        t[i] = (uint32_t)(i % 97);
    for (int s = 0; s < 3; s++) {
        snprintf(p, sizeof p, "%s/train_%d.h5", dir, s);
        ck_assert_int_eq(jdt_data_write_tokens(p, t, 400, 256, "byte", NULL), JDT_OK);
    }
    jdt_err e;
    ck_assert_int_eq(jdt_fetch_write_manifest(dir, &e), JDT_OK);
    int n_nomem = 0, n_ok = 0;
    for (long n = 1; n < 400 && n_ok < 3; n++) {
        char cache[700];
        snprintf(cache, sizeof cache, "%s/afcache/%ld", g_dir, n); /* nothing cached yet */
        jdt_fetch_opts fo = opts(0, 5);
        fo.cache_dir = cache;
        jdt_data_opts o = {.path = url_of("/af/"),
                           .kind = JDT_DATA_KIND_TOKENS,
                           .seq_len = 10,
                           .global_batch = 4,
                           .prefetch = 1,
                           .fetch = &fo};
        jdt_data *d = NULL;
        jdt_alloc_fail_after(n);
        jdt_status st = jdt_data_open(&o, &d, &e);
        if (st == JDT_OK) {
            jdt_data_batch b;
            st = jdt_data_get(d, 70, &b, &e); /* rows in shard 2 */
        }
        jdt_alloc_fail_after(0);
        ck_assert_msg(st == JDT_OK || st == JDT_ERR_NOMEM, "n=%ld: %s", n, e.msg);
        if (st == JDT_OK)
            n_ok++;
        else
            n_nomem++;
        jdt_data_close(d);
    }
    ck_assert_int_gt(n_nomem, 20);
    ck_assert_int_eq(n_ok, 3);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("fetch");
    TCase *tc = tcase_create("fetch");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_sha256_vectors);
    tcase_add_test(tc, test_fetch_and_reuse);
    tcase_add_test(tc, test_revalidate_listing_file);
    tcase_add_test(tc, test_resume_part);
    tcase_add_test(tc, test_stale_part_restarts);
    tcase_add_test(tc, test_cut_and_resumed);
    tcase_add_test(tc, test_retry_5xx);
    tcase_add_test(tc, test_not_found);
    tcase_add_test(tc, test_server_gone);
    tcase_add_test(tc, test_stall_times_out);
    tcase_add_test(tc, test_checksum_and_size_refused);
    tcase_add_test(tc, test_listing_and_manifest);
    tcase_add_test(tc, test_one_download_for_two_processes);
    tcase_add_test(tc, test_remote_dataset_equals_local);
    tcase_add_test(tc, test_remote_streams);
    tcase_add_test(tc, test_remote_wrong_length);
    tcase_add_test(tc, test_alloc_failures);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
