/*
 * fetch.c — the libcurl client behind remote data (fetch.h, docs/data.md "Remote data"):
 * downloading one file into the cache (lock, resume, retries, verification), resolving a URL
 * into files (one file, an HTML listing, a manifest), mirroring a folder for init_from, and the
 * background downloader a remote dataset's loader waits on.
 *
 * A download writes "<local>.part" and renames it to "<local>" only once it is complete and
 * matches the expected size and sha256. A later attempt (a retry, or another run after a kill)
 * continues the part with "Range: bytes=N-", guarded by "If-Range: <ETag>" (the ETag is kept in
 * "<local>.part.etag"), so a file that changed on the server is fetched whole again. The
 * processes of a host serialise on an flock of "<local>.lock": the first downloads, the others
 * find the complete file when they get the lock.
 */
#include "io/fetch.h"
#include "io/io-impl.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { MAX_TEXT_BYTES = 16 << 20, HASH_BLOCK = 1 << 20 };

void jdt_fetch_opts_default(jdt_fetch_opts *o)
{
    memset(o, 0, sizeof *o);
    o->retries = 5;
    o->backoff_s = 1.0;
    o->timeout_s = 30.0;
}

bool jdt_fetch_is_url(const char *s)
{
    return s && (strncasecmp(s, "http://", 7) == 0 || strncasecmp(s, "https://", 8) == 0);
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init(void)
{
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static jdt_status need_curl(jdt_err *e)
{
    pthread_once(&curl_once, curl_init);
    if (curl_init_rc != CURLE_OK)
        return jdt_err_set(e, JDT_ERR_INTERNAL, "libcurl: %s", curl_easy_strerror(curl_init_rc));
    return JDT_OK;
}

static bool cancelled(const int *cancel)
{
    return cancel && __atomic_load_n(cancel, __ATOMIC_ACQUIRE);
}

/* Sleeps s seconds in short steps; false if cancelled meanwhile. */
static bool nap(double s, const int *cancel)
{
    double end = jdt_now_s() + s;
    while (jdt_now_s() < end) {
        if (cancelled(cancel)) return false;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return !cancelled(cancel);
}

/* ---- URLs and cache paths ---------------------------------------------------------------- */

static char *cache_root(const jdt_fetch_opts *o, char *buf, size_t n)
{
    const char *d = o->cache_dir && *o->cache_dir ? o->cache_dir : getenv("JDT_CACHE_DIR");
    if (d && *d)
        snprintf(buf, n, "%s", d);
    else if (getenv("XDG_CACHE_HOME") && *getenv("XDG_CACHE_HOME"))
        snprintf(buf, n, "%s/jdt-train", getenv("XDG_CACHE_HOME"));
    else if (getenv("HOME") && *getenv("HOME"))
        snprintf(buf, n, "%s/.cache/jdt-train", getenv("HOME"));
    else
        snprintf(buf, n, "/tmp/jdt-train-cache");
    return buf;
}

/* True if a relative name is safe to use under a cache folder: no empty, "." or ".."
 * segment, no leading '/', no control characters. */
static bool safe_name(const char *s)
{
    if (!*s || *s == '/') return false;
    for (const char *p = s; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) return false;
    const char *seg = s;
    for (;;) {
        const char *end = strchr(seg, '/');
        size_t n = end ? (size_t)(end - seg) : strlen(seg);
        if (n == 0) return false; /* "a//b" or a trailing '/' (a folder, not a file) */
        if ((n == 1 && seg[0] == '.') || (n == 2 && seg[0] == '.' && seg[1] == '.')) return false;
        if (!end) return true;
        seg = end + 1;
    }
}

/* The cache path of url: ROOT/data/HOST[_PORT]/PATH (percent-decoded). A URL whose path ends
 * in '/' gives a folder path (without the trailing slash). */
static jdt_status local_path(const jdt_fetch_opts *o, const char *url, char **out, jdt_err *e)
{
    *out = NULL;
    CURLU *u = curl_url();
    char *host = NULL, *port = NULL, *path = NULL;
    jdt_status st = JDT_OK;
    if (!u) return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", url);
    if (curl_url_set(u, CURLUPART_URL, url, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_PATH, &path, CURLU_URLDECODE) != CURLUE_OK) {
        st = jdt_err_set(e, JDT_ERR_CONFIG, "%s: not a valid URL", url);
        goto out;
    }
    curl_url_get(u, CURLUPART_PORT, &port, 0);
    const char *rel = path[0] == '/' ? path + 1 : path;
    size_t rl = strlen(rel);
    char relbuf[2048];
    snprintf(relbuf, sizeof relbuf, "%.*s", (int)(rl && rel[rl - 1] == '/' ? rl - 1 : rl), rel);
    if (relbuf[0] && !safe_name(relbuf)) {
        st = jdt_err_set(e, JDT_ERR_CONFIG, "%s: the URL path has an empty, '.' or '..' part", url);
        goto out;
    }
    for (char *h = host; *h; h++)
        if (*h == '/' || *h == ':' || *h == '[' || *h == ']') *h = '_';
    char root[1024];
    cache_root(o, root, sizeof root);
    size_t n = strlen(root) + strlen(host) + (port ? strlen(port) : 0) + strlen(relbuf) + 16;
    if (!(*out = jdt_malloc(n))) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", url);
        goto out;
    }
    snprintf(*out, n, "%s/data/%s%s%s%s%s", root, host, port ? "_" : "", port ? port : "",
             relbuf[0] ? "/" : "", relbuf);
out:
    curl_free(host);
    curl_free(port);
    curl_free(path);
    curl_url_cleanup(u);
    return st;
}

/* base (ending in '/') + name, percent-encoding what is not unreserved or '/'. */
static char *join_url(const char *base, const char *name)
{
    size_t bl = strlen(base), n = bl + 3 * strlen(name) + 1;
    char *s = jdt_malloc(n);
    if (!s) return NULL;
    memcpy(s, base, bl);
    char *p = s + bl;
    static const char hex[] = "0123456789ABCDEF";
    for (const unsigned char *q = (const unsigned char *)name; *q; q++) {
        if ((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') ||
            strchr("-._~/", *q)) {
            *p++ = (char)*q;
        } else {
            *p++ = '%';
            *p++ = hex[*q >> 4];
            *p++ = hex[*q & 15];
        }
    }
    *p = '\0';
    return s;
}

/* Decodes %XX escapes in place. */
static void url_decode(char *s)
{
    char *w = s;
    for (char *r = s; *r; r++) {
        unsigned hi, lo;
        if (*r == '%' && r[1] && r[2] && sscanf(r + 1, "%1x%1x", &hi, &lo) == 2) {
            *w++ = (char)(hi * 16 + lo);
            r += 2;
        } else {
            *w++ = *r;
        }
    }
    *w = '\0';
}

/* ---- one HTTP transfer ------------------------------------------------------------------- */

typedef struct {
    /* file mode */
    int fd;          /* the .part, or -1 in memory mode */
    int64_t offset;  /* bytes of the part before this response's body */
    int64_t written; /* body bytes written by this response */
    jdt_sha256 *sha; /* continued over the body when non-NULL */
    bool started, bad_range;
    int write_errno;
    /* memory mode */
    char *mem;
    size_t mem_len, mem_cap;
    bool too_big;
    /* response */
    long status;
    int64_t range_start, total;
    char etag[256];
    /* progress and cancel */
    const int *cancel;
    jdt_progress *prog;
    double prog_base; /* bytes of earlier files, for a progress over a list */
    bool prog_sized;  /* the progress total comes from this transfer (one file, size unknown) */
} xfer;

static size_t on_header(char *buf, size_t size, size_t n, void *ctx)
{
    xfer *x = ctx;
    size_t len = size * n;
    char line[512];
    snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line ? len : sizeof line - 1), buf);
    line[strcspn(line, "\r\n")] = '\0';
    if (strncmp(line, "HTTP/", 5) == 0) { /* a new response (after a redirect or 100) */
        const char *sp = strchr(line, ' ');
        x->status = sp ? strtol(sp + 1, NULL, 10) : 0;
        x->range_start = x->total = -1;
        x->etag[0] = '\0';
    } else if (strncasecmp(line, "content-range:", 14) == 0) {
        long long a, b, t;
        const char *v = line + 14;
        while (*v == ' ')
            v++;
        if (sscanf(v, "bytes %lld-%lld/%lld", &a, &b, &t) == 3) {
            x->range_start = a;
            x->total = t;
        }
    } else if (strncasecmp(line, "content-length:", 15) == 0) {
        if (x->status == 200) x->total = strtoll(line + 15, NULL, 10);
    } else if (strncasecmp(line, "etag:", 5) == 0) {
        const char *v = line + 5;
        while (*v == ' ')
            v++;
        snprintf(x->etag, sizeof x->etag, "%.255s", v);
    }
    return len;
}

static size_t on_body(char *buf, size_t size, size_t n, void *ctx)
{
    xfer *x = ctx;
    size_t len = size * n;
    if (cancelled(x->cancel)) return 0;
    if (x->fd < 0) {
        if (x->mem_len + len > MAX_TEXT_BYTES) {
            x->too_big = true;
            return 0;
        }
        if (x->mem_len + len + 1 > x->mem_cap) {
            size_t cap = (x->mem_len + len + 1) * 2;
            char *m = jdt_realloc(x->mem, cap);
            if (!m) {
                x->write_errno = ENOMEM;
                return 0;
            }
            x->mem = m;
            x->mem_cap = cap;
        }
        memcpy(x->mem + x->mem_len, buf, len);
        x->mem_len += len;
        x->mem[x->mem_len] = '\0';
        return len;
    }
    if (!x->started) {
        x->started = true;
        if (x->status == 206) {
            if (x->range_start != x->offset) {
                x->bad_range = true;
                return 0;
            }
        } else if (x->offset > 0) { /* the whole file came back (If-Range, or no Range support) */
            if (ftruncate(x->fd, 0) != 0) {
                x->write_errno = errno;
                return 0;
            }
            x->offset = 0;
            if (x->sha && !jdt_sha256_init(x->sha)) {
                x->write_errno = ENOMEM;
                return 0;
            }
        }
    }
    for (size_t done = 0; done < len;) {
        ssize_t w = pwrite(x->fd, buf + done, len - done, (off_t)(x->offset + x->written));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            x->write_errno = w < 0 ? errno : EIO;
            return 0;
        }
        done += (size_t)w;
        x->written += w;
    }
    if (x->sha) jdt_sha256_update(x->sha, buf, len);
    return len;
}

static int on_progress(void *ctx, curl_off_t dl_total, curl_off_t dl_now, curl_off_t ul_total,
                       curl_off_t ul_now)
{
    xfer *x = ctx;
    if (cancelled(x->cancel)) return 1;
    if (!x->prog) return 0;
    if (x->prog_sized && dl_total > 0) x->prog->total = (double)(x->offset + dl_total) / 1e6;
    jdt_progress_update(x->prog, (x->prog_base + (double)(x->offset + dl_now)) / 1e6);
    return 0;
}

/* Sets up an easy handle for url with our transfer policy. */
static CURL *easy(const jdt_fetch_opts *o, const char *url, xfer *x, char *errbuf)
{
    CURL *c = curl_easy_init();
    if (!c) return NULL;
    long timeout_ms = (long)(o->timeout_s * 1000);
    long stall_s = (long)(o->timeout_s + 0.999);
    curl_easy_setopt(c, CURLOPT_URL, url);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(c, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 5L);
    curl_easy_setopt(c, CURLOPT_FAILONERROR, 1L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms > 0 ? timeout_ms : 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, stall_s > 0 ? stall_s : 1L);
    /* TLS: verify the peer and the host name against the system's CA store (libcurl's
     * default, stated here so it can never be lost); CURL_CA_BUNDLE names another CA file. */
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 2L);
    const char *ca = getenv("CURL_CA_BUNDLE");
    if (ca && *ca) curl_easy_setopt(c, CURLOPT_CAINFO, ca);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "jdt-train/" JDT_VERSION_STRING);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, x);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_BUFFERSIZE, 512L * 1024); /* fewer, larger writes */
    errbuf[0] = '\0';
    return c;
}

typedef enum { OUTCOME_OK, OUTCOME_RETRY, OUTCOME_RESTART, OUTCOME_FAIL } outcome;

/* libcurl's results that mean "try again": the connection failed, was reset, or the transfer
 * ended early. (libcurl's CURLcode has ~100 values, most for other protocols: a table of the
 * ones we treat specially, not a switch over all of them.) */
static const CURLcode TRANSIENT[] = {
    CURLE_COULDNT_CONNECT, CURLE_COULDNT_RESOLVE_HOST, CURLE_RECV_ERROR, CURLE_SEND_ERROR,
    CURLE_PARTIAL_FILE,    CURLE_GOT_NOTHING,          CURLE_HTTP2,      CURLE_HTTP2_STREAM};
/* ... and those that mean the server's certificate was not accepted */
static const CURLcode TLS_REFUSED[] = {CURLE_PEER_FAILED_VERIFICATION, CURLE_SSL_CACERT_BADFILE,
                                       CURLE_SSL_CERTPROBLEM, CURLE_SSL_ISSUER_ERROR};

static bool one_of(CURLcode rc, const CURLcode *set, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (set[i] == rc) return true;
    return false;
}

/* Sorts a finished transfer into done, retry (transient), restart (retry from byte 0) or
 * fail, with the status and a short description of what went wrong. */
static outcome classify(CURLcode rc, long http, const xfer *x, const char *errbuf,
                        const jdt_fetch_opts *o, jdt_status *st, char *what, size_t n)
{
    const char *detail = errbuf[0] ? errbuf : curl_easy_strerror(rc);
    *st = JDT_ERR_NET;
    if (rc == CURLE_OK) return OUTCOME_OK;
    if (rc == CURLE_HTTP_RETURNED_ERROR) {
        snprintf(what, n, "HTTP %ld", http);
        if (http == 416) return OUTCOME_RESTART; /* our part is longer than the file */
        if (http == 408 || http == 429 || http >= 500) return OUTCOME_RETRY;
        if (http == 404 || http == 410) {
            *st = JDT_ERR_NOT_FOUND;
            snprintf(what, n, "HTTP %ld: no such file on the server", http);
        } else if (http == 401 || http == 403) {
            *st = JDT_ERR_AUTH;
            snprintf(what, n, "HTTP %ld: access denied", http);
        }
        return OUTCOME_FAIL;
    }
    if (rc == CURLE_WRITE_ERROR || rc == CURLE_ABORTED_BY_CALLBACK) {
        if (cancelled(x->cancel)) {
            *st = JDT_ERR_INTERRUPTED;
            snprintf(what, n, "download interrupted");
            return OUTCOME_FAIL;
        }
        if (x->bad_range) {
            snprintf(what, n, "the server answered a different byte range");
            return OUTCOME_RESTART;
        }
        if (x->too_big) {
            *st = JDT_ERR_FORMAT;
            snprintf(what, n, "the page is larger than %d MiB", MAX_TEXT_BYTES >> 20);
            return OUTCOME_FAIL;
        }
        *st = x->write_errno == ENOMEM ? JDT_ERR_NOMEM : JDT_ERR_IO;
        snprintf(what, n, "writing the download: %s",
                 x->write_errno ? strerror(x->write_errno) : "out of memory");
        return OUTCOME_FAIL;
    }
    if (rc == CURLE_OPERATION_TIMEDOUT) {
        *st = JDT_ERR_TIMEOUT;
        snprintf(what, n, "timed out: no data for %g s (%s)", o->timeout_s, detail);
        return OUTCOME_RETRY;
    }
    if (one_of(rc, TRANSIENT, JDT_ARRAY_LEN(TRANSIENT))) {
        snprintf(what, n, "%s", detail);
        return OUTCOME_RETRY;
    }
    if (one_of(rc, TLS_REFUSED, JDT_ARRAY_LEN(TLS_REFUSED))) {
        *st = JDT_ERR_AUTH;
        snprintf(what, n,
                 "TLS verification failed (%s); add the server's CA to the system store or "
                 "point CURL_CA_BUNDLE at it",
                 detail);
        return OUTCOME_FAIL;
    }
    if (rc == CURLE_UNSUPPORTED_PROTOCOL || rc == CURLE_URL_MALFORMAT) *st = JDT_ERR_CONFIG;
    snprintf(what, n, "%s", detail);
    return OUTCOME_FAIL;
}

/* curl_easy_perform with SIGPIPE blocked in the calling thread and any SIGPIPE it raised
 * consumed: with CURLOPT_NOSIGNAL (needed with threads) libcurl does not ignore SIGPIPE, and a
 * TLS write to a peer that has gone must come back as an error, not kill the process. */
static CURLcode perform(CURL *c)
{
    sigset_t pipe_set, old;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    CURLcode rc = curl_easy_perform(c);
    struct timespec zero = {0, 0};
    while (sigtimedwait(&pipe_set, NULL, &zero) > 0) {
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

static double backoff(const jdt_fetch_opts *o, int attempt)
{
    double s = o->backoff_s;
    for (int i = 1; i < attempt && s < 30; i++)
        s *= 2;
    return s < 30 ? s : 30;
}

/* GETs a small text (a listing or manifest) into memory, with the retry policy. *body and
 * *effective (the URL after redirects) are jdt_malloc'd; caller frees. */
static jdt_status get_text(const jdt_fetch_opts *o, const char *url, char **body, char **effective,
                           jdt_err *e)
{
    *body = *effective = NULL;
    jdt_status st = need_curl(e);
    if (st != JDT_OK) return st;
    char errbuf[CURL_ERROR_SIZE], what[512];
    for (int attempt = 0;; attempt++) {
        xfer x;
        memset(&x, 0, sizeof x);
        x.fd = -1;
        CURL *c = easy(o, url, &x, errbuf);
        if (!c) return jdt_err_set(e, JDT_ERR_NOMEM, "%s: cannot start libcurl", url);
        CURLcode rc = perform(c);
        long http = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &http);
        outcome oc = classify(rc, http, &x, errbuf, o, &st, what, sizeof what);
        if (oc == OUTCOME_OK) {
            char *eff = NULL;
            curl_easy_getinfo(c, CURLINFO_EFFECTIVE_URL, &eff);
            *effective = jdt_strdup(eff ? eff : url);
            *body = x.mem ? x.mem : jdt_strdup("");
            curl_easy_cleanup(c);
            if (!*effective || !*body) {
                jdt_free(*effective);
                jdt_free(*body);
                *body = *effective = NULL;
                return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", url);
            }
            return JDT_OK;
        }
        jdt_free(x.mem);
        curl_easy_cleanup(c);
        if (oc == OUTCOME_FAIL || attempt >= o->retries)
            return oc == OUTCOME_FAIL ? jdt_err_set(e, st, "%s: %s", url, what)
                                      : jdt_err_set(e, st, "%s: %s (gave up after %d attempts)",
                                                    url, what, attempt + 1);
        double wait = backoff(o, attempt + 1);
        JDT_WARN("%s: %s (attempt %d of %d); retrying in %.1f s", url, what, attempt + 1,
                 o->retries + 1, wait);
        if (!nap(wait, NULL)) return jdt_err_set(e, JDT_ERR_INTERRUPTED, "%s: interrupted", url);
    }
}

/* ---- one file into the cache ------------------------------------------------------------- */

static int64_t file_size(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode) ? (int64_t)sb.st_size : -1;
}

/* Hashes the first n_bytes of fd into s (restarted; the caller frees s). */
static jdt_status hash_fd(int fd, int64_t n_bytes, jdt_sha256 *s, const char *path, jdt_err *e)
{
    if (!jdt_sha256_init(s))
        return jdt_err_set(e, JDT_ERR_NOMEM, "%s: cannot start a SHA-256 digest", path);
    char *buf = jdt_malloc(HASH_BLOCK);
    if (!buf) return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", path);
    jdt_status st = JDT_OK;
    for (int64_t at = 0; at < n_bytes;) {
        size_t want = n_bytes - at < HASH_BLOCK ? (size_t)(n_bytes - at) : HASH_BLOCK;
        ssize_t r = pread(fd, buf, want, (off_t)at);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            st = jdt_err_set(e, JDT_ERR_IO, "%s: reading: %s", path,
                             r < 0 ? strerror(errno) : "unexpected end of file");
            break;
        }
        jdt_sha256_update(s, buf, (size_t)r);
        at += r;
    }
    jdt_free(buf);
    return st;
}

static void read_small(const char *path, char *buf, size_t n)
{
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f) return;
    if (!fgets(buf, (int)n, f)) buf[0] = '\0';
    fclose(f);
    buf[strcspn(buf, "\r\n")] = '\0';
}

static void write_small(const char *path, const char *text)
{
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    bool ok = fprintf(f, "%s\n", text) > 0;
    ok = fclose(f) == 0 && ok;
    if (ok)
        rename(tmp, path);
    else
        unlink(tmp);
}

/* True if the cached file at it->local is complete and matches what is expected of it. A
 * file with a known sha256 is hashed once; the result is remembered in "<local>.sha256". A
 * mismatching file is removed. A file with no digest to check (from a listing) but an ETag
 * recorded when it was fetched is not ok yet: *revalidate gets the ETag, for a conditional
 * request (If-None-Match) that costs one round trip when the file has not changed. */
static jdt_status cached_ok(const jdt_fetch_item *it, bool *ok, char *revalidate, size_t n,
                            jdt_err *e)
{
    *ok = false;
    revalidate[0] = '\0';
    int64_t size = file_size(it->local);
    if (size < 0) return JDT_OK;
    if (it->n_bytes >= 0 && size != it->n_bytes) goto stale;
    if (!it->sha256[0]) {
        char side[1200];
        snprintf(side, sizeof side, "%s.etag", it->local);
        read_small(side, revalidate, n);
        if (strncmp(revalidate, "W/", 2) == 0) revalidate[0] = '\0'; /* weak: not comparable */
        *ok = revalidate[0] == '\0';
        return JDT_OK;
    }
    char side[1200], seen[80];
    snprintf(side, sizeof side, "%s.sha256", it->local);
    read_small(side, seen, sizeof seen);
    if (strcmp(seen, it->sha256) == 0) {
        *ok = true;
        return JDT_OK;
    }
    int fd = open(it->local, O_RDONLY);
    if (fd < 0) return jdt_err_set(e, JDT_ERR_IO, "%s: %s", it->local, strerror(errno));
    jdt_sha256 s = {0};
    char hex[65] = "";
    jdt_status st = hash_fd(fd, size, &s, it->local, e);
    close(fd);
    if (st == JDT_OK) jdt_sha256_hex(&s, hex);
    jdt_sha256_free(&s);
    if (st != JDT_OK) return st;
    if (strcmp(hex, it->sha256) == 0) {
        write_small(side, hex);
        *ok = true;
        return JDT_OK;
    }
stale:
    JDT_INFO("%s: the cached copy %s is stale; fetching it again", it->url, it->local);
    unlink(it->local);
    return JDT_OK;
}

/* Takes the flock on "<local>.lock", waiting (cancel-aware) while another process holds it. */
static jdt_status lock_entry(const jdt_fetch_item *it, const int *cancel, int *fd_out, jdt_err *e)
{
    char path[1200];
    snprintf(path, sizeof path, "%s.lock", it->local);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return jdt_err_set(e, JDT_ERR_IO, "%s: %s", path, strerror(errno));
    bool told = false;
    while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno != EWOULDBLOCK && errno != EINTR) {
            /* a file system without flock: go on unlocked rather than fail */
            if (errno == ENOLCK || errno == EOPNOTSUPP) break;
            jdt_status st = jdt_err_set(e, JDT_ERR_IO, "%s: flock: %s", path, strerror(errno));
            close(fd);
            return st;
        }
        if (!told) JDT_INFO("%s: another process is downloading it; waiting", it->url);
        told = true;
        if (!nap(0.1, cancel)) {
            close(fd);
            return jdt_err_set(e, JDT_ERR_INTERRUPTED, "%s: interrupted", it->url);
        }
    }
    *fd_out = fd;
    return JDT_OK;
}

/* Downloads it->url into "<local>.part" and renames it into place once verified; lock held.
 * if_none_match (or ""): the ETag of the cached copy; a 304 answer keeps that copy. */
static jdt_status download(const jdt_fetch_opts *o, const jdt_fetch_item *it, const int *cancel,
                           jdt_progress *prog, double prog_base, bool prog_sized,
                           const char *if_none_match, jdt_err *e)
{
    char part[1200], etag_path[1200], etag[256], errbuf[CURL_ERROR_SIZE], what[600];
    snprintf(part, sizeof part, "%s.part", it->local);
    snprintf(etag_path, sizeof etag_path, "%s.part.etag", it->local);
    read_small(etag_path, etag, sizeof etag);
    int fd = open(part, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return jdt_err_set(e, JDT_ERR_IO, "%s: %s", part, strerror(errno));
    jdt_status st = JDT_OK;
    bool want_sha = it->sha256[0] != '\0';
    jdt_sha256 sha = {0};
    int64_t hashed = -1; /* bytes of the part the running sha covers */
    int64_t have = 0;
    double t0 = jdt_now_s();
    int64_t start_at = -1;
    bool restarted = false;
again:
    for (int attempt = 0;; attempt++) {
        struct stat sb;
        if (fstat(fd, &sb) != 0) {
            st = jdt_err_set(e, JDT_ERR_IO, "%s: %s", part, strerror(errno));
            goto out;
        }
        have = (int64_t)sb.st_size;
        if (it->n_bytes >= 0 && have > it->n_bytes) {
            if (ftruncate(fd, 0) != 0) {
                st = jdt_err_set(e, JDT_ERR_IO, "%s: %s", part, strerror(errno));
                goto out;
            }
            have = 0;
        }
        if (start_at < 0) start_at = have;
        if (want_sha && hashed != have) {
            if ((st = hash_fd(fd, have, &sha, part, e))) goto out;
            hashed = have;
        }
        if (it->n_bytes >= 0 && have == it->n_bytes) break; /* complete from an earlier run */
        xfer x;
        memset(&x, 0, sizeof x);
        x.fd = fd;
        x.offset = have;
        x.sha = want_sha ? &sha : NULL;
        x.cancel = cancel;
        x.prog = prog;
        x.prog_base = prog_base;
        x.prog_sized = prog_sized;
        CURL *c = easy(o, it->url, &x, errbuf);
        struct curl_slist *hdrs = NULL;
        if (!c) {
            st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: cannot start libcurl", it->url);
            goto out;
        }
        char range[64], if_range[300], inm[300];
        if (have == 0 && if_none_match[0]) {
            snprintf(inm, sizeof inm, "If-None-Match: %s", if_none_match);
            hdrs = curl_slist_append(hdrs, inm);
            curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
        }
        if (have > 0) {
            snprintf(range, sizeof range, "%lld-", (long long)have);
            curl_easy_setopt(c, CURLOPT_RANGE, range);
            if (etag[0] && strncmp(etag, "W/", 2) != 0) {
                snprintf(if_range, sizeof if_range, "If-Range: %s", etag);
                hdrs = curl_slist_append(hdrs, if_range);
                curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
            }
        }
        CURLcode rc = perform(c);
        long http = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &http);
        curl_easy_cleanup(c);
        curl_slist_free_all(hdrs);
        if (x.etag[0] && strcmp(x.etag, etag) != 0) {
            snprintf(etag, sizeof etag, "%s", x.etag);
            write_small(etag_path, etag);
        }
        if (want_sha) hashed = x.offset + x.written;
        outcome oc = classify(rc, http, &x, errbuf, o, &st, what, sizeof what);
        if (oc == OUTCOME_OK && http == 304) { /* the cached copy is current */
            JDT_DEBUG("%s: unchanged since it was cached (ETag %s)", it->url, if_none_match);
            st = JDT_OK;
            goto out_delete;
        }
        if (oc == OUTCOME_OK) {
            int64_t got = x.offset + x.written;
            if (x.total < 0 || got == x.total) break;
            st = JDT_ERR_NET;
            snprintf(what, sizeof what, "the transfer ended at byte %lld of %lld", (long long)got,
                     (long long)x.total);
            oc = OUTCOME_RETRY;
        }
        if (oc == OUTCOME_RESTART) {
            if (ftruncate(fd, 0) != 0) {
                st = jdt_err_set(e, JDT_ERR_IO, "%s: %s", part, strerror(errno));
                goto out;
            }
            unlink(etag_path);
            etag[0] = '\0';
        }
        if (oc == OUTCOME_FAIL || attempt >= o->retries) {
            int64_t kept = file_size(part);
            if (oc == OUTCOME_FAIL)
                st = jdt_err_set(e, st, "%s: %s", it->url, what);
            else if (kept <= 0)
                st = jdt_err_set(e, st, "%s: %s (gave up after %d attempts)", it->url, what,
                                 attempt + 1);
            else
                st = jdt_err_set(e, st,
                                 "%s: %s (gave up after %d attempts; %lld bytes kept in %s, the "
                                 "next run resumes there)",
                                 it->url, what, attempt + 1, (long long)kept, part);
            goto out;
        }
        double wait = backoff(o, attempt + 1);
        JDT_WARN("%s: %s (attempt %d of %d); retrying in %.1f s", it->url, what, attempt + 1,
                 o->retries + 1, wait);
        if (!nap(wait, cancel)) {
            st = jdt_err_set(e, JDT_ERR_INTERRUPTED, "%s: interrupted", it->url);
            goto out;
        }
    }
    /* complete: verify, then make it visible */
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = jdt_err_set(e, JDT_ERR_IO, "%s: %s", part, strerror(errno));
        goto out;
    }
    have = (int64_t)sb.st_size;
    char hex[65] = "";
    if (want_sha && hashed != have && (st = hash_fd(fd, have, &sha, part, e))) goto out;
    if (want_sha) jdt_sha256_hex(&sha, hex);
    bool bad = (it->n_bytes >= 0 && have != it->n_bytes) || (want_sha && strcmp(hex, it->sha256));
    if (bad && start_at > 0 && !restarted) {
        /* a part left by an earlier run whose start no longer matches (a server without ETags
         * changed the file): once, from byte 0 */
        JDT_WARN("%s: the resumed download does not match the manifest; fetching it again from "
                 "the start",
                 it->url);
        if (ftruncate(fd, 0) != 0) {
            st = jdt_err_set(e, JDT_ERR_IO, "%s: %s", part, strerror(errno));
            goto out;
        }
        unlink(etag_path);
        etag[0] = '\0';
        hashed = start_at = -1;
        restarted = true;
        goto again;
    }
    if (it->n_bytes >= 0 && have != it->n_bytes) {
        st = jdt_err_set(e, JDT_ERR_FORMAT,
                         "%s: the server sent %lld bytes but the manifest says %lld; the "
                         "download was deleted",
                         it->url, (long long)have, (long long)it->n_bytes);
        goto out_delete;
    }
    if (want_sha && strcmp(hex, it->sha256) != 0) {
        st = jdt_err_set(e, JDT_ERR_FORMAT,
                         "%s: sha256 %s does not match the manifest's %s; the download was "
                         "deleted",
                         it->url, hex, it->sha256);
        goto out_delete;
    }
    if (fsync(fd) != 0 || rename(part, it->local) != 0) {
        st = jdt_err_set(e, JDT_ERR_IO, "%s: %s", it->local, strerror(errno));
        goto out;
    }
    /* the ETag of what is now cached, for revalidating a copy that has no digest to check */
    char etag_done[1200];
    snprintf(etag_done, sizeof etag_done, "%s.etag", it->local);
    if (!etag[0] || rename(etag_path, etag_done) != 0) unlink(etag_done);
    unlink(etag_path);
    if (want_sha) {
        char side[1200];
        snprintf(side, sizeof side, "%s.sha256", it->local);
        write_small(side, hex);
    }
    double dt = jdt_now_s() - t0;
    JDT_DEBUG("fetched %s: %.1f MB in %.1f s%s", it->url, (double)(have - start_at) / 1e6, dt,
              start_at > 0 ? " (resumed)" : "");
    close(fd);
    jdt_sha256_free(&sha);
    return JDT_OK;
out_delete:
    unlink(part);
    unlink(etag_path);
out:
    close(fd);
    jdt_sha256_free(&sha);
    return st;
}

/* prog_base: bytes of a list's earlier files; prog_sized: the progress total is this file's
 * size, taken from the response (a one-file progress whose size was not known up front). */
static jdt_status fetch_one(const jdt_fetch_opts *o, const jdt_fetch_item *it, const int *cancel,
                            jdt_progress *prog, double prog_base, bool prog_sized, jdt_err *e)
{
    jdt_status st = need_curl(e);
    if (st != JDT_OK) return st;
    char *dir = jdt_strdup(it->local);
    if (!dir) return jdt_err_set(e, JDT_ERR_NOMEM, "out of memory");
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    st = slash ? jdt_io_mkdir_p(dir, e) : JDT_OK;
    jdt_free(dir);
    if (st != JDT_OK) return st;
    int lock = -1;
    if ((st = lock_entry(it, cancel, &lock, e))) return st;
    bool ok;
    char etag[256];
    if ((st = cached_ok(it, &ok, etag, sizeof etag, e)) == JDT_OK && !ok)
        st = download(o, it, cancel, prog, prog_base, prog_sized, etag, e);
    if (lock >= 0) close(lock); /* releases the flock */
    return st;
}

jdt_status jdt_fetch_file(const jdt_fetch_opts *o, const jdt_fetch_item *it, const int *cancel,
                          jdt_progress *progress, jdt_err *e)
{
    jdt_err err_local_; /* e may be NULL: keep the detail locally */
    if (!e) e = &err_local_;
    return fetch_one(o, it, cancel, progress, 0, progress && progress->total <= 0, e);
}

/* ---- resolving a URL --------------------------------------------------------------------- */

void jdt_fetch_list_free(jdt_fetch_list *l)
{
    if (!l) return;
    for (int64_t i = 0; i < l->n_items; i++) {
        jdt_free(l->items[i].name);
        jdt_free(l->items[i].url);
        jdt_free(l->items[i].local);
    }
    jdt_free(l->items);
    jdt_free(l->url);
    jdt_free(l->local_dir);
    jdt_free(l);
}

/* Appends an item name under base_url / local_dir. */
static jdt_status add_item(jdt_fetch_list *l, const char *base_url, const char *name,
                           int64_t n_bytes, const char *sha, int64_t n_units, jdt_err *e)
{
    int64_t n = l->n_items;
    if ((n & (n - 1)) == 0) { /* 0, 1, 2, 4, ...: double the array (listings of 100k files) */
        jdt_fetch_item *items = jdt_realloc(l->items, (size_t)(n ? 2 * n : 1) * sizeof *items);
        if (!items) return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", l->url);
        l->items = items;
    }
    jdt_fetch_item *items = l->items;
    jdt_fetch_item *it = &items[l->n_items];
    memset(it, 0, sizeof *it);
    it->name = jdt_strdup(name);
    it->url = join_url(base_url, name);
    it->local = jdt_io_join(l->local_dir, name);
    it->n_bytes = n_bytes;
    it->n_units = n_units;
    snprintf(it->sha256, sizeof it->sha256, "%s", sha ? sha : "");
    l->n_items++;
    if (!it->name || !it->url || !it->local)
        return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", l->url);
    return JDT_OK;
}

static bool parse_i64(const char *s, int64_t *out)
{
    if (strcmp(s, "-") == 0) {
        *out = -1;
        return true;
    }
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < 0) return false;
    *out = v;
    return true;
}

/* Reads a manifest body; base_url ends in '/'. */
static jdt_status parse_manifest(jdt_fetch_list *l, const char *url, const char *base_url,
                                 char *body, jdt_fetch_filter keep, void *ctx, jdt_err *e)
{
    int lineno = 0;
    char *save = NULL;
    for (char *line = strtok_r(body, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        lineno++;
        line[strcspn(line, "\r")] = '\0';
        if (lineno == 1) {
            if (strcmp(line, JDT_FETCH_MANIFEST_MAGIC) != 0)
                return jdt_err_set(e, JDT_ERR_FORMAT, "%s:1: not a jdt manifest (expected '%s')",
                                   url, JDT_FETCH_MANIFEST_MAGIC);
            continue;
        }
        char *p = line;
        while (*p == ' ' || *p == '\t')
            p++;
        if (!*p || *p == '#') continue;
        char name[1024], bytes[32], sha[80], units[32], extra[8];
        int nf = sscanf(p, "%1023s %31s %79s %31s %7s", name, bytes, sha, units, extra);
        int64_t n_bytes, n_units;
        if (nf != 4 || !parse_i64(bytes, &n_bytes) || !parse_i64(units, &n_units))
            return jdt_err_set(e, JDT_ERR_FORMAT,
                               "%s:%d: expected 'NAME N_BYTES SHA256 N_UNITS' (sizes are "
                               "integers, '-' for unknown), got '%.200s'",
                               url, lineno, p);
        if (strcmp(sha, "-") == 0) {
            sha[0] = '\0';
        } else {
            bool hex = strlen(sha) == 64;
            for (char *c = sha; hex && *c; c++) {
                if (*c >= 'A' && *c <= 'F') *c = (char)(*c - 'A' + 'a');
                hex = (*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f');
            }
            if (!hex)
                return jdt_err_set(e, JDT_ERR_FORMAT,
                                   "%s:%d: '%s' is not a sha256 (64 hex digits) or '-'", url,
                                   lineno, sha);
        }
        if (!safe_name(name))
            return jdt_err_set(e, JDT_ERR_FORMAT,
                               "%s:%d: file name '%s' must be relative, without '.' or '..'", url,
                               lineno, name);
        if (keep && !keep(name, ctx)) continue;
        jdt_status st = add_item(l, base_url, name, n_bytes, sha, n_units, e);
        if (st != JDT_OK) return st;
    }
    if (lineno == 0) return jdt_err_set(e, JDT_ERR_FORMAT, "%s: empty manifest", url);
    l->manifest = true;
    return JDT_OK;
}

/* The hrefs of an HTML listing that name files in its own folder, decoded. */
static jdt_status parse_listing(const char *body, char ***names, size_t *n_names, size_t *n_folders,
                                jdt_err *e, const char *url)
{
    *names = NULL;
    *n_names = *n_folders = 0;
    for (const char *p = body; (p = strcasestr(p, "href=")) != NULL;) {
        p += 5;
        char q = *p;
        if (q != '"' && q != '\'') continue;
        const char *end = strchr(++p, q);
        if (!end) break;
        size_t n = (size_t)(end - p);
        char *h = jdt_malloc(n + 1);
        if (!h) return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", url);
        memcpy(h, p, n);
        h[n] = '\0';
        p = end + 1;
        bool skip =
            !n || h[0] == '?' || h[0] == '#' || strchr(h, '/') || strchr(h, '?') || strchr(h, ':');
        /* a link to a subfolder ("name/"): not followed, only counted for the error message */
        if (skip && n > 1 && h[n - 1] == '/' && !memchr(h, '/', n - 1) && !strchr(h, '?') &&
            !strchr(h, ':') && strcmp(h, "../") != 0 && strcmp(h, "./") != 0)
            (*n_folders)++;
        if (!skip) {
            url_decode(h);
            skip = !safe_name(h) || strchr(h, '/');
        }
        if (skip) {
            jdt_free(h);
            continue;
        }
        size_t k = *n_names;
        if ((k & (k - 1)) == 0) { /* 0, 1, 2, 4, ...: double */
            char **nn = jdt_realloc(*names, (k ? 2 * k : 1) * sizeof *nn);
            if (!nn) {
                jdt_free(h);
                return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", url);
            }
            *names = nn;
        }
        (*names)[(*n_names)++] = h;
    }
    return JDT_OK;
}

/* Reads body, what url returned from effective (the URL after redirects), into l: a manifest
 * or an HTML listing, under l->local_dir (set here). A listing that links the manifest name
 * sets *manifest_url (caller frees) and adds nothing, unless manifest_url is NULL. */
static jdt_status parse_body(const jdt_fetch_opts *o, const char *url, const char *effective,
                             char *body, jdt_fetch_filter keep, void *keep_ctx, jdt_fetch_list *l,
                             char **manifest_url, jdt_err *e)
{
    char *base = NULL, **names = NULL;
    size_t n_names = 0, el = strlen(effective);
    jdt_status st = JDT_OK;
    bool manifest = strncmp(body, JDT_FETCH_MANIFEST_MAGIC, strlen(JDT_FETCH_MANIFEST_MAGIC)) == 0;
    /* the folder URL items are relative to */
    if (!(base = jdt_malloc(el + 2))) goto oom;
    memcpy(base, effective, el + 1);
    char *qq = strpbrk(base, "?#");
    if (qq) *qq = '\0';
    if (manifest) {
        char *slash = strrchr(base, '/');
        if (slash) slash[1] = '\0';
    } else if (!strlen(base) || base[strlen(base) - 1] != '/') {
        strcat(base, "/");
    }
    jdt_free(l->local_dir);
    l->local_dir = NULL;
    if ((st = local_path(o, base, &l->local_dir, e))) goto out;
    if (manifest) {
        st = parse_manifest(l, url, base, body, keep, keep_ctx, e);
    } else if (strcasestr(body, "<html") || strcasestr(body, "<a ")) {
        size_t n_folders = 0;
        if ((st = parse_listing(body, &names, &n_names, &n_folders, e, url))) goto out;
        l->n_folders = (int64_t)n_folders;
        bool has_manifest = false;
        for (size_t i = 0; i < n_names && manifest_url; i++)
            has_manifest |= strcmp(names[i], JDT_FETCH_MANIFEST_NAME) == 0;
        if (has_manifest) { /* sizes, checksums and lengths: the caller reads the manifest */
            if (!(*manifest_url = join_url(base, JDT_FETCH_MANIFEST_NAME))) goto oom;
        } else {
            /* sorted, then duplicates (a listing may link a file twice) are adjacent */
            if (n_names > 1) qsort(names, n_names, sizeof *names, jdt_io_natural_cmp);
            for (size_t i = 0; i < n_names && st == JDT_OK; i++)
                if ((i == 0 || strcmp(names[i], names[i - 1]) != 0) &&
                    (!keep || keep(names[i], keep_ctx)))
                    st = add_item(l, base, names[i], -1, NULL, -1, e);
        }
    } else {
        st = jdt_err_set(e, JDT_ERR_FORMAT,
                         "%s: neither a .h5 file, a jdt manifest (first line '%s') nor an HTML "
                         "directory listing",
                         url, JDT_FETCH_MANIFEST_MAGIC);
    }
    goto out;
oom:
    st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", url);
out:
    jdt_io_names_free(names, n_names);
    jdt_free(base);
    return st;
}

static jdt_status check_not_empty(const jdt_fetch_list *l, const char *url, bool filtered,
                                  jdt_err *e)
{
    if (l->n_items > 0) return JDT_OK;
    if (!l->manifest && l->n_folders > 0)
        return jdt_err_set(e, JDT_ERR_NOT_FOUND,
                           "%s: the directory listing names no %sfiles, only %lld folder(s), "
                           "which are not followed: give the URL of the folder that holds the "
                           "files",
                           url, filtered ? "matching " : "", (long long)l->n_folders);
    return jdt_err_set(e, JDT_ERR_NOT_FOUND, "%s: the %s names no %sfiles", url,
                       l->manifest ? "manifest" : "directory listing", filtered ? "matching " : "");
}

jdt_status jdt_fetch_parse(const jdt_fetch_opts *o, const char *url, const char *body,
                           jdt_fetch_filter keep, void *keep_ctx, jdt_fetch_list **out, jdt_err *e)
{
    jdt_err err_local_; /* e may be NULL: keep the detail locally */
    if (!e) e = &err_local_;
    *out = NULL;
    jdt_status st = need_curl(e);
    if (st != JDT_OK) return st;
    jdt_fetch_list *l = jdt_calloc(1, sizeof *l);
    char *copy = jdt_strdup(body);
    if (!l || !copy || !(l->url = jdt_strdup(url))) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", url);
    } else {
        st = parse_body(o, url, url, copy, keep, keep_ctx, l, NULL, e);
        if (st == JDT_OK) st = check_not_empty(l, url, keep != NULL, e);
    }
    jdt_free(copy);
    if (st != JDT_OK) {
        jdt_fetch_list_free(l);
        return st;
    }
    *out = l;
    return JDT_OK;
}

jdt_status jdt_fetch_resolve(const jdt_fetch_opts *o, const char *url, jdt_fetch_filter keep,
                             void *keep_ctx, jdt_fetch_list **out, jdt_err *e)
{
    jdt_err err_local_; /* e may be NULL: keep the detail locally */
    if (!e) e = &err_local_;
    *out = NULL;
    if (!jdt_fetch_is_url(url))
        return jdt_err_set(e, JDT_ERR_CONFIG, "%s: not an http:// or https:// URL", url);
    jdt_status st = need_curl(e);
    if (st != JDT_OK) return st;
    char *body = NULL, *eff = NULL, *murl = NULL;
    jdt_fetch_list *l = jdt_calloc(1, sizeof *l);
    if (!l || !(l->url = jdt_strdup(url))) goto oom;
    size_t ul = strlen(url);
    const char *q = strpbrk(url, "?#");
    size_t path_end = q ? (size_t)(q - url) : ul;
    if (path_end > 3 && strncmp(url + path_end - 3, ".h5", 3) == 0) {
        /* one shard: its folder is the list's folder */
        char *local = NULL;
        if ((st = local_path(o, url, &local, e))) goto fail;
        char *slash = strrchr(local, '/');
        *slash = '\0';
        l->local_dir = local;
        jdt_fetch_item *it = l->items = jdt_calloc(1, sizeof *it);
        if (!it) goto oom;
        l->n_items = 1;
        const char *nm = url + path_end;
        while (nm > url && nm[-1] != '/')
            nm--;
        it->name = jdt_malloc(path_end - (size_t)(nm - url) + 1);
        if (!it->name) goto oom;
        snprintf(it->name, path_end - (size_t)(nm - url) + 1, "%s", nm);
        url_decode(it->name);
        it->url = jdt_strdup(url);
        it->local = jdt_io_join(l->local_dir, it->name);
        it->n_bytes = it->n_units = -1;
        if (!it->url || !it->local) goto oom;
        *out = l;
        return JDT_OK;
    }
    if ((st = get_text(o, url, &body, &eff, e))) goto fail;
    if ((st = parse_body(o, url, eff, body, keep, keep_ctx, l, &murl, e))) goto fail;
    if (murl) { /* a listing with a manifest: read through the manifest */
        jdt_free(body);
        jdt_free(eff);
        body = eff = NULL;
        if ((st = get_text(o, murl, &body, &eff, e)) ||
            (st = parse_body(o, murl, eff, body, keep, keep_ctx, l, NULL, e)))
            goto fail;
        if (!l->manifest) {
            st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: not a jdt manifest (expected first line '%s')",
                             murl, JDT_FETCH_MANIFEST_MAGIC);
            goto fail;
        }
    }
    if ((st = check_not_empty(l, url, keep != NULL, e))) goto fail;
    jdt_free(murl);
    jdt_free(body);
    jdt_free(eff);
    *out = l;
    return JDT_OK;
oom:
    st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", url);
fail:
    jdt_free(murl);
    jdt_free(body);
    jdt_free(eff);
    jdt_fetch_list_free(l);
    return st;
}

/* Sum of the known sizes, or -1 when any is unknown. */
static int64_t list_bytes(const jdt_fetch_list *l)
{
    int64_t sum = 0;
    for (int64_t i = 0; i < l->n_items; i++) {
        if (l->items[i].n_bytes < 0) return -1;
        sum += l->items[i].n_bytes;
    }
    return sum;
}

jdt_status jdt_fetch_mirror(const jdt_fetch_opts *o, const char *url, char **local_dir, jdt_err *e)
{
    jdt_err err_local_; /* e may be NULL: keep the detail locally */
    if (!e) e = &err_local_;
    *local_dir = NULL;
    jdt_fetch_list *l = NULL;
    jdt_status st = jdt_fetch_resolve(o, url, NULL, NULL, &l, e);
    if (st != JDT_OK) return st;
    jdt_progress prog;
    char what[96];
    snprintf(what, sizeof what, "fetch %.80s", url);
    int64_t total = list_bytes(l);
    jdt_progress_begin(&prog, what, total >= 0 ? (double)total / 1e6 : 0, "MB");
    double base = 0;
    for (int64_t i = 0; i < l->n_items && st == JDT_OK; i++) {
        st = fetch_one(o, &l->items[i], NULL, &prog, base, l->n_items == 1 && total < 0, e);
        int64_t sz = file_size(l->items[i].local);
        base += sz > 0 ? (double)sz : 0;
    }
    jdt_progress_end(&prog);
    if (st == JDT_OK) {
        bool one = l->n_items == 1 && strcmp(l->items[0].url, url) == 0;
        *local_dir = jdt_strdup(one ? l->items[0].local : l->local_dir);
        if (!*local_dir) st = jdt_err_set(e, JDT_ERR_NOMEM, "out of memory");
    }
    jdt_fetch_list_free(l);
    return st;
}

jdt_status jdt_fetch_beside(const jdt_fetch_opts *o, const char *url, const char *name,
                            char **local, jdt_err *e)
{
    jdt_err err_local_; /* e may be NULL: keep the detail locally */
    if (!e) e = &err_local_;
    *local = NULL;
    jdt_fetch_opts def;
    if (!o) {
        jdt_fetch_opts_default(&def);
        o = &def;
    }
    size_t n = strcspn(url, "?#");
    char *base = jdt_malloc(n + 2);
    if (!base) return jdt_err_set(e, JDT_ERR_NOMEM, "out of memory");
    memcpy(base, url, n);
    base[n] = '\0';
    char *last = strrchr(base, '/');
    if (n && base[n - 1] != '/') {
        if (last && strchr(last, '.') && last > base + 8)
            last[1] = '\0';
        else
            strcat(base, "/");
    }
    jdt_fetch_item it;
    memset(&it, 0, sizeof it);
    it.name = (char *)name;
    it.url = join_url(base, name);
    it.n_bytes = it.n_units = -1;
    jdt_status st = it.url ? local_path(o, it.url, &it.local, e)
                           : jdt_err_set(e, JDT_ERR_NOMEM, "out of memory");
    if (st == JDT_OK) st = fetch_one(o, &it, NULL, NULL, 0, false, e);
    if (st == JDT_OK)
        *local = it.local;
    else
        jdt_free(it.local);
    jdt_free(it.url);
    jdt_free(base);
    return st;
}

/* ---- writing a manifest ------------------------------------------------------------------ */

static bool manifest_entry(const char *name, void *ctx)
{
    size_t n = strlen(name);
    return (n > 3 && strcmp(name + n - 3, ".h5") == 0) || strcmp(name, "tokenizer.json") == 0;
}

/* n_tokens (token shards) or n_rows (array shards) of an .h5 file, or -1. */
static int64_t h5_units(const char *path)
{
    jdt_h5_quiet();
    int64_t v = -1;
    hid_t f = jdt_h5_open_ro(path, 0, NULL);
    if (f < 0) return -1;
    const char *attr = jdt_h5_has_attr(f, "n_tokens") ? "n_tokens"
                       : jdt_h5_has_attr(f, "n_rows") ? "n_rows"
                                                      : NULL;
    if (attr && jdt_h5_attr_read_i64(f, attr, &v, path, NULL) != JDT_OK) v = -1;
    H5Fclose(f);
    return v;
}

jdt_status jdt_fetch_write_manifest(const char *dir, jdt_err *e)
{
    jdt_err err_local_; /* e may be NULL: keep the detail locally */
    if (!e) e = &err_local_;
    char **names = NULL;
    size_t n_names = 0;
    jdt_status st = jdt_io_list_dir(dir, manifest_entry, NULL, &names, &n_names, e);
    if (st != JDT_OK) return st;
    if (n_names > 1) qsort(names, n_names, sizeof *names, jdt_io_natural_cmp);
    char *path = jdt_io_join(dir, JDT_FETCH_MANIFEST_NAME), tmp[1200];
    if (!path) {
        jdt_io_names_free(names, n_names);
        return jdt_err_set(e, JDT_ERR_NOMEM, "out of memory");
    }
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        st = jdt_err_set(e, JDT_ERR_IO, "%s: %s", tmp, strerror(errno));
        goto out;
    }
    fprintf(f, "%s\n# NAME N_BYTES SHA256 N_UNITS (tokens or rows; '-' for other files)\n",
            JDT_FETCH_MANIFEST_MAGIC);
    for (size_t i = 0; i < n_names && st == JDT_OK; i++) {
        char *p = jdt_io_join(dir, names[i]);
        if (!p) {
            st = jdt_err_set(e, JDT_ERR_NOMEM, "out of memory");
            break;
        }
        int fd = open(p, O_RDONLY | O_CLOEXEC);
        int64_t size = file_size(p);
        if (fd < 0 || size < 0) {
            st = jdt_err_set(e, JDT_ERR_IO, "%s: %s", p, strerror(errno));
        } else {
            jdt_sha256 s = {0};
            char hex[65];
            if ((st = hash_fd(fd, size, &s, p, e)) == JDT_OK && jdt_sha256_hex(&s, hex)) {
                size_t nl = strlen(names[i]);
                int64_t units = nl > 3 && strcmp(names[i] + nl - 3, ".h5") == 0 ? h5_units(p) : -1;
                char u[32] = "-";
                if (units >= 0) snprintf(u, sizeof u, "%lld", (long long)units);
                fprintf(f, "%s %lld %s %s\n", names[i], (long long)size, hex, u);
            }
            jdt_sha256_free(&s);
        }
        if (fd >= 0) close(fd);
        jdt_free(p);
    }
    bool ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    if (st == JDT_OK && !ok) st = jdt_err_set(e, JDT_ERR_IO, "%s: %s", tmp, strerror(errno));
    if (st == JDT_OK && rename(tmp, path) != 0)
        st = jdt_err_set(e, JDT_ERR_IO, "%s: %s", path, strerror(errno));
    if (st != JDT_OK) unlink(tmp);
out:
    jdt_free(path);
    jdt_io_names_free(names, n_names);
    return st;
}

/* ---- background downloads for a loader --------------------------------------------------- */

enum { ITEM_PENDING, ITEM_BUSY, ITEM_DONE, ITEM_FAILED };

struct jdt_remote {
    jdt_fetch_opts o;
    char cache_dir[1024];
    jdt_fetch_list *list;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int *state;     /* (n_items) ITEM_* */
    int64_t urgent; /* an item a waiter needs first, or -1 */
    bool failed;    /* a download failed: the thread has stopped */
    jdt_err err;    /* ... with this error */
    int cancel;
};

static void *remote_main(void *arg)
{
    jdt_remote *r = arg;
    jdt_fetch_list *l = r->list;
    jdt_progress prog;
    char what[96];
    snprintf(what, sizeof what, "fetch %.80s", l->url);
    int64_t total = list_bytes(l);
    jdt_progress_begin(&prog, what, total >= 0 ? (double)total / 1e6 : 0, "MB");
    double base = 0;
    int64_t scan = 0; /* items before it are not pending (only this thread takes items) */
    jdt_h5_quiet();
    pthread_mutex_lock(&r->mu);
    for (;;) {
        int64_t i = -1;
        if (r->urgent >= 0 && r->state[r->urgent] == ITEM_PENDING) i = r->urgent;
        while (scan < l->n_items && r->state[scan] != ITEM_PENDING)
            scan++;
        if (i < 0 && scan < l->n_items) i = scan;
        if (i < 0 || r->cancel) break;
        r->state[i] = ITEM_BUSY;
        pthread_mutex_unlock(&r->mu);
        jdt_err err;
        jdt_err_clear(&err);
        jdt_status st = fetch_one(&r->o, &l->items[i], &r->cancel, &prog, base,
                                  l->n_items == 1 && total < 0, &err);
        int64_t sz = file_size(l->items[i].local);
        base += sz > 0 ? (double)sz : 0;
        pthread_mutex_lock(&r->mu);
        r->state[i] = st == JDT_OK ? ITEM_DONE : ITEM_FAILED;
        if (st != JDT_OK && !r->failed) {
            r->failed = true;
            r->err = err;
        }
        pthread_cond_broadcast(&r->cv);
        if (st != JDT_OK) break;
    }
    pthread_mutex_unlock(&r->mu);
    jdt_progress_end(&prog);
    pthread_mutex_lock(&r->mu);
    if (!r->failed) { /* stopped by close: wake any waiter for a file that will not come */
        for (int64_t j = 0; j < l->n_items; j++)
            if (r->state[j] != ITEM_DONE) r->state[j] = ITEM_FAILED;
        r->failed = true;
        jdt_err_set(&r->err, JDT_ERR_INTERRUPTED, "%s: downloads stopped", l->url);
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

jdt_status jdt_remote_open(const jdt_fetch_opts *o, const char *url, jdt_fetch_filter keep,
                           void *keep_ctx, jdt_remote **out, jdt_err *e)
{
    jdt_err err_local_; /* e may be NULL: keep the detail locally */
    if (!e) e = &err_local_;
    *out = NULL;
    jdt_remote *r = jdt_calloc(1, sizeof *r);
    if (!r) return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", url);
    if (o)
        r->o = *o;
    else
        jdt_fetch_opts_default(&r->o);
    cache_root(&r->o, r->cache_dir, sizeof r->cache_dir);
    r->o.cache_dir = r->cache_dir;
    r->urgent = -1;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    jdt_status st = jdt_fetch_resolve(&r->o, url, keep, keep_ctx, &r->list, e);
    if (st != JDT_OK) goto fail;
    r->state = jdt_calloc((size_t)r->list->n_items, sizeof *r->state);
    if (!r->state) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", url);
        goto fail;
    }
    if (jdt_thread_create(&r->thread, remote_main, r) != 0) {
        st = jdt_err_set(e, JDT_ERR_INTERNAL, "%s: cannot start the download thread", url);
        goto fail;
    }
    r->started = true;
    *out = r;
    return JDT_OK;
fail:
    jdt_remote_close(r);
    return st;
}

const jdt_fetch_list *jdt_remote_list(const jdt_remote *r)
{
    return r->list;
}

bool jdt_remote_units_known(const jdt_remote *r)
{
    for (int64_t i = 0; i < r->list->n_items; i++)
        if (r->list->items[i].n_units < 0) return false;
    return true;
}

jdt_status jdt_remote_wait(jdt_remote *r, int64_t i, jdt_err *e)
{
    if (i < 0 || i >= r->list->n_items)
        return jdt_err_set(e, JDT_ERR_INTERNAL, "%s: no file %lld", r->list->url, (long long)i);
    pthread_mutex_lock(&r->mu);
    if (r->state[i] == ITEM_PENDING) {
        r->urgent = i;
        pthread_cond_broadcast(&r->cv);
    }
    while (r->state[i] != ITEM_DONE && !r->failed)
        pthread_cond_wait(&r->cv, &r->mu);
    jdt_status st = JDT_OK;
    if (r->state[i] != ITEM_DONE) {
        st = r->err.code;
        if (e) *e = r->err;
    }
    pthread_mutex_unlock(&r->mu);
    return st;
}

void jdt_remote_close(jdt_remote *r)
{
    if (!r) return;
    if (r->started) {
        __atomic_store_n(&r->cancel, 1, __ATOMIC_RELEASE);
        pthread_join(r->thread, NULL);
    }
    jdt_free(r->state);
    jdt_fetch_list_free(r->list);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    jdt_free(r);
}
